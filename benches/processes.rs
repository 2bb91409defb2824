//! Out-of-process children: an ACP child's and a `process` child's start →
//! result → dispose, beside the floor of spawning the same binary with
//! `--version` and waiting for it, all in one run. The closing lines print
//! each mean and its ratio to that floor.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod support;

use criterion::{criterion_group, Criterion};
use subagents::providers::{AcpConfig, AcpProvider, ProcessConfig, ProcessProvider};
use subagents::{CancellationToken, Parent, Runtime, StartRequest, Subagents};

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_subagents"))
}

async fn lifecycle(subagents: &Subagents, provider: &str, cwd: &Path) {
    let request = StartRequest::new("bench", Parent::root(cwd), CancellationToken::new());
    let run = subagents.start(provider, request).await.unwrap();
    run.result().await.unwrap();
    run.dispose().await.unwrap();
}

fn processes(c: &mut Criterion) {
    let home = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("bench-processes-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    let runtime = Runtime::builder().home(&home).build().unwrap();
    let subagents = runtime.subagents();
    let args = vec!["acp".to_owned(), "--home".to_owned(), home.join("acp").display().to_string()];
    let acp = runtime.block_on(async move { AcpProvider::new(AcpConfig::new("acp", binary(), args)).await.unwrap() });
    subagents.register_provider(acp).unwrap().keep();
    let mut process = ProcessConfig::new("process", home.join("process"));
    process.bin = binary();
    subagents.register_provider(ProcessProvider::new(process).unwrap()).unwrap().keep();

    let mut group = c.benchmark_group("processes");
    group.sample_size(10);
    group.bench_function("floor: spawn the binary with --version and wait", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async move {
                let began = Instant::now();
                for _ in 0..iters {
                    let status = tokio::process::Command::new(binary()).arg("--version").output().await.unwrap();
                    assert!(status.status.success());
                }
                support::record("floor-spawn", iters, began.elapsed())
            })
        })
    });
    for (bench, provider, name) in [
        ("acp child, start → result → dispose", "acp", "acp"),
        ("process child, start → result → dispose", "process", "process"),
    ] {
        group.bench_function(bench, |b| {
            b.iter_custom(|iters| {
                let (subagents, home) = (subagents.clone(), home.clone());
                runtime.block_on(async move {
                    let began = Instant::now();
                    for _ in 0..iters {
                        lifecycle(&subagents, provider, &home).await;
                    }
                    support::record(name, iters, began.elapsed())
                })
            })
        });
    }
    group.finish();
    let report = runtime.shutdown_blocking();
    assert!(report.live_after.is_quiescent(), "the bench leaked: {:?}", report.live_after);
    let _ = std::fs::remove_dir_all(&home);
}

fn print_ratios() {
    let means = support::means();
    let mean = |name: &str| means.get(name).copied();
    let Some(floor) = mean("floor-spawn") else { return };
    println!("\nper-run means, with ratios to spawning the binary with --version in this run:");
    for (name, &value) in &means {
        println!("{name:<14} {:>10.2} ms {:>7.1}×", value * 1e3, value / floor);
    }
    if let Some(acp) = mean("acp") {
        let ratio = acp / floor;
        let verdict = if ratio <= 3.0 { "met" } else { "MISSED" };
        println!("goal: acp lifecycle ≤ 3× the spawn floor: {ratio:.1}× ({verdict})");
    }
}

fn configured() -> Criterion {
    support::configured(Duration::from_secs(1), Duration::from_secs(4))
}

criterion_group! {
    name = benches;
    config = configured();
    targets = processes
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    print_ratios();
}
