//! Background tasks and the model-facing tools that collect them.
//!
//! A [`TaskService`] runs work the model started in the background (a
//! subagent run with `run_in_background`) and lets the owning session
//! collect it with three tools:
//!
//! - `task_output(task_id, wait?, timeout_ms?)`: the task's status and, once
//!   it finished, its output. Waits by default, at most 30 s (`timeout_ms`,
//!   capped at 10 min); a wait that times out leaves the task running.
//! - `task_list()`: the session's tasks and their statuses.
//! - `task_kill(task_id, reason?)`: `requested` (the task is `stopping`,
//!   then `killed`) or `already-finished`.
//!
//! Statuses: `running`, `stopping`, `completed`, `killed`, `failed`. A
//! session holds at most [`DEFAULT_MAX_LIVE_TASKS`] (1,000) unfinished
//! tasks at once ([`TaskService::with_max_live`] sets another cap): each
//! holds a run, its child and its session, and nothing else bounds how
//! many a model starts. Past the cap a start is refused ([`TaskLimit`]), a
//! tool error the model reads, and a task that finishes frees its place.
//! Tasks belong to the session that started them: another session can neither
//! read nor kill them (to it they do not exist). Shutting the owner down
//! ([`Agent::shutdown`], which a run's dispose does) cancels its tasks and
//! waits for them. A task that finishes posts one notice to its owner (a
//! message at its next model call), unless its output was already
//! collected.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::agent::{reads_only, Agent, Tool, ToolContext, ToolOutput, ToolSpec, WeakAgent};

/// The unfinished background tasks one session may hold at once, unless
/// [`TaskService::with_max_live`] says otherwise.
pub const DEFAULT_MAX_LIVE_TASKS: usize = 1000;

/// How long `task_output` waits by default.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);
/// The longest wait `task_output` accepts.
pub const MAX_WAIT: Duration = Duration::from_secs(600);

/// Where a task is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TaskStatus {
    /// Working.
    Running,
    /// A kill was requested; waiting for the work to stop.
    Stopping,
    /// Finished with an output.
    Completed,
    /// Stopped by a kill (or by its owner's shutdown).
    Killed,
    /// Finished with an error.
    Failed,
}

impl TaskStatus {
    /// Whether the task has finished.
    pub fn is_finished(self) -> bool {
        matches!(self, TaskStatus::Completed | TaskStatus::Killed | TaskStatus::Failed)
    }
}

/// What `task_kill` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KillOutcome {
    /// The task was asked to stop.
    Requested,
    /// The task had already finished.
    AlreadyFinished,
}

/// One task as its owner sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TaskSnapshot {
    /// The task id.
    pub task_id: String,
    /// What it is doing (the model's description).
    pub label: String,
    /// Its status.
    pub status: TaskStatus,
    /// The output, once completed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// What went wrong, once failed or killed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// No such task for this session (another session's tasks do not exist).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no task {0:?} for this session")]
pub struct UnknownTask(pub String);

/// A start refused: the session already holds this many unfinished tasks,
/// the most at once. The wording is for the model that asked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "background task refused: this session already has {0} running (the most at once); collect one with \
     task_output or stop one with task_kill, or run this one in the foreground"
)]
pub struct TaskLimit(pub usize);

struct TaskState {
    status: TaskStatus,
    output: Option<String>,
    error: Option<String>,
    kill_reason: Option<String>,
    collected: bool,
    /// `task_output` calls waiting for the end right now: they collect it,
    /// so no notice is posted.
    waiters: usize,
}

struct Task {
    id: String,
    owner: String,
    label: String,
    cancel: CancellationToken,
    state: Mutex<TaskState>,
    /// Turns `true` once the task finished.
    finished: watch::Sender<bool>,
    owner_agent: WeakAgent,
}

impl Task {
    fn state(&self) -> MutexGuard<'_, TaskState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn snapshot(&self) -> TaskSnapshot {
        let state = self.state();
        TaskSnapshot {
            task_id: self.id.clone(),
            label: self.label.clone(),
            status: state.status,
            output: state.output.clone(),
            error: state.error.clone(),
        }
    }

    /// Records the end of the work and posts the one notice.
    fn finish(&self, outcome: Result<String, String>) {
        let notice = {
            let mut state = self.state();
            let killed = state.kill_reason.is_some() || self.cancel.is_cancelled();
            match outcome {
                Ok(output) => {
                    state.status = TaskStatus::Completed;
                    state.output = Some(output);
                }
                Err(_) if killed => {
                    state.status = TaskStatus::Killed;
                    let reason = state.kill_reason.clone().unwrap_or_else(|| "cancelled".to_owned());
                    state.error = Some(format!("killed: {reason}"));
                }
                Err(error) => {
                    state.status = TaskStatus::Failed;
                    state.error = Some(error);
                }
            }
            (!state.collected && state.waiters == 0).then(|| state.status_word())
        };
        self.finished.send_replace(true);
        if let (Some(status), Some(owner)) = (notice, self.owner_agent.upgrade()) {
            owner.steer(format!(
                "Background task {} ({}) is {status}. Read it with task_output(task_id: \"{}\").",
                self.id, self.label, self.id
            ));
        }
    }
}

impl TaskState {
    fn status_word(&self) -> &'static str {
        match self.status {
            TaskStatus::Running => "running",
            TaskStatus::Stopping => "stopping",
            TaskStatus::Completed => "completed",
            TaskStatus::Killed => "killed",
            TaskStatus::Failed => "failed",
        }
    }
}

/// Runs and tracks background tasks per owning session. Cheap to clone.
#[derive(Clone)]
pub struct TaskService {
    inner: Arc<Inner>,
}

struct Inner {
    tasks: Mutex<HashMap<String, Arc<Task>>>,
    next: AtomicU64,
    /// Owners whose shutdown already cancels their tasks.
    hooked: Mutex<std::collections::HashSet<String>>,
    /// The most unfinished tasks per owner.
    max_live: usize,
    /// Unfinished tasks per owner (none: no entry).
    live: Mutex<HashMap<String, usize>>,
}

impl Default for TaskService {
    fn default() -> Self {
        TaskService {
            inner: Arc::new(Inner {
                tasks: Mutex::default(),
                next: AtomicU64::new(0),
                hooked: Mutex::default(),
                max_live: DEFAULT_MAX_LIVE_TASKS,
                live: Mutex::default(),
            }),
        }
    }
}

impl Inner {
    /// Takes a place for one more task of `owner`, if under the cap.
    fn admit(&self, owner: &str) -> Result<(), TaskLimit> {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let count = live.entry(owner.to_owned()).or_default();
        if *count >= self.max_live {
            return Err(TaskLimit(self.max_live));
        }
        *count += 1;
        Ok(())
    }

    /// Gives back the place of a task of `owner` that finished.
    fn release(&self, owner: &str) {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = live.get_mut(owner) {
            *count -= 1;
            if *count == 0 {
                live.remove(owner);
            }
        }
    }
}

impl std::fmt::Debug for TaskService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskService")
            .field("tasks", &self.tasks().len())
            .field("max_live", &self.inner.max_live)
            .finish()
    }
}

impl TaskService {
    /// An empty service, at most [`DEFAULT_MAX_LIVE_TASKS`] unfinished
    /// tasks per session.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty service, at most `max_live` unfinished tasks per session
    /// (at least one).
    pub fn with_max_live(max_live: usize) -> Self {
        let service = Self::default();
        let inner = Inner { max_live: max_live.max(1), ..Arc::into_inner(service.inner).expect("not shared yet") };
        TaskService { inner: Arc::new(inner) }
    }

    /// The most unfinished tasks a session may hold.
    pub fn max_live(&self) -> usize {
        self.inner.max_live
    }

    fn tasks(&self) -> MutexGuard<'_, HashMap<String, Arc<Task>>> {
        self.inner.tasks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts `work` in the background for `owner` and returns its task id
    /// at once, or refuses it when `owner` already holds
    /// [`max_live`](Self::max_live) unfinished tasks (`work` is then never
    /// called). `work` gets the task's own cancellation token (tripped by a
    /// kill or the owner's shutdown) and returns the output or an error.
    /// Must be called inside a tokio runtime (a runtime task, or any other).
    pub fn spawn<F, Fut>(&self, owner: &Agent, label: impl Into<String>, work: F) -> Result<String, TaskLimit>
    where
        F: FnOnce(CancellationToken) -> Fut,
        Fut: Future<Output = Result<String, String>> + Send + 'static,
    {
        self.inner.admit(owner.id())?;
        self.hook_owner(owner);
        let id = format!("task-{}", self.inner.next.fetch_add(1, Ordering::Relaxed) + 1);
        let (finished, _) = watch::channel(false);
        let task = Arc::new(Task {
            id: id.clone(),
            owner: owner.id().to_owned(),
            label: label.into(),
            cancel: CancellationToken::new(),
            state: Mutex::new(TaskState {
                status: TaskStatus::Running,
                output: None,
                error: None,
                kill_reason: None,
                collected: false,
                waiters: 0,
            }),
            finished,
            owner_agent: owner.downgrade(),
        });
        self.tasks().insert(id.clone(), task.clone());
        let work = work(task.cancel.clone());
        let inner = self.inner.clone();
        crate::actors::spawn_beside(async move {
            let outcome = work.await;
            // The place is free before the end is seen, so whoever reads the
            // end may start another at once.
            inner.release(&task.owner);
            task.finish(outcome);
        });
        Ok(id)
    }

    /// The owner's shutdown cancels and awaits its tasks.
    fn hook_owner(&self, owner: &Agent) {
        let first = self.inner.hooked.lock().unwrap_or_else(|e| e.into_inner()).insert(owner.id().to_owned());
        if first {
            let service = self.clone();
            let owner_id = owner.id().to_owned();
            owner.on_shutdown(move || Box::pin(async move { service.dispose_owner(&owner_id).await }));
        }
    }

    fn owned(&self, requester: &str, task_id: &str) -> Result<Arc<Task>, UnknownTask> {
        self.tasks()
            .get(task_id)
            .filter(|task| task.owner == requester)
            .cloned()
            .ok_or_else(|| UnknownTask(task_id.to_owned()))
    }

    /// The task's status and, once finished, its output. With `wait`, waits
    /// up to `timeout` (capped at [`MAX_WAIT`]) for it to finish; a timed
    /// out wait returns the running task and leaves it running.
    pub async fn output(
        &self,
        requester: &str,
        task_id: &str,
        wait: bool,
        timeout: Duration,
    ) -> Result<TaskSnapshot, UnknownTask> {
        let task = self.owned(requester, task_id)?;
        if wait {
            /// Counts this wait, also when the waiting future is dropped.
            struct Waiting<'a>(&'a Task);
            impl Drop for Waiting<'_> {
                fn drop(&mut self) {
                    self.0.state().waiters -= 1;
                }
            }
            task.state().waiters += 1;
            let _waiting = Waiting(&task);
            let mut finished = task.finished.subscribe();
            let _ = tokio::time::timeout(timeout.min(MAX_WAIT), finished.wait_for(|done| *done)).await;
        }
        let snapshot = task.snapshot();
        if snapshot.status.is_finished() {
            task.state().collected = true;
        }
        Ok(snapshot)
    }

    /// The requester's tasks, oldest first (outputs left out).
    pub fn list(&self, requester: &str) -> Vec<TaskSnapshot> {
        let mut tasks: Vec<TaskSnapshot> = self
            .tasks()
            .values()
            .filter(|task| task.owner == requester)
            .map(|task| TaskSnapshot { output: None, ..task.snapshot() })
            .collect();
        tasks.sort_by_key(|t| t.task_id.trim_start_matches("task-").parse::<u64>().unwrap_or(u64::MAX));
        tasks
    }

    /// Asks a running task to stop.
    pub fn kill(&self, requester: &str, task_id: &str, reason: Option<String>) -> Result<KillOutcome, UnknownTask> {
        let task = self.owned(requester, task_id)?;
        let mut state = task.state();
        if state.status.is_finished() {
            return Ok(KillOutcome::AlreadyFinished);
        }
        if state.status == TaskStatus::Running {
            state.status = TaskStatus::Stopping;
            state.kill_reason = Some(reason.unwrap_or_else(|| "requested".to_owned()));
        }
        drop(state);
        task.cancel.cancel();
        Ok(KillOutcome::Requested)
    }

    /// Cancels every task of `owner` and waits until all have finished;
    /// then forgets them.
    pub async fn dispose_owner(&self, owner: &str) {
        let owned: Vec<Arc<Task>> = self.tasks().values().filter(|task| task.owner == owner).cloned().collect();
        for task in &owned {
            {
                let mut state = task.state();
                if state.status == TaskStatus::Running {
                    state.status = TaskStatus::Stopping;
                    state.kill_reason = Some("the owner shut down".to_owned());
                }
            }
            task.cancel.cancel();
        }
        for task in &owned {
            let mut finished = task.finished.subscribe();
            let _ = finished.wait_for(|done| *done).await;
        }
        self.tasks().retain(|_, task| task.owner != owner);
        self.inner.hooked.lock().unwrap_or_else(|e| e.into_inner()).remove(owner);
    }

    /// Tasks not yet finished, across owners.
    pub fn running(&self) -> usize {
        self.tasks().values().filter(|task| !task.state().status.is_finished()).count()
    }

    /// The three task tools, bound to this service.
    pub fn tools(&self) -> [Arc<dyn Tool>; 3] {
        [
            Arc::new(TaskOutputTool(self.clone())),
            Arc::new(TaskListTool(self.clone())),
            Arc::new(TaskKillTool(self.clone())),
        ]
    }
}

fn json_output(value: impl Serialize) -> ToolOutput {
    ToolOutput::ok(serde_json::to_string(&value).unwrap_or_default())
}

/// `task_output(task_id, wait?, timeout_ms?)`.
struct TaskOutputTool(TaskService);

impl Tool for TaskOutputTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "task_output".to_owned(),
            description: "Reads a background task: its status and, once finished, its output. Waits for it to \
                          finish by default (30 s; a timed-out wait leaves the task running)."
                .to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "task_id": {"type": "string"},
                    "wait": {"type": "boolean", "description": "Wait for the task to finish (default true)"},
                    "timeout_ms": {"type": "integer", "minimum": 0, "description": "Longest wait (default 30000, at most 600000)"}
                },
                "required": ["task_id"],
                "additionalProperties": false
            }),
        }
    }

    reads_only!();

    fn call(&self, arguments: Value, context: ToolContext) -> BoxFuture<'_, ToolOutput> {
        Box::pin(async move {
            let task_id = arguments["task_id"].as_str().unwrap_or_default();
            let wait = arguments["wait"].as_bool().unwrap_or(true);
            let timeout = arguments["timeout_ms"].as_u64().map_or(DEFAULT_WAIT, Duration::from_millis);
            let waited = tokio::select! {
                biased;
                _ = context.cancel.cancelled() => return ToolOutput::error("cancelled while waiting for the task"),
                snapshot = self.0.output(&context.session_id, task_id, wait, timeout) => snapshot,
            };
            match waited {
                Ok(snapshot) => json_output(snapshot),
                Err(error) => ToolOutput::error(error.to_string()),
            }
        })
    }
}

/// `task_list()`.
struct TaskListTool(TaskService);

impl Tool for TaskListTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "task_list".to_owned(),
            description: "Lists this session's background tasks and their statuses.".to_owned(),
            parameters: json!({"type": "object", "properties": {}, "additionalProperties": false}),
        }
    }

    reads_only!();

    fn call(&self, _arguments: Value, context: ToolContext) -> BoxFuture<'_, ToolOutput> {
        let tasks = self.0.list(&context.session_id);
        Box::pin(async move { json_output(json!({"tasks": tasks})) })
    }
}

/// `task_kill(task_id, reason?)`.
struct TaskKillTool(TaskService);

impl Tool for TaskKillTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "task_kill".to_owned(),
            description: "Stops a background task of this session.".to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {"task_id": {"type": "string"}, "reason": {"type": "string"}},
                "required": ["task_id"],
                "additionalProperties": false
            }),
        }
    }

    /// It stops only its own session's work.
    fn read_only(&self) -> bool {
        true
    }

    fn call(&self, arguments: Value, context: ToolContext) -> BoxFuture<'_, ToolOutput> {
        let task_id = arguments["task_id"].as_str().unwrap_or_default().to_owned();
        let reason = arguments["reason"].as_str().map(str::to_owned);
        let outcome = self.0.kill(&context.session_id, &task_id, reason);
        Box::pin(async move {
            match outcome {
                Ok(outcome) => json_output(json!({"task_id": task_id, "outcome": outcome})),
                Err(error) => ToolOutput::error(error.to_string()),
            }
        })
    }
}
