//! Runs lifecycles in a loop inside the runtime, for profilers
//! (`perf record`, `valgrind --tool=callgrind`).
//!
//! `cargo run --release --example lifecycle_loop -- [COUNT] [mock|spawn|spawn-in-memory]`

use std::sync::Arc;
use std::time::Instant;

use subagents::agent::ScriptedModel;
use subagents::providers::{InProcessProvider, MockProvider};
use subagents::{CancellationToken, Parent, Runtime, StartRequest};

fn main() {
    let mut args = std::env::args().skip(1);
    let count: u64 = args.next().and_then(|n| n.parse().ok()).unwrap_or(100_000);
    let provider = args.next().unwrap_or_else(|| "mock".to_owned());
    let home = std::env::temp_dir().join(format!("subagents-loop-{}", std::process::id()));
    let runtime = Runtime::builder().workers(1).home(&home).build().expect("runtime");
    let subagents = runtime.subagents();
    let model = Arc::new(ScriptedModel::new());
    subagents.register_provider(MockProvider::new("mock")).expect("register").keep();
    subagents.register_provider(InProcessProvider::spawn("spawn", model.clone())).expect("register").keep();
    subagents
        .register_provider(InProcessProvider::spawn("spawn-in-memory", model).in_memory())
        .expect("register")
        .keep();
    let elapsed = runtime.block_on(async move {
        let began = Instant::now();
        for _ in 0..count {
            let request = StartRequest::new("loop", Parent::root("/tmp"), CancellationToken::new());
            let run = subagents.start(&provider, request).await.expect("start");
            run.result().await.expect("result");
            run.dispose().await.expect("dispose");
        }
        began.elapsed()
    });
    println!("{count} lifecycles, {:.2} µs each", elapsed.as_secs_f64() * 1e6 / count as f64);
    runtime.shutdown_blocking();
    let _ = std::fs::remove_dir_all(home);
}
