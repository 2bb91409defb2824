//! SPEC §11 distributed fan-out: the `remote` provider and `subagents
//! worker`, against a real `nats-server -js` and real worker processes.
//!
//! This file holds the everyday path and what crosses the wire; `remote/`
//! holds the fault drills (`faults`: killed, frozen and lost workers, a
//! broker restart, a dead caller) and cancellation (`cancel`). Each test
//! starts its own server on a free loopback port and stops it; the tests
//! run one at a time (`support::one_at_a_time`).

#[path = "remote/cancel.rs"]
mod cancel;
mod common;
#[path = "remote/faults.rs"]
mod faults;
#[path = "remote/support.rs"]
mod support;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::runtime_at;
use subagents::{CancellationToken, Parent, ProgressUpdate, StartRequest, StopReason, SubagentEvent};
use support::{one_at_a_time, provider, wire_id, Look, Server, Worker};

fn request(prompt: &str) -> StartRequest {
    StartRequest::new(prompt, Parent::root("/tmp"), CancellationToken::new())
}

#[test]
fn two_workers_share_fifty_runs_and_each_settles_once_with_its_worker_session() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let workers =
        [Worker::start(dir.path(), &server.url(), "w1", &[]), Worker::start(dir.path(), &server.url(), "w2", &[])];
    let runtime = runtime_at(&dir.path().join("caller"));
    let subagents = runtime.subagents();
    subagents.register_provider(provider(&server.url())).unwrap().keep();
    let progress: Arc<Mutex<Vec<ProgressUpdate>>> = Arc::default();
    let _listener = subagents.add_listener({
        let progress = progress.clone();
        move |event| {
            if let SubagentEvent::Progress(update) = event {
                progress.lock().unwrap().push(update.update.clone());
            }
        }
    });
    let results = runtime.block_on({
        let subagents = subagents.clone();
        async move {
            let runs = (0..50).map(|n| {
                let subagents = subagents.clone();
                async move {
                    // One nested task holds its children a while, so its
                    // tool-call progress arrives long before its result.
                    let prompt = if n == 0 { "check a [delay:300]; check b".to_owned() } else { format!("task {n}") };
                    let run = subagents.start("remote", request(&prompt)).await.unwrap();
                    let result = run.result().await.unwrap();
                    run.dispose().await.unwrap();
                    (n, run.id().to_owned(), result)
                }
            });
            futures_util::future::join_all(runs).await
        }
    });
    let mut sessions = HashSet::new();
    for (n, id, result) in &results {
        assert_eq!(result.stop_reason, StopReason::Completed, "{id}: {result:?}");
        if *n > 0 {
            assert_eq!(result.text(), format!("handled: task {n}"));
        }
        assert!(id.starts_with("remote:remote:"), "{id}");
        let session = result.child_session.clone().expect("the worker's child session comes back");
        assert!(sessions.insert(session), "each run ran once, in a session of its own");
    }
    assert!(results[0].2.text().contains("- handled: check a"), "{}", results[0].2.text());
    // Each worker took a share; every session file is one of the results'.
    let [w1, w2] = &workers;
    assert!(w1.sessions() > 0 && w2.sessions() > 0, "w1 {} w2 {}", w1.sessions(), w2.sessions());
    let on_disk: usize = workers.iter().map(Worker::sessions).sum();
    assert_eq!(on_disk, 50 + 2, "50 runs and the nested task's two children");
    let progress = progress.lock().unwrap();
    assert!(
        progress.iter().any(|update| matches!(update, ProgressUpdate::ToolCall { .. })),
        "tool-call progress crossed the wire: {progress:?}"
    );
    let look = Look::new(&server.url());
    assert_eq!(look.live("default"), 0);
    let state = look.state(wire_id(&results[1].1)).expect("the result is stored durably");
    assert_eq!(state["state"], "settled");
    assert_eq!(state["result"]["stop_reason"], "completed");
    runtime.shutdown_blocking();
}

#[test]
fn fanout_runs_a_tasks_file_on_workers_and_refuses_an_unreachable_broker() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let _worker = Worker::start(dir.path(), &server.url(), "w1", &[]);
    let tasks = dir.path().join("tasks.jsonl");
    std::fs::write(&tasks, "{\"prompt\": \"one\"}\n{\"prompt\": \"two\", \"label\": \"second\"}\n").unwrap();
    let fanout = |url: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
            .arg("fanout")
            .arg(&tasks)
            .args(["--provider", "remote", "--nats", url, "--home"])
            .arg(dir.path().join("caller"))
            .env_remove("RUST_LOG")
            .output()
            .unwrap()
    };
    let output = fanout(&server.url());
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let lines: Vec<serde_json::Value> =
        String::from_utf8_lossy(&output.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    assert!(lines.iter().all(|l| l["stop_reason"] == "completed" && l["child_session"].is_string()), "{lines:?}");
    let unreachable = format!("nats://127.0.0.1:{}", support::free_port_for_tests());
    let refused = fanout(&unreachable);
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("cannot reach the NATS server"), "{stderr}");
    assert!(refused.stdout.is_empty());
}

#[test]
fn a_start_while_the_broker_is_down_fails_startup_with_a_safe_diagnostic() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path());
    let runtime = runtime_at(&dir.path().join("caller"));
    let subagents = runtime.subagents();
    subagents.register_provider(provider(&server.url())).unwrap().keep();
    server.kill();
    let started = std::time::Instant::now();
    let error = runtime
        .block_on({
            let subagents = subagents.clone();
            async move { subagents.start("remote", request("secret task text")).await }
        })
        .unwrap_err();
    assert_eq!(error.code(), "STARTUP_FAILED");
    assert!(!error.to_string().contains("secret"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(15), "bounded by the publish timeout");
    runtime.shutdown_blocking();
}
