//! [`AnthropicConfig`]: where the Anthropic adapter connects, the token
//! limit it asks for, and the bounds it holds the endpoint to, set in code
//! or from the environment.

use crate::agent::model::http::{env_var, http_config, EnvBounds};
use crate::agent::model::ModelError;

http_config! {
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
    pub struct AnthropicConfig {
        /// Tokens asked for when the route sets no `max_tokens` (4096).
        pub max_tokens: u64 = 4096,
    }
}

impl AnthropicConfig {
    /// The Anthropic API: the endpoint when `ANTHROPIC_BASE_URL` (or a
    /// route's `base_url`) is unset.
    pub const DEFAULT_BASE_URL: &'static str = "https://api.anthropic.com";

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

    /// Sets the tokens asked for when the route sets none.
    pub fn with_max_tokens(mut self, max_tokens: u64) -> Self {
        self.max_tokens = max_tokens;
        self
    }
}
