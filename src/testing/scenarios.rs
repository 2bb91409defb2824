//! The scenarios of a conformance run, in the order they run. Each drives
//! the provider as a caller would and returns its findings; the rules and
//! clauses they cite are the contract's (`docs/contract.md`).

use std::sync::Arc;
use std::time::Instant;

use futures_util::future::join_all;

use super::probe::RunTrace;
use super::report::Finding;
use super::scenario::{After, Drive, Driven, Scenario};
use crate::seam::{Capability, Category, Detached, ToolFilter};
use crate::{AgentOptions, Run, RunResult, StartRequest, StopReason, SubagentError};

/// One scenario: its name and its driver.
#[derive(Debug)]
pub(crate) struct Case {
    pub name: &'static str,
    pub drive: Drive,
}

/// Every scenario, in order.
pub(crate) const ALL: &[Case] = &[
    Case { name: "settle-once", drive: settle_once },
    Case { name: "result-after-dispose", drive: result_after_dispose },
    Case { name: "cancel-before-launch", drive: cancel_before_launch },
    Case { name: "cancel-during-launch", drive: cancel_during_launch },
    Case { name: "cancel-mid-run", drive: cancel_mid_run },
    Case { name: "cancel-after-settle", drive: cancel_after_settle },
    Case { name: "dispose-racing-result", drive: dispose_racing_result },
    Case { name: "capabilities", drive: capabilities },
    Case { name: "many-at-once", drive: many_at_once },
    Case { name: "shutdown-with-runs-live", drive: shutdown_with_runs_live },
];

const RESULTS: &str = "docs/contract.md §4 Results";
const CANCELLATION: &str = "docs/contract.md §4 Cancellation";
const DISPOSE: &str = "docs/contract.md §4 Dispose";
const OWNERSHIP: &str = "docs/contract.md §4 Ownership";

/// A start the scenario needs; its failure is the finding.
async fn started(s: &Scenario, scenario: &'static str, request: StartRequest) -> Result<Run, Finding> {
    s.subagents.start(&s.name(), request).await.map_err(|error| {
        Finding::of(scenario, "a plain start succeeds", "docs/contract.md §3 start").broken(format!(
            "start failed ({}): {error} — give the kit a prompt and cwd this provider accepts",
            error.code()
        ))
    })
}

/// Disposes `runs`, lets go of them (a caller's `Run` may hold an
/// in-process child's agent) and checks what is left: the hook's outcome
/// and the leftovers of [`Scenario::leftovers`].
async fn disposed(
    s: &Scenario,
    scenario: &'static str,
    runs: Vec<Run>,
    traces: &[Arc<RunTrace>],
    tasks_before: usize,
) -> Vec<Finding> {
    let mut failures = Vec::new();
    for run in &runs {
        if let Err(error) = run.dispose().await {
            failures.push(format!("dispose of {} failed: {error}", run.child_id()));
        }
    }
    let count = runs.len();
    drop(runs);
    let hook = Finding::of(scenario, "the dispose hook releases the child without failing", DISPOSE);
    let leftovers = Finding::of(scenario, "dispose leaves nothing behind", DISPOSE);
    let problems = s.leftovers(traces, tasks_before).await;
    vec![
        hook.unless(failures, format!("{count} run(s) disposed")),
        leftovers.unless(problems, "no run, process, context or task left"),
    ]
}

/// The finding on whether a cancelled run stopped within the grace.
fn stopped_within_grace(
    scenario: &'static str,
    result: &RunResult,
    trace: &RunTrace,
    grace: std::time::Duration,
) -> Finding {
    let rule = Finding::of(scenario, "a child told to stop stops within the cancel grace", CANCELLATION);
    let timed_out = result.diagnostic.as_ref().is_some_and(|d| d.category == Category::TimedOut);
    if timed_out || trace.log().run_abandoned {
        rule.broken(format!(
            "the child's run was still going {grace:?} after it was told to stop; the runtime settled it `aborted` \
             (timed-out) without it: the provider needed the runtime's grace"
        ))
    } else {
        rule.kept(format!("settled `{}`", result.stop_reason))
    }
}

fn outcome(result: &Result<RunResult, SubagentError>) -> String {
    match result {
        Ok(result) => format!("`{}`", result.stop_reason),
        Err(error) => format!("error {}", error.code()),
    }
}

fn settle_once(s: Scenario) -> Driven {
    Box::pin(async move {
        const NAME: &str = "settle-once";
        let tasks = Scenario::tasks_alive();
        let run = match started(&s, NAME, s.request(&s.settings.prompt)).await {
            Ok(run) => run,
            Err(finding) => return (vec![finding], After::Nothing),
        };
        let trace = s.trace(0);
        let rule = Finding::of(NAME, "a run settles once, and every read gives that outcome", RESULTS);
        let Some(first) = s.patient_result(&run).await else {
            let mut findings = vec![rule.not_exercised(s.impatient())];
            findings.extend(disposed(&s, NAME, vec![run], &trace.into_iter().collect::<Vec<_>>(), tasks).await);
            return (findings, After::Nothing);
        };
        let again = run.result().await;
        let mut problems = Vec::new();
        if first != again {
            problems.push(format!("read once {}, then {}", outcome(&first), outcome(&again)));
        }
        if first.is_err() {
            problems.push(format!("the result was {}", outcome(&first)));
        }
        let calls = trace.as_ref().map_or(0, |trace| trace.log().run_calls);
        if calls != 1 {
            problems.push(format!("the child's run was called {calls} times"));
        }
        let mut findings = vec![rule.unless(problems, format!("settled {} once", outcome(&first)))];
        findings.extend(disposed(&s, NAME, vec![run], &trace.into_iter().collect::<Vec<_>>(), tasks).await);
        (findings, After::Nothing)
    })
}

fn result_after_dispose(s: Scenario) -> Driven {
    Box::pin(async move {
        const NAME: &str = "result-after-dispose";
        let tasks = Scenario::tasks_alive();
        let run = match started(&s, NAME, s.request(&s.settings.prompt)).await {
            Ok(run) => run,
            Err(finding) => return (vec![finding], After::Nothing),
        };
        let traces: Vec<_> = s.trace(0).into_iter().collect();
        let _ = run.dispose().await;
        let (first, again) = (run.result().await, run.result().await);
        // Disposing again is idempotent: this reports the first outcome.
        let mut findings = disposed(&s, NAME, vec![run], &traces, tasks).await;
        let rule = Finding::of(NAME, "the result is there after dispose, the same at every read", RESULTS);
        let problems = match (&first, &again) {
            (Err(error), _) => vec![format!("after dispose the result was {} ({error})", outcome(&first))],
            _ if first != again => vec![format!("read {} then {}", outcome(&first), outcome(&again))],
            _ => Vec::new(),
        };
        findings.push(rule.unless(problems, format!("{} after dispose", outcome(&first))));
        (findings, After::Nothing)
    })
}

fn cancel_before_launch(s: Scenario) -> Driven {
    Box::pin(async move {
        const NAME: &str = "cancel-before-launch";
        let request = s.request(&s.settings.prompt);
        request.signal.cancel();
        let refused = s.subagents.start(&s.name(), request).await;
        let rule = Finding::of(NAME, "a start whose signal already tripped is refused before launch", OWNERSHIP);
        let launches = s.log.runs().len();
        let finding = match refused {
            Err(error) if error.code() == "ABORTED" && launches == 0 => rule.kept("ABORTED, no launch"),
            Err(error) => rule.broken(format!("start failed {} with {launches} launch(es)", error.code())),
            Ok(run) => {
                let _ = run.dispose().await;
                rule.broken("the start succeeded")
            }
        };
        (vec![finding], After::Nothing)
    })
}

fn cancel_during_launch(s: Scenario) -> Driven {
    Box::pin(async move {
        const NAME: &str = "cancel-during-launch";
        let tasks = Scenario::tasks_alive();
        let request = s.request(&s.settings.prompt);
        s.log.trip_on_next_launch(request.signal.clone());
        let started = s.subagents.start(&s.name(), request).await;
        let rule = Finding::of(
            NAME,
            "a launch whose token trips rolls back and returns no child; start fails ABORTED",
            CANCELLATION,
        );
        let trace = s.trace(0);
        let log = trace.as_ref().map(|trace| trace.log()).unwrap_or_default();
        let mut problems = Vec::new();
        match &started {
            Err(error) if error.code() == "ABORTED" => {}
            Err(error) => problems.push(format!("start failed {} instead of ABORTED", error.code())),
            Ok(_) => problems.push("start succeeded".into()),
        }
        if log.launch_abandoned {
            problems.push(format!(
                "the launch ignored its tripped token and was abandoned after the cancel grace ({:?})",
                s.settings.cancel_grace
            ));
        }
        if let (true, Some(Ok(child))) = (log.token_tripped_at_entry, &log.launched) {
            problems.push(format!(
                "launch returned child {child} although its token had tripped as it began; the runtime refused the \
                 start and disposed the child"
            ));
        }
        let mut findings = vec![rule.unless(problems, "launch returned `aborted`; start failed ABORTED")];
        if let Ok(run) = started {
            let _ = run.dispose().await;
        }
        let leftovers = Finding::of(NAME, "a rolled-back launch leaves nothing behind", OWNERSHIP);
        findings
            .push(leftovers.unless(s.leftovers(&trace.into_iter().collect::<Vec<_>>(), tasks).await, "nothing left"));
        (findings, After::Nothing)
    })
}

fn cancel_mid_run(s: Scenario) -> Driven {
    Box::pin(async move {
        const NAME: &str = "cancel-mid-run";
        let tasks = Scenario::tasks_alive();
        let run = match started(&s, NAME, s.request(s.long_prompt())).await {
            Ok(run) => run,
            Err(finding) => return (vec![finding], After::Nothing),
        };
        let trace = s.trace(0).expect("a started run was launched");
        let rule = Finding::of(NAME, "a run cancelled mid-way settles `aborted`", CANCELLATION);
        let mut findings = Vec::new();
        if trace.log().settled.is_some() {
            findings.push(rule.not_exercised(
                "the run had settled before it could be cancelled: give the kit a `long_prompt` this provider works \
                 on for a while",
            ));
        } else {
            run.cancel();
            match run.result().await {
                Ok(result) => {
                    let reason = result.stop_reason;
                    findings.push(if matches!(reason, StopReason::Aborted | StopReason::Completed) {
                        rule.kept(format!("settled `{reason}`"))
                    } else {
                        rule.broken(format!("settled `{reason}` after cancel"))
                    });
                    findings.push(stopped_within_grace(NAME, &result, &trace, s.settings.cancel_grace));
                }
                Err(error) => findings.push(rule.broken(format!("the result was error {}", error.code()))),
            }
            let calls = trace.log().cancel_calls;
            let once = Finding::of(NAME, "the child is told to stop at most once", CANCELLATION);
            findings.push(if calls <= 1 { once.kept("once") } else { once.broken(format!("{calls} times")) });
        }
        findings.extend(disposed(&s, NAME, vec![run], &[trace], tasks).await);
        (findings, After::Nothing)
    })
}

fn cancel_after_settle(s: Scenario) -> Driven {
    Box::pin(async move {
        const NAME: &str = "cancel-after-settle";
        let run = match started(&s, NAME, s.request(&s.settings.prompt)).await {
            Ok(run) => run,
            Err(finding) => return (vec![finding], After::Nothing),
        };
        let rule = Finding::of(NAME, "a settled run keeps its outcome when cancelled", CANCELLATION);
        let Some(first) = s.patient_result(&run).await else {
            let _ = run.dispose().await;
            return (vec![rule.not_exercised(s.impatient())], After::Nothing);
        };
        run.cancel();
        let after = run.result().await;
        let cancels = s.trace(0).map_or(0, |trace| trace.log().cancel_calls);
        let finding = if first != after {
            rule.broken(format!("was {}, then {} after cancel", outcome(&first), outcome(&after)))
        } else if cancels > 0 {
            rule.broken("the settled child was told to stop")
        } else {
            rule.kept(format!("stayed {}", outcome(&first)))
        };
        let _ = run.dispose().await;
        (vec![finding], After::Nothing)
    })
}

fn dispose_racing_result(s: Scenario) -> Driven {
    Box::pin(async move {
        const NAME: &str = "dispose-racing-result";
        let tasks = Scenario::tasks_alive();
        let run = match started(&s, NAME, s.request(s.long_prompt())).await {
            Ok(run) => run,
            Err(finding) => return (vec![finding], After::Nothing),
        };
        let trace = s.trace(0).expect("a started run was launched");
        let (result, disposal) = tokio::join!(run.result(), run.dispose());
        let rule = Finding::of(NAME, "a dispose racing the result settles the run once, cleanly", DISPOSE);
        let mut findings = vec![match (&result, &disposal) {
            (Ok(settled), Ok(())) if matches!(settled.stop_reason, StopReason::Aborted | StopReason::Completed) => {
                rule.kept(format!("settled `{}`, disposed", settled.stop_reason))
            }
            (_, Err(error)) => rule.broken(format!("dispose failed: {error}")),
            _ => rule.broken(format!("settled {}", outcome(&result))),
        }];
        if let Ok(settled) = &result {
            findings.push(stopped_within_grace(NAME, settled, &trace, s.settings.cancel_grace));
        }
        drop(run);
        let leftovers = Finding::of(NAME, "dispose leaves nothing behind", DISPOSE);
        findings.push(leftovers.unless(s.leftovers(&[trace], tasks).await, "nothing left"));
        (findings, After::Nothing)
    })
}

/// A request that uses `capability` with a sane value.
fn asking_for(s: &Scenario, capability: Capability) -> StartRequest {
    let request = s.request(&s.settings.prompt);
    match capability {
        Capability::OutputSchema => request.with_output_schema(serde_json::json!({"type": "object"})),
        Capability::DepthLimit => request.with_max_depth(1),
        Capability::ToolFilter => request.with_tool_filter(ToolFilter::deny(["conformance_no_such_tool"])),
        Capability::Persona => request.with_persona("a careful reviewer"),
        Capability::AgentOptions => {
            request.with_agent_options(AgentOptions { max_tokens: Some(512), ..AgentOptions::default() })
        }
        Capability::McpServers => request.with_mcp_servers(["conformance"]),
        Capability::Detached => request.with_detached(Detached::Start("conformance-1".into())),
    }
}

fn capabilities(s: Scenario) -> Driven {
    Box::pin(async move {
        const NAME: &str = "capabilities";
        const CLAUSE: &str = "docs/contract.md §3 start's checks";
        let Some(info) = s.subagents.provider(&s.name()) else {
            return (Vec::new(), After::Nothing);
        };
        let mut refusals = Vec::new();
        let mut findings = Vec::new();
        for capability in Capability::CHECK_ORDER {
            let advertised = info.capabilities.supports(capability);
            let launches = s.log.runs().len();
            let started = s.subagents.start(&s.name(), asking_for(&s, capability)).await;
            let launched = s.log.runs().len() > launches;
            match (advertised, started) {
                (false, Err(error)) if error.code() == "UNSUPPORTED_CAPABILITY" && !launched => {}
                (false, Err(error)) => refusals.push(format!("{capability}: refused {}", error.code())),
                (false, Ok(run)) => {
                    let _ = run.dispose().await;
                    refusals.push(format!("{capability} is not advertised, yet a start asking for it succeeded"));
                }
                (true, Ok(run)) if capability == Capability::OutputSchema => {
                    findings.push(structured(&s, &run).await);
                    let _ = run.dispose().await;
                }
                (true, Ok(run)) => {
                    let _ = run.dispose().await;
                }
                (true, Err(error)) if matches!(error.code(), "INVALID_REQUEST" | "STARTUP_FAILED") => {}
                (true, Err(error)) => {
                    refusals.push(format!("{capability} is advertised, yet refused {}", error.code()))
                }
            }
        }
        let rule = Finding::of(NAME, "what is not advertised is refused UNSUPPORTED_CAPABILITY before launch", CLAUSE);
        findings.insert(0, rule.unless(refusals, format!("advertises {:?}", info.capabilities)));
        (findings, After::Nothing)
    })
}

/// The finding on a run started with an output schema.
async fn structured(s: &Scenario, run: &Run) -> Finding {
    let rule = Finding::of(
        "capabilities",
        "an advertised output_schema is honoured: a completed run carries a structured value",
        "docs/contract.md §8 Structured output",
    );
    let Some(result) = s.patient_result(run).await else {
        return rule.not_exercised(s.impatient());
    };
    match result {
        Ok(result) if result.stop_reason == StopReason::Completed => match &result.structured {
            Some(value) if value.is_object() => rule.kept("a structured object"),
            Some(value) => rule.broken(format!("the structured value is not an object: {value}")),
            None => rule.broken("completed with no structured value: the schema was accepted and ignored"),
        },
        Ok(result) => match &result.diagnostic {
            Some(d) if d.category == Category::MissingStructuredOutput => rule.kept("refused loudly: missing"),
            _ => rule.not_exercised(format!("the run settled `{}`", result.stop_reason)),
        },
        Err(error) => rule.broken(format!("the result was error {}", error.code())),
    }
}

fn many_at_once(s: Scenario) -> Driven {
    Box::pin(async move {
        const NAME: &str = "many-at-once";
        let tasks = Scenario::tasks_alive();
        let count = s.settings.concurrent_runs;
        let name = s.name();
        let starts = (0..count).map(|n| s.subagents.start(&name, s.request(&format!("{} ({n})", s.settings.prompt))));
        let mut runs = Vec::new();
        let mut problems = Vec::new();
        for started in join_all(starts).await {
            match started {
                Ok(run) => runs.push(run),
                Err(error) => problems.push(format!("a start failed: {error}")),
            }
        }
        let results = join_all(runs.iter().map(|run| s.patient_result(run))).await;
        let mut slow = 0;
        for (run, result) in runs.iter().zip(&results) {
            match result {
                Some(Err(error)) => problems.push(format!("{} settled error {}", run.child_id(), error.code())),
                None => slow += 1,
                Some(Ok(_)) => {}
            }
        }
        let mut ids: Vec<&str> = runs.iter().map(Run::child_id).collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.len() != runs.len() {
            problems.push(format!("{} runs shared {} child ids", runs.len(), ids.len()));
        }
        let rule = Finding::of(
            NAME,
            "runs side by side keep apart: one outcome and one child id each",
            "docs/contract.md §4 Two names",
        );
        let mut findings = vec![if slow > 0 && problems.is_empty() {
            rule.not_exercised(format!("{slow} of {count} runs: {}", s.impatient()))
        } else {
            rule.unless(problems, format!("{count} runs at once"))
        }];
        let traces = s.log.runs();
        findings.extend(disposed(&s, NAME, runs, &traces, tasks).await);
        (findings, After::Nothing)
    })
}

fn shutdown_with_runs_live(s: Scenario) -> Driven {
    Box::pin(async move {
        const NAME: &str = "shutdown-with-runs-live";
        let mut held = Vec::new();
        for _ in 0..2 {
            match started(&s, NAME, s.request(s.long_prompt())).await {
                Ok(run) => held.push(run),
                Err(finding) => return (vec![finding], After::Nothing),
            }
        }
        let started_at = Instant::now();
        let check = Box::new(move |report: &crate::ShutdownReport, log: &super::probe::ProbeLog| {
            drop(held);
            let rule = Finding::of(
                NAME,
                "shutdown with runs live stops them all in its phases, none forced",
                "docs/contract.md §4 Shutdown",
            );
            let mut problems = Vec::new();
            if !report.live_after.is_quiescent() {
                problems.push(format!("after shutdown: {:?}", report.live_after));
            }
            if report.runs_forced > 0 {
                problems.push(format!("{} run(s) had to be forced down", report.runs_forced));
            }
            if log.shutdowns() != 1 {
                problems.push(format!("Provider::shutdown was called {} times", log.shutdowns()));
            }
            let held_contexts = log.runs().iter().filter(|trace| trace.context_held()).count();
            if held_contexts > 0 {
                problems.push(format!("{held_contexts} run context(s) still held after shutdown"));
            }
            vec![rule.unless(problems, format!("stopped in {:?}", started_at.elapsed()))]
        });
        (Vec::new(), After::Shutdown(check))
    })
}
