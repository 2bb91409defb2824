//! What a caller asks for: the start request and the start-time features a
//! provider may advertise.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::{Approvals, Budget, BudgetLease, ContentBlock, LocalAgent, ProgressSink};

/// The largest `max_depth` the runtime represents; anything above is
/// `INVALID_REQUEST` rather than a silently unbounded recursion.
pub const MAX_DEPTH_CAP: u32 = 1024;

/// Start-time features a provider enforces. A request asking for one the
/// provider does not advertise is rejected before any child exists.
///
/// ```
/// use subagents::seam::{Capabilities, Capability};
///
/// // A provider that applies a persona and nothing else.
/// let advertised = Capabilities::none().with(Capability::Persona, true);
/// assert!(advertised.supports(Capability::Persona));
/// assert!(!advertised.supports(Capability::OutputSchema));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// Enforces `output_schema` (structured output).
    pub output_schema: bool,
    /// Enforces `max_depth`.
    pub depth_limit: bool,
    /// Enforces `tool_filter`.
    pub tool_filter: bool,
    /// Applies `persona`.
    pub persona: bool,
    /// Honours `agent_options` (the child's route).
    pub agent_options: bool,
    /// Honours `mcp_servers` (which MCP servers the child mounts).
    #[serde(default)]
    pub mcp_servers: bool,
    /// Keeps a `detached` run for a later caller to attach to. The runtime
    /// sets it from [`Provider::offers_detached`](crate::seam::Provider::offers_detached),
    /// whatever `capabilities()` says.
    #[serde(default)]
    pub detached: bool,
}

impl Capabilities {
    /// Every start-time capability.
    pub const fn all() -> Self {
        Capabilities {
            output_schema: true,
            depth_limit: true,
            tool_filter: true,
            persona: true,
            agent_options: true,
            mcp_servers: true,
            detached: true,
        }
    }

    /// No start-time capability.
    pub const fn none() -> Self {
        Capabilities {
            output_schema: false,
            depth_limit: false,
            tool_filter: false,
            persona: false,
            agent_options: false,
            mcp_servers: false,
            detached: false,
        }
    }

    /// Whether `capability` is advertised.
    pub fn supports(&self, capability: Capability) -> bool {
        match capability {
            Capability::OutputSchema => self.output_schema,
            Capability::DepthLimit => self.depth_limit,
            Capability::ToolFilter => self.tool_filter,
            Capability::Persona => self.persona,
            Capability::AgentOptions => self.agent_options,
            Capability::McpServers => self.mcp_servers,
            Capability::Detached => self.detached,
        }
    }

    /// This set with `capability` switched on or off.
    pub fn with(mut self, capability: Capability, on: bool) -> Self {
        let slot = match capability {
            Capability::OutputSchema => &mut self.output_schema,
            Capability::DepthLimit => &mut self.depth_limit,
            Capability::ToolFilter => &mut self.tool_filter,
            Capability::Persona => &mut self.persona,
            Capability::AgentOptions => &mut self.agent_options,
            Capability::McpServers => &mut self.mcp_servers,
            Capability::Detached => &mut self.detached,
        };
        *slot = on;
        self
    }
}

/// One start-time capability, named as in errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Capability {
    /// `output_schema`
    OutputSchema,
    /// `depth_limit`
    DepthLimit,
    /// `tool_filter`
    ToolFilter,
    /// `persona`
    Persona,
    /// `agent_options`
    AgentOptions,
    /// `mcp_servers`
    McpServers,
    /// `detached`: a run kept for a later caller to attach to (a provider
    /// advertises it with [`Provider::offers_detached`](crate::seam::Provider::offers_detached)).
    Detached,
}

impl Capability {
    /// Every capability, in the order `start` checks them.
    pub const CHECK_ORDER: [Capability; 7] = [
        Capability::OutputSchema,
        Capability::DepthLimit,
        Capability::ToolFilter,
        Capability::Persona,
        Capability::AgentOptions,
        Capability::McpServers,
        Capability::Detached,
    ];

    /// The stable name used in error messages.
    pub fn name(self) -> &'static str {
        match self {
            Capability::OutputSchema => "output_schema",
            Capability::DepthLimit => "depth_limit",
            Capability::ToolFilter => "tool_filter",
            Capability::Persona => "persona",
            Capability::AgentOptions => "agent_options",
            Capability::McpServers => "mcp_servers",
            Capability::Detached => "detached",
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A child's route. Each field overrides the parent's separately.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentOptions {
    /// Model provider (for example `openai`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Model name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Output token cap per model call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Reasoning effort hint (`low`, `medium`, `high`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<String>,
}

impl AgentOptions {
    /// `self` overridden field by field by `over`.
    pub fn overridden_by(&self, over: &AgentOptions) -> AgentOptions {
        AgentOptions {
            provider: over.provider.clone().or_else(|| self.provider.clone()),
            model: over.model.clone().or_else(|| self.model.clone()),
            max_tokens: over.max_tokens.or(self.max_tokens),
            reasoning_effort: over.reasoning_effort.clone().or_else(|| self.reasoning_effort.clone()),
        }
    }
}

/// Which tools a child may see and call. At least one list must be present.
///
/// ```
/// use subagents::ToolFilter;
///
/// let read_only = ToolFilter::allow(["read_file", "list_dir"]);
/// assert!(read_only.permits("read_file"));
/// assert!(!read_only.permits("subagent"));
/// assert!(!ToolFilter::deny(["subagent"]).permits("subagent"));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolFilter {
    /// Only these tools (when present).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<String>>,
    /// Never these tools (when present).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny: Option<Vec<String>>,
}

impl ToolFilter {
    /// Only the named tools.
    pub fn allow<I: IntoIterator<Item = S>, S: Into<String>>(names: I) -> Self {
        ToolFilter { allow: Some(names.into_iter().map(Into::into).collect()), deny: None }
    }

    /// Every tool but the named ones.
    pub fn deny<I: IntoIterator<Item = S>, S: Into<String>>(names: I) -> Self {
        ToolFilter { allow: None, deny: Some(names.into_iter().map(Into::into).collect()) }
    }

    /// Whether a tool of this name passes the filter.
    pub fn permits(&self, tool: &str) -> bool {
        let allowed = self.allow.as_ref().is_none_or(|names| names.iter().any(|n| n == tool));
        let denied = self.deny.as_ref().is_some_and(|names| names.iter().any(|n| n == tool));
        allowed && !denied
    }
}

/// The delegating side of a start: who asks, from where, at what depth.
#[derive(Clone, Debug)]
pub struct Parent {
    /// The delegating agent's session, when there is one. Run events carry it
    /// so subscribers can filter by parent.
    pub session_id: Option<String>,
    /// The delegating agent's delegation depth (0 for a top-level agent).
    pub depth: u32,
    /// Working directory a child inherits unless its provider sets one.
    pub cwd: PathBuf,
    /// The parent's own route; a child's route is this overridden by the
    /// request's `agent_options`.
    pub route: AgentOptions,
    /// The delegating in-process agent, when there is one: a fork reads its
    /// completed turns from it. (`agent::Agent::as_parent` fills it.)
    pub agent: Option<LocalAgent>,
    /// The delegation budget the parent holds (inherited from its own
    /// start, or opened on it): every child it starts answers to it.
    /// (`agent::Agent::as_parent` fills it.)
    pub budget: Option<BudgetLease>,
    /// The route to the approver its children's permission requests climb
    /// to, when the parent has one of its own (a door's session, or an
    /// in-process child passing on its own route); else the runtime's.
    /// (`agent::Agent::as_parent` fills it.) Not compared by `==`.
    pub approvals: Option<Approvals>,
}

impl PartialEq for Parent {
    fn eq(&self, other: &Self) -> bool {
        self.session_id == other.session_id
            && self.depth == other.depth
            && self.cwd == other.cwd
            && self.route == other.route
            && self.agent.as_ref().map(LocalAgent::session_id) == other.agent.as_ref().map(LocalAgent::session_id)
            && match (&self.budget, &other.budget) {
                (Some(a), Some(b)) => a.same_holder(b),
                (a, b) => a.is_none() && b.is_none(),
            }
    }
}

impl Eq for Parent {}

impl Parent {
    /// A top-level parent (depth 0, no session) working in `cwd`.
    pub fn root(cwd: impl Into<PathBuf>) -> Self {
        Parent {
            session_id: None,
            depth: 0,
            cwd: cwd.into(),
            route: AgentOptions::default(),
            agent: None,
            budget: None,
            approvals: None,
        }
    }

    /// This parent with a session id.
    pub fn with_session(mut self, session_id: impl Into<String>) -> Self {
        self.session_id = Some(session_id.into());
        self
    }

    /// This parent at another delegation depth.
    pub fn with_depth(mut self, depth: u32) -> Self {
        self.depth = depth;
        self
    }

    /// This parent with its in-process agent.
    pub fn with_agent(mut self, agent: LocalAgent) -> Self {
        self.agent = Some(agent);
        self
    }

    /// This parent with a route.
    pub fn with_route(mut self, route: AgentOptions) -> Self {
        self.route = route;
        self
    }

    /// This parent holding a delegation budget lease: every child it
    /// starts answers to it.
    pub fn with_budget_lease(mut self, lease: BudgetLease) -> Self {
        self.budget = Some(lease);
        self
    }

    /// This parent's children ask `approvals` for permission (see
    /// [`Approvals`]).
    pub fn with_approvals(mut self, approvals: Approvals) -> Self {
        self.approvals = Some(approvals);
        self
    }
}

/// A start whose run can be found again by a later caller: the caller
/// names the run (and records the name, e.g. in a journal) before it
/// starts, and a caller that crashed attaches to it by that name instead
/// of starting it again.
///
/// A provider that [offers it](crate::seam::Provider::offers_detached)
/// keeps such a run going for a bounded time after its caller is gone,
/// and keeps its result for collection; any other provider rejects the
/// start (`INVALID_REQUEST`, field `detached`). With `Attach` the request's
/// prompt and options are not sent again: the run keeps those it was
/// started with. An attach to a run the provider no longer knows (never
/// stored, or kept past its bound) fails `STARTUP_FAILED` with category
/// [`RunUnknown`](crate::seam::Category::RunUnknown): start it again
/// under a new name. The attached run is the caller's like any other:
/// cancelling it (or the attach, before it returns) stops the run itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Detached {
    /// Start a new run under this id (1 to 64 letters, digits, `_`, `-`).
    Start(String),
    /// Attach to the run started under this id.
    Attach(String),
}

impl Detached {
    /// The run's id.
    pub fn run_id(&self) -> &str {
        match self {
            Detached::Start(run) | Detached::Attach(run) => run,
        }
    }
}

/// Which batch task a run carries out: set by the batch engine
/// (`subagents::batch`), read by a provider that gives each run its own git
/// worktree, whose branch is `subagents/<batch>/<id>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchTask {
    /// The batch's name (a `fanout`'s: its results file's name).
    pub batch: String,
    /// The task's id in the batch.
    pub id: String,
    /// The batch resumes an earlier one: a branch an earlier run of this
    /// task left is taken up again, not refused.
    pub resumed: bool,
}

/// Everything `start` needs. Build with [`StartRequest::new`] and the
/// `with_*` methods; fields are public for pattern matching and tests.
#[derive(Clone, Debug)]
pub struct StartRequest {
    /// The task, as content blocks.
    pub prompt: Vec<ContentBlock>,
    /// Who delegates.
    pub parent: Parent,
    /// The canonical cancellation channel: tripped before publication the
    /// start rejects after rollback; after, the child is cancelled.
    pub signal: CancellationToken,
    /// The child's route overrides.
    pub agent_options: Option<AgentOptions>,
    /// A JSON Schema the child's structured result must satisfy.
    pub output_schema: Option<serde_json::Value>,
    /// Absolute cap on the child's delegation depth.
    pub max_depth: Option<u32>,
    /// Which tools the child may use.
    pub tool_filter: Option<ToolFilter>,
    /// The child's persona, replacing its default persona section.
    pub persona: Option<String>,
    /// The MCP servers the child mounts, by name: a subset of those it
    /// would mount otherwise (its provider's, else its parent's). A name
    /// not among them is refused at start; `Some(vec![])` mounts none.
    pub mcp_servers: Option<Vec<String>>,
    /// A display label for events and progress.
    pub label: Option<String>,
    /// Receives this run's progress as it happens (see [`ProgressSink`]).
    pub progress: Option<ProgressSink>,
    /// A delegation budget for this run and its descendants, on top of any
    /// the parent holds (both bind). Share one lease across several starts
    /// to budget them together.
    pub budget: Option<BudgetLease>,
    /// A run named by the caller, to be found again after the caller's
    /// loss (see [`Detached`]); only a provider that
    /// [offers it](crate::seam::Provider::offers_detached) accepts one.
    pub detached: Option<Detached>,
    /// The batch task this run carries out: a provider that gives each run
    /// a git worktree names its branch after it (see [`BatchTask`]).
    pub task: Option<BatchTask>,
    /// The child a continuation resumes (set by `Continuation::start`).
    pub(crate) resume: Option<LocalAgent>,
    /// The span the run's span hangs under while spans are exported: the
    /// caller's, taken when it starts the run (the run's span is created on
    /// the runtime's thread), or a peer's in another process.
    pub(crate) trace_parent: Option<crate::seam::TraceContext>,
}

impl StartRequest {
    /// The child this request continues, when it comes from a
    /// `Continuation`: a provider that supports continuation resumes that
    /// child's session instead of creating one.
    pub fn resumes(&self) -> Option<&LocalAgent> {
        self.resume.as_ref()
    }

    /// A request with a text prompt and nothing optional.
    pub fn new(prompt: impl Into<String>, parent: Parent, signal: CancellationToken) -> Self {
        Self::with_blocks(vec![ContentBlock::text(prompt)], parent, signal)
    }

    /// A request whose prompt is arbitrary content blocks.
    pub fn with_blocks(prompt: Vec<ContentBlock>, parent: Parent, signal: CancellationToken) -> Self {
        StartRequest {
            prompt,
            parent,
            signal,
            agent_options: None,
            output_schema: None,
            max_depth: None,
            tool_filter: None,
            persona: None,
            mcp_servers: None,
            label: None,
            progress: None,
            budget: None,
            detached: None,
            task: None,
            resume: None,
            trace_parent: None,
        }
    }

    /// Route overrides for the child.
    pub fn with_agent_options(mut self, options: AgentOptions) -> Self {
        self.agent_options = Some(options);
        self
    }

    /// Require a structured result matching `schema`.
    pub fn with_output_schema(mut self, schema: serde_json::Value) -> Self {
        self.output_schema = Some(schema);
        self
    }

    /// Cap the child's delegation depth.
    pub fn with_max_depth(mut self, max_depth: u32) -> Self {
        self.max_depth = Some(max_depth);
        self
    }

    /// Restrict the child's tools.
    pub fn with_tool_filter(mut self, filter: ToolFilter) -> Self {
        self.tool_filter = Some(filter);
        self
    }

    /// Give the child a persona.
    pub fn with_persona(mut self, persona: impl Into<String>) -> Self {
        self.persona = Some(persona.into());
        self
    }

    /// Mount only these of the MCP servers the child would mount (its
    /// provider's, else its parent's); an empty list mounts none.
    pub fn with_mcp_servers<I: IntoIterator<Item = S>, S: Into<String>>(mut self, names: I) -> Self {
        self.mcp_servers = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// Receives this run's progress as it happens (a provider reports it
    /// through its context; nested runs arrive as `Delegated`).
    pub fn with_progress(mut self, sink: ProgressSink) -> Self {
        self.progress = Some(sink);
        self
    }

    /// Opens `budget` now (its deadline starts counting) for this run and
    /// its descendants. See [`Budget`].
    pub fn with_budget(self, budget: Budget) -> Self {
        self.with_budget_lease(budget.lease())
    }

    /// Runs this start on an open lease, shared with every other start
    /// given the same lease (their width and total runs count together).
    pub fn with_budget_lease(mut self, lease: BudgetLease) -> Self {
        self.budget = Some(lease);
        self
    }

    /// Starts the run under a name the caller chose, or attaches to one
    /// started earlier (see [`Detached`]).
    pub fn with_detached(mut self, detached: Detached) -> Self {
        self.detached = Some(detached);
        self
    }

    /// Label the run for display.
    pub fn with_label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// The start-time capabilities this request needs, in check order.
    pub fn requested_capabilities(&self) -> impl Iterator<Item = Capability> + '_ {
        Capability::CHECK_ORDER.into_iter().filter(|c| match c {
            Capability::OutputSchema => self.output_schema.is_some(),
            Capability::DepthLimit => self.max_depth.is_some(),
            Capability::ToolFilter => self.tool_filter.is_some(),
            Capability::Persona => self.persona.is_some(),
            Capability::AgentOptions => self.agent_options.is_some(),
            Capability::McpServers => self.mcp_servers.is_some(),
            Capability::Detached => self.detached.is_some(),
        })
    }

    /// The depth the child would have.
    pub fn child_depth(&self) -> u32 {
        self.parent.depth.saturating_add(1)
    }
}
