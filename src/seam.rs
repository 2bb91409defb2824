//! The seam vocabulary: every type that crosses between callers, the actor
//! tree and providers.
//!
//! Providers and the model-facing tool depend on this module only; the
//! actors never name a concrete provider and providers never reach into the
//! actors. The three parts of the seam (interface, implementations,
//! consumer) can therefore change independently.
//!
//! ```
//! use subagents::{ContentBlock, Parent, StartRequest, StopReason};
//! use tokio_util::sync::CancellationToken;
//!
//! let request = StartRequest::new("summarise the report", Parent::root("/tmp"), CancellationToken::new())
//!     .with_label("summary")
//!     .with_max_depth(2);
//! assert_eq!(request.prompt, vec![ContentBlock::text("summarise the report")]);
//! assert_eq!(serde_json::to_string(&StopReason::MaxTokens).unwrap(), "\"max-tokens\"");
//! ```

mod budget;
mod content;
mod error;
mod progress;
mod provider;
mod receipt;
mod request;
mod result;
mod shown;
mod trace;
mod usage;

pub use crate::live::ProcessLease;
pub(crate) use budget::{admit as budget_admit, Admission};
pub use budget::{Budget, BudgetExhausted, BudgetLease, BudgetLimit};
pub use content::{text_of, ContentBlock};
pub use error::{DisposeError, RegisterError, StartError, SteeringError, SubagentError};
/// The boxed, `!Send` future a [`Provider`] and a [`Child`] return (they
/// run on their run actor's thread).
pub use futures_util::future::LocalBoxFuture;
pub use progress::{ProgressSink, ProgressUpdate, ToolCallStatus};
pub(crate) use provider::RunReporter;
pub use provider::{CaptureError, Child, Launch, LaunchError, LocalAgent, Provider, ProviderContext, ProviderInfo};
pub use receipt::{Branch, Receipt, StopReport};
pub use request::{AgentOptions, Capabilities, Capability, Detached, Parent, StartRequest, ToolFilter, MAX_DEPTH_CAP};
#[cfg(any(feature = "mcp-client", feature = "a2a", feature = "config"))]
pub(crate) use result::cut;
pub use result::{Category, Diagnostic, Failure, RunResult, Stage, StopReason};
pub use shown::{safe_block, safe_line};
pub(crate) use trace::TraceContext;
pub use usage::RunUsage;
