//! Sessions: the append-only log of one agent's conversation.
//!
//! A session is a header (id, parent session, delegation depth, cwd, persona,
//! creation time) and a list of events (user message, assistant message with
//! its tool calls, tool result, turn end with its reason). A
//! [`SessionStore`] persists them as JSON lines under `<home>/sessions/`:
//! many sessions share a segment file (`<segment>.log`, one per writing
//! store at a time), each line tagged with its session's id, the header
//! first, then one line per event. A file of its own per session
//! (`<id>.jsonl`, the layout of earlier versions) still loads, lists and
//! continues in place. Creating a file per session was most of what
//! persisting a short run cost; appending a few lines to a segment that is
//! already open costs a share of one `write`. A segment is rotated past
//! 64 MiB, and a session's lines are found by scanning the segments' new
//! lines into an index of where each session's lines lie.
//!
//! No session file is touched on the caller's thread: every file operation
//! of the process runs, in the order it was asked for, on one thread of its
//! own (the session lane), so an actor thread never waits for the disk.
//! [`Session::append`] queues one whole line and returns (lines queued
//! together are written together; no `fsync`); creating, loading, reading
//! and closing wait for the lane's answer — the synchronous methods by
//! blocking, the runtime's own paths by awaiting it. So a session's
//! header is queued before anything appended to it, a read sees every
//! append queued before it, and a run's `dispose` returns only after its
//! log reached the file. A process killed mid-turn leaves a prefix of its
//! events on disk (the newest may still have been queued), and a crash
//! mid-write can leave only the *last* line of a file torn — in a segment,
//! one session's last line, every other session in it whole:
//! [`SessionStore::load`] drops that line with a warning and keeps every
//! earlier event (a file of its own is cut back to its whole lines; a
//! segment is left as it is, the session goes on in a newer one). A
//! session killed before its header was written never existed: loading
//! it reports `NotFound` (and removes a file of its own that was left
//! empty). Resuming a session never lowers its depth.
//!
//! Transcripts hold prompts and file contents, so they are private: the
//! `sessions` directory (and any missing home above it that the store
//! creates) is 0700 and every segment and session file 0600, whatever the
//! umask; a `sessions` that is a symlink is refused, never its target
//! changed. Reading a file is bounded whatever sits under its name (see
//! [`SessionStore`]), and [`SessionStore::summarize`] reads one session
//! without keeping its events.
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

mod error;
mod event;
mod file;
mod lane;
mod live;
mod segment;
mod store;

pub use error::SessionError;
pub(crate) use event::completed_prefix;
pub use event::{SessionEvent, SessionHeader, ToolCall};
pub use live::Session;
#[cfg(any(feature = "acp", feature = "a2a"))]
pub(crate) use store::HomeStores;
pub use store::{LoadedSession, SessionStore, SessionSummary, StoredSession, DEFAULT_MAX_LINE_BYTES};
