//! The server side of this crate's protocols: what the `subagents` binary
//! runs when another process drives it. You need none of it to embed the
//! runtime; a program that wants to serve the same way calls exactly what
//! the binary calls, one function and its options per door:
//!
//! - [`serve_a2a`]: `subagents a2a --listen ADDR`, this runtime as an
//!   Agent2Agent server over HTTP (the counterpart of the `a2a` provider).
//! - [`serve_acp`]: `subagents acp`, this crate's agent over the Agent
//!   Client Protocol on stdio (the counterpart of the `acp` provider).
//! - [`serve_mcp`]: `subagents mcp`, this runtime's delegation as Model
//!   Context Protocol tools on stdio, for any MCP client to use as the root
//!   parent.
//! - [`serve_stdio`]: `subagents serve`, one session of a full runtime over
//!   stdio JSON-RPC (the child of the `process` provider).
//! - [`serve_worker`]: `subagents worker`, a runtime that runs the `remote`
//!   provider's runs pulled from a NATS JetStream broker.
//! - [`serve_ui`]: `subagents ui` and `--ui`, the web view of runs: a
//!   batch live, delegation trees, transcripts.
//! - [`check_home`] and [`reachable_model`]: what the commands check before
//!   any work (the home, the model endpoint).

#[cfg(all(feature = "a2a", feature = "config"))]
mod a2a;
#[cfg(all(feature = "acp", feature = "agent"))]
mod acp;
#[cfg(any(all(feature = "acp", feature = "agent"), feature = "mcp-server"))]
mod framing;
#[cfg(feature = "mcp-server")]
mod mcp;
#[cfg(any(all(feature = "acp", feature = "agent"), feature = "mcp-server", feature = "process", feature = "remote"))]
mod pipes;
mod preflight;
mod signals;
#[cfg(feature = "process")]
mod stdio;
#[cfg(feature = "ui")]
mod ui;
#[cfg(feature = "remote")]
mod worker;

#[cfg(all(feature = "a2a", feature = "config"))]
pub use a2a::{serve_a2a, A2aServeOptions};
#[cfg(all(feature = "acp", feature = "agent"))]
pub use acp::{serve_acp, AcpServeOptions, DEFAULT_MAX_SESSIONS};
#[cfg(feature = "mcp-server")]
pub use mcp::{serve_mcp, ChildProvider as McpChildProvider, McpServeOptions};
pub use preflight::{check_home, reachable_model};
#[cfg(feature = "process")]
pub use stdio::{serve_stdio, ServeOptions};
#[cfg(feature = "ui")]
pub use ui::{serve_ui, Board, Both, UiOptions, UiServer};
#[cfg(feature = "remote")]
pub use worker::{serve_worker, WorkerOptions, WorkerProvider, WorkerReport};

use std::path::PathBuf;

use crate::agent::ModelError;
use crate::seam::{RegisterError, StartError};

/// Why serving ended in failure (a clean EOF or `shutdown` is `Ok`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The model spec is invalid or its adapter cannot be built.
    #[error("model: {0}")]
    Model(#[from] ModelError),
    /// The home cannot take sessions: not a directory, or not writable.
    #[error("the home {} is not a writable directory: {source}", home.display())]
    Home {
        /// The home named.
        home: PathBuf,
        /// Why it cannot be used.
        #[source]
        source: std::io::Error,
    },
    /// The model's endpoint does not accept a connection.
    #[error("model endpoint {base_url} is unreachable: {source}")]
    Unreachable {
        /// The endpoint's base URL.
        base_url: String,
        /// What the probe met.
        #[source]
        source: ModelError,
    },
    /// The runtime's threads could not start.
    #[error("cannot start the runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The runtime refused a provider the server needs.
    #[error("cannot register a provider: {0}")]
    Provider(#[from] RegisterError),
    /// The runtime refused the subagent tool the server offers.
    #[error("cannot offer the subagent tool: {0}")]
    Tool(#[from] StartError),
    /// The options cannot be honoured together (an unknown provider, a
    /// depth cap the provider does not enforce, a provider that cannot be
    /// configured).
    #[error("{0}")]
    Options(String),
    /// The other side sent a line longer than the protocol allows.
    #[error("the other side sent an oversized line")]
    OversizedLine,
    /// Reading or writing stdio failed, or the protocol layer gave up.
    #[error("the connection failed: {0}")]
    Connection(String),
    /// A worker's broker could not be reached or set up, or dropped the
    /// worker's subscriptions.
    #[error("the broker: {0}")]
    Broker(String),
}
