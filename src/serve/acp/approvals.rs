//! A descendant's permission request, asked of this session's ACP client.
//!
//! Each session's agent carries a route to a [`ClientApprover`]
//! ([`crate::seam::Approvals`]): a child or grandchild it delegates to
//! (an ACP agent with `permission = "ask"`, say) whose request climbs this
//! far is shown to the client as its own tool call — a `tool_call` titled
//! `<who> asks: <what>`, kind as the child said — and asked with
//! `session/request_permission`, offering exactly the options the child
//! offered (their ids and kinds). So Zed, or any ACP client, approves a
//! grandchild's edit.
//!
//! The client's answer is a verdict only when it selects one of those
//! options; an id never offered, `cancelled`, an error answer or the
//! connection closing is a reject. When the asker's run stops waiting (its
//! cancel, its timeout) the request is dropped, which withdraws it on the
//! wire. The tool call is then closed: `completed` when allowed, `failed`
//! otherwise.

use std::sync::atomic::{AtomicU64, Ordering};

use agent_client_protocol::v1::schema::{
    SessionId, SessionNotification, SessionUpdate, ToolCall as AcpToolCall, ToolCallId, ToolCallStatus, ToolCallUpdate,
    ToolCallUpdateFields,
};
use agent_client_protocol::{v1, Client};
use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::seam::{Answer, Approver, PermissionRequest, Verdict};
use crate::wire::acp::{acp_request_of, option_chosen};

/// Asks one session's client.
pub(super) struct ClientApprover {
    cx: v1::ConnectionTo<Client>,
    session_id: SessionId,
    /// Numbers the requests' tool calls (`approval-N`), apart from the
    /// model's own call ids.
    asked: AtomicU64,
}

impl ClientApprover {
    pub(super) fn new(cx: v1::ConnectionTo<Client>, session_id: SessionId) -> Self {
        ClientApprover { cx, session_id, asked: AtomicU64::new(0) }
    }
}

impl std::fmt::Debug for ClientApprover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientApprover").field("session", &self.session_id.to_string()).finish()
    }
}

/// Who answered, as the asker's transcript records it.
const BY_CLIENT: &str = "the ACP client of subagents acp";

impl Approver for ClientApprover {
    fn ask(&self, request: PermissionRequest, cancel: CancellationToken) -> BoxFuture<'static, Answer> {
        let call_id = format!("approval-{}", self.asked.fetch_add(1, Ordering::Relaxed) + 1);
        let asked = acp_request_of(self.session_id.clone(), &call_id, &request);
        let (cx, session_id) = (self.cx.clone(), self.session_id.clone());
        Box::pin(async move {
            // The client sees the question as a tool call of its own first.
            let title = asked.tool_call.fields.title.clone().unwrap_or_default();
            let mut call = AcpToolCall::new(ToolCallId::new(call_id.clone()), title).status(ToolCallStatus::Pending);
            if let Some(kind) = asked.tool_call.fields.kind {
                call = call.kind(kind);
            }
            let _ = cx.send_notification(SessionNotification::new(session_id.clone(), SessionUpdate::ToolCall(call)));
            let answered = tokio::select! {
                answered = cx.send_request(asked).block_task() => answered,
                _ = cancel.cancelled() => Err(agent_client_protocol::Error::internal_error()),
            };
            let answer = match &answered {
                Ok(response) => match option_chosen(&request, &response.outcome) {
                    Some(option) => Answer::chose(option, BY_CLIENT),
                    None => Answer::new(Verdict::Reject, BY_CLIENT),
                },
                Err(_) => Answer::reject(format!("{BY_CLIENT} did not answer")),
            };
            let status = if answer.verdict.allows() { ToolCallStatus::Completed } else { ToolCallStatus::Failed };
            let closed = ToolCallUpdate::new(ToolCallId::new(call_id), ToolCallUpdateFields::new().status(status));
            let _ = cx.send_notification(SessionNotification::new(session_id, SessionUpdate::ToolCallUpdate(closed)));
            answer
        })
    }
}
