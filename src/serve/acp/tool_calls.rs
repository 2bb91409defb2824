//! Tool calls as the ACP client sees them: ids unique within a session,
//! the `session/update` for each agent update, and the permission asked
//! before a tool named with `--approve` runs.
//!
//! **Ids**: a model's call ids are unique only within its turn (the
//! scripted model says `call_0` every turn), so the client sees
//! `<turn>-<model id>`, where `<turn>` counts the session's finished turns.
//! `tool_call`, `tool_call_update` and the permission request's `toolCall`
//! all carry that id. (Turns of one session never overlap, so the count is
//! the running turn's.)
//!
//! **Permission**: we offer `allow-once`, `allow-always` and `reject-once`.
//! The tool runs only when the client selects exactly one of those ids
//! whose kind is allow; any other answer (an id never offered, a reject, a
//! cancelled or failed request, the turn or the connection closing) is a
//! tool error the model sees. `allow-always` is remembered for that tool
//! for the rest of the session.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use agent_client_protocol::v1::schema::{
    ContentBlock as AcpBlock, ContentChunk, PermissionOption, PermissionOptionKind, RequestPermissionOutcome,
    RequestPermissionRequest, SessionId, SessionUpdate, ToolCall as AcpToolCall, ToolCallId, ToolCallStatus,
    ToolCallUpdate, ToolCallUpdateFields,
};
use agent_client_protocol::{v1, Client};
use futures_util::future::BoxFuture;
use serde_json::Value;

use crate::agent::{AgentUpdate, Tool, ToolContext, ToolOutput, ToolSpec};

/// Mints a session's client-facing tool call ids.
#[derive(Debug, Default)]
pub(super) struct ToolCallIds {
    finished_turns: AtomicU64,
}

impl ToolCallIds {
    /// The client-facing id of the running turn's call `call_id`.
    fn of(&self, call_id: &str) -> ToolCallId {
        ToolCallId::new(format!("{}-{call_id}", self.finished_turns.load(Ordering::Acquire)))
    }

    /// The `session/update` for `update`, if the client is told about it.
    pub(super) fn session_update(&self, update: &AgentUpdate) -> Option<SessionUpdate> {
        match update {
            AgentUpdate::Text(text) => {
                Some(SessionUpdate::AgentMessageChunk(ContentChunk::new(AcpBlock::from(text.clone()))))
            }
            AgentUpdate::ToolCall { id, name } => Some(SessionUpdate::ToolCall(
                AcpToolCall::new(self.of(id), name.clone()).status(ToolCallStatus::InProgress),
            )),
            AgentUpdate::ToolResult { id, is_error, .. } => {
                let status = if *is_error { ToolCallStatus::Failed } else { ToolCallStatus::Completed };
                Some(SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(
                    self.of(id),
                    ToolCallUpdateFields::new().status(status),
                )))
            }
            AgentUpdate::TurnEnd(_) => {
                self.finished_turns.fetch_add(1, Ordering::AcqRel);
                None
            }
        }
    }
}

const ALLOW_ONCE: &str = "allow-once";
const ALLOW_ALWAYS: &str = "allow-always";
const REJECT_ONCE: &str = "reject-once";

/// A tool that asks the client before each call, until it is always allowed.
pub(super) struct Approved {
    tool: Arc<dyn Tool>,
    cx: v1::ConnectionTo<Client>,
    session_id: SessionId,
    ids: Arc<ToolCallIds>,
    always_allowed: AtomicBool,
}

impl Approved {
    /// Wraps `tool` for the session `session_id`.
    pub(super) fn new(
        tool: Arc<dyn Tool>,
        cx: v1::ConnectionTo<Client>,
        session_id: SessionId,
        ids: Arc<ToolCallIds>,
    ) -> Self {
        Approved { tool, cx, session_id, ids, always_allowed: AtomicBool::new(false) }
    }

    /// Whether the client allows this call.
    async fn ask(&self, name: &str, context: &ToolContext) -> bool {
        let options = vec![
            PermissionOption::new(ALLOW_ONCE, "Allow", PermissionOptionKind::AllowOnce),
            PermissionOption::new(ALLOW_ALWAYS, "Always allow", PermissionOptionKind::AllowAlways),
            PermissionOption::new(REJECT_ONCE, "Reject", PermissionOptionKind::RejectOnce),
        ];
        let call = ToolCallUpdate::new(self.ids.of(&context.call_id), ToolCallUpdateFields::new().title(name));
        let request = RequestPermissionRequest::new(self.session_id.clone(), call, options.clone());
        let asked = self.cx.send_request(request).block_task();
        // The turn's token trips on session/cancel and at EOF (the client
        // can no longer answer then).
        let answer = tokio::select! {
            answer = asked => answer,
            _ = context.cancel.cancelled() => return false,
        };
        let Ok(RequestPermissionOutcome::Selected(selected)) = answer.map(|response| response.outcome) else {
            return false;
        };
        let Some(chosen) = options.iter().find(|option| option.option_id == selected.option_id) else {
            tracing::warn!(session = %self.session_id, tool = name, "the client chose a permission option never offered");
            return false;
        };
        match chosen.kind {
            PermissionOptionKind::AllowOnce => true,
            PermissionOptionKind::AllowAlways => {
                self.always_allowed.store(true, Ordering::Release);
                true
            }
            _ => false,
        }
    }
}

impl Tool for Approved {
    fn spec(&self) -> ToolSpec {
        self.tool.spec()
    }

    fn call(&self, arguments: Value, context: ToolContext) -> BoxFuture<'_, ToolOutput> {
        Box::pin(async move {
            let name = self.tool.spec().name;
            if self.always_allowed.load(Ordering::Acquire) || self.ask(&name, &context).await {
                self.tool.call(arguments, context).await
            } else {
                ToolOutput::error(format!("the client did not allow {name:?}"))
            }
        })
    }
}
