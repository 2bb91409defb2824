//! `subagents a2a --listen ADDR`: this runtime as an Agent2Agent (A2A 1.0)
//! server, the counterpart of the `a2a` provider.
//!
//! # What maps to what
//!
//! - The agent card (`GET /.well-known/agent-card.json`, public) lists one
//!   skill per provider the door offers (a configuration's `[tool]`
//!   providers, or the one `--provider` names; without a file, `spawn`),
//!   `capabilities.streaming: true`, and one interface:
//!   `protocolBinding: "JSONRPC"`, `protocolVersion: "1.0"`, at `POST /`.
//! - A message (`SendMessage`, `SendStreamingMessage`) is a new task and a
//!   new run: its text parts are the prompt, `metadata.skill` picks the
//!   provider (default: the first), `metadata.outputSchema` is the run's
//!   output schema. The run's progress chunks are `TASK_STATE_WORKING`
//!   status updates with the text; its end is an `output` artifact (the
//!   text) and, with a structured value, a `structured` artifact holding
//!   one data part, then the final status: completed → `COMPLETED`,
//!   aborted → `CANCELED`, error → `FAILED` with the diagnostic as the
//!   status message (made safe to show, [`crate::seam::safe_line`]: a client
//!   prints it), max-tokens → `FAILED`, refusal → `REJECTED`.
//! - `GetTask`, `ListTasks` (newest first, `contextId` and `status`
//!   filters, `pageSize` ≤ 100, offset page tokens), `CancelTask` (cancels
//!   the run; answers the task once it settled, at most 10 s later) and
//!   `SubscribeToTask` (the task, then its events).
//! - Tasks are kept in memory, at most `max_tasks` (1000) holding at most
//!   `max_task_bytes` (256 MiB) of messages and artifacts together; an
//!   ended task leaves `task_ttl` (1 h) after it ended, or sooner to make
//!   room, oldest first. A store full of live tasks refuses new messages
//!   (`-32603`).
//!
//! # Security
//!
//! With a token (`--token-env NAME`: the token is that variable's value),
//! every JSON-RPC request needs `Authorization: Bearer TOKEN` (the scheme
//! in any case, as RFC 9110 has it; else HTTP 401), and the card declares a
//! bearer scheme. Without one the server
//! listens only on a loopback address: any other is refused before it
//! starts. Requests are bounded in bytes (4 MiB) and in time (10 s for the
//! headers, `body_timeout` (30 s) for the body: `408`), connections to
//! `max_connections` (1024) at once, a new one taking the slot of the
//! oldest that has not sent a whole request (`slots`); `A2A-Version`, when
//! sent, must be 1.x (`-32009`).
//!
//! # Shutdown
//!
//! SIGINT, SIGTERM or SIGHUP: no new connections; every live run is
//! cancelled, so its streams get its final `CANCELED` status; a stream
//! still open after the grace gets the task as it stands, and ends.
//!
//! # Permission requests
//!
//! A run's descendant that asks for permission turns the task
//! `TASK_STATE_INPUT_REQUIRED`, the question its status message; a message
//! naming the task (`taskId`) answers it and the task resumes (see
//! `a2a/questions.rs`).
//!
//! Only a client the door authenticated is asked: without a token, any
//! local process could connect and answer, so no request is put to a
//! client and the providers' policies decide alone (`ask` is a reject),
//! unless the user explicitly allows it
//! ([`A2aServeOptions::approvals_without_auth`], `--approvals-without-auth`).
//!
//! # Not supported
//!
//! Multi-turn beyond answering a question (any other message naming a
//! `taskId` is refused), push notifications, the extended card, the
//! HTTP+JSON and gRPC bindings, file parts and tenants.

mod http;
mod questions;
mod rpc;
mod slots;
mod store;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use self::rpc::Service;
use self::store::Store;
use super::ServeError;
use crate::agent::ModelSpec;
use crate::config::Configured;
use crate::tool::TaskService;
use crate::wire::a2a::{AgentCapabilities, AgentCard, AgentInterface, AgentSkill, JSONRPC, VERSION};
use crate::Runtime;

/// How `subagents a2a` serves.
pub struct A2aServeOptions {
    /// Where to listen (`127.0.0.1:PORT`; port 0 picks one).
    pub listen: SocketAddr,
    /// The configuration's providers; `None`: a `spawn` provider on `model`.
    pub configured: Option<Configured>,
    /// The children's model, for providers without their own.
    pub model: String,
    /// The runtime's home.
    pub home: Option<PathBuf>,
    /// The bearer token every JSON-RPC request must carry; required unless
    /// `listen` is a loopback address.
    pub token: Option<String>,
    /// The URL the card gives for the JSON-RPC interface (default
    /// `http://{listen}/`).
    pub public_url: Option<String>,
    /// Put the runs' permission requests to clients although no token
    /// authenticates them (any local process could answer them); without
    /// it, a door without a token offers no approvals (false).
    pub approvals_without_auth: bool,
    /// Most tasks kept (1000).
    pub max_tasks: usize,
    /// How long an ended task is kept (1 h).
    pub task_ttl: Duration,
    /// Most bytes of messages and artifacts the kept tasks hold together (256 MiB).
    pub max_task_bytes: usize,
    /// Most connections served at once (1024); when all are taken, a new
    /// one takes the slot of the oldest that has not sent a whole request.
    pub max_connections: usize,
    /// How long a client may take to send a request's body once its
    /// headers arrived (30 s).
    pub body_timeout: Duration,
    /// How long live runs get to settle at shutdown (5 s).
    pub shutdown_grace: Duration,
}

impl std::fmt::Debug for A2aServeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The token is a credential: only whether there is one.
        f.debug_struct("A2aServeOptions")
            .field("listen", &self.listen)
            .field("configured", &self.configured)
            .field("model", &self.model)
            .field("home", &self.home)
            .field("token", &self.token.as_ref().map(|_| "set"))
            .field("public_url", &self.public_url)
            .field("approvals_without_auth", &self.approvals_without_auth)
            .field("max_tasks", &self.max_tasks)
            .field("task_ttl", &self.task_ttl)
            .field("max_task_bytes", &self.max_task_bytes)
            .field("max_connections", &self.max_connections)
            .field("body_timeout", &self.body_timeout)
            .finish_non_exhaustive()
    }
}

impl A2aServeOptions {
    /// Defaults for serving on `listen`.
    pub fn new(listen: SocketAddr) -> Self {
        A2aServeOptions {
            listen,
            configured: None,
            model: "scripted".to_owned(),
            home: None,
            token: None,
            public_url: None,
            approvals_without_auth: false,
            max_tasks: 1000,
            task_ttl: Duration::from_secs(3600),
            max_task_bytes: 256 << 20,
            max_connections: 1024,
            body_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

/// Serves until a stop signal; `ready` gets the bound address first.
/// Refused before anything starts: a non-loopback address without a token.
pub fn serve_a2a(options: A2aServeOptions, ready: impl FnOnce(SocketAddr)) -> Result<(), ServeError> {
    if options.token.is_none() && !options.listen.ip().is_loopback() {
        let reason = format!(
            "refusing to listen on {} without a token: give --token-env NAME, or listen on a loopback address",
            options.listen
        );
        return Err(ServeError::Options(reason));
    }
    if options.max_tasks == 0 || options.max_task_bytes == 0 || options.max_connections == 0 {
        let reason = "max_tasks, max_task_bytes or max_connections is 0: every message would be refused";
        return Err(ServeError::Options(reason.to_owned()));
    }
    let cwd = std::env::current_dir().map_err(|e| ServeError::Options(format!("no working directory: {e}")))?;
    let mut builder = Runtime::builder();
    if let Some(home) = &options.home {
        builder = builder.home(home);
    }
    let runtime = builder.build().map_err(ServeError::Runtime)?;
    let registered = register(&runtime, &options);
    let skills = match registered {
        Ok(skills) => skills,
        Err(error) => {
            runtime.shutdown_blocking();
            return Err(error);
        }
    };
    let io = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("subagents-a2a")
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    let closing = CancellationToken::new();
    let store = Store::new(options.max_tasks, options.max_task_bytes, options.task_ttl);
    let service = Arc::new(Service {
        subagents: runtime.subagents(),
        skills,
        questions: questions::Questions::new(store.clone()),
        offers_approvals: options.token.is_some() || options.approvals_without_auth,
        store,
        cwd,
        closing: closing.clone(),
    });
    let served = io.block_on(http::serve(service, &options, ready));
    io.shutdown_timeout(Duration::from_secs(1));
    runtime.shutdown_blocking();
    served
}

/// Registers the door's providers: the skills, the default first.
fn register(runtime: &Runtime, options: &A2aServeOptions) -> Result<Vec<String>, ServeError> {
    let subagents = runtime.subagents();
    let model = ModelSpec::parse(&options.model)?.build()?;
    super::preflight::check_home(&runtime.home())?;
    match &options.configured {
        Some(configured) => {
            let tasks = TaskService::new();
            configured
                .register_blocking(&subagents, &tasks, &runtime.home(), model)
                .map_err(|e| ServeError::Options(e.to_string()))?;
            Ok(configured.offered.clone())
        }
        None => {
            crate::tool::register_delegating_spawn(&subagents, &TaskService::new(), model)?;
            Ok(vec!["spawn".to_owned()])
        }
    }
}

/// The card this server publishes.
fn card(skills: &[String], url: &str, with_token: bool) -> AgentCard {
    let skills = skills
        .iter()
        .map(|name| AgentSkill {
            id: name.clone(),
            name: name.clone(),
            description: format!("Runs the message as a subagent on provider {name:?}."),
            tags: vec!["subagents".to_owned()],
            output_modes: Vec::new(),
        })
        .collect();
    let (security_schemes, security_requirements) = match with_token {
        true => (
            Some(serde_json::json!({"bearer": {"httpAuthSecurityScheme": {"scheme": "Bearer"}}})),
            Some(serde_json::json!([{"schemes": {"bearer": {"list": []}}}])),
        ),
        false => (None, None),
    };
    AgentCard {
        name: "subagents".to_owned(),
        description: "A supervised runtime of subagents: each message runs as one child run.".to_owned(),
        supported_interfaces: vec![AgentInterface {
            url: url.to_owned(),
            protocol_binding: JSONRPC.to_owned(),
            protocol_version: VERSION.to_owned(),
        }],
        version: env!("CARGO_PKG_VERSION").to_owned(),
        capabilities: AgentCapabilities { streaming: Some(true), push_notifications: Some(false) },
        default_input_modes: vec!["text/plain".to_owned()],
        default_output_modes: vec!["text/plain".to_owned(), "application/json".to_owned()],
        skills,
        security_schemes,
        security_requirements,
    }
}
