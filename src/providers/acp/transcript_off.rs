//! Without the `agent` feature there is no session store: an ACP child's
//! transcript is not recorded, and these stand in for `transcript.rs`
//! (the tool calls it reports failed are still counted).

use std::collections::HashSet;
use std::path::Path;
use std::sync::Mutex;

use agent_client_protocol::v1::schema::{
    RequestPermissionOutcome, RequestPermissionRequest, SessionUpdate, ToolCallStatus,
};

use super::Recording;
use crate::seam::{Answer, Diagnostic, StopReason};

#[derive(Debug, Default)]
pub(super) struct Stores;

/// The tool calls reported failed, by id.
#[derive(Debug, Default)]
pub(super) struct Transcript(Mutex<HashSet<String>>);

pub(super) fn session_id_of(child_id: &str) -> String {
    child_id.to_owned()
}

impl Transcript {
    pub(super) async fn open(&self, _: &Stores, _: &Path, _: &str, _: Recording) {}

    pub(super) fn prompt(&self, _: &str) {}

    pub(super) fn note(&self, update: &SessionUpdate) {
        let failed = match update {
            SessionUpdate::ToolCall(call) if call.status == ToolCallStatus::Failed => call.tool_call_id.to_string(),
            SessionUpdate::ToolCallUpdate(update) if update.fields.status == Some(ToolCallStatus::Failed) => {
                update.tool_call_id.to_string()
            }
            _ => return,
        };
        self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(failed);
    }

    pub(super) fn permission(&self, _: &RequestPermissionRequest, _: &RequestPermissionOutcome, _: &Answer) {}

    pub(super) async fn end(&self, _: StopReason, _: Option<&Diagnostic>) {}

    pub(super) fn tool_calls_failed(&self) -> u32 {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len() as u32
    }
}
