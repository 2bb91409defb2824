//! Sessions: the append-only log of one agent's conversation.
//!
//! A session is a header (id, parent session, delegation depth, cwd, persona,
//! creation time) and a list of events (user message, assistant message with
//! its tool calls, tool result, turn end with its reason). A
//! [`SessionStore`] persists each session as JSON lines in
//! `<home>/sessions/<id>.jsonl`: the header first, then one line per event.
//!
//! No session file is touched on the caller's thread: every file operation
//! of the process runs, in the order it was asked for, on one thread of its
//! own (the session lane), so an actor thread never waits for the disk.
//! [`Session::append`] queues one whole line and returns (one `write` per
//! event on the lane; no `fsync`); creating, loading, reading and closing
//! wait for the lane's answer — the synchronous methods by blocking, the
//! runtime's own paths by awaiting it. So a session's file and header exist
//! when it is created, a read sees every append queued before it, and a
//! run's `dispose` returns only after its log reached the file. A process
//! killed mid-turn leaves a prefix of its events on disk (the newest may
//! still have been queued), and a crash mid-write can leave only the
//! *last* line torn: [`SessionStore::load`] drops that line with a warning
//! and keeps every earlier event; a file killed before its header was
//! written never held a session, and loading it removes it and reports
//! `NotFound`. Resuming a session never lowers its depth.
//!
//! Transcripts hold prompts and file contents, so they are private: the
//! `sessions` directory (and any missing home above it that the store
//! creates) is 0700 and every session file 0600, whatever the umask; a
//! `sessions` that is a symlink is refused, never its target changed.
//! Reading a file is bounded whatever sits under that name (see
//! [`SessionStore`]), and [`SessionStore::summarize`] reads one without
//! keeping its events.
//!
//! ```
//! use subagents::agent::{SessionEvent, SessionHeader, SessionStore};
//! use subagents::ContentBlock;
//!
//! let home = tempfile::tempdir().unwrap();
//! let store = SessionStore::new(home.path());
//! let mut session = store.create(SessionHeader::new("s1", home.path())).unwrap();
//! session.append(SessionEvent::User { content: vec![ContentBlock::text("hi")] }).unwrap();
//! session.close().unwrap();
//!
//! let loaded = store.load("s1").unwrap();
//! assert_eq!(loaded.session.events().len(), 1);
//! assert!(!loaded.torn);
//! ```

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

mod file;
mod lane;

use file::{create_private_dir, list_ids, open_regular, read_records, write_record, Record};

use crate::mix::splitmix64;
use crate::seam::{ContentBlock, StopReason};

/// Who a session is: written as the first line of its file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionHeader {
    /// The session id (also the file name).
    pub id: String,
    /// The delegating parent's session, if any.
    pub parent_session: Option<String>,
    /// Delegation depth: 0 for a top-level agent, parent + 1 for a child.
    pub depth: u32,
    /// The working directory the session's tools are confined to.
    pub cwd: PathBuf,
    /// The persona that replaced the default one, if any.
    pub persona: Option<String>,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
}

/// A fresh session id: UUID-shaped, unique without a system call per id
/// (a per-process random base, advanced by a counter through a bijective
/// mix, so ids never repeat within a process and collide across processes
/// only with 2⁻⁶⁴-scale odds).
pub fn new_session_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static BASE: OnceLock<(u64, u64)> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let (base, salt) = *BASE.get_or_init(|| {
        let random = || std::collections::hash_map::RandomState::new().build_hasher().finish();
        (random(), random())
    });
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let high = splitmix64(base.wrapping_add(n));
    let low = splitmix64(salt ^ high);
    uuid::Builder::from_random_bytes(((u128::from(high) << 64) | u128::from(low)).to_be_bytes()).into_uuid().to_string()
}

impl SessionHeader {
    /// A top-level header created now.
    pub fn new(id: impl Into<String>, cwd: impl Into<PathBuf>) -> Self {
        let created_at_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        SessionHeader { id: id.into(), parent_session: None, depth: 0, cwd: cwd.into(), persona: None, created_at_ms }
    }
}

/// A tool call requested by the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The model's id for the call; results refer to it.
    pub id: String,
    /// The tool's name, as the model wrote it (it may not exist).
    pub name: String,
    /// The arguments. Arguments that were not valid JSON arrive as a string.
    pub arguments: serde_json::Value,
}

/// One entry of a session's log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SessionEvent {
    /// A user (or parent, or steering) message.
    User {
        /// The message.
        content: Vec<ContentBlock>,
    },
    /// What the model answered in one step.
    Assistant {
        /// The answer's text (possibly empty).
        text: String,
        /// Tool calls requested in the same answer.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    /// The result of one tool call.
    ToolResult {
        /// The call this answers.
        call_id: String,
        /// The tool's name.
        name: String,
        /// What the tool returned, or the error the model should see.
        content: String,
        /// Whether `content` is an error.
        #[serde(default)]
        is_error: bool,
    },
    /// The end of a turn, with its reason.
    TurnEnd {
        /// Why the turn ended.
        reason: StopReason,
    },
}

/// A session: header, events, and (when persisted) its open file.
#[derive(Debug)]
pub struct Session {
    header: SessionHeader,
    events: Vec<SessionEvent>,
    /// Written on the session lane: each record as one `write`.
    writer: Option<SessionFile>,
}

/// A persisted session's open file, written only on the session lane, and
/// the first write error (appends do not wait, so an error is reported by
/// the next append or by the close).
#[derive(Debug)]
struct SessionFile {
    file: Arc<File>,
    failed: Arc<OnceLock<(io::ErrorKind, String)>>,
}

impl SessionFile {
    fn new(file: File) -> Self {
        SessionFile { file: Arc::new(file), failed: Arc::default() }
    }

    /// The first write that failed, if any.
    fn check(&self, id: &str) -> Result<(), SessionError> {
        match self.failed.get() {
            Some((kind, message)) => {
                Err(SessionError::Io { id: id.to_owned(), source: io::Error::new(*kind, message.clone()) })
            }
            None => Ok(()),
        }
    }
}

/// The lane failed to answer (its job panicked): an I/O error for `id`.
fn lane_failed(id: &str) -> SessionError {
    SessionError::Io { id: id.to_owned(), source: io::Error::other("the session file operation failed") }
}

/// Why a session could not be created, loaded or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The id cannot name a file.
    #[error("invalid session id {0:?}: use letters, digits, '-', '_', '.' or ':'")]
    InvalidId(String),
    /// A session with this id already exists.
    #[error("session {0:?} already exists")]
    Exists(String),
    /// No session with this id.
    #[error("no session {0:?}")]
    NotFound(String),
    /// A line before the last one does not parse (this is not a torn
    /// write), or a line is longer than the store reads.
    #[error("session {id:?} is corrupt at line {line}: {reason}")]
    Corrupt {
        /// The session.
        id: String,
        /// 1-based line number.
        line: usize,
        /// What was wrong.
        reason: String,
    },
    /// The session's file is a symlink, a FIFO, a device, a directory or a
    /// socket: it is not read (see [`SessionStore`] on what is trusted).
    #[error("session {id:?} is {found}, not a regular file: it is not read")]
    NotARegularFile {
        /// The session.
        id: String,
        /// What it is instead ("a symbolic link", "a FIFO", …).
        found: &'static str,
    },
    /// The file system failed.
    #[error("session {id:?}: {source}")]
    Io {
        /// The session.
        id: String,
        /// The underlying error.
        source: io::Error,
    },
}

/// A session read back from disk.
#[derive(Debug)]
pub struct LoadedSession {
    /// The session, open for appending.
    pub session: Session,
    /// Whether a torn last line was found and dropped.
    pub torn: bool,
}

/// A stored session as read back, for tools that show sessions.
#[derive(Clone, Debug)]
pub struct StoredSession {
    /// Its header.
    pub header: SessionHeader,
    /// Every whole event.
    pub events: Vec<SessionEvent>,
    /// Whether a torn last line (a write cut off by a crash) was left out.
    pub torn: bool,
    /// The file's size in bytes.
    pub bytes: u64,
}

impl StoredSession {
    /// How the last turn ended, if one did.
    pub fn last_stop_reason(&self) -> Option<StopReason> {
        self.events.iter().rev().find_map(|event| match event {
            SessionEvent::TurnEnd { reason } => Some(*reason),
            _ => None,
        })
    }

    /// What [`SessionStore::summarize`] tells of the same file.
    pub fn summary(&self) -> SessionSummary {
        SessionSummary {
            header: self.header.clone(),
            last_stop_reason: self.last_stop_reason(),
            torn: self.torn,
            bytes: self.bytes,
        }
    }
}

/// A stored session in brief: what listing many sessions needs, read
/// without holding the session's events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionSummary {
    /// Its header.
    pub header: SessionHeader,
    /// How the last turn ended, if one did.
    pub last_stop_reason: Option<StopReason>,
    /// Whether a torn last line (a write cut off by a crash) was left out.
    pub torn: bool,
    /// The file's size in bytes.
    pub bytes: u64,
}

/// The longest session line a store reads by default: far above what a
/// run writes (a model answer is bounded at 64 MiB by default), and a
/// bound on what reading one file may hold.
pub const DEFAULT_MAX_LINE_BYTES: usize = 256 << 20;

/// Where sessions live: `<home>/sessions/`, or nowhere (in memory).
///
/// Reading a session trusts nothing about the file: only a regular file is
/// read (a symlink, a FIFO or a device is [`SessionError::NotARegularFile`]),
/// up to the size it had when opened and line by line, each line at most
/// [`SessionStore::with_max_line_bytes`] long; and the `sessions`
/// directory is never followed through a symlink, so its mode is set only
/// on a directory of ours.
#[derive(Clone, Debug)]
pub struct SessionStore {
    dir: Option<PathBuf>,
    /// Set once the directory is known to exist (saves a syscall per session).
    dir_ready: Arc<OnceLock<()>>,
    /// The longest line read; a longer one makes the file corrupt.
    max_line_bytes: usize,
}

impl SessionStore {
    /// A store under `<home>/sessions/` (created on first use).
    pub fn new(home: impl AsRef<Path>) -> Self {
        SessionStore {
            dir: Some(home.as_ref().join("sessions")),
            dir_ready: Arc::default(),
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
        }
    }

    /// A store that keeps sessions in memory only.
    pub fn in_memory() -> Self {
        SessionStore { dir: None, dir_ready: Arc::default(), max_line_bytes: DEFAULT_MAX_LINE_BYTES }
    }

    /// Reads lines of at most `bytes` (default [`DEFAULT_MAX_LINE_BYTES`]);
    /// a file with a longer line is [`SessionError::Corrupt`] at that line.
    /// Reading one file holds about one line, so this bounds its memory.
    pub fn with_max_line_bytes(mut self, bytes: usize) -> Self {
        self.max_line_bytes = bytes;
        self
    }

    /// Creates the sessions directory now (0700, see the module doc), so a
    /// home that cannot hold sessions is reported before any run starts.
    pub fn prepare(&self) -> io::Result<()> {
        let Some(dir) = self.dir.clone() else { return Ok(()) };
        let ready = self.dir_ready.clone();
        lane::call_blocking(move || {
            create_private_dir(&dir)?;
            let _ = ready.set(());
            Ok(())
        })
        .unwrap_or_else(|| Err(io::Error::other("the session directory check failed")))
    }

    /// The directory sessions are written to, if persisted.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The file a session is persisted in, if persisted.
    pub fn path_of(&self, id: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|dir| dir.join(format!("{id}.jsonl")))
    }

    /// Runs `op` with this store on the session lane, blocking for its answer.
    fn blocking<T: Send + 'static>(
        &self,
        id: &str,
        op: impl FnOnce(&SessionStore) -> Result<T, SessionError> + Send + 'static,
    ) -> Result<T, SessionError> {
        let store = self.clone();
        lane::call_blocking(move || op(&store)).unwrap_or_else(|| Err(lane_failed(id)))
    }

    /// Runs `op` with this store on the session lane, awaiting its answer.
    async fn on_lane<T: Send + 'static>(
        &self,
        id: &str,
        op: impl FnOnce(&SessionStore) -> Result<T, SessionError> + Send + 'static,
    ) -> Result<T, SessionError> {
        let store = self.clone();
        lane::call(move || op(&store), drop).await.unwrap_or_else(|| Err(lane_failed(id)))
    }

    /// Creates a new session and writes its header.
    pub fn create(&self, header: SessionHeader) -> Result<Session, SessionError> {
        self.create_seeded(header, Vec::new())
    }

    /// Creates a new session, writes its header, then `seed` (a fork's
    /// inherited history), blocking for the file.
    pub(crate) fn create_seeded(
        &self,
        header: SessionHeader,
        seed: Vec<SessionEvent>,
    ) -> Result<Session, SessionError> {
        check_id(&header.id)?;
        if self.dir.is_none() {
            return Ok(Session::in_memory_seeded(header, seed));
        }
        let id = header.id.clone();
        self.blocking(&id, move |store| store.create_now(header, seed))
    }

    /// [`SessionStore::create_seeded`] without blocking: the file and its
    /// header exist when this resolves. A creation whose caller stopped
    /// waiting is removed again.
    pub(crate) async fn create_async(
        &self,
        header: SessionHeader,
        seed: Vec<SessionEvent>,
    ) -> Result<Session, SessionError> {
        check_id(&header.id)?;
        if self.dir.is_none() {
            return Ok(Session::in_memory_seeded(header, seed));
        }
        let id = header.id.clone();
        let store = self.clone();
        let undo_store = self.clone();
        let undo = move |created: Result<Session, SessionError>| {
            if let Ok(mut session) = created {
                session.writer = None;
                let _ = undo_store.remove_now(session.id());
            }
        };
        lane::call(move || store.create_now(header, seed), undo).await.unwrap_or_else(|| Err(lane_failed(&id)))
    }

    /// On the lane: create the file, write the header and the seed.
    fn create_now(&self, header: SessionHeader, seed: Vec<SessionEvent>) -> Result<Session, SessionError> {
        let id = header.id.clone();
        let Some(path) = self.path_of(&id) else {
            return Ok(Session::in_memory_seeded(header, seed));
        };
        let io_error = |source| SessionError::Io { id: id.clone(), source };
        if self.dir_ready.get().is_none() {
            create_private_dir(path.parent().expect("a session path has a parent")).map_err(io_error)?;
            let _ = self.dir_ready.set(());
        }
        let file = OpenOptions::new().append(true).create_new(true).mode(0o600).open(&path).map_err(|source| {
            if source.kind() == io::ErrorKind::AlreadyExists {
                SessionError::Exists(id.clone())
            } else {
                io_error(source)
            }
        })?;
        // The mode above is cut by the umask, never widened; set it exactly.
        file.set_permissions(fs::Permissions::from_mode(0o600)).map_err(io_error)?;
        write_record(&file, &Record::Header(header.clone())).map_err(io_error)?;
        for event in &seed {
            write_record(&file, event).map_err(io_error)?;
        }
        Ok(Session { header, events: seed, writer: Some(SessionFile::new(file)) })
    }

    /// Loads a session. A torn last line is dropped (with a warning) and cut
    /// from the file, so later appends start on a clean line.
    pub fn load(&self, id: &str) -> Result<LoadedSession, SessionError> {
        check_id(id)?;
        let owned = id.to_owned();
        self.blocking(id, move |store| store.load_now(&owned))
    }

    /// On the lane: [`SessionStore::load`].
    fn load_now(&self, id: &str) -> Result<LoadedSession, SessionError> {
        let Some(path) = self.path_of(id) else {
            return Err(SessionError::NotFound(id.to_owned()));
        };
        let io_error = |source| SessionError::Io { id: id.to_owned(), source };
        // One handle reads the file and then appends to it.
        let (file, len) = open_regular(&path, id, true)?;
        let mut events = Vec::new();
        let (header, valid_len) = match read_records(id, &file, len, self.max_line_bytes, |e| events.push(e)) {
            Err(SessionError::NotFound(_)) => {
                tracing::warn!(session = id, "removing a session file that never got its header");
                let _ = fs::remove_file(&path);
                return Err(SessionError::NotFound(id.to_owned()));
            }
            read => read?,
        };
        let torn = valid_len < len;
        if torn {
            tracing::warn!(session = id, dropped_bytes = len - valid_len, "dropping a torn last session line");
            file.set_len(valid_len).map_err(io_error)?;
        }
        Ok(LoadedSession { session: Session { header, events, writer: Some(SessionFile::new(file)) }, torn })
    }

    /// Reads a session without opening it for writing and without repairing
    /// a torn last line (another agent may be writing it right now).
    pub fn read(&self, id: &str) -> Result<(SessionHeader, Vec<SessionEvent>), SessionError> {
        self.inspect(id).map(|stored| (stored.header, stored.events))
    }

    /// [`SessionStore::read`] without blocking; it sees every append queued
    /// before it.
    pub(crate) async fn read_async(&self, id: &str) -> Result<(SessionHeader, Vec<SessionEvent>), SessionError> {
        check_id(id)?;
        let owned = id.to_owned();
        let stored = self.on_lane(id, move |store| store.inspect_now(&owned)).await?;
        Ok((stored.header, stored.events))
    }

    /// Like [`SessionStore::read`], and says whether a torn last line was
    /// left out and how large the file is.
    pub fn inspect(&self, id: &str) -> Result<StoredSession, SessionError> {
        check_id(id)?;
        let owned = id.to_owned();
        self.blocking(id, move |store| store.inspect_now(&owned))
    }

    /// On the lane: [`SessionStore::inspect`].
    fn inspect_now(&self, id: &str) -> Result<StoredSession, SessionError> {
        let path = self.path_of(id).ok_or_else(|| SessionError::NotFound(id.to_owned()))?;
        let (file, len) = open_regular(&path, id, false)?;
        let mut events = Vec::new();
        let (header, valid_len) = read_records(id, &file, len, self.max_line_bytes, |e| events.push(e))?;
        Ok(StoredSession { header, events, torn: valid_len < len, bytes: len })
    }

    /// A session's header, last stop reason, torn flag and size, read line
    /// by line without keeping its events: listing a thousand large
    /// sessions holds a thousand summaries, not their transcripts.
    pub fn summarize(&self, id: &str) -> Result<SessionSummary, SessionError> {
        check_id(id)?;
        let owned = id.to_owned();
        self.blocking(id, move |store| store.summarize_now(&owned))
    }

    /// On the lane: [`SessionStore::summarize`].
    fn summarize_now(&self, id: &str) -> Result<SessionSummary, SessionError> {
        let path = self.path_of(id).ok_or_else(|| SessionError::NotFound(id.to_owned()))?;
        let (file, len) = open_regular(&path, id, false)?;
        let mut last_stop_reason = None;
        let (header, valid_len) = read_records(id, &file, len, self.max_line_bytes, |event| {
            if let SessionEvent::TurnEnd { reason } = event {
                last_stop_reason = Some(reason);
            }
        })?;
        Ok(SessionSummary { header, last_stop_reason, torn: valid_len < len, bytes: len })
    }

    /// The ids of every stored session (the `*.jsonl` files), unsorted;
    /// none for an in-memory store or a home that has no sessions yet.
    pub fn ids(&self) -> io::Result<Vec<String>> {
        let Some(dir) = self.dir.clone() else { return Ok(Vec::new()) };
        lane::call_blocking(move || list_ids(&dir))
            .unwrap_or_else(|| Err(io::Error::other("listing the sessions failed")))
    }

    /// Deletes a session's file (a rolled-back start leaves nothing behind).
    pub fn remove(&self, id: &str) -> Result<(), SessionError> {
        check_id(id)?;
        if self.dir.is_none() {
            return Ok(());
        }
        let owned = id.to_owned();
        self.blocking(id, move |store| store.remove_now(&owned))
    }

    /// [`SessionStore::remove`] without blocking.
    pub(crate) async fn remove_async(&self, id: &str) -> Result<(), SessionError> {
        check_id(id)?;
        if self.dir.is_none() {
            return Ok(());
        }
        let owned = id.to_owned();
        self.on_lane(id, move |store| store.remove_now(&owned)).await
    }

    /// On the lane: [`SessionStore::remove`].
    fn remove_now(&self, id: &str) -> Result<(), SessionError> {
        let Some(path) = self.path_of(id) else { return Ok(()) };
        match fs::remove_file(path) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(SessionError::Io { id: id.to_owned(), source }),
        }
    }

    /// Loads a session to continue it at depth `depth` or deeper: a resumed
    /// session never counts as shallower than it was.
    pub fn resume(&self, id: &str, depth: u32) -> Result<Session, SessionError> {
        check_id(id)?;
        let owned = id.to_owned();
        self.blocking(id, move |store| store.resume_now(&owned, depth))
    }

    /// [`SessionStore::resume`] without blocking.
    pub(crate) async fn resume_async(&self, id: &str, depth: u32) -> Result<Session, SessionError> {
        check_id(id)?;
        let owned = id.to_owned();
        self.on_lane(id, move |store| store.resume_now(&owned, depth)).await
    }

    /// On the lane: [`SessionStore::resume`].
    fn resume_now(&self, id: &str, depth: u32) -> Result<Session, SessionError> {
        let mut session = self.load_now(id)?.session;
        if depth > session.header.depth {
            session.header.depth = depth;
            let writer = session.writer.as_ref().expect("a loaded session has its file");
            write_record(&writer.file, &Record::Header(session.header.clone()))
                .map_err(|source| SessionError::Io { id: id.to_owned(), source })?;
        }
        Ok(session)
    }
}

/// `events` up to and including the last turn end (see
/// [`Session::completed_prefix`]), for a log read from a file as well as a
/// live one.
pub(crate) fn completed_prefix(events: &[SessionEvent]) -> &[SessionEvent] {
    let end = events.iter().rposition(|e| matches!(e, SessionEvent::TurnEnd { .. })).map_or(0, |i| i + 1);
    &events[..end]
}

fn check_id(id: &str) -> Result<(), SessionError> {
    let safe = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':');
    if id.is_empty() || id.len() > 200 || id.starts_with('.') || !id.chars().all(safe) {
        return Err(SessionError::InvalidId(id.to_owned()));
    }
    Ok(())
}

impl Session {
    /// A session that is never written anywhere.
    pub fn in_memory(header: SessionHeader) -> Self {
        Session { header, events: Vec::new(), writer: None }
    }

    /// The session id.
    pub fn id(&self) -> &str {
        &self.header.id
    }

    /// The header.
    pub fn header(&self) -> &SessionHeader {
        &self.header
    }

    /// Every event so far, oldest first.
    pub fn events(&self) -> &[SessionEvent] {
        &self.events
    }

    /// Whether the session is written to a file.
    pub fn is_persisted(&self) -> bool {
        self.writer.is_some()
    }

    /// The events up to and including the last turn end: what a fork
    /// inherits. The open turn, if any, is left out.
    pub fn completed_prefix(&self) -> &[SessionEvent] {
        completed_prefix(&self.events)
    }

    /// Appends an event: kept in memory at once, and queued for the file
    /// as one whole line (one `write`, in order, on the session lane). An
    /// earlier write that failed is reported here (or by the close).
    pub fn append(&mut self, event: SessionEvent) -> Result<(), SessionError> {
        self.write_line(&event)?;
        // The first event gets room for one, not four: a child waiting on
        // its first answer holds only its prompt (later growth doubles).
        if self.events.capacity() == 0 {
            self.events.reserve_exact(1);
        }
        self.events.push(event);
        Ok(())
    }

    /// Closes the file once everything appended reached it, blocking the
    /// calling thread until then; the session stays readable in memory. In
    /// async code, [`Agent::shutdown`](super::Agent::shutdown) closes
    /// without blocking.
    pub fn close(&mut self) -> Result<(), SessionError> {
        let Some(writer) = self.writer.take() else { return Ok(()) };
        let id = self.header.id.clone();
        lane::call_blocking(move || finish(writer, &id)).unwrap_or_else(|| Err(lane_failed(&self.header.id)))
    }

    /// [`Session::close`] without blocking: the file is taken now, and the
    /// returned future resolves once everything appended reached it.
    pub(crate) fn closing(&mut self) -> impl std::future::Future<Output = Result<(), SessionError>> + Send + 'static {
        let id = self.header.id.clone();
        let writer = self.writer.take();
        async move {
            let Some(writer) = writer else { return Ok(()) };
            let closing = id.clone();
            lane::call(move || finish(writer, &closing), drop).await.unwrap_or_else(|| Err(lane_failed(&id)))
        }
    }

    /// Queues one whole line: a header record or an event (whose own tag
    /// makes it a valid record).
    fn write_line(&mut self, record: &impl Serialize) -> Result<(), SessionError> {
        let Some(writer) = &self.writer else { return Ok(()) };
        writer.check(&self.header.id)?;
        let io_error = |source| SessionError::Io { id: self.header.id.clone(), source };
        let mut line = serde_json::to_vec(record).map_err(|e| io_error(e.into()))?;
        line.push(b'\n');
        let (file, failed) = (writer.file.clone(), writer.failed.clone());
        lane::submit(move || {
            if let Err(error) = (&*file).write_all(&line) {
                let _ = failed.set((error.kind(), error.to_string()));
            }
        });
        Ok(())
    }

    fn in_memory_seeded(header: SessionHeader, seed: Vec<SessionEvent>) -> Self {
        Session { header, events: seed, writer: None }
    }
}

/// On the lane, after every queued write: close the file and report the
/// first write that failed.
fn finish(writer: SessionFile, id: &str) -> Result<(), SessionError> {
    let outcome = writer.check(id);
    drop(writer);
    outcome
}

impl Drop for Session {
    /// A session dropped without a close still has its file closed on the
    /// lane, after its queued writes: waited for outside an async runtime
    /// (a program about to exit loses nothing), queued inside one.
    fn drop(&mut self) {
        if let Some(writer) = self.writer.take() {
            if tokio::runtime::Handle::try_current().is_ok() {
                lane::submit(move || drop(writer));
            } else {
                let _ = lane::call_blocking(move || drop(writer));
            }
        }
    }
}
