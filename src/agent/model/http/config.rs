//! What every HTTP adapter's configuration and model share, written once:
//! the bounds' defaults, the builder methods that set them, how the
//! `SUBAGENTS_MODEL_*` variables apply, and a model's handle on its
//! [`Endpoint`](super::Endpoint)'s limiter and reachability.
//!
//! The configurations keep their bounds as plain public fields (a user
//! reads and sets `config.max_tool_calls` directly), so what they share is
//! generated into each: [`http_config!`] declares a configuration, the
//! shared fields around the adapter's own, and [`http_model!`] gives a
//! model its handle on the endpoint and its `Model` impl.

use std::time::Duration;

const MIB: usize = 1 << 20;

/// The shared bounds' defaults (see `OpenAiConfig` for what each means).
pub(in crate::agent::model) struct Defaults;

impl Defaults {
    pub(in crate::agent::model) const TIMEOUT: Duration = Duration::from_secs(120);
    pub(in crate::agent::model) const MAX_RETRIES: u32 = 3;
    pub(in crate::agent::model) const RETRY_BACKOFF: Duration = Duration::from_millis(500);
    pub(in crate::agent::model) const MAX_ANSWER_BYTES: usize = 64 * MIB;
    pub(in crate::agent::model) const MAX_ERROR_BODY_BYTES: usize = MIB;
    pub(in crate::agent::model) const MAX_TOOL_CALLS: usize = 128;
    pub(in crate::agent::model) const MAX_TOOL_ARGUMENT_BYTES: usize = MIB;
    pub(in crate::agent::model) const CALL_DEADLINE: Duration = Duration::from_secs(600);
}

/// An HTTP adapter's configuration: the struct, with the fields every
/// adapter shares (`base_url`, `model`, `api_key` and the bounds) around its
/// own (given with their defaults), its `Debug` (the key redacted), `new`,
/// the builder methods that set the bounds, `bounds()` and
/// `apply_env_bounds()`.
macro_rules! http_config {
    (
        $(#[$doc:meta])*
        pub struct $config:ident {
            $( $(#[$field_doc:meta])* pub $field:ident: $field_type:ty = $default:expr, )*
        }
    ) => {
        $(#[$doc])*
        #[derive(Clone)]
        pub struct $config {
            /// Base URL up to (not including) the API's path
            /// (`/chat/completions`, `/responses` or `/v1/messages`).
            pub base_url: String,
            /// Model name sent when the route names none.
            pub model: String,
            /// The key, if the endpoint needs one (sent as a bearer key, or
            /// as Anthropic's `x-api-key`).
            pub api_key: Option<String>,
            $( $(#[$field_doc])* pub $field: $field_type, )*
            /// Bound on the response headers, a whole body, and each
            /// streamed chunk.
            pub timeout: std::time::Duration,
            /// Retries after a 429, a 5xx (and Anthropic's 529), a refused
            /// connection or a timeout.
            pub max_retries: u32,
            /// First backoff; doubled on each retry.
            pub retry_backoff: std::time::Duration,
            /// Stream answers (text reaches progress listeners as it arrives).
            pub stream: bool,
            /// Most bytes one answer may take: a whole body, or every byte of a
            /// stream together (64 MiB).
            pub max_answer_bytes: usize,
            /// Most bytes of an error status's body read for its message; the
            /// rest is left unread (1 MiB).
            pub max_error_body_bytes: usize,
            /// Most tool calls in one answer (128).
            pub max_tool_calls: usize,
            /// Most bytes of one tool call's arguments (1 MiB).
            pub max_tool_argument_bytes: usize,
            /// Bound on one whole model call: every try and backoff, the
            /// headers and the whole answer, however slowly the endpoint
            /// trickles it (and SSE keep-alive comments do not extend it)
            /// (600 s).
            pub call_deadline: std::time::Duration,
            /// The rate limits every call of the model passes (none by default).
            pub limits: $crate::agent::RouteLimits,
        }

        impl std::fmt::Debug for $config {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($config))
                    .field("base_url", &self.base_url)
                    .field("model", &self.model)
                    .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
                    $( .field(stringify!($field), &self.$field) )*
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

        impl $config {
            /// An endpoint and a model; no key, 120 s timeout, 3 retries,
            /// streaming, and the default bounds (see the table above).
            pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
                use $crate::agent::model::http::Defaults;
                $config {
                    base_url: base_url.into(),
                    model: model.into(),
                    api_key: None,
                    $( $field: $default, )*
                    timeout: Defaults::TIMEOUT,
                    max_retries: Defaults::MAX_RETRIES,
                    retry_backoff: Defaults::RETRY_BACKOFF,
                    stream: true,
                    max_answer_bytes: Defaults::MAX_ANSWER_BYTES,
                    max_error_body_bytes: Defaults::MAX_ERROR_BODY_BYTES,
                    max_tool_calls: Defaults::MAX_TOOL_CALLS,
                    max_tool_argument_bytes: Defaults::MAX_TOOL_ARGUMENT_BYTES,
                    call_deadline: Defaults::CALL_DEADLINE,
                    limits: $crate::agent::RouteLimits::default(),
                }
            }

            /// Sets the key.
            pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
                self.api_key = Some(key.into());
                self
            }

            /// Sets the timeout.
            pub fn with_timeout(mut self, timeout: std::time::Duration) -> Self {
                self.timeout = timeout;
                self
            }

            /// Sets retries and the first backoff.
            pub fn with_retries(mut self, max_retries: u32, backoff: std::time::Duration) -> Self {
                self.max_retries = max_retries;
                self.retry_backoff = backoff;
                self
            }

            /// Streams or not.
            pub fn with_stream(mut self, stream: bool) -> Self {
                self.stream = stream;
                self
            }

            /// Sets the most bytes one answer may take.
            pub fn with_max_answer_bytes(mut self, bytes: usize) -> Self {
                self.max_answer_bytes = bytes;
                self
            }

            /// Sets the most bytes of an error body read for its message.
            pub fn with_max_error_body_bytes(mut self, bytes: usize) -> Self {
                self.max_error_body_bytes = bytes;
                self
            }

            /// Sets the most tool calls in one answer and the most bytes of
            /// one call's arguments.
            pub fn with_tool_call_limits(mut self, calls: usize, argument_bytes: usize) -> Self {
                self.max_tool_calls = calls;
                self.max_tool_argument_bytes = argument_bytes;
                self
            }

            /// Sets the bound on one whole model call, retries included.
            pub fn with_call_deadline(mut self, deadline: std::time::Duration) -> Self {
                self.call_deadline = deadline;
                self
            }

            /// Sets the rate limits every call passes (a model's own limiter;
            /// a route's models share the route's instead).
            pub fn with_limits(mut self, limits: $crate::agent::RouteLimits) -> Self {
                self.limits = limits;
                self
            }

            /// The bounds as the shared HTTP layer holds them.
            pub(in crate::agent::model) fn bounds(&self) -> $crate::agent::model::http::Bounds {
                $crate::agent::model::http::Bounds {
                    timeout: self.timeout,
                    max_retries: self.max_retries,
                    retry_backoff: self.retry_backoff,
                    max_answer_bytes: self.max_answer_bytes,
                    max_error_body_bytes: self.max_error_body_bytes,
                    calls: $crate::agent::model::http::CallLimits {
                        calls: self.max_tool_calls,
                        argument_bytes: self.max_tool_argument_bytes,
                    },
                    call_deadline: self.call_deadline,
                    limits: self.limits,
                }
            }

            /// Applies the bounds the `SUBAGENTS_MODEL_*` variables set.
            fn apply_env_bounds(&mut self, bounds: &$crate::agent::model::http::EnvBounds) {
                self.max_answer_bytes = bounds.max_answer_bytes.unwrap_or(self.max_answer_bytes);
                self.max_error_body_bytes = bounds.max_error_body_bytes.unwrap_or(self.max_error_body_bytes);
                self.max_tool_calls = bounds.max_tool_calls.unwrap_or(self.max_tool_calls);
                self.max_tool_argument_bytes = bounds.max_tool_argument_bytes.unwrap_or(self.max_tool_argument_bytes);
                self.call_deadline = bounds.call_deadline.unwrap_or(self.call_deadline);
                self.limits = bounds.limits;
            }
        }
    };
}

/// What an HTTP adapter's model shares, given a struct with the fields
/// `config` (an [`http_config!`] configuration), `name` and `endpoint: Endpoint`,
/// and an `async fn complete_inner(&self, ModelRequest, CancellationToken)`:
/// its `Debug` (the name only: the configuration holds the key),
/// `with_limiter`, `limiter`, `check_reachable`, `probed`, and its [`Model`](crate::agent::Model)
/// impl, each call held to the configured `call_deadline`.
macro_rules! http_model {
    ($model:ident) => {
        impl std::fmt::Debug for $model {
            /// The name only: the configuration holds the key.
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($model)).field("name", &self.name).finish_non_exhaustive()
            }
        }

        impl $model {
            /// This adapter passing `limiter` instead of its own: models built
            /// for one route share its limits and its cool-downs.
            pub fn with_limiter(mut self, limiter: $crate::agent::Limiter) -> Self {
                self.endpoint = self.endpoint.with_limiter(limiter);
                self
            }

            /// The limiter every attempt passes.
            pub fn limiter(&self) -> &$crate::agent::Limiter {
                self.endpoint.limiter()
            }

            /// Whether the endpoint's host accepts a connection (within the
            /// timeout, at most 5 s): a cheap check before a batch of runs.
            pub async fn check_reachable(&self) -> Result<(), $crate::agent::ModelError> {
                self.endpoint.check_reachable().await
            }

            /// The model, shared, and a probe of its endpoint.
            pub(in crate::agent::model) fn probed(
                self,
            ) -> (std::sync::Arc<dyn $crate::agent::Model>, $crate::agent::model::Probe) {
                let model = std::sync::Arc::new(self);
                let held = model.clone();
                (model, Box::pin(async move { held.check_reachable().await }))
            }
        }

        impl $crate::agent::Model for $model {
            fn name(&self) -> &str {
                &self.name
            }

            fn complete(
                &self,
                request: $crate::agent::ModelRequest,
                cancel: tokio_util::sync::CancellationToken,
            ) -> futures_util::future::BoxFuture<'_, Result<$crate::agent::ModelReply, $crate::agent::ModelError>> {
                let deadline = self.config.call_deadline;
                Box::pin($crate::agent::model::http::bounded_call(
                    cancel.clone(),
                    deadline,
                    self.complete_inner(request, cancel),
                ))
            }
        }
    };
}

pub(in crate::agent::model) use {http_config, http_model};
