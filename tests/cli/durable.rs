//! Long batches: results matched by task id in an `--out` file that
//! survives the batch's own SIGKILL, `--resume` running only what is left,
//! a changed line refused, `--retry` of transient failures and `--timeout`.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use super::{json_lines, run, subagents, text, write_file};

/// A mock provider slow enough that a kill lands mid-batch.
fn slow_mock_config(dir: &Path) -> PathBuf {
    write_file(
        dir,
        "slow.toml",
        "[providers.slow]\nkind = \"mock\"\nreply = \"done: \"\necho_prompt = true\ndelay = \"40ms\"\n",
    )
}

fn tasks(dir: &Path, n: usize, text: impl Fn(usize) -> String) -> PathBuf {
    let lines: Vec<String> = (0..n).map(|i| format!("{{\"prompt\": \"{}\"}}", text(i))).collect();
    write_file(dir, "tasks.jsonl", lines.join("\n") + "\n")
}

/// Each id of the results file with how many lines carry it.
fn ids_in(out: &Path) -> HashMap<String, usize> {
    let text = std::fs::read_to_string(out).unwrap_or_default();
    let mut ids = HashMap::new();
    for line in text.lines() {
        let record: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("a whole line: {e}: {line:?}"));
        *ids.entry(record["id"].as_str().unwrap().to_owned()).or_insert(0) += 1;
    }
    ids
}

/// Whole lines in the results file so far.
fn lines_in(out: &Path) -> usize {
    std::fs::read(out).map_or(0, |bytes| bytes.iter().filter(|&&b| b == b'\n').count())
}

/// Kills `fanout --resume` with SIGKILL at pseudo-random moments, then
/// lets it finish: every task's id is in the file exactly once.
fn kill_and_resume(dir: &Path, tasks: &Path, args: &[&str], n: usize) {
    let out = dir.join("out.jsonl");
    let mut seed = std::process::id() as u64;
    let fanout = || {
        let mut command = subagents();
        command.arg("fanout").arg(tasks).args(args).arg("--out").arg(&out).arg("--home").arg(dir.join("home"));
        if out.exists() {
            command.arg("--resume");
        }
        command
    };
    let mut killed_mid_batch = 0;
    for round in 0..5 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        // Killed once a pseudo-random number of further results is out
        // (or at once when the batch ends first).
        let target = ids_in(&out).len() + 1 + (seed >> 33) as usize % (n / 8);
        let mut child =
            fanout().stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while lines_in(&out) < target && std::time::Instant::now() < deadline {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        let ids = ids_in(&out);
        assert!(ids.values().all(|&lines| lines == 1), "round {round}: an id written twice: {ids:?}");
        killed_mid_batch += usize::from(!ids.is_empty() && ids.len() < n);
    }
    assert!(killed_mid_batch > 0, "no kill landed mid-batch: the drill proved nothing");
    let output = run(&mut fanout());
    assert!(output.status.success(), "{}", text(&output.stderr));
    let ids = ids_in(&out);
    assert_eq!(ids.len(), n, "every task, once");
    assert!(ids.values().all(|&lines| lines == 1));
    // A finished batch resumed runs nothing.
    let output = run(&mut fanout());
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    let skipped = stderr.lines().find(|line| line.contains("(done before, skipped)")).unwrap_or_default();
    assert!(skipped.trim_end().ends_with(&format!(" {n}")), "{stderr}");
    assert_eq!(ids_in(&out).len(), n);
}

#[test]
fn a_batch_killed_again_and_again_and_resumed_runs_every_mock_task_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = slow_mock_config(dir.path());
    let tasks = tasks(dir.path(), 2000, |i| format!("task {i}"));
    let config = config.display().to_string();
    kill_and_resume(dir.path(), &tasks, &["--config", &config, "--provider", "slow", "--concurrency", "50"], 2000);
}

#[test]
fn a_batch_killed_again_and_again_and_resumed_runs_every_spawn_task_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = tasks(dir.path(), 600, |i| format!("task {i} [delay:30]"));
    kill_and_resume(dir.path(), &tasks, &["--provider", "spawn", "--concurrency", "20"], 600);
}

#[test]
fn ids_come_from_the_line_a_changed_line_is_refused_and_failed_ones_rerun_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = write_file(
        dir.path(),
        "tasks.jsonl",
        "{\"id\": \"first\", \"prompt\": \"one\"}\n{\"prompt\": \"two [fail]\"}\n{\"id\": \"first\", \"prompt\": \"again\"}\n",
    );
    let out = dir.path().join("out.jsonl");
    let fanout = |extra: &[&str]| {
        run(subagents()
            .arg("fanout")
            .arg(&tasks)
            .arg("--out")
            .arg(&out)
            .args(extra)
            .arg("--home")
            .arg(dir.path().join("home")))
    };
    let output = fanout(&[]);
    assert_eq!(output.status.code(), Some(1), "the duplicate id was skipped: {}", text(&output.stderr));
    assert!(text(&output.stderr).contains("3: skipped: its id \"first\" is line 1's too"), "{}", text(&output.stderr));
    let results = json_lines(&std::fs::read(&out).unwrap());
    assert_eq!(results.len(), 2);
    let by_id: HashMap<&str, &Value> = results.iter().map(|r| (r["id"].as_str().unwrap(), r)).collect();
    assert_eq!(by_id["first"]["output"], "handled: one");
    let derived = by_id.keys().find(|id| id.starts_with("L2-")).expect("a line without an id: L<line>-<hash>");
    assert_eq!(by_id[derived]["stop_reason"], "error");

    // Unchanged: nothing to do but the failed one, on request.
    std::fs::write(&tasks, "{\"id\": \"first\", \"prompt\": \"one\"}\n{\"prompt\": \"two [fail]\"}\n").unwrap();
    let output = fanout(&["--resume"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(json_lines(&std::fs::read(&out).unwrap()).len(), 2, "nothing ran");
    let output = fanout(&["--resume", "--rerun-failed"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(json_lines(&std::fs::read(&out).unwrap()).len(), 3, "the failed task ran again (its last line wins)");

    // A changed line: refused with its place, or run again when asked.
    std::fs::write(&tasks, "{\"id\": \"first\", \"prompt\": \"one, changed\"}\n{\"prompt\": \"two [fail]\"}\n")
        .unwrap();
    let output = fanout(&["--resume"]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("tasks.jsonl:1: task \"first\" changed"), "{}", text(&output.stderr));
    let output = fanout(&["--resume", "--rerun-changed"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let results = json_lines(&std::fs::read(&out).unwrap());
    assert_eq!(results.last().unwrap()["output"], "handled: one, changed");
    // --resume needs --out.
    let output = run(subagents().arg("fanout").arg(&tasks).arg("--resume"));
    assert_eq!(output.status.code(), Some(2));
}

/// A chat-completions endpoint that answers 503 (retry at once) to its
/// first `failures` requests and a completion after.
fn flaky_endpoint(failures: usize) -> (String, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let answered = Arc::new(AtomicUsize::new(0));
    let count = answered.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let count = count.clone();
            std::thread::spawn(move || {
                let mut request = Vec::new();
                let mut buffer = [0u8; 4096];
                // Headers, then the body its length names.
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buffer) {
                        Ok(0) | Err(_) => return, // a reachability probe
                        Ok(n) => request.extend_from_slice(&buffer[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&request).to_lowercase();
                let length = head
                    .lines()
                    .find_map(|line| {
                        line.strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap_or(0))
                    })
                    .unwrap_or(0);
                let body_start = request.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
                while request.len() < body_start + length {
                    match stream.read(&mut buffer) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buffer[..n]),
                    }
                }
                let n = count.fetch_add(1, Ordering::SeqCst);
                let (status, body) = if n < failures {
                    ("503 Service Unavailable", r#"{"error": {"message": "overloaded"}}"#.to_owned())
                } else {
                    let answer = r#"{"id": "c", "object": "chat.completion", "choices": [{"index": 0,
                        "message": {"role": "assistant", "content": "made it"}, "finish_reason": "stop"}]}"#;
                    ("200 OK", answer.to_owned())
                };
                let reply = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\nretry-after: 0\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(reply.as_bytes());
            });
        }
    });
    (url, answered)
}

#[test]
fn retry_turns_a_burst_of_503s_into_a_completed_run_and_says_how_many_attempts_it_took() {
    let dir = tempfile::tempdir().unwrap();
    // The adapter tries each call 4 times; 6 failures outlast one attempt.
    let (url, answered) = flaky_endpoint(6);
    let tasks = write_file(dir.path(), "tasks.jsonl", "{\"prompt\": \"hello\"}\n");
    let fanout = |retry: &str| {
        run(subagents()
            .args(["fanout", "--model", "openai:test", "--retry", retry])
            .arg(&tasks)
            .arg("--home")
            .arg(dir.path().join("home"))
            .env("SUBAGENTS_BASE_URL", &url))
    };
    let output = fanout("3");
    assert!(output.status.success(), "{}", text(&output.stderr));
    let results = json_lines(&output.stdout);
    assert_eq!(
        (&results[0]["stop_reason"], &results[0]["output"]),
        (&"completed".into(), &"made it".into()),
        "{results:?}"
    );
    assert_eq!(results[0]["attempts"], 2, "{results:?}");
    assert_eq!(answered.load(Ordering::SeqCst), 7);
    assert!(text(&output.stderr).contains("(retried)"), "{}", text(&output.stderr));
}

#[test]
fn a_run_past_its_timeout_is_stopped_and_its_line_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = write_file(
        dir.path(),
        "tasks.jsonl",
        "{\"prompt\": \"slow [delay:5000]\"}\n{\"prompt\": \"quick\", \"timeout\": \"30s\"}\n{\"prompt\": \"own [delay:5000]\", \"timeout\": \"100ms\"}\n",
    );
    let output =
        run(subagents().args(["fanout", "--timeout", "300ms"]).arg(&tasks).arg("--home").arg(dir.path().join("home")));
    assert!(output.status.success(), "{}", text(&output.stderr));
    let mut results = json_lines(&output.stdout);
    results.sort_by_key(|r| r["line"].as_u64());
    for n in [0, 2] {
        assert_eq!(
            (&results[n]["stop_reason"], &results[n]["reason"]),
            (&"aborted".into(), &"timeout".into()),
            "{results:?}"
        );
    }
    assert_eq!(results[1]["stop_reason"], "completed");
    assert!(results[2]["latency_ms"].as_f64().unwrap() < 3000.0, "the line's own timeout: {results:?}");
}
