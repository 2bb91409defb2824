//! One run as one A2A task: the message sent, the events folded into what
//! the task has said so far, and the task's last state mapped to a result.

use std::rc::Rc;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::client::{A2aError, Client, Endpoint};
use super::Limits;
use crate::schema::CompiledSchema;
use crate::seam::{
    text_of, Category, Child, Diagnostic, Failure, ProgressUpdate, ProviderContext, RunResult, Stage, StopReason,
};
use crate::wire::a2a::{self as wire, method, Artifact, Message, Part, Role, StreamResponse, Task, TaskState};

/// What a run needs of its provider.
pub(super) struct Setup {
    pub(super) provider: String,
    pub(super) client: Rc<Client>,
    pub(super) endpoint: Endpoint,
    pub(super) streaming: bool,
    pub(super) skill: Option<String>,
    pub(super) limits: Limits,
}

pub(super) struct A2aChild {
    pub(super) id: String,
    pub(super) setup: Rc<Setup>,
    pub(super) prompt: String,
    pub(super) schema: Option<(Value, Rc<CompiledSchema>)>,
    pub(super) cancel: CancellationToken,
    pub(super) context: ProviderContext,
    /// Where the task's transcript goes: the parent's home, as this
    /// child's session.
    pub(super) record: Rc<Record>,
}

/// The transcript of a run's task, kept in the parent's home as the
/// child's session (the same store and format as an in-process child's,
/// linked by lineage): the prompt, each status the agent reported with
/// its message, the artifacts' text (or the agent's answer), a failure's
/// whole account and the end. Each piece is kept to 64 KiB, the statuses
/// to the last 256 of 4 KiB each; written once the run settles.
pub(super) struct Record {
    pub(super) stores: std::sync::Arc<crate::agent::HomeStores>,
    pub(super) header: crate::agent::SessionHeader,
}

/// The most of one piece of a transcript kept.
const MAX_PIECE_BYTES: usize = 64 * 1024;
/// The most statuses a transcript keeps (the last ones), and of each
/// status message: 1 MiB in all at most.
const MAX_STATUSES: usize = 256;
const MAX_STATUS_BYTES: usize = 4096;

fn piece(text: &str) -> String {
    match text.len() <= MAX_PIECE_BYTES {
        true => text.to_owned(),
        false => format!("{}…", crate::seam::cut(text, MAX_PIECE_BYTES)),
    }
}

impl Child for A2aChild {
    fn id(&self) -> String {
        self.id.clone()
    }

    fn run(&self) -> LocalBoxFuture<'static, RunResult> {
        let run = Run {
            setup: self.setup.clone(),
            message_id: self.id.clone(),
            prompt: self.prompt.clone(),
            schema: self.schema.clone(),
            context: self.context.clone(),
            seen: Seen::default(),
        };
        let cancel = self.cancel.clone();
        let (record, prompt, home) = (self.record.clone(), self.prompt.clone(), self.context.home_path().to_owned());
        Box::pin(async move {
            let (result, seen) = run.drive(cancel).await;
            record.write(&home, &prompt, &seen, &result).await;
            result
        })
    }

    fn dispose(&self) -> LocalBoxFuture<'static, Result<(), Failure>> {
        // Nothing is held between runs: the task lives on the agent.
        Box::pin(async { Ok(()) })
    }
}

/// What the task has said so far.
#[derive(Default)]
struct Seen {
    task_id: Option<String>,
    state: Option<TaskState>,
    status_text: String,
    artifacts: Vec<Artifact>,
    artifact_bytes: usize,
    /// The agent answered with a message instead of a task.
    answer: Option<Message>,
    /// Each status the task reported (its state, and its message when it
    /// had one), the last [`MAX_STATUSES`], for the transcript.
    statuses: std::collections::VecDeque<String>,
}

impl Record {
    /// Writes the transcript; one that cannot be written is logged.
    async fn write(&self, home: &std::path::Path, prompt: &str, seen: &Seen, result: &RunResult) {
        use crate::agent::SessionEvent;
        let said = |text: String| SessionEvent::Assistant { text: piece(&text), tool_calls: Vec::new() };
        let mut events = vec![SessionEvent::User { content: vec![crate::seam::ContentBlock::text(piece(prompt))] }];
        events.extend(seen.statuses.iter().map(|status| said(format!("status {status}"))));
        for artifact in &seen.artifacts {
            let name = artifact.name.as_deref().unwrap_or(&artifact.artifact_id);
            events.push(said(format!("artifact {name}: {}", text_of_parts(&artifact.parts))));
        }
        if let Some(answer) = &seen.answer {
            events.push(said(text_of_parts(&answer.parts)));
        }
        if let Some(diagnostic) = &result.diagnostic {
            events.push(said(format!("[the run failed: {diagnostic}]")));
        }
        events.push(SessionEvent::TurnEnd { reason: result.stop_reason, duration_ms: None, usage: None });
        let id = self.header.id.clone();
        let written = match self.stores.of(home).creating(self.header.clone(), events).await {
            Ok(mut session) => session.closing().await,
            Err(error) => Err(error),
        };
        if let Err(error) = written {
            tracing::warn!(session = %id, %error, "an A2A child's transcript was not saved");
        }
    }
}

/// Why a run stopped before the task reached a state worth mapping.
enum Stopped {
    Cancelled,
    Failed(Category, String),
}

impl From<A2aError> for Stopped {
    fn from(error: A2aError) -> Self {
        let category = match error {
            A2aError::Timeout(..) => Category::TimedOut,
            A2aError::Malformed(_) | A2aError::Oversized(..) => Category::Protocol,
            _ => Category::ChildError,
        };
        Stopped::Failed(category, error.safe_reason())
    }
}

struct Run {
    setup: Rc<Setup>,
    message_id: String,
    prompt: String,
    schema: Option<(Value, Rc<CompiledSchema>)>,
    context: ProviderContext,
    seen: Seen,
}

impl Run {
    /// The run to its result, and what the task said on the way.
    async fn drive(mut self, cancel: CancellationToken) -> (RunResult, Seen) {
        let result = self.settled(cancel).await;
        (result, self.seen)
    }

    async fn settled(&mut self, cancel: CancellationToken) -> RunResult {
        // A cancel before the agent named the task lets the exchange read
        // on, within the cancel bound, until it does: `CancelTask` needs
        // the name, and a task left unnamed would run on at the agent.
        let bound = self.setup.limits.cancel_timeout;
        let outcome = tokio::select! {
            biased;
            outcome = self.exchange(&cancel) => outcome,
            () = async {
                cancel.cancelled().await;
                tokio::time::sleep(bound).await;
            } => Err(Stopped::Cancelled),
        };
        match outcome {
            Ok(()) => {
                // A task waiting for input would wait on the agent for ever.
                if self.seen.state.is_some_and(TaskState::is_interrupted) {
                    self.cancel_remote().await;
                }
                self.settle().await
            }
            Err(Stopped::Cancelled) => {
                self.cancel_remote().await;
                self.with_task(RunResult::empty(StopReason::Aborted))
            }
            Err(Stopped::Failed(category, reason)) => self.failed(category, reason),
        }
    }

    /// Sends the message and follows the task until it is terminal or
    /// interrupted (or the agent answered with a message).
    /// Once `cancel` fires it stops as soon as the task has a name.
    async fn exchange(&mut self, cancel: &CancellationToken) -> Result<(), Stopped> {
        let setup = self.setup.clone();
        let params = self.send_params(!setup.streaming);
        if !setup.streaming {
            let result = setup
                .client
                .call(&setup.endpoint, method::SEND_MESSAGE, params, setup.limits.first_event_timeout)
                .await?;
            self.fold(result)?;
            if cancel.is_cancelled() && self.seen.task_id.is_some() {
                return Err(Stopped::Cancelled);
            }
            return tokio::select! {
                biased;
                _ = cancel.cancelled() => Err(Stopped::Cancelled),
                polled = self.poll() => polled,
            };
        }
        let mut events = setup.client.stream(&setup.endpoint, method::SEND_STREAMING_MESSAGE, params).await?;
        let mut attempts = 0;
        loop {
            let ended = loop {
                let named = self.seen.task_id.is_some();
                let next = tokio::select! {
                    biased;
                    _ = cancel.cancelled(), if named => return Err(Stopped::Cancelled),
                    next = events.next() => next,
                };
                match next {
                    Ok(Some(event)) => self.fold(event)?,
                    Ok(None) => break None,
                    Err(error) => break Some(error),
                }
                if self.done() {
                    return Ok(());
                }
            };
            // The stream ended or broke before the task did: re-attach.
            let Some(task_id) = self.seen.task_id.clone() else {
                return Err(ended.map_or_else(
                    || Stopped::Failed(Category::Protocol, "the A2A agent's stream ended before naming a task".into()),
                    Stopped::from,
                ));
            };
            if let Some(error) = ended.filter(|error| !error.is_broken_connection()) {
                return Err(error.into());
            }
            events = match self.reattach(&task_id, &mut attempts).await? {
                Some(events) => events,
                None => return Ok(()),
            };
        }
    }

    /// `SubscribeToTask`, tried again while the connection breaks, within
    /// the attempts left, backing off. `None`: the task ended meanwhile
    /// (the agent says so) and was read with `GetTask`.
    async fn reattach(&mut self, task_id: &str, attempts: &mut u32) -> Result<Option<super::client::Events>, Stopped> {
        let setup = self.setup.clone();
        loop {
            if *attempts >= setup.limits.resubscribe_attempts {
                let reason = format!("the A2A agent's stream broke and {attempts} attempts to re-attach failed");
                return Err(Stopped::Failed(Category::ChildError, reason));
            }
            *attempts += 1;
            tokio::time::sleep(Duration::from_millis(100) * (1 << (*attempts).min(6))).await;
            tracing::debug!(provider = %setup.provider, task = %task_id, attempts, "re-attaching to the task's stream");
            match setup.client.stream(&setup.endpoint, method::SUBSCRIBE_TO_TASK, json!({"id": task_id})).await {
                Ok(events) => return Ok(Some(events)),
                Err(A2aError::Rpc { code: wire::code::UNSUPPORTED_OPERATION, .. }) => {
                    self.get_task().await?;
                    return Ok(None);
                }
                Err(error) if error.is_broken_connection() => continue,
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// Without streaming: `GetTask` until the task is terminal or interrupted.
    async fn poll(&mut self) -> Result<(), Stopped> {
        while !self.done() {
            tokio::time::sleep(self.setup.limits.poll_interval).await;
            self.get_task().await?;
        }
        Ok(())
    }

    async fn get_task(&mut self) -> Result<(), Stopped> {
        let setup = self.setup.clone();
        let Some(task_id) = self.seen.task_id.clone() else { return Ok(()) };
        let task = setup
            .client
            .call(&setup.endpoint, method::GET_TASK, json!({"id": task_id}), setup.limits.first_event_timeout)
            .await?;
        self.fold(json!({ "task": task }))
    }

    fn done(&self) -> bool {
        self.seen.answer.is_some() || self.seen.state.is_some_and(|state| state.is_terminal() || state.is_interrupted())
    }

    /// The `SendMessageRequest`; `poll`: answer at once with the task
    /// (`returnImmediately`), which `GetTask` then follows, so a long task
    /// is not one long request.
    fn send_params(&self, poll: bool) -> Value {
        let mut message = Message {
            message_id: self.message_id.clone(),
            context_id: None,
            task_id: None,
            role: Role::User,
            parts: vec![Part::text(self.prompt.clone())],
            metadata: None,
        };
        let mut modes = vec!["text/plain"];
        // Neither is a field of A2A 1.0: an agent that knows them (ours
        // does) honours them; any other may ignore them.
        let mut metadata = serde_json::Map::new();
        if let Some((schema, _)) = &self.schema {
            metadata.insert("outputSchema".to_owned(), schema.clone());
            modes.push("application/json");
        }
        if let Some(skill) = &self.setup.skill {
            metadata.insert("skill".to_owned(), Value::String(skill.clone()));
        }
        if !metadata.is_empty() {
            message.metadata = Some(Value::Object(metadata));
        }
        json!({
            "message": message,
            "configuration": {"acceptedOutputModes": modes, "returnImmediately": poll},
        })
    }

    /// Folds one `StreamResponse` (or `SendMessageResponse`) into what the
    /// task has said, reporting its news as progress.
    fn fold(&mut self, event: Value) -> Result<(), Stopped> {
        let event: StreamResponse =
            serde_json::from_value(event).map_err(|e| Stopped::from(A2aError::Malformed(e.to_string())))?;
        if let Some(task) = event.task {
            self.adopt(task)?;
        } else if let Some(message) = event.message {
            self.seen.answer = Some(message);
        } else if let Some(update) = event.status_update {
            self.seen.task_id.get_or_insert(update.task_id);
            self.status(update.status);
        } else if let Some(update) = event.artifact_update {
            self.seen.task_id.get_or_insert(update.task_id);
            self.artifact(update.artifact, update.append)?;
        } else {
            return Err(A2aError::Malformed("a stream event with no payload".to_owned()).into());
        }
        Ok(())
    }

    /// A whole task: its state and every artifact it holds so far.
    fn adopt(&mut self, task: Task) -> Result<(), Stopped> {
        self.seen.task_id = Some(task.id);
        if !task.artifacts.is_empty() {
            self.seen.artifacts.clear();
            self.seen.artifact_bytes = 0;
            for artifact in task.artifacts {
                self.artifact(artifact, false)?;
            }
        }
        self.status(task.status);
        Ok(())
    }

    fn status(&mut self, status: wire::TaskStatus) {
        self.seen.state = Some(status.state);
        let mut noted = format!("{:?}", status.state);
        if let Some(message) = status.message {
            let text = text_of_parts(&message.parts);
            if !text.is_empty() {
                self.context.progress(ProgressUpdate::MessageChunk { text: text.clone() });
                noted = format!("{noted}: {}", crate::seam::cut(&text, MAX_STATUS_BYTES));
                self.seen.status_text = text;
            }
        }
        if self.seen.statuses.len() == MAX_STATUSES {
            self.seen.statuses.pop_front();
        }
        self.seen.statuses.push_back(noted);
    }

    fn artifact(&mut self, artifact: Artifact, append: bool) -> Result<(), Stopped> {
        let bound = self.setup.limits.max_artifact_bytes;
        let known = self.seen.artifacts.iter().position(|known| known.artifact_id == artifact.artifact_id);
        // The bound is on what is held: a replacement frees what it replaces.
        let replaced = match known {
            Some(at) if !append => wire::parts_bytes(&self.seen.artifacts[at].parts),
            _ => 0,
        };
        let held = self.seen.artifact_bytes.saturating_sub(replaced).saturating_add(wire::parts_bytes(&artifact.parts));
        if held > bound {
            return Err(A2aError::Oversized("artifacts", bound).into());
        }
        self.seen.artifact_bytes = held;
        let text = text_of_parts(&artifact.parts);
        if !text.is_empty() {
            self.context.progress(ProgressUpdate::MessageChunk { text });
        }
        match known {
            Some(at) if append => self.seen.artifacts[at].parts.extend(artifact.parts),
            Some(at) => self.seen.artifacts[at] = artifact,
            None => self.seen.artifacts.push(artifact),
        }
        Ok(())
    }

    /// The task's last state as a result.
    async fn settle(&self) -> RunResult {
        if let Some(message) = &self.seen.answer {
            let parts = message.parts.clone();
            return self.completed(&parts).await;
        }
        let state = self.seen.state.unwrap_or(TaskState::Unspecified);
        let said = safe_text(&self.seen.status_text);
        match state {
            TaskState::Completed => {
                let parts: Vec<Part> = self.seen.artifacts.iter().flat_map(|a| a.parts.iter().cloned()).collect();
                self.completed(&parts).await
            }
            TaskState::Canceled => self.with_task(RunResult::empty(StopReason::Aborted)),
            TaskState::Failed => self.failed_saying("the A2A agent's task failed", &said),
            TaskState::Rejected => self.failed_saying("the A2A agent rejected the task", &said),
            TaskState::InputRequired => {
                self.failed_saying("the A2A agent's task requires input, which this provider cannot give", &said)
            }
            TaskState::AuthRequired => self
                .failed_saying("the A2A agent's task requires authentication, which this provider cannot give", &said),
            TaskState::Submitted | TaskState::Working | TaskState::Unspecified => {
                self.failed(Category::Protocol, "the A2A agent's task ended in no final state".to_owned())
            }
        }
    }

    /// Completed with `parts`: their text the output, and with a schema,
    /// the first data part that matches it the structured value.
    async fn completed(&self, parts: &[Part]) -> RunResult {
        let mut result = self.with_task(RunResult::completed(text_of_parts(parts)));
        if result.text().is_empty() && !self.seen.status_text.is_empty() {
            result = self.with_task(RunResult::completed(self.seen.status_text.clone()));
        }
        let Some((_, schema)) = &self.schema else { return result };
        let matching =
            parts.iter().filter_map(|part| part.data.as_ref()).find(|data| schema.violations(data).is_empty());
        let Some(value) = matching else {
            let mut failed = self.failed(
                Category::MissingStructuredOutput,
                "the A2A agent's artifacts hold no data part that matches the output schema".to_owned(),
            );
            failed.output = result.output;
            return failed;
        };
        // Refused only when the run stopped meanwhile; the result carries it anyway.
        let _ = self.context.capture_structured(value.clone()).await;
        result.structured = Some(value.clone());
        result
    }

    fn failed(&self, category: Category, reason: String) -> RunResult {
        let diagnostic = Diagnostic::new(&self.setup.provider, Stage::SessionRun, category).with_reason(reason);
        self.with_task(RunResult::failed(diagnostic))
    }

    /// A `child-error` result: `why` in our words, and the agent's status
    /// message, when it gave one, as the detail (logged whole at debug).
    fn failed_saying(&self, why: &str, said: &str) -> RunResult {
        if !self.seen.status_text.is_empty() {
            let provider = &self.setup.provider;
            tracing::debug!(%provider, status = %self.seen.status_text, "{why}");
        }
        let diagnostic = Diagnostic::new(&self.setup.provider, Stage::SessionRun, Category::ChildError)
            .with_reason(why)
            .with_detail(said);
        self.with_task(RunResult::failed(diagnostic))
    }

    fn with_task(&self, mut result: RunResult) -> RunResult {
        result.child_session = self.seen.task_id.clone();
        result
    }

    /// `CancelTask` for the task, bounded; a task not known yet cannot be
    /// named (the agent keeps it, as the protocol has no other handle).
    async fn cancel_remote(&self) {
        let Some(task_id) = self.seen.task_id.clone() else { return };
        let setup = &self.setup;
        let wait = setup.limits.cancel_timeout;
        let call = setup.client.call(&setup.endpoint, method::CANCEL_TASK, json!({"id": task_id}), wait);
        if let Err(error) = call.await {
            tracing::warn!(provider = %setup.provider, task = %task_id, "CancelTask failed: {}", error.safe_reason());
        }
    }
}

fn text_of_parts(parts: &[Part]) -> String {
    let blocks: Vec<_> =
        parts.iter().filter_map(|part| part.text.clone()).map(crate::seam::ContentBlock::text).collect();
    text_of(&blocks)
}

/// The agent's words made safe to show ([`crate::seam::safe_line`]:
/// escapes, control and bidi characters gone), blanks folded, at most 160
/// bytes (cut at a character boundary).
fn safe_text(text: &str) -> String {
    let folded = crate::seam::safe_line(text).split_whitespace().collect::<Vec<_>>().join(" ");
    crate::seam::cut(&folded, 160).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_words_lose_escapes_bidi_controls_and_length() {
        assert_eq!(safe_text("bad\u{1b}[31m input\n\nhere"), "bad input here");
        assert_eq!(safe_text("disk\u{1b}[2J\u{1b}]52;c;cm0gLXJm\u{7} full\u{202e}!"), "disk full!");
        let long = "é".repeat(200);
        let cut = safe_text(&long);
        assert!(cut.len() <= 160 && cut.chars().all(|c| c == 'é'));
    }
}
