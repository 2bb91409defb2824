//! `Runtime`: owns the actor system's threads, hands out `Subagents`, and
//! shuts the tree down in bounded phases.
//!
//! Threads: one control thread (the actix System, hosting the registry and
//! provider actors), `workers` arbiters hosting run actors and caller code
//! (`spawn`, `block_on`), and one events thread for callback listeners so a
//! slow listener never stalls a run.
//!
//! Shutdown phases, each bounded by `shutdown_phase_timeout` and named in
//! tracing spans: `refuse-starts` → `dispose-runs` (deepest runs first;
//! runs still alive at the bound are forced down) → `stop-providers` →
//! `stop-registry`; then the threads are stopped and joined.

use std::collections::HashSet;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use actix::{Actor, Addr, Arbiter, System};
use futures_util::future::join_all;
use tokio::sync::oneshot;
use tracing::Instrument;

use super::core::Config;
use super::core::Core;
use super::registry::{ProvidersStopped, RegistryActor, StopProviders, StopRegistry};
use super::subagents::Subagents;
use crate::live::Live;
use crate::seam::SubagentError;

/// Configures a [`Runtime`].
#[derive(Clone, Debug)]
pub struct RuntimeBuilder {
    workers: usize,
    home: Option<PathBuf>,
    config: Config,
    event_capacity: usize,
}

impl RuntimeBuilder {
    /// Number of worker arbiters hosting runs (default: one per core).
    pub fn workers(mut self, workers: usize) -> Self {
        self.workers = workers.max(1);
        self
    }

    /// Home directory for sessions and provider state (default:
    /// `$SUBAGENTS_HOME`, else a private temporary directory of the
    /// runtime's own, removed when the runtime is dropped: a runtime
    /// writes nowhere it was not told to, the working directory least).
    pub fn home(mut self, home: impl Into<PathBuf>) -> Self {
        self.home = Some(home.into());
        self
    }

    /// How long a cancelled child may take to stop before its run settles
    /// `Aborted` without it (default 1 s).
    pub fn cancel_grace(mut self, grace: Duration) -> Self {
        self.config.cancel_grace = grace;
        self
    }

    /// Bound on a child's dispose hook (default 10 s).
    pub fn dispose_timeout(mut self, timeout: Duration) -> Self {
        self.config.dispose_timeout = timeout;
        self
    }

    /// Bound on each shutdown phase (default 5 s).
    pub fn shutdown_phase_timeout(mut self, timeout: Duration) -> Self {
        self.config.shutdown_phase_timeout = timeout;
        self
    }

    /// Events buffered per subscriber before a slow one starts lagging
    /// (default 4096).
    pub fn event_capacity(mut self, capacity: usize) -> Self {
        self.event_capacity = capacity.max(1);
        self
    }

    /// Start the threads and the registry.
    ///
    /// The first runtime of a process also chains a panic hook that keeps
    /// a panic the runtime contains off stderr unless `RUST_BACKTRACE` is
    /// set: it settles its run `Error` with the panic's message as the
    /// diagnostic's detail, and is logged at error (see `contain.rs`).
    pub fn build(self) -> std::io::Result<Runtime> {
        crate::contain::quiet_contained_panics();
        let (home, own_home) = match self.home.or_else(|| std::env::var_os("SUBAGENTS_HOME").map(PathBuf::from)) {
            Some(home) => (home, None),
            None => {
                let own = OwnHome::create()?;
                (own.0.clone(), Some(own))
            }
        };
        let home: Arc<std::path::Path> = Arc::from(std::path::absolute(&home)?);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (exited_tx, exited_rx) = oneshot::channel();
        let RuntimeBuilder { workers, config, event_capacity, .. } = self;
        let thread = std::thread::Builder::new().name("subagents-control".into()).spawn(move || {
            let system = System::new();
            let arbiters: Vec<Arbiter> = (0..workers).map(|_| Arbiter::new()).collect();
            let events = Arbiter::new();
            let core = Arc::new(Core::new(
                config,
                home,
                arbiters.iter().map(Arbiter::handle).collect(),
                events.handle(),
                event_capacity,
            ));
            for arbiter in &arbiters {
                let runtime = core.id();
                arbiter.spawn_fn(move || Core::mark_worker(runtime));
            }
            let registry = system.block_on(async { RegistryActor::new(core.clone()).start() });
            let _ = ready_tx.send((core, registry, System::current()));
            if let Err(error) = system.run() {
                tracing::error!(%error, "the actor system stopped with an error");
            }
            for arbiter in arbiters.into_iter().chain([events]) {
                arbiter.stop();
                let _ = arbiter.join();
            }
            let _ = exited_tx.send(());
        })?;
        let (core, registry, system) =
            ready_rx.recv().map_err(|_| std::io::Error::other("the actor system failed to start"))?;
        Ok(Runtime { core, registry, threads: Some(Threads { system, thread, exited: exited_rx }), own_home })
    }
}

/// The home a runtime told none makes for itself: a private directory
/// under the system's temporary one, removed with the runtime.
#[derive(Debug)]
struct OwnHome(PathBuf);

impl OwnHome {
    fn create() -> std::io::Result<OwnHome> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos();
        let mut attempt = 0u32;
        loop {
            let dir = std::env::temp_dir().join(format!("subagents-home-{}-{nanos:x}-{attempt}", std::process::id()));
            let mut builder = std::fs::DirBuilder::new();
            #[cfg(unix)]
            std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
            match builder.create(&dir) {
                Ok(()) => return Ok(OwnHome(dir)),
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists && attempt < 64 => attempt += 1,
                Err(error) => return Err(error),
            }
        }
    }
}

impl Drop for OwnHome {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

struct Threads {
    system: System,
    thread: JoinHandle<()>,
    exited: oneshot::Receiver<()>,
}

/// Owns the actor system. Build with [`Runtime::builder`]; stop with
/// [`Runtime::shutdown`] (dropping it stops the threads without the
/// graceful phases).
///
/// It runs on threads of its own, so a program needs no async runtime of
/// its own to use it: [`Runtime::block_on`] runs a future on one of its
/// workers (next to the runs it starts), and the report of
/// [`Runtime::shutdown_blocking`] says whether anything was left alive.
///
/// ```
/// use std::time::Duration;
/// use subagents::Runtime;
///
/// let runtime = Runtime::builder()
///     .workers(2)
///     .home(std::env::temp_dir().join("subagents-doc-runtime"))
///     .cancel_grace(Duration::from_millis(500))
///     .build()
///     .unwrap();
/// assert_eq!(runtime.block_on(async { 6 * 7 }), 42);
/// let report = runtime.shutdown_blocking();
/// assert!(report.live_after.is_quiescent());
/// ```
pub struct Runtime {
    core: Arc<Core>,
    registry: Addr<RegistryActor>,
    threads: Option<Threads>,
    /// Removed once the threads are stopped (declared last, so a dropped
    /// runtime removes it after stopping them too).
    own_home: Option<OwnHome>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("home", &self.core.home()).field("live", &self.live()).finish_non_exhaustive()
    }
}

impl Runtime {
    /// A builder with defaults.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder {
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            home: None,
            config: Config {
                cancel_grace: Duration::from_secs(1),
                dispose_timeout: Duration::from_secs(10),
                shutdown_phase_timeout: Duration::from_secs(5),
            },
            event_capacity: 4096,
        }
    }

    /// The registry handle.
    pub fn subagents(&self) -> Subagents {
        Subagents::new(self.core.clone(), self.registry.clone())
    }

    /// Live runs, actors and child processes right now.
    pub fn live(&self) -> Live {
        self.core.live().snapshot()
    }

    /// The home directory.
    pub fn home(&self) -> PathBuf {
        self.core.home().to_path_buf()
    }

    /// Run `future` on one of the runtime's workers, so a parent living
    /// there reaches its runs without crossing threads.
    pub fn spawn<F>(&self, future: F) -> RuntimeTask<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let (reply, outcome) = oneshot::channel();
        self.core.spawn_on_worker(future, move |output| {
            let _ = reply.send(output);
        });
        RuntimeTask { outcome }
    }

    /// Run `future` on a worker and block the calling thread until it
    /// finishes. Panics when called from a runtime worker thread (it would
    /// deadlock); await [`Runtime::spawn`] there instead.
    pub fn block_on<F>(&self, future: F) -> F::Output
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        assert!(!Core::on_any_worker(), "Runtime::block_on called from a runtime worker thread; use Runtime::spawn");
        let (reply, outcome) = std::sync::mpsc::sync_channel(1);
        self.core.spawn_on_worker(future, move |output| {
            let _ = reply.send(output);
        });
        outcome.recv().expect("the runtime stopped before the future finished")
    }

    /// Stop everything in bounded phases and report what was stopped. Call
    /// it from outside the runtime (any async context or thread).
    pub async fn shutdown(mut self) -> ShutdownReport {
        let started = Instant::now();
        let (core, registry) = (self.core.clone(), self.registry.clone());
        let (reply, outcome) = oneshot::channel();
        let threads = self.threads.take().expect("threads are present until shutdown");
        threads.system.arbiter().spawn(async move {
            let _ = reply.send(run_phases(core, registry).await);
        });
        let mut report = outcome.await.unwrap_or_default();
        threads.system.stop();
        let _ = threads.exited.await;
        let _ = threads.thread.join();
        // Its sessions and children's files go with it, now nothing runs.
        drop(self.own_home.take());
        report.elapsed = started.elapsed();
        report.live_after = self.core.live().snapshot();
        report
    }

    /// [`Runtime::shutdown`] for synchronous callers.
    pub fn shutdown_blocking(self) -> ShutdownReport {
        assert!(!Core::on_any_worker(), "Runtime::shutdown_blocking called from a runtime worker thread");
        let (reply, outcome) = std::sync::mpsc::sync_channel(1);
        std::thread::spawn(move || {
            let driver = tokio::runtime::Builder::new_current_thread().enable_all().build();
            if let Ok(driver) = driver {
                let _ = reply.send(driver.block_on(self.shutdown()));
            }
        });
        outcome.recv().unwrap_or_default()
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(threads) = self.threads.take() {
            self.core.refuse_starts();
            threads.system.stop();
        }
    }
}

/// A future spawned with [`Runtime::spawn`].
#[derive(Debug)]
pub struct RuntimeTask<T> {
    outcome: oneshot::Receiver<T>,
}

impl<T> Future for RuntimeTask<T> {
    type Output = Result<T, SubagentError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.outcome).poll(cx).map(|outcome| outcome.map_err(|_| SubagentError::RuntimeStopped))
    }
}

/// What [`Runtime::shutdown`] stopped.
#[derive(Clone, Debug, Default)]
pub struct ShutdownReport {
    /// Each phase, in order.
    pub phases: Vec<PhaseReport>,
    /// Runs stopped (disposed or forced).
    pub runs_stopped: usize,
    /// Of those, runs forced down because they did not quiesce in time.
    pub runs_forced: usize,
    /// Providers whose actor stopped.
    pub providers_stopped: Vec<String>,
    /// Wall time of the whole shutdown.
    pub elapsed: Duration,
    /// What was still alive afterwards (all zero unless something leaked).
    pub live_after: Live,
}

/// One shutdown phase.
#[derive(Clone, Debug)]
pub struct PhaseReport {
    /// `refuse-starts`, `dispose-runs`, `stop-providers` or `stop-registry`.
    pub name: &'static str,
    /// How long it took.
    pub elapsed: Duration,
    /// Whether it hit its bound and escalated.
    pub timed_out: bool,
}

async fn run_phases(core: Arc<Core>, registry: Addr<RegistryActor>) -> ShutdownReport {
    let bound = core.config().shutdown_phase_timeout;
    let mut report = ShutdownReport::default();

    phase(&mut report, "refuse-starts", async {
        core.refuse_starts();
        ((), false)
    })
    .await;

    let (stopped, forced) = phase(&mut report, "dispose-runs", async {
        let (stopped, forced) = dispose_runs(&core, bound).await;
        ((stopped, forced), forced > 0)
    })
    .await;
    report.runs_stopped = stopped;
    report.runs_forced = forced;

    report.providers_stopped = phase(&mut report, "stop-providers", async {
        match registry.send(StopProviders { timeout: bound }).await {
            Ok(ProvidersStopped { names, timed_out }) => (names, timed_out),
            Err(_) => (Vec::new(), true),
        }
    })
    .await;

    phase(&mut report, "stop-registry", async {
        ((), tokio::time::timeout(bound, registry.send(StopRegistry)).await.is_err())
    })
    .await;
    report
}

/// Run one named shutdown phase (`work` yields its value and whether it hit
/// its bound) inside a tracing span, and record it in the report.
async fn phase<T>(report: &mut ShutdownReport, name: &'static str, work: impl Future<Output = (T, bool)>) -> T {
    let began = Instant::now();
    let (value, timed_out) = work.instrument(tracing::info_span!("shutdown", phase = name)).await;
    report.phases.push(PhaseReport { name, elapsed: began.elapsed(), timed_out });
    value
}

/// Dispose every live run, deepest first, within `bound`; force down what
/// is left. Returns (runs stopped, runs forced).
async fn dispose_runs(core: &Core, bound: Duration) -> (usize, usize) {
    let deadline = tokio::time::Instant::now() + bound;
    let mut depths: Vec<u32> = core.live_runs().iter().map(|r| r.depth).collect();
    depths.sort_unstable_by(|a, b| b.cmp(a));
    depths.dedup();
    let mut seen = HashSet::new();
    for depth in depths {
        let tier: Vec<_> = core
            .live_runs()
            .into_iter()
            .filter(|r| r.depth == depth)
            .map(|r| {
                seen.insert(r.shared.run_id);
                r.dispose();
                r.quiescence()
            })
            .collect();
        let _ = tokio::time::timeout_at(deadline, join_all(tier)).await;
    }
    // Runs that did not quiesce in time (or appeared meanwhile) are forced.
    let leftovers: Vec<_> = core
        .live_runs()
        .into_iter()
        .map(|r| {
            seen.insert(r.shared.run_id);
            r.force_stop();
            r.quiescence()
        })
        .collect();
    let forced = leftovers.len();
    let escalation = tokio::time::Instant::now() + bound;
    let _ = tokio::time::timeout_at(escalation, join_all(leftovers)).await;
    (seen.len(), forced)
}
