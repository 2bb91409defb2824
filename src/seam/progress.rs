//! Live progress a running child reports to its run (docs/contract.md §11.1): the
//! payload of the `Progress` event. It lives in the seam because providers
//! produce it; the events module wraps it with the run's identity.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// One piece of live progress.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ProgressUpdate {
    /// A chunk of the child's message text.
    MessageChunk {
        /// The text.
        text: String,
    },
    /// A tool call started or changed status.
    ToolCall {
        /// Tool name.
        name: String,
        /// Where the call stands.
        status: ToolCallStatus,
    },
    /// Progress of a run this child delegated to (one level down per
    /// `Delegated`): how a grandchild's activity reaches the top.
    Delegated {
        /// What the delegated run reported.
        update: Box<ProgressUpdate>,
    },
    /// The child's current plan.
    Plan {
        /// Plan entries in order.
        entries: Vec<String>,
    },
}

/// Where a tool call stands, as progress and the `serve` wire carry it.
/// Each status has one stable spelling on the wire (its [`as_str`]), and
/// a spelling this version does not know reads as
/// [`ToolCallStatus::Unknown`] rather than failing the whole update: a
/// child may be newer than its parent.
///
/// [`as_str`]: ToolCallStatus::as_str
///
/// ```
/// use subagents::seam::ToolCallStatus;
///
/// assert_eq!(serde_json::to_string(&ToolCallStatus::InProgress).unwrap(), r#""inprogress""#);
/// let later: ToolCallStatus = serde_json::from_str(r#""awaiting_review""#).unwrap();
/// assert_eq!(later, ToolCallStatus::Unknown);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum ToolCallStatus {
    /// About to run (or waiting for its input or an approval).
    Pending,
    /// Running.
    InProgress,
    /// Finished.
    Completed,
    /// Finished with an error.
    Failed,
    /// Changed without saying its status (a new title, say).
    Updated,
    /// A status this version has no name for.
    #[serde(other)]
    Unknown,
}

impl ToolCallStatus {
    /// The status's spelling on the wire (`pending`, `inprogress`,
    /// `completed`, `failed`, `updated`, `unknown`).
    pub fn as_str(self) -> &'static str {
        match self {
            ToolCallStatus::Pending => "pending",
            ToolCallStatus::InProgress => "inprogress",
            ToolCallStatus::Completed => "completed",
            ToolCallStatus::Failed => "failed",
            ToolCallStatus::Updated => "updated",
            ToolCallStatus::Unknown => "unknown",
        }
    }
}

impl fmt::Display for ToolCallStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ProgressUpdate {
    /// How many delegations below the reporting run this happened (0: the
    /// run itself).
    pub fn depth(&self) -> usize {
        match self {
            ProgressUpdate::Delegated { update } => 1 + update.depth(),
            _ => 0,
        }
    }

    /// The update this one wraps, past every `Delegated` level.
    pub fn innermost(&self) -> &ProgressUpdate {
        match self {
            ProgressUpdate::Delegated { update } => update.innermost(),
            other => other,
        }
    }
}

/// Receives the progress of one run as it happens, besides the runtime's
/// `Progress` events: set with [`StartRequest::with_progress`](crate::StartRequest::with_progress). The model-facing subagent tool
/// uses it to pass a child's activity to its own caller. Called on the
/// run's thread: keep it short.
#[derive(Clone)]
pub struct ProgressSink(Arc<dyn Fn(&ProgressUpdate) + Send + Sync>);

impl ProgressSink {
    /// A sink calling `receive` for each update.
    pub fn new(receive: impl Fn(&ProgressUpdate) + Send + Sync + 'static) -> Self {
        ProgressSink(Arc::new(receive))
    }

    /// Hands `update` to the sink.
    pub fn send(&self, update: &ProgressUpdate) {
        (self.0)(update)
    }
}

impl fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ProgressSink")
    }
}
