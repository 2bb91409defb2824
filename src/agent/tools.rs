//! Tools: named functions with JSON-Schema parameters that a model may call.
//!
//! A [`Toolset`] belongs to one agent: another agent never sees its tools.
//! Every call goes through the same checks, in order, before the tool runs:
//!
//! 1. the pre-execute gates ([`ToolGate`]), which see every call — also calls
//!    of names the model invented — and may deny it;
//! 2. the agent's [`ToolFilter`], which hides tools from the list the model
//!    sees *and* denies them here, since a model can name a hidden tool;
//! 3. the name must exist;
//! 4. the arguments must satisfy the tool's schema; otherwise the model gets
//!    a tool error listing every path-qualified violation and can retry.
//!
//! A tool may end the turn ([`ToolOutput::ending_turn`]); later calls in the
//! same answer are then denied. A panicking tool becomes a tool error.
//!
//! ```
//! use serde_json::json;
//! use subagents::agent::{FnTool, ToolOutput, Toolset};
//!
//! let mut tools = Toolset::new();
//! tools.add(FnTool::new("add", "Adds two integers.",
//!     json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
//!            "required": ["a", "b"]}),
//!     |args| ToolOutput::ok((args["a"].as_i64().unwrap() + args["b"].as_i64().unwrap()).to_string()))).unwrap();
//! assert_eq!(tools.specs()[0].name, "add");
//! ```

mod approving;
mod builtin;
#[cfg(feature = "mcp-client")]
mod mcp;

use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

pub use approving::Approving;
pub use builtin::{ListDir, ReadFile};
#[cfg(all(feature = "mcp-client", feature = "process"))]
pub(crate) use mcp::start_all as start_mcp_servers;
#[cfg(feature = "mcp-client")]
pub use mcp::{McpServer, McpServerConfig, McpServerError, McpStartError, McpTransport, MCP_TOOL_PREFIX};

use super::session::ToolCall;
use crate::schema::{CompiledSchema, SchemaError};
use crate::seam::{ProgressUpdate, ToolFilter};

/// Whether `name` may name an MCP server: one part of its tools' names
/// (`mcp__NAME__TOOL`), so letters, digits, `_` and `-`, without `__`.
pub fn valid_server_name(name: &str) -> bool {
    !name.is_empty() && !name.contains("__") && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Why `name: value` cannot go with a streamable HTTP MCP server's
/// requests, if it cannot: [`header_problem`]'s, or a name the protocol
/// sets (`Accept`, `Mcp-Session-Id`, `Mcp-Protocol-Version`,
/// `Last-Event-Id`).
#[cfg(any(feature = "mcp-client", feature = "config"))]
pub(crate) fn mcp_header_problem(name: &str, value: &str) -> Option<String> {
    const SET_BY_THE_PROTOCOL: [&str; 4] = ["accept", "mcp-session-id", "mcp-protocol-version", "last-event-id"];
    if let Some(problem) = header_problem(name, value) {
        return Some(problem);
    }
    SET_BY_THE_PROTOCOL
        .iter()
        .any(|set| name.eq_ignore_ascii_case(set))
        .then(|| format!("header {name:?} is set by the protocol"))
}

/// Why `name: value` cannot go with an HTTP request, if it cannot: a name
/// must be an HTTP token, a value visible ASCII, spaces or tabs (a newline
/// from `${VAR}` would end the header). The value is never shown.
#[cfg(any(feature = "mcp-client", feature = "config"))]
pub(crate) fn header_problem(name: &str, value: &str) -> Option<String> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if name.is_empty() || !name.chars().all(token) {
        return Some(format!("header name {name:?} is not an HTTP token"));
    }
    if !header_value_fits(value) {
        return Some(format!("the value of header {name:?} has a character an HTTP header cannot carry"));
    }
    None
}

/// Whether an HTTP header can carry `value`: visible ASCII, spaces, tabs.
#[cfg(any(feature = "mcp-client", feature = "config"))]
pub(crate) fn header_value_fits(value: &str) -> bool {
    value.chars().all(|c| c == '\t' || (' '..='~').contains(&c))
}

/// What the model is told about a tool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The name the model calls it by.
    pub name: String,
    /// What it does and when to use it.
    pub description: String,
    /// JSON Schema of its arguments.
    pub parameters: Value,
}

/// What a running tool knows about its call.
#[derive(Clone, Debug)]
pub struct ToolContext {
    /// The calling agent (a delegating tool makes it the parent:
    /// [`Agent::as_parent`](super::Agent::as_parent)).
    pub agent: super::Agent,
    /// The calling session.
    pub session_id: Arc<str>,
    /// The session's working directory.
    pub cwd: Arc<Path>,
    /// The model's id for this call.
    pub call_id: String,
    /// Trips when the turn is cancelled.
    pub cancel: CancellationToken,
}

impl ToolContext {
    /// Reports progress of this call to the agent's update sink (as
    /// `AgentUpdate::ToolProgress`), e.g. what a delegated child does.
    pub fn progress(&self, update: ProgressUpdate) {
        self.agent.report(super::AgentUpdate::ToolProgress { id: self.call_id.clone(), update });
    }
}

/// A tool's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolOutput {
    /// What the model sees.
    pub content: String,
    /// Whether it is an error.
    pub is_error: bool,
    /// Whether this call ends the turn (later calls in the answer are denied).
    pub ends_turn: bool,
}

impl ToolOutput {
    /// A successful result.
    pub fn ok(content: impl Into<String>) -> Self {
        ToolOutput { content: content.into(), is_error: false, ends_turn: false }
    }

    /// An error the model sees.
    pub fn error(content: impl Into<String>) -> Self {
        ToolOutput { content: content.into(), is_error: true, ends_turn: false }
    }

    /// The same output, ending the turn.
    pub fn ending_turn(self) -> Self {
        ToolOutput { ends_turn: true, ..self }
    }
}

/// [`Tool::concurrent`] and [`Tool::read_only`], both yes, inside a
/// `Tool` impl: a tool that only reads may run beside the answer's other
/// concurrent calls.
macro_rules! reads_only {
    () => {
        fn concurrent(&self) -> bool {
            true
        }

        fn read_only(&self) -> bool {
            true
        }
    };
}
pub(crate) use reads_only;

/// A tool.
pub trait Tool: Send + Sync + 'static {
    /// Name, description and parameter schema (read once, when added).
    fn spec(&self) -> ToolSpec;

    /// Whether calls may run concurrently with other concurrent calls of the
    /// same answer (read-only tools). Default: no. A tool that may end the
    /// turn should stay exclusive: calls batched with it run regardless.
    fn concurrent(&self) -> bool {
        false
    }

    /// Whether the tool leaves the world as it found it: it only reads
    /// (files, directories, tasks), and whatever else it changes is its own
    /// agent's delegated work (stopping one of that agent's background
    /// tasks). An agent whose tools all only read may be run without fear
    /// of side effects: `subagents mcp` tells its client so
    /// (`readOnlyHint`). Default: no, a tool must claim it.
    fn read_only(&self) -> bool {
        false
    }

    /// Whether the tool's presence or spec may change after it was added
    /// (a subagent tool follows its provider). Dynamic tools are asked for
    /// [`Tool::available`] and their spec at every model request. Default: no.
    fn dynamic(&self) -> bool {
        false
    }

    /// Whether a dynamic tool is there right now. Default: yes.
    fn available(&self) -> bool {
        true
    }

    /// For a dynamic tool: a number that changes whenever
    /// [`Tool::available`] or its spec may answer differently. While every
    /// dynamic tool of a set says the same number as at the last request,
    /// the list the model sees is not computed again (it is shared by the
    /// set's clones: every child of a provider). Default: `None`, asked at
    /// every request.
    fn spec_state(&self) -> Option<u64> {
        None
    }

    /// Whether an agent at delegation depth `depth` is offered the tool. A
    /// subagent tool is not offered at its depth cap, where every call
    /// could only fail. Default: yes.
    fn offered_at_depth(&self, depth: u32) -> bool {
        let _ = depth;
        true
    }

    /// The MCP server whose tool this is: an agent's children inherit the
    /// servers its tools come from. Default: none.
    #[cfg(feature = "mcp-client")]
    fn mcp_server(&self) -> Option<McpServer> {
        None
    }

    /// Runs one call with arguments already validated against the schema.
    fn call(&self, arguments: Value, context: ToolContext) -> BoxFuture<'_, ToolOutput>;
}

/// A pre-execute hook: `Err(reason)` denies the call; the model sees the reason.
pub trait ToolGate: Send + Sync + 'static {
    /// Checks one call before anything else does.
    fn check(&self, call: &ToolCall) -> Result<(), String>;
}

impl<F: Fn(&ToolCall) -> Result<(), String> + Send + Sync + 'static> ToolGate for F {
    fn check(&self, call: &ToolCall) -> Result<(), String> {
        self(call)
    }
}

/// A tool from a synchronous closure.
pub struct FnTool<F> {
    spec: ToolSpec,
    concurrent: bool,
    run: F,
}

impl<F> std::fmt::Debug for FnTool<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FnTool").field("name", &self.spec.name).field("concurrent", &self.concurrent).finish()
    }
}

impl<F: Fn(Value) -> ToolOutput + Send + Sync + 'static> FnTool<F> {
    /// A concurrent tool named `name` running `run` on its arguments.
    pub fn new(name: impl Into<String>, description: impl Into<String>, parameters: Value, run: F) -> Self {
        let spec = ToolSpec { name: name.into(), description: description.into(), parameters };
        FnTool { spec, concurrent: true, run }
    }

    /// Runs alone, in order, never batched with other calls.
    pub fn exclusive(mut self) -> Self {
        self.concurrent = false;
        self
    }
}

impl<F: Fn(Value) -> ToolOutput + Send + Sync + 'static> Tool for FnTool<F> {
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    fn concurrent(&self) -> bool {
        self.concurrent
    }

    fn call(&self, arguments: Value, _context: ToolContext) -> BoxFuture<'_, ToolOutput> {
        let output = (self.run)(arguments);
        Box::pin(async move { output })
    }
}

/// Why a tool could not be added.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// Two tools with one name.
    #[error("a tool named {0:?} is already registered")]
    Duplicate(String),
    /// The parameter schema is not a JSON object or does not compile.
    #[error("tool {name:?} has an invalid parameter schema: {reason}")]
    InvalidSchema {
        /// The tool.
        name: String,
        /// Why.
        reason: String,
    },
}

struct Entry {
    spec: ToolSpec,
    /// Compiled on first use: most tools of most agents are never called,
    /// and a first compile in a process costs milliseconds.
    schema: OnceLock<Result<CompiledSchema, SchemaError>>,
    tool: Arc<dyn Tool>,
    /// Runtime-owned (the structured-output capture): no filter hides it.
    exempt: bool,
    /// Asked for its availability and spec at every request.
    dynamic: bool,
}

impl Entry {
    fn compiled(&self) -> Result<&CompiledSchema, &str> {
        self.schema.get_or_init(|| CompiledSchema::compile(&self.spec.parameters)).as_ref().map_err(SchemaError::reason)
    }
}

/// What a tool set's model sees, shared by its clones until one changes.
#[derive(Default)]
struct Visible {
    /// A set without dynamic tools: computed once.
    fixed: OnceLock<Arc<[ToolSpec]>>,
    /// A set with dynamic tools: the list as computed at their states (see
    /// [`Tool::spec_state`]), folded into one number.
    at_state: std::sync::Mutex<Option<(u64, Arc<[ToolSpec]>)>>,
}

/// One agent's tools, gates and filter. Cloning shares the tools.
#[derive(Clone, Default)]
pub struct Toolset {
    /// Shared by clones until one changes (each child of a provider holds
    /// a clone of its set: no list of its own unless it adds or removes).
    entries: Arc<Vec<Arc<Entry>>>,
    /// Shared by clones until one adds a gate (most sets have none).
    gates: Arc<Vec<Arc<dyn ToolGate>>>,
    /// The tools that ask the nearest approver before they run (one run's:
    /// its "allow always" grants are that run's).
    approving: Option<Arc<Approving>>,
    /// Shared (clones and children of one filter hold one copy), and
    /// boxed: most tool sets have none, and the agent holds its set inline.
    filter: Option<Arc<ToolFilter>>,
    /// The owning agent's delegation depth ([`Tool::offered_at_depth`]).
    depth: u32,
    /// Whether some tool is not offered at `depth`, so the shared list
    /// below is this depth's own (not the one every clone can share).
    hidden_by_depth: bool,
    /// What the model sees, computed once and shared by clones; every
    /// change replaces it.
    visible: Arc<Visible>,
    /// The MCP servers mounted, with tools or without: a call of one of
    /// their tools that is not there is told why.
    #[cfg(feature = "mcp-client")]
    mcp_mounted: Arc<Vec<McpServer>>,
}

impl std::fmt::Debug for Toolset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Toolset").field("tools", &self.names()).field("filter", &self.filter).finish_non_exhaustive()
    }
}

impl Toolset {
    /// No tools.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a tool; its name must be new and its schema a JSON object. The
    /// schema is compiled at the tool's first call (see
    /// [`Toolset::compile_all`] to check every schema now).
    pub fn add(&mut self, tool: impl Tool) -> Result<(), ToolError> {
        self.add_shared(Arc::new(tool))
    }

    /// Adds a shared tool.
    pub fn add_shared(&mut self, tool: Arc<dyn Tool>) -> Result<(), ToolError> {
        self.insert(tool, false)
    }

    /// Adds a runtime-owned tool that the filter never hides or denies (the
    /// structured-output capture belongs to the run, not to the task).
    pub fn add_exempt(&mut self, tool: impl Tool) -> Result<(), ToolError> {
        self.insert(Arc::new(tool), true)
    }

    fn insert(&mut self, tool: Arc<dyn Tool>, exempt: bool) -> Result<(), ToolError> {
        let spec = tool.spec();
        if self.entry(&spec.name).is_some() {
            return Err(ToolError::Duplicate(spec.name));
        }
        if !spec.parameters.is_object() {
            let reason = "the parameters must be a JSON Schema object".to_owned();
            return Err(ToolError::InvalidSchema { name: spec.name, reason });
        }
        let dynamic = tool.dynamic();
        Arc::make_mut(&mut self.entries).push(Arc::new(Entry { spec, schema: OnceLock::new(), tool, exempt, dynamic }));
        self.visible = Arc::default();
        Ok(())
    }

    /// Compiles every tool's schema now; the first failure is the error.
    pub fn compile_all(&self) -> Result<(), ToolError> {
        for entry in self.entries.iter() {
            entry.compiled().map_err(|reason| ToolError::InvalidSchema {
                name: entry.spec.name.clone(),
                reason: reason.to_owned(),
            })?;
        }
        Ok(())
    }

    /// Removes a tool by name; returns whether it was there.
    pub fn remove(&mut self, name: &str) -> bool {
        let before = self.entries.len();
        if self.entries.iter().any(|entry| entry.spec.name == name) {
            Arc::make_mut(&mut self.entries).retain(|entry| entry.spec.name != name);
        }
        self.visible = Arc::default();
        before != self.entries.len()
    }

    /// Adds a pre-execute gate; gates run in the order added.
    pub fn add_gate(&mut self, gate: impl ToolGate) {
        Arc::make_mut(&mut self.gates).push(Arc::new(gate));
    }

    /// Calls of the tools `approving` names ask before they run (see
    /// [`Approving`]); replaces what was set before.
    pub fn approve(&mut self, approving: Approving) {
        self.approving = Some(Arc::new(approving));
    }

    /// Hides and denies tools the filter does not permit.
    pub fn set_filter(&mut self, filter: ToolFilter) {
        self.filter = Some(Arc::new(filter));
        self.visible = Arc::default();
    }

    /// Sets the owning agent's delegation depth (the agent does this when
    /// it is built): tools not offered at that depth are hidden.
    pub fn set_depth(&mut self, depth: u32) {
        let hides = self.entries.iter().any(|entry| !entry.tool.offered_at_depth(depth));
        // Clones share one computed list; only a depth that hides a tool
        // (or leaves one that did) needs a list of its own.
        if hides || self.hidden_by_depth {
            self.visible = Arc::default();
        }
        self.depth = depth;
        self.hidden_by_depth = hides;
    }

    /// Names of every tool, hidden ones included.
    pub fn names(&self) -> Vec<&str> {
        self.entries.iter().map(|entry| entry.spec.name.as_str()).collect()
    }

    /// What the model sees: every tool the filter permits.
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.visible_specs().to_vec()
    }

    /// What the model sees, shared: cheap to call once per model request.
    pub fn visible_specs(&self) -> Arc<[ToolSpec]> {
        if !self.entries.iter().any(|e| e.dynamic) {
            return self.visible.fixed.get_or_init(|| self.compute_specs().into()).clone();
        }
        use std::hash::Hasher as _;
        // The dynamic tools' states, folded: the list computed at the same
        // states is still the list.
        let mut states = std::hash::DefaultHasher::new();
        for entry in self.entries.iter().filter(|e| e.dynamic) {
            match entry.tool.spec_state() {
                Some(state) => states.write_u64(state),
                None => return self.compute_specs().into(),
            }
        }
        let states = states.finish();
        let mut last = self.visible.at_state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match &*last {
            Some((at, specs)) if *at == states => specs.clone(),
            _ => {
                let specs: Arc<[ToolSpec]> = self.compute_specs().into();
                *last = Some((states, specs.clone()));
                specs
            }
        }
    }

    fn compute_specs(&self) -> Vec<ToolSpec> {
        let present = |e: &&Arc<Entry>| {
            self.permits(e) && (!e.dynamic || e.tool.available()) && e.tool.offered_at_depth(self.depth)
        };
        self.entries.iter().filter(present).map(|e| if e.dynamic { e.tool.spec() } else { e.spec.clone() }).collect()
    }

    /// Whether the call may run concurrently with its neighbours.
    pub(crate) fn concurrent(&self, name: &str) -> bool {
        self.entry(name).is_some_and(|entry| entry.tool.concurrent())
    }

    /// Whether the tool named `name` only reads ([`Tool::read_only`]).
    #[cfg(feature = "mcp-server")]
    pub(crate) fn read_only(&self, name: &str) -> bool {
        self.entry(name).is_some_and(|entry| entry.tool.read_only())
    }

    fn permits(&self, entry: &Entry) -> bool {
        entry.exempt || self.filter.as_ref().is_none_or(|filter| filter.permits(&entry.spec.name))
    }

    fn entry(&self, name: &str) -> Option<&Arc<Entry>> {
        self.entries.iter().find(|entry| entry.spec.name == name)
    }

    /// What a call of `name`, which is not there, is told: the tools that
    /// are, and for an MCP server's tool why it is not (also warned).
    fn no_tool_named(&self, name: &str) -> String {
        let available: Vec<_> = self.specs().into_iter().map(|spec| spec.name).collect();
        let available = available.join(", ");
        #[cfg(feature = "mcp-client")]
        if let Some(why) = self.why_mcp_missing(name) {
            tracing::warn!(tool = ?name, "a call of an MCP tool that is not mounted: {why}");
            return format!("no tool named {name:?}: {why}; available: {available}");
        }
        format!("no tool named {name:?}; available: {available}")
    }

    /// Checks and runs one call. Never fails: every problem is a tool error
    /// the model sees.
    pub async fn execute(&self, call: &ToolCall, context: ToolContext) -> ToolOutput {
        for gate in self.gates.iter() {
            if let Err(reason) = gate.check(call) {
                return ToolOutput::error(format!("tool call {:?} denied: {reason}", call.name));
            }
        }
        let entry = self.entry(&call.name);
        let filtered = match entry {
            Some(entry) => !self.permits(entry),
            None => self.filter.as_ref().is_some_and(|filter| !filter.permits(&call.name)),
        };
        if filtered {
            return ToolOutput::error(format!("tool {:?} is not available to this agent", call.name));
        }
        let Some(entry) = entry.filter(|e| !e.dynamic || e.tool.available()) else {
            return ToolOutput::error(self.no_tool_named(&call.name));
        };
        if let Value::String(raw) = &call.arguments {
            if serde_json::from_str::<Value>(raw).is_err() {
                return ToolOutput::error(format!("arguments for {:?} are not valid JSON", call.name));
            }
        }
        let violations = match entry.compiled() {
            Ok(schema) => schema.violations(&call.arguments),
            Err(reason) => {
                return ToolOutput::error(format!("tool {:?} has an invalid parameter schema: {reason}", call.name))
            }
        };
        if !violations.is_empty() {
            return ToolOutput::error(format!("invalid arguments for {:?}:\n- {}", call.name, violations.join("\n- ")));
        }
        if let Some(approving) = self.approving.as_ref().filter(|approving| approving.covers(&call.name)) {
            if let Err(rejected) = approving.ask(call, entry.tool.read_only(), &context).await {
                return rejected;
            }
        }
        // Created inside the future so a tool that panics before its first
        // await is contained too.
        let run = async { entry.tool.call(call.arguments.clone(), context).await };
        match AssertUnwindSafe(run).catch_unwind().await {
            Ok(output) => output,
            Err(_) => {
                tracing::warn!(tool = %call.name, "a tool panicked; the model sees a tool error");
                ToolOutput::error(format!("tool {:?} failed unexpectedly", call.name))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

    use serde_json::json;

    use super::*;

    /// A dynamic tool whose state a test turns: its spec says the state,
    /// and counts how often it was asked for.
    struct Turning {
        state: Arc<AtomicU64>,
        asked: Arc<AtomicUsize>,
        /// Whether it says its state ([`Tool::spec_state`]).
        says: bool,
        there: Arc<AtomicBool>,
    }

    impl Tool for Turning {
        fn spec(&self) -> ToolSpec {
            self.asked.fetch_add(1, Ordering::SeqCst);
            let description = format!("state {}", self.state.load(Ordering::SeqCst));
            ToolSpec { name: "turning".into(), description, parameters: json!({"type": "object"}) }
        }

        fn dynamic(&self) -> bool {
            true
        }

        fn available(&self) -> bool {
            self.there.load(Ordering::SeqCst)
        }

        fn spec_state(&self) -> Option<u64> {
            self.says.then(|| self.state.load(Ordering::SeqCst))
        }

        fn call(&self, _: Value, _: ToolContext) -> BoxFuture<'_, ToolOutput> {
            Box::pin(async { ToolOutput::error("not called here") })
        }
    }

    fn set_with(says: bool) -> (Toolset, Arc<AtomicU64>, Arc<AtomicUsize>, Arc<AtomicBool>) {
        let (state, asked, there) = (Arc::new(AtomicU64::new(1)), Arc::default(), Arc::new(AtomicBool::new(true)));
        let mut set = Toolset::new();
        set.add(FnTool::new("fixed", "always there", json!({"type": "object"}), |_| ToolOutput::ok(""))).unwrap();
        let turning = Turning { state: state.clone(), asked: Arc::clone(&asked), says, there: there.clone() };
        set.add(turning).unwrap();
        (set, state, asked, there)
    }

    fn descriptions(specs: &[ToolSpec]) -> Vec<&str> {
        specs.iter().map(|spec| spec.description.as_str()).collect()
    }

    #[test]
    fn a_list_with_a_dynamic_tool_is_computed_again_only_when_its_state_changes() {
        let (set, state, asked, there) = set_with(true);
        let clone = set.clone();
        let first = set.visible_specs();
        assert_eq!(descriptions(&first), ["always there", "state 1"]);
        let asked_once = asked.load(Ordering::SeqCst);
        // The same state: the very list, from the set and from its clone.
        assert!(Arc::ptr_eq(&first, &set.visible_specs()));
        assert!(Arc::ptr_eq(&first, &clone.visible_specs()));
        assert_eq!(asked.load(Ordering::SeqCst), asked_once, "not asked again");
        // A new state: a new list that says it.
        state.store(2, Ordering::SeqCst);
        assert_eq!(descriptions(&clone.visible_specs()), ["always there", "state 2"]);
        // Gone, under a state of its own: gone from the list.
        there.store(false, Ordering::SeqCst);
        state.store(3, Ordering::SeqCst);
        assert_eq!(descriptions(&set.visible_specs()), ["always there"]);
    }

    #[test]
    fn a_dynamic_tool_that_says_no_state_is_asked_at_every_request() {
        let (set, state, asked, _) = set_with(false);
        set.visible_specs();
        let before = asked.load(Ordering::SeqCst);
        state.store(7, Ordering::SeqCst);
        assert_eq!(descriptions(&set.visible_specs()), ["always there", "state 7"]);
        assert!(asked.load(Ordering::SeqCst) > before);
    }
}
