//! Seeded faults over your provider: the chaos wrapper
//! ([`ChaosProvider`](crate::providers::ChaosProvider)) around it, run
//! over many seeds, with the runtime's invariants checked after every run.
//!
//! For each seed the kit builds a fresh runtime, wraps a fresh provider
//! from your factory in the chaos wrapper (and, inside it, the probe of
//! the conformance run), and drives [`Faults::runs_per_seed`] runs one
//! after another. What each run does — wait for its result, cancel at
//! once, dispose while it works, or cancel and wait for a receipt — is
//! drawn from the seed too, so a seed names one sequence of faults and
//! actions. After each run:
//!
//! - it has one terminal outcome: every read of its result, before and
//!   after dispose, gives the same `Ok` value;
//! - after dispose nothing is live (no run, no process) and your provider
//!   let go of the run's context and reported nothing more;
//! - its receipt is complete: the run's own stop reason, and every branch
//!   that cannot be known says why;
//! - its events are in order (one Start, then at most one End, no Progress
//!   after it);
//!
//! and after the seed's shutdown the runtime is quiescent. The first seed
//! that breaks one stops the run: the [`FaultReport`] prints the seed, the
//! broken invariants, the faults injected and the actions taken, and the
//! call that replays that schedule ([`Faults::replay`]). Faults depend only
//! on the seed, the run's launch number and the schedule (see the chaos
//! provider), and the runs go one at a time, so a replay injects the same
//! launch, run and dispose faults in the same places; progress faults are
//! drawn per update, so theirs follow how many updates the child sends.

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::conformance::event_problems;
use super::probe::{Probe, ProbeLog};
use crate::mix::splitmix64;
use crate::providers::{ChaosFault, ChaosProvider, ChaosSchedule, ChaosStage, Injected};
use crate::seam::Provider;
use crate::{CancellationToken, Parent, Run, RunResult, Runtime, StartRequest, SubagentError, Subagents};

/// Seeded faults over the provider that `make` builds; see the module
/// docs.
///
/// ```
/// use subagents::providers::MockProvider;
///
/// let report = subagents::testing::faults(|| MockProvider::new("mock")).seeds(0..4).run_blocking();
/// report.assert_held();
/// assert_eq!(report.seeds_run, 4);
/// ```
pub fn faults<P, F>(make: F) -> Faults
where
    P: Provider,
    F: Fn() -> P + Send + Sync + 'static,
{
    Faults {
        make: Arc::new(move || Arc::new(make()) as Arc<dyn Provider>),
        schedule: default_schedule(),
        seeds: 0..16,
        runs_per_seed: 8,
        prompt: "Say hello.".into(),
        cwd: std::env::temp_dir(),
        cancel_grace: Duration::from_millis(200),
        dispose_timeout: Duration::from_secs(2),
        patience: Duration::from_secs(10),
        leak_wait: Duration::from_millis(500),
    }
}

/// The faults of [`faults`] unless [`Faults::schedule`] says otherwise:
/// each stage's faults, each at a low probability.
pub fn default_schedule() -> ChaosSchedule {
    ChaosSchedule::new()
        .rule(ChaosStage::Launch, ChaosFault::Error, 0.08)
        .rule(ChaosStage::Launch, ChaosFault::Panic, 0.04)
        .rule(ChaosStage::Launch, ChaosFault::Delay(Duration::from_millis(5)), 0.1)
        .rule(ChaosStage::Run, ChaosFault::Error, 0.08)
        .rule(ChaosStage::Run, ChaosFault::Crash, 0.05)
        .rule(ChaosStage::Run, ChaosFault::Panic, 0.05)
        .rule(ChaosStage::Run, ChaosFault::Hang, 0.05)
        .rule(ChaosStage::Run, ChaosFault::Delay(Duration::from_millis(20)), 0.1)
        .rule(ChaosStage::Dispose, ChaosFault::Error, 0.05)
        .rule(ChaosStage::Dispose, ChaosFault::Delay(Duration::from_millis(5)), 0.05)
        .rule(ChaosStage::Progress, ChaosFault::DropProgress, 0.2)
        .rule(ChaosStage::Progress, ChaosFault::DuplicateProgress, 0.2)
}

/// The settings of a fault run; [`faults`] makes one.
#[derive(Clone)]
pub struct Faults {
    make: Arc<dyn Fn() -> Arc<dyn Provider> + Send + Sync>,
    schedule: ChaosSchedule,
    seeds: Range<u64>,
    runs_per_seed: usize,
    prompt: String,
    cwd: PathBuf,
    cancel_grace: Duration,
    dispose_timeout: Duration,
    patience: Duration,
    leak_wait: Duration,
}

impl fmt::Debug for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Faults")
            .field("schedule", &self.schedule)
            .field("seeds", &self.seeds)
            .field("runs_per_seed", &self.runs_per_seed)
            .finish_non_exhaustive()
    }
}

/// One run's action, drawn from the seed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    /// Wait for the result, then dispose.
    Await,
    /// Cancel right after start, then read and dispose.
    Cancel,
    /// Dispose while the result is awaited.
    DisposeRacing,
    /// `cancel_and_wait` for a receipt.
    CancelAndWait,
}

impl Action {
    fn draw(seed: u64, run: usize) -> Action {
        match splitmix64(seed ^ splitmix64(run as u64 ^ 0x5eed)) % 4 {
            0 => Action::Await,
            1 => Action::Cancel,
            2 => Action::DisposeRacing,
            _ => Action::CancelAndWait,
        }
    }
}

impl Faults {
    /// The fault rules (default [`default_schedule`]).
    pub fn schedule(mut self, schedule: ChaosSchedule) -> Self {
        self.schedule = schedule;
        self
    }

    /// The seeds to run (default `0..16`).
    pub fn seeds(mut self, seeds: Range<u64>) -> Self {
        self.seeds = seeds;
        self
    }

    /// Runs per seed, one after another (default 8).
    pub fn runs_per_seed(mut self, runs: usize) -> Self {
        self.runs_per_seed = runs.max(1);
        self
    }

    /// The prompt of every run (default `Say hello.`).
    pub fn prompt(mut self, prompt: impl Into<String>) -> Self {
        self.prompt = prompt.into();
        self
    }

    /// The parent's working directory (default: the temporary directory).
    pub fn cwd(mut self, cwd: impl Into<PathBuf>) -> Self {
        self.cwd = cwd.into();
        self
    }

    /// The runtime's cancel grace (default 200 ms: a hang fault costs it).
    pub fn cancel_grace(mut self, grace: Duration) -> Self {
        self.cancel_grace = grace;
        self
    }

    /// How long after a dispose the provider may take to let go of the
    /// run's context (default 500 ms).
    pub fn leak_wait(mut self, wait: Duration) -> Self {
        self.leak_wait = wait;
        self
    }

    /// How long a start or a result may take before the kit cancels the
    /// run (default 10 s); a run that outlasts it is not an error.
    pub fn patience(mut self, patience: Duration) -> Self {
        self.patience = patience;
        self
    }

    /// Exactly one seed, as a failure's report names it: the same faults
    /// and actions again.
    pub fn replay(self, seed: u64) -> Self {
        self.seeds(seed..seed.saturating_add(1))
    }

    /// Run every seed until one breaks an invariant.
    pub async fn run(self) -> FaultReport {
        let mut report = FaultReport { seeds_run: 0, failure: None };
        for seed in self.seeds.clone() {
            report.seeds_run += 1;
            if let Some(failure) = self.seed(seed).await {
                report.failure = Some(failure);
                break;
            }
        }
        report
    }

    /// [`Faults::run`] for synchronous callers.
    pub fn run_blocking(self) -> FaultReport {
        let driver = tokio::runtime::Builder::new_current_thread().enable_all().build();
        let driver = driver.expect("the fault kit needs a tokio runtime of its own to start");
        driver.block_on(self.run())
    }

    async fn seed(&self, seed: u64) -> Option<SeedFailure> {
        let runtime = Runtime::builder()
            .workers(1)
            .cancel_grace(self.cancel_grace)
            .dispose_timeout(self.dispose_timeout)
            .shutdown_phase_timeout(self.dispose_timeout * 2)
            .build();
        let mut failure = SeedFailure { seed, ..SeedFailure::default() };
        let runtime = match runtime {
            Ok(runtime) => runtime,
            Err(error) => {
                failure.violations.push(format!("the runtime did not build: {error}"));
                return Some(failure);
            }
        };
        let inner = (self.make)();
        let name = inner.name().to_owned();
        let (probe, log) = Probe::new(inner);
        let chaos = ChaosProvider::wrap(name.clone(), Arc::new(probe), self.schedule.clone(), seed);
        let injected = chaos.injected_log();
        let subagents = runtime.subagents();
        let mut events = subagents.subscribe();
        if let Err(error) = subagents.register_provider(chaos) {
            failure.violations.push(format!("registration failed: {error}"));
            return Some(failure);
        }
        let drive = Drive { subagents, name, settings: self.clone(), seed, log: log.clone() };
        let driven = runtime.spawn(drive.runs()).await;
        let shutdown = runtime.shutdown().await;
        match driven {
            Ok((actions, violations)) => {
                failure.actions = actions;
                failure.violations = violations;
            }
            Err(error) => failure.violations.push(format!("the runtime failed under the runs: {error}")),
        }
        failure.violations.extend(event_problems(&mut events));
        if !shutdown.live_after.is_quiescent() {
            failure.violations.push(format!("after shutdown: {:?}", shutdown.live_after));
        }
        failure.injected = injected.lock().unwrap_or_else(|e| e.into_inner()).clone();
        (!failure.violations.is_empty()).then_some(failure)
    }
}

/// One seed's runs, on the runtime's worker.
struct Drive {
    subagents: Subagents,
    name: String,
    settings: Faults,
    seed: u64,
    log: Arc<ProbeLog>,
}

impl Drive {
    /// Each run's action, and the invariants broken.
    async fn runs(self) -> (Vec<String>, Vec<String>) {
        let mut actions = Vec::new();
        let mut violations = Vec::new();
        for n in 0..self.settings.runs_per_seed {
            let action = Action::draw(self.seed, n);
            actions.push(format!("run {n}: {action:?}"));
            violations.extend(self.one(action).await.into_iter().map(|v| format!("run {n} ({action:?}): {v}")));
        }
        (actions, violations)
    }

    async fn one(&self, action: Action) -> Vec<String> {
        let launches = self.log.runs().len();
        let signal = CancellationToken::new();
        let request = StartRequest::new(&self.settings.prompt, Parent::root(&self.settings.cwd), signal.clone());
        let start = self.subagents.start(&self.name, request);
        tokio::pin!(start);
        let started = tokio::select! {
            started = &mut start => started,
            _ = tokio::time::sleep(self.settings.patience) => {
                signal.cancel();
                start.await
            }
        };
        let run = match started {
            Ok(run) => run,
            Err(error) if matches!(error.code(), "STARTUP_FAILED" | "ABORTED") => {
                return self.leftovers(launches).await
            }
            Err(error) => return vec![format!("start failed {}: {error}", error.code())],
        };
        let mut violations = Vec::new();
        let first = match action {
            Action::Await => self.patient_result(&run).await,
            Action::Cancel => {
                run.cancel();
                run.result().await
            }
            Action::DisposeRacing => {
                let (result, _) = tokio::join!(run.result(), run.dispose());
                result
            }
            Action::CancelAndWait => {
                let receipt = run.cancel_and_wait().await;
                let result = run.result().await;
                if let (Ok(receipt), Ok(result)) = (&receipt, &result) {
                    violations.extend(receipt_problems(receipt, result));
                }
                result
            }
        };
        // Dispose is idempotent: a second call returns after quiescence.
        let _ = run.dispose().await;
        let again = run.result().await;
        match (&first, &again) {
            (Err(error), _) => violations.push(format!("the result was an error: {error}")),
            _ if first != again => {
                violations.push(format!("the outcome changed: {} then {}", outcome(&first), outcome(&again)))
            }
            (Ok(result), _) => violations.extend(receipt_problems(&run.receipt().await, result)),
        }
        // The caller's handle may hold an in-process child's agent.
        drop(run);
        violations.extend(self.leftovers(launches).await);
        violations
    }

    /// The result, cancelling the run if it takes longer than the patience.
    async fn patient_result(&self, run: &Run) -> Result<RunResult, SubagentError> {
        match tokio::time::timeout(self.settings.patience, run.result()).await {
            Ok(result) => result,
            Err(_) => {
                run.cancel();
                run.result().await
            }
        }
    }

    /// What is left once the run is disposed: live runs or processes, and
    /// the provider's hold on the contexts of launches from `launches` on.
    async fn leftovers(&self, launches: usize) -> Vec<String> {
        let mut problems = Vec::new();
        let live = self.subagents.live();
        if !live.is_quiescent() {
            problems.push(format!("after dispose: {} run(s), {} process(es) live", live.runs, live.processes));
        }
        let wait = self.settings.leak_wait;
        for trace in self.log.runs().iter().skip(launches) {
            if !trace.context_released_within(wait).await {
                problems.push(format!("the provider still held the run's context {wait:?} after dispose"));
            }
            if trace.log().progress_after_dispose > 0 {
                problems.push("the provider reported progress after its dispose hook returned".into());
            }
        }
        problems
    }
}

fn outcome(result: &Result<RunResult, SubagentError>) -> String {
    match result {
        Ok(result) => format!("`{}`", result.stop_reason),
        Err(error) => format!("error {}", error.code()),
    }
}

fn receipt_problems(receipt: &crate::Receipt, result: &RunResult) -> Vec<String> {
    let mut problems = Vec::new();
    if receipt.stop_reason != result.stop_reason {
        problems.push(format!("the receipt says `{}`, the result `{}`", receipt.stop_reason, result.stop_reason));
    }
    if receipt.unknown_branches().iter().any(|reason| reason.trim().is_empty()) {
        problems.push("the receipt has an unknown branch that does not say why".into());
    }
    problems
}

/// What a fault run found: how many seeds ran, and the first that broke an
/// invariant. Its `Display` is what a failing test prints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultReport {
    /// Seeds run (the last is the failing one, if any).
    pub seeds_run: usize,
    /// The first failing seed.
    pub failure: Option<SeedFailure>,
}

impl FaultReport {
    /// Every invariant held for every seed.
    pub fn held(&self) -> bool {
        self.failure.is_none()
    }

    /// Panics with the failing seed, its faults and how to replay it.
    #[track_caller]
    pub fn assert_held(&self) {
        assert!(self.held(), "{self}");
    }
}

impl fmt::Display for FaultReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.failure {
            None => write!(f, "{} seed(s): every invariant held", self.seeds_run),
            Some(failure) => write!(f, "{failure}"),
        }
    }
}

/// One seed that broke an invariant, with what to replay it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeedFailure {
    /// The seed: `faults(..).replay(seed)` runs it again.
    pub seed: u64,
    /// The invariants broken, with the run and what was seen.
    pub violations: Vec<String>,
    /// The faults injected, in order: the schedule this seed drew.
    pub injected: Vec<Injected>,
    /// What each run did.
    pub actions: Vec<String>,
}

impl fmt::Display for SeedFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "seed {} broke {} invariant(s):", self.seed, self.violations.len())?;
        for violation in &self.violations {
            writeln!(f, "  - {}", crate::seam::safe_line(violation))?;
        }
        writeln!(f, "faults injected (launch, stage, fault):")?;
        let mut injected: Vec<&Injected> = self.injected.iter().collect();
        injected.sort_by_key(|injected| injected.launch);
        for injected in injected {
            writeln!(f, "  - {} {:?} {:?}", injected.launch, injected.stage, injected.fault)?;
        }
        writeln!(f, "actions: {}", self.actions.join(", "))?;
        write!(f, "replay it: subagents::testing::faults(..).replay({})", self.seed)
    }
}
