//! [`OpenAiConfig`]: where the OpenAI adapter connects and the bounds it
//! holds an endpoint to, set in code or from the environment.

use crate::agent::model::http::{env_var, http_config, EnvBounds};
use crate::agent::model::ModelError;

http_config! {
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
    pub struct OpenAiConfig {
        /// The answer's token limit when the run's route sets none (none: the
        /// endpoint's default).
        pub max_tokens: Option<u32> = None,
    }
}

impl OpenAiConfig {
    /// The OpenAI API: the endpoint when `SUBAGENTS_BASE_URL` (or a
    /// route's `base_url`) is unset.
    pub const DEFAULT_BASE_URL: &'static str = "https://api.openai.com/v1";

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

    /// Sets the answer's token limit for routes that set none.
    pub fn with_max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = Some(max_tokens);
        self
    }
}
