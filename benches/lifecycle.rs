//! One run's lifecycle (start → result → dispose) beside two floors measured
//! in the same run: a tokio task + oneshot reply, and a bare actix actor
//! start + one request + stop.
//!
//! The mock lifecycle is measured three ways: driven from inside the runtime
//! (`Runtime::block_on`, the caller on a worker arbiter), from a foreign
//! multi-thread tokio runtime one at a time, and from that foreign runtime
//! with 1,000 in flight. The spawn lifecycle (a fresh in-process child
//! whose scripted model answers at once) is measured inside the runtime
//! with its session persisted and in memory; the difference is the
//! per-run cost of persistence. Every routine runs inside a spawned task,
//! never on a `block_on`ed main thread. The closing table divides each mean
//! by the floors' means from the same process.

use std::time::{Duration, Instant};

mod support;

use criterion::{Criterion, Throughput};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use subagents::agent::ScriptedModel;
use subagents::providers::{InProcessProvider, MockProvider};
use subagents::{CancellationToken, Parent, Runtime, StartRequest, Subagents};

async fn lifecycle_on(subagents: &Subagents, provider: &str) {
    let request = StartRequest::new("bench", Parent::root("/tmp"), CancellationToken::new());
    let run = subagents.start(provider, request).await.unwrap();
    run.result().await.unwrap();
    run.dispose().await.unwrap();
}

async fn mock_lifecycle(subagents: &Subagents) {
    lifecycle_on(subagents, "mock").await
}

fn runtime(home: &Path) -> (Runtime, Subagents) {
    let runtime = Runtime::builder().home(home).build().unwrap();
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("mock")).unwrap().keep();
    let model = Arc::new(ScriptedModel::new());
    subagents.register_provider(InProcessProvider::spawn("spawn", model.clone())).unwrap().keep();
    subagents.register_provider(InProcessProvider::spawn("spawn-in-memory", model).in_memory()).unwrap().keep();
    (runtime, subagents)
}

fn lifecycle(c: &mut Criterion) {
    // Sessions go to the build's scratch directory: on the project's disk,
    // not a /tmp that may be a different (and differently fast) filesystem.
    let home: PathBuf = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("bench-home-{}", std::process::id()));
    let (runtime, subagents) = runtime(&home);
    let mut group = c.benchmark_group("lifecycle");

    group.bench_function("floor: tokio task + oneshot", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async move {
                let began = Instant::now();
                for i in 0..iters {
                    let (reply, answer) = tokio::sync::oneshot::channel();
                    tokio::spawn(async move {
                        let _ = reply.send(i);
                    });
                    answer.await.unwrap();
                }
                support::record("floor-tokio", iters, began.elapsed())
            })
        })
    });

    support::bench_actix_floor(&mut group, &runtime);

    group.bench_function("mock, inside the runtime", |b| {
        b.iter_custom(|iters| {
            let subagents = subagents.clone();
            runtime.block_on(async move {
                let began = Instant::now();
                for _ in 0..iters {
                    mock_lifecycle(&subagents).await;
                }
                support::record("mock-inside", iters, began.elapsed())
            })
        })
    });

    for (bench, provider, name) in [
        ("spawn, session persisted, inside the runtime", "spawn", "spawn-persisted"),
        ("spawn, session in memory, inside the runtime", "spawn-in-memory", "spawn-in-memory"),
    ] {
        group.bench_function(bench, |b| {
            b.iter_custom(|iters| {
                let subagents = subagents.clone();
                let elapsed = runtime.block_on(async move {
                    let began = Instant::now();
                    for _ in 0..iters {
                        lifecycle_on(&subagents, provider).await;
                    }
                    support::record(name, iters, began.elapsed())
                });
                support::clear_sessions(&home);
                elapsed
            })
        });
    }

    let foreign = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();

    group.bench_function("mock, foreign runtime, sequential", |b| {
        b.iter_custom(|iters| {
            let subagents = subagents.clone();
            let task = foreign.spawn(async move {
                let began = Instant::now();
                for _ in 0..iters {
                    mock_lifecycle(&subagents).await;
                }
                support::record("mock-foreign-sequential", iters, began.elapsed())
            });
            foreign.block_on(task).unwrap()
        })
    });

    const IN_FLIGHT: u64 = 1000;
    group.throughput(Throughput::Elements(IN_FLIGHT));
    group.sample_size(10);
    group.bench_function("mock, foreign runtime, 1,000 in flight", |b| {
        b.iter_custom(|iters| {
            let subagents = subagents.clone();
            let task = foreign.spawn(async move {
                let began = Instant::now();
                for _ in 0..iters {
                    let runs: Vec<_> = (0..IN_FLIGHT)
                        .map(|_| {
                            let subagents = subagents.clone();
                            tokio::spawn(async move { mock_lifecycle(&subagents).await })
                        })
                        .collect();
                    for run in runs {
                        run.await.unwrap();
                    }
                }
                support::record("mock-foreign-1000-in-flight", iters * IN_FLIGHT, began.elapsed())
            });
            foreign.block_on(task).unwrap()
        })
    });
    group.finish();
    let report = runtime.shutdown_blocking();
    assert!(report.live_after.is_quiescent(), "the bench leaked runs: {:?}", report.live_after);
    let _ = std::fs::remove_dir_all(&home);
}

/// Mean per run for each bench, and its ratio to each floor.
fn print_ratios() {
    let means = support::means();
    let mean = |name: &str| means.get(name).copied();
    let (Some(tokio_floor), Some(actix_floor)) = (mean("floor-tokio"), mean("floor-actix")) else {
        return;
    };
    println!("\nper-run means over every sample, with ratios to the floors measured in this run:");
    println!("{:<30} {:>12} {:>10} {:>10}", "bench", "mean", "÷ tokio", "÷ actix");
    for (name, &value) in &means {
        println!("{name:<30} {:>10.2}µs {:>9.1}× {:>9.1}×", value * 1e6, value / tokio_floor, value / actix_floor);
    }
    let goal = |what: &str, ratio: f64, bound: f64| {
        let verdict = if ratio <= bound { "met" } else { "MISSED" };
        println!("goal: {what} ≤ {bound}×: {ratio:.1}× ({verdict})");
    };
    if let Some(inside) = mean("mock-inside") {
        goal("mock inside the runtime ÷ actix floor", inside / actix_floor, 3.0);
        goal("mock inside the runtime ÷ actix floor (stretch)", inside / actix_floor, 2.0);
    }
    if let (Some(persisted), Some(in_memory)) = (mean("spawn-persisted"), mean("spawn-in-memory")) {
        println!("per-run cost of persisting a spawn session: {:.2}µs", (persisted - in_memory) * 1e6);
        goal("spawn, persisted ÷ actix floor", persisted / actix_floor, 25.0);
        goal("spawn, persisted ÷ spawn in memory", persisted / in_memory, 2.0);
    }
}

support::bench_main! {
    config = support::configured(Duration::from_secs(1), Duration::from_secs(3)).sample_size(30);
    targets = lifecycle;
    report = print_ratios;
}
