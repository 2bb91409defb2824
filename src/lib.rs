#![doc = include_str!("../README.md")]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![deny(unused_must_use)]

pub mod actors;
pub mod agent;
mod contain;
pub mod events;
mod live;
mod mix;
pub mod prelude;
pub mod providers;
pub mod schema;
pub mod seam;
pub mod serve;
mod sync;
pub mod tool;

pub use actors::{
    Continuation, PhaseReport, Registration, Run, Runtime, RuntimeBuilder, RuntimeTask, ShutdownReport, Steering,
    Subagents,
};
pub use events::{
    EventRecvError, EventStream, ListenerHandle, ProgressUpdate, RunEndInfo, RunInfo, RunProgress, SubagentEvent,
};
pub use live::{Live, ProcessLease};
pub use seam::{
    text_of, AgentOptions, Branch, Budget, BudgetExhausted, BudgetLease, BudgetLimit, Capabilities, Capability,
    Category, Child, ContentBlock, Diagnostic, Launch, LaunchError, LocalAgent, Parent, Provider, ProviderContext,
    ProviderInfo, Receipt, RunResult, Stage, StartRequest, StopReason, StopReport, SubagentError, ToolFilter,
    MAX_DEPTH_CAP,
};
pub use tokio_util::sync::CancellationToken;
