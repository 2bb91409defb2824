//! Why an MCP server's tools are not available: [`McpServerError`], and
//! inside it why a start failed ([`McpStartError`]). The messages are what
//! a model reads when a call finds its server unavailable.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// Why an MCP server's tools could not be had.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpServerError {
    /// [`McpServer::shutdown`](super::McpServer::shutdown) closed it.
    #[error("the MCP server {server:?} is shut down")]
    ShutDown {
        /// The server's name.
        server: String,
    },
    /// It failed to start or died recently and is waiting out its backoff
    /// (a run about to start does not wait for it).
    #[error("the MCP server {server:?} is waiting to be started again")]
    BackingOff {
        /// The server's name.
        server: String,
    },
    /// Starting it failed.
    #[error("the MCP server {server:?} did not start: {reason}")]
    DidNotStart {
        /// The server's name.
        server: String,
        /// What failed.
        reason: McpStartError,
    },
}

/// Why starting an MCP server failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum McpStartError {
    /// Neither the server nor its owner names a working directory, and the
    /// process has none.
    #[error("no working directory: {0}")]
    NoWorkingDirectory(io::Error),
    /// The command could not be spawned.
    #[error("{}: {source}", command.display())]
    Spawn {
        /// The command.
        command: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A streamable HTTP server's URL or headers cannot be used.
    #[error("{0}")]
    Endpoint(String),
    /// The `initialize` handshake failed.
    #[error("initialize failed: {0}")]
    Initialize(String),
    /// The first `tools/list` failed.
    #[error("tools/list failed: {0}")]
    ListTools(String),
    /// `initialize` and the first `tools/list` took longer than the
    /// server's `initialize_timeout`.
    #[error("no answer to initialize within {0:?}")]
    Timeout(Duration),
}
