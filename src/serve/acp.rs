//! `subagents acp`: this crate's agent, served over the Agent Client
//! Protocol on stdio, so any ACP client (our own `acp` provider included)
//! can drive it.
//!
//! - `initialize` advertises the protocol version, text prompts, and
//!   `sessionCapabilities.systemPrompt` (append and override). It is
//!   answered once: a second one, after one succeeded, is refused
//!   (`-32600`, `data.reason` "already initialized"). A failed one may be
//!   retried. Requests may be written right behind it.
//! - `session/new` takes the cwd (absolute) and builds a session of a full
//!   runtime: the scripted demo model (or an HTTP model: `openai:NAME`, `openai-responses:NAME`, `anthropic:NAME`), `read_file`,
//!   `list_dir`, a subagent tool on an in-process `spawn` provider, the task
//!   tools; its children get the same kit (the CLI's children too), so they
//!   delegate further until the depth cap (3), where `subagent` is not
//!   offered. With [`AcpServeOptions::configured`] (`--config`) every
//!   provider of the file is registered instead and the subagent tools
//!   offer the ones it names. A system prompt replaces
//!   the persona section (override) or is appended to the prompt (append).
//!   The `mcpServers` the client sends (stdio, and streamable HTTP: the
//!   agent advertises `mcpCapabilities.http`) start with the session and
//!   their tools join its own, inherited by its children (see
//!   `acp/mcp_servers.rs`).
//! - `session/prompt` streams `agent_message_chunk`, `tool_call` and
//!   `tool_call_update` updates and answers with the stop reason
//!   (`end_turn`, `max_tokens`, `refusal`, `cancelled`). A failed turn is a
//!   JSON-RPC error `-32603` whose `data` is the safe diagnostic, e.g.
//!   `{"stage": "session-run", "category": "model", "reason": "the model
//!   endpoint answered 404"}` (fixed wording: never the prompt, a payload,
//!   a path or an environment value); it is also logged on stderr.
//! - `session/cancel` cancels the running turn (it then answers `cancelled`).
//! - `session/close` cancels the session's turns and gives back all it held
//!   (agent, MCP servers); at most [`AcpServeOptions::max_sessions`] are
//!   held at once, the least recently used idle one given back first (see
//!   `acp/sessions.rs`).
//! - Tools named with `--approve` ask `session/request_permission` first;
//!   only an option we offered whose kind is allow runs the tool, and
//!   `allow_always` holds for that tool for the rest of the session; any
//!   other answer becomes a tool error the model sees. `toolCallId`s are
//!   unique within a session (see `agent/tool_calls.rs`).
//! - A descendant's permission request (an `acp` child with `permission =
//!   "ask"`, however deep) is asked of the client as
//!   `session/request_permission`, after a `tool_call` naming who asks
//!   and what; the child's own options are offered, and its answer goes
//!   back to exactly that child (see `acp/approvals.rs`).
//!
//! **Input** is capped at 8 MiB a line; an over-long line, invalid UTF-8
//! or invalid JSON costs one `-32700` reply with id `null` quoting at most
//! a short excerpt, and the agent keeps serving. **EOF** on stdin cancels
//! every turn (running and queued prompts answer `cancelled`), waits up to
//! 30 s until every request has had its one answer, then exits 0. Answers
//! may come in any order. The table of every error we answer ourselves is
//! in `agent/framing.rs`.
//!
//! **What the `agent-client-protocol` crate decides** (we relay it): a
//! request before `initialize` is answered `-32600` ("ACP initialization
//! must complete before …"); an unknown method `-32601`; params of the
//! wrong shape inside the object `-32602`, whose `data` is the crate's own
//! (it quotes the params back, so at most one line's worth); a JSON batch
//! `-32600`. A notification it cannot handle is dropped, as JSON-RPC
//! requires.
//!
//! ```no_run
//! use subagents::serve::{serve_acp, AcpServeOptions};
//!
//! // What `subagents acp --home .subagents --approve list_dir` runs.
//! let options = AcpServeOptions {
//!     home: ".subagents".into(),
//!     model: "scripted".into(),
//!     approve: vec!["list_dir".into()],
//!     ..Default::default()
//! };
//! serve_acp(options).expect("served until EOF");
//! ```

mod approvals;
mod framing;
mod mcp_servers;
mod sessions;
mod tool_calls;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, CancelNotification, CloseSessionRequest, CloseSessionResponse, ContentBlock as AcpBlock,
    Implementation, InitializeRequest, InitializeResponse, McpCapabilities, NewSessionRequest, NewSessionResponse,
    PromptCapabilities, PromptRequest, PromptResponse, SessionCapabilities, SessionCloseCapabilities, SessionId,
    SessionNotification, SessionSystemPromptCapabilities, SessionSystemPromptModeCapabilities,
    SessionSystemPromptOverrideCapabilities, SystemPromptMode,
};
use agent_client_protocol::{v1, Client, Error};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use self::approvals::ClientApprover;
use self::sessions::Sessions;
pub use self::sessions::DEFAULT_MAX_SESSIONS;
use self::tool_calls::{Approved, ToolCallIds};
use super::ServeError;
use crate::agent::{Agent, AgentUpdate, Model, ModelSpec, SessionStore, Tool, Toolset, TurnOutcome};
use crate::seam::{Approvals, TraceContext};
use crate::seam::{Category, ContentBlock, Diagnostic, Stage};
use crate::telemetry;
use crate::tool::{delegating_tools, register_delegating_spawn, TaskService, DEFAULT_MAX_DEPTH};
use crate::wire::acp::acp_stop_of;
use crate::{Runtime, Subagents};

/// How `subagents acp` serves.
#[derive(Clone, Debug)]
pub struct AcpServeOptions {
    /// Where sessions are kept.
    pub home: PathBuf,
    /// `scripted`, `openai:NAME`, `openai-responses:NAME` or `anthropic:NAME`.
    pub model: String,
    /// Tools that ask the client for permission before each call.
    pub approve: Vec<String>,
    /// The most sessions held at once (default [`DEFAULT_MAX_SESSIONS`]):
    /// past it a new session takes the place of the least recently used
    /// one that runs no turn.
    pub max_sessions: usize,
    /// Providers from a configuration file: every one registered, the
    /// sessions' subagent tools on the ones it offers. `None`: a `spawn`
    /// provider of the sessions' model.
    #[cfg(feature = "config")]
    pub configured: Option<crate::config::Configured>,
}

impl Default for AcpServeOptions {
    fn default() -> Self {
        AcpServeOptions {
            home: PathBuf::from(".subagents"),
            model: "scripted".to_owned(),
            approve: Vec::new(),
            max_sessions: DEFAULT_MAX_SESSIONS,
            #[cfg(feature = "config")]
            configured: None,
        }
    }
}

/// Serves ACP on this process's stdin and stdout until EOF.
pub fn serve_acp(options: AcpServeOptions) -> Result<(), ServeError> {
    let model = ModelSpec::parse(&options.model).and_then(|spec| spec.build())?;
    let runtime = Runtime::builder().home(&options.home).workers(1).build().map_err(ServeError::Runtime)?;
    let subagents = runtime.subagents();
    let tasks = TaskService::new();
    if let Err(error) = register(&subagents, &tasks, &options, model.clone()) {
        runtime.shutdown_blocking();
        return Err(error);
    }
    let sessions = Mutex::new(Sessions::new(options.max_sessions));
    let state = Arc::new(State { subagents, model, options, sessions, tasks, closing: CancellationToken::new() });
    let served = runtime.block_on(serve(state.clone()));
    // Close every session (cancel its turns and tasks) before the runtime goes.
    let closed = state.sessions().drain();
    runtime.block_on(async move {
        for session in closed {
            session.shut_down().await;
        }
    });
    runtime.shutdown_blocking();
    served.map_err(|e| ServeError::Connection(e.to_string()))
}

/// The sessions' providers: the file's, or a `spawn` provider whose
/// children get the same kit as the sessions' own agents (and as the CLI's
/// children), so they delegate further, to the depth cap.
fn register(
    subagents: &Subagents,
    tasks: &TaskService,
    options: &AcpServeOptions,
    model: Arc<dyn Model>,
) -> Result<(), ServeError> {
    #[cfg(feature = "config")]
    if let Some(configured) = &options.configured {
        return configured
            .register_blocking(subagents, tasks, &options.home, model)
            .map_err(|e| ServeError::Options(e.to_string()));
    }
    let _ = options;
    register_delegating_spawn(subagents, tasks, model)?;
    Ok(())
}

#[cfg(feature = "mcp-client")]
type MountedServer = crate::agent::McpServer;
#[cfg(not(feature = "mcp-client"))]
type MountedServer = ();

struct State {
    subagents: Subagents,
    model: Arc<dyn Model>,
    options: AcpServeOptions,
    /// Each live session: its agent, its MCP servers, its latest prompt's
    /// token (see `acp/sessions.rs`).
    sessions: Mutex<Sessions>,
    tasks: TaskService,
    /// Cancelled at stdin EOF: every session's turns end, now and later.
    closing: CancellationToken,
}

impl State {
    /// A session's tools: the file tools, its subagent tools, the task tools.
    fn kit(&self) -> Result<Vec<Arc<dyn Tool>>, String> {
        #[cfg(feature = "config")]
        if let Some(configured) = &self.options.configured {
            let builtins: Vec<Arc<dyn Tool>> = vec![Arc::new(crate::agent::ReadFile), Arc::new(crate::agent::ListDir)];
            return Ok(configured.tools(&self.subagents, &self.tasks, &builtins));
        }
        delegating_tools(&self.subagents, &self.tasks, "spawn", DEFAULT_MAX_DEPTH).map_err(|e| e.to_string())
    }

    fn sessions(&self) -> MutexGuard<'_, Sessions> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Ends a turn's hold on its session when the turn's task ends, however it
/// ends: its cancel token is given back.
struct TurnHeld {
    state: Arc<State>,
    session: SessionId,
    number: u64,
}

impl Drop for TurnHeld {
    fn drop(&mut self) {
        self.state.sessions().end_turn(&self.session, self.number);
    }
}

async fn serve(state: Arc<State>) -> agent_client_protocol::Result<()> {
    let (transport, input) = framing::stdio(state.closing.clone());
    let input = tokio::spawn(input);
    let (for_new, for_prompt, for_cancel, for_close) = (state.clone(), state.clone(), state.clone(), state.clone());
    let served = agent_client_protocol::Agent
        .v1()
        .name("subagents")
        .on_receive_request(
            async move |_request: InitializeRequest,
                        responder: v1::Responder<InitializeResponse>,
                        _cx: v1::ConnectionTo<Client>| {
                let system_prompt = SessionSystemPromptCapabilities::new().mode(
                    SessionSystemPromptModeCapabilities::new()
                        .override_(SessionSystemPromptOverrideCapabilities::new()),
                );
                let capabilities = AgentCapabilities::new()
                    .load_session(false)
                    .mcp_capabilities(McpCapabilities::new().http(cfg!(feature = "mcp-client")))
                    .prompt_capabilities(PromptCapabilities::new().image(false).audio(false).embedded_context(false))
                    .session_capabilities(
                        SessionCapabilities::new().system_prompt(system_prompt).close(SessionCloseCapabilities::new()),
                    );
                responder.respond(
                    InitializeResponse::new(ProtocolVersion::V1)
                        .agent_capabilities(capabilities)
                        .agent_info(Implementation::new("subagents", env!("CARGO_PKG_VERSION"))),
                )
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: NewSessionRequest,
                        responder: v1::Responder<NewSessionResponse>,
                        cx: v1::ConnectionTo<Client>| {
                // Its MCP servers may take seconds to start: beside the loop.
                let state = for_new.clone();
                cx.clone().spawn(async move {
                    match state.new_session(&request, cx).await {
                        Ok(id) => responder.respond(NewSessionResponse::new(id)),
                        Err(message) => {
                            responder.respond_with_error(Error::invalid_params().data(Value::String(message)))
                        }
                    }
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: PromptRequest,
                        responder: v1::Responder<PromptResponse>,
                        cx: v1::ConnectionTo<Client>| {
                let Some(turn) = for_prompt.sessions().begin_turn(&request.session_id) else {
                    return responder.respond_with_error(Error::invalid_params().data(Value::from("unknown session")));
                };
                let sessions::Turn { number, agent, cancelled } = turn;
                let held = TurnHeld { state: for_prompt.clone(), session: request.session_id.clone(), number };
                // The turn runs beside the dispatch loop, so session/cancel
                // and permission answers get through while it works.
                // The client's trace, when its `_meta` carries one.
                let trace = request.meta.as_ref().and_then(TraceContext::from_meta);
                let span = telemetry::served("acp", agent.id(), None, trace.as_ref());
                cx.spawn(
                    async move {
                        let _held = held;
                        // The turn takes the agent's cancel token when it is
                        // made; a cancel handled before that applies now.
                        let turn = agent.prompt(prompt_blocks(&request.prompt));
                        if cancelled.is_cancelled() {
                            agent.cancel();
                        }
                        let outcome = turn.await;
                        responder.respond_with_result(prompt_reply(agent.id(), outcome))
                    }
                    .instrument(span),
                )
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |notification: CancelNotification, _cx: v1::ConnectionTo<Client>| {
                for_cancel.sessions().cancel(&notification.session_id);
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: CloseSessionRequest,
                        responder: v1::Responder<CloseSessionResponse>,
                        cx: v1::ConnectionTo<Client>| {
                let Some(closed) = for_close.sessions().close(&request.session_id) else {
                    return responder.respond_with_error(Error::invalid_params().data(Value::from("unknown session")));
                };
                // Answered once its turns have ended and its servers closed.
                cx.spawn(async move {
                    closed.shut_down().await;
                    responder.respond(CloseSessionResponse::new())
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_to(transport)
        .await;
    // The input task has drained and ended unless the connection failed.
    state.closing.cancel();
    input.abort();
    served
}

/// The answer to a prompt: its stop reason, or for a failed turn an error
/// carrying the safe diagnostic (logged too).
fn prompt_reply(session: &str, outcome: TurnOutcome) -> Result<PromptResponse, Error> {
    if let Some(stop) = acp_stop_of(outcome.stop_reason) {
        return Ok(PromptResponse::new(stop));
    }
    let (category, reason) = match &outcome.error {
        Some(error) => (error.category(), error.reason.clone()),
        None => (Category::ChildError, "the turn failed".to_owned()),
    };
    let diagnostic = Diagnostic::new("acp", Stage::SessionRun, category).with_reason(reason);
    let reason = diagnostic.reason.unwrap_or_default();
    tracing::warn!(session, stage = "session-run", category = ?diagnostic.category, reason, "a turn failed");
    let data = json!({ "stage": diagnostic.stage, "category": diagnostic.category, "reason": reason });
    Err(Error::internal_error().data(data))
}

fn prompt_blocks(blocks: &[AcpBlock]) -> Vec<ContentBlock> {
    vec![ContentBlock::text(acp_text(blocks))]
}

/// The text of `blocks`, concatenated; other kinds of block are dropped.
fn acp_text(blocks: &[AcpBlock]) -> String {
    blocks
        .iter()
        .filter_map(|block| match block {
            AcpBlock::Text(text) => Some(text.text.as_str()),
            _ => None,
        })
        .collect()
}

impl State {
    async fn new_session(
        &self,
        request: &NewSessionRequest,
        cx: v1::ConnectionTo<Client>,
    ) -> Result<SessionId, String> {
        if !request.cwd.is_absolute() {
            return Err("cwd must be absolute".to_owned());
        }
        let session_id = SessionId::new(crate::agent::ids::session_id());
        let ids = Arc::new(ToolCallIds::default());
        let mut tools = Toolset::new();
        let approve = |tool: Arc<dyn Tool>| -> Arc<dyn Tool> {
            if self.options.approve.iter().any(|name| *name == tool.spec().name) {
                Arc::new(Approved::new(tool, cx.clone(), session_id.clone(), ids.clone()))
            } else {
                tool
            }
        };
        for tool in self.kit()? {
            tools.add_shared(approve(tool)).map_err(|e| e.to_string())?;
        }
        let (servers, mounted) = mcp_servers::mount(&request.mcp_servers, &request.cwd).await?;
        let (update_cx, update_ids) = (cx.clone(), ids.clone());
        let built = (|| {
            for tool in mounted {
                tools.add_shared(approve(tool)).map_err(|e| e.to_string())?;
            }
            #[cfg(feature = "mcp-client")]
            for server in &servers {
                tools.note_mcp_server(server);
            }
            let update_session = session_id.clone();
            // What its descendants ask climbs to this session's client.
            let approvals = Approvals::new(Arc::new(ClientApprover::new(cx.clone(), session_id.clone())));
            let mut builder = Agent::builder_shared(self.model.clone())
                .approvals(approvals)
                .store(SessionStore::new(&self.options.home))
                .session_id(session_id.to_string())
                .cwd(&request.cwd)
                .toolset(tools)
                .cancel_token(self.closing.child_token())
                .on_update(Arc::new(move |update: &AgentUpdate| {
                    for update in update_ids.session_updates(update) {
                        let _ = update_cx.send_notification(SessionNotification::new(update_session.clone(), update));
                    }
                }));
            if let Some(system_prompt) = &request.system_prompt {
                let text = acp_text(&system_prompt.content);
                builder = match system_prompt.mode {
                    SystemPromptMode::Override => builder.persona(text),
                    SystemPromptMode::Append => builder.prompt_section("client", text),
                    _ => return Err("unsupported system prompt mode".to_owned()),
                };
            }
            builder.build().map_err(|e| e.to_string())
        })();
        let agent = match built {
            Ok(agent) => agent,
            Err(error) => {
                // The servers this session started are not left running.
                sessions::shut_down_servers(servers).await;
                return Err(error);
            }
        };
        let held = self.sessions().insert(session_id.clone(), agent, servers);
        match held {
            Ok(evicted) => {
                if let Some(evicted) = evicted {
                    evicted.shut_down().await;
                }
                Ok(session_id)
            }
            Err((full, refused)) => {
                refused.shut_down().await;
                Err(full.to_string())
            }
        }
    }
}
