//! The consumer side of the seam: what a model uses to delegate.
//!
//! - [`SubagentTool`]: delegate a task to one provider, in the foreground
//!   or as a background task.
//! - [`TaskService`] and its tools `task_output`, `task_list`, `task_kill`:
//!   collect and control background tasks.
//!
//! ```
//! use std::sync::{Arc, OnceLock};
//! use subagents::agent::{Agent, ScriptedModel};
//! use subagents::providers::InProcessProvider;
//! use subagents::tool::{SubagentTool, SubagentToolConfig, TaskService};
//! use subagents::{Runtime, StopReason};
//!
//! let home = tempfile::tempdir().unwrap();
//! let runtime = Runtime::builder().workers(1).home(home.path()).build().unwrap();
//! let subagents = runtime.subagents();
//! subagents.register_provider(InProcessProvider::spawn("spawn", Arc::new(ScriptedModel::demo()))).unwrap().keep();
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

use std::sync::{Arc, OnceLock};

pub use subagent::{
    stop_message, Begun, Delegated, Delegation, ForegroundRun, MaxDepth, SubagentTool, SubagentToolConfig,
};
pub use tasks::{
    KillOutcome, TaskLimit, TaskService, TaskSnapshot, TaskStatus, UnknownTask, DEFAULT_MAX_LIVE_TASKS, DEFAULT_WAIT,
    MAX_WAIT,
};

use crate::actors::Subagents;
use crate::agent::{ListDir, ReadFile, Tool, Toolset};
use crate::seam::SubagentError;

/// The kit of an agent that may delegate: `read_file`, `list_dir`, a
/// `subagent` tool bound to `provider` (children at most `max_depth`
/// deep, background runs on `tasks`) and the task tools.
pub fn delegating_tools(
    subagents: &Subagents,
    tasks: &TaskService,
    provider: &str,
    max_depth: u32,
) -> Result<Vec<Arc<dyn Tool>>, SubagentError> {
    let config = SubagentToolConfig::new(provider).with_max_depth(MaxDepth::Limit(max_depth));
    let subagent = SubagentTool::mount(subagents, config, Some(tasks.clone()))?;
    let mut tools: Vec<Arc<dyn Tool>> = vec![Arc::new(ReadFile), Arc::new(ListDir), Arc::new(subagent)];
    tools.extend(tasks.tools());
    Ok(tools)
}

/// The delegating kit as one shared [`Toolset`], built on the first call
/// (the provider must be registered by then) and cloned after: every child
/// of the CLI, `subagents acp` and `subagents serve` gets the same tools,
/// and a child at its depth cap is not offered `subagent`
/// ([`Tool::offered_at_depth`]). When the kit cannot be mounted the
/// children get the file tools and a warning is logged.
///
/// An in-process provider takes it as its tool factory:
/// `.with_tools(Arc::new(move |_: &ChildInfo| kit()))`.
pub fn shared_delegating_toolset(
    subagents: &Subagents,
    tasks: &TaskService,
    provider: &str,
    max_depth: u32,
) -> impl Fn() -> Toolset + Send + Sync + 'static {
    let built: Arc<OnceLock<Toolset>> = Arc::default();
    let (subagents, tasks, provider) = (subagents.clone(), tasks.clone(), provider.to_owned());
    move || {
        built
            .get_or_init(|| {
                let mut tools = Toolset::new();
                let kit = delegating_tools(&subagents, &tasks, &provider, max_depth).unwrap_or_else(|error| {
                    tracing::warn!(%provider, %error, "children get no subagent tool");
                    vec![Arc::new(ReadFile), Arc::new(ListDir)]
                });
                for tool in kit {
                    tools.add_shared(tool).expect("the kit's names are distinct");
                }
                tools
            })
            .clone()
    }
}
