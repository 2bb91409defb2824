//! What the benches (and the quick report) share: the actix floor's actor
//! and per-run totals gathered over every criterion sample.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use actix::prelude::*;
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion};

/// Total (runs, time) per bench, over every sample criterion took.
static TOTALS: Mutex<BTreeMap<String, (u64, Duration)>> = Mutex::new(BTreeMap::new());

/// Adds one sample's runs and time to `name`'s total; returns `elapsed`.
pub fn record(name: impl Into<String>, runs: u64, elapsed: Duration) -> Duration {
    let mut totals = TOTALS.lock().unwrap();
    let entry = totals.entry(name.into()).or_default();
    entry.0 += runs;
    entry.1 += elapsed;
    elapsed
}

/// Every recorded name with its mean seconds per run, sorted by name.
pub fn means() -> BTreeMap<String, f64> {
    let totals = TOTALS.lock().unwrap();
    totals
        .iter()
        .filter(|(_, (runs, _))| *runs > 0)
        .map(|(name, (runs, time))| (name.clone(), time.as_secs_f64() / *runs as f64))
        .collect()
}

/// The actix floor's actor: started, asked once, stopped.
pub struct Echo;

impl Actor for Echo {
    type Context = Context<Self>;
}

/// The one request.
#[derive(Message)]
#[rtype(result = "u64")]
pub struct Ping(pub u64);

impl Handler<Ping> for Echo {
    type Result = u64;

    fn handle(&mut self, msg: Ping, ctx: &mut Context<Self>) -> u64 {
        ctx.stop();
        msg.0
    }
}

/// One actix floor iteration: start an actor, one request, stop.
pub async fn actix_floor() {
    Echo.start().send(Ping(1)).await.unwrap();
}

/// The actix floor's bench in `group`: an actor started, asked once and
/// stopped, `iters` times in a row on `runtime` (recorded as
/// `floor-actix`).
pub fn bench_actix_floor(group: &mut BenchmarkGroup<'_, WallTime>, runtime: &subagents::Runtime) {
    group.bench_function("floor: actix actor start + request + stop", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async move {
                let began = std::time::Instant::now();
                for _ in 0..iters {
                    actix_floor().await;
                }
                record("floor-actix", iters, began.elapsed())
            })
        })
    });
}

/// An actor of the cancel storm's floor: watches its token, stops when it
/// is cancelled, says so as it is dropped.
pub struct Watcher {
    token: Option<subagents::CancellationToken>,
    stopped: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Actor for Watcher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if let Some(token) = self.token.take() {
            ctx.spawn(token.cancelled_owned().into_actor(self).map(|(), _, ctx| ctx.stop()));
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if let Some(stopped) = self.stopped.take() {
            let _ = stopped.send(());
        }
    }
}

/// What actix itself pays in a cancel storm: `n` live actors (started and
/// polled once), each watching a child of its own token; every token
/// cancelled; microseconds per actor until the last one is dropped
/// (awaited outside tokio's cooperative budget, see [`actix_fan_out`]).
pub async fn actix_cancel_storm(n: usize) -> f64 {
    let tokens: Vec<subagents::CancellationToken> = (0..n).map(|_| subagents::CancellationToken::new()).collect();
    let stopped: Vec<_> = tokens
        .iter()
        .map(|token| {
            let (stopped, dropped) = tokio::sync::oneshot::channel();
            Watcher { token: Some(token.child_token()), stopped: Some(stopped) }.start();
            dropped
        })
        .collect();
    // Every actor's task runs once (it is queued before this one) and
    // registers its watcher.
    tokio::task::yield_now().await;
    let began = std::time::Instant::now();
    tokens.iter().for_each(subagents::CancellationToken::cancel);
    tokio::task::unconstrained(futures_util::future::join_all(stopped)).await;
    began.elapsed().as_secs_f64() * 1e6 / n as f64
}

/// The actix floor of a fan-out: `n` actors started at once, each asked
/// once (and stopping as it answers); microseconds per actor. Outside
/// tokio's cooperative budget, as the runtime's own start path is: inside
/// it, one task awaiting 100,000 replies re-polls most of them on every
/// wake-up (the budget is spent on the first 128), a cost that grows with
/// the square of the fan-out.
pub async fn actix_fan_out(n: usize) -> f64 {
    let began = std::time::Instant::now();
    let replies = futures_util::future::join_all((0..n).map(|i| Echo.start().send(Ping(i as u64))));
    tokio::task::unconstrained(replies).await;
    began.elapsed().as_secs_f64() * 1e6 / n as f64
}

/// Criterion with short warm-up and measurement, then the command line.
pub fn configured(warm_up: Duration, measurement: Duration) -> Criterion {
    Criterion::default().warm_up_time(warm_up).measurement_time(measurement).configure_from_args()
}

/// Empties the sessions directory between samples (outside the timing), so
/// every sample creates its files in a directory of the same size.
pub fn clear_sessions(home: &std::path::Path) {
    if let Ok(entries) = std::fs::read_dir(home.join("sessions")) {
        for entry in entries.flatten() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// A bench's `main`: its criterion group (`targets` under `config`), the
/// summary, then `report` (what it prints beside criterion: ratios, goals).
/// (The quick report, `examples/perf`, shares this module and has no use
/// for it.)
#[allow(unused_macros)]
macro_rules! bench_main {
    (config = $config:expr; targets = $targets:path; report = $report:path $(;)?) => {
        criterion::criterion_group! {
            name = benches;
            config = $config;
            targets = $targets
        }

        fn main() {
            benches();
            criterion::Criterion::default().configure_from_args().final_summary();
            $report();
        }
    };
}
#[allow(unused_imports)]
pub(crate) use bench_main;
