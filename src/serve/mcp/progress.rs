//! What an MCP client sees of a foreground `subagent` call while it runs:
//! the runtime's events for that run and its descendants, as
//! `notifications/progress` on the call's `progressToken`.
//!
//! The events come from [`Subagents::subscribe`](crate::Subagents::subscribe),
//! subscribed before the run starts so none is missed. The run is known by
//! its `run_id`; its descendants by their parent's session (an in-process
//! child's id is its session id), learnt from each `Start`. Each event
//! becomes one line, prefixed by the run's description:
//!
//! ```text
//! [review the repo] tool subagent: pending
//! [review the repo] started [check the parser]
//! [check the parser] handled: check the parser
//! [check the parser] completed
//! ```
//!
//! Consecutive text chunks of one run join one line. Lines are sent
//! together at most every [`MIN_INTERVAL`], each message cut to its last
//! [`MAX_MESSAGE_CHARS`] characters, and `progress` counts the
//! notifications (the total is unknown). What is pending when the run ends
//! goes out at once, inside the interval if need be: the rate bound never
//! holds the answer back. Progress ends with its call, as MCP asks: once
//! the call is cancelled (or answered) nothing more is sent. Progress is
//! best effort: a client that reads slowly makes the event stream lag,
//! which is said in a line.

use std::collections::HashMap;
use std::time::Duration;

use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::service::{Peer, RoleServer};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::events::{EventRecvError, EventStream, ProgressUpdate, SubagentEvent};
use crate::tool::ForegroundRun;

/// The least time between two notifications of one call.
pub(super) const MIN_INTERVAL: Duration = Duration::from_millis(200);

/// The longest message, in characters (the newest part is kept).
pub(super) const MAX_MESSAGE_CHARS: usize = 1000;

/// One call's progress: its token, the client, the events since the call
/// began, and the call's end.
pub(super) struct Progress {
    token: ProgressToken,
    peer: Peer<RoleServer>,
    events: EventStream,
    /// Cancelled when the call is (by the client, or once answered).
    ended: CancellationToken,
    sent: u32,
}

/// A run being followed; [`finish`](Following::finish) sends what is left.
pub(super) struct Following {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Progress {
    /// Progress for the call with `token`, which ends when `ended` is
    /// cancelled; `events` must be subscribed before the call's run starts.
    pub(super) fn new(
        token: ProgressToken,
        peer: Peer<RoleServer>,
        events: EventStream,
        ended: CancellationToken,
    ) -> Self {
        Progress { token, peer, events, ended, sent: 0 }
    }

    /// Sends one notification now, unless the call has ended.
    pub(super) async fn say(&mut self, message: String) {
        if self.ended.is_cancelled() {
            return;
        }
        self.sent += 1;
        let notification =
            ProgressNotificationParam::new(self.token.clone(), f64::from(self.sent)).with_message(message);
        if let Err(error) = self.peer.notify_progress(notification).await {
            tracing::debug!(%error, "a progress notification was not sent");
        }
    }

    /// Follows `run` (labelled `label`) and its descendants until
    /// [`Following::finish`].
    pub(super) fn follow(self, run: &ForegroundRun, label: &str) -> Following {
        let tree = Tree::new(run.run_id(), run.child_id(), label);
        let stop = CancellationToken::new();
        let task = tokio::spawn(self.run(tree, stop.clone()));
        Following { stop, task }
    }

    async fn run(mut self, mut tree: Tree, stop: CancellationToken) {
        let mut pending = Pending::default();
        let mut quiet_until = Instant::now();
        loop {
            tokio::select! {
                biased;
                // Cancelled: nothing more for this call, not even what is pending.
                _ = self.ended.cancelled() => return,
                _ = stop.cancelled() => break,
                event = self.events.recv() => match event {
                    Ok(event) => pending.note(tree.describe(&event)),
                    Err(EventRecvError::Lagged(missed)) => pending.note(Some(Note::Line(format!("({missed} events missed)")))),
                    Err(EventRecvError::Closed) => break,
                },
                _ = tokio::time::sleep_until(quiet_until), if !pending.is_empty() => {
                    let message = pending.take();
                    self.say(message).await;
                    quiet_until = Instant::now() + MIN_INTERVAL;
                }
            }
        }
        // What the run reported before it settled, at once: the answer
        // waits for this last notification, never for the interval.
        while let Some(Ok(event)) = self.events.try_recv() {
            pending.note(tree.describe(&event));
        }
        if !pending.is_empty() {
            let message = pending.take();
            self.say(message).await;
        }
    }
}

impl Following {
    /// Stops following and sends what is still pending.
    pub(super) async fn finish(self) {
        self.stop.cancel();
        if let Err(error) = self.task.await {
            tracing::warn!(%error, "following a run's progress failed");
        }
    }
}

/// What one event says.
#[derive(Debug, PartialEq)]
enum Note {
    /// A chunk of a run's text.
    Text { run_id: u64, label: String, text: String },
    /// A whole line.
    Line(String),
}

/// The followed run and its descendants: their labels by run id, and by
/// session the runs whose children are ours.
#[derive(Debug)]
struct Tree {
    labels: HashMap<u64, String>,
    sessions: HashMap<String, String>,
}

impl Tree {
    fn new(run_id: u64, child_id: &str, label: &str) -> Self {
        Tree {
            labels: HashMap::from([(run_id, label.to_owned())]),
            sessions: HashMap::from([(child_id.to_owned(), label.to_owned())]),
        }
    }

    fn describe(&mut self, event: &SubagentEvent) -> Option<Note> {
        match event {
            SubagentEvent::Start(start) => {
                let parent = self.sessions.get(start.parent_session.as_deref()?)?.clone();
                let label =
                    start.label.clone().filter(|l| !l.trim().is_empty()).unwrap_or_else(|| start.child_id.clone());
                self.labels.insert(start.run_id, label.clone());
                self.sessions.insert(start.child_id.clone(), label.clone());
                Some(Note::Line(format!("[{parent}] started [{label}]")))
            }
            SubagentEvent::End(end) => {
                let label = self.labels.get(&end.run_id)?;
                Some(Note::Line(format!("[{label}] {}", end.stop_reason)))
            }
            SubagentEvent::Progress(progress) => {
                let label = self.labels.get(&progress.run_id)?.clone();
                match &progress.update {
                    ProgressUpdate::MessageChunk { text } => {
                        Some(Note::Text { run_id: progress.run_id, label, text: text.replace(['\n', '\r'], " ") })
                    }
                    ProgressUpdate::ToolCall { name, status } => {
                        Some(Note::Line(format!("[{label}] tool {name}: {status}")))
                    }
                    ProgressUpdate::Plan { entries } => {
                        Some(Note::Line(format!("[{label}] plan: {}", entries.join("; "))))
                    }
                    // The delegated run's own events arrive here too.
                    ProgressUpdate::Delegated { .. } => None,
                }
            }
            _ => None,
        }
    }
}

/// Lines not yet sent.
#[derive(Debug, Default)]
struct Pending {
    lines: Vec<String>,
    /// The run whose text the last line is, to join its next chunk.
    text_of: Option<u64>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    fn note(&mut self, note: Option<Note>) {
        match note {
            None => {}
            Some(Note::Text { run_id, label, text }) => match (self.text_of, self.lines.last_mut()) {
                (Some(last), Some(line)) if last == run_id => line.push_str(&text),
                _ => {
                    self.lines.push(format!("[{label}] {text}"));
                    self.text_of = Some(run_id);
                }
            },
            Some(Note::Line(line)) => {
                self.lines.push(line);
                self.text_of = None;
            }
        }
    }

    /// The message for what is pending, cut to its newest
    /// [`MAX_MESSAGE_CHARS`] characters.
    fn take(&mut self) -> String {
        self.text_of = None;
        let message = std::mem::take(&mut self.lines).join("\n");
        let chars = message.chars().count();
        if chars <= MAX_MESSAGE_CHARS {
            return message;
        }
        let tail: String = message.chars().skip(chars - (MAX_MESSAGE_CHARS - 1)).collect();
        format!("…{tail}")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::events::{RunEndInfo, RunInfo, RunProgress};
    use crate::seam::StopReason;

    fn start(run_id: u64, child_id: &str, parent: &str, label: &str) -> SubagentEvent {
        SubagentEvent::Start(Arc::new(RunInfo {
            run_id,
            child_id: child_id.to_owned(),
            provider: "spawn".to_owned(),
            parent_session: Some(parent.to_owned()),
            local: true,
            label: Some(label.to_owned()),
        }))
    }

    fn text(run_id: u64, text: &str) -> SubagentEvent {
        SubagentEvent::Progress(Arc::new(RunProgress {
            run_id,
            provider: "spawn".to_owned(),
            parent_session: None,
            update: ProgressUpdate::MessageChunk { text: text.to_owned() },
        }))
    }

    #[test]
    fn a_runs_descendants_are_followed_and_other_runs_are_not() {
        let mut tree = Tree::new(1, "root-child", "review");
        let mut pending = Pending::default();
        for event in [
            start(7, "stranger", "someone-else", "not ours"),
            text(7, "not ours either"),
            start(2, "grandchild", "root-child", "check the parser"),
            text(2, "parser "),
            text(2, "looks fine"),
            start(3, "great-grandchild", "grandchild", "deeper"),
            text(1, "summary"),
            SubagentEvent::End(Arc::new(RunEndInfo {
                run_id: 2,
                child_id: "grandchild".to_owned(),
                provider: "spawn".to_owned(),
                parent_session: Some("root-child".to_owned()),
                stop_reason: StopReason::Completed,
                last_message: None,
                diagnostic: None,
            })),
        ] {
            pending.note(tree.describe(&event));
        }
        assert_eq!(
            pending.take(),
            "[review] started [check the parser]\n[check the parser] parser looks fine\n\
             [check the parser] started [deeper]\n[review] summary\n[check the parser] completed"
        );
        assert!(pending.is_empty());
    }

    #[test]
    fn a_long_message_keeps_its_newest_characters() {
        let mut pending = Pending::default();
        pending.note(Some(Note::Line("x".repeat(MAX_MESSAGE_CHARS))));
        pending.note(Some(Note::Line("the end".to_owned())));
        let message = pending.take();
        assert_eq!(message.chars().count(), MAX_MESSAGE_CHARS);
        assert!(message.starts_with('…') && message.ends_with("\nthe end"), "{message}");
    }
}
