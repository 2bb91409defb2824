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
use tokio_util::sync::CancellationToken;

use super::provider::ProviderEntry;
use super::registry::RegistryActor;
use super::run::{Dispose, ForceStop, RunActor};
use crate::events::EventBus;
use crate::live::LiveCounters;
use crate::seam::SubagentError;

thread_local! {
    /// `(runtime id, worker index)` of the runtime whose worker this thread is.
    static WORKER: Cell<Option<(u64, usize)>> = const { Cell::new(None) };
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

/// What the runtime keeps about one live run, for shutdown.
pub(crate) struct RunControl {
    pub addr: Addr<RunActor>,
    pub token: CancellationToken,
    pub depth: u32,
    pub shared: Arc<super::run_shared::RunShared>,
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
        self.registry
            .get()
            .expect("the registry starts before any handle exists")
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

    /// Mark the current thread as worker `index` of this runtime.
    pub(crate) fn mark_worker(runtime: u64, index: usize) {
        WORKER.with(|w| w.set(Some((runtime, index))));
    }

    /// Whether the current thread is one of this runtime's workers.
    pub(crate) fn on_worker(&self) -> bool {
        WORKER.with(|w| w.get()).is_some_and(|(runtime, _)| runtime == self.id)
    }

    /// Whether the current thread belongs to any runtime's workers.
    pub(crate) fn on_any_worker() -> bool {
        WORKER.with(|w| w.get()).is_some()
    }

    pub(crate) fn pick_worker(&self) -> &ArbiterHandle {
        let n = self.next_worker.fetch_add(1, Ordering::Relaxed);
        &self.workers[n % self.workers.len()]
    }

    /// Run `future` on a worker: inline when the caller already is one
    /// (no thread crossing), else on the next worker in turn.
    pub(crate) async fn on_runtime<F, T>(&self, future: F) -> Result<T, SubagentError>
    where
        F: Future<Output = T> + Send + 'static,
        T: Send + 'static,
    {
        if self.on_worker() {
            return Ok(future.await);
        }
        let (reply, outcome) = oneshot::channel();
        let spawned = self.pick_worker().spawn(async move {
            let _ = reply.send(future.await);
        });
        if !spawned {
            return Err(SubagentError::RuntimeStopped);
        }
        outcome.await.map_err(|_| SubagentError::RuntimeStopped)
    }

    /// Tell a run to dispose (control message: never waits for mailbox room).
    pub(crate) fn dispose_run(control: &RunControl) {
        control.token.cancel();
        control.addr.do_send(Dispose);
    }

    /// Escalation: stop a run without waiting for its child.
    pub(crate) fn force_stop_run(control: &RunControl) {
        control.addr.do_send(ForceStop);
    }
}
