//! [`SessionError`]: why a session could not be created, loaded or written.

use std::io;

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
    /// socket: it is not read (see [`SessionStore`](super::SessionStore)
    /// on what is trusted).
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

impl SessionError {
    /// The file system failed for session `id`.
    pub(super) fn io(id: &str, source: io::Error) -> Self {
        SessionError::Io { id: id.to_owned(), source }
    }

    /// The lane did not answer (its job panicked): an I/O error for `id`.
    pub(super) fn lane_failed(id: &str) -> Self {
        Self::io(id, io::Error::other("the session file operation failed"))
    }
}
