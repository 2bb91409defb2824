//! `a2a`: each run is a task on a remote agent that speaks the
//! Agent2Agent protocol (A2A), version 1.0 (1.0.1 of the specification).
//!
//! **Choose it** to delegate to an agent that runs elsewhere and publishes
//! an A2A agent card: another vendor's agent, or another `subagents`
//! runtime behind `subagents a2a --listen`.
//!
//! **Advertises** `output_schema` only; a request with one is refused at
//! start (`INVALID_REQUEST`) when the card's output modes, default or any
//! skill's, name no `application/json` (a card that lists no default modes
//! at all is given the benefit of the doubt). The schema travels in the
//! message's `metadata.outputSchema` (not an A2A field: an agent that does
//! not know it may ignore it), and the run completes with a structured value only
//! when a data part of the task's artifacts matches the schema; otherwise
//! it settles `Error` with category `missing-structured-output`. A persona,
//! tool filter, depth limit or route is refused at start: A2A has no field
//! for them.
//!
//! # What it speaks
//!
//! - The card: `GET {url}/.well-known/agent-card.json` (at the first start,
//!   then kept), of which the first `supportedInterfaces` entry with
//!   `protocolBinding` `JSONRPC` and a 1.x `protocolVersion` is used, else
//!   the first `HTTP+JSON` one; a card with neither is refused (gRPC is
//!   not spoken).
//! - JSON-RPC: every method is a `POST` of `{jsonrpc, id, method, params}`
//!   to the interface URL. HTTP+JSON: `POST /message:send`,
//!   `POST /message:stream`, `GET /tasks/{id}`, `POST /tasks/{id}:cancel`,
//!   `GET /tasks/{id}:subscribe` under it, events bare `StreamResponse`s,
//!   errors an HTTP status (its `ErrorInfo` reason read for
//!   `UNSUPPORTED_OPERATION` and `TASK_NOT_FOUND`).
//! - Every request carries `A2A-Version: 1.0` and the configured headers;
//!   with [`A2aConfig::skill`] the message's `metadata.skill` names the
//!   agent's skill (how `subagents a2a` picks a provider).
//! - Redirects are followed (at most 10) only within the origin (scheme,
//!   host and port) the request went to: the headers may be credentials,
//!   so a redirect to another origin fails the card read or the call,
//!   naming that origin, rather than carry them there (or send a request
//!   without them).
//! - The task starts with `SendStreamingMessage` when the card's
//!   `capabilities.streaming` is true, else with `SendMessage` (with
//!   `returnImmediately: true`), followed by `GetTask` polls until the task
//!   is terminal or interrupted. The request is `{message: {messageId,
//!   role: "ROLE_USER", parts: [{text}]}, configuration:
//!   {acceptedOutputModes, returnImmediately}}`.
//! - Events are JSON-RPC responses in `data:` lines, each `result` a
//!   `StreamResponse`: `task`, `message`, `statusUpdate`
//!   (`TaskStatusUpdateEvent`) or `artifactUpdate`
//!   (`TaskArtifactUpdateEvent`, honouring `append`). Status messages' and
//!   artifacts' text parts are reported as `Progress` message chunks.
//! - A stream that breaks (or ends) before the task is terminal is
//!   re-attached with `SubscribeToTask`, up to
//!   [`Limits::resubscribe_attempts`] times, backing off; a task that ended
//!   meanwhile is read with `GetTask`.
//! - Cancel sends `CancelTask` (bounded by [`Limits::cancel_timeout`]); a cancel that comes before the agent has named the task reads on, within that bound, until it does, so the task is never left running unnamed.
//!
//! # How a task's end maps to the run's
//!
//! | task state | run |
//! |---|---|
//! | `TASK_STATE_COMPLETED` | `completed`: the artifacts' text parts, in order, are the output |
//! | `TASK_STATE_CANCELED` | `aborted` |
//! | `TASK_STATE_FAILED`, `TASK_STATE_REJECTED` | `error`, category `child-error`, the agent's status message as the reason, made safe ([`safe_line`](crate::seam::safe_line): escapes, control and bidi characters removed) and cut at 160 bytes |
//! | `TASK_STATE_INPUT_REQUIRED`, `TASK_STATE_AUTH_REQUIRED` | `error`, category `child-error`, saying the task requires input (or authentication), which this provider cannot give; the task is sent `CancelTask`, so it does not wait on the agent for ever |
//! | a `message` instead of a task | `completed` with its text parts |
//!
//! The task id comes back as [`RunResult::child_session`](crate::RunResult::child_session).
//!
//! # Fails and recovers
//!
//! An unreachable agent or a card that is not A2A 1.0 with a JSON-RPC
//! interface fails the start (`STARTUP_FAILED`, stage `initialize`). During
//! the run every wait and size is bounded ([`Limits`]): a silent agent is
//! `timed-out`, an oversized event or artifact set, or a malformed event,
//! is `protocol`; a JSON-RPC error is `child-error` with its code. The
//! agent's own text reaches a diagnostic only as the safe, bounded status
//! message above.
//!
//! # Limits
//!
//! - No multi-turn: a task that asks for input ends the run.
//! - File parts (`raw`, `url`) are counted against the artifact bound but
//!   not returned; only text and data parts are read.
//! - No push notifications, no extended card, no signed-card check, no
//!   `tenant`.
//! - Steering and continuation are not offered.
//! - A run the runtime forces down at shutdown (not cancelled) sends no
//!   `CancelTask`: the task is left to the agent.
//! - Without streaming, a task that never ends is polled until the run is
//!   cancelled: there is no overall deadline besides the caller's.
//!
//! ```no_run
//! use subagents::providers::{A2aConfig, A2aProvider};
//! use subagents::Runtime;
//!
//! let mut config = A2aConfig::new("reviewer", "http://127.0.0.1:8080");
//! config.headers.push(("Authorization".into(), format!("Bearer {}", std::env::var("A2A_TOKEN").unwrap())));
//! let runtime = Runtime::builder().build().unwrap();
//! runtime.subagents().register_provider(A2aProvider::new(config).unwrap()).unwrap().keep();
//! ```

mod child;
pub(crate) mod client;

use std::fmt;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::LocalBoxFuture;

use self::child::{A2aChild, Record, Setup};
use self::client::{Binding, Bounds, Client, Endpoint};
use crate::schema::CompiledSchema;
use crate::seam::{Capabilities, Category, Child, Diagnostic, Launch, LaunchError, Provider, Stage};
use crate::wire::a2a::{self as wire, AgentCard};

/// The bounds of every exchange with the agent.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connecting to the agent (10 s).
    pub connect_timeout: Duration,
    /// Reading the agent card, whole (10 s).
    pub card_timeout: Duration,
    /// From sending the message to its first event, or to a `SendMessage`
    /// / `GetTask` answer (60 s).
    pub first_event_timeout: Duration,
    /// Between two events of a stream (5 min).
    pub idle_timeout: Duration,
    /// A `CancelTask` call (5 s).
    pub cancel_timeout: Duration,
    /// How often a task is read with `GetTask` when the agent does not stream (1 s).
    pub poll_interval: Duration,
    /// The agent card (1 MiB).
    pub max_card_bytes: usize,
    /// One event, or one JSON-RPC answer (4 MiB).
    pub max_event_bytes: usize,
    /// Every part of every artifact the task holds, together (16 MiB): an
    /// artifact replaced counts as its replacement, one appended to grows.
    pub max_artifact_bytes: usize,
    /// `SubscribeToTask` attempts after a stream broke (3).
    pub resubscribe_attempts: u32,
}

impl Default for Limits {
    fn default() -> Self {
        const MIB: usize = 1 << 20;
        Limits {
            connect_timeout: Duration::from_secs(10),
            card_timeout: Duration::from_secs(10),
            first_event_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(300),
            cancel_timeout: Duration::from_secs(5),
            poll_interval: Duration::from_secs(1),
            max_card_bytes: MIB,
            max_event_bytes: 4 * MIB,
            max_artifact_bytes: 16 * MIB,
            resubscribe_attempts: 3,
        }
    }
}

/// Configuration of an [`A2aProvider`].
#[derive(Clone)]
pub struct A2aConfig {
    /// Registry name.
    pub name: String,
    /// The agent's base URL: its card is at `{url}/.well-known/agent-card.json`.
    pub url: String,
    /// Headers every request carries (`Authorization` and the like); sent
    /// marked sensitive, never logged, never to another origin (a redirect
    /// there is refused).
    pub headers: Vec<(String, String)>,
    /// Sent as the message's `metadata.skill`: which skill of the agent
    /// should take the task. Not an A2A field; `subagents a2a` reads it
    /// (its skills are its providers), other agents may ignore it.
    pub skill: Option<String>,
    /// Sizes and deadlines.
    pub limits: Limits,
}

impl A2aConfig {
    /// Defaults for provider `name` on the agent at `url`.
    pub fn new(name: impl Into<String>, url: impl Into<String>) -> Self {
        A2aConfig { name: name.into(), url: url.into(), headers: Vec::new(), skill: None, limits: Limits::default() }
    }
}

impl fmt::Debug for A2aConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: Vec<&str> = self.headers.iter().map(|(name, _)| name.as_str()).collect();
        f.debug_struct("A2aConfig")
            .field("name", &self.name)
            .field("url", &self.url)
            .field("headers", &headers)
            .field("skill", &self.skill)
            .field("limits", &self.limits)
            .finish()
    }
}

/// Why an [`A2aProvider`] could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum A2aError {
    /// The agent's address is not an HTTP one.
    #[error("a2a provider: url {0:?} must start with http:// or https://")]
    Url(String),
    /// A configured header's name is not a header name.
    #[error("a2a provider: header name {0:?} is invalid")]
    HeaderName(String),
    /// A configured header's value is not a header value (its value is
    /// not repeated: it may be a credential).
    #[error("a2a provider: the value of header {0} is not a header value")]
    HeaderValue(String),
    /// The HTTP client could not be built.
    #[error("a2a provider: cannot build the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
}

/// The `a2a` provider: runs as tasks on one remote A2A agent.
pub struct A2aProvider {
    config: A2aConfig,
    /// The card, once read (a failed read is tried again at the next start).
    card: Arc<Mutex<Option<Arc<AgentCard>>>>,
    /// Where the runs' transcripts are kept (see `child.rs`).
    stores: Arc<crate::agent::HomeStores>,
}

impl A2aProvider {
    /// What an A2A provider advertises: structured output, checked on the
    /// agent's answer; nothing else crosses the protocol.
    pub const CAPABILITIES: Capabilities = Capabilities { output_schema: true, ..Capabilities::none() };

    /// Checks the configuration; nothing is contacted until the first start.
    pub fn new(config: A2aConfig) -> Result<A2aProvider, A2aError> {
        if !(config.url.starts_with("http://") || config.url.starts_with("https://")) {
            return Err(A2aError::Url(config.url.clone()));
        }
        // The headers are checked here, where a mistake can be named.
        client(&config)?;
        Ok(A2aProvider { config, card: Arc::default(), stores: Arc::default() })
    }
}

fn client(config: &A2aConfig) -> Result<Client, A2aError> {
    let limits = &config.limits;
    let bounds = Bounds {
        card_timeout: limits.card_timeout,
        first_event_timeout: limits.first_event_timeout,
        idle_timeout: limits.idle_timeout,
        max_card_bytes: limits.max_card_bytes,
        max_event_bytes: limits.max_event_bytes,
    };
    Client::new(&config.headers, limits.connect_timeout, bounds)
}

impl fmt::Debug for A2aProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("A2aProvider").field("config", &self.config).finish_non_exhaustive()
    }
}

impl Provider for A2aProvider {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn capabilities(&self) -> Capabilities {
        A2aProvider::CAPABILITIES
    }

    fn runs_out_of_process(&self) -> bool {
        true
    }

    fn launch(&self, launch: Launch) -> LocalBoxFuture<'static, Result<Box<dyn Child>, LaunchError>> {
        let config = self.config.clone();
        let cache = self.card.clone();
        let stores = self.stores.clone();
        let name = config.name.clone();
        let diagnosed = move |reason: String| {
            LaunchError::Diagnosed(
                Diagnostic::new(&name, Stage::Initialize, Category::StartupFailed).with_reason(reason),
            )
        };
        let client = match client(&config) {
            Ok(client) => Rc::new(client),
            Err(reason) => return Box::pin(async move { Err(diagnosed(reason.to_string())) }),
        };
        let schema = match &launch.request.output_schema {
            None => None,
            Some(schema) => match CompiledSchema::compile(schema) {
                Ok(compiled) => Some((schema.clone(), Rc::new(compiled))),
                Err(error) => {
                    let reason = error.to_string();
                    return Box::pin(async move { Err(LaunchError::Invalid { field: "output_schema", reason }) });
                }
            },
        };
        Box::pin(async move {
            let known = cache.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let card = match known {
                Some(card) => card,
                None => {
                    let card = tokio::select! {
                        biased;
                        _ = launch.cancel.cancelled() => return Err(LaunchError::Aborted),
                        card = client.card(&config.url) => Arc::new(card.map_err(|e| diagnosed(e.safe_reason()))?),
                    };
                    *cache.lock().unwrap_or_else(|e| e.into_inner()) = Some(card.clone());
                    card
                }
            };
            let endpoint = match (card.interface(wire::JSONRPC), card.interface(wire::HTTP_JSON)) {
                (Some(interface), _) => Endpoint { url: interface.url.clone(), binding: Binding::JsonRpc },
                (None, Some(interface)) => Endpoint { url: interface.url.clone(), binding: Binding::HttpJson },
                (None, None) => {
                    let reason = "the A2A agent's card lists no JSON-RPC or HTTP+JSON interface of version 1.x";
                    return Err(diagnosed(reason.to_owned()));
                }
            };
            if schema.is_some() && !card.answers_json() {
                let reason =
                    "the A2A agent's card offers no application/json output, so no structured result".to_owned();
                return Err(LaunchError::Invalid { field: "output_schema", reason });
            }
            let setup = Setup {
                provider: config.name.clone(),
                client,
                endpoint,
                streaming: card.streams(),
                skill: config.skill.clone(),
                limits: config.limits,
            };
            let prompt = crate::seam::text_of(&launch.request.prompt);
            let id = format!("a2a-{}", crate::agent::ids::session_id());
            let request = &launch.request;
            let mut header = crate::agent::SessionHeader::new(&id, request.parent.cwd.clone());
            header.parent_session = request.parent.session_id.clone();
            header.depth = request.child_depth();
            (header.provider, header.label) = (Some(config.name.clone()), request.label.clone());
            let child = A2aChild {
                record: Rc::new(Record { stores, header }),
                id,
                setup: Rc::new(setup),
                prompt,
                schema,
                cancel: launch.cancel,
                context: launch.context,
            };
            Ok(Box::new(child) as Box<dyn Child>)
        })
    }
}
