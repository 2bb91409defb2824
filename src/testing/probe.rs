//! The probe: a provider wrapper that watches every call across the seam,
//! so the kit can say what a provider did, not only what the caller saw.
//!
//! It sits where the chaos wrapper sits (between the run actor and the
//! provider under test) and changes nothing the provider sees except its
//! [`ProviderContext`], whose reporter it wraps: that is how it learns of
//! progress and structured captures, and how it tells whether anything of
//! the provider still holds the run's context after dispose (a task, a
//! thread or a callback that outlived the run).

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use futures_util::future::{BoxFuture, LocalBoxFuture};
use tokio_util::sync::CancellationToken;

use crate::seam::{
    CaptureError, Child, ContentBlock, Failure, Launch, LaunchError, LocalAgent, ProgressUpdate, Provider,
    ProviderContext, RunReporter, RunResult, SteeringError, StopReason, StopReport,
};

/// What one launch of the provider under test did, as the probe saw it.
#[derive(Clone, Debug, Default)]
pub(crate) struct RunLog {
    /// The launch's cancel token had tripped before `launch` was called.
    pub token_tripped_at_entry: bool,
    /// `Ok(child id)` or the launch error's text, once `launch` resolved.
    pub launched: Option<Result<String, String>>,
    /// The launch future was dropped before it resolved (abandoned).
    pub launch_abandoned: bool,
    /// How many times `Child::run` was called.
    pub run_calls: u32,
    /// When the child's `run` future resolved, and with what.
    pub settled: Option<(Instant, StopReason)>,
    /// The run future was dropped before it resolved (the grace ran out).
    pub run_abandoned: bool,
    /// How many times `Child::cancel` was called.
    pub cancel_calls: u32,
    /// How many times `Child::dispose` was called.
    pub dispose_calls: u32,
    /// When the dispose hook resolved.
    pub disposed: Option<Instant>,
    /// Progress updates the child reported after its run resolved, and
    /// after its dispose hook resolved.
    pub progress_after_settle: u32,
    pub progress_after_dispose: u32,
    /// Structured captures the child attempted after its run resolved.
    pub captures_after_settle: u32,
}

/// One launch: its log, and a weak handle on the context it was given.
#[derive(Debug)]
pub(crate) struct RunTrace {
    log: Mutex<RunLog>,
    context: Mutex<Weak<ProbeReporter>>,
}

impl RunTrace {
    pub(crate) fn log(&self) -> RunLog {
        lock(&self.log).clone()
    }

    fn update(&self, change: impl FnOnce(&mut RunLog)) {
        change(&mut lock(&self.log));
    }

    /// Whether something of the provider still holds the run's context.
    pub(crate) fn context_held(&self) -> bool {
        lock(&self.context).strong_count() > 0
    }

    /// Waits up to `bound` for the run's context to be let go; `true` when
    /// it was.
    pub(crate) async fn context_released_within(&self, bound: Duration) -> bool {
        let deadline = Instant::now() + bound;
        while self.context_held() {
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }
}

/// Everything the probe saw of one provider, shared with the scenario.
#[derive(Debug, Default)]
pub(crate) struct ProbeLog {
    runs: Mutex<Vec<Arc<RunTrace>>>,
    shutdowns: Mutex<u32>,
    /// A caller's signal to trip as the next launch begins (the
    /// cancel-during-launch scenario).
    trip_on_launch: Mutex<Option<CancellationToken>>,
}

impl ProbeLog {
    /// The launches so far, in order.
    pub(crate) fn runs(&self) -> Vec<Arc<RunTrace>> {
        lock(&self.runs).clone()
    }

    pub(crate) fn shutdowns(&self) -> u32 {
        *lock(&self.shutdowns)
    }

    pub(crate) fn trip_on_next_launch(&self, signal: CancellationToken) {
        *lock(&self.trip_on_launch) = Some(signal);
    }
}

/// The wrapper registered in place of the provider under test.
pub(crate) struct Probe {
    inner: Arc<dyn Provider>,
    log: Arc<ProbeLog>,
}

impl Probe {
    pub(crate) fn new(inner: Arc<dyn Provider>) -> (Probe, Arc<ProbeLog>) {
        let log = Arc::new(ProbeLog::default());
        (Probe { inner, log: log.clone() }, log)
    }
}

impl Provider for Probe {
    fn name(&self) -> &str {
        self.inner.name()
    }

    crate::seam::forward_provider_queries!(inner);

    fn offers_detached(&self) -> bool {
        self.inner.offers_detached()
    }

    fn runs_out_of_process(&self) -> bool {
        self.inner.runs_out_of_process()
    }

    fn launch(&self, launch: Launch) -> LocalBoxFuture<'static, Result<Box<dyn Child>, LaunchError>> {
        if let Some(signal) = lock(&self.log.trip_on_launch).take() {
            signal.cancel();
        }
        let trace = Arc::new(RunTrace {
            log: Mutex::new(RunLog { token_tripped_at_entry: launch.cancel.is_cancelled(), ..RunLog::default() }),
            context: Mutex::new(Weak::new()),
        });
        lock(&self.log.runs).push(trace.clone());
        let reporter = Arc::new(ProbeReporter { inner: launch.context.run.clone(), trace: trace.clone() });
        *lock(&trace.context) = Arc::downgrade(&reporter);
        let context = ProviderContext { run: reporter, ..launch.context };
        let launched = self.inner.launch(Launch { context, ..launch });
        Box::pin(async move {
            let mut guard = Unresolved::new(trace.clone(), |log| log.launch_abandoned = true);
            let outcome = launched.await;
            guard.resolved();
            trace.update(|log| {
                log.launched = Some(outcome.as_ref().map(|child| child.id()).map_err(ToString::to_string));
            });
            outcome.map(|inner| Box::new(ProbeChild { inner, trace }) as Box<dyn Child>)
        })
    }

    fn shutdown(&self) -> LocalBoxFuture<'static, ()> {
        *lock(&self.log.shutdowns) += 1;
        self.inner.shutdown()
    }
}

/// Marks a log when the future holding it is dropped before resolving.
struct Unresolved {
    trace: Option<Arc<RunTrace>>,
    mark: fn(&mut RunLog),
}

impl Unresolved {
    fn new(trace: Arc<RunTrace>, mark: fn(&mut RunLog)) -> Self {
        Unresolved { trace: Some(trace), mark }
    }

    fn resolved(&mut self) {
        self.trace = None;
    }
}

impl Drop for Unresolved {
    fn drop(&mut self) {
        if let Some(trace) = self.trace.take() {
            trace.update(self.mark);
        }
    }
}

/// The run's reporter, passed through and watched.
struct ProbeReporter {
    inner: Arc<dyn RunReporter>,
    trace: Arc<RunTrace>,
}

impl std::fmt::Debug for ProbeReporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeReporter").field("run_id", &self.inner.run_id()).finish_non_exhaustive()
    }
}

impl RunReporter for ProbeReporter {
    fn run_id(&self) -> u64 {
        self.inner.run_id()
    }

    fn progress(&self, update: ProgressUpdate) {
        self.trace.update(|log| {
            if log.disposed.is_some() {
                log.progress_after_dispose += 1;
            } else if log.settled.is_some() {
                log.progress_after_settle += 1;
            }
        });
        self.inner.progress(update)
    }

    fn observes_progress(&self) -> bool {
        self.inner.observes_progress()
    }

    fn capture_structured(&self, value: serde_json::Value) -> BoxFuture<'static, Result<(), CaptureError>> {
        self.trace.update(|log| {
            if log.settled.is_some() {
                log.captures_after_settle += 1;
            }
        });
        self.inner.capture_structured(value)
    }
}

struct ProbeChild {
    inner: Box<dyn Child>,
    trace: Arc<RunTrace>,
}

impl Child for ProbeChild {
    fn id(&self) -> String {
        self.inner.id()
    }

    fn local_agent(&self) -> Option<LocalAgent> {
        self.inner.local_agent()
    }

    fn run(&self) -> LocalBoxFuture<'static, RunResult> {
        self.trace.update(|log| log.run_calls += 1);
        let (run, trace) = (self.inner.run(), self.trace.clone());
        Box::pin(async move {
            let mut guard = Unresolved::new(trace.clone(), |log| log.run_abandoned = true);
            let result = run.await;
            guard.resolved();
            trace.update(|log| log.settled = Some((Instant::now(), result.stop_reason)));
            result
        })
    }

    fn cancel(&self) {
        self.trace.update(|log| log.cancel_calls += 1);
        self.inner.cancel()
    }

    fn supports_steering(&self) -> bool {
        self.inner.supports_steering()
    }

    fn supports_continuation(&self) -> bool {
        self.inner.supports_continuation()
    }

    fn send_message(&self, message: Vec<ContentBlock>) -> LocalBoxFuture<'static, Result<(), SteeringError>> {
        self.inner.send_message(message)
    }

    fn dispose(&self) -> LocalBoxFuture<'static, Result<(), Failure>> {
        self.trace.update(|log| log.dispose_calls += 1);
        let (dispose, trace) = (self.inner.dispose(), self.trace.clone());
        Box::pin(async move {
            let outcome = dispose.await;
            trace.update(|log| log.disposed = Some(Instant::now()));
            outcome
        })
    }

    fn stop_report(&self) -> StopReport {
        self.inner.stop_report()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
