//! [`DelegationError`]: why a delegation gave no answer. Each message is
//! the tool error the calling model reads, worded so that it knows what to
//! do next.

use crate::seam::{BudgetExhausted, StartError, StopReason, SubagentError};

use super::super::tasks::TaskLimit;

/// Why a delegation ([`SubagentTool::begin`](super::SubagentTool::begin),
/// [`ForegroundRun::finish`](super::ForegroundRun::finish)) gave no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DelegationError {
    /// Cancelled before the child started: while queued under the run
    /// limit, or before the child was published.
    #[error("subagent run was cancelled")]
    Cancelled,
    /// The delegation budget refused the start; no child was started.
    #[error("delegation refused ({code}): {exhausted}; no subagent was started, finish the task without delegating")]
    BudgetExhausted {
        /// The stable error code ([`SubagentError::code`]).
        code: &'static str,
        /// What ran out.
        exhausted: BudgetExhausted,
    },
    /// The runtime or the provider refused the start.
    #[error("could not start the subagent: {0}")]
    Start(StartError),
    /// A background task was refused: the session holds too many.
    #[error(transparent)]
    TaskLimit(#[from] TaskLimit),
    /// The run ended without a result.
    #[error("subagent run failed: {0}")]
    NoResult(SubagentError),
    /// The run stopped other than completed; the message is
    /// [`stop_message`](super::stop_message), and for a failure what its
    /// diagnostic safely says of it.
    #[error("{message}")]
    Stopped {
        /// How it stopped.
        stop_reason: StopReason,
        /// The tool error.
        message: String,
    },
}

impl DelegationError {
    /// The error for a start that `error` refused.
    pub(super) fn refused_start(error: StartError) -> Self {
        let code = error.code();
        match error {
            // Cancelled before the child was published: still a cancelled run.
            StartError::Aborted { .. } => DelegationError::Cancelled,
            // Said so that the model stops delegating and finishes by itself.
            StartError::BudgetExhausted(exhausted) => DelegationError::BudgetExhausted { code, exhausted },
            error => DelegationError::Start(error),
        }
    }
}
