//! What a scenario is handed and hands back: the registry, the probe's
//! log and the settings in; its findings and what to check after the
//! runtime's shutdown out. The scenarios themselves are in `scenarios`.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::probe::{ProbeLog, RunTrace};
use super::report::Finding;
use crate::{CancellationToken, Parent, Run, RunResult, ShutdownReport, StartRequest, SubagentError, Subagents};

/// A scenario's future: its findings, and what to check after shutdown.
pub(crate) type Driven = Pin<Box<dyn Future<Output = (Vec<Finding>, After)> + Send + 'static>>;

/// What the scenarios read.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub prompt: String,
    pub long_prompt: Option<String>,
    pub cwd: PathBuf,
    pub concurrent_runs: usize,
    pub cancel_grace: Duration,
    pub dispose_timeout: Duration,
    pub shutdown_phase_timeout: Duration,
    pub leak_wait: Duration,
    pub patience: Duration,
}

/// What one scenario is handed: the registry, the probe's log and the
/// settings.
pub(crate) struct Scenario {
    pub subagents: Subagents,
    pub log: Arc<ProbeLog>,
    pub settings: Arc<Settings>,
}

impl Scenario {
    /// The provider's registry name.
    pub(crate) fn name(&self) -> String {
        self.subagents.provider_names().into_iter().next().unwrap_or_default()
    }

    /// A request for `prompt` with a fresh signal.
    pub(crate) fn request(&self, prompt: &str) -> StartRequest {
        StartRequest::new(prompt, Parent::root(&self.settings.cwd), CancellationToken::new())
    }

    /// The long prompt, or the prompt.
    pub(crate) fn long_prompt(&self) -> &str {
        self.settings.long_prompt.as_deref().unwrap_or(&self.settings.prompt)
    }

    /// The run's result, or — when it has not settled within the patience —
    /// `None` after cancelling it.
    pub(crate) async fn patient_result(&self, run: &Run) -> Option<Result<RunResult, SubagentError>> {
        match tokio::time::timeout(self.settings.patience, run.result()).await {
            Ok(result) => Some(result),
            Err(_) => {
                run.cancel();
                let _ = run.result().await;
                None
            }
        }
    }

    /// The evidence of a rule a run too slow to settle left unexercised.
    pub(crate) fn impatient(&self) -> String {
        format!(
            "the run had not settled {:?} after it started, so the kit cancelled it: give the kit a `prompt` this \
             provider completes, or more `patience`",
            self.settings.patience
        )
    }

    /// The probe's trace of the launch numbered `n`.
    pub(crate) fn trace(&self, n: usize) -> Option<Arc<RunTrace>> {
        self.log.runs().get(n).cloned()
    }

    /// Tokio tasks alive on this thread's runtime (where the runs live).
    pub(crate) fn tasks_alive() -> usize {
        tokio::runtime::Handle::current().metrics().num_alive_tasks()
    }

    /// Problems with what is left after the runs of `traces` were disposed:
    /// runs or processes still counted, a context still held, progress
    /// after dispose, tasks alive beyond `tasks_before`.
    pub(crate) async fn leftovers(&self, traces: &[Arc<RunTrace>], tasks_before: usize) -> Vec<String> {
        let mut problems = Vec::new();
        let bound = self.settings.leak_wait;
        let live = self.subagents.live();
        if live.runs > 0 || live.processes > 0 {
            problems.push(format!(
                "after dispose returned the runtime still counted {} live run(s) and {} process(es)",
                live.runs, live.processes
            ));
        }
        for (n, trace) in traces.iter().enumerate() {
            if !trace.context_released_within(bound).await {
                problems.push(format!(
                    "run {n}'s context was still held {bound:?} after dispose returned: a task, thread or callback \
                     of the provider outlived the run"
                ));
            }
            let log = trace.log();
            if log.progress_after_dispose > 0 {
                problems.push(format!(
                    "run {n} reported {} progress update(s) after its dispose hook returned",
                    log.progress_after_dispose
                ));
            }
        }
        let deadline = std::time::Instant::now() + bound;
        while Self::tasks_alive() > tasks_before && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let extra = Self::tasks_alive().saturating_sub(tasks_before);
        if extra > 0 {
            problems
                .push(format!("{extra} tokio task(s) the provider spawned were still alive {bound:?} after dispose"));
        }
        problems
    }
}

/// What the kit checks once the scenario's runtime is shut down.
pub(crate) enum After {
    Nothing,
    Shutdown(ShutdownCheck),
}

/// A check on the shutdown report and the probe's log.
pub(crate) type ShutdownCheck = Box<dyn FnOnce(&ShutdownReport, &ProbeLog) -> Vec<Finding> + Send>;

/// A scenario's driver: runs on the scenario's runtime worker.
pub(crate) type Drive = fn(Scenario) -> Driven;
