//! A worker whose disk is full: it pauses on the first write the disk
//! refuses, says why with the OS's reason, and hands its runs back to the
//! pool rather than failing them; one started on a full disk refuses to
//! start.
//!
//! The disk is a 1 MiB tmpfs mounted for the test (root with
//! `CAP_SYS_ADMIN`; the test fails saying so without it) and unmounted
//! when the test ends, however it ends.

use std::time::Duration;

use subagents::seam::Category;

use super::support::{caller, category_of, one_at_a_time, worker_command, Server, Worker};
use crate::common::blocking::eventually;
use crate::common::small_disk::SmallDisk;
use crate::common::{output_within, Within, WAIT_LIMIT};

#[test]
fn a_worker_whose_disk_fills_pauses_with_the_os_reason_and_hands_its_runs_back() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let disk = SmallDisk::mount(1 << 20);
    let server = Server::start(dir.path());
    let full = Worker::start_at(dir.path(), &disk.join("home"), &server.url(), "full", &["--concurrency", "4"]);
    let refused = disk.fill();
    assert_eq!(refused.raw_os_error(), Some(libc::ENOSPC), "the ballast filled the disk: {refused}");
    let runtime = caller(dir.path(), &server);
    let subagents = runtime.subagents();
    let runs = runtime.within(WAIT_LIMIT, "12 runs to start", async move {
        let mut runs = Vec::new();
        for n in 0..12 {
            runs.push(subagents.start("remote", crate::common::request(&format!("task {n}"))).await.unwrap());
        }
        runs
    });
    // Only the full worker is there: it takes runs, cannot write their
    // sessions, and stops taking more.
    assert!(
        eventually(Duration::from_secs(30), || full.log().contains("stops taking runs")),
        "the worker paused: {}",
        full.log()
    );
    assert!(full.log().contains("No space left on device"), "it says why, with the OS's reason: {}", full.log());
    let _healthy = Worker::start(dir.path(), &server.url(), "healthy", &[]);
    let results = runtime.within(WAIT_LIMIT, "the 12 runs to settle", async move {
        let mut results = Vec::new();
        for run in runs {
            results.push(run.result().await.unwrap());
            // A run that completed on the full worker before it paused
            // reports its session not released (DISPOSE_FAILED): loud, not lost.
            let _ = run.dispose().await;
        }
        results
    });
    for result in &results {
        assert_eq!(result.stop_reason, subagents::StopReason::Completed, "no run fails for a full disk: {result:?}");
    }
    assert!(full.log().contains("handed back"), "the full worker handed its runs back: {}", full.log());
    // Space again: the worker takes runs again.
    disk.free();
    assert!(
        eventually(Duration::from_secs(20), || full.log().contains("can be written again")),
        "the worker resumed: {}",
        full.log()
    );
    runtime.shutdown_blocking();
}

#[test]
fn a_pool_whose_only_worker_has_a_full_disk_fails_its_runs_no_worker_in_time() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let disk = SmallDisk::mount(1 << 20);
    let server = Server::start(dir.path());
    let full = Worker::start_at(dir.path(), &disk.join("home"), &server.url(), "full", &[]);
    disk.fill();
    let mut config = super::support::config(&server.url());
    config.worker_patience = Duration::from_secs(3);
    let runtime = super::support::caller_with(dir.path(), config);
    let run_one = |prompt: &'static str| {
        let subagents = runtime.subagents();
        runtime.within(Duration::from_secs(60), "a run to settle", async move {
            let run = subagents.start("remote", crate::common::request(prompt)).await?;
            let result = run.result().await;
            let _ = run.dispose().await;
            result
        })
    };
    // The first run meets the full disk: handed back (then no worker takes
    // it), or completed with its session not kept; the worker pauses.
    let first = run_one("anyone with room?");
    let completed = matches!(&first, Ok(result) if result.stop_reason == subagents::StopReason::Completed);
    assert!(completed || category_of(&first) == Some(Category::NoWorker), "{first:?}");
    assert!(eventually(Duration::from_secs(20), || full.log().contains("stops taking runs")), "{}", full.log());
    assert!(full.log().contains("No space left on device"), "{}", full.log());
    // Paused and holding nothing, the worker is no worker for the pool:
    // the next run fails in time instead of waiting on it for ever.
    let began = std::time::Instant::now();
    // (Refused at once if the pool was known silent already.)
    let second = run_one("anyone at all?");
    assert_eq!(category_of(&second), Some(Category::NoWorker), "{second:?}");
    assert!(began.elapsed() < Duration::from_secs(30), "bounded by the worker patience: {:?}", began.elapsed());
    runtime.shutdown_blocking();
}

#[test]
fn a_worker_started_on_a_full_disk_refuses_to_start_naming_the_os_reason() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let disk = SmallDisk::mount(1 << 20);
    let server = Server::start(dir.path());
    let home = disk.join("home");
    // The home exists already (a worker ran here before the disk filled).
    std::fs::create_dir_all(home.join("sessions")).unwrap();
    let refused = disk.fill();
    assert_eq!(refused.raw_os_error(), Some(libc::ENOSPC), "the ballast filled the disk: {refused}");
    let output = output_within(
        &mut worker_command(dir.path(), &home, &server.url(), &[]),
        Duration::from_secs(30),
        "a worker on a full disk",
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert!(!stderr.contains("ready on pool"), "{stderr}");
}
