//! `chaos`: wraps any provider and injects faults from a seeded schedule,
//! so you can test your own run lifecycles against a misbehaving child.
//!
//! A [`ChaosSchedule`] is a list of rules, each a stage, a fault and a
//! probability. Whether a rule fires for a run is a pure function of the
//! seed, the run's launch number and the rule's position, so the same seed
//! and the same launch order reproduce the same faults; [`ChaosProvider::injected`]
//! lists what fired.
//!
//! | stage | error | hang | delay | panic | crash | drop / duplicate |
//! |---|---|---|---|---|---|---|
//! | launch | start rejects `STARTUP_FAILED` | abandoned after the cancel grace | start waits (cancellable) | contained, `STARTUP_FAILED` | `STARTUP_FAILED` (child-crashed) | — |
//! | run | settles `Error` | ignores cancel: `Aborted` after the grace | answer waits | contained, `Error` | settles `Error` (child-crashed) | — |
//! | dispose | inner child released, then `DISPOSE_FAILED` | released, then bounded by the dispose timeout | waits | contained | released, `DISPOSE_FAILED` | — |
//! | progress | — | — | — | — | — | an update is lost / sent twice |
//!
//! The inner child is always released, whatever the fault: chaos changes
//! what the runtime sees, not what leaks.
//!
//! ```
//! use std::time::Duration;
//! use subagents::providers::{ChaosFault, ChaosProvider, ChaosSchedule, ChaosStage, MockProvider};
//!
//! let schedule = ChaosSchedule::new()
//!     .rule(ChaosStage::Run, ChaosFault::Error, 0.2)
//!     .rule(ChaosStage::Launch, ChaosFault::Delay(Duration::from_millis(5)), 0.1);
//! let chaos = ChaosProvider::new("chaos", MockProvider::new("inner"), schedule, 42);
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::{BoxFuture, LocalBoxFuture};
use tokio_util::sync::CancellationToken;

use crate::mix::splitmix64;
use crate::seam::ProgressUpdate;
use crate::seam::{
    CaptureError, Category, Child, ContentBlock, Diagnostic, Failure, Launch, LaunchError, LocalAgent, Provider,
    ProviderContext, RunReporter, RunResult, Stage, SteeringError, StopReport,
};

/// Where a fault strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChaosStage {
    /// While the child is created (before publication).
    Launch,
    /// While the child works.
    Run,
    /// While the child is released.
    Dispose,
    /// On each progress update the child reports.
    Progress,
}

/// What happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChaosFault {
    /// Fail.
    Error,
    /// Never finish, ignoring cancellation.
    Hang,
    /// Wait this long (honouring cancellation), then go on.
    Delay(Duration),
    /// Panic.
    Panic,
    /// Die like a crashed child.
    Crash,
    /// Lose the progress update.
    DropProgress,
    /// Report the progress update twice.
    DuplicateProgress,
}

/// Ordered fault rules.
#[derive(Clone, Debug, Default)]
pub struct ChaosSchedule {
    rules: Vec<(ChaosStage, ChaosFault, f64)>,
}

impl ChaosSchedule {
    /// No rules.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a rule: at `stage`, inject `fault` with `probability` (0–1).
    pub fn rule(mut self, stage: ChaosStage, fault: ChaosFault, probability: f64) -> Self {
        self.rules.push((stage, fault, probability.clamp(0.0, 1.0)));
        self
    }
}

/// One injected fault: which launch, where, what.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Injected {
    /// The run's launch number (0-based, in launch order).
    pub launch: u64,
    /// Where.
    pub stage: ChaosStage,
    /// What.
    pub fault: ChaosFault,
}

/// The chaos wrapper.
pub struct ChaosProvider {
    name: String,
    inner: Arc<dyn Provider>,
    schedule: ChaosSchedule,
    seed: u64,
    launches: AtomicU64,
    injected: Arc<Mutex<Vec<Injected>>>,
}

impl std::fmt::Debug for ChaosProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChaosProvider")
            .field("name", &self.name)
            .field("inner", &self.inner.name())
            .field("seed", &self.seed)
            .finish_non_exhaustive()
    }
}

impl ChaosProvider {
    /// Wraps `inner` under `name`.
    pub fn new(name: impl Into<String>, inner: impl Provider, schedule: ChaosSchedule, seed: u64) -> Self {
        Self::wrap(name, Arc::new(inner), schedule, seed)
    }

    /// Wraps a shared provider.
    pub fn wrap(name: impl Into<String>, inner: Arc<dyn Provider>, schedule: ChaosSchedule, seed: u64) -> Self {
        ChaosProvider {
            name: name.into(),
            inner,
            schedule,
            seed,
            launches: AtomicU64::new(0),
            injected: Arc::default(),
        }
    }

    /// Every fault injected so far, in order.
    pub fn injected(&self) -> Vec<Injected> {
        self.injected.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A handle on the injected-fault log that outlives registration.
    pub fn injected_log(&self) -> Arc<Mutex<Vec<Injected>>> {
        self.injected.clone()
    }
}

/// The faults that fire for one launch, decided up front.
#[derive(Clone)]
struct Plan {
    launch: u64,
    seed: u64,
    rules: Arc<[(ChaosStage, ChaosFault, f64)]>,
    log: Arc<Mutex<Vec<Injected>>>,
    /// Progress updates seen (each gets its own draw).
    progress: Arc<AtomicU64>,
}

impl Plan {
    /// The first rule of `stage` that fires for draw number `draw`.
    fn fault(&self, stage: ChaosStage, draw: u64) -> Option<ChaosFault> {
        let fired = self.rules.iter().enumerate().find(|(index, (rule_stage, _, probability))| {
            let roll = splitmix64(
                self.seed
                    ^ splitmix64(self.launch.wrapping_mul(0x1000_0000_01b3) ^ splitmix64(*index as u64 ^ (draw << 16))),
            );
            *rule_stage == stage && (roll as f64 / u64::MAX as f64) < *probability
        });
        let fault = fired.map(|(_, (_, fault, _))| *fault)?;
        self.log.lock().unwrap_or_else(|e| e.into_inner()).push(Injected { launch: self.launch, stage, fault });
        Some(fault)
    }
}

impl Provider for ChaosProvider {
    fn name(&self) -> &str {
        &self.name
    }

    crate::seam::forward_provider_queries!(inner);

    fn launch(&self, launch: Launch) -> LocalBoxFuture<'static, Result<Box<dyn Child>, LaunchError>> {
        let plan = Plan {
            launch: self.launches.fetch_add(1, Ordering::Relaxed),
            seed: self.seed,
            rules: self.schedule.rules.clone().into(),
            log: self.injected.clone(),
            progress: Arc::default(),
        };
        let name = self.name.clone();
        let inner = self.inner.clone();
        let cancel = launch.cancel.clone();
        let launch = Launch { context: chaotic_context(&launch.context, &plan), ..launch };
        let fault = plan.fault(ChaosStage::Launch, 0);
        Box::pin(async move {
            match fault {
                Some(ChaosFault::Error) => {
                    return Err(LaunchError::Failed { stage: Stage::Initialize, category: Category::ChildError })
                }
                Some(ChaosFault::Crash) => {
                    return Err(LaunchError::Failed { stage: Stage::Initialize, category: Category::ChildCrashed })
                }
                Some(ChaosFault::Panic) => panic!("chaos: injected panic at launch"),
                Some(ChaosFault::Hang) => std::future::pending::<()>().await,
                Some(ChaosFault::Delay(delay)) if !wait(delay, &cancel).await => return Err(LaunchError::Aborted),
                _ => {}
            }
            let child = inner.launch(launch).await?;
            Ok(Box::new(ChaosChild { name, inner: child, plan, cancel }) as Box<dyn Child>)
        })
    }

    fn shutdown(&self) -> LocalBoxFuture<'static, ()> {
        self.inner.shutdown()
    }
}

/// Sleeps `delay` unless `cancel` trips first (then `false`).
async fn wait(delay: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        _ = cancel.cancelled() => false,
        _ = tokio::time::sleep(delay) => true,
    }
}

/// The run's context with progress passing through the plan.
fn chaotic_context(context: &ProviderContext, plan: &Plan) -> ProviderContext {
    let reporter = ChaosReporter { inner: context.run.clone(), plan: plan.clone() };
    ProviderContext { run: Arc::new(reporter), ..context.clone() }
}

struct ChaosReporter {
    inner: Arc<dyn RunReporter>,
    plan: Plan,
}

impl RunReporter for ChaosReporter {
    fn run_id(&self) -> u64 {
        self.inner.run_id()
    }

    fn progress(&self, update: ProgressUpdate) {
        let draw = self.plan.progress.fetch_add(1, Ordering::Relaxed);
        match self.plan.fault(ChaosStage::Progress, draw + 1) {
            Some(ChaosFault::DropProgress) => {}
            Some(ChaosFault::DuplicateProgress) => {
                self.inner.progress(update.clone());
                self.inner.progress(update);
            }
            _ => self.inner.progress(update),
        }
    }

    fn capture_structured(&self, value: serde_json::Value) -> BoxFuture<'static, Result<(), CaptureError>> {
        self.inner.capture_structured(value)
    }
}

struct ChaosChild {
    name: String,
    inner: Box<dyn Child>,
    plan: Plan,
    cancel: CancellationToken,
}

impl Child for ChaosChild {
    fn id(&self) -> String {
        self.inner.id()
    }

    fn local_agent(&self) -> Option<LocalAgent> {
        self.inner.local_agent()
    }

    fn run(&self) -> LocalBoxFuture<'static, RunResult> {
        let failed = |category| RunResult::failed(Diagnostic::new(&self.name, Stage::SessionRun, category));
        match self.plan.fault(ChaosStage::Run, 0) {
            Some(ChaosFault::Error) => {
                let result = failed(Category::ChildError);
                Box::pin(async move { result })
            }
            Some(ChaosFault::Crash) => {
                let result = failed(Category::ChildCrashed);
                Box::pin(async move { result })
            }
            Some(ChaosFault::Panic) => Box::pin(async { panic!("chaos: injected panic mid-run") }),
            Some(ChaosFault::Hang) => Box::pin(std::future::pending()),
            Some(ChaosFault::Delay(delay)) => {
                let (run, cancel) = (self.inner.run(), self.cancel.clone());
                Box::pin(async move {
                    wait(delay, &cancel).await;
                    run.await
                })
            }
            _ => self.inner.run(),
        }
    }

    fn cancel(&self) {
        self.inner.cancel()
    }

    fn supports_steering(&self) -> bool {
        self.inner.supports_steering()
    }

    fn send_message(&self, message: Vec<ContentBlock>) -> LocalBoxFuture<'static, Result<(), SteeringError>> {
        self.inner.send_message(message)
    }

    fn supports_continuation(&self) -> bool {
        self.inner.supports_continuation()
    }

    fn stop_report(&self) -> StopReport {
        self.inner.stop_report()
    }

    fn dispose(&self) -> LocalBoxFuture<'static, Result<(), Failure>> {
        // The inner child is always released first.
        let release = self.inner.dispose();
        let fault = self.plan.fault(ChaosStage::Dispose, 0);
        Box::pin(async move {
            let released = release.await;
            match fault {
                Some(ChaosFault::Error) => Err(Failure::new(Stage::Dispose, Category::ChildError)),
                Some(ChaosFault::Crash) => Err(Failure::new(Stage::Dispose, Category::ChildCrashed)),
                Some(ChaosFault::Panic) => panic!("chaos: injected panic on dispose"),
                Some(ChaosFault::Hang) => std::future::pending().await,
                Some(ChaosFault::Delay(delay)) => {
                    tokio::time::sleep(delay).await;
                    released
                }
                _ => released,
            }
        })
    }
}
