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

mod run_agent;
mod subagent;
mod tasks;

use std::sync::{Arc, OnceLock};

pub use subagent::{
    stop_message, Begun, Delegated, Delegation, DelegationError, ForegroundRun, MaxDepth, SubagentTool,
    SubagentToolConfig,
};
pub use tasks::{
    KillOutcome, TaskLimit, TaskService, TaskSnapshot, TaskStatus, UnknownTask, DEFAULT_MAX_LIVE_TASKS, DEFAULT_WAIT,
    MAX_WAIT,
};

use crate::actors::Subagents;
use crate::agent::{ListDir, ReadFile, Tool, Toolset};
use crate::providers::{ChildInfo, InProcessProvider};
use crate::seam::StartError;

/// How deep the built-in doors let a delegation tree grow when nothing
/// says otherwise: children, grandchildren and great-grandchildren.
pub const DEFAULT_MAX_DEPTH: u32 = 3;

/// Registers (and keeps) an in-process `spawn` provider on `model` whose
/// children get [`shared_delegating_toolset`] on it, capped at
/// [`DEFAULT_MAX_DEPTH`]: what `subagents acp`, `serve` and `worker` run
/// their children on without a configuration file.
pub fn register_delegating_spawn(
    subagents: &Subagents,
    tasks: &TaskService,
    model: Arc<dyn crate::agent::Model>,
) -> Result<(), crate::RegisterError> {
    let kit = shared_delegating_toolset(subagents, tasks, "spawn", DEFAULT_MAX_DEPTH);
    let spawn = InProcessProvider::spawn("spawn", model).with_tools(Arc::new(move |_: &ChildInfo| kit()));
    subagents.register_provider(spawn)?.keep();
    Ok(())
}

/// The kit of an agent that may delegate: `read_file`, `list_dir`, a
/// `subagent` tool bound to `provider` (children at most `max_depth`
/// deep, background runs on `tasks`) and the task tools.
pub fn delegating_tools(
    subagents: &Subagents,
    tasks: &TaskService,
    provider: &str,
    max_depth: u32,
) -> Result<Vec<Arc<dyn Tool>>, StartError> {
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
    let builtins: Vec<Arc<dyn Tool>> = vec![Arc::new(ReadFile), Arc::new(ListDir)];
    delegating_kit(subagents, tasks, builtins, vec![provider.to_owned()], max_depth)
}

/// A shared kit of `builtins`, one subagent tool per provider in `offered`
/// and the task tools ([`delegating_tool_list`]), built on the first call,
/// when every offered provider must be registered, and cloned after.
pub fn delegating_kit(
    subagents: &Subagents,
    tasks: &TaskService,
    builtins: Vec<Arc<dyn Tool>>,
    offered: Vec<String>,
    max_depth: u32,
) -> impl Fn() -> Toolset + Send + Sync + 'static {
    let built: Arc<OnceLock<Toolset>> = Arc::default();
    let (subagents, tasks) = (subagents.clone(), tasks.clone());
    move || {
        built
            .get_or_init(|| {
                let mut tools = Toolset::new();
                for tool in delegating_tool_list(&subagents, &tasks, &builtins, &offered, max_depth) {
                    tools.add_shared(tool).expect("the kit's names are distinct");
                }
                tools
            })
            .clone()
    }
}

/// `builtins`, one subagent tool per provider in `offered` (the first
/// named `subagent`, each other `subagent_<provider>`; children at most
/// `max_depth` deep where the provider enforces a cap, else the provider
/// manages depth), and the task tools when any subagent tool is offered.
/// Every offered provider must be registered; a tool that cannot be
/// mounted is left out with a warning.
pub fn delegating_tool_list(
    subagents: &Subagents,
    tasks: &TaskService,
    builtins: &[Arc<dyn Tool>],
    offered: &[String],
    max_depth: u32,
) -> Vec<Arc<dyn Tool>> {
    let mut tools = builtins.to_vec();
    let mut mounted = false;
    for (index, provider) in offered.iter().enumerate() {
        let name = if index == 0 { "subagent".to_owned() } else { format!("subagent_{provider}") };
        // A provider that enforces no depth cap (an ACP agent, a process
        // child) owns its own: the tool sends none.
        let enforces = subagents.provider(provider).is_some_and(|info| info.capabilities.depth_limit);
        let depth = if enforces { MaxDepth::Limit(max_depth) } else { MaxDepth::ProviderManaged };
        let config = SubagentToolConfig::new(provider.as_str()).with_tool_name(name).with_max_depth(depth);
        match SubagentTool::mount(subagents, config, Some(tasks.clone())) {
            Ok(tool) => {
                tools.push(Arc::new(tool));
                mounted = true;
            }
            Err(error) => tracing::warn!(%provider, %error, "children get no subagent tool for it"),
        }
    }
    if mounted {
        tools.extend(tasks.tools());
    }
    tools
}
