//! Live progress a running child reports to its run (SPEC §11): the
//! payload of the `Progress` event. It lives in the seam because providers
//! produce it; the events module wraps it with the run's identity.

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
        /// Status such as `pending`, `completed`, `failed`.
        status: String,
    },
    /// The child's current plan.
    Plan {
        /// Plan entries in order.
        entries: Vec<String>,
    },
}
