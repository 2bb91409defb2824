//! The agent core: what an in-process child (and an in-process parent) runs.
//!
//! ```text
//! Agent ── owns ──> Session (header + append-only log, JSON lines on disk)
//!   │                 ▲ every event is written as it is appended
//!   ├── Model         scripted | replay | record | openai   (one async trait)
//!   ├── Toolset       named tools, schemas, gates, filter   (this agent's only)
//!   └── SystemPrompt  named sections: persona, tools, …
//! ```
//!
//! A turn ([`Agent::prompt`]) is the loop: request → assistant message →
//! tool calls (concurrently where the tools allow) → results → … until the
//! model finishes, hits its token limit, refuses, is cancelled, or fails.
//! Every turn ends with a recorded [`TurnEnd`](SessionEvent::TurnEnd) and its
//! reason (each event reaches the session file as it is appended). Turns on
//! one agent run one at a time.
//!
//! ```
//! use subagents::agent::{Agent, ScriptedModel};
//! use subagents::StopReason;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let agent = Agent::builder(ScriptedModel::new()).build().unwrap();
//! let outcome = agent.prompt("summarise the plan").await;
//! assert_eq!(outcome.stop_reason, StopReason::Completed);
//! assert_eq!(outcome.output, "handled: summarise the plan");
//! # });
//! ```

pub mod ids;
mod model;
mod prompt;
mod session;
mod tools;
mod turn;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use futures_util::future::BoxFuture;

use tokio_util::sync::CancellationToken;

#[cfg(any(feature = "openai", feature = "process"))]
pub(crate) use model::endpoint_var;
#[cfg(feature = "process")]
pub(crate) use model::limit::{Unreachable, UpstreamGrant, UpstreamLimiter};
#[cfg(feature = "config")]
pub(crate) use model::MODEL_FORMS;
pub use model::{
    retry_delay, Api, ApiNotBuilt, Booked, Booking, CallMeter, Cancelled, FleetConcurrency, FleetSlots, Limiter,
    ModelRoute, Permit, RouteLimits, RouteStats, SharedSchedule, SharedStats, Unshared, DEFAULT_CONCURRENCY_CAP,
    MAX_COOL_DOWN, MAX_CREDIBLE_USAGE, MAX_TOKEN_DEBT, SLICE_SPAN,
};
#[cfg(feature = "openai")]
pub use model::{AnthropicConfig, AnthropicModel, OpenAiConfig, OpenAiModel, OpenAiResponsesModel};
pub use model::{
    ChunkSink, DelayRule, Finish, Model, ModelError, ModelReply, ModelRequest, ModelSpec, Oversize, RecordingModel,
    ReplayModel, Responder, ScriptMatch, ScriptedModel, Step, Tape, Usage,
};
pub use model::{TapeAnswer, TapeSession};
pub use prompt::SystemPrompt;
pub(crate) use session::completed_prefix;
#[cfg(any(feature = "acp", feature = "a2a"))]
pub(crate) use session::HomeStores;
pub use session::{
    LoadedSession, Session, SessionError, SessionEvent, SessionHeader, SessionStore, SessionSummary, StoredSession,
    ToolCall, DEFAULT_MAX_LINE_BYTES,
};
#[cfg(any(feature = "mcp-client", feature = "config"))]
pub(crate) use tools::mcp_header_problem;
pub(crate) use tools::reads_only;
#[cfg(all(feature = "mcp-client", feature = "process"))]
pub(crate) use tools::start_mcp_servers;
#[cfg(feature = "config")]
pub(crate) use tools::{header_problem, header_value_fits};
pub use tools::{
    valid_server_name, Approving, FnTool, ListDir, ReadFile, Tool, ToolContext, ToolError, ToolGate, ToolOutput,
    ToolSpec, Toolset,
};
#[cfg(feature = "mcp-client")]
pub use tools::{McpServer, McpServerConfig, McpServerError, McpStartError, McpTransport, MCP_TOOL_PREFIX};
pub use turn::{AgentUpdate, TurnError, TurnErrorKind, TurnOutcome};

use crate::seam::{AgentOptions, Approvals, Budget, BudgetLease, ContentBlock, LocalAgent, Parent};

/// Receives live updates from an agent's turns (text chunks, tool calls).
pub type UpdateSink = Arc<dyn Fn(&AgentUpdate) + Send + Sync>;

/// A prompt: text or content blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prompt(pub Vec<ContentBlock>);

impl From<&str> for Prompt {
    fn from(text: &str) -> Self {
        Prompt(vec![ContentBlock::text(text)])
    }
}

impl From<String> for Prompt {
    fn from(text: String) -> Self {
        Prompt(vec![ContentBlock::text(text)])
    }
}

impl From<Vec<ContentBlock>> for Prompt {
    fn from(blocks: Vec<ContentBlock>) -> Self {
        Prompt(blocks)
    }
}

/// Why an agent could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// Its session could not be created or loaded.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// A tool could not be added.
    #[error(transparent)]
    Tool(#[from] ToolError),
    /// The working directory is not usable.
    #[error("working directory {0:?} is not an existing directory")]
    Cwd(PathBuf),
}

/// Builds an [`Agent`]: its model, session, tools, persona and route.
pub struct AgentBuilder {
    model: Arc<dyn Model>,
    store: SessionStore,
    session_id: Option<String>,
    resume: bool,
    parent_session: Option<String>,
    depth: u32,
    cwd: Option<PathBuf>,
    persona: Option<String>,
    /// The provider and label the session's header records.
    recorded: (Option<String>, Option<String>),
    prompt: SystemPrompt,
    toolset: Toolset,
    pending_tools: Vec<Arc<dyn Tool>>,
    options: AgentOptions,
    max_steps: u32,
    seed: Vec<SessionEvent>,
    on_update: Option<UpdateSink>,
    cancel: Option<GivenToken>,
    budget: Option<BudgetLease>,
    approvals: Option<Approvals>,
}

impl std::fmt::Debug for AgentBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentBuilder")
            .field("model", &self.model.name())
            .field("session_id", &self.session_id)
            .field("depth", &self.depth)
            .field("cwd", &self.cwd)
            .finish_non_exhaustive()
    }
}

impl AgentBuilder {
    /// Where the session is persisted (default: in memory only).
    pub fn store(mut self, store: SessionStore) -> Self {
        self.store = store;
        self
    }

    /// The session id (default: a fresh UUID).
    pub fn session_id(mut self, id: impl Into<String>) -> Self {
        self.session_id = Some(id.into());
        self
    }

    /// Continues the stored session `id` instead of creating one. Its depth
    /// never drops below what the session recorded.
    pub fn resume(mut self, id: impl Into<String>) -> Self {
        self.session_id = Some(id.into());
        self.resume = true;
        self
    }

    /// The delegating parent's session and this agent's depth.
    pub fn parent(mut self, parent_session: Option<String>, depth: u32) -> Self {
        self.parent_session = parent_session;
        self.depth = depth;
        self
    }

    /// The provider that runs this agent as a child and the run's label,
    /// recorded in a new session's header for `subagents sessions list`.
    pub fn recorded_as(mut self, provider: impl Into<String>, label: Option<String>) -> Self {
        self.recorded = (Some(provider.into()), label);
        self
    }

    /// The working directory (default: the process's).
    pub fn cwd(mut self, cwd: impl Into<PathBuf>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// Replaces the default persona section.
    pub fn persona(mut self, persona: impl Into<String>) -> Self {
        self.persona = Some(persona.into());
        self
    }

    /// Sets (or adds) one system-prompt section.
    pub fn prompt_section(mut self, name: &str, text: impl Into<String>) -> Self {
        self.prompt.set(name, text);
        self
    }

    /// Starts from this tool set (tools, gates, filter).
    pub fn toolset(mut self, toolset: Toolset) -> Self {
        self.toolset = toolset;
        self
    }

    /// The tool set so far (tools added with [`AgentBuilder::tool`] join it
    /// at build).
    pub fn toolset_mut(&mut self) -> &mut Toolset {
        &mut self.toolset
    }

    /// Adds a tool (a duplicate name fails [`AgentBuilder::build`]).
    pub fn tool(mut self, tool: impl Tool) -> Self {
        self.pending_tools.push(Arc::new(tool));
        self
    }

    /// Adds `read_file` and `list_dir`, confined to the cwd.
    pub fn builtin_tools(self) -> Self {
        self.tool(ReadFile).tool(ListDir)
    }

    /// The route: model, token limit, reasoning effort.
    pub fn options(mut self, options: AgentOptions) -> Self {
        self.options = options;
        self
    }

    /// Most model calls in one turn before it ends `Error` (default 64).
    pub fn max_steps(mut self, max_steps: u32) -> Self {
        self.max_steps = max_steps.max(1);
        self
    }

    /// Events copied into a new session before its first turn (a fork's
    /// inherited history).
    pub fn seed(mut self, events: Vec<SessionEvent>) -> Self {
        self.seed = events;
        self
    }

    /// Receives live updates.
    pub fn on_update(mut self, sink: UpdateSink) -> Self {
        self.on_update = Some(sink);
        self
    }

    /// Cancelling this token cancels every turn of the agent, now and later.
    pub fn cancel_token(mut self, token: CancellationToken) -> Self {
        self.cancel = Some(GivenToken::Above(token));
        self
    }

    /// The agent's cancellation is this token itself: [`Agent::cancel`]
    /// trips it, and turns after that are cancelled too. For an agent that
    /// lives as long as one cancellable thing (an in-process run's child,
    /// whose run's token trips whenever the child is cancelled): it saves
    /// the token a child of it would cost (over 100 bytes an agent).
    pub(crate) fn own_cancel_token(mut self, token: CancellationToken) -> Self {
        self.cancel = Some(GivenToken::Own(token));
        self
    }

    /// The delegation budget the agent holds: its turns stop when the
    /// budget's tokens or time run out, and every child it starts answers
    /// to it.
    pub fn budget(mut self, lease: BudgetLease) -> Self {
        self.budget = Some(lease);
        self
    }

    /// The route its children's permission requests climb to (see
    /// [`Approvals`]): a door's session gives its own, an in-process child
    /// its run's. Without one, its children use the runtime's.
    pub fn approvals(mut self, approvals: Approvals) -> Self {
        self.approvals = Some(approvals);
        self
    }

    /// Creates (or resumes) the session and returns the agent, blocking the
    /// calling thread while the session's file is created. In async code
    /// use [`AgentBuilder::build_async`].
    pub fn build(self) -> Result<Agent, AgentError> {
        let (parts, opening) = self.prepare()?;
        let session = match opening {
            Opening::Resume { store, id, depth } => store.resuming(&id, depth).wait()?,
            Opening::Create { store, header, seed } => store.creating(header, seed).wait()?,
        };
        Ok(parts.finish(session))
    }

    /// [`AgentBuilder::build`] without blocking: the session's file is
    /// created (or loaded) off this thread, and exists when this resolves.
    pub async fn build_async(self) -> Result<Agent, AgentError> {
        let (parts, opening) = self.prepare()?;
        let session = match opening {
            Opening::Resume { store, id, depth } => store.resuming(&id, depth).await?,
            Opening::Create { store, header, seed } => store.creating(header, seed).await?,
        };
        Ok(parts.finish(session))
    }

    /// Everything but the session's file.
    fn prepare(self) -> Result<(AgentParts, Opening), AgentError> {
        let cwd = match self.cwd {
            Some(cwd) => cwd,
            None => std::env::current_dir().map_err(|_| AgentError::Cwd(PathBuf::from(".")))?,
        };
        if !cwd.is_dir() {
            return Err(AgentError::Cwd(cwd));
        }
        let mut toolset = self.toolset;
        for tool in self.pending_tools {
            toolset.add_shared(tool)?;
        }
        let opening = if self.resume {
            let id = self.session_id.expect("resume sets the id");
            Opening::Resume { store: self.store, id, depth: self.depth }
        } else {
            let id = self.session_id.unwrap_or_else(ids::session_id);
            let mut header = SessionHeader::new(id, cwd);
            header.parent_session = self.parent_session;
            header.depth = self.depth;
            header.persona = self.persona.clone();
            (header.provider, header.label) = self.recorded;
            Opening::Create { store: self.store, header, seed: self.seed }
        };
        let parts = AgentParts {
            model: self.model,
            toolset,
            prompt: self.prompt,
            persona: self.persona,
            options: self.options,
            max_steps: self.max_steps,
            on_update: self.on_update,
            cancel: self.cancel,
            budget: self.budget,
            approvals: self.approvals,
        };
        Ok((parts, opening))
    }
}

/// The cancellation token an agent was given.
enum GivenToken {
    /// Cancels the agent; [`Agent::cancel`] trips a child of it.
    Above(CancellationToken),
    /// Is the agent's own: [`Agent::cancel`] trips it.
    Own(CancellationToken),
}

/// How a built agent gets its session.
enum Opening {
    Resume { store: SessionStore, id: String, depth: u32 },
    Create { store: SessionStore, header: SessionHeader, seed: Vec<SessionEvent> },
}

/// What an agent is made of besides its session.
struct AgentParts {
    model: Arc<dyn Model>,
    toolset: Toolset,
    prompt: SystemPrompt,
    persona: Option<String>,
    options: AgentOptions,
    max_steps: u32,
    on_update: Option<UpdateSink>,
    cancel: Option<GivenToken>,
    budget: Option<BudgetLease>,
    approvals: Option<Approvals>,
}

impl AgentParts {
    fn finish(self, session: Session) -> Agent {
        let AgentParts {
            model,
            mut toolset,
            mut prompt,
            persona,
            options,
            max_steps,
            on_update,
            cancel,
            budget,
            approvals,
        } = self;
        if let Some(persona) = persona.or_else(|| session.header().persona.clone()) {
            prompt.set(SystemPrompt::PERSONA, persona);
        }
        toolset.set_depth(session.header().depth);
        let (root, generation) = match cancel {
            Some(GivenToken::Own(token)) => (token.clone(), token),
            Some(GivenToken::Above(root)) => (root.clone(), root.child_token()),
            None => {
                let root = CancellationToken::new();
                (root.clone(), root.child_token())
            }
        };
        Agent {
            inner: Arc::new(AgentInner {
                id: session.id().into(),
                cwd: session.header().cwd.clone().into(),
                model,
                tools: toolset,
                system: prompt.rendered(),
                options: shared_route(options),
                max_steps,
                session: Mutex::new(session),
                turn_lock: tokio::sync::Mutex::new(()),
                busy: Busy::default(),
                cancel: Mutex::new(generation),
                root_cancel: root,
                rare: match (budget, approvals) {
                    (None, None) => OnceLock::new(),
                    (budget, approvals) => OnceLock::from(Box::new(Rare {
                        budget: budget.map_or_else(OnceLock::new, OnceLock::from),
                        approvals,
                        ..Rare::default()
                    })),
                },
                on_update,
            }),
        }
    }
}

/// The route `options`, shared with the agents already on the same one
/// (children of one provider, most often): an agent holds a pointer to it,
/// not a copy.
fn shared_route(options: AgentOptions) -> Arc<AgentOptions> {
    /// A few distinct routes are kept; past that, each agent has its own.
    const KEPT: usize = 64;
    static SHARED: Mutex<Vec<Arc<AgentOptions>>> = Mutex::new(Vec::new());
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(kept) = shared.iter().find(|kept| ***kept == options) {
        return kept.clone();
    }
    let options = Arc::new(options);
    if shared.len() < KEPT {
        shared.push(options.clone());
    }
    options
}

/// A running agent: run prompts, await idle, cancel, read its session.
/// Cheap to clone; clones share the agent.
#[derive(Clone)]
pub struct Agent {
    inner: Arc<AgentInner>,
}

pub(crate) struct AgentInner {
    id: Arc<str>,
    cwd: Arc<Path>,
    model: Arc<dyn Model>,
    tools: Toolset,
    system: Arc<str>,
    options: Arc<AgentOptions>,
    max_steps: u32,
    session: Mutex<Session>,
    turn_lock: tokio::sync::Mutex<()>,
    /// Turns running or queued.
    busy: Busy,
    /// The current cancellation generation; [`Agent::cancel`] replaces it.
    cancel: Mutex<CancellationToken>,
    root_cancel: CancellationToken,
    on_update: Option<UpdateSink>,
    /// Steering messages, cleanups and the budget, made on first use.
    rare: OnceLock<Box<Rare>>,
}

/// What few agents use, made on first use: held inline it would size
/// every agent (a child waiting on its model holds one).
#[derive(Default)]
struct Rare {
    steering: Mutex<VecDeque<Vec<ContentBlock>>>,
    /// Run by [`Agent::shutdown`], once (tools that own background work).
    teardowns: Mutex<Vec<Teardown>>,
    /// The delegation budget it holds: set at build, or opened on its first
    /// delegation by a tool configured with one ([`Agent::budget_or_open`]).
    budget: OnceLock<BudgetLease>,
    /// Where its children's permission requests climb (set at build).
    approvals: Option<Approvals>,
}

/// Async cleanup a tool registers on the agent that owns its work.
type Teardown = Box<dyn FnOnce() -> BoxFuture<'static, ()> + Send>;

/// A handle that does not keep the agent alive (for services that would
/// otherwise form a cycle with the agent's own tools).
#[derive(Clone)]
pub struct WeakAgent(Weak<AgentInner>);

impl WeakAgent {
    /// The agent, if it still exists.
    pub fn upgrade(&self) -> Option<Agent> {
        self.0.upgrade().map(|inner| Agent { inner })
    }
}

impl std::fmt::Debug for WeakAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WeakAgent")
    }
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent").field("id", &self.inner.id).field("model", &self.inner.model.name()).finish()
    }
}

impl Agent {
    /// Starts building an agent on `model`.
    pub fn builder(model: impl Model) -> AgentBuilder {
        Self::builder_shared(Arc::new(model))
    }

    /// Starts building an agent on a shared model.
    pub fn builder_shared(model: Arc<dyn Model>) -> AgentBuilder {
        AgentBuilder {
            model,
            store: SessionStore::in_memory(),
            session_id: None,
            resume: false,
            parent_session: None,
            recorded: (None, None),
            depth: 0,
            cwd: None,
            persona: None,
            prompt: SystemPrompt::default(),
            toolset: Toolset::new(),
            pending_tools: Vec::new(),
            options: AgentOptions::default(),
            max_steps: 64,
            seed: Vec::new(),
            on_update: None,
            cancel: None,
            budget: None,
            approvals: None,
        }
    }

    /// The session id.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The session header.
    pub fn header(&self) -> SessionHeader {
        self.inner.session().header().clone()
    }

    /// The working directory its tools are confined to.
    pub fn cwd(&self) -> &Path {
        &self.inner.cwd
    }

    /// The system prompt the model sees.
    pub fn system_prompt(&self) -> &str {
        &self.inner.system
    }

    /// The tools the model sees.
    pub fn tool_specs(&self) -> Vec<ToolSpec> {
        self.inner.tools.specs()
    }

    /// The model's name.
    pub fn model_name(&self) -> &str {
        self.inner.model.name()
    }

    /// The model (a continuation keeps talking to the same one).
    pub fn model(&self) -> Arc<dyn Model> {
        self.inner.model.clone()
    }

    /// Its tool set (tools, gates, filter); clones share the tools.
    pub fn toolset(&self) -> Toolset {
        self.inner.tools.clone()
    }

    /// The route its turns use.
    pub fn options(&self) -> &AgentOptions {
        &self.inner.options
    }

    /// This agent as the delegating parent of a start: its session, depth,
    /// cwd and route, and itself (so a fork can read its completed turns).
    pub fn as_parent(&self) -> Parent {
        let depth = self.inner.session().header().depth;
        let parent = Parent::root(self.inner.cwd.to_path_buf())
            .with_session(self.id())
            .with_depth(depth)
            .with_route(AgentOptions::clone(&self.inner.options))
            .with_agent(LocalAgent::new(self.id(), self.clone()));
        let parent = match self.inner.rare.get().and_then(|rare| rare.approvals.clone()) {
            Some(approvals) => parent.with_approvals(approvals),
            None => parent,
        };
        match self.budget() {
            Some(lease) => parent.with_budget_lease(lease),
            None => parent,
        }
    }

    /// Its route to the nearest approver (no one, unless set at build).
    pub(crate) fn approvals(&self) -> Approvals {
        self.inner.rare.get().and_then(|rare| rare.approvals.clone()).unwrap_or_default()
    }

    /// The delegation budget this agent holds, if any.
    pub fn budget(&self) -> Option<BudgetLease> {
        self.inner.budget().cloned()
    }

    /// The lease this agent holds, opening `budget` on it first when it
    /// holds none (it becomes the root of that budget's tree).
    pub fn budget_or_open(&self, budget: Budget) -> BudgetLease {
        self.inner.rare().budget.get_or_init(|| budget.lease()).clone()
    }

    /// Hands `update` to the agent's update sink, if it has one.
    pub(crate) fn report(&self, update: AgentUpdate) {
        if let Some(sink) = &self.inner.on_update {
            sink(&update);
        }
    }

    /// Whether no turn is running or queued.
    pub fn is_idle(&self) -> bool {
        self.inner.busy.count.load(Ordering::Acquire) == 0
    }

    /// Runs one turn. Turns queue behind each other; a cancel trips the
    /// running turn and every queued one.
    ///
    /// The turn joins the queue (and takes its cancellation) when `prompt`
    /// is called, not when the returned future is first polled: a cancel
    /// issued right after reaches it even if it has not started yet.
    pub fn prompt(&self, prompt: impl Into<Prompt>) -> impl std::future::Future<Output = TurnOutcome> + Send + '_ {
        let prompt = prompt.into();
        // The generation's own token, not a child of it: what cancels a
        // turn is the generation's cancel, and a child would cost a tree
        // node (over 100 bytes) per turn for nothing.
        let cancel = self.inner.lock(&self.inner.cancel).clone();
        self.inner.busy.count.fetch_add(1, Ordering::AcqRel);
        let busy = BusyGuard(&self.inner.busy);
        async move {
            let _busy = &busy;
            let _turn = self.inner.turn_lock.lock().await;
            turn::run(&self.inner, prompt.0, cancel).await
        }
    }

    /// Cancels the running turn and the queued ones; later turns run normally.
    pub fn cancel(&self) {
        let mut current = self.inner.lock(&self.inner.cancel);
        current.cancel();
        *current = self.inner.root_cancel.child_token();
    }

    /// Waits until no turn is running or queued.
    pub async fn idle(&self) {
        let busy = &self.inner.busy;
        loop {
            let idle = busy.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if busy.count.load(Ordering::Acquire) == 0 {
                return;
            }
            idle.await;
        }
    }

    /// Queues a message for the running turn: it reaches the model at the
    /// next model call (or at the start of the next turn).
    pub fn steer(&self, message: impl Into<Prompt>) {
        let rare = self.inner.rare();
        self.inner.lock(&rare.steering).push_back(message.into().0);
    }

    /// Every session event so far.
    pub fn events(&self) -> Vec<SessionEvent> {
        self.inner.session().events().to_vec()
    }

    /// The session through its last turn end (what a fork inherits).
    pub fn completed_prefix(&self) -> Vec<SessionEvent> {
        self.inner.session().completed_prefix().to_vec()
    }

    /// A handle that does not keep the agent alive.
    pub fn downgrade(&self) -> WeakAgent {
        WeakAgent(Arc::downgrade(&self.inner))
    }

    /// Registers cleanup for [`Agent::shutdown`] (a tool's background work).
    pub fn on_shutdown(&self, teardown: impl FnOnce() -> BoxFuture<'static, ()> + Send + 'static) {
        let rare = self.inner.rare();
        self.inner.lock(&rare.teardowns).push(Box::new(teardown));
    }

    /// Ends the agent's life: cancels its turns, waits until idle, runs the
    /// registered cleanups (its background tasks are cancelled and awaited),
    /// then closes the session once every event reached its file.
    pub async fn shutdown(&self) -> Result<(), SessionError> {
        self.cancel();
        self.idle().await;
        let teardowns = match self.inner.rare.get() {
            Some(rare) => std::mem::take(&mut *self.inner.lock(&rare.teardowns)),
            None => Vec::new(),
        };
        for teardown in teardowns {
            teardown().await;
        }
        self.inner.model.session_closed(&self.inner.id);
        let closing = self.inner.session().closing();
        closing.await
    }

    /// Flushes and closes the session file, blocking the calling thread
    /// until everything appended reached it (in async code,
    /// [`Agent::shutdown`] closes without blocking). Call after
    /// [`Agent::idle`]; the agent stays readable, and further turns are
    /// kept in memory only.
    pub fn close(&self) -> Result<(), SessionError> {
        self.inner.model.session_closed(&self.inner.id);
        self.inner.session().close()
    }
}

impl AgentInner {
    fn lock<'a, T>(&self, mutex: &'a Mutex<T>) -> MutexGuard<'a, T> {
        mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn session(&self) -> MutexGuard<'_, Session> {
        self.lock(&self.session)
    }

    fn rare(&self) -> &Rare {
        self.rare.get_or_init(Box::default)
    }

    /// The delegation budget it holds, if any.
    fn budget(&self) -> Option<&BudgetLease> {
        self.rare.get().and_then(|rare| rare.budget.get())
    }

    /// The steering messages queued so far, taken.
    fn take_steering(&self) -> Vec<Vec<ContentBlock>> {
        match self.rare.get() {
            Some(rare) => self.lock(&rare.steering).drain(..).collect(),
            None => Vec::new(),
        }
    }

    /// Whether no steering message is queued.
    fn no_steering(&self) -> bool {
        self.rare.get().is_none_or(|rare| self.lock(&rare.steering).is_empty())
    }
}

/// Turns running or queued, and who waits for none (inline: a watch
/// channel would cost a few hundred bytes per agent).
#[derive(Default)]
struct Busy {
    count: AtomicUsize,
    idle: tokio::sync::Notify,
}

struct BusyGuard<'a>(&'a Busy);

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}
