//! The conformance run: the provider under test driven through the
//! lifecycle contract's scenarios, each in a runtime of its own, and a
//! [`Report`] of what held.
//!
//! Each scenario builds a fresh [`Runtime`] with one worker (so the
//! scenario, its runs and any task the provider spawns share one thread
//! the kit can count tasks on), registers a fresh provider from the
//! factory wrapped in the probe, drives it as a caller would and checks
//! what the caller saw (results, errors, events, [`Runtime::live`]) against
//! what the probe saw the provider do. See the [module](super) docs for
//! the scenarios and what each finding means.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::probe::{Probe, ProbeLog};
use super::report::{Finding, Report};
use super::scenario::{After, Scenario, Settings};
use super::scenarios;
use crate::events::{EventRecvError, EventStream};
use crate::seam::Provider;
use crate::{Runtime, SubagentEvent};

/// Drive the provider that `make` builds through the contract's scenarios.
/// `make` is called once per scenario, so no state carries from one to the
/// next. It is called on the kit's own task (inside the tokio runtime of
/// [`Conformance::run_blocking`], or yours): a provider whose constructor is
/// async is built once beforehand and shared with [`Conformance::shared`].
///
/// ```
/// use subagents::providers::MockProvider;
///
/// let report = subagents::testing::conformance(|| MockProvider::new("mock")).run_blocking();
/// report.assert_conformant();
/// ```
pub fn conformance<P, F>(make: F) -> Conformance
where
    P: Provider,
    F: Fn() -> P + Send + Sync + 'static,
{
    Conformance::shared(move || Arc::new(make()) as Arc<dyn Provider>)
}

/// The settings of a conformance run; [`conformance`] makes one.
#[derive(Clone)]
pub struct Conformance {
    pub(crate) make: Arc<dyn Fn() -> Arc<dyn Provider> + Send + Sync>,
    pub(crate) settings: Arc<Settings>,
}

impl std::fmt::Debug for Conformance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conformance").field("settings", &self.settings).finish_non_exhaustive()
    }
}

impl Conformance {
    /// [`conformance`] for a factory of shared providers (one built
    /// elsewhere and cloned, say). Each scenario's shutdown calls the
    /// provider's [`Provider::shutdown`], so share only a provider that
    /// stays usable after it; otherwise build a fresh one in the factory.
    pub fn shared(make: impl Fn() -> Arc<dyn Provider> + Send + Sync + 'static) -> Conformance {
        let settings = Settings {
            prompt: "Say hello.".into(),
            long_prompt: None,
            cwd: std::env::temp_dir(),
            concurrent_runs: 8,
            cancel_grace: Duration::from_secs(1),
            dispose_timeout: Duration::from_secs(10),
            shutdown_phase_timeout: Duration::from_secs(5),
            leak_wait: Duration::from_millis(500),
            patience: Duration::from_secs(30),
        };
        Conformance { make: Arc::new(make), settings: Arc::new(settings) }
    }

    fn set(mut self, change: impl FnOnce(&mut Settings)) -> Self {
        change(Arc::make_mut(&mut self.settings));
        self
    }

    /// The prompt of every run (default `Say hello.`): one the provider
    /// completes.
    pub fn prompt(self, prompt: impl Into<String>) -> Self {
        self.set(|settings| settings.prompt = prompt.into())
    }

    /// A prompt the provider is still working on a moment after `start`
    /// returns, for the scenarios that cancel or dispose a run mid-way
    /// (default: the prompt). Without one, a provider that answers at once
    /// leaves those rules "not exercised".
    pub fn long_prompt(self, prompt: impl Into<String>) -> Self {
        self.set(|settings| settings.long_prompt = Some(prompt.into()))
    }

    /// The parent's working directory (default: the temporary directory).
    pub fn cwd(self, cwd: impl Into<PathBuf>) -> Self {
        self.set(|settings| settings.cwd = cwd.into())
    }

    /// How many runs the `many-at-once` scenario starts together
    /// (default 8).
    pub fn concurrent_runs(self, runs: usize) -> Self {
        self.set(|settings| settings.concurrent_runs = runs.max(2))
    }

    /// The runtime's cancel grace in every scenario (default 1 s, the
    /// runtime's own): a child still running this long after cancel is
    /// reported as needing it.
    pub fn cancel_grace(self, grace: Duration) -> Self {
        self.set(|settings| settings.cancel_grace = grace)
    }

    /// The runtime's dispose timeout (default 10 s, the runtime's own).
    pub fn dispose_timeout(self, timeout: Duration) -> Self {
        self.set(|settings| settings.dispose_timeout = timeout)
    }

    /// How long after a dispose returns the provider may take to let go of
    /// the run's context and tasks before that counts as a leak (default
    /// 500 ms).
    pub fn leak_wait(self, wait: Duration) -> Self {
        self.set(|settings| settings.leak_wait = wait)
    }

    /// How long the kit waits for a run to settle on its own before it
    /// cancels it (default 30 s); the rule that needed the answer is then
    /// "not exercised".
    pub fn patience(self, patience: Duration) -> Self {
        self.set(|settings| settings.patience = patience)
    }

    /// Run every scenario and report. Await it outside the runtime it
    /// builds (from `#[tokio::test]`, say); [`Conformance::run_blocking`]
    /// is the same for a plain `#[test]`.
    pub async fn run(self) -> Report {
        let mut report = Report { provider: (self.make)().name().to_owned(), findings: Vec::new() };
        let mut ledger = Ledger::default();
        for scenario in scenarios::ALL {
            let findings = self.scenario(scenario, &mut ledger).await;
            report.findings.extend(findings);
        }
        report.findings.extend(ledger.findings());
        report
    }

    /// [`Conformance::run`] for synchronous callers.
    pub fn run_blocking(self) -> Report {
        let driver = tokio::runtime::Builder::new_current_thread().enable_all().build();
        let driver = driver.expect("the conformance kit needs a tokio runtime of its own to start");
        driver.block_on(self.run())
    }

    /// One scenario in a fresh runtime.
    async fn scenario(&self, scenario: &scenarios::Case, ledger: &mut Ledger) -> Vec<Finding> {
        let runtime = Runtime::builder()
            .workers(1)
            .cancel_grace(self.settings.cancel_grace)
            .dispose_timeout(self.settings.dispose_timeout)
            .shutdown_phase_timeout(self.settings.shutdown_phase_timeout)
            .build();
        let runtime = match runtime {
            Ok(runtime) => runtime,
            Err(error) => {
                let finding = Finding::of(scenario.name, "the kit builds a runtime", "docs/contract.md §2 Runtime");
                return vec![finding.not_exercised(format!("the runtime did not build: {error}"))];
            }
        };
        let (probe, log) = Probe::new((self.make)());
        let subagents = runtime.subagents();
        let mut events = subagents.subscribe();
        if let Err(error) = subagents.register_shared(Arc::new(probe)) {
            let finding = Finding::of(scenario.name, "the provider registers", "docs/contract.md §3 Registration");
            return vec![finding.broken(format!("registration failed: {error}"))];
        }
        let context = Scenario { subagents, log: log.clone(), settings: self.settings.clone() };
        let driven = runtime.spawn((scenario.drive)(context)).await;
        let (mut findings, after) = match driven {
            Ok(driven) => driven,
            Err(error) => {
                let finding = Finding::of(scenario.name, "the scenario runs", "docs/contract.md §4");
                (vec![finding.broken(format!("the runtime failed under the scenario: {error}"))], After::Nothing)
            }
        };
        let shutdown = runtime.shutdown().await;
        if let After::Shutdown(check) = after {
            findings.extend(check(&shutdown, &log));
        }
        ledger.record(&log, &mut events);
        findings
    }
}

/// The rules checked across every scenario's runs, reported once at the
/// end: what a provider delivered after a run settled, and the events.
#[derive(Debug, Default)]
struct Ledger {
    runs: usize,
    delivered_after_settle: Vec<String>,
    event_problems: Vec<String>,
}

impl Ledger {
    fn record(&mut self, log: &ProbeLog, events: &mut EventStream) {
        for trace in log.runs() {
            let run = self.runs;
            self.runs += 1;
            let seen = trace.log();
            if seen.progress_after_settle + seen.captures_after_settle > 0 {
                self.delivered_after_settle.push(format!(
                    "launch {run}: {} progress update(s) and {} structured capture(s) after its run resolved `{}`",
                    seen.progress_after_settle,
                    seen.captures_after_settle,
                    seen.settled.map_or("?", |(_, reason)| reason.as_str())
                ));
            }
            if seen.run_calls > 1 {
                self.delivered_after_settle.push(format!("launch {run}: `run` was called {} times", seen.run_calls));
            }
        }
        self.event_problems.extend(event_problems(events));
    }

    fn findings(self) -> Vec<Finding> {
        let settle = Finding::of(
            "every-run",
            "a child delivers nothing after its run settled (no progress, no structured capture)",
            "docs/contract.md §4 Results, §5 Events",
        );
        let events = Finding::of(
            "every-run",
            "each run's Start precedes its one End, and no Progress follows it",
            "docs/contract.md §5 Events",
        );
        vec![
            settle.unless(self.delivered_after_settle, format!("{} launches watched", self.runs)),
            events.unless(self.event_problems, "events in order"),
        ]
    }
}

/// What is out of order among the events queued on `events`: a run with
/// two Starts or two Ends, an End before its Start, Progress after End.
pub(crate) fn event_problems(events: &mut EventStream) -> Vec<String> {
    let mut problems = Vec::new();
    let mut started = std::collections::HashSet::new();
    let mut ended = std::collections::HashSet::new();
    while let Some(event) = events.try_recv() {
        match event {
            Err(EventRecvError::Closed) => break,
            Err(EventRecvError::Lagged(missed)) => {
                problems.push(format!("the kit's event stream lagged and missed {missed} events"))
            }
            Ok(SubagentEvent::Start(info)) if !started.insert(info.run_id) => {
                problems.push(format!("run {} had two Start events", info.run_id))
            }
            Ok(SubagentEvent::End(end)) => {
                if !started.contains(&end.run_id) {
                    problems.push(format!("run {} ended before its Start", end.run_id));
                }
                if !ended.insert(end.run_id) {
                    problems.push(format!("run {} had two End events", end.run_id));
                }
            }
            Ok(SubagentEvent::Progress(progress)) if ended.contains(&progress.run_id) => {
                problems.push(format!("run {} had Progress after its End", progress.run_id))
            }
            _ => {}
        }
    }
    problems
}
