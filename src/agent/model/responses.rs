//! OpenAI's Responses API (`POST {base}/responses`), with function calls
//! and streaming: `--model openai-responses:NAME`.
//!
//! Choose it for OpenAI's own endpoint where the Responses API is the
//! newer door (reasoning models, cached-token counts); chat completions
//! (`OpenAiModel`) stays the choice for OpenAI-compatible servers. It takes
//! the same [`OpenAiConfig`] and so the same environment
//! (`SUBAGENTS_BASE_URL`, `SUBAGENTS_MODEL`, `SUBAGENTS_API_KEY`, the
//! `SUBAGENTS_MODEL_*` bounds), and the same bearer key.
//!
//! The mapping: the system prompt is `instructions`; the conversation is
//! `input` items (user and assistant messages, each tool call a
//! `function_call` item and its result a `function_call_output` item with
//! the same `call_id`); a route's `max_tokens` is `max_output_tokens`, its
//! `reasoning_effort` is `reasoning.effort`, its `model` overrides the
//! configured one. Requests say `store: false`: each carries the whole
//! conversation, and nothing is kept on the server to refer back to.
//!
//! Endings: `response.completed` finishes the answer (asking for the
//! results when it holds function calls, a refusal when it holds only a
//! refusal); `response.incomplete` is the token limit (`max_output_tokens`)
//! or a refusal (`content_filter`); `response.failed` and `error` end the
//! call as an answer that broke off, with the endpoint's code and message,
//! keeping the text streamed so far. The API's `input_tokens` include the
//! cached ones (`input_tokens_details.cached_tokens`); the reply's
//! [`Usage`](super::Usage) keeps them apart, as every adapter does.
//!
//! How it fails: exactly as `OpenAiModel` does (the same retries, bounds,
//! deadline, cancellation and rate limits), through the same shared HTTP
//! layer.
//!
//! ```no_run
//! use subagents::agent::{Agent, OpenAiConfig, OpenAiResponsesModel};
//!
//! let model = OpenAiResponsesModel::new(OpenAiConfig::from_env_for(Some("gpt-5-mini")).unwrap()).unwrap();
//! let agent = Agent::builder(model).build().unwrap();
//! ```

use tokio_util::sync::CancellationToken;

mod answer;
mod request;
mod wire;

use answer::Response;
use request::{Reasoning, ResponsesRequest};

use super::http::{http_model, transient, Endpoint};
use super::openai::{bearer, OpenAiConfig};
use super::{ModelError, ModelReply, ModelRequest};

/// The OpenAI Responses adapter.
pub struct OpenAiResponsesModel {
    config: OpenAiConfig,
    name: String,
    endpoint: Endpoint,
}

http_model!(OpenAiResponsesModel);

impl OpenAiResponsesModel {
    /// An adapter for `config` (its `base_url` up to, not including,
    /// `/responses`).
    pub fn new(config: OpenAiConfig) -> Result<Self, ModelError> {
        let endpoint = Endpoint::new(&config.base_url, "responses", bearer(&config)?, config.bounds(), transient)?;
        Ok(OpenAiResponsesModel { name: format!("openai-responses:{}", config.model), config, endpoint })
    }

    fn body<'a>(&'a self, request: &'a ModelRequest) -> Result<ResponsesRequest<'a>, ModelError> {
        let options = &request.options;
        Ok(ResponsesRequest {
            model: options.model.as_deref().unwrap_or(&self.config.model),
            input: request::input(request),
            store: false,
            instructions: &request.system,
            tools: self.endpoint.tools().of(request, request::tools)?,
            max_output_tokens: options.max_tokens.or(self.config.max_tokens),
            reasoning: options.reasoning_effort.as_deref().map(|effort| Reasoning { effort }),
            stream: self.config.stream,
        })
    }

    async fn complete_inner(&self, request: ModelRequest, cancel: CancellationToken) -> Result<ModelReply, ModelError> {
        let body = self.body(&request)?;
        let max_tokens = request.options.max_tokens.or(self.config.max_tokens).map_or(0, u64::from);
        self.endpoint.complete::<Response>(&body, max_tokens, self.config.stream, &request, &cancel).await
    }
}
