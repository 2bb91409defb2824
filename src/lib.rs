// The README is the crate's front page when every door is built (its
// examples use them all); the core alone gets the short page below.
#![cfg_attr(feature = "cli", doc = include_str!("../README.md"))]
#![cfg_attr(
    not(feature = "cli"),
    doc = "A supervised actor runtime in which one AI agent delegates work to child agents through named \
           providers. This build has a subset of the crate's features; the README lists them."
)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(unused_must_use)]
#![forbid(unsafe_code)]

mod actors;
#[cfg(feature = "agent")]
pub mod agent;
#[cfg(feature = "batch")]
pub mod batch;
#[cfg(any(feature = "acp", feature = "process", feature = "mcp-client"))]
mod child_process;
#[cfg(feature = "config")]
pub mod config;
mod contain;
pub mod events;
mod live;
mod mix;
pub mod prelude;
pub mod providers;
pub mod schema;
pub mod seam;
#[cfg(any(
    all(feature = "acp", feature = "agent"),
    all(feature = "a2a", feature = "config"),
    feature = "mcp-server",
    feature = "process",
    feature = "remote"
))]
pub mod serve;
mod sync;
pub mod telemetry;
#[cfg(any(feature = "openai", feature = "a2a", feature = "mcp-client"))]
mod tls;
#[cfg(feature = "agent")]
pub mod tool;
#[cfg(any(feature = "a2a", feature = "acp", feature = "process"))]
mod wire;

pub use actors::{
    Continuation, PhaseReport, Registration, Run, Runtime, RuntimeBuilder, RuntimeTask, ScopedRegistration,
    ShutdownReport, Steering, Subagents,
};
pub use events::SubagentEvent;
pub use seam::{
    AgentOptions, Budget, BudgetLease, ContentBlock, Detached, DisposeError, Parent, Receipt, RegisterError, RunResult,
    StartError, StartRequest, SteeringError, StopReason, SubagentError, ToolFilter,
};
pub use tokio_util::sync::CancellationToken;
