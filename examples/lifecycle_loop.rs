//! Runs mock lifecycles in a loop inside the runtime, for profilers
//! (`perf record`, `valgrind --tool=callgrind`).
//!
//! `cargo run --release --example lifecycle_loop -- 200000`

use std::time::Instant;

use subagents::providers::MockProvider;
use subagents::{CancellationToken, Parent, Runtime, StartRequest};

fn main() {
    let count: u64 = std::env::args().nth(1).and_then(|n| n.parse().ok()).unwrap_or(100_000);
    let runtime = Runtime::builder().workers(1).build().expect("runtime");
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("mock")).expect("register").keep();
    let elapsed = runtime.block_on(async move {
        let began = Instant::now();
        for _ in 0..count {
            let request = StartRequest::new("loop", Parent::root("/tmp"), CancellationToken::new());
            let run = subagents.start("mock", request).await.expect("start");
            run.result().await.expect("result");
            run.dispose().await.expect("dispose");
        }
        began.elapsed()
    });
    println!("{count} lifecycles, {:.2} µs each", elapsed.as_secs_f64() * 1e6 / count as f64);
    runtime.shutdown_blocking();
}
