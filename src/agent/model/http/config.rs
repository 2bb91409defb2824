//! What every HTTP adapter's configuration and model share, written once:
//! the bounds' defaults, the builder methods that set them, how the
//! `SUBAGENTS_MODEL_*` variables apply, and a model's handle on its
//! [`Endpoint`](super::Endpoint)'s limiter and reachability.
//!
//! The configurations keep their bounds as plain public fields (a user
//! reads and sets `config.max_tool_calls` directly), so what they share is
//! generated into each: [`http_config!`] inside an `impl` of a
//! configuration with those fields, [`endpoint_handle!`] inside an `impl`
//! of a model with an `endpoint` field.

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

/// The builder methods, `bounds()` and `apply_env_bounds()` of an HTTP
/// adapter's configuration: a struct with the fields `timeout`,
/// `max_retries`, `retry_backoff`, `stream`, `max_answer_bytes`,
/// `max_error_body_bytes`, `max_tool_calls`, `max_tool_argument_bytes`,
/// `call_deadline` and `limits`.
macro_rules! http_config {
    () => {
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

        /// Sets the most tool calls in one answer and the most bytes of one
        /// call's arguments.
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

        /// Sets the rate limits every call passes (a model's own limiter; a
        /// route's models share the route's instead).
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
    };
}

/// `with_limiter`, `limiter` and `check_reachable` of an HTTP adapter: a
/// model with an `endpoint: Endpoint` field.
macro_rules! endpoint_handle {
    () => {
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
    };
}

pub(in crate::agent::model) use {endpoint_handle, http_config};
