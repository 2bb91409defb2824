//! Any OpenAI-compatible chat-completions endpoint (OpenAI, DeepSeek, vLLM,
//! Ollama, …), with tool calls and streaming.
//!
//! Configure it in code ([`OpenAiConfig::new`]) or from the environment
//! ([`OpenAiConfig::from_env`]: `SUBAGENTS_BASE_URL`, `SUBAGENTS_MODEL`,
//! `SUBAGENTS_API_KEY`, and the bounds below). A route's `model`,
//! `max_tokens` and `reasoning_effort` override the configured ones per
//! request.
//!
//! How it fails: transient answers (408, 425, 429, 500, 502, 503, 504),
//! refused connections and timeouts are retried with exponential backoff
//! and jitter (honouring `Retry-After` or `retry-after-ms`, capped at 30 s)
//! up to `max_retries` times;
//! other statuses (400, 404, 501, 505, …) fail at once with the status and
//! the endpoint's error message, reduced to one line of at most 200
//! characters (an HTML error page becomes its text; only its first
//! `max_error_body_bytes` are read). A body that is not a chat completion
//! is [`ModelError::Malformed`]. `timeout` bounds the wait for the response
//! headers, for a whole non-streamed body, and between two streamed
//! chunks; `call_deadline` bounds the whole call, every retry included, so
//! neither a trickle nor SSE keep-alive comments can stretch it
//! ([`ModelError::Deadline`]). An answer larger than `max_answer_bytes`
//! (its body, or its stream's bytes together), with more than
//! `max_tool_calls` tool calls or with a call's arguments past
//! `max_tool_argument_bytes` fails the call ([`ModelError::Oversized`]) as
//! soon as the bound is passed, so memory stays near the bounds whatever
//! the endpoint sends; such an answer is never retried (it would likely
//! come back the same). [`OpenAiConfig`] lists the bounds, their defaults
//! and their environment variables. Cancellation, a deadline and a refused answer all
//! drop the in-flight request, which closes its connection.
//!
//! Rate limits: every attempt first passes the model's
//! [`Limiter`](super::Limiter) (`OpenAiConfig::limits`; share one between
//! models with [`OpenAiModel::with_limiter`], as a route's models do),
//! charged the request's estimated tokens (its bytes / 4, plus
//! `max_tokens`) and settled with the usage the answer reports. A 429 or
//! 529 that says when to come back (`retry-after`, `retry-after-ms`,
//! `x-ratelimit-reset-*`) pauses every call on the limiter until then
//! rather than this call alone. Each attempt and its wait is recorded on
//! the request's [`CallMeter`](super::CallMeter). The other HTTP adapters
//! do all of this the same way, in the same shared layer.
//!
//! ```no_run
//! use subagents::agent::{Agent, OpenAiConfig, OpenAiModel};
//!
//! let model = OpenAiModel::new(OpenAiConfig::from_env().unwrap()).unwrap();
//! let agent = Agent::builder(model).build().unwrap();
//! ```

use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION};
use tokio_util::sync::CancellationToken;

mod answer;
mod config;
mod request;

use answer::StreamedAnswer;
pub use config::OpenAiConfig;
use request::{ChatRequest, StreamOptions};

use super::http::{http_model, transient, Endpoint};
use super::{ModelError, ModelReply, ModelRequest};

/// The OpenAI-compatible adapter.
pub struct OpenAiModel {
    config: OpenAiConfig,
    name: String,
    endpoint: Endpoint,
}

http_model!(OpenAiModel);

impl OpenAiModel {
    /// An adapter for `config`.
    pub fn new(config: OpenAiConfig) -> Result<Self, ModelError> {
        let endpoint =
            Endpoint::new(&config.base_url, "chat/completions", bearer(&config)?, config.bounds(), transient)?;
        Ok(OpenAiModel { name: format!("openai:{}", config.model), config, endpoint })
    }

    fn body<'a>(&'a self, request: &'a ModelRequest) -> Result<ChatRequest<'a>, ModelError> {
        let options = &request.options;
        Ok(ChatRequest {
            model: options.model.as_deref().unwrap_or(&self.config.model),
            messages: request::messages(request),
            tools: self.endpoint.tools().of(request, request::tools)?,
            max_tokens: options.max_tokens.or(self.config.max_tokens),
            reasoning_effort: options.reasoning_effort.as_deref(),
            stream: self.config.stream,
            stream_options: self.config.stream.then_some(StreamOptions { include_usage: true }),
        })
    }

    async fn complete_inner(&self, request: ModelRequest, cancel: CancellationToken) -> Result<ModelReply, ModelError> {
        let body = self.body(&request)?;
        let max_tokens = request.options.max_tokens.or(self.config.max_tokens).map_or(0, u64::from);
        self.endpoint.complete::<StreamedAnswer>(&body, max_tokens, self.config.stream, &request, &cancel).await
    }
}

/// The bearer key, if there is one, as a header marked sensitive.
pub(super) fn bearer(config: &OpenAiConfig) -> Result<HeaderMap, ModelError> {
    let mut headers = HeaderMap::new();
    if let Some(key) = &config.api_key {
        let mut value = HeaderValue::from_str(&format!("Bearer {key}"))
            .map_err(|_| ModelError::Config("the API key is not a valid header value".to_owned()))?;
        value.set_sensitive(true);
        headers.insert(AUTHORIZATION, value);
    }
    Ok(headers)
}
