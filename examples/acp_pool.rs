//! A warm pool of ACP children: the same agent (this crate's own
//! `subagents acp`) cold and pooled, each run's time and agent process.
//!
//! `cargo build --bin subagents && cargo run --example acp_pool`

use std::path::PathBuf;
use std::time::Instant;

use subagents::providers::{AcpConfig, AcpProvider, PoolConfig, Reuse};
use subagents::{CancellationToken, Parent, Runtime, StartRequest};

/// The `subagents` binary beside this example's directory.
fn binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the example's own path");
    let bin = exe.parent().and_then(|dir| dir.parent()).expect("target/<profile>/examples").join("subagents");
    assert!(bin.is_file(), "run `cargo build --bin subagents` first (looked for {})", bin.display());
    bin
}

fn main() {
    let home = tempfile_home();
    let runtime = Runtime::builder().home(&home).build().unwrap();
    let subagents = runtime.subagents();
    let args = vec!["acp".to_owned(), "--home".to_owned(), home.join("agent").display().to_string()];
    let cold = AcpConfig::new("cold", binary(), args.clone());
    let mut pooled = AcpConfig::new("pooled", binary(), args);
    pooled.reuse = Reuse::Pooled(PoolConfig { size: 1, ..PoolConfig::default() });
    for config in [cold, pooled] {
        let provider = runtime.block_on(AcpProvider::new(config)).unwrap();
        subagents.register_provider(provider).unwrap().keep();
    }
    runtime.block_on(async move {
        for provider in ["cold", "cold", "pooled", "pooled", "pooled"] {
            let began = Instant::now();
            let request = StartRequest::new("say hello", Parent::root(std::env::temp_dir()), CancellationToken::new());
            let run = subagents.start(provider, request).await.unwrap();
            let answer = run.result().await.unwrap().text();
            run.dispose().await.unwrap();
            println!(
                "{provider:>6}: {answer:?} in {:.1} ms (session {})",
                began.elapsed().as_secs_f64() * 1e3,
                run.child_id()
            );
        }
    });
    let report = runtime.shutdown_blocking(); // drains the pool
    assert_eq!(report.live_after.processes, 0, "no agent process outlives the runtime");
    let _ = std::fs::remove_dir_all(&home);
}

fn tempfile_home() -> PathBuf {
    let home = std::env::temp_dir().join(format!("subagents-acp-pool-{}", std::process::id()));
    std::fs::create_dir_all(&home).unwrap();
    home
}
