//! The `subagents` binary, run as a user runs it.
//!
//! This file holds the everyday paths; `cli/` holds the hardening checks by
//! concern: what the binary accepts (`input`), which models it speaks to
//! (`models`), what it prints (`output`),
//! how a batch ends and what it costs (`batch`), and whether the README and
//! the guide say what it does (`docs`).

#[path = "cli/batch.rs"]
mod batch;
#[path = "cli/docs.rs"]
mod docs;
#[path = "cli/durable.rs"]
mod durable;
#[path = "cli/input.rs"]
mod input;
#[path = "cli/lost.rs"]
mod lost;
#[path = "cli/models.rs"]
mod models;
#[path = "cli/output.rs"]
mod output;
#[path = "cli/pipeline.rs"]
mod pipeline;
#[path = "cli/sessions.rs"]
mod sessions;
#[path = "cli/terminal.rs"]
mod terminal;

use crate::common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The binary, run from the project root, with no inherited home and the
/// default log filter.
fn subagents() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_subagents"));
    command.env_remove("SUBAGENTS_HOME").env_remove("RUST_LOG").current_dir(env!("CARGO_MANIFEST_DIR"));
    command
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The binary's output, bounded: a hung command fails the test.
fn run(command: &mut Command) -> Output {
    common::output_within(command, common::WAIT_LIMIT, "the subagents binary")
}

/// Runs `command` to its end and returns its peak resident set in KiB: its
/// own high-water mark (`VmHWM`), read from `/proc` every millisecond while
/// it runs. Not `wait4`'s `ru_maxrss`: a child spawned from this process
/// carries this process's high-water mark through `exec`, so it would count
/// what the other tests of the binary hold. A peak that lasts under a
/// millisecond may be missed; a line held whole is not.
pub(crate) fn peak_rss_kib(command: &mut Command) -> (ExitStatus, u64) {
    let mut child = command.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    loop {
        if let Ok(status) = std::fs::read_to_string(&status_file) {
            let hwm = status.lines().find_map(|line| line.strip_prefix("VmHWM:"));
            let kib = hwm.and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
            peak = peak.max(kib.unwrap_or(0));
        }
        if let Some(status) = child.try_wait().unwrap() {
            return (status, peak);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `bytes` written as `name` in `dir`.
fn write_file(dir: &Path, name: &str, bytes: impl AsRef<[u8]>) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Every stdout line, parsed: each must be whole JSON.
fn json_lines(stdout: &[u8]) -> Vec<Value> {
    text(stdout).lines().map(|line| serde_json::from_str(line).expect("every line is whole JSON")).collect()
}

/// The `line` numbers of result lines, sorted.
fn line_numbers(results: &[Value]) -> Vec<u64> {
    let mut numbers: Vec<u64> = results.iter().map(|r| r["line"].as_u64().unwrap()).collect();
    numbers.sort_unstable();
    numbers
}

#[test]
fn run_prints_the_answer_and_the_tree_of_delegated_runs() {
    let home = tempfile::tempdir().unwrap();
    let output = run(subagents().args(["run", "review the parser; check the docs", "--home"]).arg(home.path()));
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", text(&output.stderr));
    assert!(stdout.contains("- handled: review the parser"), "{stdout}");
    assert!(stdout.contains("- handled: check the docs"), "{stdout}");
    let tree: Vec<&str> = stdout.lines().filter(|l| l.contains("─ spawn ")).collect();
    assert_eq!(tree.len(), 2, "{stdout}");
    assert!(tree.iter().all(|line| line.contains(": completed")), "{stdout}");
    let sessions = subagents::agent::SessionStore::new(home.path()).ids().unwrap().len();
    assert_eq!(sessions, 3, "the parent and two children were persisted");
}

#[test]
fn run_off_a_terminal_says_on_stderr_as_each_child_starts_and_ends() {
    let home = tempfile::tempdir().unwrap();
    let output = run(subagents().args(["run", "review the parser; check the docs", "--home"]).arg(home.path()));
    assert!(output.status.success());
    let stderr = text(&output.stderr);
    for child in ["review the parser", "check the docs"] {
        let lines: Vec<&str> = stderr.lines().filter(|line| line.contains(&format!("─ spawn [{child}]"))).collect();
        assert!(lines.first().is_some_and(|line| line.ends_with(" started")), "{stderr}");
        assert!(lines.last().is_some_and(|line| line.ends_with(" completed")), "{stderr}");
    }
    assert!(!stderr.contains('\u{1b}'), "no cursor movement off a terminal: {stderr:?}");
}

#[test]
fn run_on_a_terminal_draws_the_tree_in_place_and_clears_it() {
    // A pseudo-terminal from Python's standard library (the suite already
    // needs Python for the broker): the binary's stderr is a terminal.
    let home = tempfile::tempdir().unwrap();
    let on_a_terminal = "import os, pty, sys\nsys.exit(os.waitstatus_to_exitcode(pty.spawn(sys.argv[1:])))";
    let mut command = Command::new("python3");
    command.args(["-c", on_a_terminal]).arg(env!("CARGO_BIN_EXE_subagents"));
    command.args(["run", "review the parser; check the docs", "--home"]).arg(home.path());
    command.env_remove("SUBAGENTS_HOME").env_remove("RUST_LOG").current_dir(env!("CARGO_MANIFEST_DIR"));
    let output = run(command.stdin(Stdio::null()));
    let screen = text(&output.stdout);
    assert!(output.status.success(), "{screen}{}", text(&output.stderr));
    for child in ["review the parser", "check the docs"] {
        assert!(screen.contains(&format!("─ spawn [{child}]")), "the tree names {child}: {screen:?}");
    }
    assert!(screen.contains("\u{1b}[J"), "the tree is redrawn in place and cleared: {screen:?}");
    assert!(!screen.contains(" started\r\n"), "no plain start lines on a terminal: {screen:?}");
}

#[test]
fn fanout_runs_every_task_writes_results_a_summary_and_a_trace() {
    let home = tempfile::tempdir().unwrap();
    let out = home.path().join("results.jsonl");
    let trace = home.path().join("trace.json");
    let output = run(subagents()
        .args(["fanout", "examples/tasks.jsonl", "--concurrency", "4", "--home"])
        .arg(home.path())
        .arg("--out")
        .arg(&out)
        .arg("--trace")
        .arg(&trace));
    let stderr = text(&output.stderr);
    // The examples show every stop reason; the batch is still carried out.
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let results: Vec<Value> =
        std::fs::read_to_string(&out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let tasks = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tasks.jsonl")).unwrap();
    assert_eq!(results.len(), tasks.lines().count());
    let reasons: Vec<&str> = results.iter().filter_map(|r| r["stop_reason"].as_str()).collect();
    for reason in ["completed", "refusal", "max-tokens", "error"] {
        assert!(reasons.contains(&reason), "{reason} in {reasons:?}");
    }
    assert!(results.iter().any(|r| r["structured"]["risk"] == "low"), "structured results are written");
    assert!(stderr.contains("runs/s") && stderr.contains("p50") && stderr.contains("p99"), "{stderr}");
    assert!(stderr.contains("completed"), "{stderr}");
    // The trace is the runtime's own spans: each run (nested ones too)
    // begins and ends once, with its model and tool calls inside.
    let trace: Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    let events = trace.as_array().expect("a JSON array of trace events");
    let count = |name: &str, phase: &str| events.iter().filter(|e| e["name"] == name && e["ph"] == phase).count();
    let runs = count("run", "b");
    assert!(runs > results.len(), "nested runs are in the trace too: {runs} runs for {} tasks", results.len());
    assert_eq!(count("run", "e"), runs, "every run's span ends");
    assert!(count("model_call", "b") >= runs && count("tool_call", "b") > 0, "model and tool calls are in it");
    let nested = events.iter().filter(|e| e["name"] == "run" && e["args"]["depth"] == "2").count();
    assert!(nested > 0, "children of children carry their depth");
}

#[test]
fn fanout_lines_carry_each_runs_usage_and_its_trees_and_the_summary_adds_the_trees_up() {
    let home = tempfile::tempdir().unwrap();
    let tasks = write_file(
        home.path(),
        "tasks.jsonl",
        "{\"prompt\": \"review the parser; check the docs\"}\n{\"prompt\": \"say hello\"}\n",
    );
    let output = run(subagents().arg("fanout").arg(&tasks).arg("--home").arg(home.path()));
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let lines = json_lines(&output.stdout);
    assert_eq!(lines.len(), 2, "{stderr}");
    let number = |value: &Value, key: &str| value[key].as_u64().unwrap_or_else(|| panic!("{key} in {value}"));
    let tokens = |usage: &Value| {
        ["input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens"]
            .map(|k| number(usage, k))
            .iter()
            .sum::<u64>()
    };
    for line in &lines {
        let (usage, tree) = (&line["usage"], &line["tree_usage"]);
        assert!(number(usage, "input_tokens") > 0 && number(usage, "model_calls") >= 1, "{line}");
        assert!(tokens(tree) >= tokens(usage) && number(tree, "model_calls") >= number(usage, "model_calls"), "{line}");
    }
    let delegating = lines.iter().find(|l| l["line"] == 1).unwrap();
    let (usage, tree) = (&delegating["usage"], &delegating["tree_usage"]);
    assert!(number(tree, "model_calls") >= number(usage, "model_calls") + 2, "two children's calls: {delegating}");
    assert!(tokens(tree) > tokens(usage), "the children's tokens count in the tree: {delegating}");
    let total: u64 = lines.iter().map(|l| tokens(&l["tree_usage"])).sum();
    assert!(stderr.contains(&format!("tokens {total} (input ")), "the summary adds up the trees ({total}): {stderr}");
}

#[test]
fn malformed_lines_are_reported_with_their_number_and_skipped() {
    let home = tempfile::tempdir().unwrap();
    let tasks = home.path().join("tasks.jsonl");
    std::fs::write(&tasks, "{\"prompt\": \"first\"}\nnot json\n\n{\"prompt\": 3}\n{\"prompt\": \"last\"}\n").unwrap();
    let output = run(subagents().arg("fanout").arg(&tasks).arg("--home").arg(home.path()));
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "skipped tasks were not done: {stderr}");
    assert!(stderr.contains("tasks.jsonl:2: skipped"), "{stderr}");
    assert!(stderr.contains("tasks.jsonl:4: skipped"), "{stderr}");
    assert_eq!(line_numbers(&json_lines(&output.stdout)), [1, 5]);
}

#[test]
fn bad_input_is_one_line_and_exit_code_two() {
    let home = tempfile::tempdir().unwrap();
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    // (arguments, environment, what the one line says)
    type Case = (Vec<String>, Vec<(&'static str, String)>, &'static str);
    let cases: Vec<Case> = vec![
        (vec!["fanout".into(), "no/such/tasks.jsonl".into()], vec![], "cannot open"),
        (
            vec!["fanout".into(), "examples/tasks.jsonl".into(), "--provider".into(), "nope".into()],
            vec![],
            "unknown provider",
        ),
        (vec!["run".into(), "hi".into(), "--provider".into(), "nope".into()], vec![], "unknown provider"),
        (vec!["run".into(), "hi".into(), "--model".into(), "gpt".into()], vec![], "unknown model"),
        (
            vec!["run".into(), "hi".into(), "--model".into(), "openai:some-model".into()],
            vec![("SUBAGENTS_BASE_URL", format!("http://127.0.0.1:{closed_port}/v1"))],
            "unreachable",
        ),
    ];
    for (args, env, expected) in cases {
        let mut command = subagents();
        command.args(&args).arg("--home").arg(home.path());
        for (key, value) in env {
            command.env(key, value);
        }
        let output = run(&mut command);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: one line: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
    }
}

#[test]
fn sigint_during_a_fanout_cancels_exits_promptly_and_keeps_what_finished() {
    let home = tempfile::tempdir().unwrap();
    let tasks = home.path().join("many.jsonl");
    let mut file = std::fs::File::create(&tasks).unwrap();
    for n in 0..2000 {
        writeln!(file, "{{\"prompt\": \"task {n}\"}}").unwrap();
    }
    drop(file);
    let out = home.path().join("partial.jsonl");
    // The mock provider answers after 20 ms: 2,000 tasks two at a time take
    // 20 s, far longer than the test waits.
    let mut child = subagents()
        .args(["fanout", "--provider", "mock", "--concurrency", "2"])
        .arg(&tasks)
        .arg("--out")
        .arg(&out)
        .arg("--home")
        .arg(home.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::read_to_string(&out).map_or(0, |t| t.lines().count()) < 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let interrupted = Instant::now();
    assert!(Command::new("kill").args(["-INT", &pid.to_string()]).status().unwrap().success());
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(interrupted.elapsed() < Duration::from_secs(10), "the fanout did not exit promptly");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(130));
    let written = std::fs::read_to_string(&out).unwrap();
    let lines: Vec<Value> =
        written.lines().map(|l| serde_json::from_str(l).expect("every line is whole JSON")).collect();
    assert!(lines.len() >= 4 && lines.len() < 2000, "{} lines", lines.len());
    assert!(lines
        .iter()
        .all(|l| l["stop_reason"] == "completed" || l["stop_reason"] == "aborted" || l["code"] == "ABORTED"));
    // No process is left: the pid is gone.
    assert!(!Path::new(&format!("/proc/{pid}")).exists(), "the process is gone");
}

#[test]
fn fanout_budgets_the_batch_with_flags_and_a_task_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    // Task 1 splits into three parts but its own budget allows it two more
    // runs; the batch allows four runs in all, so of the three plain tasks
    // after it (at concurrency 1, in order) only one starts.
    let tasks = write_file(
        dir.path(),
        "tasks.jsonl",
        "{\"prompt\": \"check a; check b; check c\", \"budget\": {\"runs\": 3}}\n\
         {\"prompt\": \"task 2\"}\n{\"prompt\": \"task 3\"}\n{\"prompt\": \"task 4\"}\n",
    );
    let home = dir.path().join("home");
    let out = run(subagents()
        .args(["fanout", "--concurrency", "1", "--budget-runs", "4", "--budget-deadline", "10m", "--home"])
        .arg(&home)
        .arg(&tasks));
    assert_eq!(out.status.code(), Some(0), "every line ran and has its result: {}", text(&out.stderr));
    let mut results = json_lines(&out.stdout);
    results.sort_by_key(|r| r["line"].as_u64());
    let first = results[0]["output"].as_str().unwrap();
    assert_eq!(first.matches("- handled: check").count(), 2, "{first}");
    assert!(first.contains("budget exhausted: total runs 3 of 3 used"), "the task's own budget: {first}");
    assert_eq!(results[1]["output"], "handled: task 2");
    for refused in &results[2..] {
        assert_eq!(refused["code"], "BUDGET_EXHAUSTED", "{refused}");
        assert_eq!(refused["error"], "budget exhausted: total runs 4 of 4 used");
    }
    let bad = run(subagents().args(["fanout", "--budget-deadline", "ten"]).arg(&tasks));
    assert_eq!(bad.status.code(), Some(2), "a duration without a unit is a usage error");
}
