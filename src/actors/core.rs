//! State shared by every actor of one runtime and by its handles: the
//! configuration, the worker threads, the event bus, the live counters, the
//! provider table and the run table. The floor under the actors: it names
//! no actor type (a run is held as its [`RunControl`], a provider as its
//! [`ProviderEntry`]), and every field is reached through a method.

use std::cell::Cell;
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use actix::ArbiterHandle;
use dashmap::DashMap;
use tokio::sync::oneshot;

use super::control::RunControl;
use super::entry::ProviderEntry;
use super::run_shared::{Family, RunShared};
use crate::events::EventBus;
use crate::live::LiveCounters;
use crate::seam::{Approvals, StartError};

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
    id: u64,
    config: Config,
    home: Arc<Path>,
    workers: Vec<ArbiterHandle>,
    next_worker: AtomicUsize,
    events_thread: ArbiterHandle,
    bus: EventBus,
    live: Arc<LiveCounters>,
    /// Live runs by run id (the runtime's one run table), shared with the
    /// runs' handles.
    runs: DashMap<u64, Arc<RunControl>>,
    /// Open families by session id: the runs started under a live run's
    /// session (or a serve scope's), for receipts.
    families: DashMap<String, Arc<Family>>,
    /// Registered providers in insertion order (the one provider table;
    /// the registry actor keeps only the addresses of the actors it
    /// supervises, retired ones included).
    providers: RwLock<Vec<Arc<ProviderEntry>>>,
    accepting: AtomicBool,
    next_run_id: AtomicU64,
    /// The route of runs whose parent brings none: the approver a door
    /// installed on the runtime, else nobody.
    approvals: RwLock<Approvals>,
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
            bus: EventBus::new(event_capacity),
            live: Arc::new(LiveCounters::default()),
            runs: DashMap::new(),
            families: DashMap::new(),
            providers: RwLock::new(Vec::new()),
            accepting: AtomicBool::new(true),
            next_run_id: AtomicU64::new(1),
            approvals: RwLock::new(Approvals::nobody()),
        }
    }

    /// This runtime's id (tells its tasks from another runtime's).
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    pub(crate) fn home(&self) -> &Arc<Path> {
        &self.home
    }

    pub(crate) fn bus(&self) -> &EventBus {
        &self.bus
    }

    /// The thread callback listeners run on.
    pub(crate) fn events_thread(&self) -> &ArbiterHandle {
        &self.events_thread
    }

    pub(crate) fn live(&self) -> &Arc<LiveCounters> {
        &self.live
    }

    /// The route of a run whose parent brings none.
    pub(crate) fn approvals(&self) -> Approvals {
        self.approvals.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn set_approvals(&self, approvals: Approvals) {
        *self.approvals.write().unwrap_or_else(|e| e.into_inner()) = approvals;
    }

    /// The registered provider named `name`.
    pub(crate) fn provider(&self, name: &str) -> Option<Arc<ProviderEntry>> {
        self.read_providers().iter().find(|entry| entry.name() == name).cloned()
    }

    /// The key of the provider registered as `name`.
    #[cfg(feature = "agent")]
    pub(crate) fn provider_key(&self, name: &str) -> Option<u64> {
        self.read_providers().iter().find(|entry| entry.name() == name).map(|entry| entry.key)
    }

    /// Registered provider names, in insertion order.
    pub(crate) fn provider_names(&self) -> Vec<String> {
        self.read_providers().iter().map(|entry| entry.name().to_owned()).collect()
    }

    /// Adds `entry`; `false` when its name is taken.
    pub(crate) fn insert_provider(&self, entry: Arc<ProviderEntry>) -> bool {
        let mut table = self.providers.write().unwrap_or_else(|e| e.into_inner());
        if table.iter().any(|e| e.name() == entry.name()) {
            return false;
        }
        table.push(entry);
        true
    }

    /// Removes the entry with `key`, if it is still registered.
    pub(crate) fn remove_provider(&self, key: u64) -> Option<Arc<ProviderEntry>> {
        let mut table = self.providers.write().unwrap_or_else(|e| e.into_inner());
        table.iter().position(|e| e.key == key).map(|index| table.remove(index))
    }

    fn read_providers(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<ProviderEntry>>> {
        self.providers.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn insert_run(&self, run_id: u64, control: Arc<RunControl>) {
        self.runs.insert(run_id, control);
    }

    pub(crate) fn remove_run(&self, run_id: u64) {
        self.runs.remove(&run_id);
    }

    /// The live run `run_id`, if it is still in the table.
    pub(crate) fn run_control(&self, run_id: u64) -> Option<Arc<RunControl>> {
        self.runs.get(&run_id).map(|entry| entry.value().clone())
    }

    /// Opens the family of `session`: runs published with it as their
    /// parent session are adopted into it until it is closed. A session
    /// continued by a new run opens a new family; the old one stays with
    /// the old run.
    pub(crate) fn open_family(&self, session: &str) -> Arc<Family> {
        let family = Arc::new(Family::new(session));
        self.families.insert(session.to_owned(), family.clone());
        family
    }

    /// Stops adopting into `family` (if it is still the open one).
    pub(crate) fn close_family(&self, family: &Arc<Family>) {
        self.families.remove_if(family.session(), |_, open| Arc::ptr_eq(open, family));
    }

    /// Records a published run under its parent session's open family, if any.
    pub(crate) fn adopt(&self, parent_session: &str, shared: &Arc<RunShared>) {
        if let Some(family) = self.families.get(parent_session) {
            family.adopt(shared.clone());
        }
    }

    /// Every live run, for shutdown.
    pub(crate) fn live_runs(&self) -> Vec<Arc<RunControl>> {
        self.runs.iter().map(|entry| entry.value().clone()).collect()
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
        self.spawn_on(n, future, reply)
    }

    /// How many worker threads host runs.
    #[cfg(feature = "batch")]
    pub(crate) fn worker_count(&self) -> usize {
        self.workers.len()
    }

    /// Run `future` on worker `n` (modulo their number) and hand its output
    /// to `reply`; false when the runtime is stopped.
    pub(crate) fn spawn_on<F>(&self, n: usize, future: F, reply: impl FnOnce(F::Output) + Send + 'static) -> bool
    where
        F: Future + Send + 'static,
    {
        let task = in_runtime(self.id, async move { reply(future.await) });
        self.workers[n % self.workers.len()].spawn(task)
    }

    /// Run `future` on a worker: inline when the caller already is one
    /// (no thread crossing), else on the next worker in turn.
    pub(crate) async fn on_runtime<F, T>(&self, future: F) -> Result<T, StartError>
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
            return Err(StartError::RuntimeStopped);
        }
        outcome.await.map_err(|_| StartError::RuntimeStopped)
    }
}
