//! What a session's log holds: the [`SessionHeader`] that says who the
//! session is, and the [`SessionEvent`]s of its conversation. Both are
//! written to the session file as they are (one JSON object a line, see
//! [`file`](super::file)), so their serde names are the on-disk format.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::seam::{ContentBlock, RunUsage, StopReason};

/// Who a session is: written as the first line of its file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionHeader {
    /// The session id (also the file name).
    pub id: String,
    /// The delegating parent's session, if any.
    pub parent_session: Option<String>,
    /// Delegation depth: 0 for a top-level agent, parent + 1 for a child.
    pub depth: u32,
    /// The working directory the session's tools are confined to.
    pub cwd: PathBuf,
    /// The persona that replaced the default one, if any.
    pub persona: Option<String>,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// The provider that ran the session as a child, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The run's label, when it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

impl SessionHeader {
    /// A top-level header created now.
    pub fn new(id: impl Into<String>, cwd: impl Into<PathBuf>) -> Self {
        let created_at_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        SessionHeader {
            id: id.into(),
            parent_session: None,
            depth: 0,
            cwd: cwd.into(),
            persona: None,
            created_at_ms,
            provider: None,
            label: None,
        }
    }
}

/// A tool call requested by the model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The model's id for the call; results refer to it.
    pub id: String,
    /// The tool's name, as the model wrote it (it may not exist).
    pub name: String,
    /// The arguments. Arguments that were not valid JSON arrive as a string.
    pub arguments: serde_json::Value,
}

/// One entry of a session's log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SessionEvent {
    /// A user (or parent, or steering) message.
    User {
        /// The message.
        content: Vec<ContentBlock>,
    },
    /// What the model answered in one step.
    Assistant {
        /// The answer's text (possibly empty).
        text: String,
        /// Tool calls requested in the same answer.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    /// The result of one tool call.
    ToolResult {
        /// The call this answers.
        call_id: String,
        /// The tool's name.
        name: String,
        /// What the tool returned, or the error the model should see.
        content: String,
        /// Whether `content` is an error.
        #[serde(default)]
        is_error: bool,
    },
    /// The end of a turn, with its reason.
    TurnEnd {
        /// Why the turn ended.
        reason: StopReason,
        /// How long the turn took, where the recorder knows.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        duration_ms: Option<u64>,
        /// What the turn's model calls spent, where the recorder knows.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        usage: Option<RunUsage>,
    },
}

impl SessionEvent {
    /// How the turn ended, if this event ends one.
    pub fn ended(&self) -> Option<StopReason> {
        match self {
            SessionEvent::TurnEnd { reason, .. } => Some(*reason),
            _ => None,
        }
    }
}

/// `events` up to and including the last turn end (see
/// [`Session::completed_prefix`](super::Session::completed_prefix)), for a
/// log read from a file as well as a live one.
pub(crate) fn completed_prefix(events: &[SessionEvent]) -> &[SessionEvent] {
    let end = events.iter().rposition(|e| matches!(e, SessionEvent::TurnEnd { .. })).map_or(0, |i| i + 1);
    &events[..end]
}
