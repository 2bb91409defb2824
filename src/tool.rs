//! The consumer side of the seam: what a model uses to delegate.
//!
//! - [`SubagentTool`]: delegate a task to one provider, in the foreground
//!   or as a background task.
//! - [`TaskService`] and its tools `task_output`, `task_list`, `task_kill`:
//!   collect and control background tasks.
//!
//! ```
//! use std::sync::Arc;
//! use subagents::agent::{Agent, ScriptedModel};
//! use subagents::providers::SpawnProvider;
//! use subagents::tool::{SubagentTool, SubagentToolConfig, TaskService};
//! use subagents::{Runtime, StopReason};
//!
//! let home = tempfile::tempdir().unwrap();
//! let runtime = Runtime::builder().workers(1).home(home.path()).build().unwrap();
//! let subagents = runtime.subagents();
//! subagents.register_provider(SpawnProvider::new("spawn", Arc::new(ScriptedModel::demo()))).unwrap().keep();
//! let tasks = TaskService::new();
//! let tool = SubagentTool::mount(&subagents, SubagentToolConfig::new("spawn"), Some(tasks.clone())).unwrap();
//! let mut parent = Agent::builder(ScriptedModel::demo()).cwd(home.path()).tool(tool);
//! for task_tool in tasks.tools() {
//!     parent.toolset_mut().add_shared(task_tool).unwrap();
//! }
//! let parent = parent.build().unwrap();
//! let outcome = runtime.block_on(async move { parent.prompt("check the parser; check the docs").await });
//! assert_eq!(outcome.stop_reason, StopReason::Completed);
//! assert!(outcome.output.contains("handled: check the docs"));
//! runtime.shutdown_blocking();
//! ```

mod subagent;
mod tasks;

pub use subagent::{stop_message, MaxDepth, SubagentTool, SubagentToolConfig};
pub use tasks::{KillOutcome, TaskService, TaskSnapshot, TaskStatus, UnknownTask, DEFAULT_WAIT, MAX_WAIT};
