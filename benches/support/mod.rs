//! What the benches (and the quick report) share: the actix floor's actor
//! and per-run totals gathered over every criterion sample.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use actix::prelude::*;
use criterion::Criterion;

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
