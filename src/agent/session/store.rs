//! [`SessionStore`]: where sessions live (`<home>/sessions/`, or nowhere),
//! and the operations on them — create, load, resume, read, inspect,
//! summarize, remove, list.
//!
//! Each operation is written once, as the job the session lane runs (see
//! [`lane`](super::lane)); the public methods wait for it on the calling
//! thread, and the runtime's own paths await the same job through the
//! `*ing` form (`creating`, `resuming`, `reading`, `removing`).

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use super::file::{create_private_dir, list_ids, open_regular, push_line, read_records, umask_keeps, Record};
use super::lane::{self, LaneCall};
use super::live::SessionFile;
use super::{Session, SessionError, SessionEvent, SessionHeader};
use crate::seam::StopReason;

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

    /// `job` on the lane with this store, once `id` is known to name a
    /// file.
    fn on_lane<T: Send + 'static>(
        &self,
        id: &str,
        job: impl FnOnce(&SessionStore, &str) -> Result<T, SessionError> + Send + 'static,
    ) -> LaneCall<T> {
        if let Err(error) = check_id(id) {
            return LaneCall::ready(id, Err(error));
        }
        let (store, owned) = (self.clone(), id.to_owned());
        LaneCall::new(id, move || job(&store, &owned))
    }

    /// Creates a new session and writes its header.
    pub fn create(&self, header: SessionHeader) -> Result<Session, SessionError> {
        self.creating(header, Vec::new()).wait()
    }

    /// Creates a new session, writes its header, then `seed` (a fork's
    /// inherited history): the file and its header exist when the call
    /// answers. A creation whose caller stopped awaiting it is removed
    /// again.
    pub(crate) fn creating(&self, header: SessionHeader, seed: Vec<SessionEvent>) -> LaneCall<Session> {
        let id = header.id.clone();
        if self.dir.is_none() {
            let created = check_id(&id).map(|()| Session::in_memory_seeded(header, seed));
            return LaneCall::ready(&id, created);
        }
        let undo_store = self.clone();
        self.on_lane(&id, move |store, _| store.create_now(header, seed)).undo_if_abandoned(move |mut session| {
            session.forget_file();
            let _ = remove_now(&undo_store, session.id());
        })
    }

    /// On the lane: create the file, write the header and the seed.
    fn create_now(&self, header: SessionHeader, seed: Vec<SessionEvent>) -> Result<Session, SessionError> {
        let id = header.id.clone();
        let Some(path) = self.path_of(&id) else {
            return Ok(Session::in_memory_seeded(header, seed));
        };
        let io_error = |source| SessionError::io(&id, source);
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
        // The mode above is cut by the umask, never widened; set it exactly
        // unless the umask leaves it whole (a syscall per file saved).
        if !umask_keeps(0o600) {
            file.set_permissions(fs::Permissions::from_mode(0o600)).map_err(io_error)?;
        }
        // The header and the seed in one write: whole lines, so a crash
        // tears at most the last.
        let mut lines = Vec::new();
        push_line(&mut lines, &Record::Header(header.clone())).map_err(io_error)?;
        for event in &seed {
            push_line(&mut lines, event).map_err(io_error)?;
        }
        (&file).write_all(&lines).map_err(io_error)?;
        Ok(Session::persisted(header, seed, SessionFile::new(file)))
    }

    /// Loads a session. A torn last line is dropped (with a warning) and cut
    /// from the file, so later appends start on a clean line.
    pub fn load(&self, id: &str) -> Result<LoadedSession, SessionError> {
        self.on_lane(id, load_now).wait()
    }

    /// Loads a session to continue it at depth `depth` or deeper: a resumed
    /// session never counts as shallower than it was.
    pub fn resume(&self, id: &str, depth: u32) -> Result<Session, SessionError> {
        self.resuming(id, depth).wait()
    }

    /// [`SessionStore::resume`], to wait for or await.
    pub(crate) fn resuming(&self, id: &str, depth: u32) -> LaneCall<Session> {
        self.on_lane(id, move |store, id| {
            let mut session = load_now(store, id)?.session;
            session.deepen(depth)?;
            Ok(session)
        })
    }

    /// Reads a session without opening it for writing and without repairing
    /// a torn last line (another agent may be writing it right now).
    pub fn read(&self, id: &str) -> Result<(SessionHeader, Vec<SessionEvent>), SessionError> {
        self.reading(id).wait()
    }

    /// [`SessionStore::read`], to wait for or await; it sees every append
    /// queued before it.
    pub(crate) fn reading(&self, id: &str) -> LaneCall<(SessionHeader, Vec<SessionEvent>)> {
        self.on_lane(id, |store, id| inspect_now(store, id).map(|stored| (stored.header, stored.events)))
    }

    /// Like [`SessionStore::read`], and says whether a torn last line was
    /// left out and how large the file is.
    pub fn inspect(&self, id: &str) -> Result<StoredSession, SessionError> {
        self.on_lane(id, inspect_now).wait()
    }

    /// A session's header, last stop reason, torn flag and size, read line
    /// by line without keeping its events: listing a thousand large
    /// sessions holds a thousand summaries, not their transcripts.
    pub fn summarize(&self, id: &str) -> Result<SessionSummary, SessionError> {
        self.on_lane(id, summarize_now).wait()
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
        self.removing(id).wait()
    }

    /// [`SessionStore::remove`], to wait for or await.
    pub(crate) fn removing(&self, id: &str) -> LaneCall<()> {
        if self.dir.is_none() {
            return LaneCall::ready(id, check_id(id));
        }
        self.on_lane(id, remove_now)
    }
}

/// On the lane: [`SessionStore::load`]. One handle reads the file and then
/// appends to it.
fn load_now(store: &SessionStore, id: &str) -> Result<LoadedSession, SessionError> {
    let Some(path) = store.path_of(id) else {
        return Err(SessionError::NotFound(id.to_owned()));
    };
    let (file, len) = open_regular(&path, id, true)?;
    let mut events = Vec::new();
    let (header, valid_len) = match read_records(id, &file, len, store.max_line_bytes, |e| events.push(e)) {
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
        file.set_len(valid_len).map_err(|source| SessionError::io(id, source))?;
    }
    Ok(LoadedSession { session: Session::persisted(header, events, SessionFile::new(file)), torn })
}

/// On the lane: [`SessionStore::inspect`].
fn inspect_now(store: &SessionStore, id: &str) -> Result<StoredSession, SessionError> {
    let path = store.path_of(id).ok_or_else(|| SessionError::NotFound(id.to_owned()))?;
    let (file, len) = open_regular(&path, id, false)?;
    let mut events = Vec::new();
    let (header, valid_len) = read_records(id, &file, len, store.max_line_bytes, |e| events.push(e))?;
    Ok(StoredSession { header, events, torn: valid_len < len, bytes: len })
}

/// On the lane: [`SessionStore::summarize`].
fn summarize_now(store: &SessionStore, id: &str) -> Result<SessionSummary, SessionError> {
    let path = store.path_of(id).ok_or_else(|| SessionError::NotFound(id.to_owned()))?;
    let (file, len) = open_regular(&path, id, false)?;
    let mut last_stop_reason = None;
    let (header, valid_len) = read_records(id, &file, len, store.max_line_bytes, |event| {
        if let SessionEvent::TurnEnd { reason } = event {
            last_stop_reason = Some(reason);
        }
    })?;
    Ok(SessionSummary { header, last_stop_reason, torn: valid_len < len, bytes: len })
}

/// On the lane: [`SessionStore::remove`]; a file already gone is removed.
fn remove_now(store: &SessionStore, id: &str) -> Result<(), SessionError> {
    let Some(path) = store.path_of(id) else { return Ok(()) };
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(SessionError::io(id, source)),
    }
}

/// Whether `id` can name a session file.
fn check_id(id: &str) -> Result<(), SessionError> {
    let safe = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':');
    if id.is_empty() || id.len() > 200 || id.starts_with('.') || !id.chars().all(safe) {
        return Err(SessionError::InvalidId(id.to_owned()));
    }
    Ok(())
}
