//! An `acp` run's dispose once the run has finished, timed from `dispose()`
//! to its return (start and result stay outside the timing). Agents that
//! never exit at stdin EOF (codex-acp, claude-agent-acp) used to cost the
//! whole `dispose_eof_grace` (6 s) here; the goal is ≤ 1 s. Timed in one
//! run, beside each other:
//!
//! - the floor: a shell stand-in that exits at EOF (`tests/acp/stand_ins.rs`);
//! - our own `subagents acp`, which exits at EOF too;
//! - the same stand-in ignoring EOF, with the default graces (it waits out
//!   `dispose_idle_eof_grace`, then is SIGTERMed);
//! - once, outside criterion, that stand-in with the EOF phase fixed at
//!   `dispose_eof_grace` (the ladder before the idle grace).
//!
//! The closing lines print each mean, the EOF-ignoring agent's excess over
//! the floor, and the verdict against ≤ 1 s.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[path = "../tests/acp/stand_ins.rs"]
mod stand_ins;
mod support;

use criterion::{Criterion, SamplingMode};
use subagents::providers::{AcpConfig, AcpProvider};
use subagents::{CancellationToken, Parent, Runtime, StartRequest, Subagents};

/// The goal for a finished run's dispose of an agent that ignores EOF.
const GOAL: Duration = Duration::from_secs(1);

/// Start, result, then the dispose alone, timed.
async fn timed_dispose(subagents: &Subagents, provider: &str, cwd: &Path) -> Duration {
    let request = StartRequest::new("bench", Parent::root(cwd), CancellationToken::new());
    let run = subagents.start(provider, request).await.unwrap();
    run.result().await.unwrap();
    let began = Instant::now();
    run.dispose().await.unwrap();
    began.elapsed()
}

fn register(runtime: &Runtime, subagents: &Subagents, config: AcpConfig) {
    let provider = runtime.block_on(async move { AcpProvider::new(config).await.unwrap() });
    subagents.register_provider(provider).unwrap().keep();
}

fn acp_dispose(c: &mut Criterion) {
    let home = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("bench-acp-dispose-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    let runtime = Runtime::builder().home(&home).build().unwrap();
    let subagents = runtime.subagents();
    register(&runtime, &subagents, stand_ins::exits_at_eof(&home, "exits-at-eof"));
    register(&runtime, &subagents, stand_ins::ignores_eof(&home, "ignores-eof"));
    let args = vec!["acp".to_owned(), "--home".to_owned(), home.join("own").display().to_string()];
    register(&runtime, &subagents, AcpConfig::new("own", PathBuf::from(env!("CARGO_BIN_EXE_subagents")), args));
    let mut fixed = stand_ins::ignores_eof(&home, "fixed-grace");
    fixed.dispose_idle_eof_grace = fixed.dispose_eof_grace;
    register(&runtime, &subagents, fixed);

    let benched = [
        ("floor: dispose a finished stand-in that exits at EOF", "exits-at-eof"),
        ("dispose a finished `subagents acp` (exits at EOF)", "own"),
        ("dispose a finished stand-in that ignores EOF (default graces)", "ignores-eof"),
    ];
    let mut group = c.benchmark_group("acp_dispose");
    // Half a second an iteration for the EOF-ignoring agent: one each sample.
    group.sample_size(10).sampling_mode(SamplingMode::Flat);
    for (bench, provider) in benched {
        group.bench_function(bench, |b| {
            b.iter_custom(|iters| {
                let (subagents, home) = (subagents.clone(), home.clone());
                runtime.block_on(async move {
                    let mut disposing = Duration::ZERO;
                    for _ in 0..iters {
                        disposing += timed_dispose(&subagents, provider, &home).await;
                    }
                    support::record(provider, iters, disposing)
                })
            })
        });
    }
    group.finish();
    let (before, cwd) = (subagents.clone(), home.clone());
    let took = runtime.block_on(async move { timed_dispose(&before, "fixed-grace", &cwd).await });
    support::record("fixed-grace", 1, took);
    let report = runtime.shutdown_blocking();
    assert!(report.live_after.is_quiescent(), "the bench leaked: {:?}", report.live_after);
    let _ = std::fs::remove_dir_all(&home);
}

fn print_verdict() {
    let means = support::means();
    let mean = |name: &str| means.get(name).copied();
    println!("\nper-run dispose means after a finished run, in this run:");
    for (name, &value) in &means {
        println!("{name:<14} {:>10.2} ms", value * 1e3);
    }
    if let (Some(ignoring), Some(floor)) = (mean("ignores-eof"), mean("exits-at-eof")) {
        println!("ignoring EOF costs {:.1} ms over the floor", (ignoring - floor) * 1e3);
    }
    if let Some(ignoring) = mean("ignores-eof") {
        let verdict = if ignoring <= GOAL.as_secs_f64() { "met" } else { "MISSED" };
        println!("goal: an EOF-ignoring agent's dispose ≤ 1 s: {:.0} ms ({verdict})", ignoring * 1e3);
    }
}

support::bench_main! {
    config = support::configured(Duration::from_secs(1), Duration::from_secs(6));
    targets = acp_dispose;
    report = print_verdict;
}
