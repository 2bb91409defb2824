//! What the binary prints: no terminal controls from tasks, models or
//! children; a failed run's safe reason; the library's warnings.

use std::io::{Read, Write};
use std::net::TcpListener;

use super::{json_lines, run, subagents, text, write_file};

/// Labels that would retitle the window, clear the screen, or open a CSI
/// through its one-byte C1 form, plus a DEL.
const HOSTILE_LABELS: [&str; 3] = ["a\u{1b}]0;pwned\u{7}b", "c\u{1b}[2Jd", "e\u{9b}31mf\u{7f}g"];

/// No control character but the line breaks (and tabs) text needs.
fn assert_printable(what: &str, text: &str) {
    let found: Vec<char> = text.chars().filter(|c| c.is_control() && !matches!(c, '\n' | '\t')).collect();
    assert!(found.is_empty(), "{what} carries control characters {found:?}: {text:?}");
}

/// A loopback OpenAI-compatible endpoint answering every request with
/// `status` and `body`; its base URL.
pub(super) fn endpoint_answering(status: &'static str, body: &'static str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for mut socket in listener.incoming().flatten() {
            // Headers, then the body its length announces; the reachability
            // probe connects and sends nothing.
            let mut request = Vec::new();
            let mut chunk = [0u8; 4096];
            let complete = loop {
                let Ok(read @ 1..) = socket.read(&mut chunk) else { break false };
                request.extend_from_slice(&chunk[..read]);
                let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
                let head = String::from_utf8_lossy(&request[..end]).to_lowercase();
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                if request.len() >= end + 4 + length {
                    break true;
                }
            };
            if complete {
                let reply = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(reply.as_bytes());
            }
        }
    });
    base_url
}

#[test]
fn fanout_prints_labels_without_terminal_controls_and_keeps_them_in_json() {
    let home = tempfile::tempdir().unwrap();
    let lines: String = HOSTILE_LABELS
        .iter()
        .map(|label| format!("{}\n", serde_json::json!({"prompt": format!("do {label}"), "label": label})))
        .collect();
    // One that fails, so a reason is printed too.
    let lines = format!("{lines}{}\n", serde_json::json!({"prompt": "x [fail]", "label": HOSTILE_LABELS[0]}));
    let tasks = write_file(home.path(), "tasks.jsonl", lines);
    let output = run(subagents().arg("fanout").arg(&tasks).arg("--home").arg(home.path()));
    let stderr = text(&output.stderr);
    assert_printable("stderr", &stderr);
    assert!(stderr.contains(" ab: ") && stderr.contains(" cd: "), "the text around the escapes stays: {stderr}");
    assert!(!stderr.contains("pwned") && !stderr.contains("[2J"), "no escape leaves a trace: {stderr}");
    let mut labels: Vec<String> =
        json_lines(&output.stdout).iter().map(|r| r["label"].as_str().unwrap().to_owned()).collect();
    labels.sort();
    labels.dedup();
    assert_eq!(labels, HOSTILE_LABELS, "JSON lines keep the label as written (JSON-escaped)");
}

#[test]
fn run_prints_answers_descriptions_and_the_tree_without_terminal_controls() {
    let home = tempfile::tempdir().unwrap();
    // The demo model delegates each `;` part with its first words as the
    // description: the model-written labels carry the escapes too.
    let prompt = "\u{1b}[2J wipe the screen; \u{1b}c\u{7} reset the terminal; \u{9b}31m paint it red";
    let output = run(subagents().args(["run", prompt, "--home"]).arg(home.path()));
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "{stderr}");
    assert_printable("stdout", &stdout);
    assert_printable("stderr", &stderr);
    assert!(stdout.contains("wipe the screen") && stdout.contains("reset the terminal"), "{stdout}");
    assert_eq!(stdout.lines().filter(|l| l.contains("─ spawn ")).count(), 3, "{stdout}");
}

#[test]
fn a_failed_runs_json_and_progress_lines_carry_the_safe_reason() {
    let home = tempfile::tempdir().unwrap();
    let tasks = write_file(
        home.path(),
        "tasks.jsonl",
        "{\"prompt\": \"call upstream [fail]\", \"label\": \"flaky\"}\n{\"prompt\": \"fine\"}\n",
    );
    let output = run(subagents().arg("fanout").arg(&tasks).arg("--home").arg(home.path()));
    let stderr = text(&output.stderr);
    let failed = json_lines(&output.stdout).into_iter().find(|r| r["line"] == 1).expect("line 1 ran");
    assert_eq!(failed["stop_reason"], "error");
    assert_eq!(failed["diagnostic"]["reason"], "the scripted model failed", "{failed}");
    let progress = stderr.lines().find(|l| l.starts_with("line 1:")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(progress.contains("error") && progress.contains("the scripted model failed"), "{progress}");
}

#[test]
fn an_endpoint_answering_404_is_the_reason_and_its_body_prints_without_controls() {
    let home = tempfile::tempdir().unwrap();
    let base_url = endpoint_answering("404 Not Found", "{\"error\": \"\u{1b}]0;pwned\u{7} no such model\"}");
    let tasks = write_file(home.path(), "tasks.jsonl", "{\"prompt\": \"hello\"}\n");
    let output = run(subagents()
        .args(["fanout", "--model", "openai:nope"])
        .arg(&tasks)
        .arg("--home")
        .arg(home.path())
        .env("SUBAGENTS_BASE_URL", &base_url));
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "the batch ran: {stderr}");
    let results = json_lines(&output.stdout);
    assert_eq!(results[0]["diagnostic"]["reason"], "the model endpoint answered 404", "{results:?}");
    assert!(stderr.contains("the model endpoint answered 404"), "{stderr}");

    // `run` prints the turn's whole error, the endpoint's words included.
    let output = run(subagents()
        .args(["run", "hello", "--model", "openai:nope", "--home"])
        .arg(home.path())
        .env("SUBAGENTS_BASE_URL", &base_url));
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "the parent did not complete: {stderr}");
    assert!(stderr.contains("404") && stderr.contains("no such model"), "{stderr}");
    assert_printable("stderr", &stderr);
    assert_printable("stdout", &text(&output.stdout));
}

#[test]
fn library_logs_reach_stderr_at_the_level_rust_log_asks_for() {
    let home = tempfile::tempdir().unwrap();
    // A failing child turn is logged at debug by the library, inside the
    // run's span.
    let tasks = write_file(home.path(), "tasks.jsonl", "{\"prompt\": \"one [fail]\"}\n");
    let fanout = |rust_log: Option<&str>| {
        let mut command = subagents();
        command.arg("fanout").arg(&tasks).arg("--home").arg(home.path());
        if let Some(filter) = rust_log {
            command.env("RUST_LOG", filter);
        }
        let output = run(&mut command);
        assert_eq!(output.status.code(), Some(0), "the batch ran");
        text(&output.stderr)
    };
    let stderr = fanout(Some("subagents=debug"));
    let logged = stderr.lines().find(|l| l.contains("child turn failed"));
    let logged = logged.unwrap_or_else(|| panic!("the debug line is printed: {stderr}"));
    assert!(logged.contains("DEBUG") && logged.contains("run{run_id="), "it names its run: {logged}");
    let stderr = fanout(None);
    assert!(!stderr.contains("child turn failed"), "the default level is warn: {stderr}");
    let stderr = fanout(Some("off"));
    assert!(!stderr.contains("child turn failed"), "RUST_LOG=off silences it: {stderr}");
    assert!(stderr.contains("line 1:"), "the CLI's own lines stay: {stderr}");
}

#[test]
fn a_flag_is_offered_only_where_it_does_something() {
    // `--otlp` exports the spans of runs: `sessions` and `providers` run none.
    for args in [&["sessions", "list"][..], &["providers", "list"]] {
        let output = run(subagents().args(args).args(["--otlp", "http://127.0.0.1:4318"]));
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(text(&output.stderr).contains("unexpected argument '--otlp'"), "{}", text(&output.stderr));
    }
    // The remote-only flags stand under one heading of their own.
    let help = text(&run(subagents().args(["run", "--help"])).stdout);
    let remote = help.split("The remote provider (--provider remote):").nth(1).expect("a remote heading");
    let remote = remote.split("\n\n").next().unwrap();
    for flag in ["--nats", "--pool", "--broker-patience", "--worker-patience", "--detached-ttl"] {
        assert!(remote.contains(flag), "{flag} is not under the remote heading: {help}");
    }
}

#[test]
fn help_matches_its_checked_in_snapshots() {
    // `SUBAGENTS_BLESS=1` rewrites the snapshots from the binary.
    let bless = std::env::var_os("SUBAGENTS_BLESS").is_some();
    for (args, name) in [(&["--help"][..], "subagents"), (&["fanout", "--help"], "fanout"), (&["run", "--help"], "run")]
    {
        let output = run(subagents().args(args));
        assert!(output.status.success(), "{args:?}");
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/cli/help/{name}.txt"));
        if bless {
            std::fs::write(&path, &output.stdout).unwrap();
        }
        let snapshot = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text(&output.stdout), snapshot, "{args:?} changed: SUBAGENTS_BLESS=1 rewrites {}", path.display());
    }
}
