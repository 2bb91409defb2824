//! An ACP child's transcript, kept in the parent's home as that child's
//! session: the same store and format as an in-process child's, linked by
//! lineage (its header names the parent's session), so `subagents
//! sessions tree` of the parent reaches it and `show` reads it.
//!
//! What the agent reports becomes session events: the prompt a `user`
//! message; its text an `assistant` message (flushed when something else
//! comes between); its thoughts and plans `assistant` messages marked
//! `thinking:` and `plan:`; each tool call an `assistant` message asking
//! for it (its title as the name, its raw input as the arguments) and,
//! once it completed or failed, a `tool_result` with its text content
//! (`is_error` when it failed); each permission request a `tool_result`
//! named `permission` saying what was asked, the answer and who gave it;
//! a failure's whole account; the turn's end. A tool call the agent
//! reports failed is counted ([`Transcript::tool_calls_failed`]).
//!
//! Bounded like every store write: one piece of text is kept to
//! [`MAX_PIECE_BYTES`], and a session to [`MAX_TRANSCRIPT_BYTES`], where
//! one marker line says it was cut and nothing more is kept but its end.
//! The writes queue on the store's lane; nothing waits for the disk. The
//! session is opened once the agent's session exists, so an update before
//! it (none is expected before the prompt) is not recorded.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Mutex;

use agent_client_protocol::v1::schema::{
    Content, ContentBlock as AcpBlock, ContentChunk, RequestPermissionOutcome, RequestPermissionRequest, SessionUpdate,
    ToolCallContent, ToolCallStatus,
};

use super::Recording;
pub(super) use crate::agent::HomeStores as Stores;
use crate::agent::{Session, SessionEvent, SessionHeader, ToolCall};
use crate::seam::{cut, Answer, Diagnostic, StopReason};

/// The most of one piece of text (a message, a tool's output) kept.
pub(crate) const MAX_PIECE_BYTES: usize = 64 * 1024;

/// The most one transcript keeps before its marker.
pub(crate) const MAX_TRANSCRIPT_BYTES: usize = 4 << 20;

/// One ACP session's transcript as it is recorded.
#[derive(Debug, Default)]
pub(super) struct Transcript(Mutex<Recorder>);

#[derive(Debug, Default)]
struct Recorder {
    session: Option<Session>,
    /// Text and thoughts not yet written (they stream in chunks).
    text: String,
    thought: String,
    /// The bytes kept so far, and whether the cap was met.
    kept: usize,
    cut: bool,
    /// Each tool call's title, and the calls already given a result.
    titles: HashMap<String, String>,
    finished: HashSet<String>,
    failed: u32,
}

/// A child's session id from its run's child id: the characters a session
/// id may not hold become `_`, at most 200 bytes.
pub(super) fn session_id_of(child_id: &str) -> String {
    let safe = |c: char| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':') { c } else { '_' };
    let id: String = child_id.chars().map(safe).collect();
    let id = cut(&id, 200).trim_start_matches('.');
    if id.is_empty() {
        "acp".to_owned()
    } else {
        id.to_owned()
    }
}

impl Transcript {
    /// Opens the session `id` in `home`'s store; a session that cannot be
    /// created is logged and the run goes on unrecorded.
    pub(super) async fn open(&self, stores: &Stores, home: &Path, id: &str, recording: Recording) {
        let mut header = SessionHeader::new(id, recording.cwd);
        header.parent_session = recording.parent_session;
        header.depth = recording.depth;
        header.persona = recording.persona;
        (header.provider, header.label) = (Some(recording.provider), recording.label);
        let store = stores.of(home);
        match store.creating(header, Vec::new()).await {
            Ok(session) => self.lock().session = Some(session),
            Err(error) => tracing::warn!(session = id, %error, "an ACP child's transcript cannot be recorded"),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Recorder> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The prompt, as the session's user message.
    pub(super) fn prompt(&self, text: &str) {
        let content = vec![crate::seam::ContentBlock::text(piece(text))];
        self.lock().append(SessionEvent::User { content });
    }

    /// One session update of the agent.
    pub(super) fn note(&self, update: &SessionUpdate) {
        let mut recorder = self.lock();
        if recorder.session.is_none() {
            return;
        }
        match update {
            SessionUpdate::AgentMessageChunk(ContentChunk { content: AcpBlock::Text(chunk), .. }) => {
                recorder.flush_thought();
                grow(&mut recorder.text, &chunk.text);
            }
            SessionUpdate::AgentThoughtChunk(ContentChunk { content: AcpBlock::Text(chunk), .. }) => {
                recorder.flush_text();
                grow(&mut recorder.thought, &chunk.text);
            }
            SessionUpdate::ToolCall(call) => {
                recorder.flush();
                let id = call.tool_call_id.to_string();
                recorder.titles.insert(id.clone(), piece(&call.title));
                let arguments = call.raw_input.clone().unwrap_or_else(|| serde_json::json!({}));
                let arguments = bounded_json(arguments);
                let call_event = ToolCall { id: id.clone(), name: piece(&call.title), arguments };
                recorder.append(SessionEvent::Assistant { text: String::new(), tool_calls: vec![call_event] });
                recorder.finish_call(&id, call.status, &call.content, call.raw_output.as_ref());
            }
            SessionUpdate::ToolCallUpdate(update) => {
                let id = update.tool_call_id.to_string();
                if let Some(title) = &update.fields.title {
                    recorder.titles.insert(id.clone(), piece(title));
                }
                if let Some(status) = update.fields.status {
                    recorder.flush();
                    let content = update.fields.content.as_deref().unwrap_or_default();
                    recorder.finish_call(&id, status, content, update.fields.raw_output.as_ref());
                }
            }
            SessionUpdate::Plan(plan) => {
                recorder.flush();
                let entries: Vec<String> =
                    plan.entries.iter().map(|entry| format!("- [{:?}] {}", entry.status, entry.content)).collect();
                let text = piece(&format!("plan:\n{}", entries.join("\n")));
                recorder.append(SessionEvent::Assistant { text, tool_calls: Vec::new() });
            }
            _ => {}
        }
    }

    /// A permission request, the answer it got and who gave it.
    pub(super) fn permission(
        &self,
        request: &RequestPermissionRequest,
        outcome: &RequestPermissionOutcome,
        by: &Answer,
    ) {
        let mut recorder = self.lock();
        if recorder.session.is_none() {
            return;
        }
        recorder.flush();
        let call_id = request.tool_call.tool_call_id.to_string();
        let title = request.tool_call.fields.title.clone().or_else(|| recorder.titles.get(&call_id).cloned());
        let options: Vec<String> =
            request.options.iter().map(|option| format!("{} ({:?})", option.name, option.kind)).collect();
        let answer = match outcome {
            RequestPermissionOutcome::Selected(selected) => {
                let chosen = request.options.iter().find(|option| option.option_id == selected.option_id);
                chosen.map_or_else(
                    || selected.option_id.to_string(),
                    |option| format!("{} ({:?})", option.name, option.kind),
                )
            }
            _ => format!("cancelled (no option offered for {})", by.verdict),
        };
        let content = piece(&format!(
            "asked to run {}; options: {}; answered: {answer}, by {}",
            title.as_deref().unwrap_or("a tool call"),
            options.join(", "),
            by.by
        ));
        recorder.append(SessionEvent::ToolResult { call_id, name: "permission".to_owned(), content, is_error: false });
    }

    /// The turn's end: what is pending, the failure's whole account when
    /// it failed, the stop reason; then the session is closed (a later
    /// update is not recorded).
    pub(super) async fn end(&self, stop_reason: StopReason, failure: Option<&Diagnostic>) {
        let closing = {
            let mut recorder = self.lock();
            if recorder.session.is_none() {
                return;
            }
            recorder.flush();
            if let Some(failure) = failure {
                let text = piece(&format!("[the run failed: {failure}]"));
                recorder.append(SessionEvent::Assistant { text, tool_calls: Vec::new() });
            }
            recorder.cut = false; // the end is always written
            recorder.append(SessionEvent::TurnEnd { reason: stop_reason, duration_ms: None, usage: None });
            recorder.session.take().map(|mut session| session.closing())
        };
        if let Some(closing) = closing {
            if let Err(error) = closing.await {
                tracing::warn!(%error, "an ACP child's transcript was not saved whole");
            }
        }
    }

    /// The tool calls the agent reported failed so far.
    pub(super) fn tool_calls_failed(&self) -> u32 {
        self.lock().failed
    }
}

impl Recorder {
    /// Writes `event` unless the cap was met; the event that meets it is
    /// replaced by one marker.
    fn append(&mut self, event: SessionEvent) {
        let Some(session) = self.session.as_mut() else { return };
        if self.cut {
            return;
        }
        let size = match &event {
            SessionEvent::User { content } => crate::seam::text_of(content).len(),
            SessionEvent::Assistant { text, tool_calls } => {
                text.len()
                    + tool_calls.iter().map(|call| call.name.len() + call.arguments.to_string().len()).sum::<usize>()
            }
            SessionEvent::ToolResult { content, .. } => content.len(),
            SessionEvent::TurnEnd { .. } => 0,
        };
        let event = if self.kept + size > MAX_TRANSCRIPT_BYTES && !matches!(event, SessionEvent::TurnEnd { .. }) {
            self.cut = true;
            let text = format!("[the transcript was cut here: it passed {MAX_TRANSCRIPT_BYTES} bytes]");
            SessionEvent::Assistant { text, tool_calls: Vec::new() }
        } else {
            event
        };
        self.kept += size;
        if let Err(error) = session.append(event) {
            tracing::warn!(session = session.id(), %error, "an ACP child's transcript line was not written");
            self.session = None;
        }
    }

    fn flush_text(&mut self) {
        if !self.text.is_empty() {
            let text = std::mem::take(&mut self.text);
            self.append(SessionEvent::Assistant { text, tool_calls: Vec::new() });
        }
    }

    fn flush_thought(&mut self) {
        if !self.thought.is_empty() {
            let text = format!("thinking: {}", std::mem::take(&mut self.thought));
            self.append(SessionEvent::Assistant { text, tool_calls: Vec::new() });
        }
    }

    fn flush(&mut self) {
        self.flush_thought();
        self.flush_text();
    }

    /// A tool call that completed or failed gets its result, once.
    fn finish_call(
        &mut self,
        id: &str,
        status: ToolCallStatus,
        content: &[ToolCallContent],
        raw_output: Option<&serde_json::Value>,
    ) {
        let failed = matches!(status, ToolCallStatus::Failed);
        if !(failed || matches!(status, ToolCallStatus::Completed)) || !self.finished.insert(id.to_owned()) {
            return;
        }
        if failed {
            self.failed = self.failed.saturating_add(1);
        }
        let mut text: String = content
            .iter()
            .filter_map(|content| match content {
                ToolCallContent::Content(Content { content: AcpBlock::Text(text), .. }) => Some(text.text.as_str()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n");
        if text.is_empty() {
            if let Some(output) = raw_output {
                text = bounded_json(output.clone()).to_string();
            }
        }
        let name = self.titles.get(id).cloned().unwrap_or_else(|| id.to_owned());
        let content = piece(&text);
        self.append(SessionEvent::ToolResult { call_id: id.to_owned(), name, content, is_error: failed });
    }
}

/// `text` kept to [`MAX_PIECE_BYTES`], marked `…` when cut.
fn piece(text: &str) -> String {
    if text.len() <= MAX_PIECE_BYTES {
        return text.to_owned();
    }
    format!("{}…", cut(text, MAX_PIECE_BYTES))
}

/// Streamed text grows to [`MAX_PIECE_BYTES`], then stops.
fn grow(kept: &mut String, chunk: &str) {
    let room = MAX_PIECE_BYTES.saturating_sub(kept.len());
    kept.push_str(cut(chunk, room));
}

/// A JSON value of at most [`MAX_PIECE_BYTES`] serialised, else its text cut.
fn bounded_json(value: serde_json::Value) -> serde_json::Value {
    let text = value.to_string();
    match text.len() <= MAX_PIECE_BYTES {
        true => value,
        false => serde_json::Value::String(piece(&text)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_id_becomes_a_session_id_a_store_takes() {
        assert_eq!(session_id_of("acp:codex:01a2-b3"), "acp:codex:01a2-b3");
        assert_eq!(session_id_of("acp:x:../../etc/passwd"), "acp:x:.._.._etc_passwd");
        assert_eq!(session_id_of(&"é".repeat(300)).len(), 200);
    }
}
