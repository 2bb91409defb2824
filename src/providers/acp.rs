//! `acp`: an Agent Client Protocol client driving a configured child
//! command over stdio (newline-delimited JSON-RPC).
//!
//! **Choose it** for an isolated child in another process that speaks ACP
//! — another agent product, or this crate's own `subagents acp`.
//!
//! **Advertises** what the handshake allows: [`AcpProvider::new`] runs one
//! `initialize` against the command and advertises `persona` when the agent
//! offers `sessionCapabilities.systemPrompt` (the persona is then sent as
//! the session's system prompt, overriding when the agent allows it).
//! Everything else is advertised off and rejected at `start`.
//!
//! **Start**: the cwd (configured, else the parent's) must be an absolute,
//! enterable directory, checked before spawning; the child is spawned with
//! an allowlisted environment plus `inherit_env` and `env` (see [the child environment](super#child-environment))
//! in its own process group; `initialize`, then `session/new {cwd,
//! mcpServers: []}`. Any failure kills and reaps the child before `start`
//! rejects.
//!
//! **Run**: the prompt goes out as `session/prompt`; `agent_message_chunk`
//! text is the output; tool calls, their updates and plans become
//! `Progress` events. Stop map: `end_turn` → completed, `max_tokens` →
//! max-tokens, `refusal` → refusal, `cancelled` → aborted, anything else (or
//! an error answer) → error. Permission requests are answered by policy:
//! `reject` (default) picks a reject option, `allow` an `allow_once` or
//! `allow_always` option — always by kind, never by position.
//!
//! **Cancel** sends `session/cancel`; the run settles `Aborted` even if the
//! child ignores it (after the runtime's cancel grace). **Dispose** closes
//! the connection (stdin EOF), waits `dispose_eof_grace`, SIGTERMs the
//! group, waits `dispose_grace`, SIGKILLs, and fails loudly if any process
//! of the group survives. Child output lines are capped, so a child that
//! floods stdout cannot grow memory without bound. Diagnostics carry only
//! stage and category, never stderr (discarded) or payloads.
//!
//! **Receipts** list the agent process reaped by dispose (its pid) and an
//! unknown branch for whatever the agent itself started: ACP does not tell
//! a client about an agent's own subagents.

use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    CancelNotification, ContentBlock as AcpBlock, ContentChunk, Implementation, InitializeRequest, InitializeResponse,
    NewSessionRequest, PermissionOptionKind, PromptRequest, RequestPermissionOutcome, RequestPermissionRequest,
    RequestPermissionResponse, SelectedPermissionOutcome, SessionId, SessionNotification, SessionUpdate,
    StopReason as AcpStop, SystemPrompt, SystemPromptMode,
};
use agent_client_protocol::{v1, ByteStreams, Client};
use futures_util::future::LocalBoxFuture;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::oneshot;
use tokio_util::codec::AnyDelimiterCodecError;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};
use tokio_util::sync::CancellationToken;

use super::child_process::{lines, spawn, ChildEnv, Spawned, MAX_OUTPUT};
use crate::events::ProgressUpdate;
use crate::live::LiveCounters;
use crate::seam::{
    text_of, Branch, Capabilities, Category, Child, ContentBlock, Diagnostic, Failure, Launch, LaunchError, Provider,
    ProviderContext, RunResult, Stage, StopReason, StopReport,
};

/// Our stop reasons and ACP's, for both ends: this client and the agent in
/// [`agent`]. `Error` has none: a failed turn is an error answer, and an
/// ACP reason not listed (`max_turn_requests`, …) is an error to us.
const STOP_REASONS: [(StopReason, AcpStop); 4] = [
    (StopReason::Completed, AcpStop::EndTurn),
    (StopReason::MaxTokens, AcpStop::MaxTokens),
    (StopReason::Refusal, AcpStop::Refusal),
    (StopReason::Aborted, AcpStop::Cancelled),
];

fn stop_reason_of(acp: AcpStop) -> StopReason {
    STOP_REASONS.iter().find(|(_, theirs)| *theirs == acp).map_or(StopReason::Error, |(ours, _)| *ours)
}

pub(crate) fn acp_stop_of(stop: StopReason) -> Option<AcpStop> {
    STOP_REASONS.iter().find(|(ours, _)| *ours == stop).map(|(_, theirs)| *theirs)
}

/// How long `initialize` + `session/new` may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// How permission requests are answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Permission {
    /// Pick a reject option (or cancel when there is none).
    #[default]
    Reject,
    /// Pick an `allow_once` or `allow_always` option.
    Allow,
}

/// Configuration of an [`AcpProvider`].
#[derive(Clone, Debug)]
pub struct AcpConfig {
    /// Registry name.
    pub name: String,
    /// The agent command.
    pub command: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Working directory; default the parent's.
    pub cwd: Option<PathBuf>,
    /// Permission policy.
    pub permission: Permission,
    /// Variables set in the child as given (the only way to hand it a key).
    pub env: Vec<(String, String)>,
    /// Parent variables the child inherits beyond the allowlist: `NAME` or
    /// `PREFIX*`; credential-shaped names are never passed (see
    /// [the child environment](super#child-environment)).
    pub inherit_env: Vec<String>,
    /// Grace after stdin EOF (6 s).
    pub dispose_eof_grace: Duration,
    /// Grace after SIGTERM (3 s).
    pub dispose_grace: Duration,
}

impl AcpConfig {
    /// Defaults for `name` running `command args…`.
    pub fn new(name: impl Into<String>, command: impl Into<PathBuf>, args: Vec<String>) -> Self {
        AcpConfig {
            name: name.into(),
            command: command.into(),
            args,
            cwd: None,
            permission: Permission::Reject,
            env: Vec::new(),
            inherit_env: Vec::new(),
            dispose_eof_grace: Duration::from_secs(6),
            dispose_grace: Duration::from_secs(3),
        }
    }

    /// The child's environment: the allowlist, `inherit_env`, then `env`.
    pub(crate) fn child_env(&self) -> ChildEnv<'_> {
        ChildEnv { inherit: &self.inherit_env, explicit: &self.env }
    }
}

/// What the agent said it can do.
#[derive(Clone, Copy, Debug, Default)]
struct AgentFeatures {
    system_prompt: bool,
    override_prompt: bool,
}

/// The `acp` provider.
#[derive(Debug)]
pub struct AcpProvider {
    config: AcpConfig,
    features: AgentFeatures,
}

/// Why an ACP agent could not be probed.
#[derive(Debug, thiserror::Error)]
#[error("acp provider {name:?}: {reason}")]
pub struct ProbeError {
    name: String,
    reason: String,
}

impl AcpProvider {
    /// Runs one `initialize` against the command to learn what it
    /// supports (the probe child is reaped before this returns). Needs a
    /// tokio runtime.
    pub async fn new(config: AcpConfig) -> Result<AcpProvider, ProbeError> {
        let failed = |reason: String| ProbeError { name: config.name.clone(), reason };
        let cwd = config.cwd.clone().or_else(|| std::env::current_dir().ok()).ok_or_else(|| failed("no cwd".into()))?;
        let lease = crate::live::ProcessLease::new(Arc::new(LiveCounters::default()));
        let mut spawned = spawn(&config.command, &config.args, &cwd, config.child_env(), lease)
            .map_err(|e| failed(format!("spawn: {e}")))?;
        let transport = transport(&mut spawned, Arc::default());
        let probe = Client
            .v1()
            .name("subagents")
            .connect_with(transport, async |cx: v1::ConnectionTo<agent_client_protocol::Agent>| {
                cx.send_request(initialize()).block_task().await
            });
        let answered = tokio::time::timeout(HANDSHAKE_TIMEOUT, probe).await;
        spawned.kill().await;
        let response = match answered {
            Ok(Ok(response)) => response,
            Ok(Err(error)) => return Err(failed(format!("initialize failed: {}", error.message))),
            Err(_) => return Err(failed("initialize timed out".into())),
        };
        Ok(AcpProvider { features: features(&response), config })
    }
}

fn initialize() -> InitializeRequest {
    InitializeRequest::new(ProtocolVersion::V1).client_info(Implementation::new("subagents", env!("CARGO_PKG_VERSION")))
}

fn features(response: &InitializeResponse) -> AgentFeatures {
    let system_prompt = response.agent_capabilities.session_capabilities.system_prompt.as_ref();
    AgentFeatures {
        system_prompt: system_prompt.is_some(),
        override_prompt: system_prompt.and_then(|s| s.mode.as_ref()).is_some_and(|m| m.override_.is_some()),
    }
}

/// Child stdout goes through a bounded line reader into the crate: an
/// endless line costs at most [`MAX_LINE`](super::child_process::MAX_LINE),
/// and a line that is not JSON ends the connection (the crate would answer
/// it and wait on, so a babbling child would hang the run). `broken` is
/// set when either happens.
fn transport(
    spawned: &mut Spawned,
    broken: Arc<AtomicBool>,
) -> ByteStreams<impl futures_util::AsyncWrite, impl futures_util::AsyncRead> {
    let stdin = spawned.stdin.take().expect("piped");
    let stdout = spawned.stdout.take().expect("piped");
    let (mut into_crate, from_pump) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let mut lines = lines(stdout);
        loop {
            match lines.next().await {
                Some(Ok(line)) => {
                    let blank = line.iter().all(u8::is_ascii_whitespace);
                    if !blank && serde_json::from_slice::<serde::de::IgnoredAny>(&line).is_err() {
                        tracing::warn!("an ACP child wrote a line that is not JSON");
                        broken.store(true, Ordering::Release);
                        break;
                    }
                    let mut line = Vec::from(line);
                    line.push(b'\n');
                    if into_crate.write_all(&line).await.is_err() {
                        break;
                    }
                }
                None | Some(Err(AnyDelimiterCodecError::Io(_))) => break,
                Some(Err(AnyDelimiterCodecError::MaxChunkLengthExceeded)) => {
                    tracing::warn!("an ACP child wrote a line longer than allowed");
                    broken.store(true, Ordering::Release);
                    break;
                }
            }
        }
        // Dropping the pipe is EOF for the connection.
    });
    ByteStreams::new(stdin.compat_write(), from_pump.compat())
}

impl Provider for AcpProvider {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { persona: self.features.system_prompt, ..Capabilities::none() }
    }

    fn launch(&self, launch: Launch) -> LocalBoxFuture<'static, Result<Box<dyn Child>, LaunchError>> {
        let (config, features) = (self.config.clone(), self.features);
        Box::pin(async move { start(config, features, launch).await })
    }
}

type Connection = v1::ConnectionTo<agent_client_protocol::Agent>;

/// What the connection task hands the child once the session exists.
struct Session {
    cx: Connection,
    session_id: SessionId,
}

async fn start(config: AcpConfig, features: AgentFeatures, launch: Launch) -> Result<Box<dyn Child>, LaunchError> {
    let Launch { request, cancel, context } = launch;
    if cancel.is_cancelled() {
        return Err(LaunchError::Aborted);
    }
    let cwd = config.cwd.clone().unwrap_or_else(|| request.parent.cwd.clone());
    if !cwd.is_absolute() || std::fs::read_dir(&cwd).is_err() {
        return Err(LaunchError::Invalid {
            field: "cwd",
            reason: "must be an absolute path to an enterable directory".to_owned(),
        });
    }
    if request.prompt.iter().any(|block| block.as_text().is_none()) {
        return Err(LaunchError::Invalid { field: "prompt", reason: "the acp provider sends text only".to_owned() });
    }
    let mut spawned =
        spawn(&config.command, &config.args, &cwd, config.child_env(), context.track_process()).map_err(|error| {
            tracing::warn!(provider = %config.name, %error, "could not spawn an ACP child");
            LaunchError::Failed { stage: Stage::Initialize, category: Category::StartupFailed }
        })?;
    let text = Arc::new(Mutex::new(String::new()));
    let (ready, session) = oneshot::channel::<Result<Session, Category>>();
    let (close, closed) = oneshot::channel::<()>();
    let system_prompt = request.persona.clone().filter(|_| features.system_prompt).map(|persona| {
        let mode = if features.override_prompt { SystemPromptMode::Override } else { SystemPromptMode::Append };
        SystemPrompt::new(vec![AcpBlock::from(persona)]).mode(mode)
    });
    let broken = Arc::new(AtomicBool::new(false));
    let connection =
        connection(&mut spawned, &config, &context, text.clone(), cwd, system_prompt, ready, closed, broken.clone());
    let task = tokio::spawn(connection);
    let outcome = tokio::select! {
        biased;
        _ = cancel.cancelled() => Err(None),
        outcome = tokio::time::timeout(HANDSHAKE_TIMEOUT, session) => match outcome {
            Ok(Ok(Ok(session))) => Ok(session),
            Ok(Ok(Err(category))) => Err(Some(category)),
            Ok(Err(_)) => Err(Some(Category::ChildCrashed)),
            Err(_) => Err(Some(Category::TimedOut)),
        },
    };
    let session = match outcome {
        Ok(session) => session,
        Err(category) => {
            // Reap before rejecting: nothing outlives a failed start.
            task.abort();
            spawned.kill().await;
            return Err(category
                .map_or(LaunchError::Aborted, |c| LaunchError::Failed { stage: Stage::Initialize, category: c }));
        }
    };
    Ok(Box::new(AcpChild {
        id: format!("acp:{}:{}", config.name, session.session_id),
        provider: config.name.clone(),
        prompt: RefCell::new(Some(text_of(&request.prompt))),
        session,
        text,
        broken,
        close: RefCell::new(Some(close)),
        task: RefCell::new(Some(task)),
        spawned: Arc::new(tokio::sync::Mutex::new(Some(spawned))),
        grace: (config.dispose_eof_grace, config.dispose_grace),
        cancel,
        reaped: Rc::new(Cell::new(None)),
    }))
}

/// The connection task: handshake, then serve the child's notifications
/// and permission requests until `closed` fires.
#[allow(clippy::too_many_arguments)]
fn connection(
    spawned: &mut Spawned,
    config: &AcpConfig,
    context: &ProviderContext,
    text: Arc<Mutex<String>>,
    cwd: PathBuf,
    system_prompt: Option<SystemPrompt>,
    ready: oneshot::Sender<Result<Session, Category>>,
    closed: oneshot::Receiver<()>,
    broken: Arc<AtomicBool>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let transport = transport(spawned, broken);
    let permission = config.permission;
    let progress = context.clone();
    async move {
        let ran = Client
            .v1()
            .name("subagents")
            .on_receive_notification(
                async move |notification: SessionNotification, _cx: Connection| {
                    note_update(&text, &progress, notification.update);
                    Ok(())
                },
                agent_client_protocol::on_receive_notification!(),
            )
            .on_receive_request(
                async move |request: RequestPermissionRequest,
                            responder: v1::Responder<RequestPermissionResponse>,
                            _cx: Connection| {
                    responder.respond(RequestPermissionResponse::new(choose(permission, &request)))
                },
                agent_client_protocol::on_receive_request!(),
            )
            .connect_with(transport, async |cx: Connection| {
                let handshake = async {
                    cx.send_request(initialize()).block_task().await?;
                    let mut new_session = NewSessionRequest::new(cwd).mcp_servers(vec![]);
                    if let Some(system_prompt) = system_prompt {
                        new_session = new_session.system_prompt(system_prompt);
                    }
                    cx.send_request(new_session).block_task().await
                };
                match handshake.await {
                    Ok(session) => {
                        let _ = ready.send(Ok(Session { cx: cx.clone(), session_id: session.session_id }));
                    }
                    Err(error) => {
                        let category = if agent_client_protocol::is_incoming_transport_closed(&error) {
                            Category::ChildCrashed
                        } else {
                            Category::ChildError
                        };
                        let _ = ready.send(Err(category));
                        return Ok(());
                    }
                }
                // Serve until the child is disposed (or the peer goes away).
                tokio::select! {
                    _ = closed => {}
                    _ = cx.incoming_closed() => {}
                }
                Ok(())
            })
            .await;
        if let Err(error) = ran {
            tracing::debug!(code = error.code.value(), "an ACP connection ended with an error");
        }
    }
}

fn note_update(text: &Mutex<String>, progress: &ProviderContext, update: SessionUpdate) {
    let update = match update {
        SessionUpdate::AgentMessageChunk(ContentChunk { content: AcpBlock::Text(chunk), .. }) => {
            let mut kept = text.lock().unwrap_or_else(|e| e.into_inner());
            // Text past the cap is dropped: memory stays bounded.
            if kept.len() + chunk.text.len() <= MAX_OUTPUT {
                kept.push_str(&chunk.text);
            }
            drop(kept);
            ProgressUpdate::MessageChunk { text: chunk.text }
        }
        SessionUpdate::ToolCall(call) => {
            ProgressUpdate::ToolCall { name: call.title, status: format!("{:?}", call.status).to_lowercase() }
        }
        SessionUpdate::ToolCallUpdate(update) => ProgressUpdate::ToolCall {
            name: update.fields.title.unwrap_or_else(|| update.tool_call_id.to_string()),
            status: update.fields.status.map_or("updated".to_owned(), |s| format!("{s:?}").to_lowercase()),
        },
        SessionUpdate::Plan(plan) => {
            ProgressUpdate::Plan { entries: plan.entries.into_iter().map(|entry| entry.content).collect() }
        }
        _ => return,
    };
    progress.progress(update);
}

/// Picks an option by kind, never by position.
fn choose(permission: Permission, request: &RequestPermissionRequest) -> RequestPermissionOutcome {
    let kinds: &[PermissionOptionKind] = match permission {
        Permission::Allow => &[PermissionOptionKind::AllowOnce, PermissionOptionKind::AllowAlways],
        Permission::Reject => &[PermissionOptionKind::RejectOnce, PermissionOptionKind::RejectAlways],
    };
    let chosen = kinds.iter().find_map(|kind| request.options.iter().find(|option| option.kind == *kind));
    match chosen {
        Some(option) => RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(option.option_id.clone())),
        None => RequestPermissionOutcome::Cancelled,
    }
}

struct AcpChild {
    id: String,
    provider: String,
    prompt: RefCell<Option<String>>,
    session: Session,
    text: Arc<Mutex<String>>,
    /// Set when the child broke the protocol.
    broken: Arc<AtomicBool>,
    close: RefCell<Option<oneshot::Sender<()>>>,
    task: RefCell<Option<tokio::task::JoinHandle<()>>>,
    spawned: Arc<tokio::sync::Mutex<Option<Spawned>>>,
    grace: (Duration, Duration),
    cancel: CancellationToken,
    /// The agent's pid, once dispose reaped it.
    reaped: Rc<Cell<Option<u32>>>,
}

/// Why an ACP run's own runs are an unknown branch of its receipt.
const AGENT_RUNS_UNKNOWN: &str = "an ACP agent does not report the runs it started";

impl Child for AcpChild {
    fn id(&self) -> String {
        self.id.clone()
    }

    fn run(&self) -> LocalBoxFuture<'static, RunResult> {
        let prompt = self.prompt.borrow_mut().take().unwrap_or_default();
        let request = PromptRequest::new(self.session.session_id.clone(), vec![AcpBlock::from(prompt)]);
        let sent = self.session.cx.send_request(request);
        let (text, provider, cancel) = (self.text.clone(), self.provider.clone(), self.cancel.clone());
        let broken = self.broken.clone();
        Box::pin(async move {
            let answered = sent.block_task().await;
            let stop_reason =
                answered.as_ref().map_or(StopReason::Error, |response| stop_reason_of(response.stop_reason));
            let diagnostic = (stop_reason == StopReason::Error && !cancel.is_cancelled()).then(|| {
                let category = match &answered {
                    _ if broken.load(Ordering::Acquire) => Category::Protocol,
                    Err(error) if agent_client_protocol::is_incoming_transport_closed(error) => Category::ChildCrashed,
                    Err(error) if agent_client_protocol::is_connection_terminated(error) => Category::ChildCrashed,
                    _ => Category::ChildError,
                };
                Diagnostic::new(&provider, Stage::SessionRun, category)
            });
            let output = std::mem::take(&mut *text.lock().unwrap_or_else(|e| e.into_inner()));
            RunResult {
                output: if output.is_empty() { Vec::new() } else { vec![ContentBlock::text(output)] },
                structured: None,
                stop_reason,
                diagnostic,
                child_session: None,
            }
        })
    }

    fn cancel(&self) {
        let _ = self.session.cx.send_notification(CancelNotification::new(self.session.session_id.clone()));
    }

    fn dispose(&self) -> LocalBoxFuture<'static, Result<(), Failure>> {
        if let Some(close) = self.close.borrow_mut().take() {
            let _ = close.send(());
        }
        let task = self.task.borrow_mut().take();
        let (spawned, reaped) = (self.spawned.clone(), self.reaped.clone());
        let (eof_grace, grace) = self.grace;
        Box::pin(async move {
            // The connection closes its writer on the way out: stdin EOF.
            if let Some(mut task) = task {
                if tokio::time::timeout(Duration::from_secs(1), &mut task).await.is_err() {
                    task.abort(); // dropping the connection closes the child's stdin
                }
            }
            let spawned = spawned.lock().await.take();
            match spawned {
                Some(spawned) => {
                    let pid = spawned.pid;
                    let released = spawned.dispose(eof_grace, grace).await;
                    // The ladder reaps the agent whether or not its group went quietly.
                    reaped.set(Some(pid));
                    released
                }
                None => Ok(()),
            }
        })
    }

    fn stop_report(&self) -> StopReport {
        let report = StopReport::new().with_children([Branch::unknown(AGENT_RUNS_UNKNOWN)]);
        match self.reaped.get() {
            Some(pid) => report.with_process(pid),
            None => report,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_reasons_map_both_ways_and_error_is_an_error_answer_not_a_reason() {
        for stop in [StopReason::Completed, StopReason::MaxTokens, StopReason::Refusal, StopReason::Aborted] {
            let acp = acp_stop_of(stop).expect("every outcome but Error has an ACP reason");
            assert_eq!(stop_reason_of(acp), stop);
        }
        assert_eq!(acp_stop_of(StopReason::Error), None);
        assert_eq!(stop_reason_of(AcpStop::MaxTurnRequests), StopReason::Error);
    }
}
