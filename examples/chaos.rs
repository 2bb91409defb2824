//! Fault-inject a batch of runs and check the runtime keeps its promises:
//! every run settles once, every dispose returns, nothing stays alive, and
//! the same seed reproduces the same faults.
//!
//! `cargo run --release --example chaos -- [SEED] [RUNS]`

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use subagents::agent::ScriptedModel;
use subagents::providers::{ChaosFault, ChaosProvider, ChaosSchedule, ChaosStage, InProcessProvider};
use subagents::{CancellationToken, Parent, Runtime, StartRequest};

fn batch(seed: u64, runs: usize) -> (BTreeMap<String, usize>, BTreeMap<String, usize>) {
    let home = std::env::temp_dir().join(format!("subagents-chaos-{}-{seed}", std::process::id()));
    let runtime = Runtime::builder()
        .home(&home)
        .cancel_grace(Duration::from_millis(50))
        .dispose_timeout(Duration::from_millis(200))
        .build()
        .expect("runtime");
    let schedule = ChaosSchedule::new()
        .rule(ChaosStage::Launch, ChaosFault::Error, 0.05)
        .rule(ChaosStage::Launch, ChaosFault::Delay(Duration::from_millis(2)), 0.10)
        .rule(ChaosStage::Run, ChaosFault::Error, 0.10)
        .rule(ChaosStage::Run, ChaosFault::Crash, 0.05)
        .rule(ChaosStage::Run, ChaosFault::Hang, 0.03)
        .rule(ChaosStage::Run, ChaosFault::Panic, 0.02)
        .rule(ChaosStage::Dispose, ChaosFault::Error, 0.05)
        .rule(ChaosStage::Progress, ChaosFault::DropProgress, 0.20);
    let spawn = InProcessProvider::spawn("spawn", Arc::new(ScriptedModel::demo())).in_memory();
    let chaos = ChaosProvider::new("chaos", spawn, schedule, seed);
    let log = chaos.injected_log();
    let subagents = runtime.subagents();
    subagents.register_provider(chaos).expect("register").keep();
    let outcomes = runtime.block_on(async move {
        let mut outcomes = BTreeMap::<String, usize>::new();
        for n in 0..runs {
            let request =
                StartRequest::new(format!("task {n}"), Parent::root(std::env::temp_dir()), CancellationToken::new());
            let outcome = match subagents.start("chaos", request).await {
                Ok(run) => {
                    // A hung child never answers: give each run a deadline,
                    // as a careful caller would, then cancel it.
                    if tokio::time::timeout(Duration::from_millis(500), run.result()).await.is_err() {
                        run.cancel();
                    }
                    let reason = run.result().await.map_or_else(|e| e.code().to_owned(), |r| r.stop_reason.to_string());
                    match run.dispose().await {
                        Ok(()) => reason,
                        Err(error) => format!("{reason}, then {}", error.code()),
                    }
                }
                Err(error) => format!("start rejected: {}", error.code()),
            };
            *outcomes.entry(outcome).or_default() += 1;
        }
        outcomes
    });
    let mut faults = BTreeMap::<String, usize>::new();
    for injected in log.lock().unwrap().iter() {
        *faults.entry(format!("{:?} {:?}", injected.stage, injected.fault)).or_default() += 1;
    }
    let report = runtime.shutdown_blocking();
    assert!(report.live_after.is_quiescent(), "something stayed alive: {:?}", report.live_after);
    let _ = std::fs::remove_dir_all(home);
    (outcomes, faults)
}

fn main() {
    // Injected panics are contained by the runtime; keep their reports short.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let injected = info.payload().downcast_ref::<&str>().is_some_and(|m| m.starts_with("chaos:"));
        if !injected {
            default_hook(info);
        }
    }));
    let mut args = std::env::args().skip(1);
    let seed = args.next().and_then(|s| s.parse().ok()).unwrap_or(7);
    let runs = args.next().and_then(|s| s.parse().ok()).unwrap_or(200);
    let (outcomes, faults) = batch(seed, runs);
    println!("seed {seed}, {runs} runs");
    println!("outcomes:");
    for (outcome, count) in &outcomes {
        println!("  {count:>5}  {outcome}");
    }
    println!("faults injected:");
    for (fault, count) in &faults {
        println!("  {count:>5}  {fault}");
    }
    let again = batch(seed, runs);
    assert_eq!(again, (outcomes, faults), "the same seed must reproduce the same faults");
    println!("the same seed reproduced the same faults and outcomes; nothing stayed alive");
}
