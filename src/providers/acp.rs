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
//! mcpServers}`: the configured [`AcpMcpServer`]s, or the subset the
//! request's `mcp_servers` names (the agent starts them itself, outside
//! the environment scrub; see `mcp_servers.rs`). Any failure kills and
//! reaps the child before `start` rejects.
//!
//! **Run**: the prompt goes out as `session/prompt`; `agent_message_chunk`
//! text is the output; tool calls, their updates and plans become
//! `Progress` events. Text content of a `tool_call_update` (what a
//! delegating agent such as `subagents acp` streams of the child behind a
//! subagent call, its grandchildren indented within) goes on as
//! `Delegated` message chunks, only what is new since that call's last
//! update: a grandchild's progress reaches the top caller one level down.
//! It stays text: which call and how deep inside it is not parsed back. Stop map: `end_turn` → completed, `max_tokens` →
//! max-tokens, `refusal` → refusal, `cancelled` → aborted, anything else (or
//! an error answer) → error.
//!
//! **Permission**: each `session/request_permission` is answered by the
//! provider's [`Rules`] ([`AcpConfig::permission`]: `reject` by default,
//! `allow`, or `ask`, and rules by kind of call, tool name or title glob
//! and path prefix); what they leave to `ask` climbs to the run's nearest
//! approver ([`crate::seam::Approvals`]), within `permission_timeout`. No
//! approver, no answer in time, a cancel or a dispose is a reject; "allow
//! always" holds for this run only; the agent gets only an option it
//! offered, by kind, never by position (see `permission.rs`). Each request
//! and its answer, with who gave it, is in the run's transcript.
//!
//! **Cancel** sends `session/cancel`; the run settles `Aborted` even if the
//! child ignores it (after the runtime's cancel grace). **Dispose** closes
//! the connection (stdin EOF), waits for the agent to exit on its own,
//! SIGTERMs the group, waits `dispose_grace`, SIGKILLs, and fails loudly if
//! any process of the group survives. The wait after EOF is
//! `dispose_eof_grace` while a prompt is unanswered, else
//! `dispose_idle_eof_grace` past the agent's last line (see `dispose.rs`):
//! agents that never exit on EOF cost half a second, not six, once their
//! run finished. Child output lines are capped, so a child that
//! floods stdout cannot grow memory without bound. A failure's diagnostic
//! carries its stage and category and, as its `detail`, the agent's
//! account: its error answer (code, message, data), how it exited (after a
//! crash, waited for a moment) and the last lines of its stderr, made one
//! safe line with the values of `env` replaced (`child_process/account.rs`;
//! a pooled process's stderr is shared by its sessions).
//!
//! **Reuse** ([`AcpConfig::reuse`]): `PerRun` (the default) is all of the
//! above, one process per run. `Pooled` keeps initialized processes in a
//! warm pool ([`PoolConfig`], see `pool.rs`): `start` takes one and opens a
//! fresh `session/new` on it; dispose ends the session (`session/cancel`
//! first if the prompt is still running, its answer awaited within
//! `cancel_grace`) and returns the process, or retires it down the ladder
//! when it died, broke the protocol or did not answer. The pool drains in
//! [`Provider::shutdown`] (provider removal, runtime shutdown). Limit: a
//! pooled process serves many tasks over its life, so what the agent keeps
//! in its process is shared between runs (see [`Reuse`]).
//!
//! **Receipts** list the agent process reaped by dispose (its pid; a pooled
//! run's process goes back to the pool, so it lists none) and an unknown
//! branch for whatever the agent itself started: ACP does not tell a client
//! about an agent's own subagents.

mod dispose;
mod mcp_servers;
mod permission;
mod pool;
mod process;
mod run_dir;
#[cfg(feature = "agent")]
mod transcript;
#[cfg(not(feature = "agent"))]
#[path = "acp/transcript_off.rs"]
mod transcript;

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::schema::{
    Content, ContentBlock as AcpBlock, ContentChunk, Implementation, InitializeRequest, InitializeResponse, SessionId,
    SessionUpdate, SystemPrompt, SystemPromptMode, ToolCallContent, ToolCallStatus,
};
use agent_client_protocol::{v1, ByteStreams, Client};
use futures_util::future::LocalBoxFuture;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::watch;
use tokio_util::codec::AnyDelimiterCodecError;
use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};
use tokio_util::sync::CancellationToken;

use self::dispose::{Activity, Graces};
pub use self::mcp_servers::AcpMcpServer;
use self::permission::Asking;
use self::pool::Pool;
pub use self::pool::PoolConfig;
use self::process::{AgentProcess, Answer, Fault, Route};
use self::run_dir::RunDir;
pub use self::run_dir::RunDirs;
use self::transcript::{Stores, Transcript};
use crate::child_process::{lines, spawn, ChildEnv, ChildProcessConfig, Spawned, HANDSHAKE_TIMEOUT, MAX_OUTPUT};
use crate::live::LiveCounters;
use crate::live::ProcessLease;
use crate::seam::{
    text_of, Branch, Capabilities, Category, Child, ContentBlock, Diagnostic, Failure, Launch, LaunchError, Provider,
    RunResult, RunUsage, Stage, StopReason, StopReport,
};
use crate::seam::{Policy, Rules, DEFAULT_APPROVAL_TIMEOUT};
use crate::seam::{ProgressUpdate, ToolCallStatus as Progress};
use crate::workspace::Worktree;

/// Configuration of an [`AcpProvider`].
#[derive(Clone, Debug)]
pub struct AcpConfig {
    /// Registry name.
    pub name: String,
    /// The agent command.
    pub command: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// How the agent's permission requests are answered: rules, then a
    /// default (`Policy::Reject` unless set); `Policy::Ask` goes to the
    /// run's nearest approver.
    pub permission: Rules,
    /// How long an `ask` waits for an answer before it is a reject
    /// ([`DEFAULT_APPROVAL_TIMEOUT`], ten minutes, unless set).
    pub permission_timeout: Duration,
    /// Where the agent runs, its environment and its graces
    /// (`dispose_eof_grace`: while a prompt is unanswered).
    pub child: ChildProcessConfig,
    /// Grace after stdin EOF, and after the agent's last line, when every
    /// prompt was answered (500 ms): a finished agent that ignores EOF is
    /// SIGTERMed then. At most `dispose_eof_grace`.
    pub dispose_idle_eof_grace: Duration,
    /// One process per run (the default) or a warm pool of them.
    pub reuse: Reuse,
    /// Each process's private directory, made when `{run_dir}` appears in
    /// `args` or an `env` value (see [`RunDirs`]).
    pub run_dirs: RunDirs,
    /// The MCP servers each session is given (`session/new`'s
    /// `mcpServers`); the agent starts or connects to them itself.
    pub mcp_servers: Vec<AcpMcpServer>,
    /// A git worktree per run (`workspace = "worktree"`): the run's
    /// working directory, its work committed on its branch when it ends
    /// (see [`crate::workspace`]).
    pub workspace: Option<Arc<crate::workspace::Workspaces>>,
}

/// Whether each run gets its own agent process.
///
/// **Trade-off**: `PerRun` isolates every run in a fresh process and pays a
/// spawn and an `initialize` each time; `Pooled` pays that once per process,
/// so a run costs one `session/new`, but a pooled process serves more than
/// one task over its life: whatever the agent keeps in the process (memory,
/// caches, files it opened, its cwd) may be seen by a later run's session.
/// Choose `Pooled` only for an agent whose sessions are independent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Reuse {
    /// Spawn and `initialize` a process for each run; dispose climbs the
    /// ladder. Today's behaviour.
    #[default]
    PerRun,
    /// Keep initialized processes in a [`PoolConfig`] pool; each run opens
    /// a fresh session on one of them, and its dispose ends that session
    /// and returns the process.
    Pooled(PoolConfig),
}

impl AcpConfig {
    /// Defaults for `name` running `command args…`.
    pub fn new(name: impl Into<String>, command: impl Into<PathBuf>, args: Vec<String>) -> Self {
        AcpConfig {
            name: name.into(),
            command: command.into(),
            args,
            permission: Rules::new(Policy::Reject),
            permission_timeout: DEFAULT_APPROVAL_TIMEOUT,
            child: ChildProcessConfig::default(),
            // An agent that exits at EOF does so in milliseconds (our own
            // `subagents acp` is disposed in 2.6–3.5 ms, benches/acp_dispose.rs);
            // one that ignores EOF is SIGTERMed then: 506–507 ms in all.
            dispose_idle_eof_grace: Duration::from_millis(500),
            reuse: Reuse::PerRun,
            run_dirs: RunDirs::default(),
            mcp_servers: Vec::new(),
            workspace: None,
        }
    }

    /// Whether each process gets a private directory: `{run_dir}` in
    /// `args` or an `env` value.
    pub fn uses_run_dir(&self) -> bool {
        run_dir::wanted(self.args.iter().chain(self.env.iter().map(|(_, value)| value)).map(String::as_str))
    }

    /// Spawns the agent in `cwd`: the allowlist, `inherit_env`, then
    /// `env`, with `{run_dir}` replaced by a fresh private directory when
    /// the configuration names one (returned, to be removed once the
    /// process is reaped).
    async fn spawn_agent(&self, cwd: &Path, lease: ProcessLease) -> std::io::Result<(Spawned, Option<RunDir>)> {
        if !self.uses_run_dir() {
            return Ok((spawn(&self.command, &self.args, cwd, self.child.child_env(), lease)?, None));
        }
        let dir = RunDir::create(&self.name, &self.run_dirs).await?;
        let args: Vec<String> = self.args.iter().map(|arg| dir.expand(arg)).collect();
        let env: Vec<(String, String)> = self.env.iter().map(|(key, value)| (key.clone(), dir.expand(value))).collect();
        let spawned = spawn(&self.command, &args, cwd, ChildEnv { inherit: &self.inherit_env, explicit: &env }, lease)?;
        Ok((spawned, Some(dir)))
    }
}

impl std::ops::Deref for AcpConfig {
    type Target = ChildProcessConfig;

    fn deref(&self) -> &ChildProcessConfig {
        &self.child
    }
}

impl std::ops::DerefMut for AcpConfig {
    fn deref_mut(&mut self) -> &mut ChildProcessConfig {
        &mut self.child
    }
}

/// What a child's session header records of its run (read only where
/// transcripts are recorded: with the `agent` feature).
#[derive(Debug)]
#[cfg_attr(not(feature = "agent"), allow(dead_code))]
struct Recording {
    parent_session: Option<String>,
    depth: u32,
    cwd: PathBuf,
    persona: Option<String>,
    provider: String,
    label: Option<String>,
}

/// What the agent said it can do.
#[derive(Clone, Copy, Debug, Default)]
struct AgentFeatures {
    system_prompt: bool,
    override_prompt: bool,
    /// `mcpCapabilities.http`: it takes streamable HTTP MCP servers.
    mcp_http: bool,
}

/// The `acp` provider.
#[derive(Debug)]
pub struct AcpProvider {
    config: AcpConfig,
    features: AgentFeatures,
    /// The warm pool, under `Reuse::Pooled`.
    pool: Option<Arc<Pool>>,
    /// Where the runs' transcripts are recorded (see `transcript.rs`).
    stores: Arc<Stores>,
}

/// Why an ACP agent could not be probed ([`AcpProvider::new`]): the
/// provider's name and what went wrong.
#[derive(Debug, thiserror::Error)]
#[error("acp provider {name:?}: {failure}")]
pub struct ProbeError {
    name: String,
    failure: ProbeFailure,
}

/// What went wrong in an ACP agent's probe.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProbeFailure {
    /// No working directory to start the agent in.
    #[error("{0}")]
    NoWorkingDirectory(String),
    /// The agent could not be spawned.
    #[error("spawn: {0}")]
    Spawn(std::io::Error),
    /// The agent answered `initialize` with an error.
    #[error("initialize failed: {0}")]
    Initialize(String),
    /// The agent did not answer `initialize` in time.
    #[error("initialize timed out")]
    TimedOut,
    /// An HTTP MCP server is configured for an agent that does not
    /// advertise `mcpCapabilities.http`.
    #[error("MCP server {0:?} is an HTTP server, and the agent does not advertise mcpCapabilities.http")]
    McpHttpUnsupported(String),
    /// A worktree per run asked of a pooled provider, whose processes
    /// outlive their runs.
    #[error("workspace = \"worktree\" needs reuse = \"per-run\": a pooled agent process outlives each run's worktree")]
    PooledWorkspace,
}

impl ProbeError {
    /// The provider whose agent failed its probe.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What went wrong.
    pub fn failure(&self) -> &ProbeFailure {
        &self.failure
    }
}

impl AcpProvider {
    /// Runs one `initialize` against the command to learn what it
    /// supports (the probe child is reaped before this returns). Needs a
    /// tokio runtime.
    pub async fn new(config: AcpConfig) -> Result<AcpProvider, ProbeError> {
        let failed = |failure: ProbeFailure| ProbeError { name: config.name.clone(), failure };
        if config.workspace.is_some() && config.reuse != Reuse::PerRun {
            return Err(failed(ProbeFailure::PooledWorkspace));
        }
        let cwd = config.probe_cwd().map_err(|e| failed(ProbeFailure::NoWorkingDirectory(e)))?;
        let lease = ProcessLease::new(Arc::new(LiveCounters::default()));
        // The probe has no worktree: `{worktree}` is an empty directory of its own.
        let probe_dir = std::env::temp_dir().join(format!("subagents-probe-{}", std::process::id()));
        let probing = match config.workspace.is_some() {
            true => {
                let _ = std::fs::create_dir_all(&probe_dir);
                let dir = probe_dir.to_string_lossy().into_owned();
                let mut probing = config.clone();
                probing.args = config.args.iter().map(|arg| arg.replace(crate::workspace::PLACEHOLDER, &dir)).collect();
                for (_, value) in &mut probing.env {
                    *value = value.replace(crate::workspace::PLACEHOLDER, &dir);
                }
                probing
            }
            false => config.clone(),
        };
        let (mut spawned, run_dir) =
            probing.spawn_agent(&cwd, lease).await.map_err(|e| failed(ProbeFailure::Spawn(e)))?;
        let transport = transport(&mut spawned, Arc::default(), Arc::default());
        let probe = Client
            .v1()
            .name("subagents")
            .connect_with(transport, async |cx: v1::ConnectionTo<agent_client_protocol::Agent>| {
                cx.send_request(initialize()).block_task().await
            });
        let answered = tokio::time::timeout(HANDSHAKE_TIMEOUT, probe).await;
        let failure = match &answered {
            Ok(Ok(_)) => None,
            Ok(Err(error)) => Some(process::probe_account(&probing, &mut spawned, error).await),
            Err(_) => Some(ProbeFailure::TimedOut),
        };
        spawned.kill().await;
        if let Some(run_dir) = run_dir {
            run_dir.discard().await;
        }
        if config.workspace.is_some() {
            let _ = std::fs::remove_dir(&probe_dir);
        }
        let response = match (answered, failure) {
            (Ok(Ok(response)), _) => response,
            (_, failure) => return Err(failed(failure.unwrap_or(ProbeFailure::TimedOut))),
        };
        let features = features(&response);
        if let Some(server) = mcp_servers::refused_by_agent(&config.mcp_servers, features.mcp_http) {
            return Err(failed(ProbeFailure::McpHttpUnsupported(server.name().to_owned())));
        }
        let pool = match &config.reuse {
            Reuse::PerRun => None,
            Reuse::Pooled(pool) => Some(Pool::new(config.clone(), pool.clone())),
        };
        Ok(AcpProvider { features, config, pool, stores: Arc::default() })
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
        mcp_http: response.agent_capabilities.mcp_capabilities.http,
    }
}

/// Child stdout goes through a bounded line reader into the crate: an
/// endless line costs at most [`MAX_LINE`](crate::child_process::MAX_LINE),
/// and a line that is not JSON ends the connection (the crate would answer
/// it and wait on, so a babbling child would hang the run). `broken` is
/// set when either happens. Every line is `heard` by `activity`; once the
/// connection is gone (a dispose), lines are still read and dropped until
/// the child closes its stdout.
fn transport(
    spawned: &mut Spawned,
    broken: Arc<AtomicBool>,
    activity: Arc<Activity>,
) -> ByteStreams<impl futures_util::AsyncWrite, impl futures_util::AsyncRead> {
    let stdin = spawned.stdin.take().expect("piped");
    let stdout = spawned.stdout.take().expect("piped");
    let (into_crate, from_pump) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let mut lines = lines(stdout);
        // `None` once the connection is gone: an agent still writing during
        // its EOF grace is neither blocked on a full pipe nor killed by
        // a closed one (EPIPE), and its lines still count as activity.
        let mut into_crate = Some(into_crate);
        loop {
            match lines.next().await {
                Some(Ok(line)) => {
                    activity.heard();
                    let Some(connection) = into_crate.as_mut() else { continue };
                    let blank = line.iter().all(u8::is_ascii_whitespace);
                    if !blank && serde_json::from_slice::<serde::de::IgnoredAny>(&line).is_err() {
                        tracing::warn!("an ACP child wrote a line that is not JSON");
                        broken.store(true, Ordering::Release);
                        break;
                    }
                    let mut line = Vec::from(line);
                    line.push(b'\n');
                    if connection.write_all(&line).await.is_err() {
                        into_crate = None;
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

    fn runs_out_of_process(&self) -> bool {
        true
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { persona: self.features.system_prompt, mcp_servers: true, ..Capabilities::none() }
    }

    fn launch(&self, launch: Launch) -> LocalBoxFuture<'static, Result<Box<dyn Child>, LaunchError>> {
        let (config, features, pool) = (self.config.clone(), self.features, self.pool.clone());
        let stores = self.stores.clone();
        Box::pin(async move { start(config, features, (pool, stores), launch).await })
    }

    /// Drains the pool (pooled mode): every process climbs the dispose
    /// ladder. Runs at provider removal and at runtime shutdown.
    fn shutdown(&self) -> LocalBoxFuture<'static, ()> {
        let pool = self.pool.clone();
        Box::pin(async move {
            if let Some(pool) = pool {
                pool.drain().await;
            }
        })
    }
}

type Connection = v1::ConnectionTo<agent_client_protocol::Agent>;

/// Pooled processes found dead at session/new that one start retires
/// before it gives up (each is replaced by the pool).
const MAX_DEAD_POOLED: usize = 3;

async fn start(
    config: AcpConfig,
    features: AgentFeatures,
    (pool, stores): (Option<Arc<Pool>>, Arc<Stores>),
    launch: Launch,
) -> Result<Box<dyn Child>, LaunchError> {
    let Launch { request, cancel, context } = launch;
    if cancel.is_cancelled() {
        return Err(LaunchError::Aborted);
    }
    if request.prompt.iter().any(|block| block.as_text().is_none()) {
        return Err(LaunchError::Invalid { field: "prompt", reason: "the acp provider sends text only".to_owned() });
    }
    let (config, worktree) = in_worktree(config, &request, &context).await?;
    let started =
        start_in(config, features, (pool, stores), Launch { request, cancel, context }, worktree.clone()).await;
    if let (Err(_), Some(worktree)) = (&started, worktree) {
        worktree.discard().await;
    }
    started
}

/// The run's own worktree, when the provider gives each run one: the
/// configuration then has `{worktree}` replaced in `args` and `env`, and
/// the worktree as its working directory.
async fn in_worktree(
    mut config: AcpConfig,
    request: &crate::seam::StartRequest,
    context: &crate::seam::ProviderContext,
) -> Result<(AcpConfig, Option<Arc<Worktree>>), LaunchError> {
    let Some(workspaces) = config.workspace.clone() else { return Ok((config, None)) };
    let worktree = workspaces
        .create(request.task.as_ref(), context.run_id())
        .await
        .map_err(|error| crate::workspace::launch_error(&config.name, &error))?;
    config.args = config.args.iter().map(|arg| worktree.expand(arg)).collect();
    config.env = config.env.iter().map(|(key, value)| (key.clone(), worktree.expand(value))).collect();
    config.cwd = Some(worktree.path().to_owned());
    Ok((config, Some(Arc::new(worktree))))
}

async fn start_in(
    config: AcpConfig,
    features: AgentFeatures,
    (pool, stores): (Option<Arc<Pool>>, Arc<Stores>),
    launch: Launch,
    worktree: Option<Arc<Worktree>>,
) -> Result<Box<dyn Child>, LaunchError> {
    let Launch { request, cancel, context } = launch;
    let cwd = config.run_cwd(&request.parent.cwd)?;
    let failed = |fault: Option<Fault>| match fault {
        None => LaunchError::Aborted,
        Some(fault) => LaunchError::Diagnosed(diagnostic_of(&config.name, Stage::Initialize, fault)),
    };
    let system_prompt = request.persona.clone().filter(|_| features.system_prompt).map(|persona| {
        let mode = if features.override_prompt { SystemPromptMode::Override } else { SystemPromptMode::Append };
        SystemPrompt::new(vec![AcpBlock::from(persona)]).mode(mode)
    });
    let servers = mcp_servers::for_run(&config.mcp_servers, &request)?;
    let text = Arc::new(Mutex::new(String::new()));
    // A pooled process can die between its last run and this one (killed,
    // crashed) without the pool seeing it yet: a process that is still
    // exiting has no zombie to reap. Its session/new then finds the
    // connection gone; that process is retired and the next one tried, so
    // a dead pooled process never fails a run. A fresh process that crashes
    // fails the start.
    let mut dead_pooled = 0;
    let transcript = Arc::new(Transcript::default());
    let asking = Arc::new(Asking::new(&config, context.approvals().clone(), &cancel));
    let (process, session_id) = loop {
        let process = match &pool {
            None => {
                Arc::new(AgentProcess::start(&config, &cwd, context.track_process(), &cancel).await.map_err(failed)?)
            }
            Some(pool) => pool.checkout(&cwd, &cancel, &context).await.map_err(failed)?,
        };
        let route = Route {
            text: text.clone(),
            progress: context.clone(),
            delegated: DelegatedText::default(),
            transcript: transcript.clone(),
            asking: asking.clone(),
        };
        let opened = tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(None),
            opened = process.open_session(cwd.clone(), system_prompt.clone(), servers.clone(), route) => opened.map_err(Some),
        };
        match opened {
            Ok(session_id) => break (process, session_id),
            Err(fault) => {
                let fault = match fault {
                    Some(fault) => Some(process.account(&config, fault).await),
                    None => None,
                };
                // Nothing outlives a failed start: a per-run process is
                // killed, a pooled one retired (its state after a failed
                // session/new is unknown).
                match &pool {
                    None => process.kill().await,
                    Some(pool) => pool.give_back(process, false).await,
                }
                let crashed = fault.as_ref().is_some_and(|fault| fault.category == Category::ChildCrashed);
                if pool.is_none() || !crashed || dead_pooled >= MAX_DEAD_POOLED {
                    return Err(failed(fault));
                }
                dead_pooled += 1;
            }
        }
    };
    let id = format!("acp:{}:{}", config.name, session_id);
    let recording = Recording {
        parent_session: request.parent.session_id.clone(),
        depth: request.child_depth(),
        cwd: cwd.clone(),
        persona: request.persona.clone(),
        provider: config.name.clone(),
        label: request.label.clone(),
    };
    transcript.open(&stores, context.home_path(), &transcript::session_id_of(&id), recording).await;
    Ok(Box::new(AcpChild {
        id,
        transcript,
        asking,
        graces: Graces::of(&config),
        config: Rc::new(config),
        prompt: RefCell::new(Some(text_of(&request.prompt))),
        process,
        session_id,
        text,
        answer: RefCell::new(None),
        pool,
        cancel,
        reaped: Rc::new(Cell::new(None)),
        worktree,
    }))
}

/// An ACP tool call status as progress carries it (a status newer than
/// this crate is `Unknown`, not dropped).
fn progress_status(status: ToolCallStatus) -> Progress {
    match status {
        ToolCallStatus::Pending => Progress::Pending,
        ToolCallStatus::InProgress => Progress::InProgress,
        ToolCallStatus::Completed => Progress::Completed,
        ToolCallStatus::Failed => Progress::Failed,
        _ => Progress::Unknown,
    }
}

/// One session update as the run's progress (and answer text).
///
/// A `tool_call_update` carrying text content is what a delegating agent
/// (our own `subagents acp` among them) streams of the child behind that
/// tool call: its text, its tool calls, its own children's. That content
/// grows (and may be cut to its tail), so only what is new since the call's
/// last update goes on, as a [`ProgressUpdate::Delegated`] message chunk:
/// a grandchild's activity reaches the top caller one level down.
fn note_update(route: &Route, update: SessionUpdate) {
    route.transcript.note(&update);
    let progress = &route.progress;
    let update = match update {
        SessionUpdate::AgentMessageChunk(ContentChunk { content: AcpBlock::Text(chunk), .. }) => {
            let mut kept = route.text.lock().unwrap_or_else(|e| e.into_inner());
            // Text past the cap is dropped: memory stays bounded.
            if kept.len() + chunk.text.len() <= MAX_OUTPUT {
                kept.push_str(&chunk.text);
            }
            drop(kept);
            ProgressUpdate::MessageChunk { text: chunk.text }
        }
        SessionUpdate::ToolCall(call) => {
            route.asking.note_call(&call);
            ProgressUpdate::ToolCall { name: call.title, status: progress_status(call.status) }
        }
        SessionUpdate::ToolCallUpdate(update) => {
            route.asking.note_update(&update);
            let id = update.tool_call_id.to_string();
            let content: String = update
                .fields
                .content
                .iter()
                .flatten()
                .filter_map(|content| match content {
                    ToolCallContent::Content(Content { content: AcpBlock::Text(text), .. }) => Some(text.text.as_str()),
                    _ => None,
                })
                .collect();
            let finished =
                update.fields.status.is_some_and(|s| matches!(s, ToolCallStatus::Completed | ToolCallStatus::Failed));
            let new = route.delegated.advance(&id, content, finished);
            if !new.is_empty() {
                progress.progress(ProgressUpdate::Delegated {
                    update: Box::new(ProgressUpdate::MessageChunk { text: new }),
                });
            }
            if update.fields.status.is_none() && update.fields.title.is_none() {
                return; // a content-only update: its news went on above
            }
            ProgressUpdate::ToolCall {
                name: update.fields.title.unwrap_or(id),
                status: update.fields.status.map_or(Progress::Updated, progress_status),
            }
        }
        SessionUpdate::Plan(plan) => {
            ProgressUpdate::Plan { entries: plan.entries.into_iter().map(|entry| entry.content).collect() }
        }
        _ => return,
    };
    progress.progress(update);
}

/// The text content each running tool call of a session showed last, to
/// tell what a new `tool_call_update` adds.
#[derive(Debug, Default)]
pub(super) struct DelegatedText(Mutex<std::collections::HashMap<String, String>>);

impl DelegatedText {
    /// The part of `content` not shown before for call `id`; forgets the
    /// call once it `finished`.
    fn advance(&self, id: &str, content: String, finished: bool) -> String {
        let mut calls = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let before = calls.get(id).map_or("", String::as_str);
        let new = added_text(before, &content).to_owned();
        if finished {
            calls.remove(id);
        } else if !content.is_empty() {
            calls.insert(id.to_owned(), content);
        }
        new
    }
}

/// What `now` adds to `before`: the rest when it extends it; when the
/// sender cut its head off (a tail marked `…`), what follows the last
/// stretch of `before` found in it; else all of it.
fn added_text<'a>(before: &str, now: &'a str) -> &'a str {
    if let Some(rest) = now.strip_prefix(before) {
        return rest;
    }
    let mut anchor_start = before.len().saturating_sub(64);
    while !before.is_char_boundary(anchor_start) {
        anchor_start += 1;
    }
    let anchor = &before[anchor_start..];
    match now.rfind(anchor) {
        Some(at) if !anchor.is_empty() => &now[at + anchor.len()..],
        _ => now,
    }
}

/// The diagnostic of a failure: the fixed category, the agent's account
/// as its detail.
fn diagnostic_of(provider: &str, stage: Stage, fault: Fault) -> Diagnostic {
    let diagnostic = Diagnostic::new(provider, stage, fault.category);
    match fault.said {
        Some(said) => diagnostic.with_detail(said),
        None => diagnostic,
    }
}

struct AcpChild {
    id: String,
    /// The run's transcript in the parent's home.
    transcript: Arc<Transcript>,
    /// Its permission state: closed at dispose, so nothing pending is granted.
    asking: Arc<Asking>,
    /// The provider's configuration: its name, and the environment whose
    /// values an account of a failure must not show.
    config: Rc<AcpConfig>,
    prompt: RefCell<Option<String>>,
    process: Arc<AgentProcess>,
    session_id: SessionId,
    text: Arc<Mutex<String>>,
    /// The prompt's answer, once `run` sent it.
    answer: RefCell<Option<watch::Receiver<Option<Answer>>>>,
    /// Where the process goes back to at dispose (pooled mode).
    pool: Option<Arc<Pool>>,
    graces: Graces,
    cancel: CancellationToken,
    /// The agent's pid, once dispose reaped it.
    reaped: Rc<Cell<Option<u32>>>,
    /// The run's git worktree (`workspace = "worktree"`).
    worktree: Option<Arc<Worktree>>,
}

/// Why an ACP run's own runs are an unknown branch of its receipt.
const AGENT_RUNS_UNKNOWN: &str = "an ACP agent does not report the runs it started";

impl Child for AcpChild {
    fn id(&self) -> String {
        self.id.clone()
    }

    fn run(&self) -> LocalBoxFuture<'static, RunResult> {
        let prompt = self.prompt.borrow_mut().take().unwrap_or_default();
        self.transcript.prompt(&prompt);
        let mut answer = self.process.prompt(&self.session_id, prompt);
        let transcript = self.transcript.clone();
        *self.answer.borrow_mut() = Some(answer.clone());
        let (text, cancel) = (self.text.clone(), self.cancel.clone());
        let (process, config) = (self.process.clone(), self.config.clone());
        let worktree = self.worktree.clone();
        Box::pin(async move {
            // A sender gone without an answer: the connection went with it.
            let crashed = || Answer::Failed(Fault::from(Category::ChildCrashed));
            let answered = match answer.wait_for(Option::is_some).await {
                Ok(answer) => answer.clone().unwrap_or_else(crashed),
                Err(_) => crashed(),
            };
            let (stop_reason, fault) = match answered {
                Answer::Stopped(stop) => (stop, Fault::from(Category::ChildError)),
                Answer::Failed(fault) => (StopReason::Error, fault),
            };
            let diagnostic = match stop_reason == StopReason::Error && !cancel.is_cancelled() {
                true => Some(diagnostic_of(&config.name, Stage::SessionRun, process.account(&config, fault).await)),
                false => None,
            };
            transcript.end(stop_reason, diagnostic.as_ref()).await;
            let output = std::mem::take(&mut *text.lock().unwrap_or_else(|e| e.into_inner()));
            let workspace = match worktree {
                Some(worktree) => Some(worktree.settle().await),
                None => None,
            };
            RunResult {
                output: if output.is_empty() { Vec::new() } else { vec![ContentBlock::text(output)] },
                structured: None,
                stop_reason,
                diagnostic,
                child_session: None,
                // ACP reports no token usage for a prompt turn.
                usage: RunUsage::default(),
                tool_calls_failed: transcript.tool_calls_failed(),
                workspace,
            }
        })
    }

    fn cancel(&self) {
        self.process.cancel(&self.session_id);
    }

    fn dispose(&self) -> LocalBoxFuture<'static, Result<(), Failure>> {
        self.asking.close();
        let (process, session_id, pool) = (self.process.clone(), self.session_id.clone(), self.pool.clone());
        let answer = self.answer.borrow().clone();
        let reaped = self.reaped.clone();
        let graces = self.graces;
        let worktree = self.worktree.clone();
        Box::pin(async move {
            let Some(pool) = pool else {
                let released = process.dispose(graces).await;
                // The ladder reaps the agent whether or not its group went quietly.
                reaped.set(Some(process.pid));
                // The agent is gone: what it left is committed, its worktree removed.
                if let Some(worktree) = worktree {
                    worktree.release().await;
                }
                return released;
            };
            // The session ends here; the process goes back only once the
            // agent has answered its prompt (cancelled now if still running),
            // so the next run never finds it busy with a stale one.
            let settled = match answer {
                None => true,
                Some(mut answer) => {
                    if answer.borrow().is_none() {
                        process.cancel(&session_id);
                    }
                    let waited = tokio::time::timeout(pool.cancel_grace(), answer.wait_for(Option::is_some)).await;
                    matches!(waited, Ok(Ok(answered)) if answered.as_ref().is_some_and(Answer::leaves_process_sound))
                }
            };
            process.forget(&session_id);
            pool.give_back(process, settled).await;
            Ok(())
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
    fn a_tool_calls_growing_content_yields_only_what_is_new_even_when_its_head_was_cut() {
        assert_eq!(added_text("", "hello"), "hello");
        assert_eq!(added_text("hello", "hello world"), " world");
        let before = "the head, cut later; ".repeat(10) + "the tail of what was shown";
        let now = format!("…{} and more", &before[before.len() - 80..]);
        assert_eq!(added_text(&before, &now), " and more");
        assert_eq!(added_text("unrelated", "fresh"), "fresh");
    }
}
