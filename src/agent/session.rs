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
pub use store::{LoadedSession, SessionStore, SessionSummary, StoredSession, DEFAULT_MAX_LINE_BYTES};
