//! Load: thousands of live runs cancelled through their tokens at once all
//! settle `Aborted`, reach quiescence, and give their memory back.
//!
//! Run with `--nocapture` to see the figures.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use subagents::agent::{ScriptMatch, ScriptedModel, Step};
use subagents::providers::{InProcessProvider, MockProvider};
use subagents::{CancellationToken, Parent, Runtime, StartRequest, StopReason, Subagents};

fn resident_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<f64>().unwrap() / 1024.0
}

fn give_memory_back() {
    // SAFETY: malloc_trim only returns free heap pages to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Starts `count` runs on `provider`, cancels every token at once, and
/// checks each settles `Aborted` and the runtime goes quiescent.
fn cancel_all_at_once(runtime: &Runtime, subagents: &Subagents, provider: &'static str, count: usize) -> String {
    let cwd = std::env::temp_dir();
    let subagents = subagents.clone();
    let (started, cancelled, settled, peak) = runtime.block_on(async move {
        let tokens: Vec<CancellationToken> = (0..count).map(|_| CancellationToken::new()).collect();
        let began = Instant::now();
        let starts = tokens.iter().map(|token| {
            let request = StartRequest::new("wait", Parent::root(&cwd), token.clone());
            subagents.start(provider, request)
        });
        let runs: Vec<_> = join_all(starts).await.into_iter().map(|run| run.unwrap()).collect();
        let started = began.elapsed();
        let peak = resident_mib();
        assert_eq!(subagents.live().runs, count, "every run is live before the cancel");
        let began = Instant::now();
        for token in &tokens {
            token.cancel();
        }
        let results = join_all(runs.iter().map(|run| run.result())).await;
        assert!(results.iter().all(|r| r.as_ref().unwrap().stop_reason == StopReason::Aborted));
        join_all(runs.iter().map(|run| run.dispose())).await.into_iter().for_each(|d| d.unwrap());
        let cancelled = began.elapsed();
        drop(runs);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !subagents.live().is_quiescent() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        (started, cancelled, subagents.live(), peak)
    });
    assert!(settled.is_quiescent(), "{settled:?}");
    format!(
        "{count} {provider} runs: started in {started:.2?} (resident {peak:.1} MiB with all live), \
         cancelled to quiescence in {cancelled:.2?}"
    )
}

#[test]
fn ten_thousand_mock_runs_and_a_thousand_spawn_runs_cancel_at_once() {
    let home = tempfile::tempdir().unwrap();
    let runtime = Runtime::builder().home(home.path()).cancel_grace(Duration::from_millis(500)).build().unwrap();
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("mock").with_delay(Duration::from_secs(600))).unwrap().keep();
    let slow = ScriptedModel::new().script(ScriptMatch::Any, vec![Step::text("late").after(Duration::from_secs(600))]);
    subagents.register_provider(InProcessProvider::spawn("spawn", Arc::new(slow)).in_memory()).unwrap().keep();
    // Warm up allocator pools and lazily built state, then measure.
    cancel_all_at_once(&runtime, &subagents, "mock", 100);
    give_memory_back();
    let baseline = resident_mib();

    let mock = cancel_all_at_once(&runtime, &subagents, "mock", 10_000);
    give_memory_back();
    let after_mock = resident_mib();
    let spawn = cancel_all_at_once(&runtime, &subagents, "spawn", 1_000);
    give_memory_back();
    let after_spawn = resident_mib();
    eprintln!("{mock}\n{spawn}");
    eprintln!(
        "resident memory: baseline {baseline:.1} MiB, after mock {after_mock:.1} MiB, after spawn {after_spawn:.1} MiB"
    );
    assert!(after_mock - baseline < 48.0, "memory did not come back after the mock runs");
    assert!(after_spawn - baseline < 48.0, "memory did not come back after the spawn runs");
    assert!(runtime.shutdown_blocking().live_after.is_quiescent());
}
