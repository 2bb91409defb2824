//! [`AnthropicConfig`]: where the Anthropic adapter connects, the token
//! limit it asks for, and the bounds it holds the endpoint to, set in code
//! or from the environment.

use std::time::Duration;

use crate::agent::model::http::{env_var, http_config, Defaults, EnvBounds};
use crate::agent::model::{ModelError, RouteLimits};

/// Where and how to reach the Messages API, and the bounds on its answers.
///
/// The bounds are the OpenAI adapter's, with the same defaults and the same
/// environment variables (see `OpenAiConfig`): one answer's bytes, an error
/// body's bytes read, tool calls per answer, one call's arguments, one whole
/// call's deadline. The API requires `max_tokens` on every request: a
/// route's `max_tokens` is sent where it sets one, else this one.
///
/// | field | default | environment ([`AnthropicConfig::from_env`]) |
/// |---|---|---|
/// | `base_url` | `https://api.anthropic.com` | `ANTHROPIC_BASE_URL` |
/// | `api_key` | none | `ANTHROPIC_API_KEY` |
/// | `model` | (required) | `anthropic:NAME`, else `ANTHROPIC_MODEL` |
/// | `max_tokens` | 4096 | `ANTHROPIC_MAX_TOKENS` |
/// | the bounds and `limits` | as `OpenAiConfig` | `SUBAGENTS_MODEL_*` |
///
/// ```
/// use std::time::Duration;
/// use subagents::agent::AnthropicConfig;
///
/// let config = AnthropicConfig::new("http://127.0.0.1:8000", "claude-sonnet-4-5")
///     .with_max_tokens(1024)
///     .with_call_deadline(Duration::from_secs(60));
/// assert_eq!(config.max_tokens, 1024);
/// ```
#[derive(Clone)]
pub struct AnthropicConfig {
    /// Base URL up to (not including) `/v1/messages`.
    pub base_url: String,
    /// Model name sent when the route names none.
    pub model: String,
    /// The key sent as `x-api-key`, if the endpoint needs one.
    pub api_key: Option<String>,
    /// Tokens asked for when the route sets no `max_tokens` (4096).
    pub max_tokens: u64,
    /// Bound on the response headers, a whole body, and each streamed chunk.
    pub timeout: Duration,
    /// Retries after a 429, a 529, another 5xx, a refused connection or a
    /// timeout.
    pub max_retries: u32,
    /// First backoff; doubled on each retry.
    pub retry_backoff: Duration,
    /// Stream answers (text reaches progress listeners as it arrives).
    pub stream: bool,
    /// Most bytes one answer may take: a whole body, or every byte of a
    /// stream together (64 MiB).
    pub max_answer_bytes: usize,
    /// Most bytes of an error status's body read for its message (1 MiB).
    pub max_error_body_bytes: usize,
    /// Most tool calls in one answer (128).
    pub max_tool_calls: usize,
    /// Most bytes of one tool call's arguments (1 MiB).
    pub max_tool_argument_bytes: usize,
    /// Bound on one whole model call, every try and backoff included
    /// (600 s).
    pub call_deadline: Duration,
    /// The rate limits every call of the model passes (none by default).
    pub limits: RouteLimits,
}

impl std::fmt::Debug for AnthropicConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnthropicConfig")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("max_tokens", &self.max_tokens)
            .field("timeout", &self.timeout)
            .field("max_retries", &self.max_retries)
            .field("stream", &self.stream)
            .field("max_answer_bytes", &self.max_answer_bytes)
            .field("max_error_body_bytes", &self.max_error_body_bytes)
            .field("max_tool_calls", &self.max_tool_calls)
            .field("max_tool_argument_bytes", &self.max_tool_argument_bytes)
            .field("call_deadline", &self.call_deadline)
            .field("limits", &self.limits)
            .finish()
    }
}

impl AnthropicConfig {
    /// The Anthropic API: the endpoint when `ANTHROPIC_BASE_URL` (or a
    /// route's `base_url`) is unset.
    pub const DEFAULT_BASE_URL: &'static str = "https://api.anthropic.com";

    /// An endpoint and a model; no key, 4096 tokens, 120 s timeout, 3
    /// retries, streaming, and the default bounds.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        AnthropicConfig {
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            max_tokens: 4096,
            timeout: Defaults::TIMEOUT,
            max_retries: Defaults::MAX_RETRIES,
            retry_backoff: Defaults::RETRY_BACKOFF,
            stream: true,
            max_answer_bytes: Defaults::MAX_ANSWER_BYTES,
            max_error_body_bytes: Defaults::MAX_ERROR_BODY_BYTES,
            max_tool_calls: Defaults::MAX_TOOL_CALLS,
            max_tool_argument_bytes: Defaults::MAX_TOOL_ARGUMENT_BYTES,
            call_deadline: Defaults::CALL_DEADLINE,
            limits: RouteLimits::default(),
        }
    }

    /// From `ANTHROPIC_BASE_URL` (default the Anthropic API),
    /// `ANTHROPIC_MODEL` (required), `ANTHROPIC_API_KEY` (optional),
    /// `ANTHROPIC_MAX_TOKENS` and the `SUBAGENTS_MODEL_*` bounds (each
    /// optional, a whole number).
    pub fn from_env() -> Result<Self, ModelError> {
        Self::from_env_for(None)
    }

    /// As [`AnthropicConfig::from_env`], with the model named here instead
    /// of by `ANTHROPIC_MODEL` when `model` is given.
    pub fn from_env_for(model: Option<&str>) -> Result<Self, ModelError> {
        let model = model
            .map(str::to_owned)
            .or_else(|| env_var("ANTHROPIC_MODEL"))
            .ok_or_else(|| ModelError::Config("name the model (anthropic:NAME) or set ANTHROPIC_MODEL".to_owned()))?;
        let base_url = env_var("ANTHROPIC_BASE_URL").unwrap_or_else(|| Self::DEFAULT_BASE_URL.to_owned());
        let mut config = AnthropicConfig { api_key: env_var("ANTHROPIC_API_KEY"), ..Self::new(base_url, model) };
        if let Some(value) = env_var("ANTHROPIC_MAX_TOKENS") {
            config.max_tokens = value.trim().parse().ok().filter(|&n| n > 0).ok_or_else(|| {
                ModelError::Config(format!("ANTHROPIC_MAX_TOKENS must be a whole number above 0, not {value:?}"))
            })?;
        }
        config.apply_env_bounds(&EnvBounds::read()?);
        Ok(config)
    }

    /// Sets the key.
    pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// Sets the tokens asked for when the route sets none.
    pub fn with_max_tokens(mut self, max_tokens: u64) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    http_config!();
}
