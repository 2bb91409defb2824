//! docs/contract.md §7.10, §11.6 distributed fan-out: the `remote` provider and `subagents
//! worker`, against a real `nats-server -js` and real worker processes.
//!
//! This file holds the everyday path and what crosses the wire; `remote/`
//! holds the fault drills (`faults`: killed, frozen and lost workers, a
//! broker restart, a dead caller), cancellation (`cancel`) and the bounds
//! on what is waited for (`bounds`: partitions, a broker gone, no worker,
//! a worker's home that cannot be written; `full_disk`: a worker's disk
//! that fills), re-attach to detached runs
//! (`reattach`: a killed and resumed `fanout`). Each test
//! starts its own server on a free loopback port and stops it; the tests
//! run one at a time (`support::one_at_a_time`).

#[path = "remote/approvals.rs"]
mod approvals;
#[path = "remote/bounds.rs"]
mod bounds;
#[path = "remote/cancel.rs"]
mod cancel;
#[path = "remote/faults.rs"]
mod faults;
#[path = "remote/fleet_limits.rs"]
mod fleet_limits;
#[path = "remote/full_disk.rs"]
mod full_disk;
#[path = "remote/reattach.rs"]
mod reattach;
#[path = "remote/support.rs"]
pub(crate) mod support;

use crate::common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::blocking::eventually;
use common::{request, runtime_at, Within, WAIT_LIMIT};
use serde_json::Value;
use subagents::seam::{ProgressUpdate, RunUsage};
use subagents::{CancellationToken, Parent, StartRequest, StopReason, SubagentEvent};
use support::{broker, caller, one_at_a_time, provider, wire_id, Look, Server, Worker};

#[test]
fn two_workers_share_fifty_runs_and_each_settles_once_with_its_worker_session() {
    let (_serial, dir, server) = broker();
    let workers =
        [Worker::start(dir.path(), &server.url(), "w1", &[]), Worker::start(dir.path(), &server.url(), "w2", &[])];
    let runtime = caller(dir.path(), &server);
    let subagents = runtime.subagents();
    let progress: Arc<Mutex<Vec<ProgressUpdate>>> = Arc::default();
    let _listener = subagents.add_listener({
        let progress = progress.clone();
        move |event| {
            if let SubagentEvent::Progress(update) = event {
                progress.lock().unwrap().push(update.update.clone());
            }
        }
    });
    let results = runtime.within(WAIT_LIMIT, "50 remote runs on two workers to settle", {
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
                    (n, run.child_id().to_owned(), result)
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
    // A copy: the listener may still be handed a late update, and must not
    // wait on a guard held through the runtime's shutdown (which waits for
    // the events thread).
    let progress = progress.lock().unwrap().clone();
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
    let (_serial, dir, server) = broker();
    let _worker = Worker::start(dir.path(), &server.url(), "w1", &[]);
    let tasks = dir.path().join("tasks.jsonl");
    std::fs::write(&tasks, "{\"prompt\": \"one\"}\n{\"prompt\": \"two\", \"label\": \"second\"}\n").unwrap();
    let fanout = |url: &str| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"));
        command.arg("fanout").arg(&tasks).args(["--provider", "remote", "--nats", url, "--home"]);
        command.arg(dir.path().join("caller")).env_remove("RUST_LOG");
        common::output_within(&mut command, WAIT_LIMIT, "fanout on the remote provider")
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
    let runtime = caller(dir.path(), &server);
    let subagents = runtime.subagents();
    server.kill();
    let started = std::time::Instant::now();
    let error = runtime
        .within(WAIT_LIMIT, "a start against a killed broker to fail", {
            let subagents = subagents.clone();
            async move { subagents.start("remote", request("secret task text")).await }
        })
        .unwrap_err();
    assert_eq!(error.code(), "STARTUP_FAILED");
    assert!(!error.to_string().contains("secret"), "{error}");
    assert!(started.elapsed() < Duration::from_secs(15), "bounded by the publish timeout");
    runtime.shutdown_blocking();
}

#[test]
fn start_time_features_cross_the_wire_and_the_worker_enforces_them() {
    use subagents::agent::SessionStore;
    use subagents::seam::{Capabilities, ToolFilter};
    let (_serial, dir, server) = broker();
    let worker = Worker::start(dir.path(), &server.url(), "w1", &[]);
    let runtime = caller(dir.path(), &server);
    let subagents = runtime.subagents();
    // A provider that says its workers enforce only the route refuses the rest.
    let mut narrow = support::config(&server.url());
    narrow.name = "narrow".to_owned();
    narrow.capabilities = Capabilities { agent_options: true, ..Capabilities::none() };
    subagents.register_provider(subagents::providers::RemoteProvider::connect(narrow).unwrap()).unwrap().keep();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"verdict": {"type": "string", "enum": ["ok", "bad"]}},
        "required": ["verdict"]
    });
    // A child at depth 3 is at the workers' delegation cap (3): the depth
    // crossed the wire if it does not delegate.
    let deep = Parent::root("/tmp").with_session("parent-7").with_depth(2);
    let requests = vec![
        request("judge it").with_output_schema(schema),
        request("say hi").with_persona("You are terse."),
        request("list the files here").with_tool_filter(ToolFilter::deny(["list_dir"])),
        request("list the files here"),
        StartRequest::new("check a; check b", deep, CancellationToken::new()).with_max_depth(3),
        request("check a; check b"),
    ];
    let (results, refused, too_deep) = runtime.within(WAIT_LIMIT, "the depth, filter and schema runs to settle", {
        let subagents = subagents.clone();
        async move {
            let mut results = Vec::new();
            for request in requests {
                let run = subagents.start("remote", request).await.unwrap();
                results.push(run.result().await.unwrap());
                run.dispose().await.unwrap();
            }
            let refused = subagents.start("narrow", request("x").with_persona("terse")).await.unwrap_err();
            let beyond = StartRequest::new("x", Parent::root("/tmp").with_depth(3), CancellationToken::new());
            let too_deep = subagents.start("remote", beyond.with_max_depth(2)).await.unwrap_err();
            (results, refused, too_deep)
        }
    });
    assert!(results.iter().all(|r| r.stop_reason == StopReason::Completed), "{results:?}");
    let store = SessionStore::new(&worker.home);
    let header = |n: usize| store.read(results[n].child_session.as_ref().unwrap()).unwrap().0;
    assert_eq!(results[0].structured, Some(serde_json::json!({"verdict": "ok"})));
    assert_eq!(header(1).persona.as_deref(), Some("You are terse."));
    assert_eq!(results[2].text(), "handled: list the files here", "list_dir was filtered out");
    assert_ne!(results[3].text(), results[2].text(), "without the filter the child lists the directory");
    let capped = header(4);
    assert_eq!((capped.depth, capped.parent_session.as_deref()), (3, Some("parent-7")));
    assert_eq!(results[4].text(), "handled: check a; check b", "at its depth cap the child cannot delegate");
    assert!(results[5].text().contains("- handled: check a"), "uncapped it delegates: {}", results[5].text());
    assert_eq!(refused.code(), "UNSUPPORTED_CAPABILITY");
    assert!(refused.to_string().contains("persona"), "{refused}");
    assert_eq!(too_deep.code(), "INVALID_REQUEST");
    runtime.shutdown_blocking();
}

#[test]
fn a_process_worker_isolates_each_run_and_refuses_loudly_what_it_cannot_enforce() {
    let (_serial, dir, server) = broker();
    let _worker = Worker::start(dir.path(), &server.url(), "iso", &["--provider", "process", "--pool", "isolated"]);
    let runtime = runtime_at(&dir.path().join("caller"));
    let subagents = runtime.subagents();
    // Misconfigured on purpose: it claims every capability for this pool.
    let config = support::config(&server.url()).with_pool("isolated");
    subagents.register_provider(subagents::providers::RemoteProvider::connect(config).unwrap()).unwrap().keep();
    let (plain, persona) = runtime.within(WAIT_LIMIT, "the isolated pool's plain and persona runs", {
        let subagents = subagents.clone();
        async move {
            let mut results = Vec::new();
            for request in [request("summarise the log"), request("say hi").with_persona("terse")] {
                let run = subagents.start("remote", request).await.unwrap();
                results.push(run.result().await.unwrap());
                run.dispose().await.unwrap();
            }
            (results.remove(0), results.remove(0))
        }
    });
    assert_eq!((plain.stop_reason, plain.text()), (StopReason::Completed, "handled: summarise the log".to_owned()));
    assert!(plain.child_session.is_some());
    assert_eq!(persona.stop_reason, StopReason::Error);
    let diagnostic = persona.diagnostic.unwrap();
    assert_eq!(diagnostic.stage_name(), "initialize");
    assert!(diagnostic.reason.unwrap().contains("does not support the \"persona\" capability"));
    common::no_process_mentions(&dir.path().join("iso/children"));
    runtime.shutdown_blocking();
}

#[test]
fn malformed_and_oversized_messages_are_dropped_and_nothing_crashes() {
    let (_serial, dir, server) = broker();
    let worker = Worker::start(dir.path(), &server.url(), "w1", &[]);
    let runtime = runtime_at(&dir.path().join("caller"));
    let subagents = runtime.subagents();
    let remote = provider(&server.url());
    let caller = remote.caller_id().to_owned();
    subagents.register_provider(remote).unwrap().keep();
    let look = Look::new(&server.url());
    let garbage: Vec<Vec<u8>> = vec![
        b"not json".to_vec(),
        b"{\"v\": 99, \"run\": \"x\"}".to_vec(),
        b"{\"v\": 1}".to_vec(),
        b"{\"v\": 1, \"run\": \"bad.id\", \"caller\": \"c\", \"prompt\": [], \"parent\": {\"depth\": 0}}".to_vec(),
        vec![b'x'; 900 * 1024],
    ];
    for bytes in &garbage {
        look.publish_durable("subagents.run.default", bytes.clone());
        for subject in
            ["subagents.cancel.x", &format!("subagents.result.{caller}"), &format!("subagents.progress.{caller}")]
        {
            look.publish(subject, bytes.clone());
        }
    }
    let result = runtime.within(WAIT_LIMIT, "a run after the malformed messages", {
        let subagents = subagents.clone();
        async move {
            let run = subagents.start("remote", request("still standing")).await.unwrap();
            let result = run.result().await.unwrap();
            run.dispose().await.unwrap();
            result
        }
    });
    assert_eq!(result.text(), "handled: still standing");
    let log = worker.log();
    assert!(log.contains("dropped a malformed run request"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
    let status = look.status("default");
    assert_eq!(status.len(), 1, "the worker still answers: {status:?}");
    assert_eq!(status[0]["live"], 0, "and holds nothing");
    runtime.shutdown_blocking();
}

#[test]
fn sigterm_drains_a_worker_its_live_run_finishes_and_it_exits_zero() {
    let (_serial, dir, server) = broker();
    let look = Look::new(&server.url());
    let mut worker = Worker::start(dir.path(), &server.url(), "w1", &[]);
    let runtime = caller(dir.path(), &server);
    let subagents = runtime.subagents();
    let (quick, slow) = runtime.within(WAIT_LIMIT, "the quick and slow runs to start", {
        let subagents = subagents.clone();
        async move {
            let quick = subagents.start("remote", request("finish [delay:500]")).await.unwrap();
            let slow = subagents.start("remote", request("too long [delay:60000]")).await.unwrap();
            (quick, slow)
        }
    });
    assert!(eventually(Duration::from_secs(5), || look.live("default") == 2));
    // The drain grace (2 s) lets the quick run finish and hands the slow one back.
    let status = worker.terminate(Duration::from_secs(10)).expect("the worker exits after draining");
    assert!(status.success(), "{status:?}: {}", worker.log());
    assert!(worker.log().contains("1 results written, 1 handed back"), "{}", worker.log());
    let replacement = Worker::start(dir.path(), &server.url(), "w2", &[]);
    assert!(eventually(Duration::from_secs(5), || look.live("default") == 1), "the slow run was handed on");
    let (quick_result, slow_result) =
        runtime.within(WAIT_LIMIT, "the quick and the handed-on slow run to settle", async move {
            let quick_result = quick.result().await.unwrap();
            slow.cancel();
            let slow_result = slow.result().await.unwrap();
            quick.dispose().await.unwrap();
            slow.dispose().await.unwrap();
            (quick_result, slow_result)
        });
    assert_eq!(quick_result.stop_reason, StopReason::Completed);
    assert_eq!(slow_result.stop_reason, StopReason::Aborted);
    assert_eq!(replacement.sessions(), 1);
    runtime.shutdown_blocking();
}

#[test]
fn a_remote_child_inherits_what_is_left_of_its_budget() {
    let (_serial, dir, server) = broker();
    let _worker = Worker::start(dir.path(), &server.url(), "w1", &[]);
    let runtime = caller(dir.path(), &server);
    let subagents = runtime.subagents();
    // The remote child takes one of the three runs; the worker lets it
    // start two more below it, and refuses the third part.
    let budget = subagents::Budget::new().with_runs(3).with_depth(2);
    let request = request("check a; check b; check c").with_budget(budget);
    let result = common::lifecycle(&runtime, &subagents, "remote", request);
    assert_eq!(result.stop_reason, StopReason::Completed, "{result:?}");
    let text = result.text();
    assert_eq!(text.matches("- handled: check").count(), 2, "two of three parts ran: {text}");
    assert_eq!(text.matches("BUDGET_EXHAUSTED").count(), 1, "the third was refused: {text}");
}

#[test]
fn a_worker_runs_its_runs_on_a_provider_of_its_configuration_file() {
    let (_serial, dir, server) = broker();
    let file = dir.path().join("worker.toml");
    std::fs::write(&file, "[providers.cheap]\nkind = \"spawn\"\n\n[providers.echo]\nkind = \"mock\"\nreply = \"echoed: \"\necho_prompt = true\n").unwrap();
    let config = file.display().to_string();
    let _worker = Worker::start(dir.path(), &server.url(), "w1", &["--config", &config, "--provider", "echo"]);
    let runtime = caller(dir.path(), &server);
    let subagents = runtime.subagents();
    let result = runtime.within(WAIT_LIMIT, "a remote run on the configured provider", {
        let subagents = subagents.clone();
        async move {
            let run = subagents.start("remote", request("through the file")).await.unwrap();
            let result = run.result().await.unwrap();
            run.dispose().await.unwrap();
            result
        }
    });
    assert_eq!(result.stop_reason, StopReason::Completed, "{result:?}");
    assert_eq!(result.text(), "echoed: through the file");
    runtime.shutdown_blocking();
    // A provider the file does not define: refused before the worker starts.
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args(["worker", "--nats", &server.url(), "--config", &config, "--provider", "nope"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("unknown provider \"nope\""));
}

/// The conformance kit (`subagents::testing`) over the remote provider:
/// a local broker, one worker of our binary on the demo model, and a
/// fresh connection per scenario (each scenario's shutdown closes one).
#[test]
fn the_remote_provider_passes_the_conformance_kit() {
    use subagents::testing::{conformance, Verdict};
    let (_serial, dir, server) = broker();
    let _worker = Worker::start(dir.path(), &server.url(), "w1", &[]);
    let url = server.url();
    let report =
        conformance(move || provider(&url)).long_prompt("Say hello. [delay:5000]").concurrent_runs(4).run_blocking();
    report.assert_conformant();
    assert_eq!(report.with_verdict(Verdict::NotExercised).count(), 0, "{report}");
}

/// One task file's result lines under `fanout --provider PROVIDER` (with
/// `extra` flags), as written to its `--out`.
fn fanout_lines(dir: &std::path::Path, provider: &str, tasks: &std::path::Path, extra: &[&str]) -> Vec<Value> {
    let out = dir.join(format!("{provider}.jsonl"));
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .arg("fanout")
        .arg(tasks)
        .args(["--provider", provider, "--concurrency", "8", "--out"])
        .arg(&out)
        .arg("--home")
        .arg(dir.join(format!("{provider}-home")))
        .args(extra)
        .env_remove("RUST_LOG")
        .env_remove("SUBAGENTS_HOME")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "fanout on {provider}: {status}");
    let text = std::fs::read_to_string(&out).unwrap();
    text.lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

/// What a batch's lines say it spent: each task's `tree_usage`, by label.
fn tree_usage_by_label(lines: &[Value]) -> std::collections::BTreeMap<String, RunUsage> {
    lines
        .iter()
        .map(|line| {
            let label = line["label"].as_str().unwrap().to_owned();
            (label, serde_json::from_value::<RunUsage>(line["tree_usage"].clone()).unwrap())
        })
        .collect()
}

#[test]
fn one_task_file_spends_the_same_on_spawn_process_and_remote() {
    let (_serial, dir, server) = broker();
    // A third of the tasks answer alone; the others delegate two or three checks.
    let tasks = dir.path().join("tasks.jsonl");
    let lines: Vec<String> = (0..12)
        .map(|n| {
            let prompt = match n % 3 {
                0 => format!("check a{n}; check b{n}"),
                1 => format!("check a{n}; check b{n}; check c{n}"),
                _ => format!("task {n}: summarise the notes"),
            };
            serde_json::json!({"prompt": prompt, "label": format!("task {n}")}).to_string()
        })
        .collect();
    std::fs::write(&tasks, lines.join("\n")).unwrap();
    let config = dir.path().join("process.toml");
    std::fs::write(&config, "[providers.process]\nkind = \"process\"\n").unwrap();
    let _workers =
        [Worker::start(dir.path(), &server.url(), "w1", &[]), Worker::start(dir.path(), &server.url(), "w2", &[])];
    let spawn = fanout_lines(dir.path(), "spawn", &tasks, &[]);
    let process = fanout_lines(dir.path(), "process", &tasks, &["--config", config.to_str().unwrap()]);
    let remote = fanout_lines(dir.path(), "remote", &tasks, &["--nats", &server.url()]);

    // The scripted model answers alike wherever it runs: the waits differ.
    let spent = |lines: &[Value]| {
        let mut usage = tree_usage_by_label(lines);
        usage.values_mut().for_each(|usage| usage.limit_wait_ms = 0);
        usage
    };
    let on_spawn = spent(&spawn);
    assert_eq!(on_spawn.len(), 12, "{spawn:?}");
    assert!(on_spawn.values().any(|usage| usage.model_calls > 1), "some task delegates: {on_spawn:?}");
    assert_eq!(spent(&process), on_spawn, "process spends what spawn spends");
    assert_eq!(spent(&remote), on_spawn, "remote spends what spawn spends");
    let total = |usage: std::collections::BTreeMap<String, RunUsage>| usage.into_values().sum::<RunUsage>();
    assert_eq!(total(spent(&remote)), total(on_spawn));
}
