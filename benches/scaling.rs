//! How cost grows with work, beside the actix floor measured in the same
//! run: fan-out of N concurrent runs (mock N = 10 … 100,000; spawn up to
//! 1,000, in memory and with sessions on disk), cancelling N live runs until
//! all are quiescent, a lifecycle with 0, 1 and 100 event listeners, and a
//! mock lifecycle while another thread keeps the runtime creating 1,000
//! persisted spawn runs at a time. The closing table prints per-run cost and
//! runs/s for each N and each ratio to the floor, then the goals.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod support;

use criterion::{BenchmarkId, Criterion, Throughput};
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
    subagents.register_provider(InProcessProvider::spawn("spawn", instant.clone()).in_memory()).unwrap().keep();
    // Sessions on the build's disk (the project's filesystem), not a tmpfs.
    let sessions = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let persisted_home = sessions.path().to_path_buf();
    let persisted = Runtime::builder().home(&persisted_home).build().unwrap();
    let on_disk = persisted.subagents();
    on_disk.register_provider(InProcessProvider::spawn("spawn", instant.clone())).unwrap().keep();
    on_disk.register_provider(InProcessProvider::spawn("spawn-in-memory", instant).in_memory()).unwrap().keep();
    on_disk.register_provider(MockProvider::new("mock")).unwrap().keep();

    let mut group = c.benchmark_group("scaling");
    group.sample_size(10);
    support::bench_actix_floor(&mut group, &runtime);
    for (provider, sizes) in [("mock", &[10usize, 100, 1_000, 10_000, 100_000][..]), ("spawn", &[10, 100, 1_000][..])] {
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
                        join_all(runs.iter().map(|run| async move { drop(run.result().await) })).await;
                        join_all(runs.iter().map(|run| async move { drop(run.dispose().await) })).await;
                        total += began.elapsed();
                    }
                    support::record(format!("cancel {n:>5}"), iters * n as u64, total)
                })
            })
        });
    }
    group.throughput(Throughput::Elements(10_000));
    group.bench_function("floor: actix cancel storm 10,000", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async move {
                // Timed from the cancel on, as the runs' storm is.
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let per_actor_us = support::actix_cancel_storm(10_000).await;
                    total += Duration::from_secs_f64(per_actor_us * 10_000.0 / 1e6);
                }
                support::record("floor-actix-storm", iters * 10_000, total)
            })
        })
    });
    group.throughput(Throughput::Elements(1_000));
    for (name, provider) in [("persisted", "spawn"), ("in memory", "spawn-in-memory")] {
        group.bench_function(format!("fan-out 1,000 spawn, {name}"), |b| {
            b.iter_custom(|iters| {
                let subagents = on_disk.clone();
                let began = Instant::now();
                persisted.block_on(async move {
                    for _ in 0..iters {
                        fan_out(&subagents, provider, 1_000).await;
                    }
                });
                let elapsed = began.elapsed();
                support::clear_sessions(&persisted_home);
                support::record(format!("spawn 1000 {name}"), iters * 1_000, elapsed)
            })
        });
    }
    group.throughput(Throughput::Elements(1));
    for (name, load) in [("idle", None), ("creating 1,000 persisted spawns", Some("spawn"))] {
        let stop = Arc::new(AtomicBool::new(false));
        let loader = load.map(|provider| {
            let (subagents, stop) = (on_disk.clone(), stop.clone());
            std::thread::spawn(move || {
                let foreign = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                while !stop.load(Ordering::Relaxed) {
                    foreign.block_on(fan_out(&subagents, provider, 1_000));
                }
            })
        });
        group.bench_function(format!("mock lifecycle, runtime {name}"), |b| {
            b.iter_custom(|iters| {
                let subagents = on_disk.clone();
                persisted.block_on(async move {
                    let began = Instant::now();
                    for _ in 0..iters {
                        fan_out(&subagents, "mock", 1).await;
                    }
                    support::record(format!("mock, {name}"), iters, began.elapsed())
                })
            })
        });
        stop.store(true, Ordering::Relaxed);
        if let Some(loader) = loader {
            loader.join().unwrap();
        }
        support::clear_sessions(&persisted_home);
    }
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
    assert!(persisted.shutdown_blocking().live_after.is_quiescent());
}

fn print_table() {
    let means = support::means();
    let mean = |name: &str| means.get(name).copied();
    let Some(floor) = mean("floor-actix") else { return };
    println!("\nper-run cost with ratios to the actix floor ({:.2} µs) measured in this run:", floor * 1e6);
    for (name, &value) in &means {
        println!("{name:<22} {:>9.2} µs {:>7.1}× {:>10.0} runs/s", value * 1e6, value / floor, 1.0 / value);
    }
    let goal = |what: &str, ratio: f64, bound: f64| {
        let verdict = if ratio <= bound { "met" } else { "MISSED" };
        println!("goal: {what} ≤ {bound}×: {ratio:.2}× ({verdict})");
    };
    if let Some(small) = mean("fan-out mock    10") {
        for large in ["fan-out mock 10000", "fan-out mock 100000"] {
            if let Some(large_mean) = mean(large) {
                goal(&format!("{large} per run ÷ N = 10"), large_mean / small, 1.5);
            }
        }
    }
    if let (Some(on_disk), Some(in_memory)) = (mean("spawn 1000 persisted"), mean("spawn 1000 in memory")) {
        goal("fan-out of 1,000 spawn runs, persisted ÷ in memory", on_disk / in_memory, 2.0);
    }
    if let (Some(loaded), Some(idle)) = (mean("mock, creating 1,000 persisted spawns"), mean("mock, idle")) {
        goal("mock lifecycle while creating 1,000 persisted spawns ÷ idle", loaded / idle, 1.5);
    }
    if let (Some(cancel), Some(floor)) = (mean("cancel 10000"), mean("floor-actix")) {
        goal("cancel 10,000 to quiescence ÷ actix floor", cancel / floor, 3.0);
    }
    if let (Some(cancel), Some(storm)) = (mean("cancel 10000"), mean("floor-actix-storm")) {
        goal("cancel 10,000 to quiescence ÷ actix cancel storm of 10,000", cancel / storm, 3.0);
    }
    if let (Some(one), Some(none)) = (mean("listeners   1"), mean("listeners   0")) {
        goal("mock lifecycle with one listener ÷ none", one / none, 1.25);
    }
}

support::bench_main! {
    config = support::configured(Duration::from_millis(500), Duration::from_secs(2));
    targets = scaling;
    report = print_table;
}
