//! The child side of the `serve` protocol: `subagents serve` runs one
//! session of a full runtime over stdio.
//!
//! The child builds its own [`Runtime`] (home from `--home`), a `spawn`
//! provider of its own (it can delegate further), and one agent from the
//! `initialize` request: the route picks the model (`scripted`, the
//! default, or `openai`), the profile and its ordered patches pick the
//! persona, step limit and tools. Malformed input gets a JSON-RPC error
//! reply: unparsable JSON -32700, anything that is not a request object
//! with a string, integer or null id and a method name (a batch, a bare
//! value, an object id, an id beyond 64 bits) -32600 with id null, bad
//! parameters (a relative cwd, an unknown profile) -32602. An oversized
//! line ends the session. EOF, `shutdown` or a stop signal (SIGINT,
//! SIGTERM, SIGHUP: see `serve/signals.rs`) ends it after the running turn
//! is cancelled and the session is closed (its turn end on disk); the
//! `shutdown` reply carries the receipts of the runs the session started
//! (`runs`, each gathered once it is quiescent).
//!
//! With a configuration file (`--config`, the `process` provider's
//! `config`) the session delegates to the file's providers (what its
//! `[tool]` offers) instead of a `spawn` of its own. When the parent says
//! it answers permission requests, the runs below the session ask it
//! (`approvals.rs`); at the end of input every pending request is
//! rejected first, so a parent that died leaves no grandchild waiting.
//! When the parent lends its route limiters, the session's model calls on
//! those routes ask the parent's limiter too (`limits.rs`); a parent that
//! died is not waited for.

mod approvals;
mod limits;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::codec::AnyDelimiterCodecError;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use self::approvals::ParentApprover;
use self::limits::ParentLimits;
use super::pipes::{self, StdoutLines};
use super::signals::StopSignals;
use super::ServeError;
use crate::actors::LineageScope;
use crate::agent::{Agent, AgentUpdate, ListDir, ModelSpec, ReadFile, SessionEvent, SessionStore, Tool, Toolset};
use crate::child_process::lines;
#[cfg(any(feature = "mcp-server", feature = "remote"))]
use crate::providers::ProcessConfig;
use crate::seam::ContentBlock;
use crate::seam::TraceContext;
use crate::telemetry;
use crate::tool::{delegating_tools, register_delegating_spawn, TaskService, DEFAULT_MAX_DEPTH};
use crate::wire::process::profile::{Profile, PROFILE_TOOLS};
use crate::wire::process::{ChildEvent, Initialize, TurnEndReason, PROTOCOL_VERSION};
use crate::Runtime;

/// How deep the served session's delegation tree may go, counted in its
/// own runtime (the parent owns the budget above it: provider-managed).
const MAX_DEPTH: u32 = DEFAULT_MAX_DEPTH;

/// How long the end of input waits for the pending permission requests to
/// take their rejects before the session's turn is cancelled.
const REJECT_BOUND: Duration = Duration::from_secs(2);

/// Where the served session keeps its state.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    /// The child's home directory (sessions).
    pub home: PathBuf,
    /// Providers from a configuration file: every one registered, and the
    /// session's subagent tool offers what its `[tool]` offers (else the
    /// session delegates to a `spawn` of its own).
    #[cfg(feature = "config")]
    pub configured: Option<crate::config::Configured>,
}

impl ServeOptions {
    /// A session at `home`, delegating to a `spawn` of its own.
    pub fn new(home: impl Into<PathBuf>) -> Self {
        ServeOptions {
            home: home.into(),
            #[cfg(feature = "config")]
            configured: None,
        }
    }
}

/// Serves one session over this process's stdin and stdout until EOF or
/// `shutdown`.
pub fn serve_stdio(options: ServeOptions) -> Result<(), ServeError> {
    let runtime = Runtime::builder().home(&options.home).workers(1).build().map_err(ServeError::Runtime)?;
    let tasks = TaskService::new();
    #[cfg(feature = "config")]
    if let Some(configured) = &options.configured {
        // Outside the runtime: an `acp` provider's probe runs on its own.
        let model: Arc<dyn crate::agent::Model> = Arc::new(crate::agent::ScriptedModel::demo());
        configured
            .register_blocking(&runtime.subagents(), &tasks, &options.home, model)
            .map_err(|e| ServeError::Options(e.to_string()))?;
    }
    let served = runtime.block_on(Server::new(runtime.subagents(), options, tasks).run());
    runtime.shutdown_blocking();
    served
}

struct Server {
    subagents: crate::Subagents,
    options: ServeOptions,
    out: mpsc::UnboundedSender<Value>,
    outgoing: Option<mpsc::UnboundedReceiver<Value>>,
    agent: Option<Agent>,
    /// The MCP servers the session mounted, closed at its end.
    #[cfg(feature = "mcp-client")]
    mcp_servers: Vec<crate::agent::McpServer>,
    turn: Option<tokio::task::JoinHandle<()>>,
    /// Tripped by a `cancel` for the latest turn: a cancel read before the
    /// turn's task first ran (they arrive back to back) still stops it.
    turn_cancel: CancellationToken,
    /// The runs the served session starts, for the `shutdown` receipt.
    lineage: Option<LineageScope>,
    /// The served session's span: its turns run inside it.
    span: tracing::Span,
    /// The session's task tools' service.
    tasks: TaskService,
    /// Asks the parent, when it said it answers.
    approver: Option<Arc<ParentApprover>>,
    /// The parent's route limiters, when it lent any.
    limits: Option<Arc<ParentLimits>>,
}

/// A served door's own `process` provider, without a configuration file:
/// children under `home` running `spec` (see [`ProcessConfig::route_child_model`]).
#[cfg(any(feature = "mcp-server", feature = "remote"))]
pub(crate) fn door_process_provider(
    name: &str,
    home: std::path::PathBuf,
    spec: &ModelSpec,
) -> Result<crate::providers::ProcessProvider, crate::providers::process::ConfigError> {
    let mut config = ProcessConfig::new(name, home);
    config.route_child_model(spec);
    crate::providers::ProcessProvider::new(config)
}

fn reply(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn error(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

fn event(event: &ChildEvent) -> Value {
    json!({"jsonrpc": "2.0", "method": "event", "params": event})
}

/// What the parent is streamed of an update: text and tool calls (the turn
/// end goes out once the turn's outcome is known).
fn streamed(update: &AgentUpdate) -> Option<ChildEvent> {
    match update {
        AgentUpdate::Text(text) => Some(ChildEvent::TextDelta { text: text.clone() }),
        AgentUpdate::ToolProgress { update, .. } => Some(ChildEvent::Delegated { update: update.clone() }),
        update => update.tool_call().map(|(name, status)| ChildEvent::ToolCall { name: name.to_owned(), status }),
    }
}

impl Server {
    fn new(subagents: crate::Subagents, options: ServeOptions, tasks: TaskService) -> Server {
        let (out, outgoing) = mpsc::unbounded_channel();
        Server {
            subagents,
            options,
            out,
            outgoing: Some(outgoing),
            agent: None,
            #[cfg(feature = "mcp-client")]
            mcp_servers: Vec::new(),
            turn: None,
            turn_cancel: CancellationToken::new(),
            lineage: None,
            span: tracing::Span::none(),
            tasks,
            approver: None,
            limits: None,
        }
    }

    async fn run(mut self) -> Result<(), ServeError> {
        let mut outgoing = self.outgoing.take().expect("run once");
        let writer = tokio::spawn(async move {
            let stdout = StdoutLines::new();
            while let Some(message) = outgoing.recv().await {
                if stdout.write(message.to_string()).await.is_err() {
                    break;
                }
            }
        });
        // Stdin on a thread of its own, so that a signal can end the session
        // while a read is pending (see `serve/pipes.rs`).
        let mut lines = lines(pipes::stdin());
        let mut signals = StopSignals::register();
        let outcome = loop {
            let read = tokio::select! {
                biased;
                signal = signals.recv() => {
                    tracing::info!(signal, "stopped by a signal: closing as at EOF");
                    break Ok(());
                }
                read = lines.next() => read,
            };
            let line = match read {
                Some(Ok(line)) => line,
                None => break Ok(()),
                Some(Err(AnyDelimiterCodecError::MaxChunkLengthExceeded)) => {
                    let _ = self.out.send(error(&Value::Null, -32600, "line too long"));
                    break Err(ServeError::OversizedLine);
                }
                Some(Err(AnyDelimiterCodecError::Io(e))) => break Err(ServeError::Connection(e.to_string())),
            };
            let Ok(message) = serde_json::from_slice::<Value>(&line) else {
                let _ = self.out.send(error(&Value::Null, -32700, "parse error"));
                continue;
            };
            if self.handle(message).await {
                break Ok(());
            }
        };
        self.close_limits("the parent is gone");
        self.close_approvals("the parent is gone").await;
        self.end().await;
        drop(self.out);
        let _ = writer.await;
        outcome
    }

    /// Handles one message; `true` when the session should end.
    async fn handle(&mut self, message: Value) -> bool {
        // Only an object with a usable id and a method name is a request; the
        // rest is answered "invalid request" with id null (JSON-RPC 2.0 §5),
        // so a batch, a bare number or an id that would not round-trip
        // (an object, a fraction, beyond 64 bits) never goes unanswered.
        let id = message.get("id").cloned().unwrap_or(Value::Null);
        let usable_id = match &id {
            Value::Null | Value::String(_) => true,
            Value::Number(number) => number.is_i64() || number.is_u64(),
            _ => false,
        };
        let method = message.get("method").and_then(Value::as_str);
        let answers = method.is_none() && (message.get("result").is_some() || message.get("error").is_some());
        if let Some(approver) = self.approver.as_ref().filter(|_| answers) {
            if approver.answered(&id, &message) {
                return false;
            }
        }
        if let Some(limits) = self.limits.as_ref().filter(|_| answers) {
            if limits.answered(&id, &message) {
                return false;
            }
        }
        let Some(method) = method.filter(|_| usable_id) else {
            let _ = self.out.send(error(&Value::Null, -32600, "invalid request"));
            return false;
        };
        let method = method.to_owned();
        let params = message.get("params").cloned().unwrap_or(Value::Null);
        let answer = match method.as_str() {
            "initialize" => Some(self.initialize(&id, params).await),
            "prompt" => self.prompt(&id, params),
            "cancel" => {
                self.turn_cancel.cancel();
                if let Some(agent) = &self.agent {
                    agent.cancel();
                }
                None
            }
            "shutdown" => {
                self.close_limits("the parent shut the session down");
                self.close_approvals("the parent shut the session down").await;
                self.end().await;
                // Every run of the session is disposed by now (the agent's
                // shutdown awaits its tasks): report each once quiescent.
                let runs = match &self.lineage {
                    Some(lineage) => lineage.branches().await,
                    None => Vec::new(),
                };
                let _ = self.out.send(reply(&id, json!({"runs": runs})));
                return true;
            }
            _ if id.is_null() => None,
            _ => Some(error(&id, -32601, "unknown method")),
        };
        if let Some(answer) = answer {
            let _ = self.out.send(answer);
        }
        false
    }

    async fn initialize(&mut self, id: &Value, params: Value) -> Value {
        if self.agent.is_some() {
            return error(id, -32600, "already initialized");
        }
        let init: Initialize = match serde_json::from_value(params) {
            Ok(init) => init,
            Err(_) => return error(id, -32602, "invalid initialize parameters"),
        };
        if init.protocol_version != PROTOCOL_VERSION {
            return error(id, -32602, "unsupported protocol version");
        }
        if !init.cwd.is_absolute() {
            return error(id, -32602, "cwd must be an absolute path");
        }
        let mounted = match self.mount_mcp_servers(&init).await {
            Ok(tools) => tools,
            Err(message) => return error(id, -32602, &message),
        };
        self.limits = self.borrow_limits(&init);
        match self.build_agent(&init, mounted) {
            Ok(agent) => {
                let session_id = agent.id().to_owned();
                let parent = TraceContext::received(init.traceparent.as_deref(), init.tracestate.as_deref());
                self.span = telemetry::served(&init.profile, &session_id, init.route.model.as_deref(), parent.as_ref());
                self.lineage = Some(self.subagents.lineage_scope(&session_id));
                self.agent = Some(agent);
                if init.approvals {
                    let approver = Arc::new(ParentApprover::new(self.out.clone()));
                    self.subagents.set_approver(approver.clone());
                    self.approver = Some(approver);
                }
                reply(id, json!({"protocol_version": PROTOCOL_VERSION, "session_id": session_id}))
            }
            Err(message) => {
                self.limits = None;
                error(id, -32602, &message)
            }
        }
    }

    /// The parent's lent route limiters, drawn on by the routes of this
    /// child's configuration of the same names (the session's model draws
    /// on its own in `build_agent`).
    fn borrow_limits(&self, init: &Initialize) -> Option<Arc<ParentLimits>> {
        if init.limits.is_empty() {
            return None;
        }
        let parent = ParentLimits::new(self.out.clone());
        #[cfg(feature = "config")]
        if let Some(configured) = &self.options.configured {
            for name in &init.limits {
                if let Some(route) = configured.config.route(name) {
                    route.limiter().draw_from(parent.route(name));
                }
            }
        }
        Some(parent)
    }

    /// The session's model limiter draws on the parent's route the model
    /// is on, when the parent lent it.
    fn draw_model_on_parent(&self, init: &Initialize, limiter: &crate::agent::Limiter) {
        let lent = init.model_route.as_ref().filter(|route| init.limits.contains(route));
        if let (Some(parent), Some(route)) = (&self.limits, lent) {
            limiter.draw_from(parent.route(route));
        }
    }

    /// Starts the MCP servers the parent sent: their tools, for the session.
    #[cfg(feature = "mcp-client")]
    async fn mount_mcp_servers(&mut self, init: &Initialize) -> Result<Vec<Arc<dyn Tool>>, String> {
        let configs = init.mcp_servers.iter().map(from_wire);
        let configs = configs.collect::<Result<Vec<_>, String>>()?;
        let (servers, tools) = crate::agent::start_mcp_servers(configs, &init.cwd).await;
        self.mcp_servers = servers;
        Ok(tools)
    }

    #[cfg(not(feature = "mcp-client"))]
    async fn mount_mcp_servers(&mut self, init: &Initialize) -> Result<Vec<Arc<dyn Tool>>, String> {
        match init.mcp_servers.is_empty() {
            true => Ok(Vec::new()),
            false => Err("this child was built without MCP servers (the crate's \"mcp-client\" feature)".to_owned()),
        }
    }

    fn build_agent(&self, init: &Initialize, mounted: Vec<Arc<dyn Tool>>) -> Result<Agent, String> {
        let mut profile = Profile::named(&init.profile)?;
        for patch in &init.patches {
            profile.patch(patch)?;
        }
        let spec = ModelSpec::from_route(init.route.provider.as_deref(), init.route.model.clone())
            .map_err(|e| e.to_string())?;
        let model =
            spec.build_limited(|limiter| self.draw_model_on_parent(init, limiter)).map_err(|e| e.to_string())?;
        if let Some(unknown) = profile.tools.iter().find(|n| !PROFILE_TOOLS.contains(&n.as_str())) {
            return Err(format!("unknown tool {unknown:?}"));
        }
        let delegates = profile.tools.iter().any(|n| n == "subagent");
        let kit = if delegates {
            let tasks = &self.tasks;
            #[cfg(feature = "config")]
            if let Some(configured) = &self.options.configured {
                let builtins: Vec<Arc<dyn Tool>> = vec![Arc::new(ReadFile), Arc::new(ListDir)];
                let kit = configured.tools(&self.subagents, tasks, &builtins);
                return self.finish_agent(init, profile, model, kit, mounted, delegates);
            }
            if !self.subagents.has_provider("spawn") {
                // Its children get the same kit as the CLI's and `acp`'s.
                register_delegating_spawn(&self.subagents, tasks, model.clone()).map_err(|e| e.to_string())?;
            }
            delegating_tools(&self.subagents, tasks, "spawn", MAX_DEPTH).map_err(|e| e.to_string())?
        } else {
            vec![Arc::new(ReadFile) as Arc<dyn Tool>, Arc::new(ListDir)]
        };
        self.finish_agent(init, profile, model, kit, mounted, delegates)
    }

    /// The agent of `profile` with the tools of `kit` it names, and `mounted`.
    fn finish_agent(
        &self,
        init: &Initialize,
        profile: Profile,
        model: Arc<dyn crate::agent::Model>,
        kit: Vec<Arc<dyn Tool>>,
        mounted: Vec<Arc<dyn Tool>>,
        delegates: bool,
    ) -> Result<Agent, String> {
        // The profile names the tools; the task tools (and a configuration's
        // further subagent tools) come with `subagent`.
        let mut tools = Toolset::new();
        for tool in kit {
            let name = tool.spec().name;
            let delegating = name.starts_with("task_") || name.starts_with("subagent");
            if profile.tools.contains(&name) || (delegates && delegating) {
                tools.add_shared(tool).map_err(|e| e.to_string())?;
            }
        }
        // The parent chose the MCP servers: the profile does not filter them.
        for tool in mounted {
            tools.add_shared(tool).map_err(|e| e.to_string())?;
        }
        #[cfg(feature = "mcp-client")]
        for server in &self.mcp_servers {
            tools.note_mcp_server(server);
        }
        let out = self.out.clone();
        let mut builder = Agent::builder_shared(model)
            .store(SessionStore::new(&self.options.home))
            .cwd(&init.cwd)
            .options(init.route.clone())
            .max_steps(profile.max_steps)
            .toolset(tools)
            .on_update(Arc::new(move |update: &AgentUpdate| {
                if let Some(streamed) = streamed(update) {
                    let _ = out.send(event(&streamed));
                }
            }));
        if let Some(persona) = profile.persona {
            builder = builder.persona(persona);
        }
        if let Some(budget) = init.budget {
            // What the parent had left: this agent is the root of it here.
            builder = builder.budget(budget.lease());
        }
        if let Some(parent) = &init.parent_session {
            // The lineage crosses the process; the depth cap counts from
            // here (the parent manages what is above).
            builder = builder.parent(Some(parent.clone()), 0);
        }
        builder.build().map_err(|e| e.to_string())
    }

    fn prompt(&mut self, id: &Value, params: Value) -> Option<Value> {
        let Some(agent) = self.agent.clone() else { return Some(error(id, -32600, "not initialized")) };
        if self.turn.as_ref().is_some_and(|turn| !turn.is_finished()) {
            return Some(error(id, -32600, "a turn is already running"));
        }
        let Ok(prompt) = serde_json::from_value::<Vec<ContentBlock>>(params["prompt"].clone()) else {
            return Some(error(id, -32602, "prompt must be content blocks"));
        };
        let (id, out) = (id.clone(), self.out.clone());
        let span = self.span.clone();
        self.turn_cancel = CancellationToken::new();
        let cancelled = self.turn_cancel.clone();
        self.turn = Some(tokio::task::spawn_local(
            async move {
                // The turn takes the agent's cancel token when it is made;
                // a cancel that came before that is applied to it now.
                let turn = agent.prompt(prompt);
                if cancelled.is_cancelled() {
                    agent.cancel();
                }
                let outcome = turn.await;
                if let Some(text) = last_assistant_text(&agent.events()) {
                    let _ = out.send(event(&ChildEvent::AssistantMessage { text }));
                }
                let reason = TurnEndReason::from(outcome.stop_reason);
                let _ = out.send(event(&ChildEvent::TurnEnd { reason }));
                // Why it failed, in the safe words a diagnostic carries.
                let failed =
                    outcome.error.as_ref().map(|error| json!({"category": error.category(), "reason": error.reason}));
                let _ = out.send(reply(&id, json!({"reason": reason, "usage": outcome.usage, "error": failed})));
            }
            .instrument(span),
        ));
        None
    }

    /// The parent can admit no more calls: what waits on its limiters goes
    /// on the child's own.
    fn close_limits(&self, why: &str) {
        if let Some(limits) = &self.limits {
            limits.close(why);
        }
    }

    /// The parent can answer no more: what waits on it is rejected, and
    /// the rejects reach their askers before the turn is cancelled.
    async fn close_approvals(&self, why: &str) {
        if let Some(approver) = &self.approver {
            approver.close(why, REJECT_BOUND).await;
        }
    }

    /// Cancels a running turn, waits for it, and closes the session.
    async fn end(&mut self) {
        if let Some(agent) = &self.agent {
            agent.cancel();
        }
        if let Some(turn) = self.turn.take() {
            let _ = turn.await;
        }
        if let Some(agent) = self.agent.take() {
            if let Err(error) = agent.shutdown().await {
                tracing::warn!(%error, "the served session was not saved");
            }
        }
        #[cfg(feature = "mcp-client")]
        futures_util::future::join_all(self.mcp_servers.drain(..).map(|server| async move { server.shutdown().await }))
            .await;
    }
}

/// The last non-empty assistant text of the latest turn.
fn last_assistant_text(events: &[SessionEvent]) -> Option<String> {
    let start = events.iter().rposition(|e| matches!(e, SessionEvent::User { .. })).unwrap_or(0);
    events[start..].iter().rev().find_map(|event| match event {
        SessionEvent::Assistant { text, .. } if !text.trim().is_empty() => Some(text.clone()),
        _ => None,
    })
}

/// A server as the child's session mounts it.
#[cfg(feature = "mcp-client")]
fn from_wire(wire: &crate::wire::process::WireMcpServer) -> Result<crate::agent::McpServerConfig, String> {
    use crate::agent::{McpServerConfig, McpTransport};
    use std::time::Duration;

    if !crate::agent::valid_server_name(&wire.name) {
        return Err(format!("MCP server name {:?} cannot be part of tool names", wire.name));
    }
    let transport = match (&wire.command, &wire.url) {
        (Some(command), None) => McpTransport::Stdio {
            command: command.clone(),
            args: wire.args.clone(),
            env: wire.env.clone(),
            inherit_env: Vec::new(),
            cwd: wire.cwd.clone(),
        },
        (None, Some(url)) => McpTransport::Http { url: url.clone(), headers: wire.headers.clone() },
        _ => return Err(format!("MCP server {:?} needs exactly one of a command and a url", wire.name)),
    };
    let mut config = McpServerConfig::over(wire.name.clone(), transport);
    config.initialize_timeout = Duration::from_millis(wire.initialize_timeout_ms.max(1));
    config.call_timeout = Duration::from_millis(wire.call_timeout_ms.max(1));
    config.max_result_bytes = wire.max_result_bytes.max(1);
    Ok(config)
}
