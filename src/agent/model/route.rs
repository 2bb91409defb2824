//! [`ModelRoute`]: a named way to reach a model (which API, where, with
//! which key, the answer's token limit, timeouts, retries) and the one
//! [`Limiter`] every run on it shares. The configuration file's
//! `[models.NAME]` tables become routes; a provider picks one by name.
//!
//! A route owns its limiter, so every model built from it (any number of
//! times, by any front door in the process) passes the same limits and
//! obeys the same cool-downs.
//!
//! ```
//! use subagents::agent::{Api, ModelRoute, RouteLimits};
//!
//! let limits = RouteLimits { requests_per_minute: Some(300), ..RouteLimits::default() };
//! let route = ModelRoute::new("fast", Api::OpenAiChat, "gpt-4o-mini", limits);
//! assert_eq!(route.limiter().limits().requests_per_minute, Some(300));
//! assert_eq!(route.clone(), route, "clones share the limiter");
//! ```

use std::sync::Arc;
use std::time::Duration;

use super::limit::{Limiter, RouteLimits};
use super::{Model, ModelError};

/// The wire protocol a route speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Api {
    /// OpenAI chat completions (`openai-chat`), and every server that
    /// copies it.
    OpenAiChat,
    /// The OpenAI Responses API (`openai-responses`).
    OpenAiResponses,
    /// Anthropic Messages (`anthropic`).
    Anthropic,
}

impl Api {
    /// The name a configuration spells it with.
    pub fn name(self) -> &'static str {
        match self {
            Api::OpenAiChat => "openai-chat",
            Api::OpenAiResponses => "openai-responses",
            Api::Anthropic => "anthropic",
        }
    }

    /// The model provider a route's runs name ([`ModelSpec::from_route`](super::ModelSpec::from_route)):
    /// `openai`, `openai-responses` or `anthropic`.
    pub fn provider(self) -> &'static str {
        match self {
            Api::OpenAiChat => "openai",
            Api::OpenAiResponses => "openai-responses",
            Api::Anthropic => "anthropic",
        }
    }

    /// Whether this build has the API's adapter (feature `openai` carries
    /// all three): `Err` names what is missing.
    pub fn check_built(self) -> Result<(), ApiNotBuilt> {
        if cfg!(feature = "openai") {
            return Ok(());
        }
        Err(ApiNotBuilt { api: self, feature: "openai" })
    }
}

/// A route's API whose adapter this build leaves out ([`Api::check_built`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("api {:?} needs the crate's {feature:?} feature", api.name())]
#[non_exhaustive]
pub struct ApiNotBuilt {
    /// The API.
    pub api: Api,
    /// The crate feature that carries its adapter.
    pub feature: &'static str,
}

/// A named model route.
#[derive(Clone, PartialEq, Eq)]
pub struct ModelRoute {
    /// Its name (`[models.NAME]`).
    pub name: String,
    /// The protocol.
    pub api: Api,
    /// Where the API lives (default: the API's public endpoint).
    pub base_url: Option<String>,
    /// The key sent with each call, if the endpoint needs one.
    pub api_key: Option<String>,
    /// The model name sent when a run's route names none.
    pub model: String,
    /// The answer's token limit when a run's route sets none.
    pub max_tokens: Option<u32>,
    /// Bound on each wait of a call (the adapter's default when `None`).
    pub timeout: Option<Duration>,
    /// Retries of a transient failure (the adapter's default when `None`).
    pub retries: Option<u32>,
    /// Whether its limits are the fleet's (`shared = true`): a `remote`
    /// worker books the route's starts on the broker's schedule
    /// ([`Limiter::share`]) instead of keeping them to itself.
    pub shared: bool,
    limiter: Limiter,
}

impl std::fmt::Debug for ModelRoute {
    /// Without the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelRoute")
            .field("name", &self.name)
            .field("api", &self.api)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .field("max_tokens", &self.max_tokens)
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .field("limits", &self.limiter.limits())
            .field("shared", &self.shared)
            .finish()
    }
}

impl ModelRoute {
    /// A route on `api` to `model`, with its own limiter enforcing
    /// `limits`; the rest unset.
    pub fn new(name: impl Into<String>, api: Api, model: impl Into<String>, limits: RouteLimits) -> Self {
        ModelRoute {
            name: name.into(),
            api,
            base_url: None,
            api_key: None,
            model: model.into(),
            max_tokens: None,
            timeout: None,
            retries: None,
            shared: false,
            limiter: Limiter::new(limits),
        }
    }

    /// The limiter every model built from the route shares.
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// A model on this route (the adapter its `api` names), passing its
    /// limiter.
    pub fn build(&self) -> Result<Arc<dyn Model>, ModelError> {
        #[cfg(feature = "openai")]
        return Ok(self.build_http()?.0);
        #[cfg(not(feature = "openai"))]
        Err(ModelError::Config(format!("route {:?}: {}", self.name, self.api.check_built().unwrap_err())))
    }

    /// The route's model, its base URL, and a probe of its endpoint.
    #[cfg(feature = "openai")]
    pub(super) fn build_http(&self) -> Result<(Arc<dyn Model>, String, super::Probe), ModelError> {
        use super::{AnthropicConfig, AnthropicModel, OpenAiConfig, OpenAiModel, OpenAiResponsesModel};
        let limiter = self.limiter.clone();
        if self.shared {
            limiter.meant_for_a_fleet(&self.name);
        }
        let ((model, probe), base_url) = match self.api {
            Api::OpenAiChat | Api::OpenAiResponses => {
                let base_url = self.base_url.clone().unwrap_or_else(|| OpenAiConfig::DEFAULT_BASE_URL.to_owned());
                let mut config = OpenAiConfig::new(base_url.clone(), self.model.clone());
                config.api_key = self.api_key.clone();
                config.max_tokens = self.max_tokens;
                config.timeout = self.timeout.unwrap_or(config.timeout);
                config.max_retries = self.retries.unwrap_or(config.max_retries);
                let model = match self.api {
                    Api::OpenAiChat => OpenAiModel::new(config)?.with_limiter(limiter).probed(),
                    _ => OpenAiResponsesModel::new(config)?.with_limiter(limiter).probed(),
                };
                (model, base_url)
            }
            Api::Anthropic => {
                let base_url = self.base_url.clone().unwrap_or_else(|| AnthropicConfig::DEFAULT_BASE_URL.to_owned());
                let mut config = AnthropicConfig::new(base_url.clone(), self.model.clone());
                config.api_key = self.api_key.clone();
                config.max_tokens = self.max_tokens.map_or(config.max_tokens, u64::from);
                config.timeout = self.timeout.unwrap_or(config.timeout);
                config.max_retries = self.retries.unwrap_or(config.max_retries);
                (AnthropicModel::new(config)?.with_limiter(limiter).probed(), base_url)
            }
        };
        Ok((model, base_url, probe))
    }
}
