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
//! **Children's progress**: a subagent call shows what it was asked (its
//! title is `subagent: <description>`, kind `think`, `rawInput` the
//! arguments) and, as the child works, `tool_call_update`s whose content
//! is the child's activity: its text, its own tool calls, and its
//! children's, indented one step per level. Bounded: at most one update per
//! call every [`PROGRESS_INTERVAL`] (the rest is batched into the next),
//! and the content keeps the last [`PROGRESS_BYTES`] of text, so a chatty
//! child cannot flood the client.
//!
//! **Permission**: we offer `allow-once`, `allow-always` and `reject-once`.
//! The tool runs only when the client selects exactly one of those ids
//! whose kind is allow; any other answer (an id never offered, a reject, a
//! cancelled or failed request, the turn or the connection closing) is a
//! tool error the model sees. `allow-always` is remembered for that tool
//! for the rest of the session.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_client_protocol::v1::schema::{
    ContentBlock as AcpBlock, ContentChunk, PermissionOption, PermissionOptionKind, RequestPermissionOutcome,
    RequestPermissionRequest, SessionId, SessionUpdate, ToolCall as AcpToolCall, ToolCallContent, ToolCallId,
    ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields, ToolKind,
};
use agent_client_protocol::{v1, Client};
use futures_util::future::BoxFuture;
use serde_json::Value;

use crate::agent::{AgentUpdate, Tool, ToolContext, ToolOutput, ToolSpec};
use crate::seam::ProgressUpdate;

/// The shortest time between two progress updates of one tool call.
pub(super) const PROGRESS_INTERVAL: Duration = Duration::from_millis(100);

/// The most progress text one tool call's content keeps (its tail).
pub(super) const PROGRESS_BYTES: usize = 16 * 1024;

/// Mints a session's client-facing tool call ids, and keeps the progress
/// of its running tool calls.
#[derive(Debug, Default)]
pub(super) struct ToolCallIds {
    finished_turns: AtomicU64,
    progress: Mutex<HashMap<String, Progress>>,
}

/// What a running call's child has done so far.
#[derive(Debug)]
struct Progress {
    text: String,
    last_sent: Option<Instant>,
    unsent: bool,
}

impl ToolCallIds {
    /// The client-facing id of the running turn's call `call_id`.
    fn of(&self, call_id: &str) -> ToolCallId {
        ToolCallId::new(format!("{}-{call_id}", self.finished_turns.load(Ordering::Acquire)))
    }

    /// The `session/update`s for `update` (none when the client is not
    /// told about it).
    pub(super) fn session_updates(&self, update: &AgentUpdate) -> Vec<SessionUpdate> {
        match update {
            AgentUpdate::Text(text) => {
                vec![SessionUpdate::AgentMessageChunk(ContentChunk::new(AcpBlock::from(text.clone())))]
            }
            AgentUpdate::ToolCall { id, name, arguments } => {
                let mut call = AcpToolCall::new(self.of(id), name.clone()).status(ToolCallStatus::InProgress);
                if let Some(description) = arguments.get("description").and_then(Value::as_str) {
                    // A delegating call: say what the child was asked.
                    call = AcpToolCall::new(self.of(id), format!("{name}: {description}"))
                        .status(ToolCallStatus::InProgress)
                        .kind(ToolKind::Think)
                        .raw_input(arguments.clone());
                }
                vec![SessionUpdate::ToolCall(call)]
            }
            AgentUpdate::ToolProgress { id, update } => self.progress(id, update).into_iter().collect(),
            AgentUpdate::ToolResult { id, is_error, .. } => {
                let status = if *is_error { ToolCallStatus::Failed } else { ToolCallStatus::Completed };
                let mut fields = ToolCallUpdateFields::new().status(status);
                let finished = self.progress.lock().unwrap_or_else(|e| e.into_inner()).remove(id);
                if let Some(progress) = finished.filter(|p| p.unsent) {
                    fields = fields.content(vec![ToolCallContent::from(progress.text)]);
                }
                vec![SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(self.of(id), fields))]
            }
            AgentUpdate::TurnEnd(_) => {
                self.finished_turns.fetch_add(1, Ordering::AcqRel);
                self.progress.lock().unwrap_or_else(|e| e.into_inner()).clear();
                Vec::new()
            }
        }
    }

    /// Adds a child's `update` to call `id`'s content; the update to send
    /// now, unless the last one went out less than an interval ago.
    fn progress(&self, id: &str, update: &ProgressUpdate) -> Option<SessionUpdate> {
        let mut calls = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        let progress = calls.entry(id.to_owned()).or_insert_with(|| Progress {
            text: String::new(),
            last_sent: None,
            unsent: false,
        });
        append(&mut progress.text, update);
        progress.unsent = true;
        let due = progress.last_sent.is_none_or(|at| at.elapsed() >= PROGRESS_INTERVAL);
        if !due {
            return None;
        }
        progress.last_sent = Some(Instant::now());
        progress.unsent = false;
        let fields = ToolCallUpdateFields::new().content(vec![ToolCallContent::from(progress.text.clone())]);
        Some(SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(self.of(id), fields)))
    }
}

/// Appends one child update as text: message chunks as they come, tool
/// calls and plans on lines of their own, a grandchild's indented.
fn append(text: &mut String, update: &ProgressUpdate) {
    let indent = "  ".repeat(update.depth());
    match update.innermost() {
        ProgressUpdate::MessageChunk { text: chunk } if update.depth() == 0 => text.push_str(chunk),
        ProgressUpdate::MessageChunk { text: chunk } => text.push_str(&format!("\n{indent}{chunk}")),
        ProgressUpdate::ToolCall { name, status } => text.push_str(&format!("\n{indent}[{name}: {status}]\n")),
        ProgressUpdate::Plan { entries } => text.push_str(&format!("\n{indent}plan: {}\n", entries.join("; "))),
        _ => {}
    }
    if text.len() > PROGRESS_BYTES {
        let mut cut = text.len() - PROGRESS_BYTES;
        while !text.is_char_boundary(cut) {
            cut += 1;
        }
        text.replace_range(..cut, "…");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grandchilds_activity_is_indented_and_the_text_stays_bounded() {
        let mut text = String::new();
        append(&mut text, &ProgressUpdate::MessageChunk { text: "child says".into() });
        let grandchild =
            ProgressUpdate::ToolCall { name: "read_file".into(), status: crate::seam::ToolCallStatus::Pending };
        append(&mut text, &ProgressUpdate::Delegated { update: Box::new(grandchild) });
        assert_eq!(text, "child says\n  [read_file: pending]\n");
        for _ in 0..10_000 {
            append(&mut text, &ProgressUpdate::MessageChunk { text: "chatter ".into() });
        }
        assert!(text.len() <= PROGRESS_BYTES + "…".len() && text.starts_with('…'), "{}", text.len());
    }

    #[test]
    fn progress_of_one_call_is_sent_at_most_once_per_interval_and_the_rest_at_its_end() {
        let ids = ToolCallIds::default();
        let chunk = |text: &str| AgentUpdate::ToolProgress {
            id: "call_0".into(),
            update: ProgressUpdate::MessageChunk { text: text.into() },
        };
        assert_eq!(ids.session_updates(&chunk("a")).len(), 1, "the first goes out at once");
        assert!(ids.session_updates(&chunk("b")).is_empty(), "the next waits for the interval");
        let end = AgentUpdate::ToolResult { id: "call_0".into(), name: "subagent".into(), is_error: false };
        let ended = ids.session_updates(&end);
        let ended = serde_json::to_value(&ended).unwrap();
        assert_eq!(ended[0]["content"][0]["content"]["text"], "ab", "the held text goes out with the result: {ended}");
    }
}
