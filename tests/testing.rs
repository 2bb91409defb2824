//! The conformance kit (`subagents::testing`) on providers built to break
//! one rule each: every flaw is caught by a report line that names the
//! scenario, the evidence and the contract's clause, and the faultless
//! provider passes.

mod flawed;

use std::time::Duration;

use flawed::{Echo, Flaw};
use subagents::providers::{ChaosStage, MockProvider};
use subagents::testing::{conformance, Finding, Report, Verdict};

/// The kit run over the echo provider with `flaw`, with graces short
/// enough for a test.
fn report(flaw: Flaw) -> Report {
    conformance(move || Echo::new(flaw))
        .cancel_grace(Duration::from_millis(200))
        .leak_wait(Duration::from_millis(200))
        .patience(Duration::from_secs(2))
        .concurrent_runs(4)
        .run_blocking()
}

/// The one broken finding of `scenario` whose rule mentions `rule`.
fn broken<'a>(report: &'a Report, scenario: &str, rule: &str) -> &'a Finding {
    let found = report.broken().find(|finding| finding.scenario == scenario && finding.rule.contains(rule));
    found.unwrap_or_else(|| panic!("no broken `{scenario}` rule about {rule:?} in:\n{report}"))
}

#[test]
fn the_guides_echo_provider_keeps_every_rule() {
    let report = report(Flaw::None);
    report.assert_conformant();
    assert_eq!(report.with_verdict(Verdict::NotExercised).count(), 0, "{report}");
    for scenario in
        ["settle-once", "cancel-mid-run", "dispose-racing-result", "many-at-once", "shutdown-with-runs-live"]
    {
        assert!(report.scenario(scenario).any(|f| f.verdict == Verdict::Kept), "{scenario} ran:\n{report}");
    }
}

#[test]
fn a_provider_that_settles_twice_is_caught_with_what_it_sent_after() {
    let report = report(Flaw::SettlesTwice);
    let finding = broken(&report, "every-run", "after its run settled");
    assert!(
        finding.evidence.contains("progress update(s) and 1 structured capture(s) after its run resolved"),
        "{finding:?}"
    );
    assert!(finding.clause.contains("docs/contract.md §4 Results"), "{finding:?}");
    assert!(report.to_string().contains("BROKEN        every-run"), "{report}");
}

#[test]
fn a_provider_that_leaks_a_task_after_dispose_is_caught() {
    let report = report(Flaw::LeaksTask);
    let finding = broken(&report, "settle-once", "leaves nothing behind");
    assert!(finding.evidence.contains("context was still held"), "{finding:?}");
    assert!(finding.evidence.contains("progress update(s) after its dispose hook returned"), "{finding:?}");
    assert!(finding.evidence.contains("tokio task(s) the provider spawned were still alive"), "{finding:?}");
    assert_eq!(finding.clause, "docs/contract.md §4 Dispose");
}

#[test]
fn a_provider_that_ignores_an_advertised_capability_is_caught() {
    let report = report(Flaw::IgnoresCapability);
    let finding = broken(&report, "capabilities", "output_schema is honoured");
    assert!(finding.evidence.contains("accepted and ignored"), "{finding:?}");
    assert!(finding.clause.contains("§8"), "{finding:?}");
    assert_eq!(report.broken().count(), 1, "only that rule broke:\n{report}");
}

#[test]
fn a_provider_that_ignores_cancel_is_reported_as_needing_the_grace() {
    let report = report(Flaw::IgnoresCancel);
    let finding = broken(&report, "cancel-mid-run", "stops within the cancel grace");
    assert!(finding.evidence.contains("needed the runtime's grace"), "{finding:?}");
    assert_eq!(finding.clause, "docs/contract.md §4 Cancellation");
    broken(&report, "dispose-racing-result", "stops within the cancel grace");
}

#[test]
fn a_provider_that_answers_at_once_leaves_the_mid_run_rules_not_exercised() {
    let report = conformance(|| MockProvider::new("mock")).cancel_grace(Duration::from_millis(200)).run_blocking();
    report.assert_conformant();
    let skipped = report.scenario("cancel-mid-run").find(|f| f.verdict == Verdict::NotExercised);
    let skipped = skipped.unwrap_or_else(|| panic!("cancel-mid-run not exercised:\n{report}"));
    assert!(skipped.evidence.contains("long_prompt"), "{skipped:?}");
}

#[test]
fn the_mock_provider_keeps_every_rule_with_a_delay() {
    let mock = || MockProvider::new("mock").with_delay(Duration::from_millis(50));
    let report = conformance(mock).cancel_grace(Duration::from_millis(200)).run_blocking();
    report.assert_conformant();
    assert_eq!(report.with_verdict(Verdict::NotExercised).count(), 0, "{report}");
}

#[test]
fn seeded_faults_over_the_echo_provider_keep_every_invariant() {
    let report = subagents::testing::faults(|| Echo::new(Flaw::None)).seeds(0..6).runs_per_seed(6).run_blocking();
    report.assert_held();
    assert_eq!(report.seeds_run, 6);
}

#[test]
fn a_seed_that_breaks_an_invariant_is_printed_with_its_faults_and_replays_the_same() {
    let leaky = || {
        subagents::testing::faults(|| Echo::new(Flaw::LeaksTask)).leak_wait(Duration::from_millis(100)).runs_per_seed(4)
    };
    let report = leaky().seeds(40..48).run_blocking();
    let failure = report.failure.clone().unwrap_or_else(|| panic!("the leak was not caught: {report}"));
    assert_eq!(report.seeds_run, 1, "the first seed already leaks");
    let printed = report.to_string();
    assert!(printed.contains(&format!("seed {} broke", failure.seed)), "{printed}");
    assert!(printed.contains("still held the run's context"), "{printed}");
    assert!(printed.contains("faults injected (launch, stage, fault):"), "{printed}");
    assert!(printed.contains(&format!("replay({})", failure.seed)), "{printed}");

    // Launch, run and dispose faults replay exactly; progress faults are
    // drawn per update, and the leaked tasks send updates on their own time.
    let again = leaky().replay(failure.seed).run_blocking().failure.expect("the replay fails too");
    let scheduled = |failure: &subagents::testing::SeedFailure| {
        let faults = failure.injected.iter().filter(|injected| injected.stage != ChaosStage::Progress);
        faults.copied().collect::<Vec<_>>()
    };
    assert!(!scheduled(&failure).is_empty(), "seed {} injected a launch, run or dispose fault", failure.seed);
    assert_eq!((again.seed, scheduled(&again), &again.actions), (failure.seed, scheduled(&failure), &failure.actions));
}
