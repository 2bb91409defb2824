//! The driver `spawn` and `fork` share: a child [`Agent`] owned by its run
//! actor.
//!
//! A launch creates the child's session (its id is the run id; the header
//! records the parent session and depth) before `start` returns, so the
//! child is published only once it really exists. The child's route is the
//! provider's defaults, overridden by the parent's route, overridden by the
//! request's `agent_options`, field by field; the route's `provider` picks a
//! model from [`ModelRoutes`]. The persona replaces the persona section; the
//! tool filter hides tools from the child's list and denies them at
//! execution. A structured child gets its own `structured_output` tool
//! (docs/contract.md §8) whose capture is a message to the run actor. A child whose
//! start answered to a delegation budget holds its lease
//! ([`ProviderContext::budget`]): its turns spend the budget's tokens and
//! time, and its own children answer to it.
//!
//! MCP servers: a child mounts its provider's when the provider scopes
//! them, else its parent agent's (the same connections), narrowed by the
//! request's `mcp_servers` (see `mcp_mounts.rs`).
//!
//! Rollback: a child that is disposed without ever having run (a cancel
//! between creation and publication) has its session file deleted, so a
//! rejected start leaves nothing behind.

mod mcp_mounts;

use std::cell::{Cell, RefCell};
use std::future::Ready;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::{BoxFuture, Either, LocalBoxFuture};
use futures_util::FutureExt;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use self::mcp_mounts::{McpMounts, RunMounts, MCP_TOOL_PREFIX};
use crate::agent::{
    completed_prefix, ids, Agent, AgentBuilder, AgentError, AgentUpdate, Approving, ListDir, Model, ReadFile,
    SessionEvent, SessionStore, Tool, ToolContext, ToolOutput, ToolSpec, Toolset, TurnOutcome,
};
use crate::seam::ProgressUpdate;
use crate::seam::{
    AgentOptions, Budget, Capabilities, CaptureError, Category, Child, ContentBlock, Diagnostic, Failure, Launch,
    LaunchError, LocalAgent, Provider, ProviderContext, RunResult, RunUsage, Stage, StartRequest, SteeringError,
    StopReason,
};

/// The name of the capture tool a structured child gets.
pub const STRUCTURED_OUTPUT_TOOL: &str = "structured_output";

const STRUCTURED_SECTION: &str = "structured_output";
const STRUCTURED_INSTRUCTION: &str = "When your answer is ready, call the `structured_output` tool exactly once \
     with the answer as its arguments; its parameters are the required shape of the answer. Calling it ends \
     your turn.";
const STRUCTURED_NUDGE: &str = "You finished without calling `structured_output`. Call it now with your answer; \
     its parameters are the required shape.";

/// What a tool factory knows about the child it equips.
#[derive(Clone, Debug)]
pub struct ChildInfo {
    /// The child's session (and run) id.
    pub session_id: String,
    /// The delegating parent's session.
    pub parent_session: Option<String>,
    /// The child's delegation depth.
    pub depth: u32,
    /// The child's working directory.
    pub cwd: PathBuf,
}

/// Builds each child's tools (the default: `read_file` and `list_dir`).
/// Build the tool set once and return clones: a clone shares the tools and
/// their compiled schemas, so a child costs no schema compilation.
pub type ToolFactory = Arc<dyn Fn(&ChildInfo) -> Toolset + Send + Sync>;

/// Which model a child talks to: the route's `provider` names one; no name
/// means the default.
#[derive(Clone)]
pub struct ModelRoutes {
    default: Arc<dyn Model>,
    named: Vec<(String, Arc<dyn Model>)>,
}

impl std::fmt::Debug for ModelRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let named: Vec<(&str, &str)> = self.named.iter().map(|(route, model)| (route.as_str(), model.name())).collect();
        f.debug_struct("ModelRoutes").field("default", &self.default.name()).field("named", &named).finish()
    }
}

impl ModelRoutes {
    /// Every child talks to `model`.
    pub fn new(model: Arc<dyn Model>) -> Self {
        ModelRoutes { default: model, named: Vec::new() }
    }

    /// Routes naming `provider` talk to `model`.
    pub fn with(mut self, provider: impl Into<String>, model: Arc<dyn Model>) -> Self {
        self.named.push((provider.into(), model));
        self
    }

    fn resolve(&self, provider: Option<&str>) -> Option<Arc<dyn Model>> {
        match provider {
            None => Some(self.default.clone()),
            Some(name) => self.named.iter().find(|(n, _)| n == name).map(|(_, model)| model.clone()),
        }
    }
}

/// How an in-process provider builds its children.
#[derive(Clone)]
struct InProcessConfig {
    models: ModelRoutes,
    persist: bool,
    tools: ToolFactory,
    structured_nudge_retries: u32,
    route_defaults: AgentOptions,
    max_steps: u32,
    /// The persona of a child whose request names none.
    persona: Option<String>,
    /// The budget a run gets when its request carries none.
    budget: Option<Budget>,
    /// The MCP servers whose tools each child mounts; `None`: its parent's.
    mcp: Option<Arc<McpMounts>>,
    /// The tools (names or globs) that ask before they run, and how long
    /// they wait for an answer.
    approve: Option<(Arc<[String]>, Duration)>,
}

/// The provider behind `spawn` and `fork` (build one with
/// [`InProcessProvider::spawn`] or [`InProcessProvider::fork`]); configure
/// it with the `with_*` methods before registering it.
pub struct InProcessProvider {
    /// Shared with each run (its diagnostics name the provider).
    name: Arc<str>,
    config: InProcessConfig,
    fork: bool,
    /// The session store for the runtime home last seen (one per provider
    /// in practice), so the sessions directory is checked once.
    store: Mutex<Option<(PathBuf, Arc<SessionStore>)>>,
    /// The store of a provider that keeps sessions in memory.
    in_memory: Arc<SessionStore>,
}

impl std::fmt::Debug for InProcessProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessProvider").field("name", &self.name).field("fork", &self.fork).finish_non_exhaustive()
    }
}

impl InProcessProvider {
    /// What an in-process provider advertises: every start-time capability.
    pub const CAPABILITIES: Capabilities = Capabilities::all();

    /// Children on `model`, sessions persisted under the runtime's home,
    /// `read_file` and `list_dir`, one structured nudge, 64 steps a turn.
    pub(crate) fn new(name: String, model: Arc<dyn Model>, fork: bool) -> Self {
        // Built once: clones share the tools and their compiled schemas.
        let mut builtins = Toolset::new();
        builtins.add(ReadFile).expect("a fresh toolset takes read_file");
        builtins.add(ListDir).expect("a fresh toolset takes list_dir");
        let config = InProcessConfig {
            models: ModelRoutes::new(model),
            persist: true,
            tools: Arc::new(move |_: &ChildInfo| builtins.clone()),
            structured_nudge_retries: 1,
            route_defaults: AgentOptions::default(),
            max_steps: 64,
            persona: None,
            budget: None,
            mcp: None,
            approve: None,
        };
        InProcessProvider {
            name: name.into(),
            config,
            fork,
            store: Mutex::new(None),
            in_memory: Arc::new(SessionStore::in_memory()),
        }
    }

    /// Pick models by the route's `provider`.
    pub fn with_models(mut self, models: ModelRoutes) -> Self {
        self.config.models = models;
        self
    }

    /// Keep sessions in memory only (no files).
    pub fn in_memory(mut self) -> Self {
        self.config.persist = false;
        self
    }

    /// Build each child's tools.
    pub fn with_tools(mut self, factory: ToolFactory) -> Self {
        self.config.tools = factory;
        self
    }

    /// Re-prompts after a finish without a structured capture (default 1).
    pub fn with_structured_nudge_retries(mut self, retries: u32) -> Self {
        self.config.structured_nudge_retries = retries;
        self
    }

    /// Route defaults, under the parent's route and the request's options.
    pub fn with_route_defaults(mut self, route: AgentOptions) -> Self {
        self.config.route_defaults = route;
        self
    }

    /// Most model calls per child turn (default 64).
    pub fn with_max_steps(mut self, max_steps: u32) -> Self {
        self.config.max_steps = max_steps;
        self
    }

    /// The persona of each child whose request names none (a request's
    /// persona wins; a fork without either keeps its parent's).
    pub fn with_persona(mut self, persona: impl Into<String>) -> Self {
        self.config.persona = Some(persona.into());
        self
    }

    /// A budget each run opens for itself when its request carries none:
    /// its turns spend its tokens and time, and its own children answer
    /// to it (depth, width and runs count below the run). A run started
    /// under a caller's budget keeps the caller's.
    pub fn with_budget(mut self, budget: Budget) -> Self {
        self.config.budget = (!budget.is_unlimited()).then_some(budget);
        self
    }

    /// Each child's calls of these tools (names or `*`/`?` globs, built-in
    /// and MCP tools alike) ask the run's nearest approver first, waiting
    /// at most `timeout`; a reject is a tool error the model sees, and the
    /// tool does not run (see [`Approving`]).
    pub fn with_approve(mut self, tools: Vec<String>, timeout: Duration) -> Self {
        self.config.approve = (!tools.is_empty()).then(|| (Arc::from(tools), timeout));
        self
    }

    /// Each child mounts these MCP servers' tools (`mcp__SERVER__TOOL`),
    /// beside the tools the factory gives it, instead of its parent's
    /// (an empty list: none); the tool filter applies to them as to any
    /// tool. A server with `isolate` is started per run. Without this a
    /// child mounts its parent agent's servers, sharing their connections.
    #[cfg(feature = "mcp-client")]
    pub fn with_mcp_servers(mut self, servers: Vec<crate::agent::McpServerConfig>) -> Self {
        self.config.mcp = Some(Arc::new(McpMounts::new(servers)));
        self
    }

    /// The MCP servers its children mount when it scopes them: the shared
    /// ones as they run, a per-run one as a fresh, unstarted server (to
    /// list its tools). Empty when its children inherit their parent's.
    #[cfg(feature = "mcp-client")]
    pub fn mcp_servers(&self) -> Vec<crate::agent::McpServer> {
        self.config.mcp.as_ref().map(|mounts| mounts.servers()).unwrap_or_default()
    }

    /// Shared: a run holds the store (to roll back a session that never
    /// ran) without a copy of its own.
    fn store(&self, context: &ProviderContext) -> Arc<SessionStore> {
        if !self.config.persist {
            return self.in_memory.clone();
        }
        let mut cached = self.store.lock().unwrap_or_else(|e| e.into_inner());
        match &*cached {
            Some((home, store)) if home == context.home_path() => store.clone(),
            _ => {
                let store = Arc::new(SessionStore::new(context.home_path()));
                *cached = Some((context.home_path().to_path_buf(), store.clone()));
                store
            }
        }
    }

    /// Everything a launch does before the child's session file: checks,
    /// route, tools, capture tool. The file is created by [`Prepared::open`].
    fn prepare(&self, launch: Launch) -> Result<Prepared, LaunchError> {
        let Launch { request, cancel, context } = launch;
        if cancel.is_cancelled() {
            return Err(LaunchError::Aborted);
        }
        let store = self.store(&context);
        let mcp = McpMounts::for_child(self.config.mcp.as_ref(), &request)?;
        let servers = mcp.names();
        let cwd = match request.resumes().and_then(|previous| previous.downcast::<Agent>()) {
            Some(previous) => previous.header().cwd.clone(),
            None => request.parent.cwd.clone(),
        };
        let (builder, seed, resumed) = match request.resumes() {
            Some(previous) => (self.resume_builder(previous, &request, &store, &servers)?, Seed::Ready, true),
            None => {
                let (builder, seed) = self.new_builder(&request, &store, &servers)?;
                (builder, seed, false)
            }
        };
        let captured = Arc::new(AtomicBool::new(false));
        // The launch token is the agent's own: it trips whenever the run is
        // cancelled or disposed (before `Child::cancel`), and the agent
        // outlives no run, so it needs no token of its own below it.
        let mut builder = builder.own_cancel_token(cancel.clone()).on_update(progress_sink(&context));
        let lease = context.budget().cloned().or_else(|| self.config.budget.map(Budget::lease));
        if let Some(lease) = lease {
            // The child spends its tokens and time on this lease and its
            // own children answer to it.
            builder = builder.budget(lease);
        }
        if context.approvals().has_approver() {
            // Its children's requests climb the same route, this run on its path.
            builder = builder.approvals(context.approvals().clone());
        }
        if let Some((tools, timeout)) = &self.config.approve {
            // Its own grants: "allow always" never outlives the run.
            builder.toolset_mut().approve(Approving::new(tools.clone(), *timeout));
        }
        if let Some(schema) = &request.output_schema {
            let tool = StructuredOutputTool::new(schema, context.clone(), captured.clone());
            let toolset = builder.toolset_mut();
            toolset.remove(STRUCTURED_OUTPUT_TOOL);
            toolset
                .add_exempt(tool)
                .map_err(|error| LaunchError::Invalid { field: "output_schema", reason: error.to_string() })?;
            builder = builder.prompt_section(STRUCTURED_SECTION, STRUCTURED_INSTRUCTION);
        }
        Ok(Prepared {
            provider: self.name.clone(),
            builder,
            seed,
            prompt: request.prompt,
            structured: request.output_schema.is_some().then_some(captured),
            nudges: self.config.structured_nudge_retries,
            roll_back_unstarted: !resumed,
            store,
            cancel,
            cwd,
            mcp,
            live: context.live.clone(),
        })
    }

    fn new_builder(
        &self,
        request: &StartRequest,
        store: &SessionStore,
        servers: &[String],
    ) -> Result<(AgentBuilder, Seed), LaunchError> {
        let parent = &request.parent;
        let route = self.config.route_defaults.overridden_by(&parent.route);
        let route = match &request.agent_options {
            Some(options) => route.overridden_by(options),
            None => route,
        };
        let model = self.config.models.resolve(route.provider.as_deref()).ok_or_else(|| LaunchError::Invalid {
            field: "agent_options.provider",
            reason: format!("provider {:?} routes no model named {:?}", self.name, route.provider.as_deref()),
        })?;
        if !parent.cwd.is_absolute() {
            return Err(invalid_cwd());
        }
        let info = ChildInfo {
            session_id: ids::session_id(),
            parent_session: parent.session_id.clone(),
            depth: request.child_depth(),
            cwd: parent.cwd.clone(),
        };
        let mut toolset = (self.config.tools)(&info);
        apply_filter(&mut toolset, request, servers)?;
        let seed = if self.fork { parent_prefix(request) } else { Seed::Ready };
        let mut builder = Agent::builder_shared(model)
            .store(store.clone())
            .session_id(info.session_id)
            .parent(info.parent_session, info.depth)
            .recorded_as(&*self.name, request.label.clone())
            .cwd(info.cwd)
            .toolset(toolset)
            .options(route)
            .max_steps(self.config.max_steps);
        if let Seed::Live(events) = seed {
            builder = builder.seed(events);
            return Ok((self.apply_persona(builder, request), Seed::Ready));
        }
        Ok((self.apply_persona(builder, request), seed))
    }

    fn apply_persona(&self, builder: AgentBuilder, request: &StartRequest) -> AgentBuilder {
        match request.persona.as_ref().or(self.config.persona.as_ref()) {
            Some(persona) => builder.persona(persona.clone()),
            None => builder,
        }
    }

    /// A continuation: the same session, depth and cwd as before; the same
    /// model, route, tools and persona unless the request overrides them.
    fn resume_builder(
        &self,
        previous: &LocalAgent,
        request: &StartRequest,
        store: &SessionStore,
        servers: &[String],
    ) -> Result<AgentBuilder, LaunchError> {
        let invalid = |reason: &str| LaunchError::Invalid { field: "resume", reason: reason.to_owned() };
        let previous = previous.downcast::<Agent>().ok_or_else(|| invalid("not an in-process child"))?;
        if !previous.is_idle() {
            return Err(invalid("the child is still running"));
        }
        let header = previous.header();
        let info = ChildInfo {
            session_id: header.id.clone(),
            parent_session: header.parent_session.clone(),
            depth: header.depth,
            cwd: header.cwd.clone(),
        };
        // The previous child's tools and filter, without its run-bound
        // capture tool; the request's filter, if any, replaces the filter.
        let mut toolset = previous.toolset();
        toolset.remove(STRUCTURED_OUTPUT_TOOL);
        // MCP tools are mounted afresh (a per-run server closed with its run).
        let mounted: Vec<String> =
            toolset.names().into_iter().filter(|name| name.starts_with(MCP_TOOL_PREFIX)).map(str::to_owned).collect();
        for name in mounted {
            toolset.remove(&name);
        }
        apply_filter(&mut toolset, request, servers)?;
        let (model, route) = match &request.agent_options {
            Some(options) => {
                let route = previous.options().overridden_by(options);
                let model = match &options.provider {
                    Some(_) => {
                        self.config.models.resolve(route.provider.as_deref()).ok_or_else(|| LaunchError::Invalid {
                            field: "agent_options.provider",
                            reason: format!("provider {:?} routes no model named {:?}", self.name, route.provider),
                        })?
                    }
                    None => previous.model(),
                };
                (model, route)
            }
            None => (previous.model(), previous.options().clone()),
        };
        let builder = Agent::builder_shared(model)
            .store(store.clone())
            .cwd(info.cwd)
            .toolset(toolset)
            .options(route)
            .max_steps(self.config.max_steps)
            .parent(info.parent_session, info.depth);
        let builder = if self.config.persist {
            builder.resume(info.session_id)
        } else {
            builder.session_id(info.session_id).seed(previous.events())
        };
        Ok(match request.persona.clone().or(header.persona).or_else(|| self.config.persona.clone()) {
            Some(persona) => builder.persona(persona),
            None => builder,
        })
    }
}

impl Provider for InProcessProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> Capabilities {
        InProcessProvider::CAPABILITIES
    }

    fn inherits_parent_context(&self) -> bool {
        self.fork
    }

    fn offers_continuation(&self) -> bool {
        true
    }

    fn route_defaults(&self) -> AgentOptions {
        self.config.route_defaults.clone()
    }

    fn launch(&self, launch: Launch) -> LocalBoxFuture<'static, Result<Box<dyn Child>, LaunchError>> {
        // The checks run now; the session file is created on the session
        // lane, and exists before the future resolves.
        let prepared = self.prepare(launch);
        Box::pin(async move { prepared?.open().await })
    }

    fn shutdown(&self) -> LocalBoxFuture<'static, ()> {
        let mounts = self.config.mcp.clone();
        Box::pin(async move {
            if let Some(mounts) = mounts {
                mounts.shutdown().await;
            }
        })
    }
}

fn invalid_cwd() -> LaunchError {
    LaunchError::Invalid { field: "parent.cwd", reason: "must be an absolute path to an existing directory".to_owned() }
}

/// Where a fork's inherited history comes from.
enum Seed {
    /// Nothing more to read (a spawn, a continuation, a root parent).
    Ready,
    /// The live parent agent's completed turns.
    Live(Vec<SessionEvent>),
    /// The parent's stored session, read on the session lane.
    Stored(String),
}

/// A fork's inherited history: the parent's events through its last turn
/// end, from the live parent agent when the request carries it, else from
/// the parent's stored session.
fn parent_prefix(request: &StartRequest) -> Seed {
    let parent = &request.parent;
    if let Some(agent) = parent.agent.as_ref().and_then(|a| a.downcast::<Agent>()) {
        return Seed::Live(agent.completed_prefix());
    }
    match &parent.session_id {
        Some(session_id) => Seed::Stored(session_id.clone()),
        None => Seed::Ready,
    }
}

/// A launch checked and assembled, waiting for its session file.
struct Prepared {
    provider: Arc<str>,
    builder: AgentBuilder,
    seed: Seed,
    prompt: Vec<ContentBlock>,
    structured: Option<Arc<AtomicBool>>,
    nudges: u32,
    roll_back_unstarted: bool,
    store: Arc<SessionStore>,
    cancel: CancellationToken,
    /// The child's working directory (a per-run MCP server's too).
    cwd: PathBuf,
    mcp: Arc<McpMounts>,
    /// Where a started MCP server's process is counted (the runtime's).
    live: Arc<crate::live::LiveCounters>,
}

impl Prepared {
    /// Reads a fork's stored history and creates the child's session, both
    /// on the session lane; the child.
    async fn open(self) -> Result<Box<dyn Child>, LaunchError> {
        let mut builder = self.builder;
        if let Seed::Stored(session_id) = &self.seed {
            let (_, mut events) = self.store.reading(session_id).await.map_err(|error| LaunchError::Invalid {
                field: "parent.session_id",
                reason: format!("fork cannot read the parent session: {error}"),
            })?;
            events.truncate(completed_prefix(&events).len());
            builder = builder.seed(events);
        }
        let mcp_owned = self.mcp.mount(builder.toolset_mut(), &self.cwd, &self.live, &self.cancel).await?;
        // The builder checks that the cwd is a directory.
        let built = builder.build_async().await;
        if built.is_err() {
            mcp_owned.close().await;
        }
        let agent = built.map_err(|error| match error {
            AgentError::Cwd(_) => invalid_cwd(),
            error => {
                tracing::warn!(provider = %self.provider, %error, "could not create an in-process child");
                LaunchError::Failed { stage: Stage::Initialize, category: Category::StartupFailed }
            }
        })?;
        Ok(Box::new(InProcessChild {
            provider: self.provider,
            prompt: RefCell::new(Some(self.prompt)),
            structured: self.structured,
            nudges: self.nudges,
            started: Cell::new(false),
            roll_back_unstarted: self.roll_back_unstarted,
            store: self.store,
            cancel: self.cancel,
            agent,
            mcp_owned,
        }))
    }
}

/// Child updates become `Progress` events; they never enter the parent's
/// conversation.
fn progress_sink(context: &ProviderContext) -> Arc<dyn Fn(&AgentUpdate) + Send + Sync> {
    // Only the reporter, not the whole context: the sink lives as long as the run.
    let run = context.run.clone();
    Arc::new(move |update: &AgentUpdate| {
        let progress = match update {
            AgentUpdate::Text(text) => ProgressUpdate::MessageChunk { text: text.clone() },
            // A run this child delegated to: one level down.
            AgentUpdate::ToolProgress { update, .. } => ProgressUpdate::Delegated { update: Box::new(update.clone()) },
            update => match update.tool_call() {
                Some((name, status)) => ProgressUpdate::ToolCall { name: name.to_owned(), status },
                None => return,
            },
        };
        run.progress(progress);
    })
}

/// One in-process child, owned by its run actor.
struct InProcessChild {
    provider: Arc<str>,
    agent: Agent,
    prompt: RefCell<Option<Vec<ContentBlock>>>,
    /// Set (by the capture tool) once the run actor took a structured value.
    structured: Option<Arc<AtomicBool>>,
    nudges: u32,
    started: Cell<bool>,
    /// A new session that never ran is deleted on dispose (rollback).
    roll_back_unstarted: bool,
    store: Arc<SessionStore>,
    cancel: CancellationToken,
    /// The per-run MCP servers this run started, closed at its dispose.
    mcp_owned: RunMounts,
}

impl Child for InProcessChild {
    fn id(&self) -> String {
        self.agent.id().to_owned()
    }

    fn local_agent(&self) -> Option<LocalAgent> {
        Some(LocalAgent::new(self.agent.id(), self.agent.clone()))
    }

    fn run(&self) -> LocalBoxFuture<'static, RunResult> {
        self.started.set(true);
        let prompt = self.prompt.borrow_mut().take().unwrap_or_default();
        let driver = Driver {
            agent: self.agent.clone(),
            provider: self.provider.clone(),
            structured: self.structured.clone(),
            nudges: self.nudges,
            cancel: self.cancel.clone(),
        };
        Box::pin(driver.run(prompt))
    }

    fn cancel(&self) {
        self.agent.cancel();
    }

    fn supports_steering(&self) -> bool {
        true
    }

    fn send_message(&self, message: Vec<ContentBlock>) -> LocalBoxFuture<'static, Result<(), SteeringError>> {
        self.agent.steer(message);
        Box::pin(async { Ok(()) })
    }

    fn supports_continuation(&self) -> bool {
        true
    }

    fn dispose(&self) -> LocalBoxFuture<'static, Result<(), Failure>> {
        let agent = self.agent.clone();
        let roll_back = self.roll_back_unstarted && !self.started.get();
        let store = self.store.clone();
        let mcp_owned = self.mcp_owned.clone();
        Box::pin(async move {
            // Cancels its turns and background tasks, awaits them, closes.
            let mut released = agent.shutdown().await;
            mcp_owned.close().await;
            if roll_back && released.is_ok() {
                released = store.removing(agent.id()).await;
            }
            released.map_err(|error| {
                tracing::warn!(session = agent.id(), %error, "could not release a child session");
                Failure::new(Stage::Dispose, Category::ChildError)
            })
        })
    }
}

/// Drives one run: the prompt, then the structured nudges.
struct Driver {
    agent: Agent,
    provider: Arc<str>,
    structured: Option<Arc<AtomicBool>>,
    nudges: u32,
    cancel: CancellationToken,
}

impl Driver {
    /// An `async` block, not an `async fn`: the driver is held once in the
    /// run's state, not once as an argument and again as a local.
    #[allow(clippy::manual_async_fn, reason = "an async fn would hold the driver twice")]
    fn run(self, prompt: Vec<ContentBlock>) -> impl std::future::Future<Output = RunResult> {
        // One await, whose value is the block's: the first turn's outcome
        // is never a local beside the turn's future (it would add its
        // room, ~150 bytes, to every run's state).
        async move { self.agent.prompt(prompt).then(|outcome| self.after_turn(outcome)).await }
    }

    /// The result after the first turn, or the structured nudges to run
    /// first (boxed: held inline, the nudges' turns would size every
    /// run's state, most not structured).
    fn after_turn(
        &self,
        mut outcome: TurnOutcome,
    ) -> Either<Ready<RunResult>, Pin<Box<impl std::future::Future<Output = RunResult> + '_>>> {
        let output = std::mem::take(&mut outcome.output);
        match &self.structured {
            Some(captured) => Either::Right(Box::pin(self.nudged(outcome, output, captured.clone()))),
            None => Either::Left(std::future::ready(self.settled(&outcome, output, outcome.usage))),
        }
    }

    /// A structured run's nudges: re-prompts while the turn finished
    /// without a capture.
    async fn nudged(&self, mut outcome: TurnOutcome, mut output: String, captured: Arc<AtomicBool>) -> RunResult {
        let mut usage = outcome.usage;
        let missing =
            |outcome: &TurnOutcome| outcome.stop_reason == StopReason::Completed && !captured.load(Ordering::Acquire);
        let mut nudges = self.nudges;
        while missing(&outcome) && nudges > 0 && !self.cancel.is_cancelled() {
            nudges -= 1;
            outcome = self.agent.prompt(STRUCTURED_NUDGE).await;
            usage += outcome.usage;
            if !outcome.output.is_empty() {
                output = std::mem::take(&mut outcome.output);
            }
        }
        if missing(&outcome) {
            // A cancel that lands after a capture-less finish is an abort.
            let (stop_reason, category) = if self.cancel.is_cancelled() {
                (StopReason::Aborted, None)
            } else {
                (StopReason::Error, Some(Category::MissingStructuredOutput))
            };
            let failure = category.map(|category| Diagnostic::new(&self.provider, Stage::SessionRun, category));
            return self.result(output, stop_reason, failure, usage);
        }
        self.settled(&outcome, output, usage)
    }

    /// The run's result from its last turn.
    fn settled(&self, outcome: &TurnOutcome, output: String, usage: RunUsage) -> RunResult {
        let failure = outcome.error.as_ref().map(|error| {
            Diagnostic::new(&self.provider, Stage::SessionRun, error.category()).with_reason(error.reason.clone())
        });
        if let Some(error) = &outcome.error {
            tracing::debug!(provider = %self.provider, session = self.agent.id(), %error, "child turn failed");
        }
        self.result(output, outcome.stop_reason, failure, usage)
    }

    fn result(
        &self,
        output: String,
        stop_reason: StopReason,
        failure: Option<Diagnostic>,
        usage: RunUsage,
    ) -> RunResult {
        RunResult {
            output: if output.is_empty() { Vec::new() } else { vec![ContentBlock::text(output)] },
            structured: None, // the run actor attaches the captured value
            stop_reason,
            diagnostic: failure.filter(|_| stop_reason == StopReason::Error),
            child_session: None,
            usage,
            tool_calls_failed: 0,
            workspace: None,
        }
    }
}

/// Applies the request's tool filter. A filter naming a tool the child does
/// not have is a mistake the caller must hear of, not a child quietly left
/// without tools. The MCP tools are mounted later (their servers start
/// then), so an `mcp__SERVER__…` name is known when the child mounts SERVER.
fn apply_filter(toolset: &mut Toolset, request: &StartRequest, servers: &[String]) -> Result<(), LaunchError> {
    let Some(filter) = &request.tool_filter else { return Ok(()) };
    let names = toolset.names();
    let mounted = |name: &str| {
        let Some(rest) = name.strip_prefix(MCP_TOOL_PREFIX) else { return false };
        rest.split_once("__").is_some_and(|(server, _)| servers.iter().any(|s| s == server))
    };
    let known = |name: &String| {
        names.contains(&name.as_str())
            || mounted(name)
            || (name == STRUCTURED_OUTPUT_TOOL && request.output_schema.is_some())
    };
    let mut listed = filter.allow.iter().chain(filter.deny.iter()).flatten();
    if let Some(unknown) = listed.find(|name| !known(name)) {
        return Err(LaunchError::Invalid {
            field: "tool_filter",
            reason: format!("the child has no tool named {unknown:?} (its tools: {})", names.join(", ")),
        });
    }
    toolset.set_filter(filter.clone());
    Ok(())
}

/// The per-child capture tool: the request's schema verbatim as parameters.
struct StructuredOutputTool {
    spec: ToolSpec,
    context: ProviderContext,
    captured: Arc<AtomicBool>,
}

impl StructuredOutputTool {
    fn new(schema: &Value, context: ProviderContext, captured: Arc<AtomicBool>) -> Self {
        let spec = ToolSpec {
            name: STRUCTURED_OUTPUT_TOOL.to_owned(),
            description: "Records your final answer as structured data. Call it once, when the answer is ready; \
                          its parameters are the required shape of the answer."
                .to_owned(),
            parameters: schema.clone(),
        };
        StructuredOutputTool { spec, context, captured }
    }
}

impl Tool for StructuredOutputTool {
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    fn call(&self, arguments: Value, _context: ToolContext) -> BoxFuture<'_, ToolOutput> {
        Box::pin(async move {
            if self.captured.load(Ordering::Acquire) {
                return ToolOutput::error(CaptureError::AlreadyCaptured.to_string());
            }
            // The tool layer has validated `arguments` against the schema
            // (the tool's parameters) before this call.
            match self.context.capture_structured(arguments).await {
                Ok(()) => {
                    self.captured.store(true, Ordering::Release);
                    ToolOutput::ok("Structured result recorded.").ending_turn()
                }
                Err(refused) => ToolOutput::error(refused.to_string()),
            }
        })
    }
}
