//! How cost grows with work, beside the actix floor measured in the same
//! run: fan-out of N concurrent runs (mock N = 10 … 10,000; spawn up to
//! 1,000), cancelling N live runs until all are quiescent, and a lifecycle
//! with 0, 1 and 100 event listeners. The closing table prints per-run cost
//! and runs/s for each N and each ratio to the floor.

use std::sync::Arc;
use std::time::{Duration, Instant};

mod support;

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use futures_util::future::join_all;
use subagents::agent::ScriptedModel;
use subagents::providers::{InProcessProvider, MockProvider};
use subagents::{CancellationToken, Parent, Runtime, StartRequest, Subagents};

fn request(signal: CancellationToken) -> StartRequest {
    StartRequest::new("bench", Parent::root(std::env::temp_dir()), signal)
}

/// Starts `n` runs at once, collects and disposes them.
async fn fan_out(subagents: &Subagents, provider: &str, n: usize) {
    let runs = join_all((0..n).map(|_| subagents.start(provider, request(CancellationToken::new())))).await;
    let runs: Vec<_> = runs.into_iter().map(Result::unwrap).collect();
    join_all(runs.iter().map(|run| run.result())).await;
    join_all(runs.iter().map(|run| run.dispose())).await;
}

fn scaling(c: &mut Criterion) {
    let home = tempfile::tempdir().unwrap();
    let runtime = Runtime::builder().home(home.path()).cancel_grace(Duration::from_secs(5)).build().unwrap();
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("mock")).unwrap().keep();
    subagents.register_provider(MockProvider::new("held").with_delay(Duration::from_secs(600))).unwrap().keep();
    let instant = Arc::new(ScriptedModel::new());
    subagents.register_provider(InProcessProvider::spawn("spawn", instant).in_memory()).unwrap().keep();

    let mut group = c.benchmark_group("scaling");
    group.sample_size(10);
    group.bench_function("floor: actix actor start + request + stop", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async move {
                let began = Instant::now();
                for _ in 0..iters {
                    support::actix_floor().await;
                }
                support::record("floor-actix", iters, began.elapsed())
            })
        })
    });
    for (provider, sizes) in [("mock", &[10usize, 100, 1_000, 10_000][..]), ("spawn", &[10, 100, 1_000][..])] {
        for &n in sizes {
            group.throughput(Throughput::Elements(n as u64));
            group.bench_with_input(BenchmarkId::new(format!("fan-out {provider}"), n), &n, |b, &n| {
                b.iter_custom(|iters| {
                    let subagents = subagents.clone();
                    runtime.block_on(async move {
                        let began = Instant::now();
                        for _ in 0..iters {
                            fan_out(&subagents, provider, n).await;
                        }
                        support::record(format!("fan-out {provider} {n:>5}"), iters * n as u64, began.elapsed())
                    })
                })
            });
        }
    }
    for n in [100usize, 1_000, 10_000] {
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::new("cancel to quiescence", n), &n, |b, &n| {
            b.iter_custom(|iters| {
                let subagents = subagents.clone();
                runtime.block_on(async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let tokens: Vec<_> = (0..n).map(|_| CancellationToken::new()).collect();
                        let runs = join_all(tokens.iter().map(|t| subagents.start("held", request(t.clone())))).await;
                        let runs: Vec<_> = runs.into_iter().map(Result::unwrap).collect();
                        let began = Instant::now();
                        tokens.iter().for_each(CancellationToken::cancel);
                        join_all(runs.iter().map(|run| run.result())).await;
                        join_all(runs.iter().map(|run| run.dispose())).await;
                        total += began.elapsed();
                    }
                    support::record(format!("cancel {n:>5}"), iters * n as u64, total)
                })
            })
        });
    }
    group.throughput(Throughput::Elements(1));
    for listeners in [0usize, 1, 100] {
        let handles: Vec<_> =
            (0..listeners).map(|_| subagents.add_listener(|_: &subagents::SubagentEvent| {})).collect();
        group.bench_with_input(BenchmarkId::new("mock lifecycle with listeners", listeners), &listeners, |b, _| {
            b.iter_custom(|iters| {
                let subagents = subagents.clone();
                runtime.block_on(async move {
                    let began = Instant::now();
                    for _ in 0..iters {
                        fan_out(&subagents, "mock", 1).await;
                    }
                    support::record(format!("listeners {listeners:>3}"), iters, began.elapsed())
                })
            })
        });
        drop(handles);
    }
    group.finish();
    assert!(runtime.shutdown_blocking().live_after.is_quiescent());
}

fn print_table() {
    let means = support::means();
    let mean = |name: &str| means.get(name).copied();
    let Some(floor) = mean("floor-actix") else { return };
    println!("\nper-run cost with ratios to the actix floor ({:.2} µs) measured in this run:", floor * 1e6);
    for (name, &value) in &means {
        println!("{name:<22} {:>9.2} µs {:>7.1}× {:>10.0} runs/s", value * 1e6, value / floor, 1.0 / value);
    }
    if let (Some(small), Some(large)) = (mean("fan-out mock    10"), mean("fan-out mock 10000")) {
        println!("fan-out per-run cost, N = 10,000 over N = 10: {:.2}× (goal ≤ 1.5×)", large / small);
    }
}

fn configured() -> Criterion {
    support::configured(Duration::from_millis(500), Duration::from_secs(2))
}

criterion_group! {
    name = benches;
    config = configured();
    targets = scaling
}

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    print_table();
}
