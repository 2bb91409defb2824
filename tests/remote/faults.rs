//! Fault drills: a killed worker, a worker killed on every delivery, a
//! frozen worker, a dead caller, a broker restart.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use subagents::seam::Category;
use subagents::{RunResult, StopReason};

use super::support::{broker, caller, one_at_a_time, wire_id, Look, Server, Worker};
use crate::common::blocking::eventually;
use crate::common::request;
use crate::common::{Within, WAIT_LIMIT};

/// Starts every prompt on `remote`, returns `(run id, result)` per prompt
/// after disposing each, in order.
fn run_all(runtime: &subagents::Runtime, prompts: Vec<String>) -> Vec<(String, RunResult)> {
    let subagents = runtime.subagents();
    runtime.within(WAIT_LIMIT, "every run of the batch to settle and dispose", async move {
        let runs = prompts.into_iter().map(|prompt| {
            let subagents = subagents.clone();
            async move {
                let run = subagents.start("remote", request(&prompt)).await.unwrap();
                let result = run.result().await.unwrap();
                run.dispose().await.unwrap();
                (run.child_id().to_owned(), result)
            }
        });
        futures_util::future::join_all(runs).await
    })
}

#[test]
fn a_killed_worker_s_runs_are_redelivered_and_each_of_200_settles_once() {
    let (_serial, dir, server) = broker();
    let mut workers: Vec<Worker> =
        ["w1", "w2", "w3"].iter().map(|name| Worker::start(dir.path(), &server.url(), name, &[])).collect();
    let runtime = caller(dir.path(), &server);
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
    let (_serial, dir, server) = broker();
    let look = Look::new(&server.url());
    // The first worker creates the consumer with `--max-deliver 3`.
    let mut first = Worker::start(dir.path(), &server.url(), "w1", &[]);
    let runtime = caller(dir.path(), &server);
    let subagents = runtime.subagents();
    let run = runtime
        .within(WAIT_LIMIT, "a run on the dying workers to start", {
            let subagents = subagents.clone();
            async move { subagents.start("remote", request("hold on [delay:60000]")).await }
        })
        .unwrap();
    assert!(eventually(Duration::from_secs(5), || look.live("default") == 1), "w1 took the run");
    first.kill();
    for name in ["w2", "w3"] {
        let mut worker = Worker::start(dir.path(), &server.url(), name, &[]);
        assert!(eventually(Duration::from_secs(5), || look.live("default") == 1), "{name} took the redelivery");
        worker.kill();
    }
    // JetStream notices the exhausted run when a worker next asks for
    // work, and tells the caller; that worker never runs it.
    let late = Worker::start(dir.path(), &server.url(), "w4", &[]);
    let began = Instant::now();
    let result = runtime.within(WAIT_LIMIT, "the run whose workers all died to settle", async move {
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

#[test]
fn a_frozen_worker_is_fenced_out_and_cancels_its_child() {
    let (_serial, dir, server) = broker();
    let look = Look::new(&server.url());
    let frozen = Worker::start(dir.path(), &server.url(), "w1", &[]);
    let runtime = caller(dir.path(), &server);
    let subagents = runtime.subagents();
    let run = runtime
        .within(WAIT_LIMIT, "a run on the worker to be frozen to start", {
            let subagents = subagents.clone();
            async move { subagents.start("remote", request("think it over [delay:4000]")).await }
        })
        .unwrap();
    assert!(eventually(Duration::from_secs(5), || look.live("default") == 1), "w1 took the run");
    let _other = Worker::start(dir.path(), &server.url(), "w2", &[]);
    frozen.signal(libc::SIGSTOP);
    // Past the ack wait the run goes to w2 (w1 cannot answer the status
    // request while it is stopped).
    assert!(eventually(Duration::from_secs(5), || look.live("default") == 1), "w2 took the redelivery");
    let wire = wire_id(run.child_id()).to_owned();
    assert_eq!(look.state(&wire).unwrap()["attempt"], 2);
    frozen.signal(libc::SIGCONT);
    assert!(
        eventually(Duration::from_secs(3), || frozen.log().contains("its child was cancelled")),
        "the woken worker saw its claim superseded and cancelled its child: {}",
        frozen.log()
    );
    let result = runtime.within(WAIT_LIMIT, "the fenced run to settle on the other worker", async move {
        let result = tokio::time::timeout(Duration::from_secs(10), run.result()).await;
        run.dispose().await.unwrap();
        result
    });
    let result = result.expect("settles").unwrap();
    assert_eq!(result.stop_reason, StopReason::Completed);
    let state = look.state(&wire).unwrap();
    assert_eq!(state["attempt"], 2, "the one result is the redelivery's: {state}");
    assert!(!state["worker"].as_str().unwrap().is_empty());
    assert!(eventually(Duration::from_secs(2), || look.live("default") == 0), "the stale child is gone too");
    runtime.shutdown_blocking();
}

#[test]
fn workers_cancel_the_runs_of_a_caller_that_died_once_its_lease_expires() {
    let (_serial, dir, server) = broker();
    let look = Look::new(&server.url());
    let _worker = Worker::start(dir.path(), &server.url(), "w1", &[]);
    let tasks = dir.path().join("tasks.jsonl");
    std::fs::write(&tasks, "{\"prompt\": \"a [delay:60000]\"}\n".repeat(3)).unwrap();
    let mut caller = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .arg("fanout")
        .arg(&tasks)
        .args(["--provider", "remote", "--nats", &server.url(), "--home"])
        .arg(dir.path().join("caller"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(eventually(Duration::from_secs(10), || look.live("default") == 3), "the worker holds the 3 runs");
    caller.kill().unwrap();
    caller.wait().unwrap();
    let died = Instant::now();
    assert!(eventually(Duration::from_secs(6), || look.live("default") == 0), "the dead caller's runs were cancelled");
    let took = died.elapsed();
    // The lease lapses within its TTL of the last refresh; the worker
    // notices at its next check (a third of the ack wait).
    let bound = Duration::from_millis(super::support::LEASE_TTL_MS + super::support::ACK_WAIT_MS);
    assert!(took <= bound, "took {took:?}, bound {bound:?}");
    all_states_aborted(&look);
}

/// Every run state on the broker is settled `aborted`.
fn all_states_aborted(look: &Look) {
    let states = look.states();
    assert_eq!(states.len(), 3, "{states:?}");
    assert!(states.iter().all(|s| s["state"] == "settled" && s["result"]["stop_reason"] == "aborted"), "{states:?}");
}

#[test]
fn a_broker_restart_mid_batch_loses_no_run() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path());
    let _workers =
        [Worker::start(dir.path(), &server.url(), "w1", &[]), Worker::start(dir.path(), &server.url(), "w2", &[])];
    let runtime = caller(dir.path(), &server);
    let subagents = runtime.subagents();
    let runs = runtime.within(WAIT_LIMIT, "the batch to start before the broker restart", {
        let subagents = subagents.clone();
        async move {
            let starts = (0..20).map(|n| subagents.start("remote", request(&format!("job {n} [delay:1500]"))));
            futures_util::future::join_all(starts).await.into_iter().map(Result::unwrap).collect::<Vec<_>>()
        }
    });
    {
        let look = Look::new(&server.url());
        assert!(eventually(Duration::from_secs(5), || look.live("default") == 20), "all 20 live");
    }
    server.restart();
    let began = Instant::now();
    let results = runtime.within(WAIT_LIMIT, "the batch to settle after the broker restart", async move {
        let settle = runs.iter().map(|run| async move {
            let result = tokio::time::timeout(Duration::from_secs(30), run.result()).await;
            let disposed = run.dispose().await;
            (result, disposed)
        });
        futures_util::future::join_all(settle).await
    });
    for (n, (result, disposed)) in results.into_iter().enumerate() {
        let result = result.expect("settles after the restart").unwrap();
        assert_eq!(result.stop_reason, StopReason::Completed, "{result:?}");
        assert_eq!(result.text(), format!("handled: job {n} [delay:1500]"));
        assert!(disposed.is_ok(), "{disposed:?}");
    }
    assert!(began.elapsed() < Duration::from_secs(30), "took {:?}", began.elapsed());
    runtime.shutdown_blocking();
}
