//! The JSON-RPC methods: a message becomes a run on one of the door's
//! providers, and the run's progress and end become the task's events.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::questions::Questions;
use super::store::{status_event, Store};
use crate::seam::{Approvals, ContentBlock, Parent, ProgressSink, ProgressUpdate, RunResult, StartRequest, StopReason};
use crate::wire::a2a::{
    self as wire, code, method, Artifact, Message, Part, Response, StreamResponse, Task, TaskArtifactUpdateEvent,
    TaskState, TaskStatus,
};
use crate::Subagents;

/// Most tasks a `ListTasks` page holds.
const MAX_PAGE: usize = 100;
/// How long `CancelTask` waits for the run to settle before it answers.
const CANCEL_WAIT: Duration = Duration::from_secs(10);

/// What every method shares.
pub(super) struct Service {
    pub(super) subagents: Subagents,
    /// The providers messages may name (`metadata.skill`), the first the default.
    pub(super) skills: Vec<String>,
    pub(super) store: Arc<Store>,
    /// The runs' permission requests, waiting on their tasks' clients.
    pub(super) questions: Arc<Questions>,
    /// Whether the runs' permission requests are put to the clients at
    /// all: only to clients the door authenticated, unless the user said
    /// otherwise (else the providers' policies decide).
    pub(super) offers_approvals: bool,
    pub(super) cwd: std::path::PathBuf,
    /// Tripped at shutdown: open streams end with a final event.
    pub(super) closing: CancellationToken,
}

/// What a request gets: one JSON answer, or an event stream.
pub(super) enum Answer {
    Json(Response),
    Stream(Box<Stream>),
}

/// A stream's events: the task as it stands, then its feed until a
/// terminal or interrupted state (or shutdown).
pub(super) struct Stream {
    pub(super) id: Value,
    pub(super) first: StreamResponse,
    pub(super) feed: broadcast::Receiver<StreamResponse>,
    pub(super) task_id: String,
}

impl Service {
    pub(super) async fn handle(self: &Arc<Self>, request: wire::Request) -> Answer {
        let id = request.id.clone();
        let fail = |code: i64, message: &str| Answer::Json(Response::error(id.clone(), code, message));
        if request.jsonrpc != "2.0" {
            return fail(code::INVALID_REQUEST, "jsonrpc must be \"2.0\"");
        }
        let params = request.params;
        let task_id = || params.get("id").and_then(Value::as_str).map(str::to_owned);
        match request.method.as_str() {
            method::SEND_MESSAGE | method::SEND_STREAMING_MESSAGE => {
                let task = match self.start(&params) {
                    Ok(task) => task,
                    Err((code, message)) => return fail(code, &message),
                };
                let Some((snapshot, feed)) = self.store.follow(&task) else {
                    return fail(code::INTERNAL, "the task was evicted at once");
                };
                // An answer resumes its task: the reply follows it as a new
                // message's does.
                if request.method == method::SEND_STREAMING_MESSAGE {
                    let first = StreamResponse { task: Some(snapshot), ..StreamResponse::default() };
                    return Answer::Stream(Box::new(Stream { id, first, feed, task_id: task }));
                }
                let immediately = params["configuration"]["returnImmediately"].as_bool() == Some(true);
                let task = match immediately {
                    true => snapshot,
                    false => self.settled(&task, snapshot, feed, Until::EndOrInput, None).await,
                };
                Answer::Json(Response::result(id, json!({ "task": task })))
            }
            method::GET_TASK => match task_id().and_then(|task| self.store.get(&task)) {
                Some(task) => Answer::Json(Response::result(id, to_value(&task))),
                None => fail(code::TASK_NOT_FOUND, "task not found"),
            },
            method::LIST_TASKS => Answer::Json(Response::result(id, self.list(&params))),
            method::CANCEL_TASK => {
                let Some(task) = task_id() else { return fail(code::INVALID_PARAMS, "params.id is required") };
                let Some((snapshot, feed)) = self.store.follow(&task) else {
                    return fail(code::TASK_NOT_FOUND, "task not found");
                };
                match self.store.cancel(&task) {
                    None => fail(code::TASK_NOT_FOUND, "task not found"),
                    Some(false) => fail(code::TASK_NOT_CANCELABLE, "the task has ended"),
                    Some(true) => {
                        let task = self.settled(&task, snapshot, feed, Until::End, Some(CANCEL_WAIT)).await;
                        Answer::Json(Response::result(id, to_value(&task)))
                    }
                }
            }
            method::SUBSCRIBE_TO_TASK => {
                let Some(task) = task_id() else { return fail(code::INVALID_PARAMS, "params.id is required") };
                match self.store.follow(&task) {
                    None => fail(code::TASK_NOT_FOUND, "task not found"),
                    Some((snapshot, _)) if snapshot.status.state.is_terminal() => {
                        fail(code::UNSUPPORTED_OPERATION, "the task has ended: read it with GetTask")
                    }
                    Some((snapshot, feed)) => {
                        let first = StreamResponse { task: Some(snapshot), ..StreamResponse::default() };
                        Answer::Stream(Box::new(Stream { id, first, feed, task_id: task }))
                    }
                }
            }
            _ => fail(code::METHOD_NOT_FOUND, "method not found"),
        }
    }

    /// Starts the run a `SendMessageRequest` asks for, or answers the
    /// question of the task it names: the task's id.
    fn start(self: &Arc<Self>, params: &Value) -> Result<String, (i64, String)> {
        let invalid = |message: String| (code::INVALID_PARAMS, message);
        let message: Message = serde_json::from_value(params["message"].clone())
            .map_err(|e| invalid(format!("params.message is not a Message: {e}")))?;
        if let Some(task_id) = &message.task_id {
            return self.answer(task_id, message.clone());
        }
        let text: Vec<&str> = message.parts.iter().filter_map(|part| part.text.as_deref()).collect();
        if text.is_empty() {
            return Err(invalid("the message has no text part".to_owned()));
        }
        let metadata = message.metadata.clone().unwrap_or(Value::Null);
        let skill = match metadata["skill"].as_str() {
            None => self.skills[0].clone(),
            Some(skill) if self.skills.iter().any(|known| known == skill) => skill.to_owned(),
            Some(skill) => return Err(invalid(format!("unknown skill {skill:?}"))),
        };
        let task_id = format!("task-{}", crate::agent::ids::session_id());
        let context_id =
            message.context_id.clone().unwrap_or_else(|| format!("ctx-{}", crate::agent::ids::session_id()));
        let cancel = CancellationToken::new();
        let task = Task {
            id: task_id.clone(),
            context_id: Some(context_id.clone()),
            status: TaskStatus { state: TaskState::Submitted, message: None, timestamp: None },
            artifacts: Vec::new(),
            history: vec![message.clone()],
        };
        self.store.insert(task, cancel.clone()).map_err(|full| (code::INTERNAL, full.to_string()))?;
        // What its descendants ask waits on this task's client, when the
        // door may ask it; else the providers' policies decide alone.
        let mut parent = Parent::root(&self.cwd);
        if self.offers_approvals {
            let approver = self.questions.approver((task_id.clone(), context_id.clone()));
            parent = parent.with_approvals(Approvals::new(Arc::new(approver)));
        }
        let mut request = StartRequest::with_blocks(vec![ContentBlock::text(text.join("\n"))], parent, cancel);
        if let Some(schema) = metadata.get("outputSchema").filter(|schema| schema.is_object()) {
            request = request.with_output_schema(schema.clone());
        }
        let ids = (task_id.clone(), context_id);
        let sink = {
            let (store, ids) = (self.store.clone(), ids.clone());
            ProgressSink::new(move |update| {
                if let ProgressUpdate::MessageChunk { text } = update.innermost() {
                    store.publish(&ids.0, status_event(&ids, TaskState::Working, Some(text.clone())));
                }
            })
        };
        let service = self.clone();
        tokio::spawn(async move { service.run(skill, request.with_progress(sink), ids).await });
        Ok(task_id)
    }

    /// A message to the existing task `task_id`: the answer to its question
    /// (see `questions.rs`), kept in its history.
    fn answer(&self, task_id: &str, message: Message) -> Result<String, (i64, String)> {
        let Some(task) = self.store.get(task_id) else {
            return Err((code::TASK_NOT_FOUND, "task not found".to_owned()));
        };
        if task.status.state.is_terminal() {
            return Err((code::UNSUPPORTED_OPERATION, "the task has ended".to_owned()));
        }
        let context_id = task.context_id.clone().unwrap_or_default();
        if message.context_id.as_ref().is_some_and(|context| *context != context_id) {
            return Err((code::INVALID_PARAMS, "the message's contextId is not its task's".to_owned()));
        }
        let ids = (task.id, context_id);
        self.questions.answer(&ids, &message)?;
        self.store.record(&ids.0, message);
        Ok(ids.0)
    }

    /// Runs the task to its end and publishes it.
    async fn run(self: Arc<Self>, skill: String, request: StartRequest, ids: (String, String)) {
        self.store.publish(&ids.0, status_event(&ids, TaskState::Working, None));
        let cancel = request.signal.clone();
        let result = match self.subagents.start(&skill, request).await {
            Ok(run) => {
                let result = run.result().await;
                if let Err(error) = run.dispose().await {
                    tracing::warn!(task = %ids.0, %error, "the task's run did not dispose cleanly");
                }
                result.map_err(|error| error.to_string())
            }
            Err(error) => Err(error.to_string()),
        };
        let (state, said) = match &result {
            Ok(result) => outcome(result),
            // Cancelled before its run existed.
            Err(_) if cancel.is_cancelled() => (TaskState::Canceled, None),
            Err(error) => (TaskState::Failed, Some(account(error))),
        };
        if let Ok(result) = &result {
            let text = result.text();
            if !text.is_empty() {
                self.store.publish(&ids.0, artifact_event(&ids, "output", Part::text(text)));
            }
            if let Some(value) = &result.structured {
                self.store.publish(&ids.0, artifact_event(&ids, "structured", Part::data(value.clone())));
            }
        }
        self.store.publish(&ids.0, status_event(&ids, state, said));
    }

    /// The task once terminal (or, `Until::EndOrInput`, interrupted), or as
    /// it stands after `wait`.
    async fn settled(
        &self,
        task: &str,
        snapshot: Task,
        mut feed: broadcast::Receiver<StreamResponse>,
        until: Until,
        wait: Option<Duration>,
    ) -> Task {
        let stops = |state: TaskState| state.is_terminal() || (until == Until::EndOrInput && state.is_interrupted());
        let until_end = async {
            loop {
                match self.store.get(task) {
                    Some(known) if stops(known.status.state) => return,
                    None => return,
                    Some(_) => {}
                }
                if let Err(broadcast::error::RecvError::Closed) = feed.recv().await {
                    return;
                }
            }
        };
        match wait {
            Some(wait) => drop(tokio::time::timeout(wait, until_end).await),
            None => until_end.await,
        }
        // Evicted meanwhile (a full store of ended tasks): what was known.
        self.store.get(task).unwrap_or(snapshot)
    }

    fn list(&self, params: &Value) -> Value {
        let context = params["contextId"].as_str();
        let state = params.get("status").and_then(|s| serde_json::from_value::<TaskState>(s.clone()).ok());
        let state = state.filter(|state| *state != TaskState::Unspecified);
        let page_size = params["pageSize"].as_u64().map_or(50, |n| (n as usize).clamp(1, MAX_PAGE));
        let offset = params["pageToken"].as_str().and_then(|token| token.parse().ok()).unwrap_or(0);
        let (tasks, total) = self.store.list(context, state, offset, page_size);
        let next = offset + tasks.len();
        let next_token = if next < total { next.to_string() } else { String::new() };
        let include_artifacts = params["includeArtifacts"].as_bool() == Some(true);
        let tasks: Vec<Task> = tasks
            .into_iter()
            .map(|mut task| {
                if !include_artifacts {
                    task.artifacts.clear();
                }
                task.history.clear();
                task
            })
            .collect();
        json!({"tasks": tasks, "nextPageToken": next_token, "pageSize": page_size, "totalSize": total})
    }
}

/// What a caller of [`Service::settled`] waits for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Until {
    /// A terminal state (a cancel: a question withdrawn is no end).
    End,
    /// A terminal state, or the task waiting on its client.
    EndOrInput,
}

/// A run's end as a task state and, for a failure, what to say.
fn outcome(result: &RunResult) -> (TaskState, Option<String>) {
    let said = || result.diagnostic.as_ref().map(|diagnostic| account(&diagnostic.to_string()));
    match result.stop_reason {
        StopReason::Completed => (TaskState::Completed, None),
        StopReason::Aborted => (TaskState::Canceled, None),
        StopReason::Error => (TaskState::Failed, said()),
        StopReason::MaxTokens => (TaskState::Failed, Some("the run stopped at its token limit".to_owned())),
        StopReason::Refusal => (TaskState::Rejected, Some("the model refused".to_owned())),
    }
}

/// A failure's account as the task's status message: clients print it, so
/// it is made safe here, whichever provider (or child) wrote it.
fn account(said: &str) -> String {
    crate::seam::safe_line(said).into_owned()
}

fn artifact_event(ids: &(String, String), artifact_id: &str, part: Part) -> StreamResponse {
    let artifact =
        Artifact { artifact_id: artifact_id.to_owned(), name: Some(artifact_id.to_owned()), parts: vec![part] };
    let update = TaskArtifactUpdateEvent {
        task_id: ids.0.clone(),
        context_id: ids.1.clone(),
        artifact,
        append: false,
        last_chunk: true,
    };
    StreamResponse { artifact_update: Some(update), ..StreamResponse::default() }
}

pub(super) fn to_value<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seam::{Category, Diagnostic, Stage};

    #[test]
    fn a_failures_account_loses_escapes_and_bidi_controls() {
        let reason = "disk\u{1b}[2J full\u{1b}]52;c;cm0gLXJm\u{7}\u{202e}!";
        let diagnostic = Diagnostic::new("far", Stage::SessionRun, Category::ChildError).with_reason(reason);
        let (state, said) = outcome(&RunResult::failed(diagnostic));
        assert_eq!(state, TaskState::Failed);
        let said = said.unwrap();
        assert!(said.ends_with(": disk full!"), "{said}");
    }
}
