//! docs/contract.md §7.9 chaos wrapper: seeded, reproducible faults at every stage.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use subagents::agent::ScriptedModel;
use subagents::providers::{ChaosFault, ChaosProvider, ChaosSchedule, ChaosStage, InProcessProvider, MockProvider};
use subagents::seam::{Category, ProgressUpdate};
use subagents::{Runtime, StopReason, SubagentEvent};

/// Runs `runs` lifecycles one after another; what each did.
fn outcomes(schedule: ChaosSchedule, seed: u64, runs: usize) -> (Vec<String>, Vec<subagents::providers::Injected>) {
    let runtime = common::runtime();
    let chaos = ChaosProvider::new("chaos", MockProvider::new("inner"), schedule, seed);
    let log = chaos.injected_log();
    let subagents = runtime.subagents();
    subagents.register_provider(chaos).unwrap().keep();
    let seen = runtime.block_on(async move {
        let mut seen = Vec::new();
        for _ in 0..runs {
            seen.push(match subagents.start("chaos", common::request("x")).await {
                Ok(run) => {
                    let reason = run.result().await.unwrap().stop_reason.to_string();
                    let disposed = run.dispose().await.map_or_else(|e| e.code().to_owned(), |()| "ok".to_owned());
                    format!("{reason}/{disposed}")
                }
                Err(error) => error.code().to_owned(),
            });
        }
        seen
    });
    let report = runtime.shutdown_blocking();
    assert!(report.live_after.is_quiescent(), "{:?}", report.live_after);
    let injected = log.lock().unwrap().clone();
    (seen, injected)
}

fn mixed() -> ChaosSchedule {
    ChaosSchedule::new()
        .rule(ChaosStage::Launch, ChaosFault::Error, 0.1)
        .rule(ChaosStage::Run, ChaosFault::Error, 0.2)
        .rule(ChaosStage::Run, ChaosFault::Crash, 0.1)
        .rule(ChaosStage::Dispose, ChaosFault::Error, 0.1)
}

#[test]
fn the_same_seed_reproduces_the_same_faults_and_another_seed_does_not() {
    let first = outcomes(mixed(), 11, 60);
    let again = outcomes(mixed(), 11, 60);
    let other = outcomes(mixed(), 12, 60);
    assert_eq!(first, again);
    assert_ne!(first.1, other.1);
    assert!(first.1.len() >= 5, "the schedule injected faults: {:?}", first.1);
    assert!(first.0.iter().any(|o| o == "completed/ok"), "most runs are fine: {:?}", first.0);
}

#[test]
fn each_fault_has_its_documented_effect() {
    let cases: Vec<(ChaosStage, ChaosFault, &str)> = vec![
        (ChaosStage::Launch, ChaosFault::Error, "STARTUP_FAILED"),
        (ChaosStage::Launch, ChaosFault::Crash, "STARTUP_FAILED"),
        (ChaosStage::Launch, ChaosFault::Panic, "STARTUP_FAILED"),
        (ChaosStage::Launch, ChaosFault::Delay(Duration::from_millis(10)), "completed/ok"),
        (ChaosStage::Run, ChaosFault::Error, "error/ok"),
        (ChaosStage::Run, ChaosFault::Crash, "error/ok"),
        (ChaosStage::Run, ChaosFault::Panic, "error/ok"),
        (ChaosStage::Run, ChaosFault::Delay(Duration::from_millis(10)), "completed/ok"),
        (ChaosStage::Dispose, ChaosFault::Error, "completed/DISPOSE_FAILED"),
        (ChaosStage::Dispose, ChaosFault::Crash, "completed/DISPOSE_FAILED"),
        (ChaosStage::Dispose, ChaosFault::Panic, "completed/DISPOSE_FAILED"),
        (ChaosStage::Dispose, ChaosFault::Hang, "completed/DISPOSE_FAILED"),
    ];
    for (stage, fault, expected) in cases {
        let (seen, injected) = outcomes(ChaosSchedule::new().rule(stage, fault, 1.0), 1, 1);
        assert_eq!(seen, [expected], "{stage:?} {fault:?}");
        assert_eq!(injected.len(), 1, "{stage:?} {fault:?}");
    }
}

#[test]
fn a_hung_run_or_launch_is_bounded_by_the_cancel_grace() {
    let runtime = common::runtime();
    let subagents = runtime.subagents();
    let hung_run = ChaosSchedule::new().rule(ChaosStage::Run, ChaosFault::Hang, 1.0);
    let hung_launch = ChaosSchedule::new().rule(ChaosStage::Launch, ChaosFault::Hang, 1.0);
    subagents.register_provider(ChaosProvider::new("run", MockProvider::new("a"), hung_run, 1)).unwrap().keep();
    subagents.register_provider(ChaosProvider::new("launch", MockProvider::new("b"), hung_launch, 1)).unwrap().keep();
    let (run_reason, launch_error) = runtime.block_on(async move {
        let run = subagents.start("run", common::request("x")).await.unwrap();
        run.cancel();
        let reason = run.result().await.unwrap().stop_reason;
        run.dispose().await.unwrap();
        let signal = subagents::CancellationToken::new();
        let canceller = signal.clone();
        actix::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            canceller.cancel();
        });
        let error = subagents.start("launch", common::request_with("x", signal)).await.unwrap_err();
        (reason, error.code())
    });
    assert_eq!(run_reason, StopReason::Aborted);
    assert_eq!(launch_error, "ABORTED");
    assert!(runtime.shutdown_blocking().live_after.is_quiescent());
}

#[test]
fn progress_updates_can_be_dropped_or_duplicated() {
    let count_chunks = |fault: Option<ChaosFault>| -> usize {
        let home = tempfile::tempdir().unwrap();
        let runtime = Runtime::builder().home(home.path()).build().unwrap();
        let subagents = runtime.subagents();
        let schedule = match fault {
            Some(fault) => ChaosSchedule::new().rule(ChaosStage::Progress, fault, 1.0),
            None => ChaosSchedule::new(),
        };
        let spawn = InProcessProvider::spawn("spawn", Arc::new(ScriptedModel::new())).in_memory();
        subagents.register_provider(ChaosProvider::new("chaos", spawn, schedule, 3)).unwrap().keep();
        let mut events = subagents.subscribe();
        let cwd = home.path().to_path_buf();
        runtime.block_on(async move {
            let request = subagents::StartRequest::new("hello", subagents::Parent::root(cwd), Default::default());
            let run = subagents.start("chaos", request).await.unwrap();
            run.result().await.unwrap();
            run.dispose().await.unwrap();
        });
        let mut chunks = 0;
        while let Some(Ok(event)) = events.try_recv() {
            if let SubagentEvent::Progress(progress) = event {
                if matches!(progress.update, ProgressUpdate::MessageChunk { .. }) {
                    chunks += 1;
                }
            }
        }
        runtime.shutdown_blocking();
        chunks
    };
    assert_eq!(count_chunks(None), 1, "the scripted answer streams as one chunk");
    assert_eq!(count_chunks(Some(ChaosFault::DropProgress)), 0);
    assert_eq!(count_chunks(Some(ChaosFault::DuplicateProgress)), 2);
}

#[test]
fn chaos_failures_carry_safe_diagnostics() {
    let runtime = common::runtime();
    let subagents = runtime.subagents();
    let schedule = ChaosSchedule::new().rule(ChaosStage::Run, ChaosFault::Crash, 1.0);
    subagents.register_provider(ChaosProvider::new("chaos", MockProvider::new("m"), schedule, 5)).unwrap().keep();
    let result = runtime.block_on(async move {
        let run = subagents.start("chaos", common::request("x")).await.unwrap();
        let result = run.result().await.unwrap();
        run.dispose().await.unwrap();
        result
    });
    let diagnostic = result.diagnostic.unwrap();
    assert_eq!((diagnostic.provider.as_str(), diagnostic.category), ("chaos", Category::ChildCrashed));
}
