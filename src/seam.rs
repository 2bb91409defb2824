//! The seam vocabulary: every type that crosses between callers, the actor
//! tree and providers.
//!
//! Providers and the model-facing tool depend on this module only; the
//! actors never name a concrete provider and providers never reach into the
//! actors. The three parts of the seam (interface, implementations,
//! consumer) can therefore change independently.
//!
//! ```
//! use subagents::{CancellationToken, ContentBlock, Parent, StartRequest, StopReason};
//!
//! let request = StartRequest::new("summarise the report", Parent::root("/tmp"), CancellationToken::new())
//!     .with_label("summary")
//!     .with_max_depth(2);
//! assert_eq!(request.prompt, vec![ContentBlock::text("summarise the report")]);
//! assert_eq!(serde_json::to_string(&StopReason::MaxTokens).unwrap(), "\"max-tokens\"");
//! ```
//!
//! # Writing a provider
//!
//! A provider is two traits: [`Provider`] makes a child for each start and
//! [`Child`] runs it, stops it and releases it. Every future they return is
//! `'static` and runs on the run's own actor thread (so it need not be
//! `Send`): copy what it needs out of `&self` before `Box::pin(async move {
//! … })`; a future that borrows `self` cannot match the trait, whatever
//! lifetime the compiler suggests. The runtime does the rest: it refuses a
//! request for a capability the provider does not advertise before
//! `launch`, trips `Launch::cancel` on cancel and early dispose, contains a
//! panic as a settled `Error`, and counts the run until `dispose` resolves.
//!
//! An echo provider with a delay, registered and run (the same program is
//! `examples/echo_provider.rs` in the repository):
//!
//! ```
//! use std::time::Duration;
//!
//! use subagents::seam::{
//!     text_of, Capabilities, Child, Failure, Launch, LaunchError, LocalBoxFuture, Provider, RunResult, StopReason,
//! };
//! use subagents::{CancellationToken, Parent, Runtime, StartRequest};
//!
//! /// Answers each prompt with `echo: PROMPT` after `delay`.
//! struct EchoProvider {
//!     name: String,
//!     delay: Duration,
//! }
//!
//! impl Provider for EchoProvider {
//!     fn name(&self) -> &str {
//!         &self.name
//!     }
//!
//!     /// It honours no persona, schema, tool filter or depth limit: the
//!     /// runtime refuses a request that asks for one before `launch`.
//!     fn capabilities(&self) -> Capabilities {
//!         Capabilities::none()
//!     }
//!
//!     fn launch(&self, launch: Launch) -> LocalBoxFuture<'static, Result<Box<dyn Child>, LaunchError>> {
//!         let delay = self.delay; // copied out: the future may not borrow `self`
//!         Box::pin(async move {
//!             if launch.cancel.is_cancelled() {
//!                 return Err(LaunchError::Aborted); // nothing to roll back yet
//!             }
//!             let child = EchoChild {
//!                 id: format!("echo-{}", launch.context.run_id()),
//!                 prompt: text_of(&launch.request.prompt),
//!                 delay,
//!                 cancel: launch.cancel,
//!             };
//!             Ok(Box::new(child) as Box<dyn Child>)
//!         })
//!     }
//! }
//!
//! /// One live echo. `cancel` trips when the run is cancelled or disposed
//! /// early, so `run` watches it instead of implementing `Child::cancel`.
//! struct EchoChild {
//!     id: String,
//!     prompt: String,
//!     delay: Duration,
//!     cancel: CancellationToken,
//! }
//!
//! impl Child for EchoChild {
//!     fn id(&self) -> String {
//!         self.id.clone()
//!     }
//!
//!     fn run(&self) -> LocalBoxFuture<'static, RunResult> {
//!         let (prompt, delay, cancel) = (self.prompt.clone(), self.delay, self.cancel.clone());
//!         Box::pin(async move {
//!             tokio::select! {
//!                 _ = tokio::time::sleep(delay) => RunResult::completed(format!("echo: {prompt}")),
//!                 _ = cancel.cancelled() => RunResult::empty(StopReason::Aborted),
//!             }
//!         })
//!     }
//!
//!     /// Nothing to release: no session, no process.
//!     fn dispose(&self) -> LocalBoxFuture<'static, Result<(), Failure>> {
//!         Box::pin(async { Ok(()) })
//!     }
//! }
//!
//! let runtime = Runtime::builder().build().expect("runtime");
//! let subagents = runtime.subagents();
//! let echo = EchoProvider { name: "echo".into(), delay: Duration::from_millis(20) };
//! subagents.register_provider(echo).expect("a unique name").keep();
//!
//! runtime.block_on(async move {
//!     let request = StartRequest::new("hello", Parent::root("/tmp"), CancellationToken::new());
//!     let run = subagents.start("echo", request).await.expect("started");
//!     let result = run.result().await.expect("settled");
//!     run.dispose().await.expect("disposed"); // the caller owns the run: always dispose
//!     assert_eq!(result.text(), "echo: hello");
//!     println!("{} answered {:?}", run.child_id(), result.text());
//!
//!     // Cancelled while it waits: the run settles `aborted`.
//!     let request = StartRequest::new("never mind", Parent::root("/tmp"), CancellationToken::new());
//!     let run = subagents.start("echo", request).await.expect("started");
//!     run.cancel();
//!     let result = run.result().await.expect("settled");
//!     run.dispose().await.expect("disposed");
//!     assert_eq!(result.stop_reason, StopReason::Aborted);
//!     println!("{} stopped: {:?}", run.child_id(), result.stop_reason);
//!
//!     // A request for something it does not advertise is refused at start.
//!     let request = StartRequest::new("hi", Parent::root("/tmp"), CancellationToken::new()).with_persona("a pirate");
//!     let refused = subagents.start("echo", request).await.expect_err("persona is not advertised");
//!     println!("refused: {refused}");
//! });
//! let report = runtime.shutdown_blocking();
//! assert!(report.live_after.is_quiescent(), "nothing left running");
//! ```

mod approval;
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
#[cfg(feature = "agent")]
pub(crate) use approval::glob;
pub use approval::{
    Answer, Approvals, Approver, Hop, OptionKind, PermissionOption, PermissionRequest, Policy, RequestField, Rule,
    Rules, Verdict, DEFAULT_APPROVAL_TIMEOUT, MAX_JUDGED, MAX_JUDGED_INPUT, MAX_PATHS, MAX_PATH_BYTES, MAX_SHOWN_INPUT,
};
pub(crate) use budget::{admit as budget_admit, Admission};
pub use budget::{Budget, BudgetExhausted, BudgetLease, BudgetLimit};
pub use content::{text_of, ContentBlock};
pub use error::{DisposeError, RegisterError, StartError, SteeringError, SubagentError};
/// The boxed, `Send` future an [`Approver`] returns.
pub use futures_util::future::BoxFuture;
/// The boxed, `!Send` future a [`Provider`] and a [`Child`] return (they
/// run on their run actor's thread).
pub use futures_util::future::LocalBoxFuture;
pub use progress::{ProgressSink, ProgressUpdate, ToolCallStatus};
pub(crate) use provider::{forward_provider_queries, RunReporter};
pub use provider::{CaptureError, Child, Launch, LaunchError, LocalAgent, Provider, ProviderContext, ProviderInfo};
pub use receipt::{Branch, Receipt, StopReport};
pub use request::{
    AgentOptions, BatchTask, Capabilities, Capability, Detached, Parent, StartRequest, ToolFilter, MAX_DEPTH_CAP,
};
pub(crate) use result::cut;
pub use result::{Category, Diagnostic, Failure, RunResult, Stage, StopReason, WorkspaceReport};
pub use shown::{safe_block, safe_line};
pub(crate) use trace::TraceContext;
pub use usage::RunUsage;
