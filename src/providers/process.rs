//! `process`: each run is a fresh, full `subagents` runtime in its own
//! process (`subagents serve` over stdio JSON-RPC).
//!
//! **Choose it** when a child must be a complete peer — its own runtime,
//! home, session, profile and model route — isolated from the parent's
//! process, and a process start per run is an acceptable price.
//!
//! **MCP servers** (feature `mcp`): chosen as for an in-process child and
//! started by the child runtime, its own copies (see `mcp_servers.rs`);
//! `mcp_servers` is advertised.
//!
//! **Advertises** `agent_options` (and `mcp_servers`): the route (provider, model,
//! max_tokens, reasoning_effort) crosses the wire as an explicit whitelist
//! and the provider publishes its route defaults. Structured output, depth
//! caps, tool filters and personas are rejected at `start` (configure the
//! child's profile and its ordered patches instead). A delegation budget
//! is not a capability: the start path enforces it here like everywhere,
//! and the child runtime gets what is left of it
//! ([`BudgetLease::remaining`](crate::seam::BudgetLease::remaining)) and enforces
//! that for its own subtree; what it spends is not charged back.
//!
//! **Output** is the child's last non-empty assistant message, else the
//! streamed text. **Stop map**: `completed` and `max-tokens` pass through,
//! `blocked` → refusal, `aborted` → aborted, anything else or no turn end →
//! error.
//!
//! **Fails and recovers**: the cwd is resolved and checked before spawning;
//! every startup failure (spawn, handshake, a cancel) kills and reaps the
//! child before `start` rejects. Cancel sends `cancel` (the run settles
//! `Aborted` after the runtime's grace even if the child ignores it).
//! Dispose sends a bounded `shutdown`, then closes stdin and climbs the
//! ladder EOF → SIGTERM → SIGKILL, and fails loudly if the child's process
//! group survives. A failure's diagnostic carries its stage and category,
//! the child's own reason when it gave one, and as its `detail` the
//! child's account: its error answer, how it exited (after a crash) and
//! the last lines of its stderr, with the values of `env` replaced.
//!
//! **Receipts**: the `shutdown` reply carries the receipts of the runs the
//! child's session started (`runs`); the run's receipt lists them under it
//! with the child's pid as reaped. A child that dies, does not answer
//! within `shutdown_timeout`, or is an older peer without the field leaves
//! an unknown branch saying which.
//!
//! **Approvals**: a run whose route reaches an approver tells its child
//! so, and the permission requests of the child's runs (an `acp`
//! grandchild's `ask`, with `config` naming a file of the child's
//! providers) cross the wire to be asked here, the child's path under this
//! run's; the child waits with its own timeout, and a parent that dies is
//! a reject there (see `approvals.rs`, and the wire in
//! `crate::wire::process`).
//!
//! **Limits**: the parent lends its route limiters (`lent_limiters`; a
//! configuration's process provider lends every route of its file) to
//! each child in `initialize`, and the child's model calls on a route of
//! the same name (its session's model, when the provider's `model` names
//! a route; a route of the child's own `config`) wait on the parent's
//! limiter too: every child of the parent, and the parent itself, stay
//! under one `rpm`, `tpm` and `max_concurrent`, a 429 in one child cools
//! the route for all, and the parent's [`Limiter::stats`](crate::agent::Limiter::stats) count the
//! children's calls. The child is held to bounds, and what it held is
//! given back when its wire closes (see `limits.rs`). An older child
//! refuses the fields; it is asked again without them and keeps its own
//! limits.
//!
//! **Environment**: the allowlist of [the child environment](super#child-environment)
//! (`PATH`, `HOME`, `LANG`, …), the names listed in `inherit_env`, and the
//! explicit `env` entries; nothing else of the parent's. A child on the
//! `openai` route needs `SUBAGENTS_BASE_URL` (`inherit_env`) and its key
//! (`env`: credential-shaped names are never inherited).
//!
//! **Limits**: a process start per run, no pooling; local children only.
//! Tool filters cannot be checked against the child's tools from here
//! (they are advertised off).

mod approvals;
mod limits;
#[cfg(feature = "mcp-client")]
pub(crate) mod mcp_servers;

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::agent::Limiter;
use crate::child_process::{
    account, exit_words, redacted, spawn, ChildProcessConfig, Spawned, StderrTail, HANDSHAKE_TIMEOUT, MAX_OUTPUT,
};
use crate::seam::{
    AgentOptions, Branch, BudgetLease, Capabilities, Category, Child, ContentBlock, Diagnostic, Failure, Launch,
    LaunchError, ProgressUpdate, Provider, ProviderContext, RunResult, RunUsage, Stage, StopReason, StopReport,
    ToolCallStatus,
};
use crate::wire::process::{ChildEvent, Connection, Initialize, TurnEndReason, WireError, PROTOCOL_VERSION};
use crate::workspace::Worktree;

/// Configuration of a [`ProcessProvider`].
#[derive(Clone, Debug)]
pub struct ProcessConfig {
    /// Registry name.
    pub name: String,
    /// The `subagents` executable (default: this one).
    pub bin: PathBuf,
    /// The child's named profile (default `default`).
    pub profile: String,
    /// Ordered profile patch files (JSON objects), checked at construction.
    pub patches: Vec<PathBuf>,
    /// The children's home (absolute; required).
    pub home: PathBuf,
    /// A configuration file for the child (`serve --config`): its session
    /// delegates to that file's providers (an `acp` agent, say) instead of
    /// a `spawn` of its own.
    pub config: Option<PathBuf>,
    /// Route defaults, overridden per request by `agent_options`.
    pub route: AgentOptions,
    /// Bound on the `shutdown` exchange (1 s).
    pub shutdown_timeout: Duration,
    /// Where the child runs, its environment and its graces.
    pub child: ChildProcessConfig,
    /// The MCP servers each child mounts (`None`, the default: its parent
    /// agent's; `Some(vec![])`: none); each child starts its own copies.
    #[cfg(feature = "mcp-client")]
    pub mcp_servers: Option<Vec<crate::agent::McpServerConfig>>,
    /// A git worktree per run (`workspace = "worktree"`): the run's
    /// working directory, its work committed on its branch when it ends
    /// (see [`crate::workspace`]).
    pub workspace: Option<std::sync::Arc<crate::workspace::Workspaces>>,
    /// The route limiters each child draws on, by route name: its model
    /// calls on a route of that name wait on the limiter here too (see
    /// [`ProcessConfig::lend_route`]).
    pub lent_limiters: Vec<(String, Limiter)>,
    /// Which lent route the child's session model is on (set by
    /// [`ProcessConfig::route_child_model`] for a configured route).
    pub model_route: Option<String>,
}

impl std::ops::Deref for ProcessConfig {
    type Target = ChildProcessConfig;

    fn deref(&self) -> &ChildProcessConfig {
        &self.child
    }
}

impl std::ops::DerefMut for ProcessConfig {
    fn deref_mut(&mut self) -> &mut ChildProcessConfig {
        &mut self.child
    }
}

impl ProcessConfig {
    /// Tells the child to run `spec` (what `subagents serve` reads back
    /// from its route): the route names the model; for an HTTP model the
    /// child inherits the endpoint's variables and is handed the key
    /// explicitly, as a credential-shaped name is never inherited. A
    /// configured route reaches the child as its API and model, with the
    /// route's base URL and key handed over under the API's variables, and
    /// its limiter lent ([`ProcessConfig::lend_route`]): the child's calls
    /// wait on it; `max_tokens`, `timeout` and `retries` are not sent (a
    /// child runs its own model).
    pub fn route_child_model(&mut self, spec: &crate::agent::ModelSpec) {
        let Some(provider) = spec.route_provider() else { return };
        self.route.provider = Some(provider.to_owned());
        self.route.model = spec.model_name().map(str::to_owned);
        let (inherited, key) = spec.endpoint_env();
        if let crate::agent::ModelSpec::Route(route) = spec {
            self.lend_route(route);
            self.model_route = Some(route.name.clone());
            let handed = [(inherited[0], route.base_url.as_ref()), (key.unwrap_or_default(), route.api_key.as_ref())];
            self.env.extend(handed.into_iter().filter_map(|(name, value)| Some((name.to_owned(), value?.clone()))));
            return;
        }
        self.inherit_env.extend(inherited.iter().map(|name| (*name).to_owned()));
        // A value found under the ecosystem's name (`OPENAI_BASE_URL`) is
        // handed over under ours, which the child reads first.
        for name in inherited {
            let unset = std::env::var(name).ok().filter(|value| !value.trim().is_empty()).is_none();
            if let Some(value) = crate::agent::endpoint_var(name).filter(|_| unset) {
                self.env.push(((*name).to_owned(), value));
            }
        }
        if let Some(key) = key.and_then(|name| Some((name, crate::agent::endpoint_var(name)?))) {
            self.env.push((key.0.to_owned(), key.1));
        }
    }

    /// Lends `route`'s limiter to every child, under the route's name: a
    /// child's model calls on a route of that name (its session's, or one
    /// of its own `config`) wait on this limiter as well as on its own.
    pub fn lend_route(&mut self, route: &crate::agent::ModelRoute) {
        if !self.lent_limiters.iter().any(|(name, _)| *name == route.name) {
            self.lent_limiters.push((route.name.clone(), route.limiter().clone()));
        }
    }

    /// Defaults for `name`, with children's home `home`.
    pub fn new(name: impl Into<String>, home: impl Into<PathBuf>) -> Self {
        ProcessConfig {
            name: name.into(),
            bin: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("subagents")),
            profile: "default".to_owned(),
            patches: Vec::new(),
            home: home.into(),
            config: None,
            route: AgentOptions::default(),
            shutdown_timeout: Duration::from_secs(1),
            child: ChildProcessConfig::default(),
            #[cfg(feature = "mcp-client")]
            mcp_servers: None,
            workspace: None,
            lent_limiters: Vec::new(),
            model_route: None,
        }
    }

    /// The child's command line: `serve --home HOME [--config FILE]`.
    fn serve_args(&self) -> Vec<String> {
        let mut args = vec!["serve".to_owned(), "--home".to_owned(), self.home.display().to_string()];
        if let Some(config) = &self.config {
            args.extend(["--config".to_owned(), config.display().to_string()]);
        }
        args
    }
}

/// Why a [`ProcessConfig`] was refused ([`ProcessProvider::new`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The children's home is a relative path.
    #[error("process provider configuration: home must be an absolute path")]
    RelativeHome,
    /// `bin` names no file.
    #[error("process provider configuration: no executable at {}", .0.display())]
    NoExecutable(PathBuf),
    /// A patch file could not be read.
    #[error("process provider configuration: patch {}: {source}", path.display())]
    UnreadablePatch {
        /// The patch file.
        path: PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// A patch file is not JSON.
    #[error("process provider configuration: patch {} is not JSON: {source}", path.display())]
    PatchNotJson {
        /// The patch file.
        path: PathBuf,
        /// Where the JSON broke.
        source: serde_json::Error,
    },
    /// A patch does not apply to a profile.
    #[error("process provider configuration: patch {}: {reason}", path.display())]
    InvalidPatch {
        /// The patch file.
        path: PathBuf,
        /// What the profile refused.
        reason: String,
    },
}

/// Why [`ProcessProvider::probe`] found the child unusable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProbeError {
    /// No working directory to start the child in.
    #[error("{0}")]
    NoWorkingDirectory(String),
    /// The child could not be spawned.
    #[error("spawn: {0}")]
    Spawn(std::io::Error),
    /// The child answered its `initialize` with a failure, or never did.
    #[error("its child's initialize failed ({category})")]
    Initialize {
        /// The failure's category as the wire names it (`child-crashed`, …).
        category: String,
    },
}

/// The `process` provider.
#[derive(Debug)]
pub struct ProcessProvider {
    config: ProcessConfig,
    patches: Vec<Value>,
}

impl ProcessProvider {
    /// What a process provider advertises: the child's route, and the MCP
    /// servers it mounts when the child side is built.
    pub const CAPABILITIES: Capabilities =
        Capabilities { agent_options: true, mcp_servers: cfg!(feature = "mcp-client"), ..Capabilities::none() };

    /// Checks the configuration: the home must be absolute, the binary
    /// must exist, every patch must load and apply to a profile.
    pub fn new(config: ProcessConfig) -> Result<Self, ConfigError> {
        if !config.home.is_absolute() {
            return Err(ConfigError::RelativeHome);
        }
        if !config.bin.is_file() {
            return Err(ConfigError::NoExecutable(config.bin.clone()));
        }
        let mut patches = Vec::with_capacity(config.patches.len());
        for path in &config.patches {
            let path_of = || path.clone();
            let text =
                std::fs::read(path).map_err(|source| ConfigError::UnreadablePatch { path: path_of(), source })?;
            let patch: Value = serde_json::from_slice(&text)
                .map_err(|source| ConfigError::PatchNotJson { path: path_of(), source })?;
            crate::wire::process::profile::check_patch(&patch)
                .map_err(|reason| ConfigError::InvalidPatch { path: path_of(), reason })?;
            patches.push(patch);
        }
        Ok(ProcessProvider { config, patches })
    }
}

impl ProcessProvider {
    /// Starts one child, runs its `initialize` handshake with the
    /// configured profile, route and patches, and shuts it down: what
    /// `providers check` asks of a process provider. The child's session
    /// stays in the children's home like any run's. Needs a tokio runtime.
    pub async fn probe(&self) -> Result<(), ProbeError> {
        // The connection's tasks are local to their thread, as in a run.
        tokio::task::LocalSet::new().run_until(self.handshake_once()).await
    }

    async fn handshake_once(&self) -> Result<(), ProbeError> {
        let config = &self.config;
        let cwd = config.probe_cwd().map_err(ProbeError::NoWorkingDirectory)?;
        let lease = crate::live::ProcessLease::new(Default::default());
        let mut spawned =
            spawn(&config.bin, &config.serve_args(), &cwd, config.child_env(), lease).map_err(ProbeError::Spawn)?;
        let (events, _received) = mpsc::unbounded_channel();
        let (stdin, stdout) = (spawned.stdin.take(), spawned.stdout.take());
        let connection = Connection::start(stdin.expect("piped"), stdout.expect("piped"), events, None, None);
        let init = Initialize {
            protocol_version: PROTOCOL_VERSION,
            route: config.route.clone(),
            profile: config.profile.clone(),
            patches: self.patches.clone(),
            cwd,
            budget: None,
            parent_session: None,
            traceparent: None,
            tracestate: None,
            mcp_servers: Vec::new(),
            approvals: false,
            limits: Vec::new(),
            model_route: None,
        };
        let answered = handshake(&connection, &init).await;
        if answered.is_ok() {
            let _ = tokio::time::timeout(config.shutdown_timeout, connection.request("shutdown", json!({}))).await;
        }
        let eof_phase = || tokio::time::sleep(config.dispose_eof_grace);
        let _ = spawned.dispose(connection.close_input(), eof_phase, config.dispose_grace).await;
        answered.map(drop).map_err(|(category, _)| {
            let category = serde_json::to_value(category).ok().and_then(|c| c.as_str().map(str::to_owned));
            ProbeError::Initialize { category: category.unwrap_or_default() }
        })
    }
}

impl Provider for ProcessProvider {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn runs_out_of_process(&self) -> bool {
        true
    }

    fn capabilities(&self) -> Capabilities {
        ProcessProvider::CAPABILITIES
    }

    fn route_defaults(&self) -> AgentOptions {
        self.config.route.clone()
    }

    fn launch(&self, launch: Launch) -> LocalBoxFuture<'static, Result<Box<dyn Child>, LaunchError>> {
        let config = self.config.clone();
        let patches = self.patches.clone();
        Box::pin(async move { start(config, patches, launch).await })
    }
}

async fn start(mut config: ProcessConfig, patches: Vec<Value>, launch: Launch) -> Result<Box<dyn Child>, LaunchError> {
    if launch.cancel.is_cancelled() {
        return Err(LaunchError::Aborted);
    }
    // The run's own worktree: its working directory, `{worktree}` in `env`.
    let worktree = match config.workspace.clone() {
        None => None,
        Some(workspaces) => {
            let worktree = workspaces
                .create(launch.request.task.as_ref(), launch.context.run_id())
                .await
                .map_err(|error| crate::workspace::launch_error(&config.name, &error))?;
            config.env = config.env.iter().map(|(key, value)| (key.clone(), worktree.expand(value))).collect();
            config.cwd = Some(worktree.path().to_owned());
            Some(Rc::new(worktree))
        }
    };
    let started = start_in(config, patches, launch, worktree.clone()).await;
    if let (Err(_), Some(worktree)) = (&started, worktree) {
        worktree.discard().await;
    }
    started
}

async fn start_in(
    config: ProcessConfig,
    patches: Vec<Value>,
    launch: Launch,
    worktree: Option<Rc<Worktree>>,
) -> Result<Box<dyn Child>, LaunchError> {
    let Launch { request, cancel, context } = launch;
    let cwd = config.run_cwd(&request.parent.cwd)?;
    #[cfg(feature = "mcp-client")]
    let mcp_servers = mcp_servers::for_child(config.mcp_servers.as_deref(), &request)?;
    #[cfg(not(feature = "mcp-client"))]
    let mcp_servers = Vec::new();
    let route = match &request.agent_options {
        Some(options) => config.route.overridden_by(options),
        None => config.route.clone(),
    };
    let mut spawned = spawn(&config.bin, &config.serve_args(), &cwd, config.child_env(), context.track_process())
        .map_err(|error| {
            tracing::warn!(provider = %config.name, %error, "could not spawn a process child");
            let said = redacted(&format!("could not start {}: {error}", config.bin.display()), &config.env);
            LaunchError::Diagnosed(
                Diagnostic::new(&config.name, Stage::Initialize, Category::StartupFailed).with_detail(said),
            )
        })?;
    let (events, received) = mpsc::unbounded_channel();
    // The child's requests for permission are read only when someone above
    // can answer them (and the child is told so).
    let (asks, asked) = match context.approvals().has_approver() {
        true => {
            let (asks, asked) = mpsc::unbounded_channel();
            (Some(asks), Some(asked))
        }
        false => (None, None),
    };
    // The routes lent, and the asks about them (bounded: a child that asks
    // faster than they are heard is read no faster).
    let lent: Rc<[(String, Limiter)]> = config.lent_limiters.iter().cloned().collect();
    let (limit_asks, limits_asked) = match lent.is_empty() {
        true => (None, None),
        false => {
            let (asks, asked) = mpsc::channel(LIMIT_ASKS_QUEUED);
            (Some(asks), Some(asked))
        }
    };
    let (stdin, stdout) = (spawned.stdin.take(), spawned.stdout.take());
    let connection = Connection::start(stdin.expect("piped"), stdout.expect("piped"), events, asks, limit_asks);
    // Heard from the start, until the run ends or the child's wire closes.
    let lending = limits_asked
        .map(|asked| AbortOnDrop(tokio::task::spawn_local(limits::lend(asked, lent.clone(), connection.replier()))));
    let lent_names: Vec<String> = lent.iter().map(|(name, _)| name.clone()).collect();
    let limits: Vec<String> = crate::wire::limit::lendable(&lent_names).cloned().collect();
    let budget = context.budget().map(BudgetLease::remaining);
    // We are inside the run's span: the child's span joins its trace.
    let trace = crate::telemetry::current_trace();
    let init = Initialize {
        protocol_version: PROTOCOL_VERSION,
        route,
        profile: config.profile.clone(),
        patches,
        cwd,
        budget,
        parent_session: request.parent.session_id.clone(),
        traceparent: trace.as_ref().map(|trace| trace.traceparent.clone()),
        tracestate: trace.and_then(|trace| trace.tracestate),
        mcp_servers,
        approvals: asked.is_some(),
        model_route: config.model_route.clone().filter(|route| limits.contains(route)),
        limits,
    };
    let outcome = tokio::select! {
        biased;
        _ = cancel.cancelled() => Err(None),
        outcome = handshake(&connection, &init) => outcome.map_err(Some),
    };
    let session_id = match outcome {
        Ok(session_id) => session_id,
        Err(None) => {
            drop(connection);
            spawned.kill().await;
            return Err(LaunchError::Aborted);
        }
        Err(Some((category, said))) => {
            let account = account_of(&config, &mut spawned, category, said.as_deref()).await;
            // Reap before rejecting: nothing outlives a failed start.
            drop(connection);
            spawned.kill().await;
            let diagnostic = Diagnostic::new(&config.name, Stage::Initialize, category).with_detail(account);
            return Err(LaunchError::Diagnosed(diagnostic));
        }
    };
    // Tripped at cancel and dispose: what the child asked is rejected then.
    let asking = cancel.child_token();
    let answering = asked.map(|asked| {
        let answering =
            approvals::answer_child(asked, context.approvals().clone(), connection.replier(), asking.clone());
        AbortOnDrop(tokio::task::spawn_local(answering))
    });
    Ok(Box::new(ProcessChild {
        id: format!("process:{}:{session_id}", config.name),
        provider: config.name.clone(),
        prompt: RefCell::new(Some(request.prompt)),
        shared: Rc::new(Shared {
            connection,
            stderr: spawned.stderr.clone(),
            spawned: RefCell::new(Some(spawned)),
            report: RefCell::new(StopReport::new().with_children([Branch::unknown(NOT_DISPOSED)])),
        }),
        received: RefCell::new(Some(received)),
        context,
        cancel,
        shutdown_timeout: config.shutdown_timeout,
        grace: (config.dispose_eof_grace, config.dispose_grace),
        env: config.env.clone().into(),
        worktree,
        asking,
        _answering: answering,
        _lending: lending,
    }))
}

/// A task that ends with its owner.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Asks about lent limiters queued at most from one child.
const LIMIT_ASKS_QUEUED: usize = 64;

/// `initialize`: the child's session id, or why it gave none (and its
/// error answer's words, when it gave one). A child that refuses the lent
/// limits (an older peer, which knows no such field) is asked again
/// without them, and keeps its own limits.
async fn handshake(connection: &Connection, init: &Initialize) -> Result<String, (Category, Option<String>)> {
    let params = serde_json::to_value(init).expect("serialisable");
    let mut answer = tokio::time::timeout(HANDSHAKE_TIMEOUT, connection.request("initialize", params)).await;
    if !init.limits.is_empty() && matches!(answer, Ok(Err(WireError::Remote(-32602, _)))) {
        tracing::debug!("a child refused the lent limits: asking again without them");
        let init = Initialize { limits: Vec::new(), model_route: None, ..init.clone() };
        let params = serde_json::to_value(&init).expect("serialisable");
        answer = tokio::time::timeout(HANDSHAKE_TIMEOUT, connection.request("initialize", params)).await;
    }
    match answer {
        Ok(Ok(reply)) => reply["session_id"].as_str().map(str::to_owned).ok_or((Category::Protocol, None)),
        Ok(Err(WireError::Remote(code, message))) => {
            Err((Category::ChildError, Some(format!("the child answered error {code}: {message}"))))
        }
        Ok(Err(WireError::Protocol)) => Err((Category::Protocol, None)),
        Ok(Err(WireError::Closed)) => Err((Category::ChildCrashed, None)),
        Err(_) => Err((Category::TimedOut, None)),
    }
}

/// How long a failed child's exit status and last stderr are waited for.
const ACCOUNT_WAIT: Duration = Duration::from_secs(1);

/// The child's account of a failed start of `category`: `said` (its
/// error answer), how it exited and the tail of its stderr (each waited
/// for a moment), with the values of the environment the
/// provider set for it replaced; the whole logged at debug.
async fn account_of(config: &ProcessConfig, spawned: &mut Spawned, category: Category, said: Option<&str>) -> String {
    // Waited for whatever the category: the wrong program may have
    // answered before it exited, or may live on (then only a moment lost).
    let exit = spawned.exit_within(ACCOUNT_WAIT).await;
    let stderr = match exit {
        Some(_) => spawned.stderr.settled(ACCOUNT_WAIT).await,
        None => spawned.stderr.last_lines(),
    };
    let text = redacted(&account(said, exit, &stderr), &config.env);
    tracing::debug!(provider = %config.name, ?category, account = %text, "a process child failed");
    text
}

struct Shared {
    connection: Connection,
    spawned: RefCell<Option<Spawned>>,
    /// The tail of the child's stderr.
    stderr: StderrTail,
    /// What dispose learned: the runs the child reported, the pid reaped.
    report: RefCell<StopReport>,
}

impl Shared {
    /// The child's account of a run's failure of `category`: after a
    /// crash, how it exited and the rest of its stderr (each waited for a
    /// moment); else its stderr so far; `env`'s values replaced. The whole
    /// is logged at debug.
    async fn account(&self, provider: &str, env: &[(String, String)], category: Category) -> String {
        let (mut exit, mut stderr) = (None, self.stderr.last_lines());
        if category == Category::ChildCrashed {
            let deadline = tokio::time::Instant::now() + ACCOUNT_WAIT;
            exit = loop {
                // Borrowed only for the check: a dispose may need it between.
                let status = self.spawned.try_borrow_mut().ok().and_then(|mut spawned| {
                    spawned.as_mut().and_then(|spawned| spawned.child.try_wait().ok().flatten())
                });
                if let Some(status) = status {
                    break Some(exit_words(status));
                }
                if tokio::time::Instant::now() >= deadline {
                    break None;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            stderr = self.stderr.settled(ACCOUNT_WAIT).await;
        }
        let text = redacted(&account(None, exit, &stderr), env);
        tracing::debug!(%provider, ?category, account = %text, "a process child's run failed");
        text
    }
}

/// A child's runs before its dispose finished (a forced shutdown).
const NOT_DISPOSED: &str = "the serve child was not disposed: its runs are not known";

/// The runs a `shutdown` reply reports (`runs`), or why they are unknown.
fn reported_runs(reply: Option<Result<Value, WireError>>) -> Vec<Branch> {
    match reply {
        Some(Ok(reply)) => match reply.get("runs") {
            Some(runs) => serde_json::from_value(runs.clone()).unwrap_or_else(|_| {
                vec![Branch::unknown("the serve child reported its runs in a form we cannot read")]
            }),
            None => vec![Branch::unknown("the serve child did not report its runs (a peer without receipts)")],
        },
        Some(Err(WireError::Remote(..))) => {
            vec![Branch::unknown("the serve child refused shutdown: its runs are not known")]
        }
        Some(Err(_)) => vec![Branch::unknown("the serve child ended before it reported its runs")],
        None => vec![Branch::unknown("the serve child did not answer shutdown in time: its runs are not known")],
    }
}

struct ProcessChild {
    id: String,
    provider: String,
    prompt: RefCell<Option<Vec<ContentBlock>>>,
    shared: Rc<Shared>,
    received: RefCell<Option<mpsc::UnboundedReceiver<ChildEvent>>>,
    /// Where the child's text, tool calls and delegated runs go as progress.
    context: ProviderContext,
    cancel: CancellationToken,
    shutdown_timeout: Duration,
    grace: (Duration, Duration),
    /// The variables the provider set for the child: their values never
    /// show in an account of its failure.
    env: Rc<[(String, String)]>,
    /// The run's git worktree (`workspace = "worktree"`).
    worktree: Option<Rc<Worktree>>,
    /// Trips at cancel and dispose: the child's pending requests for
    /// permission are rejected (see `approvals.rs`).
    asking: CancellationToken,
    /// Answers the child's requests while the run lives.
    _answering: Option<AbortOnDrop>,
    /// Lends the routes' limiters while the run lives (see `limits.rs`).
    _lending: Option<AbortOnDrop>,
}

impl Child for ProcessChild {
    fn id(&self) -> String {
        self.id.clone()
    }

    fn run(&self) -> LocalBoxFuture<'static, RunResult> {
        let shared = self.shared.clone();
        let prompt = self.prompt.borrow_mut().take().unwrap_or_default();
        let mut received = self.received.borrow_mut().take().expect("run is called once");
        let provider = self.provider.clone();
        let cancel = self.cancel.clone();
        let context = self.context.clone();
        let env = self.env.clone();
        let worktree = self.worktree.clone();
        Box::pin(async move {
            let answer = shared.connection.request("prompt", json!({"prompt": prompt}));
            tokio::pin!(answer);
            let mut transcript = Transcript::default();
            // A cancel that came before the prompt went out (`Child::cancel`
            // can run before this future is first polled) reached a child
            // with no turn to stop: it is sent again once the prompt is.
            let mut cancel_resent = false;
            let replied = loop {
                tokio::select! {
                    biased;
                    replied = &mut answer => break replied,
                    _ = cancel.cancelled(), if !cancel_resent => {
                        cancel_resent = true;
                        shared.connection.notify("cancel", json!({}));
                    }
                    Some(event) = received.recv() => {
                        report(&context, &event);
                        transcript.note(event);
                        if transcript.overflowed {
                            break Err(WireError::Protocol);
                        }
                    }
                }
            };
            while let Ok(event) = received.try_recv() {
                report(&context, &event);
                transcript.note(event);
            }
            let mut result =
                transcript.result(&provider, replied, shared.connection.is_broken(), cancel.is_cancelled());
            if let Some(diagnostic) = result.diagnostic.take() {
                let account = shared.account(&provider, &env, diagnostic.category).await;
                result.diagnostic = Some(diagnostic.with_detail(account));
            }
            if let Some(worktree) = worktree {
                result.workspace = Some(worktree.settle().await);
            }
            result
        })
    }

    fn cancel(&self) {
        self.asking.cancel();
        self.shared.connection.notify("cancel", json!({}));
    }

    fn dispose(&self) -> LocalBoxFuture<'static, Result<(), Failure>> {
        let shared = self.shared.clone();
        let (shutdown_timeout, (eof_grace, grace)) = (self.shutdown_timeout, self.grace);
        let worktree = self.worktree.clone();
        self.asking.cancel();
        Box::pin(async move {
            let released = dispose_child(&shared, shutdown_timeout, (eof_grace, grace)).await;
            // The child is gone: what it left is committed, its worktree removed.
            if let Some(worktree) = worktree {
                worktree.release().await;
            }
            released
        })
    }

    fn stop_report(&self) -> StopReport {
        self.shared.report.take()
    }
}

/// The dispose ladder of a process child: `shutdown`, then EOF, SIGTERM,
/// SIGKILL.
async fn dispose_child(
    shared: &Shared,
    shutdown_timeout: Duration,
    (eof_grace, grace): (Duration, Duration),
) -> Result<(), Failure> {
    let reply = tokio::time::timeout(shutdown_timeout, shared.connection.request("shutdown", json!({}))).await;
    let runs = reported_runs(reply.ok());
    let spawned = shared.spawned.borrow_mut().take();
    let Some(spawned) = spawned else {
        shared.connection.close_input().await;
        *shared.report.borrow_mut() = StopReport::new().with_children(runs);
        return Ok(());
    };
    let pid = spawned.pid;
    // The ladder looks for the child's descendants before its input
    // closes: a child exiting at EOF would orphan them.
    let close_input = shared.connection.close_input();
    let released = spawned.dispose(close_input, || tokio::time::sleep(eof_grace), grace).await;
    // The ladder reaps the child whether or not its group went quietly.
    *shared.report.borrow_mut() = StopReport::new().with_process(pid).with_children(runs);
    released
}

/// The child's streamed text, tool calls and delegated runs, as this
/// run's progress.
fn report(context: &ProviderContext, event: &ChildEvent) {
    let update = match event {
        ChildEvent::TextDelta { text } => ProgressUpdate::MessageChunk { text: text.clone() },
        ChildEvent::ToolCall { name, status } => ProgressUpdate::ToolCall { name: name.clone(), status: *status },
        ChildEvent::Delegated { update } => ProgressUpdate::Delegated { update: Box::new(update.clone()) },
        ChildEvent::AssistantMessage { .. } | ChildEvent::TurnEnd { .. } => return,
    };
    context.progress(update);
}

/// What the child said during one turn.
#[derive(Default)]
struct Transcript {
    last_message: Option<String>,
    streamed: String,
    turn_end: Option<TurnEndReason>,
    /// The child streamed more than [`MAX_OUTPUT`].
    overflowed: bool,
    /// Tool calls the child reported failed.
    tool_calls_failed: u32,
}

impl Transcript {
    fn note(&mut self, event: ChildEvent) {
        match event {
            ChildEvent::TextDelta { text } => {
                if self.streamed.len() + text.len() > MAX_OUTPUT {
                    self.overflowed = true;
                } else {
                    self.streamed.push_str(&text);
                }
            }
            ChildEvent::AssistantMessage { text } if !text.trim().is_empty() => self.last_message = Some(text),
            ChildEvent::TurnEnd { reason } => self.turn_end = Some(reason),
            ChildEvent::ToolCall { status: ToolCallStatus::Failed, .. } => {
                self.tool_calls_failed = self.tool_calls_failed.saturating_add(1);
            }
            _ => {}
        }
    }

    fn result(self, provider: &str, replied: Result<Value, WireError>, broken: bool, cancelled: bool) -> RunResult {
        let self_overflowed = self.overflowed;
        let answered = replied.as_ref().ok().and_then(|r| TurnEndReason::deserialize(&r["reason"]).ok());
        let stop_reason = answered.or(self.turn_end).map_or(StopReason::Error, StopReason::from);
        let text = self.last_message.unwrap_or(self.streamed);
        // A peer that reports no usage (an older one) spent nothing we know of.
        let usage = replied.as_ref().ok().and_then(|r| RunUsage::deserialize(&r["usage"]).ok()).unwrap_or_default();
        let diagnostic = (stop_reason == StopReason::Error && !cancelled).then(|| {
            let category = match replied {
                Err(WireError::Closed) => Category::ChildCrashed,
                _ if broken || self_overflowed => Category::Protocol,
                Err(WireError::Protocol) => Category::Protocol,
                _ => Category::ChildError,
            };
            let diagnostic = Diagnostic::new(provider, Stage::SessionRun, category);
            // The child's own account, when it gave one: its category, and
            // a reason kept only as a short line of plain text, nothing
            // `safe_line` would remove (the child is a process, not this crate).
            let told = replied.as_ref().ok().map(|reply| &reply["error"]);
            let told_category = told.and_then(|error| Category::deserialize(&error["category"]).ok());
            let reason = told.and_then(|error| error["reason"].as_str()).filter(|reason| {
                reason.len() <= 200 && matches!(crate::seam::safe_line(reason), std::borrow::Cow::Borrowed(_))
            });
            match (category, told_category) {
                (Category::ChildError, Some(told)) => {
                    let diagnostic = Diagnostic::new(provider, Stage::SessionRun, told);
                    match reason {
                        Some(reason) => diagnostic.with_reason(reason),
                        None => diagnostic,
                    }
                }
                _ => diagnostic,
            }
        });
        RunResult {
            output: if text.is_empty() { Vec::new() } else { vec![ContentBlock::text(text)] },
            structured: None,
            stop_reason,
            diagnostic,
            child_session: None,
            usage,
            tool_calls_failed: self.tool_calls_failed,
            workspace: None,
        }
    }
}
