//! [`SessionStore`]: where sessions live (`<home>/sessions/`, or nowhere),
//! and the operations on them — create, load, resume, read, inspect,
//! summarize, remove, list.
//!
//! Each operation is written once, as the job the session lane runs (see
//! [`lane`](super::lane)); the public methods wait for it on the calling
//! thread, and the runtime's own paths await the same job through the
//! `*ing` form (`creating`, `resuming`, `reading`, `removing`). Creating is
//! the one shortcut: once the segment being written is open, a new session
//! needs nothing from the disk, so it is checked against the index and its
//! header queued at once, without waiting for the lane.
//!
//! New sessions go to shared segments (see [`segment`](super::segment));
//! a session in a file of its own, from an earlier version, is read,
//! continued and removed in that file.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use super::file::{create_private_dir, list_ids, open_regular, read_records, Record};
use super::lane::{self, LaneCall};
use super::live::SessionFile;
use super::segment::{push_tagged_line, Index};
use super::{Session, SessionError, SessionEvent, SessionHeader};
use crate::seam::{RunUsage, StopReason};

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
    /// The bytes its lines take on disk (for a session in a file of its
    /// own, the file's size).
    pub bytes: u64,
}

impl StoredSession {
    /// How the last turn ended, if one did.
    pub fn last_stop_reason(&self) -> Option<StopReason> {
        self.events.iter().rev().find_map(|event| match event {
            SessionEvent::TurnEnd { reason, .. } => Some(*reason),
            _ => None,
        })
    }

    /// What [`SessionStore::summarize`] tells of the same file.
    pub fn summary(&self) -> SessionSummary {
        let mut summary = SessionSummary::of(self.header.clone(), self.torn, self.bytes);
        for event in &self.events {
            summary.note(event);
        }
        summary
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
    /// The bytes its lines take on disk (for a session in a file of its
    /// own, the file's size).
    pub bytes: u64,
    /// The first user message's text, cut at [`SessionSummary::PROMPT_BYTES`]
    /// (someone else's words: made safe where it is shown).
    pub first_prompt: Option<String>,
    /// Turns that ended.
    pub turns: u32,
    /// Tool calls the model asked for.
    pub tool_calls: u32,
    /// Tool results that were errors.
    pub tool_calls_failed: u32,
    /// A user message came after the last turn end: a turn still running,
    /// or one its process did not live to end.
    pub open_turn: bool,
    /// How long its ended turns took, summed over the turns whose recorder
    /// knew (`None`: none did).
    pub duration_ms: Option<u64>,
    /// What its ended turns' model calls spent, summed (turns whose
    /// recorder knew: an in-process child's; an ACP or A2A child does not
    /// say).
    pub usage: RunUsage,
}

impl SessionSummary {
    /// How much of the first prompt a summary keeps.
    pub const PROMPT_BYTES: usize = 200;

    fn of(header: SessionHeader, torn: bool, bytes: u64) -> Self {
        SessionSummary {
            header,
            last_stop_reason: None,
            torn,
            bytes,
            first_prompt: None,
            turns: 0,
            tool_calls: 0,
            tool_calls_failed: 0,
            open_turn: false,
            duration_ms: None,
            usage: RunUsage::default(),
        }
    }

    /// Counts one event of the session, in order.
    fn note(&mut self, event: &SessionEvent) {
        match event {
            SessionEvent::User { content } => {
                if self.first_prompt.is_none() {
                    let text = crate::seam::text_of(content);
                    self.first_prompt = Some(crate::seam::cut(&text, Self::PROMPT_BYTES).to_owned());
                }
                self.open_turn = true;
            }
            SessionEvent::Assistant { tool_calls, .. } => {
                self.tool_calls = self.tool_calls.saturating_add(tool_calls.len() as u32);
            }
            SessionEvent::ToolResult { is_error, .. } => {
                self.tool_calls_failed = self.tool_calls_failed.saturating_add(u32::from(*is_error));
            }
            SessionEvent::TurnEnd { reason, duration_ms, usage } => {
                self.last_stop_reason = Some(*reason);
                self.turns = self.turns.saturating_add(1);
                if let Some(ms) = duration_ms {
                    self.duration_ms = Some(self.duration_ms.unwrap_or(0).saturating_add(*ms));
                }
                if let Some(usage) = usage {
                    self.usage += *usage;
                }
                self.open_turn = false;
            }
        }
    }
}

/// The stores of the homes a provider's runs record out-of-process
/// children's transcripts into: one per home, made on first use (a store
/// writes segments of its own, so several share a home).
#[cfg(any(feature = "acp", feature = "a2a"))]
#[derive(Debug, Default)]
pub(crate) struct HomeStores(Mutex<Option<(PathBuf, Arc<SessionStore>)>>);

#[cfg(any(feature = "acp", feature = "a2a"))]
impl HomeStores {
    /// The store of `home`.
    pub(crate) fn of(&self, home: &Path) -> Arc<SessionStore> {
        let mut cached = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match &*cached {
            Some((path, store)) if path == home => store.clone(),
            _ => {
                let store = Arc::new(SessionStore::new(home));
                *cached = Some((home.to_owned(), store.clone()));
                store
            }
        }
    }
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
    /// Where in the segments each session's lines are (see
    /// [`segment`](super::segment)): changed on the session lane, and by
    /// a creation that needs no disk, which only ever tries the lock.
    index: Arc<Mutex<Indexed>>,
    /// The longest line read; a longer one makes the file corrupt.
    max_line_bytes: usize,
}

/// What [`SessionStore::create_queued`] did.
enum Creation {
    /// Created (or refused) without the lane.
    Answered(Result<Session, SessionError>),
    /// The lane has to create it.
    ForTheLane(SessionHeader, Vec<SessionEvent>),
}

/// The index, and whether it has read the directory yet.
#[derive(Debug, Default)]
struct Indexed {
    index: Index,
    looked: bool,
}

/// How deep under `<home>/children` [`SessionStore::of_children`] looks
/// for the homes of process children (a child's children live under its
/// own home).
const NESTED_HOME_LEVELS: usize = 8;
/// The most directories it looks into there.
const NESTED_HOME_DIRS: usize = 10_000;

impl SessionStore {
    /// The session stores of the `process` children under `home`: every
    /// directory below `<home>/children` (symlinks not followed) holding a
    /// `sessions` directory, breadth first, at most 8 levels deep and
    /// 10,000 directories in all.
    pub fn of_children(home: &Path) -> Vec<SessionStore> {
        let is_dir = |path: &Path| fs::symlink_metadata(path).is_ok_and(|meta| meta.is_dir());
        let mut stores = Vec::new();
        let mut level = vec![home.join("children")];
        let mut visited = 0;
        for _ in 0..NESTED_HOME_LEVELS {
            let mut next = Vec::new();
            for dir in level {
                if visited == NESTED_HOME_DIRS || !is_dir(&dir) {
                    continue;
                }
                visited += 1;
                if is_dir(&dir.join("sessions")) {
                    stores.push(SessionStore::new(&dir));
                }
                let Ok(entries) = fs::read_dir(&dir) else { continue };
                next.extend(
                    entries
                        .flatten()
                        .map(|entry| entry.path())
                        .filter(|path| path.file_name().is_some_and(|name| name != "sessions") && is_dir(path)),
                );
            }
            level = next;
        }
        stores
    }
}

impl SessionStore {
    /// A store under `<home>/sessions/` (created on first use).
    pub fn new(home: impl AsRef<Path>) -> Self {
        SessionStore {
            dir: Some(home.as_ref().join("sessions")),
            dir_ready: Arc::default(),
            index: Arc::default(),
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
        }
    }

    /// A store that keeps sessions in memory only.
    pub fn in_memory() -> Self {
        // With no directory the index is never filled and the directory
        // never made: every in-memory store shares one empty pair, so a
        // run on one costs no index of its own (about 260 bytes).
        type Unused = (Arc<OnceLock<()>>, Arc<Mutex<Indexed>>);
        static UNUSED: OnceLock<Unused> = OnceLock::new();
        let (dir_ready, index) = UNUSED.get_or_init(Default::default);
        SessionStore {
            dir: None,
            dir_ready: dir_ready.clone(),
            index: index.clone(),
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
        }
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

    /// The file of its own a session had in the layout of earlier
    /// versions (`<home>/sessions/<id>.jsonl`), if persisted: such a file
    /// still loads, lists and continues. New sessions are written to
    /// shared segments instead (see the module doc).
    pub fn path_of(&self, id: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|dir| dir.join(format!("{id}.jsonl")))
    }

    /// On the lane: the index, read up to date with the segments' new
    /// lines (`fresh`), or at least read once.
    fn indexed(&self, fresh: bool) -> Result<MutexGuard<'_, Indexed>, io::Error> {
        let mut indexed = self.index.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(dir), true) = (&self.dir, fresh || !indexed.looked) {
            indexed.index.refresh(dir)?;
            indexed.looked = true;
        }
        Ok(indexed)
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

    /// Creates a new session and queues its header (written before
    /// anything appended to it).
    pub fn create(&self, header: SessionHeader) -> Result<Session, SessionError> {
        self.creating(header, Vec::new()).wait()
    }

    /// Creates a new session and queues its header, then `seed` (a fork's
    /// inherited history), before anything appended to it. A creation
    /// whose caller stopped awaiting it is removed again.
    pub(crate) fn creating(&self, header: SessionHeader, seed: Vec<SessionEvent>) -> LaneCall<Session> {
        let id = header.id.clone();
        if self.dir.is_none() {
            let created = check_id(&id).map(|()| Session::in_memory_seeded(header, seed));
            return LaneCall::ready(&id, created);
        }
        if let Err(error) = check_id(&id) {
            return LaneCall::ready(&id, Err(error));
        }
        let (header, seed) = match self.create_queued(header, seed) {
            Creation::Answered(created) => return LaneCall::ready(&id, created),
            Creation::ForTheLane(header, seed) => (header, seed),
        };
        let undo_store = self.clone();
        self.on_lane(&id, move |store, _| store.create_now(header, seed)).undo_if_abandoned(move |mut session| {
            session.forget_file();
            let _ = remove_now(&undo_store, session.id());
        })
    }

    /// Creates a session without waiting for the lane, when nothing on disk
    /// needs doing: the index has read the directory and the segment being
    /// written has room. The id is checked against the index (which holds
    /// what this store created and what it last read of the directory)
    /// and the header and seed are queued, on the caller's thread, never
    /// waiting for the disk (an index the lane holds is left to the lane).
    /// Gives `header` and `seed` back when the lane has to do it.
    fn create_queued(&self, header: SessionHeader, seed: Vec<SessionEvent>) -> Creation {
        let Ok(mut indexed) = self.index.try_lock() else { return Creation::ForTheLane(header, seed) };
        let target = match indexed.index.open_writer_for_new() {
            Some(target) if indexed.looked => target,
            _ => return Creation::ForTheLane(header, seed),
        };
        let id = header.id.clone();
        if indexed.index.holds(&id) || indexed.index.has_own_file(&id) {
            return Creation::Answered(Err(SessionError::Exists(id)));
        }
        let mut lines = Vec::new();
        let pushed = std::iter::once(push_tagged_line(&mut lines, &id, &Record::Header(header.clone())))
            .chain(seed.iter().map(|event| push_tagged_line(&mut lines, &id, event)))
            .collect::<io::Result<()>>();
        if let Err(source) = pushed {
            return Creation::Answered(Err(SessionError::io(&id, source)));
        }
        indexed.index.created(&id);
        let end = lane::append(&target, lines);
        Creation::Answered(Ok(Session::persisted(header, seed, SessionFile::shared(target, end))))
    }

    /// On the lane: check the id is new, queue the header and the seed
    /// for the segment being written (they reach it before anything
    /// appended after).
    fn create_now(&self, header: SessionHeader, seed: Vec<SessionEvent>) -> Result<Session, SessionError> {
        let id = header.id.clone();
        let (Some(dir), Some(own_file)) = (self.dir.as_deref(), self.path_of(&id)) else {
            return Ok(Session::in_memory_seeded(header, seed));
        };
        let io_error = |source| SessionError::io(&id, source);
        if self.dir_ready.get().is_none() {
            create_private_dir(dir).map_err(io_error)?;
            let _ = self.dir_ready.set(());
        }
        // A session of an earlier version, in a file of its own.
        if fs::symlink_metadata(&own_file).is_ok() {
            return Err(SessionError::Exists(id));
        }
        let mut indexed = self.indexed(false).map_err(io_error)?;
        if indexed.index.holds(&id) {
            return Err(SessionError::Exists(id));
        }
        let target = indexed.index.writer_for(dir, &id).map_err(io_error)?;
        indexed.index.created(&id);
        // The header and the seed in one queued write: whole lines, so a
        // crash tears at most the last.
        let mut lines = Vec::new();
        push_tagged_line(&mut lines, &id, &Record::Header(header.clone())).map_err(io_error)?;
        for event in &seed {
            push_tagged_line(&mut lines, &id, event).map_err(io_error)?;
        }
        let end = lane::append(&target, lines);
        Ok(Session::persisted(header, seed, SessionFile::shared(target, end)))
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

    /// Session `id` read in order, each event handed to `event` until it
    /// answers `Break` (then nothing more is read): its header, whether a
    /// torn last line was left out (`false` when stopped), and the bytes
    /// read. For a reader that shows a bounded part of a long session.
    #[allow(dead_code)] // The web view's, which builds only beside a door (`serve`).
    pub(crate) fn read_while(
        &self,
        id: &str,
        event: impl FnMut(SessionEvent) -> std::ops::ControlFlow<()> + Send + 'static,
    ) -> Result<(SessionHeader, bool, u64), SessionError> {
        self.on_lane(id, move |store, id| read_now(store, id, event)).wait()
    }

    /// A session's header, last stop reason, torn flag and size, read line
    /// by line without keeping its events: listing a thousand large
    /// sessions holds a thousand summaries, not their transcripts.
    pub fn summarize(&self, id: &str) -> Result<SessionSummary, SessionError> {
        self.on_lane(id, summarize_now).wait()
    }

    /// The ids of every stored session (in the segments, and the
    /// `*.jsonl` files of earlier versions), unsorted; none for an
    /// in-memory store or a home that has no sessions yet.
    pub fn ids(&self) -> io::Result<Vec<String>> {
        let Some(dir) = self.dir.clone() else { return Ok(Vec::new()) };
        let store = self.clone();
        lane::call_blocking(move || ids_now(&store, &dir))
            .unwrap_or_else(|| Err(io::Error::other("listing the sessions failed")))
    }

    /// Removes a session (a rolled-back start leaves no session behind): a
    /// file of its own is deleted, a session in the segments is marked
    /// removed.
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

/// Session `id`'s file of its own (the layout of earlier versions), if it
/// has one: `None` when nothing is under that name.
fn own_file(store: &SessionStore, id: &str, append: bool) -> Result<Option<(PathBuf, fs::File, u64)>, SessionError> {
    let Some(path) = store.path_of(id) else {
        return Err(SessionError::NotFound(id.to_owned()));
    };
    match open_regular(&path, id, append) {
        Ok((file, len)) => Ok(Some((path, file, len))),
        Err(SessionError::NotFound(_)) => Ok(None),
        Err(error) => Err(error),
    }
}

/// On the lane: [`SessionStore::load`]. A session in a file of its own is
/// read and continued through one handle; one in the segments continues
/// in the segment being written.
fn load_now(store: &SessionStore, id: &str) -> Result<LoadedSession, SessionError> {
    let Some((path, file, len)) = own_file(store, id, true)? else {
        return load_from_segments(store, id);
    };
    let mut events = Vec::new();
    let (header, valid_len) = match read_records(id, &file, len, store.max_line_bytes, |e| {
        events.push(e);
        std::ops::ControlFlow::Continue(())
    }) {
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
    Ok(LoadedSession { session: Session::persisted(header, events, SessionFile::own(file)), torn })
}

/// On the lane: [`SessionStore::load`] of a session in the segments. A
/// torn last line is left out (with a warning) and left where it is: the
/// segment it ends belongs to a writer that died, and the session goes on
/// in another.
fn load_from_segments(store: &SessionStore, id: &str) -> Result<LoadedSession, SessionError> {
    let dir = store.dir.as_deref().ok_or_else(|| SessionError::NotFound(id.to_owned()))?;
    let mut indexed = store.indexed(true).map_err(|source| SessionError::io(id, source))?;
    if !indexed.index.holds(id) {
        return Err(SessionError::NotFound(id.to_owned()));
    }
    let mut events = Vec::new();
    let (header, torn, _) = indexed.index.read(dir, id, store.max_line_bytes, |e| {
        events.push(e);
        std::ops::ControlFlow::Continue(())
    })?;
    let target = indexed.index.writer_for(dir, id).map_err(|source| SessionError::io(id, source))?;
    Ok(LoadedSession { session: Session::persisted(header, events, SessionFile::shared(target, 0)), torn })
}

/// On the lane: session `id` read to the end, each whole event handed to
/// `event`: its header, whether a torn last line was left out, and its
/// size on disk.
fn read_now(
    store: &SessionStore,
    id: &str,
    mut event: impl FnMut(SessionEvent) -> std::ops::ControlFlow<()>,
) -> Result<(SessionHeader, bool, u64), SessionError> {
    if let Some((_, file, len)) = own_file(store, id, false)? {
        let (header, valid_len) = read_records(id, &file, len, store.max_line_bytes, event)?;
        return Ok((header, valid_len < len, len));
    }
    let dir = store.dir.as_deref().ok_or_else(|| SessionError::NotFound(id.to_owned()))?;
    let indexed = store.indexed(true).map_err(|source| SessionError::io(id, source))?;
    if !indexed.index.holds(id) {
        return Err(SessionError::NotFound(id.to_owned()));
    }
    indexed.index.read(dir, id, store.max_line_bytes, &mut event)
}

/// On the lane: [`SessionStore::inspect`].
fn inspect_now(store: &SessionStore, id: &str) -> Result<StoredSession, SessionError> {
    let mut events = Vec::new();
    let (header, torn, bytes) = read_now(store, id, |e| {
        events.push(e);
        std::ops::ControlFlow::Continue(())
    })?;
    Ok(StoredSession { header, events, torn, bytes })
}

/// On the lane: [`SessionStore::summarize`].
fn summarize_now(store: &SessionStore, id: &str) -> Result<SessionSummary, SessionError> {
    let mut summary = SessionSummary::of(SessionHeader::new("", ""), false, 0);
    let (header, torn, bytes) = read_now(store, id, |event| {
        summary.note(&event);
        std::ops::ControlFlow::Continue(())
    })?;
    (summary.header, summary.torn, summary.bytes) = (header, torn, bytes);
    Ok(summary)
}

/// On the lane: [`SessionStore::remove`]. A file of its own is deleted; a
/// session in the segments gets a removal line, after which it is no
/// session. A session already gone is removed.
fn remove_now(store: &SessionStore, id: &str) -> Result<(), SessionError> {
    let (Some(dir), Some(path)) = (store.dir.as_deref(), store.path_of(id)) else { return Ok(()) };
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(source) => return Err(SessionError::io(id, source)),
    }
    let io_error = |source| SessionError::io(id, source);
    let mut indexed = store.indexed(true).map_err(io_error)?;
    if indexed.index.holds(id) {
        let target = indexed.index.writer_for(dir, id).map_err(io_error)?;
        let mut line = Vec::new();
        push_tagged_line(&mut line, id, &Record::Removed).map_err(io_error)?;
        lane::append(&target, line);
        indexed.index.removed(id);
    }
    Ok(())
}

/// On the lane: [`SessionStore::ids`].
fn ids_now(store: &SessionStore, dir: &Path) -> io::Result<Vec<String>> {
    let mut ids = list_ids(dir)?;
    let mut seen: HashSet<String> = ids.iter().cloned().collect();
    let indexed = store.indexed(true)?;
    ids.extend(indexed.index.ids().filter(|id| seen.insert((*id).clone())).cloned());
    Ok(ids)
}

/// Whether `id` can name a session file.
fn check_id(id: &str) -> Result<(), SessionError> {
    let safe = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':');
    if id.is_empty() || id.len() > 200 || id.starts_with('.') || !id.chars().all(safe) {
        return Err(SessionError::InvalidId(id.to_owned()));
    }
    Ok(())
}
