//! Bounds on what a remote run waits for, and what is said meanwhile: a
//! caller cut off from the broker past its lease, a broker gone for good,
//! a pool with no worker, a worker stopped while the broker is down, a
//! worker whose home cannot be written.

use std::time::{Duration, Instant};

use super::support::{
    broker, caller, category_of, one_at_a_time, Look, Proxy, Server, Worker, ACK_WAIT_MS, LEASE_TTL_MS,
};
use crate::common::blocking::eventually;
use crate::common::WAIT_LIMIT;

/// `fanout TASKS --provider remote --nats URL` with `extra` flags, bounded.
fn fanout(dir: &std::path::Path, tasks: &str, url: &str, extra: &[&str]) -> std::process::Child {
    let file = dir.join("tasks.jsonl");
    std::fs::write(&file, tasks).unwrap();
    std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .arg("fanout")
        .arg(&file)
        .args(["--provider", "remote", "--nats", url, "--home"])
        .arg(dir.join("caller"))
        .args(extra)
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits (bounded) for a fanout started by [`fanout`]; its exit code,
/// result lines and stderr.
fn finish(child: std::process::Child, within: Duration) -> (Option<i32>, Vec<serde_json::Value>, String) {
    let pid = child.id() as i32;
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    let deadline = Instant::now() + within;
    while !waiter.is_finished() {
        if Instant::now() > deadline {
            // SAFETY: kill(2) on our own child, reaped by the waiter thread.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let output = waiter.join().unwrap();
            panic!("fanout ran past {within:?}; its stderr: {}", String::from_utf8_lossy(&output.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = waiter.join().unwrap();
    let lines = String::from_utf8_lossy(&output.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    (output.status.code(), lines, String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn a_caller_cut_off_past_its_lease_loses_only_its_runs_in_flight_says_why_and_runs_what_it_sends_after() {
    let (_serial, dir, server) = broker();
    let look = Look::new(&server.url());
    let _worker = Worker::start(dir.path(), &server.url(), "w1", &[]);
    let proxy = Proxy::start(server.port);
    // Two long runs go first; the three short ones start only after the
    // long ones settled, i.e. after the partition healed.
    let tasks =
        "{\"prompt\": \"long [delay:60000]\"}\n".repeat(2) + &"{\"prompt\": \"after the partition\"}\n".repeat(3);
    let caller = fanout(dir.path(), &tasks, &proxy.url(), &["--concurrency", "2"]);
    assert!(eventually(Duration::from_secs(20), || look.live("default") == 2), "the worker holds the two long runs");
    proxy.cut();
    // Past the lease TTL the worker stops the cut-off caller's runs.
    assert!(
        eventually(Duration::from_millis(LEASE_TTL_MS + 3 * ACK_WAIT_MS + 5000), || look.live("default") == 0),
        "the worker stopped the runs of the caller whose lease expired"
    );
    proxy.heal();
    let (code, lines, stderr) = finish(caller, WAIT_LIMIT);
    assert_eq!(lines.len(), 5, "{lines:?}\n{stderr}");
    let aborted: Vec<_> = lines.iter().filter(|l| l["stop_reason"] == "aborted").collect();
    assert_eq!(aborted.len(), 2, "only the runs in flight during the partition were lost: {lines:?}");
    for line in &aborted {
        assert_eq!(line["diagnostic"]["category"], "lease-expired", "{line}");
        assert!(line["diagnostic"]["reason"].as_str().unwrap().contains("lease"), "{line}");
    }
    let after: Vec<_> = lines.iter().filter(|l| l["output"] == "handled: after the partition").collect();
    assert_eq!(after.len(), 3, "the runs sent after the heal ran: {lines:?}");
    assert!(after.iter().all(|l| l["stop_reason"] == "completed"), "{lines:?}");
    assert_eq!(code, Some(1), "runs lost to the partition make the batch incomplete: {stderr}");
    assert!(stderr.contains("(not served)"), "{stderr}");
}

#[test]
fn fanout_fails_its_runs_with_the_cause_when_the_broker_is_gone_for_good() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path());
    let look = Look::new(&server.url());
    let _worker = Worker::start(dir.path(), &server.url(), "w1", &[]);
    let tasks = "{\"prompt\": \"long [delay:60000]\"}\n".repeat(2);
    let caller = fanout(dir.path(), &tasks, &server.url(), &["--broker-patience", "3s"]);
    assert!(eventually(Duration::from_secs(20), || look.live("default") == 2), "the worker holds both runs");
    drop(look);
    server.kill();
    let killed = Instant::now();
    let (code, lines, stderr) = finish(caller, Duration::from_secs(60));
    assert!(killed.elapsed() < Duration::from_secs(20), "bounded by the broker patience: {:?}", killed.elapsed());
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(lines.len(), 2, "{lines:?}");
    for line in &lines {
        assert_eq!(line["stop_reason"], "error", "{line}");
        assert_eq!(line["diagnostic"]["category"], "broker-unreachable", "{line}");
        assert!(line["diagnostic"]["reason"].as_str().unwrap().contains("broker_patience"), "{line}");
    }
    assert!(stderr.contains("has not answered for"), "a line says what the runs wait for: {stderr}");
}

#[test]
fn fanout_on_a_pool_with_no_worker_fails_after_the_worker_patience_or_the_budget_deadline() {
    let (_serial, dir, server) = broker();
    // The callers bucket's lease TTL comes from whoever creates it: a
    // worker that came and went.
    drop(Worker::start(dir.path(), &server.url(), "gone", &[]));
    let began = Instant::now();
    let caller = fanout(dir.path(), "{\"prompt\": \"anyone?\"}\n", &server.url(), &["--worker-patience", "6s"]);
    let (code, lines, stderr) = finish(caller, Duration::from_secs(60));
    assert!(began.elapsed() < Duration::from_secs(20), "bounded by the worker patience: {:?}", began.elapsed());
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["diagnostic"]["category"], "no-worker", "{lines:?}");
    assert!(lines[0]["diagnostic"]["reason"].as_str().unwrap().contains("pool \"default\""), "{lines:?}");
    assert!(stderr.contains("no worker of pool \"default\" has answered"), "{stderr}");

    // The batch's deadline bounds the wait as well, with the default patience.
    let began = Instant::now();
    let caller = fanout(dir.path(), "{\"prompt\": \"anyone?\"}\n", &server.url(), &["--budget-deadline", "3s"]);
    let (code, lines, stderr) = finish(caller, Duration::from_secs(60));
    assert!(began.elapsed() < Duration::from_secs(20), "bounded by the deadline: {:?}", began.elapsed());
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(lines[0]["stop_reason"], "aborted", "{lines:?}");
    assert_eq!(lines[0]["diagnostic"]["category"], "no-worker", "{lines:?}");
    assert!(lines[0]["diagnostic"]["reason"].as_str().unwrap().contains("deadline"), "{lines:?}");
}

#[test]
fn a_worker_stopped_while_the_broker_is_down_exits_within_its_drain_bound() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path());
    let look = Look::new(&server.url());
    let mut worker = Worker::start(dir.path(), &server.url(), "w1", &[]);
    let runtime = caller(dir.path(), &server);
    let _run = crate::common::Within::within(&runtime, WAIT_LIMIT, "a long run to start", {
        let subagents = runtime.subagents();
        async move { subagents.start("remote", crate::common::request("hold on [delay:60000]")).await.unwrap() }
    });
    assert!(eventually(Duration::from_secs(10), || look.live("default") == 1), "the worker holds the run");
    drop(look);
    server.kill();
    std::thread::sleep(Duration::from_millis(500));
    let stopped = Instant::now();
    // The drain grace (2 s), the hand-back bound (5 s), the last flush (2 s).
    let status = worker.terminate(Duration::from_secs(30));
    assert!(status.is_some(), "the worker exited within 30 s of SIGTERM: {}", worker.log());
    assert!(stopped.elapsed() < Duration::from_secs(15), "took {:?}: {}", stopped.elapsed(), worker.log());
    assert!(status.unwrap().success(), "{}", worker.log());
    drop(runtime);
}

#[test]
fn a_worker_that_cannot_write_its_home_stops_taking_runs_and_the_caller_hears_why() {
    let (_serial, dir, server) = broker();
    let broken = Worker::start(dir.path(), &server.url(), "w1", &["--concurrency", "2"]);
    // Root writes through any mode: a home whose sessions directory is now
    // a regular file cannot take a session file.
    let sessions = broken.home.join("sessions");
    std::fs::remove_dir_all(&sessions).unwrap();
    std::fs::write(&sessions, "not a directory").unwrap();
    let runtime = caller(dir.path(), &server);
    let run_all = |count: usize| {
        let subagents = runtime.subagents();
        crate::common::Within::within(&runtime, WAIT_LIMIT, "the runs to settle", async move {
            let runs = (0..count).map(|n| {
                let subagents = subagents.clone();
                async move {
                    let run = subagents.start("remote", crate::common::request(&format!("task {n}"))).await.unwrap();
                    let result = run.result().await.unwrap();
                    run.dispose().await.unwrap();
                    result
                }
            });
            futures_util::future::join_all(runs).await
        })
    };
    let failed = run_all(1).remove(0);
    assert_eq!(failed.stop_reason, subagents::StopReason::Error, "{failed:?}");
    let reason = failed.diagnostic.unwrap().reason.unwrap();
    assert!(reason.contains("cannot write its home") && reason.contains("os error"), "{reason}");
    assert!(broken.log().contains("stops taking runs"), "{}", broken.log());
    // A healthy worker joins: the broken one takes nothing more.
    let _healthy = Worker::start(dir.path(), &server.url(), "w2", &[]);
    let results = run_all(20);
    assert!(results.iter().all(|r| r.stop_reason == subagents::StopReason::Completed), "{results:?}");
    runtime.shutdown_blocking();
}

#[test]
fn under_cpu_load_every_result_of_300_runs_at_once_arrives_within_a_bound() {
    let (_serial, dir, server) = broker();
    let _workers =
        [Worker::start(dir.path(), &server.url(), "w1", &[]), Worker::start(dir.path(), &server.url(), "w2", &[])];
    let runtime = caller(dir.path(), &server);
    // Two busy threads beside the batch: the two cores are never idle.
    let hogging = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let hogs: Vec<_> = (0..2)
        .map(|_| {
            let hogging = hogging.clone();
            std::thread::spawn(move || while hogging.load(std::sync::atomic::Ordering::Relaxed) {})
        })
        .collect();
    let began = Instant::now();
    let subagents = runtime.subagents();
    let results =
        crate::common::Within::within(&runtime, Duration::from_secs(90), "300 loaded runs to settle", async move {
            let runs = (0..300).map(|n| {
                let subagents = subagents.clone();
                async move {
                    let run = subagents.start("remote", crate::common::request(&format!("load {n}"))).await.unwrap();
                    let result = run.result().await.unwrap();
                    run.dispose().await.unwrap();
                    result
                }
            });
            futures_util::future::join_all(runs).await
        });
    hogging.store(false, std::sync::atomic::Ordering::Relaxed);
    hogs.into_iter().for_each(|hog| hog.join().unwrap());
    assert_eq!(results.len(), 300);
    assert!(results.iter().all(|r| r.stop_reason == subagents::StopReason::Completed), "{results:?}");
    eprintln!("300 loaded runs settled in {:?}", began.elapsed());
    runtime.shutdown_blocking();
}

/// Starts `count` runs, `at_once` at a time, each detached (so each writes
/// its holder first, as `fanout --out` does); every start's error or
/// result, and how long they all took.
fn start_many(
    runtime: &subagents::Runtime,
    count: usize,
    at_once: usize,
    limit: Duration,
) -> (Vec<Result<subagents::RunResult, subagents::SubagentError>>, Duration) {
    use futures_util::StreamExt;
    // Run ids are never reused, not even across calls.
    static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let first = STARTED.fetch_add(count, std::sync::atomic::Ordering::Relaxed);
    let subagents = runtime.subagents();
    let began = Instant::now();
    let outcomes = crate::common::Within::within(runtime, limit, "every start to end", async move {
        let starts = (first..first + count).map(|n| {
            let subagents = subagents.clone();
            async move {
                let mut request = crate::common::request(&format!("task {n}"));
                request.detached = Some(subagents::seam::Detached::Start(format!("batch-{n}-{}", std::process::id())));
                let run = subagents.start("remote", request).await?;
                let result = run.result().await;
                let _ = run.dispose().await;
                result
            }
        });
        futures_util::stream::iter(starts).buffer_unordered(at_once).collect::<Vec<_>>().await
    });
    (outcomes, began.elapsed())
}

#[test]
fn starts_after_the_broker_is_known_unreachable_fail_at_once_and_a_broker_back_is_used_again() {
    use subagents::seam::Category;
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path());
    let _worker = Worker::start(dir.path(), &server.url(), "w1", &[]);
    let mut config = super::support::config(&server.url());
    config.broker_patience = Duration::from_secs(2);
    let runtime = crate::common::runtime_at(&dir.path().join("caller"));
    let provider = subagents::providers::RemoteProvider::connect(config).unwrap();
    runtime.subagents().register_provider(provider).unwrap().keep();
    server.kill();
    // 40 × broker_patience would be 80 s; each start on its own (a holder
    // written twice, a publish, a rollback) took 15 s, 150 s for the batch.
    let (outcomes, took) = start_many(&runtime, 40, 4, Duration::from_secs(40));
    assert!(took < Duration::from_secs(20), "40 starts against a dead broker took {took:?}");
    for outcome in &outcomes {
        assert_eq!(category_of(outcome), Some(Category::BrokerUnreachable), "{outcome:?}");
    }
    let refused_at_once = outcomes.iter().filter(|o| o.is_err()).count();
    assert!(refused_at_once >= 30, "the starts after the first wave are refused: {outcomes:?}");

    // The broker comes back: the provider notices, and starts run again.
    server.restart();
    let back = crate::common::blocking::eventually(Duration::from_secs(30), || {
        let (outcomes, _) = start_many(&runtime, 1, 1, WAIT_LIMIT);
        matches!(&outcomes[0], Ok(result) if result.stop_reason == subagents::StopReason::Completed)
    });
    assert!(back, "a start completes once the broker is back");
    runtime.shutdown_blocking();
}

#[test]
fn starts_through_an_unhealed_cut_fail_at_once_once_the_broker_patience_passed() {
    use subagents::seam::Category;
    let (_serial, dir, server) = broker();
    let proxy = Proxy::start(server.port);
    let mut config = super::support::config(&proxy.url());
    config.broker_patience = Duration::from_secs(2);
    let runtime = super::support::caller_with(dir.path(), config);
    proxy.cut();
    // 20 × broker_patience would be 40 s; each start on its own took 15 s.
    let (outcomes, took) = start_many(&runtime, 20, 4, Duration::from_secs(60));
    assert!(took < Duration::from_secs(15), "20 starts through a cut took {took:?}");
    for outcome in &outcomes {
        assert_eq!(category_of(outcome), Some(Category::BrokerUnreachable), "{outcome:?}");
    }
    runtime.shutdown_blocking();
}

#[test]
fn a_pool_known_empty_refuses_starts_at_once_until_a_worker_answers() {
    use subagents::seam::Category;
    let (_serial, dir, server) = broker();
    drop(Worker::start(dir.path(), &server.url(), "gone", &[]));
    let mut config = super::support::config(&server.url());
    config.worker_patience = Duration::from_secs(2);
    let runtime = super::support::caller_with(dir.path(), config);
    // The first wave waits for the pool once; the rest are refused at once.
    let (outcomes, took) = start_many(&runtime, 40, 4, Duration::from_secs(90));
    assert!(
        took < Duration::from_secs(15),
        "40 starts on an empty pool took {took:?} (10 waves × 2 s patience = 20 s)"
    );
    for outcome in &outcomes {
        assert_eq!(category_of(outcome), Some(Category::NoWorker), "{outcome:?}");
    }
    let refused = outcomes.iter().filter(|o| o.is_err()).count();
    assert!(refused >= 30, "the starts after the first wave are refused: {outcomes:?}");
    let Err(subagents::SubagentError::Start(subagents::StartError::StartupFailed { diagnostic, .. })) =
        outcomes.iter().find(|o| o.is_err()).unwrap()
    else {
        unreachable!()
    };
    let reason = diagnostic.reason.as_deref().unwrap_or_default();
    assert!(reason.contains("pool \"default\"") && reason.contains("worker_patience"), "{reason}");

    // A worker joins: the next starts run on it.
    let _worker = Worker::start(dir.path(), &server.url(), "w1", &[]);
    let back = crate::common::blocking::eventually(Duration::from_secs(30), || {
        let (outcomes, _) = start_many(&runtime, 1, 1, WAIT_LIMIT);
        matches!(&outcomes[0], Ok(result) if result.stop_reason == subagents::StopReason::Completed)
    });
    assert!(back, "a start completes once a worker answers");
    runtime.shutdown_blocking();
}

/// `count` lines of `prompt`, each with its own id.
fn tasks_of(count: usize, prompt: &str) -> String {
    (0..count).map(|n| format!("{{\"id\": \"t{n}\", \"prompt\": \"{prompt} {n}\"}}\n")).collect()
}

#[test]
fn fanout_with_out_against_a_broker_that_died_fails_its_remaining_starts_at_once() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path());
    drop(Worker::start(dir.path(), &server.url(), "gone", &[]));
    let out = dir.path().join("out.jsonl");
    let journal = dir.path().join("out.jsonl.runs");
    let out_flag = out.to_str().unwrap();
    let caller = fanout(
        dir.path(),
        &tasks_of(300, "never served"),
        &server.url(),
        &["--out", out_flag, "--broker-patience", "2s", "--concurrency", "8"],
    );
    // The batch is connected and starting runs: the broker dies.
    assert!(
        eventually(Duration::from_secs(30), || std::fs::metadata(&journal).is_ok_and(|m| m.len() > 0)),
        "the batch recorded a run"
    );
    server.kill();
    let killed = Instant::now();
    // 300 × broker_patience would be 600 s; each start on its own took
    // 15 s, 560 s for the batch at 8 at once.
    let (code, _, stderr) = finish(caller, Duration::from_secs(90));
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(45), "300 tasks against a dead broker took {took:?}: {stderr}");
    assert_eq!(code, Some(1), "{stderr}");
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(&out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 300, "every task has its line");
    for line in &lines {
        assert_eq!(line["diagnostic"]["category"], "broker-unreachable", "{line}");
        assert!(line["diagnostic"]["reason"].as_str().unwrap().contains("broker_patience"), "{line}");
    }
}

#[test]
fn fanout_on_an_empty_pool_waits_once_for_the_pool_not_once_per_wave() {
    let (_serial, dir, server) = broker();
    drop(Worker::start(dir.path(), &server.url(), "gone", &[]));
    let began = Instant::now();
    let caller =
        fanout(dir.path(), &tasks_of(48, "anyone"), &server.url(), &["--worker-patience", "3s", "--concurrency", "4"]);
    // Twelve waves of 4, each waiting its own 3 s, took 40 s and more.
    let (code, lines, stderr) = finish(caller, Duration::from_secs(90));
    let took = began.elapsed();
    assert!(took < Duration::from_secs(20), "48 tasks on an empty pool took {took:?}: {stderr}");
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(lines.len(), 48, "{lines:?}");
    for line in &lines {
        assert_eq!(line["diagnostic"]["category"], "no-worker", "{line}");
        assert!(line["diagnostic"]["reason"].as_str().unwrap().contains("worker_patience"), "{line}");
    }
}
