//! `spawn`: a fresh in-process child agent per run.
//!
//! **Choose it** for cheap, isolated subtasks in this process: the child
//! starts with its own session (its id is the run's child id, not its run
//! id; `parent_session` lineage and depth in its header), its own system
//! prompt, and an empty conversation, so the prompt must stand alone.
//!
//! **Advertises** every start-time capability: structured output, depth
//! limit, tool filter, persona, agent options. Runtime features: steering
//! (a message reaches the child at its next model call) and continuation
//! (a new run on the same session once this one settled). `local_agent()`
//! is the child's [`Agent`](crate::agent::Agent).
//!
//! **Fails and recovers**: a model or tool failure settles `Error` with a
//! safe diagnostic; a missing structured result after the nudges settles
//! `Error` (`missing-structured-output`); cancel settles `Aborted`; dispose
//! waits for the child to go idle and closes its session. A
//! start cancelled before publication deletes the session it created.
//!
//! **Limits**: the child shares this process (a runaway tool affects the
//! parent); its tools come from the provider's tool factory.
//!
//! ```
//! use std::sync::Arc;
//! use subagents::agent::ScriptedModel;
//! use subagents::providers::InProcessProvider;
//! use subagents::{CancellationToken, Parent, Runtime, StartRequest, StopReason};
//!
//! let home = tempfile::tempdir().unwrap();
//! let runtime = Runtime::builder().workers(1).home(home.path()).build().unwrap();
//! let subagents = runtime.subagents();
//! subagents.register_provider(InProcessProvider::spawn("spawn", Arc::new(ScriptedModel::new()))).unwrap().keep();
//! let text = runtime.block_on(async move {
//!     let request = StartRequest::new("list the risks", Parent::root(std::env::temp_dir()), CancellationToken::new());
//!     let run = subagents.start("spawn", request).await.unwrap();
//!     let result = run.result().await.unwrap();
//!     run.dispose().await.unwrap();
//!     assert_eq!(result.stop_reason, StopReason::Completed);
//!     result.text()
//! });
//! assert_eq!(text, "handled: list the risks");
//! runtime.shutdown_blocking();
//! ```

use std::sync::Arc;

use super::in_process::InProcessProvider;
use crate::agent::Model;

impl InProcessProvider {
    /// A `spawn` provider named `name` whose children talk to `model`;
    /// configure it with the `with_*` methods.
    pub fn spawn(name: impl Into<String>, model: Arc<dyn Model>) -> InProcessProvider {
        InProcessProvider::new(name.into(), model, false)
    }
}
