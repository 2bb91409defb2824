//! The typed errors `start`, `dispose`, registration and steering return.
//!
//! Code matches on the variants, logs their messages, and keys on
//! [`SubagentError::code`], which never changes:
//!
//! ```
//! use subagents::seam::Capability;
//! use subagents::SubagentError;
//!
//! let error = SubagentError::UnsupportedCapability { provider: "plain".into(), capability: Capability::Persona };
//! assert_eq!(error.code(), "UNSUPPORTED_CAPABILITY");
//! assert_eq!(error.to_string(), r#"subagent provider "plain" does not support the "persona" capability"#);
//! ```

use super::{BudgetExhausted, Capability, Diagnostic};

/// Everything the seam can refuse or fail with. `code()` is stable; the
/// message names the offending provider, capability or field.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SubagentError {
    /// A provider of this name is already registered.
    #[error("a subagent provider named {0:?} is already registered")]
    DuplicateProvider(String),
    /// No provider of this name is registered.
    #[error("no subagent provider registered for {0:?}")]
    NoProvider(String),
    /// The request asks for a start-time feature the provider lacks.
    #[error("subagent provider {provider:?} does not support the \"{capability}\" capability")]
    UnsupportedCapability {
        /// The provider asked.
        provider: String,
        /// The first unmet capability, in check order.
        capability: Capability,
    },
    /// A request value is out of range or malformed.
    #[error("invalid subagent request: {field}: {reason}")]
    InvalidRequest {
        /// The offending field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A steering message did not reach the run's child. Its code is
    /// `INVALID_REQUEST`, the message names the `message` field.
    #[error("invalid subagent request: message: {0}")]
    Steering(SteeringError),
    /// The output schema leaves the supported subset.
    #[error("output_schema is outside the supported subset: {}", violations.join("; "))]
    UnsupportedSchema {
        /// Every path-qualified violation.
        violations: Vec<String>,
    },
    /// The start was cancelled; everything partial was rolled back.
    #[error("subagent start on provider {provider:?} was aborted")]
    Aborted {
        /// The provider asked.
        provider: String,
    },
    /// The provider could not create the child; everything partial was
    /// rolled back.
    #[error("subagent provider {provider:?} failed to start a child ({diagnostic})")]
    StartupFailed {
        /// The provider asked.
        provider: String,
        /// Safe facts about the failure.
        diagnostic: Diagnostic,
    },
    /// A child could not be released cleanly: it was forced down, and this
    /// says where.
    #[error("subagent provider {provider:?} could not dispose a child cleanly ({diagnostic})")]
    DisposeFailed {
        /// The provider asked.
        provider: String,
        /// Safe facts about the failure.
        diagnostic: Diagnostic,
    },
    /// The runtime is shutting down or gone.
    #[error("the subagents runtime is stopped")]
    RuntimeStopped,
    /// The start would exceed the delegation budget it answers to; no child
    /// was created. The message names the limit and the numbers.
    #[error("{0}")]
    BudgetExhausted(BudgetExhausted),
}

impl SubagentError {
    /// The stable error code.
    pub fn code(&self) -> &'static str {
        match self {
            SubagentError::DuplicateProvider(_) => "DUPLICATE_PROVIDER",
            SubagentError::NoProvider(_) => "NO_PROVIDER",
            SubagentError::UnsupportedCapability { .. } => "UNSUPPORTED_CAPABILITY",
            SubagentError::InvalidRequest { .. } | SubagentError::Steering(_) => "INVALID_REQUEST",
            SubagentError::UnsupportedSchema { .. } => "UNSUPPORTED_SCHEMA",
            SubagentError::Aborted { .. } => "ABORTED",
            SubagentError::StartupFailed { .. } => "STARTUP_FAILED",
            SubagentError::DisposeFailed { .. } => "DISPOSE_FAILED",
            SubagentError::RuntimeStopped => "RUNTIME_STOPPED",
            SubagentError::BudgetExhausted(_) => "BUDGET_EXHAUSTED",
        }
    }

    pub(crate) fn unsupported(provider: &str, capability: Capability) -> Self {
        SubagentError::UnsupportedCapability { provider: provider.to_owned(), capability }
    }

    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        SubagentError::InvalidRequest { field, reason: reason.into() }
    }
}

/// Why a steering message ([`Steering`](crate::Steering), a child's
/// [`send_message`](crate::seam::Child::send_message)) was refused.
///
/// ```
/// use subagents::providers::MockProvider;
/// use subagents::seam::SteeringError;
/// use subagents::{CancellationToken, Parent, Runtime, StartRequest, SubagentError};
///
/// let runtime = Runtime::builder().workers(1).build().unwrap();
/// let subagents = runtime.subagents();
/// subagents.register_provider(MockProvider::new("mock").with_wait_for_message()).unwrap().keep();
/// let (settled, disposed) = runtime.block_on(async move {
///     let request = StartRequest::new("wait for a message", Parent::root("/tmp"), CancellationToken::new());
///     let run = subagents.start("mock", request).await.unwrap();
///     let steering = run.steering().expect("the mock takes messages");
///     steering.send("go ahead").await.unwrap();
///     run.result().await.unwrap();
///     let settled = steering.send("too late").await.unwrap_err();
///     run.dispose().await.unwrap();
///     (settled, steering.send("gone").await.unwrap_err())
/// });
/// assert_eq!(settled, SubagentError::Steering(SteeringError::NotRunning));
/// assert_eq!(settled.code(), "INVALID_REQUEST");
/// assert_eq!(settled.to_string(), "invalid subagent request: message: the run is no longer running");
/// assert_eq!(disposed, SubagentError::Steering(SteeringError::Disposed));
/// runtime.shutdown_blocking();
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SteeringError {
    /// The child takes no messages (the default of
    /// [`Child::send_message`](crate::seam::Child::send_message)).
    #[error("this child does not accept messages")]
    Unsupported,
    /// The run has settled, or is being cancelled or disposed.
    #[error("the run is no longer running")]
    NotRunning,
    /// The run's actor is gone: the run was disposed.
    #[error("the run is disposed")]
    Disposed,
    /// The child's `send_message` panicked (the runtime contained it).
    #[error("the child failed to take the message")]
    ChildFailed,
}
