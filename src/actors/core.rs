//! State shared by every actor of one runtime and by its handles.

use std::cell::Cell;
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use actix::{Addr, ArbiterHandle};
use dashmap::DashMap;
use tokio::sync::oneshot;

use super::provider::ProviderEntry;
use super::registry::RegistryActor;
use super::run::RunControl;
use crate::events::EventBus;
use crate::live::LiveCounters;
use crate::seam::SubagentError;

thread_local! {
    /// The id of the runtime whose worker this thread is.
    static WORKER: Cell<Option<u64>> = const { Cell::new(None) };
}

tokio::task_local! {
    /// The runtime whose task is being polled right now, if any: set only
    /// while polling futures the runtime spawned on a worker's local set
    /// (user code it runs, a run's provider futures), where actors can be
    /// started in place. A plain `tokio::spawn` on a worker thread is not
    /// inside the local set, and is not marked.
    static IN_TASK: u64;
}

/// Runs `poll` marked as a task of runtime `runtime`.
pub(crate) fn poll_in_runtime<T>(runtime: u64, poll: impl FnOnce() -> T) -> T {
    IN_TASK.sync_scope(runtime, poll)
}

/// `future`, polled as a task of runtime `runtime`.
pub(crate) fn in_runtime<F: Future>(runtime: u64, future: F) -> impl Future<Output = F::Output> {
    IN_TASK.scope(runtime, future)
}

/// Timeouts and sizes fixed at build time.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    /// How long a cancelled child may take to stop before the run settles
    /// `Aborted` without it.
    pub cancel_grace: Duration,
    /// Bound on a child's own dispose hook.
    pub dispose_timeout: Duration,
    /// Bound on each shutdown phase.
    pub shutdown_phase_timeout: Duration,
}

pub(crate) struct Core {
    pub id: u64,
    pub config: Config,
    pub home: Arc<Path>,
    pub workers: Vec<ArbiterHandle>,
    next_worker: AtomicUsize,
    pub events_thread: ArbiterHandle,
    pub registry: OnceLock<Addr<RegistryActor>>,
    pub bus: EventBus,
    pub live: Arc<LiveCounters>,
    pub runs: DashMap<u64, RunControl>,
    pub providers: RwLock<Vec<Arc<ProviderEntry>>>,
    accepting: AtomicBool,
    next_run_id: AtomicU64,
}

impl Core {
    pub(crate) fn new(
        config: Config,
        home: Arc<Path>,
        workers: Vec<ArbiterHandle>,
        events_thread: ArbiterHandle,
        event_capacity: usize,
    ) -> Self {
        static NEXT_RUNTIME: AtomicU64 = AtomicU64::new(1);
        Core {
            id: NEXT_RUNTIME.fetch_add(1, Ordering::Relaxed),
            config,
            home,
            workers,
            next_worker: AtomicUsize::new(0),
            events_thread,
            registry: OnceLock::new(),
            bus: EventBus::new(event_capacity),
            live: Arc::new(LiveCounters::default()),
            runs: DashMap::new(),
            providers: RwLock::new(Vec::new()),
            accepting: AtomicBool::new(true),
            next_run_id: AtomicU64::new(1),
        }
    }

    pub(crate) fn registry(&self) -> &Addr<RegistryActor> {
        self.registry.get().expect("the registry starts before any handle exists")
    }

    pub(crate) fn is_accepting(&self) -> bool {
        self.accepting.load(Ordering::Acquire)
    }

    pub(crate) fn refuse_starts(&self) {
        self.accepting.store(false, Ordering::Release);
    }

    pub(crate) fn mint_run_id(&self) -> u64 {
        self.next_run_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Mark the current thread as a worker of runtime `runtime`.
    pub(crate) fn mark_worker(runtime: u64) {
        WORKER.with(|w| w.set(Some(runtime)));
    }

    /// Whether the caller is a task of this runtime on a worker's local
    /// set, where actors can be started in place.
    pub(crate) fn in_task(&self) -> bool {
        Self::current_task_runtime() == Some(self.id)
    }

    /// The runtime whose task is being polled on this thread, if any.
    pub(crate) fn current_task_runtime() -> Option<u64> {
        IN_TASK.try_with(|runtime| *runtime).ok()
    }

    /// Whether the current thread belongs to any runtime's workers.
    pub(crate) fn on_any_worker() -> bool {
        WORKER.with(|w| w.get()).is_some()
    }

    /// Run `future` on the next worker in turn and hand its output to
    /// `reply`; false when the runtime is stopped.
    pub(crate) fn spawn_on_worker<F>(&self, future: F, reply: impl FnOnce(F::Output) + Send + 'static) -> bool
    where
        F: Future + Send + 'static,
    {
        let n = self.next_worker.fetch_add(1, Ordering::Relaxed);
        let task = in_runtime(self.id, async move { reply(future.await) });
        self.workers[n % self.workers.len()].spawn(task)
    }

    /// Run `future` on a worker: inline when the caller already is one
    /// (no thread crossing), else on the next worker in turn.
    pub(crate) async fn on_runtime<F, T>(&self, future: F) -> Result<T, SubagentError>
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        if self.in_task() {
            return Ok(future.await);
        }
        let (reply, outcome) = oneshot::channel();
        let spawned = self.spawn_on_worker(future, move |output| {
            let _ = reply.send(output);
        });
        if !spawned {
            return Err(SubagentError::RuntimeStopped);
        }
        outcome.await.map_err(|_| SubagentError::RuntimeStopped)
    }
}
