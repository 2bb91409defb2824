//! What most programs that embed the runtime use, in one import:
//!
//! ```
//! use subagents::prelude::*;
//!
//! let runtime = Runtime::builder().workers(1).build().unwrap();
//! let subagents = runtime.subagents();
//! subagents.register_provider(MockProvider::new("mock").with_reply("42")).unwrap().keep();
//! let result = runtime.block_on(async move {
//!     let request = StartRequest::new("six times seven?", Parent::root("/tmp"), CancellationToken::new());
//!     let run = subagents.start("mock", request).await?;
//!     let result = run.result().await;
//!     run.dispose().await?;
//!     result
//! });
//! assert_eq!(result.unwrap().stop_reason, StopReason::Completed);
//! runtime.shutdown_blocking();
//! ```

#[cfg(feature = "agent")]
pub use crate::agent::{Agent, ScriptedModel};
#[cfg(feature = "agent")]
pub use crate::providers::InProcessProvider;
pub use crate::providers::MockProvider;
pub use crate::{
    Budget, CancellationToken, ContentBlock, Parent, Receipt, Run, RunResult, Runtime, StartRequest, StopReason,
    SubagentError, SubagentEvent, Subagents,
};
