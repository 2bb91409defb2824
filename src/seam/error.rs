//! The typed errors of each operation: registration ([`RegisterError`]),
//! `start` ([`StartError`]), `dispose` ([`DisposeError`]) and steering
//! ([`SteeringError`]), each with only the variants that operation can
//! meet, and [`SubagentError`], every one of them, for code that handles
//! several operations in one place (each converts into it with `?`).
//!
//! Code matches on the variants, logs their messages, and keys on
//! `code()`, which never changes and is the same for a variant in its
//! operation's type and in the umbrella:
//!
//! ```
//! use subagents::seam::Capability;
//! use subagents::{StartError, SubagentError};
//!
//! let error = StartError::UnsupportedCapability { provider: "plain".into(), capability: Capability::Persona };
//! assert_eq!(error.code(), "UNSUPPORTED_CAPABILITY");
//! assert_eq!(error.to_string(), r#"subagent provider "plain" does not support the "persona" capability"#);
//! let umbrella = SubagentError::from(error);
//! assert_eq!(umbrella.code(), "UNSUPPORTED_CAPABILITY");
//! ```

use super::{BudgetExhausted, Capability, Diagnostic};

/// Everything the seam can refuse or fail with, for code that handles
/// several operations at once ([`Subagents::run_to_end`](crate::Subagents::run_to_end),
/// [`Run::result`](crate::Run::result)): each operation's own error,
/// wrapped as it is (its message unchanged), and the runtime stopped, said
/// one way whichever operation met it. `code()` is the wrapped error's.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SubagentError {
    /// A provider was not registered.
    #[error(transparent)]
    Register(RegisterError),
    /// A start was refused or failed.
    #[error(transparent)]
    Start(StartError),
    /// A run was not released cleanly.
    #[error(transparent)]
    Dispose(DisposeError),
    /// A steering message did not reach the run's child. Its code is
    /// `INVALID_REQUEST`, the message names the `message` field.
    #[error("invalid subagent request: message: {0}")]
    Steering(SteeringError),
    /// The runtime is shutting down or gone.
    #[error("the subagents runtime is stopped")]
    RuntimeStopped,
}

/// Why a provider was not registered.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum RegisterError {
    /// A provider of this name is already registered.
    #[error("a subagent provider named {0:?} is already registered")]
    DuplicateProvider(String),
    /// The runtime is shutting down or gone.
    #[error("the subagents runtime is stopped")]
    RuntimeStopped,
}

/// Why a start was refused or failed. No child is left behind: whatever
/// the provider made of it was rolled back.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
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
    /// The output schema leaves the supported subset.
    #[error("output_schema is outside the supported subset: {}", violations.join("; "))]
    UnsupportedSchema {
        /// Every path-qualified violation.
        violations: Vec<String>,
    },
    /// The start was cancelled.
    #[error("subagent start on provider {provider:?} was aborted")]
    Aborted {
        /// The provider asked.
        provider: String,
    },
    /// The provider could not create the child.
    #[error("subagent provider {provider:?} failed to start a child ({diagnostic})")]
    StartupFailed {
        /// The provider asked.
        provider: String,
        /// Safe facts about the failure.
        diagnostic: Diagnostic,
    },
    /// The runtime is shutting down or gone.
    #[error("the subagents runtime is stopped")]
    RuntimeStopped,
    /// The start would exceed the delegation budget it answers to.
    #[error("{0}")]
    BudgetExhausted(BudgetExhausted),
}

/// Why a run was not released cleanly ([`Run::dispose`](crate::Run::dispose)).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum DisposeError {
    /// The child could not be released cleanly: it was forced down, and
    /// this says where.
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
}

impl RegisterError {
    /// The stable error code.
    pub fn code(&self) -> &'static str {
        match self {
            RegisterError::DuplicateProvider(_) => "DUPLICATE_PROVIDER",
            RegisterError::RuntimeStopped => "RUNTIME_STOPPED",
        }
    }
}

impl StartError {
    /// The stable error code.
    pub fn code(&self) -> &'static str {
        match self {
            StartError::NoProvider(_) => "NO_PROVIDER",
            StartError::UnsupportedCapability { .. } => "UNSUPPORTED_CAPABILITY",
            StartError::InvalidRequest { .. } => "INVALID_REQUEST",
            StartError::UnsupportedSchema { .. } => "UNSUPPORTED_SCHEMA",
            StartError::Aborted { .. } => "ABORTED",
            StartError::StartupFailed { .. } => "STARTUP_FAILED",
            StartError::RuntimeStopped => "RUNTIME_STOPPED",
            StartError::BudgetExhausted(_) => "BUDGET_EXHAUSTED",
        }
    }

    pub(crate) fn unsupported(provider: &str, capability: Capability) -> Self {
        StartError::UnsupportedCapability { provider: provider.to_owned(), capability }
    }

    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        StartError::InvalidRequest { field, reason: reason.into() }
    }
}

impl DisposeError {
    /// The stable error code.
    pub fn code(&self) -> &'static str {
        match self {
            DisposeError::DisposeFailed { .. } => "DISPOSE_FAILED",
            DisposeError::RuntimeStopped => "RUNTIME_STOPPED",
        }
    }
}

impl From<RegisterError> for SubagentError {
    fn from(error: RegisterError) -> Self {
        match error {
            RegisterError::RuntimeStopped => SubagentError::RuntimeStopped,
            error => SubagentError::Register(error),
        }
    }
}

impl From<StartError> for SubagentError {
    fn from(error: StartError) -> Self {
        match error {
            StartError::RuntimeStopped => SubagentError::RuntimeStopped,
            error => SubagentError::Start(error),
        }
    }
}

impl From<DisposeError> for SubagentError {
    fn from(error: DisposeError) -> Self {
        match error {
            DisposeError::RuntimeStopped => SubagentError::RuntimeStopped,
            error => SubagentError::Dispose(error),
        }
    }
}

impl From<SteeringError> for SubagentError {
    fn from(error: SteeringError) -> Self {
        SubagentError::Steering(error)
    }
}

impl SubagentError {
    /// The stable error code: the wrapped error's.
    pub fn code(&self) -> &'static str {
        match self {
            SubagentError::Register(error) => error.code(),
            SubagentError::Start(error) => error.code(),
            SubagentError::Dispose(error) => error.code(),
            SubagentError::Steering(error) => error.code(),
            SubagentError::RuntimeStopped => "RUNTIME_STOPPED",
        }
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
/// assert_eq!(settled, SteeringError::NotRunning);
/// assert_eq!(settled.code(), "INVALID_REQUEST");
/// assert_eq!(SubagentError::from(settled).to_string(), "invalid subagent request: message: the run is no longer running");
/// assert_eq!(disposed, SteeringError::Disposed);
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

impl SteeringError {
    /// The stable error code: the message was refused, `INVALID_REQUEST`.
    pub fn code(&self) -> &'static str {
        "INVALID_REQUEST"
    }
}
