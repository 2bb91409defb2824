//! Fault drills: a killed worker, a worker killed on every delivery, a
//! frozen worker, a dead caller, a broker restart.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use subagents::{Category, RunResult, StopReason};

use crate::common::runtime_at;
use crate::request;
use crate::support::{one_at_a_time, provider, wait_until, wire_id, Look, Server, Worker};

/// Starts every prompt on `remote`, returns `(run id, result)` per prompt
/// after disposing each, in order.
fn run_all(runtime: &subagents::Runtime, prompts: Vec<String>) -> Vec<(String, RunResult)> {
    let subagents = runtime.subagents();
    runtime.block_on(async move {
        let runs = prompts.into_iter().map(|prompt| {
            let subagents = subagents.clone();
            async move {
                let run = subagents.start("remote", request(&prompt)).await.unwrap();
                let result = run.result().await.unwrap();
                run.dispose().await.unwrap();
                (run.id().to_owned(), result)
            }
        });
        futures_util::future::join_all(runs).await
    })
}

#[test]
fn a_killed_worker_s_runs_are_redelivered_and_each_of_200_settles_once() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut workers: Vec<Worker> =
        ["w1", "w2", "w3"].iter().map(|name| Worker::start(dir.path(), &server.url(), name, &[])).collect();
    let runtime = runtime_at(&dir.path().join("caller"));
    runtime.subagents().register_provider(provider(&server.url())).unwrap().keep();
    // Kill w1 while it holds runs.
    let victim = workers[0].pid();
    let look = Look::new(&server.url());
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(700));
        // SAFETY: kill(2) on a child of this test that is reaped later.
        unsafe { libc::kill(victim, libc::SIGKILL) };
    });
    let prompts = (0..200).map(|n| format!("task {n} [delay:400]")).collect();
    let began = Instant::now();
    let results = run_all(&runtime, prompts);
    killer.join().unwrap();
    workers[0].kill();
    let mut runs = HashSet::new();
    let mut sessions = HashSet::new();
    for (n, (id, result)) in results.iter().enumerate() {
        assert_eq!(result.stop_reason, StopReason::Completed, "{id}: {result:?}");
        assert_eq!(result.text(), format!("handled: task {n} [delay:400]"));
        assert!(runs.insert(id.clone()), "one run per task");
        assert!(sessions.insert(result.child_session.clone().unwrap()), "one result per run");
    }
    let redelivered = results
        .iter()
        .filter(|(id, _)| look.state(wire_id(id)).is_some_and(|state| state["attempt"].as_u64().unwrap() > 1))
        .count();
    assert!(redelivered > 0, "the killed worker held runs that were redelivered");
    assert!(began.elapsed() < Duration::from_secs(30), "took {:?}", began.elapsed());
    assert_eq!(look.live("default"), 0);
    runtime.shutdown_blocking();
}

#[test]
fn a_run_whose_every_worker_dies_settles_worker_lost_after_max_deliver() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let look = Look::new(&server.url());
    // The first worker creates the consumer with `--max-deliver 3`.
    let mut first = Worker::start(dir.path(), &server.url(), "w1", &[]);
    let runtime = runtime_at(&dir.path().join("caller"));
    let subagents = runtime.subagents();
    subagents.register_provider(provider(&server.url())).unwrap().keep();
    let run = runtime
        .block_on({
            let subagents = subagents.clone();
            async move { subagents.start("remote", request("hold on [delay:60000]")).await }
        })
        .unwrap();
    assert!(wait_until(Duration::from_secs(5), || look.live("default") == 1), "w1 took the run");
    first.kill();
    for name in ["w2", "w3"] {
        let mut worker = Worker::start(dir.path(), &server.url(), name, &[]);
        assert!(wait_until(Duration::from_secs(5), || look.live("default") == 1), "{name} took the redelivery");
        worker.kill();
    }
    // JetStream notices the exhausted run when a worker next asks for
    // work, and tells the caller; that worker never runs it.
    let late = Worker::start(dir.path(), &server.url(), "w4", &[]);
    let began = Instant::now();
    let result = runtime.block_on(async move {
        let result = tokio::time::timeout(Duration::from_secs(10), run.result()).await;
        let disposed = run.dispose().await;
        (result, disposed)
    });
    let (result, disposed) = result;
    let result = result.expect("settles, not a hang").unwrap();
    assert_eq!(result.stop_reason, StopReason::Error);
    assert_eq!(result.diagnostic.as_ref().unwrap().category, Category::WorkerLost);
    assert_eq!(serde_json::to_value(Category::WorkerLost).unwrap(), "worker-lost");
    assert!(disposed.is_ok(), "{disposed:?}");
    assert!(began.elapsed() < Duration::from_secs(5), "took {:?}", began.elapsed());
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(late.sessions(), 0);
    assert_eq!(look.live("default"), 0);
    runtime.shutdown_blocking();
}
