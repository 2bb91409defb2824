//! Model adapters: one async trait, its implementations.
//!
//! | adapter | when to choose it |
//! |---|---|
//! | [`ScriptedModel`] | the embedded default: deterministic scripts keyed by session, no key, no network; [`ScriptedModel::demo`] uses its tools |
//! | [`ReplayModel`] / [`RecordingModel`] | replay recorded tapes; record them around any adapter |
//! | `OpenAiModel` | any OpenAI-compatible chat-completions endpoint (feature `openai`) |
//! | `OpenAiResponsesModel` | OpenAI's Responses API (feature `openai`) |
//! | `AnthropicModel` | Anthropic's Messages API (feature `openai`) |
//!
//! Every call takes a [`CancellationToken`]; an adapter returns
//! [`ModelError::Cancelled`] promptly once it trips (an HTTP adapter drops
//! the in-flight request, which closes its connection). The HTTP adapters
//! share one layer for sending, retrying and reading bounded answers, so
//! each holds its endpoint to the same bounds; [`ModelSpec`] names any of
//! them in one string, or a configured [`ModelRoute`].
//!
//! That layer passes the model's [`Limiter`] (its route's, shared by every
//! model built from the route) before each attempt and records the attempt
//! on the request's [`CallMeter`], so a run can say how many attempts its
//! calls took and how long they waited on limits (see
//! [`limit`](self::limit) for what is shared).

#[cfg(feature = "openai")]
mod anthropic;
mod demo;
#[cfg(feature = "openai")]
mod http;
pub(crate) mod limit;
#[cfg(feature = "openai")]
mod openai;
#[cfg(feature = "openai")]
mod responses;

mod replay;
mod route;
mod scripted;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

#[cfg(feature = "openai")]
pub use anthropic::{AnthropicConfig, AnthropicModel};
pub use limit::{
    retry_delay, Booked, Booking, Cancelled, FleetConcurrency, FleetSlots, Limiter, Permit, RouteLimits, RouteStats,
    SharedSchedule, SharedStats, Unshared, DEFAULT_CONCURRENCY_CAP, MAX_COOL_DOWN, MAX_CREDIBLE_USAGE, MAX_TOKEN_DEBT,
    SLICE_SPAN,
};
#[cfg(feature = "openai")]
pub use openai::{OpenAiConfig, OpenAiModel};
#[cfg(feature = "openai")]
pub use responses::OpenAiResponsesModel;

pub use replay::{RecordingModel, ReplayModel, Tape, TapeAnswer, TapeSession};
pub use route::{Api, ApiNotBuilt, ModelRoute};
pub use scripted::{DelayRule, Responder, ScriptMatch, ScriptedModel, Step};

use super::session::{SessionEvent, ToolCall};
use super::tools::ToolSpec;
use crate::seam::{text_of, AgentOptions};

/// The forms [`ModelSpec::parse`] takes, for its errors.
pub(crate) const MODEL_FORMS: &str = "\"scripted\", \"openai:NAME\", \"openai-responses:NAME\" or \"anthropic:NAME\"";

/// A model named on a command line or in a route: `scripted` (the
/// embedded default, [`ScriptedModel::demo`]), `openai:NAME` (an
/// OpenAI-compatible chat-completions endpoint), `openai-responses:NAME`
/// (OpenAI's Responses API, the same environment) or `anthropic:NAME`
/// (Anthropic's Messages API), each HTTP one configured by the environment;
/// or a configured [`ModelRoute`] (a configuration file's `[models.NAME]`).
///
/// ```
/// use subagents::agent::ModelSpec;
///
/// let spec = ModelSpec::parse("anthropic:claude-sonnet-4-5").unwrap();
/// assert_eq!(spec, ModelSpec::Anthropic(Some("claude-sonnet-4-5".to_owned())));
/// assert_eq!(spec.route_provider(), Some("anthropic"));
/// assert!(ModelSpec::parse("gemini:pro").unwrap_err().to_string().contains("anthropic:NAME"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSpec {
    /// The scripted demo model.
    Scripted,
    /// `OpenAiModel` (feature `openai`); `None` takes the model name from
    /// `SUBAGENTS_MODEL`.
    OpenAi(Option<String>),
    /// `OpenAiResponsesModel` (feature `openai`); `None` takes the model
    /// name from `SUBAGENTS_MODEL`.
    OpenAiResponses(Option<String>),
    /// `AnthropicModel` (feature `openai`, which carries every HTTP
    /// adapter); `None` takes the model name from `ANTHROPIC_MODEL`.
    Anthropic(Option<String>),
    /// A configured route (`[models.NAME]`), with the limiter its models share.
    Route(Arc<ModelRoute>),
}

impl ModelSpec {
    /// Parses `scripted`, `openai:NAME`, `openai-responses:NAME` or `anthropic:NAME`.
    pub fn parse(spec: &str) -> Result<ModelSpec, ModelError> {
        if spec == "scripted" {
            return Ok(ModelSpec::Scripted);
        }
        let unknown = || ModelError::Config(format!("unknown model {spec:?}: use {MODEL_FORMS}"));
        let (api, name) = spec.split_once(':').ok_or_else(unknown)?;
        if name.is_empty() {
            return Err(unknown());
        }
        ModelSpec::from_route(Some(api), Some(name.to_owned())).map_err(|_| unknown())
    }

    /// The spec a route names by its provider (`openai`,
    /// `openai-responses`, `anthropic`; none or `scripted` is the scripted
    /// model) and model: how a child process is told its model.
    pub fn from_route(provider: Option<&str>, model: Option<String>) -> Result<ModelSpec, ModelError> {
        Ok(match provider {
            None | Some("scripted") => ModelSpec::Scripted,
            Some("openai") => ModelSpec::OpenAi(model),
            Some("openai-responses") => ModelSpec::OpenAiResponses(model),
            Some("anthropic") => ModelSpec::Anthropic(model),
            Some(other) => return Err(ModelError::Config(format!("unknown model provider {other:?}"))),
        })
    }

    /// The route's provider for this model ([`ModelSpec::from_route`]'s
    /// inverse); `None` for the scripted model.
    pub fn route_provider(&self) -> Option<&'static str> {
        match self {
            ModelSpec::Scripted => None,
            ModelSpec::OpenAi(_) => Some("openai"),
            ModelSpec::OpenAiResponses(_) => Some("openai-responses"),
            ModelSpec::Anthropic(_) => Some("anthropic"),
            ModelSpec::Route(route) => Some(route.api.provider()),
        }
    }

    /// The model name it gives, if any (else the environment's).
    pub fn model_name(&self) -> Option<&str> {
        match self {
            ModelSpec::Scripted => None,
            ModelSpec::OpenAi(name) | ModelSpec::OpenAiResponses(name) | ModelSpec::Anthropic(name) => name.as_deref(),
            ModelSpec::Route(route) => Some(&route.model),
        }
    }

    /// Where the model's endpoint is configured in the environment: the
    /// variables a child process may inherit (the base URL, the model), and
    /// the one holding the key, which is only ever handed over explicitly.
    /// A route's are its API's (a child is handed the route's base URL and
    /// key under those names).
    pub fn endpoint_env(&self) -> (&'static [&'static str], Option<&'static str>) {
        const OPENAI: (&[&str], Option<&str>) = (&["SUBAGENTS_BASE_URL", "SUBAGENTS_MODEL"], Some("SUBAGENTS_API_KEY"));
        const ANTHROPIC: (&[&str], Option<&str>) =
            (&["ANTHROPIC_BASE_URL", "ANTHROPIC_MODEL"], Some("ANTHROPIC_API_KEY"));
        match self {
            ModelSpec::Scripted => (&[], None),
            ModelSpec::OpenAi(_) | ModelSpec::OpenAiResponses(_) => OPENAI,
            ModelSpec::Anthropic(_) => ANTHROPIC,
            ModelSpec::Route(route) if route.api == Api::Anthropic => ANTHROPIC,
            ModelSpec::Route(_) => OPENAI,
        }
    }

    /// Builds the model.
    pub fn build(&self) -> Result<Arc<dyn Model>, ModelError> {
        match self {
            ModelSpec::Scripted => Ok(Arc::new(ScriptedModel::demo())),
            #[cfg(feature = "openai")]
            _ => Ok(self.build_http()?.0),
            #[cfg(not(feature = "openai"))]
            _ => Err(ModelError::Config(format!(
                "{} models need the crate's \"openai\" feature",
                self.route_provider().unwrap_or_default()
            ))),
        }
    }

    /// Builds the model, handing its limiter (an HTTP model's; the scripted
    /// model has none) to `limited` first: how a served child's model is
    /// made to draw on its parent's limiter.
    #[cfg(feature = "process")]
    pub(crate) fn build_limited(&self, limited: impl FnOnce(&Limiter)) -> Result<Arc<dyn Model>, ModelError> {
        #[cfg(feature = "openai")]
        if !matches!(self, ModelSpec::Scripted) {
            return Ok(self.build_http_with(limited)?.0);
        }
        let _ = limited;
        self.build()
    }

    /// Builds the model and, for an HTTP one, checks that its endpoint's
    /// host accepts a connection (within its timeout, at most 5 s). `Err`
    /// carries the base URL when the endpoint is what failed.
    pub async fn build_reachable(&self) -> Result<Arc<dyn Model>, (Option<String>, ModelError)> {
        #[cfg(feature = "openai")]
        if !matches!(self, ModelSpec::Scripted) {
            let (model, base_url, probe) = self.build_http().map_err(|e| (None, e))?;
            probe.await.map_err(|e| (Some(base_url.clone()), e))?;
            self.warn_keyless(&base_url);
            return Ok(model);
        }
        self.build().map_err(|e| (None, e))
    }

    /// Says once per endpoint that a model named by the environment calls
    /// it without a key (a local server may want none; a hosted one answers
    /// 401 to every call), naming the variables that would give it one.
    #[cfg(feature = "openai")]
    fn warn_keyless(&self, base_url: &str) {
        static WARNED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
        let (_, Some(key)) = self.endpoint_env() else { return };
        if matches!(self, ModelSpec::Route(_) | ModelSpec::Scripted) || endpoint_var(key).is_some() {
            return;
        }
        let variables = if key == "SUBAGENTS_API_KEY" { "SUBAGENTS_API_KEY or OPENAI_API_KEY" } else { key };
        let mut warned = WARNED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !warned.iter().any(|url| url == base_url) {
            warned.push(base_url.to_owned());
            tracing::warn!("calls to the model endpoint {base_url} carry no API key: set {variables} if it needs one");
        }
    }

    /// An HTTP model, its base URL, and a probe of its endpoint.
    #[cfg(feature = "openai")]
    fn build_http(&self) -> Result<(Arc<dyn Model>, String, Probe), ModelError> {
        self.build_http_with(|_| {})
    }

    /// [`ModelSpec::build_http`], the model's limiter handed to `limited` first.
    #[cfg(feature = "openai")]
    fn build_http_with(&self, limited: impl FnOnce(&Limiter)) -> Result<(Arc<dyn Model>, String, Probe), ModelError> {
        Ok(match self {
            ModelSpec::OpenAi(name) => {
                let config = OpenAiConfig::from_env_for(name.as_deref())?;
                let base_url = config.base_url.clone();
                let model = OpenAiModel::new(config)?;
                limited(model.limiter());
                let (model, probe) = model.probed();
                (model, base_url, probe)
            }
            ModelSpec::OpenAiResponses(name) => {
                let config = OpenAiConfig::from_env_for(name.as_deref())?;
                let base_url = config.base_url.clone();
                let model = OpenAiResponsesModel::new(config)?;
                limited(model.limiter());
                let (model, probe) = model.probed();
                (model, base_url, probe)
            }
            ModelSpec::Anthropic(name) => {
                let config = AnthropicConfig::from_env_for(name.as_deref())?;
                let base_url = config.base_url.clone();
                let model = AnthropicModel::new(config)?;
                limited(model.limiter());
                let (model, probe) = model.probed();
                (model, base_url, probe)
            }
            ModelSpec::Route(route) => {
                limited(route.limiter());
                route.build_http()?
            }
            ModelSpec::Scripted => unreachable!("the scripted model is no HTTP model"),
        })
    }
}

/// A check that an HTTP model's endpoint accepts a connection.
#[cfg(feature = "openai")]
type Probe = BoxFuture<'static, Result<(), ModelError>>;

/// Receives streamed text as it arrives.
pub type ChunkSink = Arc<dyn Fn(&str) + Send + Sync>;

/// One model call: everything the model sees.
#[derive(Clone)]
pub struct ModelRequest {
    /// The calling session (adapters key scripts and tapes by it).
    pub session_id: String,
    /// The assembled system prompt.
    pub system: Arc<str>,
    /// The conversation so far (turn ends are bookkeeping and carry no text).
    pub messages: Arc<[SessionEvent]>,
    /// The tools the model may call.
    pub tools: Arc<[ToolSpec]>,
    /// Route: model, token limit, reasoning effort.
    pub options: AgentOptions,
    /// Where streamed text goes, if anyone listens.
    pub chunks: Option<ChunkSink>,
    /// Where the adapter records each HTTP attempt and its wait on limits.
    pub meter: CallMeter,
}

/// What one model call cost at the transport, recorded by the adapter as
/// it goes (so a call that fails after its retries still reports them);
/// clones share the counts.
///
/// ```
/// use std::time::Duration;
/// use subagents::agent::CallMeter;
///
/// let meter = CallMeter::default();
/// meter.attempt(Duration::from_millis(40));
/// meter.clone().attempt(Duration::ZERO);
/// assert_eq!((meter.attempts(), meter.limit_wait()), (2, Duration::from_millis(40)));
/// ```
#[derive(Clone, Debug, Default)]
pub struct CallMeter(Arc<MeterCounts>);

#[derive(Debug, Default)]
struct MeterCounts {
    attempts: AtomicU64,
    limit_wait_nanos: AtomicU64,
}

impl CallMeter {
    /// One attempt, after `waited` on the route's limits.
    pub fn attempt(&self, waited: Duration) {
        self.0.attempts.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX);
        self.0.limit_wait_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Attempts so far.
    pub fn attempts(&self) -> u64 {
        self.0.attempts.load(Ordering::Relaxed)
    }

    /// Time waited on limits so far.
    pub fn limit_wait(&self) -> Duration {
        Duration::from_nanos(self.0.limit_wait_nanos.load(Ordering::Relaxed))
    }
}

impl ModelRequest {
    /// The text of the latest user message. On a session's first call this
    /// is the prompt that started it (for a fork, not the seeded history),
    /// which is what scripts and tapes bind by.
    pub fn last_user_text(&self) -> Option<String> {
        self.messages.iter().rev().find_map(|event| match event {
            SessionEvent::User { content } => Some(text_of(content)),
            _ => None,
        })
    }
}

impl std::fmt::Debug for ModelRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelRequest")
            .field("session_id", &self.session_id)
            .field("messages", &self.messages.len())
            .field("tools", &self.tools.iter().map(|t| &t.name).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Why the model stopped answering.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Finish {
    /// It finished its answer.
    Stop,
    /// It wants tool results.
    ToolCalls,
    /// It hit the token limit.
    MaxTokens,
    /// It declined.
    Refusal,
}

impl Finish {
    /// The OpenTelemetry GenAI conventions' finish reason, as OpenAI spells
    /// it.
    pub(crate) fn convention_name(&self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::ToolCalls => "tool_calls",
            Finish::MaxTokens => "length",
            Finish::Refusal => "content_filter",
        }
    }
}

/// Token counts, where the model reports them. The kinds do not overlap:
/// `input_tokens` are the prompt tokens neither read from nor written to a
/// cache (an adapter whose API counts cached tokens inside the prompt's
/// subtracts them), so [`Usage::total`] is their plain sum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens, cached ones excepted.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Prompt tokens read from the provider's cache.
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the provider's cache.
    #[serde(default)]
    pub cache_write_tokens: u64,
}

impl Usage {
    /// Every token, of all four kinds.
    pub fn total(&self) -> u64 {
        self.input_tokens
            .saturating_add(self.output_tokens)
            .saturating_add(self.cache_read_tokens)
            .saturating_add(self.cache_write_tokens)
    }
}

/// One model answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelReply {
    /// The answer's text.
    pub text: String,
    /// Tool calls, in the order the model wrote them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// Why it stopped.
    pub finish: Finish,
    /// Token counts, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

impl ModelReply {
    /// A finished text answer.
    pub fn text(text: impl Into<String>) -> Self {
        ModelReply { text: text.into(), tool_calls: Vec::new(), finish: Finish::Stop, usage: None }
    }
}

/// Why a model call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The call was cancelled.
    #[error("the model call was cancelled")]
    Cancelled,
    /// The adapter is misconfigured.
    #[error("model configuration: {0}")]
    Config(String),
    /// The endpoint answered with an error status (after retries).
    #[error("the model endpoint answered {status}: {message}")]
    Status {
        /// HTTP status.
        status: u16,
        /// A short excerpt of the body.
        message: String,
    },
    /// The connection failed or broke.
    #[error("the model endpoint could not be reached: {0}")]
    Transport(String),
    /// The endpoint began an answer and it broke off: the connection closed
    /// or failed mid-answer, or a stream ended before its finish.
    #[error("the model's answer broke off: {0}")]
    BrokeOff(String),
    /// The request or a streamed chunk timed out.
    #[error("the model call timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// The whole call (every try and backoff, the headers, the whole
    /// answer) outlasted its deadline.
    #[error("the model call passed its deadline of {} s, retries included", .0.as_secs_f64())]
    Deadline(std::time::Duration),
    /// The answer went past one of the adapter's bounds; the rest of it was
    /// not read.
    #[error("{0}")]
    Oversized(Oversize),
    /// The endpoint answered something that is not an answer of its API.
    #[error("malformed model response: {0}")]
    Malformed(String),
    /// A script or tape said to fail, or ran out.
    #[error("{0}")]
    Scripted(String),
}

impl ModelError {
    /// The kind of failure in one word, as spans name it (`error.type`).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            ModelError::Cancelled => "cancelled",
            ModelError::Config(_) => "config",
            ModelError::Status { .. } => "status",
            ModelError::Transport(_) => "transport",
            ModelError::BrokeOff(_) => "broke_off",
            ModelError::Timeout(_) | ModelError::Deadline(_) => "timeout",
            ModelError::Oversized(_) => "oversized",
            ModelError::Malformed(_) => "malformed",
            ModelError::Scripted(_) => "scripted",
        }
    }
}

impl ModelError {
    /// The failure in fixed wording, safe for a diagnostic: no body, URL,
    /// payload or configuration value, only the kind and a status or time.
    pub fn safe_reason(&self) -> String {
        match self {
            ModelError::Cancelled => "the model call was cancelled".to_owned(),
            ModelError::Config(_) => "the model is misconfigured".to_owned(),
            ModelError::Status { status, .. } => format!("the model endpoint answered {status}"),
            ModelError::Transport(_) => "the model endpoint could not be reached".to_owned(),
            ModelError::BrokeOff(_) => "the model endpoint's answer broke off before it finished".to_owned(),
            ModelError::Timeout(after) => format!("the model call timed out after {} s", after.as_secs_f64()),
            ModelError::Deadline(after) => format!("the model call passed its deadline of {} s", after.as_secs_f64()),
            // Fixed wording and the bound: nothing of the answer itself.
            ModelError::Oversized(oversize) => oversize.to_string(),
            ModelError::Malformed(_) => "the model endpoint answered something that is not a model answer".to_owned(),
            ModelError::Scripted(_) => "the scripted model failed".to_owned(),
        }
    }
}

/// Which of an adapter's bounds an answer went past, and the bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Oversize {
    /// The answer (a whole body, or a stream's bytes together) is larger
    /// than this many bytes.
    AnswerBytes(usize),
    /// The answer asks for more tool calls than this.
    ToolCalls(usize),
    /// A tool call's arguments are larger than this many bytes.
    ToolArgumentBytes(usize),
}

impl std::fmt::Display for Oversize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Oversize::AnswerBytes(bound) => write!(f, "the model's answer is larger than {}", size(*bound)),
            Oversize::ToolCalls(bound) => write!(f, "the model's answer asks for more than {bound} tool calls"),
            Oversize::ToolArgumentBytes(bound) => {
                write!(f, "a tool call's arguments are larger than {}", size(*bound))
            }
        }
    }
}

/// A byte count as people set it: `64 MiB`, `16 KiB`, else `1000 bytes`.
fn size(bytes: usize) -> String {
    const KIB: usize = 1 << 10;
    const MIB: usize = 1 << 20;
    match bytes {
        0 => "0 bytes".to_owned(),
        _ if bytes.is_multiple_of(MIB) => format!("{} MiB", bytes / MIB),
        _ if bytes.is_multiple_of(KIB) => format!("{} KiB", bytes / KIB),
        _ => format!("{bytes} bytes"),
    }
}

/// A model: turns a request into one answer. Cancellable.
pub trait Model: Send + Sync + 'static {
    /// A short name for logs (`scripted`, `openai:gpt-4o`, …).
    fn name(&self) -> &str;

    /// The agent of `session_id` closed its session: per-session state
    /// (script cursors, …) may be dropped. Default: nothing to drop.
    fn session_closed(&self, session_id: &str) {
        let _ = session_id;
    }

    /// Answers one request. Returns [`ModelError::Cancelled`] promptly once
    /// `cancel` trips.
    fn complete(
        &self,
        request: ModelRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'_, Result<ModelReply, ModelError>>;
}

/// The variables every OpenAI client reads, beside ours: ours win when both
/// are set.
#[cfg(any(feature = "openai", feature = "process"))]
const OPENAI_ECOSYSTEM: [(&str, &str); 2] =
    [("SUBAGENTS_BASE_URL", "OPENAI_BASE_URL"), ("SUBAGENTS_API_KEY", "OPENAI_API_KEY")];

/// The value of an endpoint's variable `name` (set to more than blanks),
/// else of the ecosystem's name for the same thing (`OPENAI_API_KEY` for
/// `SUBAGENTS_API_KEY`, `OPENAI_BASE_URL` for `SUBAGENTS_BASE_URL`).
#[cfg(any(feature = "openai", feature = "process"))]
pub(crate) fn endpoint_var(name: &str) -> Option<String> {
    let set = |name: &str| std::env::var(name).ok().filter(|value| !value.trim().is_empty());
    set(name).or_else(|| OPENAI_ECOSYSTEM.iter().find(|(ours, _)| *ours == name).and_then(|(_, theirs)| set(theirs)))
}
