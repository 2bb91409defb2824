//! MCP servers' tools for children (feature `mcp`): a server speaks the
//! Model Context Protocol as a child process on its pipes or over
//! streamable HTTP ([`McpTransport`]), and each tool it lists becomes a
//! [`Tool`] named `mcp__SERVER__TOOL` with the server's description and
//! input schema.
//!
//! **Process**: a stdio server is spawned like every other child of the
//! runtime — the scrubbed environment (an allowlist, plus `inherit_env`,
//! plus `env`), its own process group, stderr drained (only its tail is kept) — and spoken to
//! through rmcp's client over its pipes. Closing climbs the dispose
//! ladder: stdin EOF, SIGTERM to the group, SIGKILL, and nothing of the
//! group survives. A streamable HTTP server is one MCP session on the
//! crate's reqwest, each request with the configured headers (see
//! `http.rs` for redirects, bounds and reconnects); closing ends the
//! session (`DELETE`).
//!
//! **Lifecycle**: an [`McpServer`] starts at its first use (the first run
//! that mounts it), bounded by [`McpServerConfig::initialize_timeout`] for
//! `initialize` and the first `tools/list`. The list is bounded (see
//! `listing.rs`), cached, and fetched again when the server sends
//! `notifications/tools/list_changed` (one refresh at a time, however
//! many notifications): a mounted tool the server no longer lists
//! disappears from the model's list, and one whose description changed is
//! shown changed; a tool the server adds is mounted by the runs that start
//! after it. A call of a tool that is not there is told why: the server
//! did not start (and what failed), it lists the tool but it was left out
//! (and which bound it broke), or it does not list it. A server that
//! dies turns the calls in flight into tool errors the model reads (the
//! run goes on) and is started again at the next call, after a backoff
//! that doubles with each death in a row (100 ms up to 5 s).
//!
//! **Calls** are bounded: [`McpServerConfig::call_timeout`] (then the
//! server is sent `notifications/cancelled` and the model a tool error),
//! [`McpServerConfig::max_result_bytes`] of text; a cancelled turn drops
//! its calls, and dropping a call sends `notifications/cancelled` for it.
//!
//! **Inheritance**, as Claude Code does it: a `spawn` or `fork` child
//! mounts its parent agent's servers (those whose tools the parent may
//! see, each the same connection, never a second process — a server with
//! `isolate` is started afresh for the child), unless its provider scopes
//! them (`InProcessProvider::with_mcp_servers`, an empty list meaning
//! none) or its start request does (`StartRequest::with_mcp_servers`, a
//! subset of what it would mount otherwise; a name not among them is
//! refused at start). The tool filter and the depth rules apply to
//! mounted tools as to any. An `acp` child gets its provider's servers
//! only (its agent starts them); a `process` child gets the servers an
//! in-process child would, as copies its own runtime starts.
//!
//! **Failures**: a server that dies (a stdio process exiting, an HTTP
//! connection or event stream broken past its reconnects) turns the calls
//! in flight into tool errors; the next call starts it (or a new session)
//! after the backoff.
//!
//! Any agent an embedder builds can mount one itself:
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use subagents::agent::{Agent, McpServer, McpServerConfig, ScriptedModel};
//!
//! let server = McpServer::new(McpServerConfig::new("files", "mcp-files", vec!["/srv".to_owned()]));
//! let mut builder = Agent::builder(ScriptedModel::demo());
//! for tool in server.tools().await? {
//!     // Starts it once: `mcp__files__read`, …
//!     builder.toolset_mut().add_shared(tool)?;
//! }
//! let agent = builder.build()?;
//! # drop(agent);
//! server.shutdown().await; // the owner closes it: EOF, SIGTERM, SIGKILL
//! # Ok(()) }
//! ```

mod catalog;
mod error;
mod http;
mod listing;
mod render;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use futures_util::future::BoxFuture;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{NotificationContext, Peer, RoleClient, RunningService};
use rmcp::{ClientHandler, ServiceExt};
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use error::{McpServerError, McpStartError};

use self::catalog::{Catalog, Listed};
use super::{Tool, ToolContext, ToolOutput, ToolSpec};
use crate::child_process::{spawn, ChildEnv, Spawned};
use crate::live::{LiveCounters, ProcessLease};

/// The prefix of every MCP tool's name: `mcp__SERVER__TOOL`.
pub const MCP_TOOL_PREFIX: &str = "mcp__";

/// How long a closing server has after EOF, then after SIGTERM.
const CLOSE_EOF_GRACE: Duration = Duration::from_secs(2);
const CLOSE_TERM_GRACE: Duration = Duration::from_secs(2);

/// One MCP server: how to reach it and how its calls are bounded.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct McpServerConfig {
    /// Its name: the `SERVER` in `mcp__SERVER__TOOL` (letters, digits, `_`, `-`).
    pub name: String,
    /// A child process on its pipes, or a streamable HTTP endpoint.
    pub transport: McpTransport,
    /// One connection per run instead of one per provider shared by its runs.
    pub isolate: bool,
    /// Bounds `initialize` and the first `tools/list` (default 10 s).
    pub initialize_timeout: Duration,
    /// Bounds each `tools/call` (default 60 s).
    pub call_timeout: Duration,
    /// The most result text a call passes to the model (default 64 KiB).
    pub max_result_bytes: usize,
}

/// How an MCP server is reached.
#[derive(Clone)]
#[non_exhaustive]
pub enum McpTransport {
    /// A child process speaking on its stdin and stdout.
    Stdio {
        /// The program.
        command: PathBuf,
        /// Its arguments.
        args: Vec<String>,
        /// Variables set as given (after the scrub).
        env: Vec<(String, String)>,
        /// Names or `PREFIX*` patterns inherited beyond the allowlist
        /// (never a credential-shaped one).
        inherit_env: Vec<String>,
        /// Where it runs; default: the child's working directory for a
        /// per-run server, the runtime's for a shared one.
        cwd: Option<PathBuf>,
    },
    /// Streamable HTTP: JSON-RPC posted to `url`, answers as JSON or an
    /// event stream.
    Http {
        /// An `http://` or `https://` URL.
        url: String,
        /// Sent with every request (an `Authorization` header, say); not
        /// `Accept`, `Mcp-Session-Id`, `Mcp-Protocol-Version` or
        /// `Last-Event-Id`, which the protocol sets.
        headers: Vec<(String, String)>,
    },
}

impl std::fmt::Debug for McpTransport {
    /// Header values and variables are left out: they may be credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            McpTransport::Stdio { command, args, env, inherit_env, cwd } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("args", args)
                .field("env", &env.iter().map(|(name, _)| name).collect::<Vec<_>>())
                .field("inherit_env", inherit_env)
                .field("cwd", cwd)
                .finish(),
            McpTransport::Http { url, headers } => f
                .debug_struct("Http")
                .field("url", url)
                .field("headers", &headers.iter().map(|(name, _)| name).collect::<Vec<_>>())
                .finish(),
        }
    }
}

impl McpServerConfig {
    /// `command args…` on its pipes, shared by a provider's runs, with the
    /// default bounds.
    pub fn new(name: impl Into<String>, command: impl Into<PathBuf>, args: Vec<String>) -> Self {
        let transport =
            McpTransport::Stdio { command: command.into(), args, env: Vec::new(), inherit_env: Vec::new(), cwd: None };
        McpServerConfig::over(name, transport)
    }

    /// The streamable HTTP server at `url`, no headers, shared by a
    /// provider's runs, with the default bounds.
    pub fn http(name: impl Into<String>, url: impl Into<String>) -> Self {
        McpServerConfig::over(name, McpTransport::Http { url: url.into(), headers: Vec::new() })
    }

    /// The server reached over `transport`, shared by a provider's runs,
    /// with the default bounds.
    pub fn over(name: impl Into<String>, transport: McpTransport) -> Self {
        McpServerConfig {
            name: name.into(),
            transport,
            isolate: false,
            initialize_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(60),
            max_result_bytes: 64 * 1024,
        }
    }
}

/// A connection to one MCP server, started at first use. Cloning shares it.
#[derive(Clone)]
pub struct McpServer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpServer").field("name", &self.shared.config.name).finish_non_exhaustive()
    }
}

struct Shared {
    config: McpServerConfig,
    cwd: Option<PathBuf>,
    slot: tokio::sync::Mutex<Slot>,
    /// The last `tools/list`, each tool as the model is shown it.
    listed: RwLock<Arc<Catalog>>,
    /// Why its last start failed, until one succeeds.
    start_failure: Mutex<Option<String>>,
    /// Where the server's process is counted while it lives (the
    /// runtime's `live()` once a run mounted it).
    counters: Mutex<Arc<LiveCounters>>,
}

/// Where the connection stands.
enum Phase {
    /// Not started, or dead and waiting for its next call.
    Down,
    /// Initialized.
    Up(Arc<Connection>),
    /// Shut down for good.
    Closed,
}

struct Slot {
    phase: Phase,
    /// Deaths (or failed starts) in a row: the next start waits for the backoff.
    failures: u32,
    restart_at: Option<Instant>,
    generation: u64,
}

struct Connection {
    generation: u64,
    peer: Peer<RoleClient>,
    service: Mutex<Option<RunningService<RoleClient, Listener>>>,
    process: Mutex<Option<Spawned>>,
}

impl Connection {
    fn alive(&self) -> bool {
        !self.peer.is_transport_closed()
    }

    /// Closes the session (stdin EOF) and climbs the dispose ladder.
    async fn close(&self) {
        let service = self.service.lock().unwrap_or_else(|e| e.into_inner()).take();
        let end_session = async move {
            if let Some(mut service) = service {
                let _ = service.close_with_timeout(CLOSE_EOF_GRACE).await;
            }
        };
        let process = self.process.lock().unwrap_or_else(|e| e.into_inner()).take();
        let Some(process) = process else { return end_session.await };
        // The ladder looks for the server's descendants before the session
        // ends: a server exiting at EOF would orphan them.
        if process.dispose(end_session, || tokio::time::sleep(CLOSE_EOF_GRACE), CLOSE_TERM_GRACE).await.is_err() {
            tracing::error!("an MCP server's process tree survived its dispose");
        }
    }
}

/// The client side's handler: a changed tool list is fetched again.
struct Listener {
    shared: Weak<Shared>,
    generation: u64,
    refreshes: Arc<listing::Refreshes>,
}

impl ClientHandler for Listener {
    async fn on_tool_list_changed(&self, context: NotificationContext<RoleClient>) {
        let Some(shared) = self.shared.upgrade() else { return };
        if !self.refreshes.ask() {
            return;
        }
        let (peer, generation, refreshes) = (context.peer, self.generation, self.refreshes.clone());
        // Listing from inside the handler would wait on the loop that runs it.
        tokio::spawn(async move {
            loop {
                shared.refresh(&peer, generation).await;
                if !refreshes.again() {
                    break;
                }
            }
        });
    }
}

impl Shared {
    fn store(&self, listing: listing::Listing) {
        let catalog = Catalog::of(&self.config.name, listing);
        *self.listed.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(catalog);
    }

    fn catalog(&self) -> Arc<Catalog> {
        self.listed.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The listing again, after `notifications/tools/list_changed`; kept
    /// if the connection it came over is still the server's.
    async fn refresh(&self, peer: &Peer<RoleClient>, generation: u64) {
        let (server, timeout) = (&self.config.name, self.config.initialize_timeout);
        match tokio::time::timeout(timeout, listing::list(peer)).await {
            Ok(Ok(listing)) => {
                if self.slot.lock().await.generation == generation {
                    self.store(listing);
                }
            }
            Ok(Err(error)) => tracing::warn!(%server, error = %untrusted(&error), "tools/list failed"),
            Err(_) => tracing::warn!(%server, "tools/list timed out"),
        }
    }
}

impl McpServer {
    /// A server not yet started; its first use starts it.
    pub fn new(config: McpServerConfig) -> Self {
        McpServer::in_dir(config, None)
    }

    /// A server that runs in `cwd` unless its config names a directory.
    pub(crate) fn in_dir(config: McpServerConfig, cwd: Option<PathBuf>) -> Self {
        let slot = Slot { phase: Phase::Down, failures: 0, restart_at: None, generation: 0 };
        let shared = Shared {
            config,
            cwd,
            slot: tokio::sync::Mutex::new(slot),
            listed: RwLock::default(),
            start_failure: Mutex::default(),
            counters: Mutex::default(),
        };
        McpServer { shared: Arc::new(shared) }
    }

    /// Its configuration.
    pub fn config(&self) -> &McpServerConfig {
        &self.shared.config
    }

    /// Counts its process in `live` (a runtime's) from its next start on.
    pub(crate) fn count_in(&self, live: &Arc<LiveCounters>) {
        let mut counters = self.shared.counters.lock().unwrap_or_else(|e| e.into_inner());
        if !Arc::ptr_eq(&counters, live) {
            *counters = live.clone();
        }
    }

    /// Its tools as the agent loop takes them, starting it if needed (a
    /// server that cannot start is the error). A tool whose name does not
    /// fit `mcp__SERVER__TOOL` in 64 letters, digits, `_` and `-`, or whose
    /// schema is over 64 KiB of JSON, is left out (warned).
    pub async fn tools(&self) -> Result<Vec<Arc<dyn Tool>>, McpServerError> {
        self.connection(Backoff::Wait).await?;
        Ok(self.listed_tools())
    }

    /// Its tools for a run about to start: a server waiting out its
    /// backoff is not waited for (nor one that just failed to start
    /// retried), and what it listed last is mounted — a call starts it
    /// again. Never listed and not starting: the error.
    pub(crate) async fn tools_for_run(&self) -> Result<Vec<Arc<dyn Tool>>, McpServerError> {
        match self.connection(Backoff::Skip).await {
            Ok(_) => Ok(self.listed_tools()),
            Err(_) if !self.shared.catalog().tools.is_empty() => Ok(self.listed_tools()),
            Err(error) => Err(error),
        }
    }

    fn listed_tools(&self) -> Vec<Arc<dyn Tool>> {
        let catalog = self.shared.catalog();
        let tool = |listed: &Listed| -> Arc<dyn Tool> {
            let (remote, spec, read_only) = (listed.remote.clone(), listed.spec.clone(), listed.read_only);
            Arc::new(McpTool { server: self.clone(), remote, spec, read_only })
        };
        catalog.tools.iter().map(tool).collect()
    }

    /// Why it has no tool `remote` to call, as a model and the log are told.
    pub(crate) fn why_missing(&self, remote: &str) -> String {
        if let Some(failure) = self.shared.start_failure.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return failure;
        }
        self.shared.catalog().why_missing(&self.shared.config.name, remote)
    }

    /// Closes the connection and reaps the process group; later calls fail.
    pub async fn shutdown(&self) {
        let previous = std::mem::replace(&mut self.shared.slot.lock().await.phase, Phase::Closed);
        if let Phase::Up(connection) = previous {
            connection.close().await;
        }
    }

    /// The live connection: started (or restarted after its backoff) if needed.
    async fn connection(&self, patience: Backoff) -> Result<Arc<Connection>, McpServerError> {
        let server = || self.shared.config.name.clone();
        let mut slot = self.shared.slot.lock().await;
        match &slot.phase {
            Phase::Up(connection) if connection.alive() => return Ok(connection.clone()),
            Phase::Closed => return Err(McpServerError::ShutDown { server: server() }),
            Phase::Up(_) => self.mark_dead(&mut slot),
            Phase::Down => {}
        }
        match (slot.restart_at, patience) {
            (Some(at), Backoff::Skip) if at > Instant::now() => {
                return Err(McpServerError::BackingOff { server: server() });
            }
            (Some(at), _) => tokio::time::sleep_until(at).await,
            (None, _) => {}
        }
        slot.generation += 1;
        let started = self.start(slot.generation).await;
        let mut start_failure = self.shared.start_failure.lock().unwrap_or_else(|e| e.into_inner());
        match started {
            Ok(connection) => {
                slot.phase = Phase::Up(connection.clone());
                slot.restart_at = None;
                *start_failure = None;
                Ok(connection)
            }
            Err(reason) => {
                slot.failures += 1;
                slot.restart_at = Some(Instant::now() + backoff(slot.failures));
                let error = McpServerError::DidNotStart { server: server(), reason };
                *start_failure = Some(error.to_string());
                Err(error)
            }
        }
    }

    /// A connection found dead: its process is reaped in the background
    /// and the next start waits for the backoff.
    fn mark_dead(&self, slot: &mut Slot) {
        if let Phase::Up(connection) = std::mem::replace(&mut slot.phase, Phase::Down) {
            slot.failures += 1;
            slot.restart_at = Some(Instant::now() + backoff(slot.failures));
            tracing::warn!(server = %self.shared.config.name, "an MCP server died; it restarts at the next call");
            tokio::spawn(async move { connection.close().await });
        }
    }

    async fn start(&self, generation: u64) -> Result<Arc<Connection>, McpStartError> {
        let config = &self.shared.config;
        let listener = Listener { shared: Arc::downgrade(&self.shared), generation, refreshes: Arc::default() };
        let (service, listing, process) = match &config.transport {
            McpTransport::Stdio { command, args, env, inherit_env, cwd } => {
                let cwd = match cwd.clone().or_else(|| self.shared.cwd.clone()) {
                    Some(cwd) => cwd,
                    None => std::env::current_dir().map_err(McpStartError::NoWorkingDirectory)?,
                };
                let env = ChildEnv { inherit: inherit_env, explicit: env };
                let lease = ProcessLease::new(self.shared.counters.lock().unwrap_or_else(|e| e.into_inner()).clone());
                let mut process = spawn(command, args, &cwd, env, lease)
                    .map_err(|source| McpStartError::Spawn { command: command.clone(), source })?;
                let pipes = (process.stdout.take().expect("piped"), process.stdin.take().expect("piped"));
                match initialize(listener, pipes, config.initialize_timeout).await {
                    Ok((service, listing)) => (service, listing, Some(process)),
                    Err(error) => {
                        process.kill().await;
                        return Err(error);
                    }
                }
            }
            McpTransport::Http { url, headers } => {
                let transport = http::transport(url, headers)?;
                let (service, listing) = initialize(listener, transport, config.initialize_timeout).await?;
                (service, listing, None)
            }
        };
        self.shared.store(listing);
        let peer = service.peer().clone();
        Ok(Arc::new(Connection { generation, peer, service: Mutex::new(Some(service)), process: Mutex::new(process) }))
    }

    /// One `tools/call`; every failure is a tool error the model reads.
    async fn call(&self, tool: &str, arguments: Value, cancel: &CancellationToken) -> ToolOutput {
        let config = &self.shared.config;
        let connection = tokio::select! {
            connection = self.connection(Backoff::Wait) => connection,
            () = cancel.cancelled() => return ToolOutput::error("cancelled"),
        };
        let connection = match connection {
            Ok(connection) => connection,
            Err(error) => return ToolOutput::error(error.to_string()),
        };
        let mut params = CallToolRequestParams::new(tool.to_owned());
        if let Value::Object(arguments) = arguments {
            params = params.with_arguments(arguments);
        }
        // Inside the tool call's span: the server's work joins its trace.
        if let Some(trace) = crate::telemetry::current_trace() {
            let meta = rmcp::model::MetaObject(trace.into_meta());
            params.meta = Some(rmcp::model::RequestMetaObject(meta));
        }
        // Dropping the call (a cancel, the timeout) sends notifications/cancelled.
        let answer = tokio::select! {
            answer = connection.peer.call_tool(params) => answer,
            () = cancel.cancelled() => return ToolOutput::error("cancelled"),
            () = tokio::time::sleep(config.call_timeout) => {
                return ToolOutput::error(format!(
                    "the MCP server {:?} did not answer {tool:?} within {:?}", config.name, config.call_timeout
                ));
            }
        };
        match answer {
            Ok(result) => {
                let mut slot = self.shared.slot.lock().await;
                if slot.generation == connection.generation {
                    slot.failures = 0;
                }
                drop(slot);
                render::render(&result, config.max_result_bytes)
            }
            Err(error) if !connection.alive() || transport_failed(&error) => {
                let mut slot = self.shared.slot.lock().await;
                if slot.generation == connection.generation {
                    self.mark_dead(&mut slot);
                }
                tracing::debug!(server = %config.name, %error, "a call ended with its server");
                ToolOutput::error(match config.transport {
                    McpTransport::Stdio { .. } => format!(
                        "the MCP server {:?} exited during the call to {tool:?}; it is started again at the next call",
                        config.name
                    ),
                    McpTransport::Http { .. } => format!(
                        "the connection to the MCP server {:?} broke during the call to {tool:?}; it is opened \
                         again at the next call",
                        config.name
                    ),
                })
            }
            Err(error) => {
                ToolOutput::error(format!("the MCP server {:?} refused {tool:?}: {}", config.name, untrusted(&error)))
            }
        }
    }
}

impl McpServer {
    /// Whether `other` is this server (one connection, not two alike).
    pub(crate) fn same_as(&self, other: &McpServer) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

/// Starts `configs` together in `cwd` (each server's own `cwd` aside): the
/// servers, and the tools of each that started (one that did not is left
/// out, warned, and still returned to be shut down).
#[cfg(feature = "process")]
pub(crate) async fn start_all(
    configs: Vec<McpServerConfig>,
    cwd: &std::path::Path,
) -> (Vec<McpServer>, Vec<Arc<dyn Tool>>) {
    let servers: Vec<McpServer> =
        configs.into_iter().map(|config| McpServer::in_dir(config, Some(cwd.to_path_buf()))).collect();
    let started = futures_util::future::join_all(servers.iter().map(McpServer::tools)).await;
    let mut tools = Vec::new();
    for (server, listed) in servers.iter().zip(started) {
        match listed {
            Ok(listed) => tools.extend(listed),
            Err(error) => tracing::warn!(server = %server.config().name, %error, "a session's MCP server is left out"),
        }
    }
    (servers, tools)
}

impl super::Toolset {
    /// Mounts `server`'s tools, or notes why it has none (warned): either
    /// way a call of one of its tools that is not there is told why.
    pub(crate) fn mount_mcp(&mut self, server: &McpServer, tools: Result<Vec<Arc<dyn Tool>>, McpServerError>) {
        let name = &server.config().name;
        match tools {
            Ok(tools) => {
                for tool in tools {
                    if let Err(error) = self.add_shared(tool) {
                        tracing::warn!(server = %name, %error, "an MCP tool was not mounted");
                    }
                }
            }
            Err(error) => tracing::warn!(server = %name, %error, "a child starts without an MCP server's tools"),
        }
        self.note_mcp_server(server);
    }

    /// Remembers `server` as mounted (its tools added or not): a call of
    /// one of its tools that is not there is told why.
    pub(crate) fn note_mcp_server(&mut self, server: &McpServer) {
        if !self.mcp_mounted.iter().any(|known| known.same_as(server)) {
            Arc::make_mut(&mut self.mcp_mounted).push(server.clone());
        }
    }

    /// Why there is no tool `name`, when it names a mounted MCP server.
    pub(super) fn why_mcp_missing(&self, name: &str) -> Option<String> {
        let (server, remote) = name.strip_prefix(MCP_TOOL_PREFIX)?.split_once("__")?;
        let mounted = self.mcp_mounted.iter().find(|known| known.config().name == server)?;
        Some(mounted.why_missing(remote))
    }

    /// The MCP servers its tools come from, each once, in mount order:
    /// only those with a tool its filter lets it see.
    pub fn mcp_servers(&self) -> Vec<McpServer> {
        let mut servers: Vec<McpServer> = Vec::new();
        for entry in self.entries.iter().filter(|entry| self.permits(entry)) {
            let Some(server) = entry.tool.mcp_server() else { continue };
            if !servers.iter().any(|known| known.same_as(&server)) {
                servers.push(server);
            }
        }
        servers
    }
}

/// Whether a start waits out the backoff of a server that keeps dying.
#[derive(Clone, Copy)]
enum Backoff {
    Wait,
    Skip,
}

/// The wait before the next start after `failures` deaths in a row.
fn backoff(failures: u32) -> Duration {
    let doubled = 100u64.saturating_mul(1 << failures.saturating_sub(1).min(10));
    Duration::from_millis(doubled.min(5_000))
}

/// Whether a call failed because its connection did (not the server
/// answering with an error).
fn transport_failed(error: &rmcp::ServiceError) -> bool {
    matches!(error, rmcp::ServiceError::TransportClosed | rmcp::ServiceError::TransportSend(_))
}

/// `initialize` and the first `tools/list` over `transport`, within `timeout`.
async fn initialize<T, E, A>(
    listener: Listener,
    transport: T,
    timeout: Duration,
) -> Result<(RunningService<RoleClient, Listener>, listing::Listing), McpStartError>
where
    T: rmcp::transport::IntoTransport<RoleClient, E, A>,
    E: std::error::Error + Send + Sync + 'static,
{
    let started = tokio::time::timeout(timeout, async {
        let service = listener.serve(transport).await.map_err(|error| {
            // The transport's own words, without the SDK's type names.
            let said = match &error {
                rmcp::service::ClientInitializeError::TransportError { error, .. } => untrusted(&error.error),
                error => untrusted(error),
            };
            McpStartError::Initialize(said)
        })?;
        let listing = listing::list(service.peer()).await.map_err(|e| McpStartError::ListTools(untrusted(&e)))?;
        Ok((service, listing))
    });
    started.await.map_err(|_| McpStartError::Timeout(timeout))?
}

/// An error that may quote the server, made fit for a model to read:
/// escapes and control and bidi characters dropped (`seam::safe_line`), at
/// most 300 bytes.
fn untrusted(error: &dyn std::fmt::Display) -> String {
    crate::seam::cut(&crate::seam::safe_line(&error.to_string()), 300).to_owned()
}

/// One of a server's tools in an agent's tool set.
struct McpTool {
    server: McpServer,
    /// The server's name for it.
    remote: String,
    /// The spec when mounted.
    spec: ToolSpec,
    read_only: bool,
}

impl Tool for McpTool {
    fn mcp_server(&self) -> Option<McpServer> {
        Some(self.server.clone())
    }

    fn spec(&self) -> ToolSpec {
        let catalog = self.server.shared.catalog();
        let current = catalog.find(&self.remote);
        current.map_or_else(|| self.spec.clone(), |tool| tool.spec.clone())
    }

    fn concurrent(&self) -> bool {
        self.read_only
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn dynamic(&self) -> bool {
        true
    }

    fn available(&self) -> bool {
        self.server.shared.catalog().find(&self.remote).is_some()
    }

    fn call(&self, arguments: Value, context: ToolContext) -> BoxFuture<'_, ToolOutput> {
        Box::pin(async move { self.server.call(&self.remote, arguments, &context.cancel).await })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_a_tenth_of_a_second_to_five() {
        let waits: Vec<u64> = (1..=8).map(|n| backoff(n).as_millis() as u64).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        assert_eq!(backoff(u32::MAX), Duration::from_secs(5));
    }

    #[test]
    fn a_server_name_is_one_part_of_a_tool_name() {
        assert!(crate::agent::valid_server_name("git-hub_2"));
        assert!(!crate::agent::valid_server_name("a__b"));
        assert!(!crate::agent::valid_server_name("") && !crate::agent::valid_server_name("a.b"));
    }
}
