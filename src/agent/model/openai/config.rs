//! [`OpenAiConfig`]: where the OpenAI adapter connects and the bounds it
//! holds an endpoint to, set in code or from the environment.

use std::time::Duration;

use crate::agent::model::http::{env_var, http_config, Defaults, EnvBounds};
use crate::agent::model::{ModelError, RouteLimits};

/// Where and how to reach the endpoint, and the bounds on its answers.
///
/// An endpoint is trusted to speak chat completions, not to be small or
/// quick: every answer is bounded in bytes (its body or its whole stream),
/// in tool calls and in each call's arguments, and every call in time
/// (each wait, and the call as a whole with its retries). Past a bound the
/// call fails with [`ModelError::Oversized`] or [`ModelError::Deadline`]
/// and the rest of the answer is never read. The defaults sit far above
/// what a model produces (a 128k-token answer streams about 25 MiB) and
/// far below what hurts a machine running many agents at once.
///
/// | field | default | environment ([`OpenAiConfig::from_env`]) |
/// |---|---|---|
/// | `max_answer_bytes` | 64 MiB | `SUBAGENTS_MODEL_MAX_ANSWER_MIB` |
/// | `max_error_body_bytes` | 1 MiB | `SUBAGENTS_MODEL_MAX_ERROR_BODY_MIB` |
/// | `max_tool_calls` | 128 | `SUBAGENTS_MODEL_MAX_TOOL_CALLS` |
/// | `max_tool_argument_bytes` | 1 MiB | `SUBAGENTS_MODEL_MAX_TOOL_ARGUMENTS_MIB` |
/// | `call_deadline` | 600 s | `SUBAGENTS_MODEL_DEADLINE_SECS` |
/// | `max_tokens` | none | `SUBAGENTS_MODEL_MAX_TOKENS` |
/// | `limits.requests_per_minute` | none | `SUBAGENTS_MODEL_RPM` |
/// | `limits.tokens_per_minute` | none | `SUBAGENTS_MODEL_TPM` |
/// | `limits.max_concurrent` | none | `SUBAGENTS_MODEL_MAX_CONCURRENT` |
///
/// ```
/// use std::time::Duration;
/// use subagents::agent::OpenAiConfig;
///
/// let config = OpenAiConfig::new("http://127.0.0.1:8000/v1", "local")
///     .with_max_answer_bytes(8 << 20)
///     .with_tool_call_limits(16, 64 << 10)
///     .with_call_deadline(Duration::from_secs(60));
/// assert_eq!(config.max_tool_calls, 16);
/// ```
#[derive(Clone)]
pub struct OpenAiConfig {
    /// Base URL up to (not including) `/chat/completions`.
    pub base_url: String,
    /// Model name sent when the route names none.
    pub model: String,
    /// Bearer key, if the endpoint needs one.
    pub api_key: Option<String>,
    /// Bound on the response headers, a whole body, and each streamed chunk.
    pub timeout: Duration,
    /// Retries after a 429, a 5xx, a refused connection or a timeout.
    pub max_retries: u32,
    /// First backoff; doubled on each retry.
    pub retry_backoff: Duration,
    /// Stream answers (text reaches progress listeners as it arrives).
    pub stream: bool,
    /// Most bytes one answer may take: a whole body, or every byte of a
    /// stream together (64 MiB).
    pub max_answer_bytes: usize,
    /// Most bytes of an error status's body read for its message; the rest
    /// is left unread (1 MiB).
    pub max_error_body_bytes: usize,
    /// Most tool calls in one answer (128).
    pub max_tool_calls: usize,
    /// Most bytes of one tool call's arguments (1 MiB).
    pub max_tool_argument_bytes: usize,
    /// Bound on one whole model call: every try and backoff, the headers
    /// and the whole answer, however slowly the endpoint trickles it (and
    /// SSE keep-alive comments do not extend it) (600 s).
    pub call_deadline: Duration,
    /// The answer's token limit when the run's route sets none (none: the
    /// endpoint's default).
    pub max_tokens: Option<u32>,
    /// The rate limits every call of the model passes (none by default).
    pub limits: RouteLimits,
}

impl std::fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("max_retries", &self.max_retries)
            .field("stream", &self.stream)
            .field("max_answer_bytes", &self.max_answer_bytes)
            .field("max_error_body_bytes", &self.max_error_body_bytes)
            .field("max_tool_calls", &self.max_tool_calls)
            .field("max_tool_argument_bytes", &self.max_tool_argument_bytes)
            .field("call_deadline", &self.call_deadline)
            .field("max_tokens", &self.max_tokens)
            .field("limits", &self.limits)
            .finish()
    }
}

impl OpenAiConfig {
    /// The OpenAI API: the endpoint when `SUBAGENTS_BASE_URL` (or a
    /// route's `base_url`) is unset.
    pub const DEFAULT_BASE_URL: &'static str = "https://api.openai.com/v1";

    /// An endpoint and a model; no key, 120 s timeout, 3 retries,
    /// streaming, and the default bounds (see [`OpenAiConfig`]).
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        OpenAiConfig {
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            timeout: Defaults::TIMEOUT,
            max_retries: Defaults::MAX_RETRIES,
            retry_backoff: Defaults::RETRY_BACKOFF,
            stream: true,
            max_answer_bytes: Defaults::MAX_ANSWER_BYTES,
            max_error_body_bytes: Defaults::MAX_ERROR_BODY_BYTES,
            max_tool_calls: Defaults::MAX_TOOL_CALLS,
            max_tool_argument_bytes: Defaults::MAX_TOOL_ARGUMENT_BYTES,
            call_deadline: Defaults::CALL_DEADLINE,
            max_tokens: None,
            limits: RouteLimits::default(),
        }
    }

    /// From `SUBAGENTS_BASE_URL` (else `OPENAI_BASE_URL`, else the OpenAI
    /// API), `SUBAGENTS_MODEL` (required), `SUBAGENTS_API_KEY` (else
    /// `OPENAI_API_KEY`; optional) and the bounds' variables (see
    /// [`OpenAiConfig`]; each optional, a whole number).
    pub fn from_env() -> Result<Self, ModelError> {
        Self::from_env_for(None)
    }

    /// As [`OpenAiConfig::from_env`], with the model named here instead of
    /// by `SUBAGENTS_MODEL` when `model` is given.
    pub fn from_env_for(model: Option<&str>) -> Result<Self, ModelError> {
        let model = model
            .map(str::to_owned)
            .or_else(|| env_var("SUBAGENTS_MODEL"))
            .ok_or_else(|| ModelError::Config("set SUBAGENTS_MODEL to the model name".to_owned()))?;
        let endpoint_var = crate::agent::endpoint_var;
        let base_url = endpoint_var("SUBAGENTS_BASE_URL").unwrap_or_else(|| Self::DEFAULT_BASE_URL.to_owned());
        let mut config = OpenAiConfig { api_key: endpoint_var("SUBAGENTS_API_KEY"), ..Self::new(base_url, model) };
        let bounds = EnvBounds::read()?;
        config.apply_env_bounds(&bounds);
        config.max_tokens = bounds.max_tokens;
        Ok(config)
    }

    /// Sets the bearer key.
    pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// Sets the answer's token limit for routes that set none.
    pub fn with_max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = Some(max_tokens);
        self
    }

    http_config!();
}
