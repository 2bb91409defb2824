//! Cancellation across the wire: before pickup (the tombstone) and mid-run
//! (the notice), one run or a hundred at once.

use std::time::{Duration, Instant};

use subagents::StopReason;

use super::support::{broker, caller, caller_with, config, wire_id, Look, Worker};
use crate::common::blocking::eventually;
use crate::common::request;
use crate::common::{Within, WAIT_LIMIT};

#[test]
fn a_run_cancelled_before_any_worker_picked_it_up_never_runs() {
    let (_serial, dir, server) = broker();
    let look = Look::new(&server.url());
    let runtime = caller(dir.path(), &server);
    let subagents = runtime.subagents();
    // No worker yet: both runs wait in the queue. One is cancelled and kept,
    // the other cancelled and disposed.
    let (kept, kept_result, dropped_id, dispose_took) =
        runtime.within(WAIT_LIMIT, "two queued runs to be cancelled", {
            let subagents = subagents.clone();
            async move {
                let kept = subagents.start("remote", request("never [delay:100]")).await.unwrap();
                let dropped = subagents.start("remote", request("never either")).await.unwrap();
                kept.cancel();
                dropped.cancel();
                let kept_result = kept.result().await.unwrap();
                let began = Instant::now();
                dropped.dispose().await.unwrap();
                (kept, kept_result, dropped.child_id().to_owned(), began.elapsed())
            }
        });
    assert_eq!(kept_result.stop_reason, StopReason::Aborted);
    assert!(dispose_took < Duration::from_secs(2), "a run never claimed disposes at once: {dispose_took:?}");
    let worker = Worker::start(dir.path(), &server.url(), "w1", &[]);
    let kept_id = wire_id(kept.child_id()).to_owned();
    assert!(
        eventually(Duration::from_secs(5), || look.state(&kept_id).is_some_and(|s| s["state"] == "settled")),
        "the worker settles the tombstoned run"
    );
    let state = look.state(&kept_id).unwrap();
    assert_eq!(state["result"]["stop_reason"], "aborted");
    runtime.within(WAIT_LIMIT, "the kept cancelled run's dispose", async move { kept.dispose().await }).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(worker.sessions(), 0, "no child ever existed");
    assert!(look.state(wire_id(&dropped_id)).is_none(), "the disposed run was removed from the queue");
    runtime.shutdown_blocking();
}

#[test]
fn a_cancel_storm_of_100_remote_runs_aborts_them_all_and_leaves_no_child() {
    let (_serial, dir, server) = broker();
    let look = Look::new(&server.url());
    let workers = [
        Worker::start(dir.path(), &server.url(), "w1", &["--concurrency", "16"]),
        Worker::start(dir.path(), &server.url(), "w2", &["--concurrency", "16"]),
    ];
    let runtime = caller(dir.path(), &server);
    let subagents = runtime.subagents();
    let runs = runtime.within(WAIT_LIMIT, "100 remote runs to start", {
        let subagents = subagents.clone();
        async move {
            let starts = (0..100).map(|n| subagents.start("remote", request(&format!("wait {n} [delay:60000]"))));
            futures_util::future::join_all(starts).await.into_iter().map(Result::unwrap).collect::<Vec<_>>()
        }
    });
    // Both workers full (32 live), 68 still queued.
    assert!(eventually(Duration::from_secs(10), || look.live("default") == 32), "live: {}", look.live("default"));
    let began = Instant::now();
    let outcomes = runtime.within(WAIT_LIMIT, "100 cancelled remote runs to settle and dispose", async move {
        runs.iter().for_each(subagents::Run::cancel);
        let settle = runs.iter().map(|run| async move {
            let result = run.result().await.unwrap();
            (result, run.dispose().await)
        });
        futures_util::future::join_all(settle).await
    });
    let took = began.elapsed();
    for (result, disposed) in &outcomes {
        assert_eq!(result.stop_reason, StopReason::Aborted);
        assert!(disposed.is_ok(), "{disposed:?}");
    }
    assert!(took < Duration::from_secs(10), "the storm settled and disposed in {took:?}");
    assert_eq!(look.live("default"), 0, "no worker holds a child");
    let ran: usize = workers.iter().map(Worker::sessions).sum();
    assert_eq!(ran, 32, "the queued runs never started");
    runtime.shutdown_blocking();
}

#[test]
fn dispose_reports_a_vanished_worker_instead_of_waiting_for_it() {
    let (_serial, dir, server) = broker();
    let look = Look::new(&server.url());
    let mut worker = Worker::start(dir.path(), &server.url(), "w1", &[]);
    let runtime = caller(dir.path(), &server);
    let subagents = runtime.subagents();
    let run = runtime
        .within(WAIT_LIMIT, "a run on the doomed worker to start", {
            let subagents = subagents.clone();
            async move { subagents.start("remote", request("hold [delay:60000]")).await }
        })
        .unwrap();
    assert!(eventually(Duration::from_secs(5), || look.live("default") == 1));
    worker.kill();
    let began = Instant::now();
    let (result, disposed) = runtime.within(WAIT_LIMIT, "a vanished worker's run to settle and dispose", async move {
        run.cancel();
        let result = run.result().await.unwrap();
        (result, run.dispose().await)
    });
    assert_eq!(result.stop_reason, StopReason::Aborted);
    let error = disposed.unwrap_err();
    assert_eq!(error.code(), "DISPOSE_FAILED");
    assert!(error.to_string().contains("worker-lost"), "{error}");
    assert!(began.elapsed() < Duration::from_secs(6), "bounded by dispose_wait: {:?}", began.elapsed());
    runtime.shutdown_blocking();
}

#[test]
fn a_live_worker_slower_to_report_a_disposed_run_than_dispose_wait_is_waited_for_not_reported_lost() {
    let (_serial, dir, server) = broker();
    let look = Look::new(&server.url());
    // The worker's child ignores its cancel (a slow agent, a loaded
    // machine): the worker's runtime aborts it after its cancel grace
    // (500 ms), so the worker reports the run well after the caller's
    // cancel grace (300 ms) and dispose_wait (1 ms) are over.
    let file = dir.path().join("worker.toml");
    std::fs::write(
        &file,
        "[providers.held]\nkind = \"mock\"\ndelay = \"60s\"\n\n[providers.deaf]\nkind = \"chaos\"\nwraps = \"held\"\n\
         seed = 1\nfaults = [{ stage = \"run\", fault = \"hang\", probability = 1.0 }]\n",
    )
    .unwrap();
    let config_file = file.display().to_string();
    let _worker = Worker::start(dir.path(), &server.url(), "w1", &["--config", &config_file, "--provider", "deaf"]);
    let mut remote = config(&server.url());
    remote.dispose_wait = Duration::from_millis(1);
    let runtime = caller_with(dir.path(), remote);
    let subagents = runtime.subagents();
    let run = runtime
        .within(WAIT_LIMIT, "a run on the slow worker to start", {
            let subagents = subagents.clone();
            async move { subagents.start("remote", request("hold")).await }
        })
        .unwrap();
    assert!(eventually(Duration::from_secs(5), || look.live("default") == 1));
    let (disposed, result) = runtime.within(WAIT_LIMIT, "a run disposed mid-way on a slow worker", async move {
        let disposed = run.dispose().await;
        (disposed, run.result().await)
    });
    assert!(disposed.is_ok(), "a worker that still answers is slow, not lost: {disposed:?}");
    assert_eq!(result.unwrap().stop_reason, StopReason::Aborted);
    assert_eq!(look.live("default"), 0, "the worker released its child before it reported");
    runtime.shutdown_blocking();
}

#[test]
fn a_cancelled_remote_runs_receipt_lists_what_ran_under_it_on_the_worker() {
    let (_serial, dir, server) = broker();
    let worker = Worker::start(dir.path(), &server.url(), "w1", &[]);
    let runtime = caller(dir.path(), &server);
    let subagents = runtime.subagents();
    let run = runtime
        .within(WAIT_LIMIT, "the delegating remote run to start", {
            let subagents = subagents.clone();
            async move { subagents.start("remote", request("check a [slow]; check b [slow]")).await }
        })
        .unwrap();
    // The worker's run and its two slow children have sessions.
    assert!(eventually(Duration::from_secs(30), || worker.sessions() == 3), "the tree never ran");
    let receipt = runtime
        .within(WAIT_LIMIT, "the cancelled remote tree's receipt", async move { run.cancel_and_wait().await })
        .unwrap();
    assert_eq!((receipt.provider.as_str(), receipt.stop_reason), ("remote", StopReason::Aborted));
    assert!(receipt.is_complete(), "{receipt:#?}");
    // Under the remote run: the worker's local run, and its two children.
    let local = receipt.children[0].as_run().expect("the worker's run");
    assert_eq!(receipt.children.len(), 1, "{receipt:#?}");
    assert_eq!(local.stop_reason, StopReason::Aborted);
    assert_eq!(local.children.len(), 2, "{receipt:#?}");
    assert_eq!(receipt.stopped_descendants(), 3);
    assert!(runtime.live().is_quiescent());
    runtime.shutdown_blocking();
}
