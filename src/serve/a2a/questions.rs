//! A task's permission requests, asked of its A2A client: the task goes
//! `TASK_STATE_INPUT_REQUIRED` with the question as its status message and
//! resumes `TASK_STATE_WORKING` when the client answers on the same task.
//!
//! Each task's run carries a route to a [`TaskApprover`]
//! ([`crate::seam::Approvals`]): a descendant's request that climbs this
//! far joins the task's queue of questions. The first one waiting is the
//! task's status message: a text part (`<who> asks: <what>. Answer on this
//! task with one of: yes (Allow: allow once), …`, made safe to show) and a
//! data part `{"permission": {"asker", "call", "options": [{"id", "name",
//! "kind"}]}}`.
//!
//! The client answers with a message naming the task (`taskId`): a data
//! part `{"optionId": ID}` (with `"question": N`, the number the data part
//! of the question carries), or a text part that is an option's id or name
//! (case and surrounding blanks aside). An answer naming no option the
//! child offered is refused (`-32602`, listing the options) and the task
//! stays input-required; an offered one is given to the child, and the task
//! shows the next question, or is working again. No answer within the
//! asker's timeout, or the run cancelled, withdraws the question (a reject)
//! and the task goes on.
//!
//! An answer is never given to a question its client may not have seen:
//! one naming a question that no longer waits is refused, and one naming
//! none is taken only when the question waiting is the only one shown since
//! the task's last answer (else a question withdrawn meanwhile would pass
//! its answer to the next). A message id already taken as an answer is
//! refused, so a client's retry does not answer the next question too.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::store::{status_event, Store};
use crate::seam::{safe_line, Answer, Approver, PermissionOption, PermissionRequest};
use crate::wire::a2a::{code, Message, Part, TaskState};

/// Who answered, as the asker's transcript records it.
const BY_CLIENT: &str = "the A2A client of subagents a2a";

/// The questions waiting on their tasks' clients, by task id.
pub(super) struct Questions {
    store: Arc<Store>,
    waiting: Mutex<HashMap<String, Asking>>,
    asked: AtomicU64,
}

/// A task's questions, and what its client was shown and answered.
#[derive(Default)]
struct Asking {
    queue: VecDeque<Question>,
    /// Questions shown since the last answer.
    shown: u32,
    /// The message ids of the last answers taken.
    answered_by: VecDeque<String>,
}

/// Answers' message ids remembered per task.
const ANSWERS_REMEMBERED: usize = 32;

/// One request waiting on its client.
struct Question {
    number: u64,
    request: PermissionRequest,
    answer: oneshot::Sender<Answer>,
}

impl Questions {
    pub(super) fn new(store: Arc<Store>) -> Arc<Questions> {
        Arc::new(Questions { store, waiting: Mutex::default(), asked: AtomicU64::new(0) })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Asking>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The approver of the task `ids` (task, context).
    pub(super) fn approver(self: &Arc<Self>, ids: (String, String)) -> TaskApprover {
        TaskApprover { questions: self.clone(), ids }
    }

    /// Publishes where the task stands: its first question, or working.
    fn show(&self, ids: &(String, String), asking: &mut Asking) {
        let event = match asking.queue.front() {
            Some(question) => {
                asking.shown += 1;
                let mut event = status_event(ids, TaskState::InputRequired, Some(asking_text(&question.request)));
                if let Some(message) = event.status_update.as_mut().and_then(|update| update.status.message.as_mut()) {
                    let mut asked = asked_data(&question.request);
                    asked["question"] = json!(question.number);
                    message.parts.push(Part::data(json!({ "permission": asked })));
                }
                event
            }
            None => status_event(ids, TaskState::Working, None),
        };
        // A task that ended meanwhile is not reopened.
        if self.store.get(&ids.0).is_some_and(|task| !task.status.state.is_terminal()) {
            self.store.publish(&ids.0, event);
        }
    }

    /// Asks the task's client; resolves to the answer, or a reject when
    /// `cancel` trips first (the question is then withdrawn).
    async fn ask(&self, ids: (String, String), request: PermissionRequest, cancel: CancellationToken) -> Answer {
        let number = self.asked.fetch_add(1, Ordering::Relaxed);
        let (answer, answered) = oneshot::channel();
        {
            let mut waiting = self.lock();
            // A task's record outlives its questions (what it was shown and
            // answered is what keeps a late answer from the next question),
            // until the task ends.
            waiting.retain(|task, asking| {
                !asking.queue.is_empty() || self.store.get(task).is_some_and(|task| !task.status.state.is_terminal())
            });
            let asking = waiting.entry(ids.0.clone()).or_default();
            asking.queue.push_back(Question { number, request, answer });
            if asking.queue.len() == 1 {
                self.show(&ids, asking);
            }
        }
        // However this ends (answered, cancelled, or this future dropped
        // by an asker that stopped waiting), the question leaves the queue.
        let _withdraw = Withdraw { questions: self, ids: &ids, number };
        tokio::select! {
            answered = answered => match answered {
                Ok(answer) => answer,
                Err(_) => Answer::reject(format!("{BY_CLIENT} is gone")),
            },
            _ = cancel.cancelled() => Answer::reject("the question was withdrawn"),
        }
    }

    /// Takes question `number` out of its task's queue, if it is still
    /// there; the task then shows the next question, or works on.
    fn withdraw(&self, ids: &(String, String), number: u64) {
        let mut waiting = self.lock();
        let Some(asking) = waiting.get_mut(&ids.0) else { return };
        let first = asking.queue.front().is_some_and(|question| question.number == number);
        asking.queue.retain(|question| question.number != number);
        if first {
            self.show(ids, asking);
        }
    }

    /// The client's `message` to the task `ids`, as the answer to its
    /// first question. Refused, the question still waiting, when it names
    /// no option the child offered; refused when nothing waits.
    pub(super) fn answer(&self, ids: &(String, String), message: &Message) -> Result<(), (i64, String)> {
        let mut waiting = self.lock();
        let Some(asking) = waiting.get_mut(&ids.0).filter(|asking| !asking.queue.is_empty()) else {
            let reason = "the task is not waiting for input (a message to a task answers its question)";
            return Err((code::UNSUPPORTED_OPERATION, reason.to_owned()));
        };
        if asking.answered_by.contains(&message.message_id) {
            let reason = "this message was taken as an answer already (a new answer needs a new messageId)";
            return Err((code::INVALID_PARAMS, reason.to_owned()));
        }
        let front = &asking.queue[0];
        let named = message.parts.iter().find_map(|part| part.data.as_ref()?.get("question")?.as_u64());
        match named {
            Some(number) if number != front.number => {
                let reason = format!("question {number} is no longer waiting: the task asks question {}", front.number);
                return Err((code::INVALID_PARAMS, reason));
            }
            None if asking.shown > 1 => {
                let reason = format!(
                    "the question changed since the last answer: name it (a data part with \"question\": {})",
                    front.number
                );
                return Err((code::INVALID_PARAMS, reason));
            }
            _ => {}
        }
        let request = &front.request;
        let Some(option) = chosen(request, message) else {
            let ids: Vec<String> = request.options.iter().map(|option| safe_line(&option.id).into_owned()).collect();
            let reason = format!("the answer names none of the options offered: {}", ids.join(", "));
            return Err((code::INVALID_PARAMS, reason));
        };
        let answer = Answer::chose(option, BY_CLIENT);
        let question = asking.queue.pop_front().expect("a question waits");
        // The asker may have given up this very moment: then it rejects.
        let _ = question.answer.send(answer);
        asking.shown = 0;
        if asking.answered_by.len() == ANSWERS_REMEMBERED {
            asking.answered_by.pop_front();
        }
        asking.answered_by.push_back(message.message_id.chars().take(256).collect());
        self.show(ids, asking);
        Ok(())
    }
}

/// Withdraws its question when dropped.
struct Withdraw<'a> {
    questions: &'a Questions,
    ids: &'a (String, String),
    number: u64,
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        self.questions.withdraw(self.ids, self.number);
    }
}

/// Asks one task's client.
pub(super) struct TaskApprover {
    questions: Arc<Questions>,
    ids: (String, String),
}

impl std::fmt::Debug for TaskApprover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskApprover").field("task", &self.ids.0).finish()
    }
}

impl Approver for TaskApprover {
    fn ask(&self, request: PermissionRequest, cancel: CancellationToken) -> BoxFuture<'static, Answer> {
        let (questions, ids) = (self.questions.clone(), self.ids.clone());
        Box::pin(async move { questions.ask(ids, request, cancel).await })
    }
}

/// The question as the status message's text.
fn asking_text(request: &PermissionRequest) -> String {
    let options: Vec<String> = request
        .options
        .iter()
        .map(|option| {
            format!("{} ({}: {})", safe_line(&option.id), safe_line(&option.name), request.option_said(option.kind))
        })
        .collect();
    format!(
        "{} asks: {}. Answer on this task with one of: {}",
        request.asker_line(),
        request.call_line(),
        options.join(", ")
    )
}

/// The question as the status message's data part.
fn asked_data(request: &PermissionRequest) -> Value {
    let options: Vec<Value> = request
        .options
        .iter()
        .map(|option| json!({"id": option.id, "name": safe_line(&option.name), "kind": option.kind}))
        .collect();
    json!({"asker": request.asker_line(), "call": request.call_line(), "options": options})
}

/// The option `message` names (a data part's `optionId`, else a text part
/// that is an option's id or name), when offered.
fn chosen<'a>(request: &'a PermissionRequest, message: &Message) -> Option<&'a PermissionOption> {
    let by_data = message.parts.iter().find_map(|part| part.data.as_ref()?.get("optionId")?.as_str());
    match by_data {
        Some(id) => request.options.iter().find(|option| option.id == id),
        None => message.parts.iter().filter_map(|part| part.text.as_deref()).find_map(|text| {
            // An option's id before any option's name: a name cannot pose
            // as another option's id.
            let text = text.trim();
            let by_id = request.options.iter().find(|option| option.id == text);
            by_id.or_else(|| request.options.iter().find(|option| option.name.eq_ignore_ascii_case(text)))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seam::OptionKind;
    use crate::wire::a2a::Role;

    fn message(parts: Vec<Part>) -> Message {
        Message { message_id: "m".to_owned(), context_id: None, task_id: None, role: Role::User, parts, metadata: None }
    }

    #[test]
    fn an_answer_names_an_offered_option_by_data_id_or_text() {
        let request = PermissionRequest::new(vec![
            PermissionOption::new("yes", "Allow", OptionKind::AllowOnce),
            PermissionOption::new("no", "Reject", OptionKind::RejectOnce),
        ]);
        assert_eq!(
            chosen(&request, &message(vec![Part::data(json!({"optionId": "yes"}))])).map(|option| option.id.as_str()),
            Some("yes")
        );
        assert_eq!(chosen(&request, &message(vec![Part::text(" no\n")])).map(|option| option.id.as_str()), Some("no"));
        assert_eq!(
            chosen(&request, &message(vec![Part::text("allow")])).map(|option| option.id.as_str()),
            Some("yes"),
            "by name"
        );
        assert_eq!(
            chosen(&request, &message(vec![Part::text("always")])).map(|option| option.id.as_str()),
            None,
            "never offered"
        );
        assert_eq!(
            chosen(&request, &message(vec![Part::data(json!({"optionId": "always"}))]))
                .map(|option| option.id.as_str()),
            None
        );
        // A hostile agent names an allowing option as another's id: the id wins.
        let posing = PermissionRequest::new(vec![
            PermissionOption::new("a", "no", OptionKind::AllowOnce),
            PermissionOption::new("no", "Reject", OptionKind::RejectOnce),
        ]);
        assert_eq!(chosen(&posing, &message(vec![Part::text("no")])).map(|option| option.id.as_str()), Some("no"));
    }
}
