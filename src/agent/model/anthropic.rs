//! Anthropic's Messages API (`POST /v1/messages`), with tool use and
//! streaming: `--model anthropic:NAME`.
//!
//! Choose it for Claude models: the API's own shape, its prompt-cache
//! counts in [`Usage`](crate::agent::Usage), its `529 overloaded` retried.
//! Configure it in code ([`AnthropicConfig::new`]) or from the environment
//! ([`AnthropicConfig::from_env`]: `ANTHROPIC_BASE_URL`, `ANTHROPIC_API_KEY`,
//! `ANTHROPIC_MODEL`, `ANTHROPIC_MAX_TOKENS`, and the `SUBAGENTS_MODEL_*`
//! bounds every HTTP adapter shares). Each request carries `x-api-key` and
//! `anthropic-version: 2023-06-01`.
//!
//! The mapping: the system prompt is the top-level `system`; a session's
//! tool calls are `tool_use` blocks of the assistant's message and their
//! results `tool_result` blocks of the next user message (one user message
//! holds every result of one answer, and any message that follows them);
//! a route's `max_tokens` is sent, else the configured one (the API
//! requires it), and its `model` overrides the configured one. A route's
//! `reasoning_effort` is refused: the API has no such field, and a request
//! the adapter cannot carry fails rather than being sent without it.
//!
//! Stop reasons: `end_turn` and `stop_sequence` finish the answer,
//! `tool_use` asks for the results, `max_tokens` (and
//! `model_context_window_exceeded`) is the token limit, `refusal` a
//! refusal. `pause_turn` comes only from server tools, which this adapter
//! never sends; should it come, the paused answer is kept as it stands and
//! ends as cut short (`MaxTokens`), never resumed.
//!
//! How it fails: as the OpenAI adapter does (`OpenAiModel`'s module doc),
//! with 529 retried besides 408, 425, 429, 500, 502, 503 and 504, its
//! `retry-after` honoured, and the same rate limits: a 429 or 529 that
//! says when to come back (`retry-after`, `anthropic-ratelimit-*-reset`)
//! pauses every call on the model's limiter (its route's) until then. An `error` event mid-stream
//! (an overload, say) ends the call as an answer that broke off, keeping
//! the text streamed so far; it is not retried, as its text has already
//! reached the listeners. Every bound (answer bytes, tool calls, arguments,
//! the call's deadline) holds the same way, and cancelling drops the
//! request, which closes its connection.
//!
//! ```no_run
//! use subagents::agent::{Agent, AnthropicConfig, AnthropicModel};
//!
//! let model = AnthropicModel::new(AnthropicConfig::from_env_for(Some("claude-sonnet-4-5")).unwrap()).unwrap();
//! let agent = Agent::builder(model).build().unwrap();
//! ```

use reqwest::header::{HeaderMap, HeaderValue};
use tokio_util::sync::CancellationToken;

mod answer;
mod config;
mod request;

use answer::Message;
pub use config::AnthropicConfig;
use request::MessagesRequest;

use super::http::{http_model, transient, Endpoint};
use super::{ModelError, ModelReply, ModelRequest};

/// The API version every request names.
const API_VERSION: &str = "2023-06-01";

/// The Anthropic Messages adapter.
pub struct AnthropicModel {
    config: AnthropicConfig,
    name: String,
    endpoint: Endpoint,
}

http_model!(AnthropicModel);

impl AnthropicModel {
    /// An adapter for `config`.
    pub fn new(config: AnthropicConfig) -> Result<Self, ModelError> {
        if config.max_tokens == 0 {
            return Err(ModelError::Config("max_tokens is 0: every model call would fail".to_owned()));
        }
        let mut headers = HeaderMap::new();
        headers.insert("anthropic-version", HeaderValue::from_static(API_VERSION));
        if let Some(key) = &config.api_key {
            let mut value = HeaderValue::from_str(key)
                .map_err(|_| ModelError::Config("the API key is not a valid header value".to_owned()))?;
            value.set_sensitive(true);
            headers.insert("x-api-key", value);
        }
        let endpoint = Endpoint::new(&config.base_url, "v1/messages", headers, config.bounds(), overloaded)?;
        Ok(AnthropicModel { name: format!("anthropic:{}", config.model), config, endpoint })
    }

    fn body<'a>(&'a self, request: &'a ModelRequest) -> Result<MessagesRequest<'a>, ModelError> {
        let options = &request.options;
        if options.reasoning_effort.is_some() {
            return Err(ModelError::Config("the anthropic adapter takes no reasoning_effort".to_owned()));
        }
        Ok(MessagesRequest {
            model: options.model.as_deref().unwrap_or(&self.config.model),
            max_tokens: options.max_tokens.map_or(self.config.max_tokens, u64::from),
            messages: request::turns(request),
            system: &request.system,
            tools: self.endpoint.tools().of(request, request::tools)?,
            stream: self.config.stream,
        })
    }

    async fn complete_inner(&self, request: ModelRequest, cancel: CancellationToken) -> Result<ModelReply, ModelError> {
        let body = self.body(&request)?;
        let max_tokens = request.options.max_tokens.map_or(self.config.max_tokens, u64::from);
        self.endpoint.complete::<Message>(&body, max_tokens, self.config.stream, &request, &cancel).await
    }
}

/// The shared transient statuses and the API's own 529 (overloaded).
fn overloaded(status: u16) -> bool {
    status == 529 || transient(status)
}
