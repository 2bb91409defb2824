//! The server's tasks: one per run, bounded in number and in the bytes
//! their messages and artifacts hold together, each kept for a while after
//! it ended, with a broadcast of its events for the streams that follow it.
//!
//! Both bounds make room the same way: the oldest ended task leaves first.
//! Live tasks never leave; a new task that finds no ended one to evict is
//! refused. A task that has just ended is kept even past the byte bound
//! (its client is reading it), until the next task needs the room.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::wire::a2a::{
    self as wire, Message, Part, Role, StreamResponse, Task, TaskState, TaskStatus, TaskStatusUpdateEvent,
};

/// Events a slow stream may fall behind by before it is sent a snapshot.
const EVENT_BUFFER: usize = 256;

/// One task: its state so far, the run's cancel, and its event feed.
pub(super) struct Entry {
    pub(super) task: Task,
    pub(super) cancel: CancellationToken,
    pub(super) events: broadcast::Sender<StreamResponse>,
    /// Since when it is terminal (the TTL counts from here).
    ended: Option<Instant>,
    /// What its messages and artifacts hold ([`Task::bytes`]).
    bytes: usize,
}

/// Why a task could not be stored: every task that would have to leave
/// to make room is live.
#[derive(Debug, thiserror::Error)]
pub(super) enum Full {
    #[error("the server holds {0} live tasks, its most")]
    Tasks(usize),
    #[error("the server's live tasks and this one would hold more than {0} bytes, its most")]
    Bytes(usize),
}

/// The tasks, at most `capacity` of them holding at most `max_bytes`;
/// ended ones leave `ttl` after they ended, or sooner, oldest first, to
/// make room.
pub(super) struct Store {
    tasks: Mutex<Tasks>,
    capacity: usize,
    max_bytes: usize,
    ttl: Duration,
}

#[derive(Default)]
struct Tasks {
    by_id: HashMap<String, Entry>,
    /// Ids in creation order (newest last).
    order: VecDeque<String>,
    /// What every entry holds, together.
    bytes: usize,
}

impl Store {
    pub(super) fn new(capacity: usize, max_bytes: usize, ttl: Duration) -> Arc<Store> {
        Arc::new(Store { tasks: Mutex::default(), capacity, max_bytes, ttl })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tasks> {
        self.tasks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stores a new task, evicting expired (then the oldest ended) tasks
    /// while the store is full in number or in bytes; `Full` when only
    /// live tasks are left to evict.
    pub(super) fn insert(&self, task: Task, cancel: CancellationToken) -> Result<(), Full> {
        let mut tasks = self.lock();
        let now = Instant::now();
        let ttl = self.ttl;
        let expired: Vec<String> = tasks
            .by_id
            .iter()
            .filter(|(_, entry)| entry.ended.is_some_and(|ended| now.duration_since(ended) >= ttl))
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            tasks.remove(&id);
        }
        let bytes = task.bytes();
        loop {
            let full = if tasks.by_id.len() >= self.capacity {
                Full::Tasks(self.capacity)
            } else if tasks.bytes.saturating_add(bytes) > self.max_bytes {
                Full::Bytes(self.max_bytes)
            } else {
                break;
            };
            if !tasks.evict_oldest_ended(None) {
                return Err(full);
            }
        }
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        tasks.order.push_back(task.id.clone());
        tasks.bytes += bytes;
        tasks.by_id.insert(task.id.clone(), Entry { task, cancel, events, ended: None, bytes });
        Ok(())
    }

    /// The task as it stands.
    pub(super) fn get(&self, id: &str) -> Option<Task> {
        self.lock().by_id.get(id).map(|entry| entry.task.clone())
    }

    /// The task and a feed of what follows, unless it is terminal already.
    pub(super) fn follow(&self, id: &str) -> Option<(Task, broadcast::Receiver<StreamResponse>)> {
        let tasks = self.lock();
        let entry = tasks.by_id.get(id)?;
        Some((entry.task.clone(), entry.events.subscribe()))
    }

    /// Trips the task's run cancel; `None` if unknown, `Some(false)` if it
    /// is terminal already.
    pub(super) fn cancel(&self, id: &str) -> Option<bool> {
        let tasks = self.lock();
        let entry = tasks.by_id.get(id)?;
        if entry.task.status.state.is_terminal() {
            return Some(false);
        }
        entry.cancel.cancel();
        Some(true)
    }

    /// Applies `event` to the task and sends it to its followers; past the
    /// byte bound, older ended tasks leave.
    pub(super) fn publish(&self, id: &str, event: StreamResponse) {
        let mut tasks = self.lock();
        let Some(entry) = tasks.by_id.get_mut(id) else { return };
        let before = entry.bytes;
        if let Some(update) = &event.status_update {
            let replaced = entry.task.status.message.as_ref().map_or(0, Message::bytes);
            let said = update.status.message.as_ref().map_or(0, Message::bytes);
            entry.bytes = entry.bytes - replaced + said;
            entry.task.status = update.status.clone();
            if update.status.state.is_terminal() {
                entry.ended = Some(Instant::now());
            }
        }
        if let Some(update) = &event.artifact_update {
            entry.bytes += wire::parts_bytes(&update.artifact.parts);
            entry.task.artifacts.push(update.artifact.clone());
        }
        // No follower is no error.
        let _ = entry.events.send(event);
        let after = entry.bytes;
        tasks.bytes = tasks.bytes - before + after;
        while tasks.bytes > self.max_bytes && tasks.evict_oldest_ended(Some(id)) {}
    }

    /// Adds the client's `message` to the task's history (an answer on the
    /// task); past the byte bound, older ended tasks leave.
    pub(super) fn record(&self, id: &str, message: Message) {
        let mut tasks = self.lock();
        let Some(entry) = tasks.by_id.get_mut(id) else { return };
        let bytes = message.bytes();
        entry.bytes += bytes;
        entry.task.history.push(message);
        tasks.bytes += bytes;
        while tasks.bytes > self.max_bytes && tasks.evict_oldest_ended(Some(id)) {}
    }

    /// Tasks newest first, filtered, from `offset`: the page and the total.
    pub(super) fn list(
        &self,
        context_id: Option<&str>,
        state: Option<TaskState>,
        offset: usize,
        page_size: usize,
    ) -> (Vec<Task>, usize) {
        let tasks = self.lock();
        let matching: Vec<&Entry> = tasks
            .order
            .iter()
            .rev()
            .filter_map(|id| tasks.by_id.get(id))
            .filter(|entry| context_id.is_none_or(|context| entry.task.context_id.as_deref() == Some(context)))
            .filter(|entry| state.is_none_or(|state| entry.task.status.state == state))
            .collect();
        let total = matching.len();
        let page = matching.into_iter().skip(offset).take(page_size).map(|entry| entry.task.clone()).collect();
        (page, total)
    }

    /// Ids of the tasks still running.
    pub(super) fn live(&self) -> Vec<String> {
        let tasks = self.lock();
        tasks.by_id.iter().filter(|(_, entry)| entry.ended.is_none()).map(|(id, _)| id.clone()).collect()
    }
}

impl Tasks {
    fn remove(&mut self, id: &str) {
        if let Some(entry) = self.by_id.remove(id) {
            self.bytes -= entry.bytes;
        }
        self.order.retain(|known| known != id);
    }

    /// Evicts the oldest ended task but `sparing`; whether there was one.
    fn evict_oldest_ended(&mut self, sparing: Option<&str>) -> bool {
        let oldest = self
            .order
            .iter()
            .find(|id| Some(id.as_str()) != sparing && self.by_id.get(*id).is_some_and(|entry| entry.ended.is_some()));
        match oldest.cloned() {
            Some(id) => {
                tracing::debug!(task = %id, "an ended task left the store to make room");
                self.remove(&id);
                true
            }
            None => false,
        }
    }
}

/// A task's status changed (with what it said, if anything): the event
/// the store publishes to the task's watchers.
pub(super) fn status_event(ids: &(String, String), state: TaskState, said: Option<String>) -> StreamResponse {
    let message = said.map(|text| Message {
        message_id: format!("msg-{}", crate::agent::ids::session_id()),
        context_id: Some(ids.1.clone()),
        task_id: Some(ids.0.clone()),
        role: Role::Agent,
        parts: vec![Part::text(text)],
        metadata: None,
    });
    let status = TaskStatus { state, message, timestamp: None };
    let update = TaskStatusUpdateEvent { task_id: ids.0.clone(), context_id: ids.1.clone(), status };
    StreamResponse { status_update: Some(update), ..StreamResponse::default() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::a2a::{Artifact, Part, Role, TaskArtifactUpdateEvent, TaskStatus, TaskStatusUpdateEvent};

    /// A submitted task whose message holds `bytes` of text.
    fn task(id: &str, bytes: usize) -> Task {
        let message = Message {
            message_id: format!("m-{id}"),
            context_id: None,
            task_id: None,
            role: Role::User,
            parts: vec![Part::text("x".repeat(bytes))],
            metadata: None,
        };
        Task {
            id: id.to_owned(),
            context_id: None,
            status: TaskStatus { state: TaskState::Submitted, message: None, timestamp: None },
            artifacts: Vec::new(),
            history: vec![message],
        }
    }

    fn ended(store: &Store, id: &str) {
        let status = TaskStatus { state: TaskState::Completed, message: None, timestamp: None };
        let update = TaskStatusUpdateEvent { task_id: id.to_owned(), context_id: "ctx".to_owned(), status };
        store.publish(id, StreamResponse { status_update: Some(update), ..StreamResponse::default() });
    }

    fn artifact(store: &Store, id: &str, bytes: usize) {
        let artifact =
            Artifact { artifact_id: "output".to_owned(), name: None, parts: vec![Part::text("y".repeat(bytes))] };
        let update = TaskArtifactUpdateEvent {
            task_id: id.to_owned(),
            context_id: "ctx".to_owned(),
            artifact,
            append: false,
            last_chunk: true,
        };
        store.publish(id, StreamResponse { artifact_update: Some(update), ..StreamResponse::default() });
    }

    #[test]
    fn a_new_task_makes_room_in_bytes_by_evicting_the_oldest_ended() {
        let store = Store::new(100, 1000, Duration::from_secs(3600));
        for id in ["a", "b", "c"] {
            store.insert(task(id, 300), CancellationToken::new()).unwrap();
            ended(&store, id);
        }
        store.insert(task("d", 300), CancellationToken::new()).unwrap();
        assert!(store.get("a").is_none(), "the oldest ended task left");
        assert!(store.get("b").is_some() && store.get("c").is_some() && store.get("d").is_some());
    }

    #[test]
    fn live_tasks_stay_and_a_task_that_does_not_fit_beside_them_is_refused() {
        let store = Store::new(100, 500, Duration::from_secs(3600));
        store.insert(task("a", 300), CancellationToken::new()).unwrap();
        let refused = store.insert(task("b", 300), CancellationToken::new()).unwrap_err();
        assert!(matches!(refused, Full::Bytes(500)), "{refused}");
        assert!(store.get("a").is_some());
    }

    #[test]
    fn a_task_that_grows_past_the_bound_evicts_older_ended_ones_but_stays() {
        let store = Store::new(100, 1000, Duration::from_secs(3600));
        store.insert(task("a", 300), CancellationToken::new()).unwrap();
        ended(&store, "a");
        store.insert(task("b", 300), CancellationToken::new()).unwrap();
        artifact(&store, "b", 900);
        ended(&store, "b");
        assert!(store.get("a").is_none(), "the older ended task made room");
        let b = store.get("b").expect("the task that just ended is kept for its client");
        assert_eq!(b.artifacts.len(), 1);
        // The next task finds it ended, and evicts it in turn.
        store.insert(task("c", 300), CancellationToken::new()).unwrap();
        assert!(store.get("b").is_none() && store.get("c").is_some());
    }
}
