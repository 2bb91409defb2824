//! The server's tasks: one per run, bounded in number, each kept for a
//! while after it ended, with a broadcast of its events for the streams
//! that follow it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::providers::a2a::wire::{StreamResponse, Task, TaskState};

/// Events a slow stream may fall behind by before it is sent a snapshot.
const EVENT_BUFFER: usize = 256;

/// One task: its state so far, the run's cancel, and its event feed.
pub(super) struct Entry {
    pub(super) task: Task,
    pub(super) cancel: CancellationToken,
    pub(super) events: broadcast::Sender<StreamResponse>,
    /// Since when it is terminal (the TTL counts from here).
    ended: Option<Instant>,
}

/// Why a task could not be stored.
#[derive(Debug)]
pub(super) struct Full(pub(super) usize);

/// The tasks, at most `capacity` of them; ended ones leave `ttl` after
/// they ended, or sooner, oldest first, to make room.
pub(super) struct Store {
    tasks: Mutex<Tasks>,
    capacity: usize,
    ttl: Duration,
}

#[derive(Default)]
struct Tasks {
    by_id: HashMap<String, Entry>,
    /// Ids in creation order (newest last).
    order: VecDeque<String>,
}

impl Store {
    pub(super) fn new(capacity: usize, ttl: Duration) -> Arc<Store> {
        Arc::new(Store { tasks: Mutex::default(), capacity, ttl })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tasks> {
        self.tasks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stores a new task, evicting expired (then the oldest ended) tasks
    /// if the store is full; `Full` when every stored task is live.
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
        if tasks.by_id.len() >= self.capacity {
            let oldest_ended = tasks.order.iter().find(|id| tasks.by_id.get(*id).is_some_and(|e| e.ended.is_some()));
            match oldest_ended.cloned() {
                Some(id) => tasks.remove(&id),
                None => return Err(Full(self.capacity)),
            }
        }
        let (events, _) = broadcast::channel(EVENT_BUFFER);
        tasks.order.push_back(task.id.clone());
        tasks.by_id.insert(task.id.clone(), Entry { task, cancel, events, ended: None });
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

    /// Applies `event` to the task and sends it to its followers.
    pub(super) fn publish(&self, id: &str, event: StreamResponse) {
        let mut tasks = self.lock();
        let Some(entry) = tasks.by_id.get_mut(id) else { return };
        if let Some(update) = &event.status_update {
            entry.task.status = update.status.clone();
            if update.status.state.is_terminal() {
                entry.ended = Some(Instant::now());
            }
        }
        if let Some(update) = &event.artifact_update {
            entry.task.artifacts.push(update.artifact.clone());
        }
        // No follower is no error.
        let _ = entry.events.send(event);
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
        self.by_id.remove(id);
        self.order.retain(|known| known != id);
    }
}
