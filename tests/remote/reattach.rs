//! Re-attach: a detached remote run outlives its caller for a bounded
//! time, and a later caller attaches to it by its id instead of starting
//! it again; `fanout --out` records its remote runs in `OUT.runs` and a
//! killed batch resumed with `--resume` re-attaches to them.
//!
//! "Ran once" is read off the workers' homes: every run a worker carries
//! out leaves one session file holding its prompt, and each task's prompt
//! is unique.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use subagents::providers::MockProvider;
use subagents::seam::{Capability, Category, Detached};
use subagents::{StartError, StopReason};

use super::support::{broker, provider, Look, Worker};
use crate::common::blocking::eventually;
use crate::common::request;
use crate::common::{runtime_at, Within, WAIT_LIMIT};

/// `subagents fanout TASKS --provider remote --out OUT`, with `extra` flags.
fn fanout(dir: &Path, url: &str, tasks: &Path, out: &Path, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_subagents"));
    command.arg("fanout").arg(tasks).args(["--provider", "remote", "--nats", url, "--home"]);
    command.arg(dir.join("caller")).arg("--out").arg(out).args(extra);
    command.env_remove("RUST_LOG").stdin(Stdio::null());
    command
}

/// Whole JSON lines of a file (a torn last line is left out).
fn lines_of(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().filter_map(|line| serde_json::from_str(line).ok()).collect()
}

fn runs_journal(out: &Path) -> PathBuf {
    PathBuf::from(format!("{}.runs", out.display()))
}

/// How many session files under the workers' homes hold each prompt.
fn executions(workers: &[&Worker], prompts: &[String]) -> HashMap<String, usize> {
    let mut counts: HashMap<String, usize> = prompts.iter().map(|p| (p.clone(), 0)).collect();
    for worker in workers {
        let store = subagents::agent::SessionStore::new(&worker.home);
        for id in store.ids().unwrap_or_default() {
            let events = store.read(&id).map(|(_, events)| events).unwrap_or_default();
            let text = serde_json::to_string(&events).unwrap();
            for prompt in prompts {
                // JSON-escaped in the file; the prompts hold no quote or backslash.
                if text.contains(&format!("\"{prompt}\"")) {
                    *counts.get_mut(prompt).unwrap() += 1;
                }
            }
        }
    }
    counts
}

#[test]
fn a_run_that_finished_while_its_caller_was_away_is_collected_by_attach_and_not_run_again() {
    let (_serial, dir, server) = broker();
    let look = Look::new(&server.url());
    let worker = Worker::start(dir.path(), &server.url(), "w1", &[]);
    // Longer than the lease TTL (2 s) and the worker's check after it: a
    // run that was not detached would be stopped `lease-expired`.
    let prompts: Vec<String> = (0..3).map(|n| format!("away {n} [delay:4000]")).collect();
    let tasks = dir.path().join("tasks.jsonl");
    let lines: Vec<String> = prompts.iter().map(|p| format!("{{\"prompt\": \"{p}\"}}\n")).collect();
    std::fs::write(&tasks, lines.concat()).unwrap();
    let out = dir.path().join("out.jsonl");
    let mut caller = fanout(dir.path(), &server.url(), &tasks, &out, &[])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(eventually(Duration::from_secs(10), || look.live("default") == 3), "the worker holds the 3 runs");
    caller.kill().unwrap();
    caller.wait().unwrap();
    let recorded = lines_of(&runs_journal(&out));
    assert_eq!(recorded.len(), 3, "each run was recorded before it started: {recorded:?}");
    let runs: Vec<String> = recorded.iter().map(|r| r["run"].as_str().unwrap().to_owned()).collect();
    let settled = |run: &str| look.state(run).is_some_and(|s| s["state"] == "settled");
    assert!(
        eventually(Duration::from_secs(15), || runs.iter().all(|run| settled(run))),
        "the runs finished with their caller gone"
    );
    assert!(lines_of(&out).is_empty(), "the killed caller wrote no result");

    let runtime = runtime_at(&dir.path().join("later"));
    let subagents = runtime.subagents();
    subagents.register_provider(provider(&server.url())).unwrap().keep();
    subagents.register_provider(MockProvider::new("mock")).unwrap().keep();
    let collected = runtime.within(WAIT_LIMIT, "attaching to the finished runs", {
        let (subagents, runs) = (subagents.clone(), runs.clone());
        async move {
            let mut collected = Vec::new();
            for run in runs {
                let attach = request("not sent again").with_detached(Detached::Attach(run.clone()));
                let attached = subagents.start("remote", attach).await.unwrap();
                let result = attached.result().await.unwrap();
                attached.dispose().await.unwrap();
                collected.push((run, attached.child_id().to_owned(), result));
            }
            collected
        }
    });
    for (run, child_id, result) in &collected {
        assert_eq!(result.stop_reason, StopReason::Completed, "{run}: {result:?}");
        assert!(result.text().starts_with("handled: away "), "{}", result.text());
        assert_eq!(child_id, &format!("remote:remote:{run}"));
    }
    let texts: Vec<String> = collected.iter().map(|(_, _, r)| r.text()).collect();
    for prompt in &prompts {
        assert!(texts.contains(&format!("handled: {prompt}")), "{texts:?}");
    }
    let counts = executions(&[&worker], &prompts);
    assert!(counts.values().all(|&n| n == 1), "each run was carried out once: {counts:?}");

    // A run the broker never stored is not attached to; a provider that
    // cannot detach refuses the start.
    let (unknown, refused) = runtime.within(WAIT_LIMIT, "an attach to an unknown run", {
        let subagents = subagents.clone();
        async move {
            let attach = request("x").with_detached(Detached::Attach("no-such-run".to_owned()));
            let unknown = subagents.start("remote", attach).await.map(|_| ()).unwrap_err();
            let detached = request("x").with_detached(Detached::Start("r1".to_owned()));
            let refused = subagents.start("mock", detached).await.map(|_| ()).unwrap_err();
            (unknown, refused)
        }
    });
    match &unknown {
        StartError::StartupFailed { diagnostic, .. } => assert_eq!(diagnostic.category, Category::RunUnknown),
        other => panic!("expected STARTUP_FAILED run-unknown, got {other:?}"),
    }
    assert_eq!(
        refused,
        StartError::UnsupportedCapability { provider: "mock".into(), capability: Capability::Detached }
    );
    assert_eq!(refused.code(), "UNSUPPORTED_CAPABILITY", "{refused}");
    assert!(refused.to_string().contains("\"detached\" capability"), "{refused}");
    runtime.shutdown_blocking();
}

#[test]
fn a_remote_fanout_killed_again_and_again_and_resumed_runs_every_task_exactly_once() {
    let (_serial, dir, server) = broker();
    let w1 = Worker::start(dir.path(), &server.url(), "w1", &["--concurrency", "16"]);
    let w2 = Worker::start(dir.path(), &server.url(), "w2", &["--concurrency", "16"]);
    let count = 400;
    // 200 to 600 ms each: with 32 slots, runs are in flight at any kill,
    // and the batch takes several seconds.
    let prompts: Vec<String> = (0..count).map(|n| format!("task {n} [delay:{}]", 200 + (n * 37) % 400)).collect();
    let tasks = dir.path().join("tasks.jsonl");
    let lines: Vec<String> = prompts.iter().map(|p| format!("{{\"prompt\": \"{p}\"}}\n")).collect();
    std::fs::write(&tasks, lines.concat()).unwrap();
    let out = dir.path().join("out.jsonl");
    // Moments to kill at, in ms after the start: fixed per run of the test
    // but spread, from the nanoseconds of the clock.
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() as u64;
    let mut kills = 0;
    for round in 0..5u64 {
        let mut command = fanout(dir.path(), &server.url(), &tasks, &out, &["--concurrency", "32"]);
        if round > 0 {
            command.arg("--resume");
        }
        let mut caller = command.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        let after = Duration::from_millis(300 + (seed.wrapping_mul(round + 7) >> 3) % 900);
        std::thread::sleep(after);
        if caller.try_wait().unwrap().is_none() {
            kills += 1;
        }
        caller.kill().unwrap();
        caller.wait().unwrap();
    }
    assert!(kills >= 3, "the batch was killed mid-way at least three times ({kills})");
    let output = crate::common::output_within(
        &mut fanout(dir.path(), &server.url(), &tasks, &out, &["--concurrency", "32", "--resume"]),
        WAIT_LIMIT,
        "the last resume",
    );
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let results = lines_of(&out);
    let mut seen: HashMap<String, usize> = HashMap::new();
    for line in &results {
        *seen.entry(line["id"].as_str().unwrap().to_owned()).or_default() += 1;
        assert_eq!(line["stop_reason"], "completed", "{line}");
    }
    assert_eq!(seen.len(), count as usize, "every task has its line");
    assert!(seen.values().all(|&n| n == 1), "no task has two lines: {seen:?}");
    let reattached = results.iter().filter(|line| line["reattached"] == true).count();
    assert!(reattached > 0, "some runs of a killed batch were attached to again");
    let counts = executions(&[&w1, &w2], &prompts);
    let twice: Vec<_> = counts.iter().filter(|(_, &n)| n != 1).collect();
    assert!(twice.is_empty(), "every task was carried out exactly once; not these: {twice:?}");
}

#[test]
fn a_recorded_run_the_broker_does_not_know_is_started_again_and_its_line_says_so() {
    let (_serial, dir, server) = broker();
    let _worker = Worker::start(dir.path(), &server.url(), "w1", &[]);
    let tasks = dir.path().join("tasks.jsonl");
    std::fs::write(&tasks, "{\"id\": \"t1\", \"prompt\": \"again\"}\n").unwrap();
    let out = dir.path().join("out.jsonl");
    // An earlier batch recorded a run the broker never stored (or forgot).
    let hash = {
        let probe = crate::common::output_within(
            &mut fanout(dir.path(), &server.url(), &tasks, &dir.path().join("probe.jsonl"), &[]),
            WAIT_LIMIT,
            "a probe batch for the task's hash",
        );
        assert!(probe.status.success());
        lines_of(&dir.path().join("probe.jsonl"))[0]["task_hash"].as_str().unwrap().to_owned()
    };
    let recorded = format!("{{\"id\":\"t1\",\"run\":\"gone-run\",\"task_hash\":\"{hash}\"}}\n");
    std::fs::write(runs_journal(&out), recorded).unwrap();
    std::fs::write(&out, "").unwrap();
    let output = crate::common::output_within(
        &mut fanout(dir.path(), &server.url(), &tasks, &out, &["--resume"]),
        WAIT_LIMIT,
        "the resumed batch",
    );
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let lines = lines_of(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["stop_reason"], "completed", "{}", lines[0]);
    assert_eq!(lines[0]["expired_run"], "gone-run", "{}", lines[0]);
    assert!(lines[0].get("reattached").is_none(), "{}", lines[0]);
    let runs = lines_of(&runs_journal(&out));
    assert_eq!(runs.len(), 2, "the new run was recorded after the old one: {runs:?}");
    assert_ne!(runs[1]["run"], "gone-run");
}

#[test]
fn a_killed_batchs_runs_wait_for_a_resume_only_their_detached_ttl_and_then_start_again() {
    let (_serial, dir, server) = broker();
    let look = Look::new(&server.url());
    let _worker = Worker::start(dir.path(), &server.url(), "w1", &[]);
    let tasks = dir.path().join("tasks.jsonl");
    std::fs::write(&tasks, "{\"prompt\": \"slow 0 [delay:8000]\"}\n{\"prompt\": \"slow 1 [delay:8000]\"}\n").unwrap();
    let out = dir.path().join("out.jsonl");
    let ttl = ["--detached-ttl", "1s"];
    let mut caller = fanout(dir.path(), &server.url(), &tasks, &out, &ttl)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(eventually(Duration::from_secs(10), || look.live("default") == 2), "the worker holds the 2 runs");
    caller.kill().unwrap();
    caller.wait().unwrap();
    let runs: Vec<String> =
        lines_of(&runs_journal(&out)).iter().map(|r| r["run"].as_str().unwrap().to_owned()).collect();
    assert_eq!(runs.len(), 2);
    // The lease lapses within 2 s, the runs then have 1 s: stopped long
    // before their 8 s would have run out.
    let stopped = |run: &str| {
        look.state(run).is_some_and(|s| {
            s["state"] == "settled"
                && s["result"]["stop_reason"] == "aborted"
                && s["result"]["diagnostic"]["category"] == "lease-expired"
        })
    };
    assert!(
        eventually(Duration::from_secs(6), || runs.iter().all(|run| stopped(run))),
        "runs without a caller were stopped after their detached TTL: {:?}",
        runs.iter().map(|run| look.state(run)).collect::<Vec<_>>()
    );
    let mut resume = ttl.to_vec();
    resume.push("--resume");
    let output = crate::common::output_within(
        &mut fanout(dir.path(), &server.url(), &tasks, &out, &resume),
        WAIT_LIMIT,
        "the resumed batch",
    );
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let lines = lines_of(&out);
    assert_eq!(lines.len(), 2, "{lines:?}");
    for line in &lines {
        assert_eq!(line["stop_reason"], "completed", "{line}");
        let expired = line["expired_run"].as_str().expect("the line names the run that expired");
        assert!(runs.iter().any(|run| run == expired), "{line}");
    }
}

#[test]
fn a_run_attached_to_by_a_second_caller_is_cancelled_through_the_new_handle() {
    let (_serial, dir, server) = broker();
    let look = Look::new(&server.url());
    let _worker = Worker::start(dir.path(), &server.url(), "w1", &[]);
    let runtime = runtime_at(&dir.path().join("caller"));
    let subagents = runtime.subagents();
    subagents.register_provider(provider(&server.url())).unwrap().keep();
    let mut second = super::support::config(&server.url());
    second.name = "second".to_owned();
    subagents.register_provider(subagents::providers::RemoteProvider::connect(second).unwrap()).unwrap().keep();
    let (first, attached) = runtime.within(WAIT_LIMIT, "a detached start, then an attach from another caller", {
        let subagents = subagents.clone();
        async move {
            let start = request("long [delay:60000]").with_detached(Detached::Start("shared-run".to_owned()));
            let first = subagents.start("remote", start).await.unwrap();
            let attach = request("long").with_detached(Detached::Attach("shared-run".to_owned()));
            let attached = subagents.start("second", attach).await.unwrap();
            (first, attached)
        }
    });
    assert!(eventually(Duration::from_secs(10), || look.live("default") == 1), "one run, on the worker");
    assert_eq!(attached.child_id(), "remote:second:shared-run");
    let (through_attach, through_first) = runtime.within(WAIT_LIMIT, "the cancel through the attached handle", {
        async move {
            attached.cancel();
            let through_attach = attached.result().await.unwrap();
            attached.dispose().await.unwrap();
            let through_first = first.result().await.unwrap();
            first.dispose().await.unwrap();
            (through_attach, through_first)
        }
    });
    assert_eq!(through_attach.stop_reason, StopReason::Aborted, "{through_attach:?}");
    assert_eq!(through_first.stop_reason, StopReason::Aborted, "the one run was stopped: {through_first:?}");
    assert!(eventually(Duration::from_secs(5), || look.live("default") == 0), "its child is gone");
    runtime.shutdown_blocking();
}
