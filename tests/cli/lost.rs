//! Results that could not be written are the batch's error, never lost in
//! silence: a full disk under `--out` or `--trace`, a reader of stdout that
//! went away, two flags that lead to one file, an out file that is not a
//! file; and an interrupted batch, whose stopped runs are not settled.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::{run, subagents, text, write_file};
use crate::common::line_peer::LinePeer;
use crate::common::small_disk::SmallDisk;

/// `n` tasks with their own ids, each answered with about 1 KB.
fn tasks(dir: &Path, n: usize) -> std::path::PathBuf {
    let filler = "x".repeat(1000);
    let lines: Vec<String> = (0..n).map(|i| format!("{{\"id\": \"t{i}\", \"prompt\": \"{i} {filler}\"}}")).collect();
    write_file(dir, "tasks.jsonl", lines.join("\n") + "\n")
}

/// A mock that echoes its prompt, `delay` long.
fn echo_config(dir: &Path, delay: &str) -> std::path::PathBuf {
    let config =
        format!("[providers.echo]\nkind = \"mock\"\nreply = \"done: \"\necho_prompt = true\ndelay = \"{delay}\"\n");
    write_file(dir, "echo.toml", config)
}

/// Each result line of `out`, which must all be whole JSON, by id.
fn results_by_id(out: &Path) -> HashMap<String, Vec<Value>> {
    let text = std::fs::read_to_string(out).unwrap();
    assert!(text.is_empty() || text.ends_with('\n'), "the file ends with a whole line");
    let mut by_id: HashMap<String, Vec<Value>> = HashMap::new();
    for line in text.lines() {
        let record: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("a whole line: {e}: {line:?}"));
        by_id.entry(record["id"].as_str().unwrap().to_owned()).or_default().push(record);
    }
    by_id
}

#[test]
fn a_full_disk_under_out_stops_the_batch_with_an_error_and_resume_finishes_it_when_space_returns() {
    let dir = tempfile::tempdir().unwrap();
    let disk = SmallDisk::mount(64 * 1024);
    let (tasks, config, out) = (tasks(dir.path(), 300), echo_config(dir.path(), "1ms"), disk.join("out.jsonl"));
    let fanout = |resume: bool| {
        let mut command = subagents();
        command.arg("fanout").arg(&tasks).arg("--config").arg(&config).args(["--provider", "echo"]);
        command.arg("--out").arg(&out).arg("--home").arg(dir.path().join("home")).args(["--concurrency", "8"]);
        if resume {
            command.arg("--resume");
        }
        run(&mut command)
    };
    let output = fanout(false);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "a result that could not be written fails the batch: {stderr}");
    assert!(stderr.contains("results lost: cannot write to") && stderr.contains("No space left on device"), "{stderr}");
    assert!(stderr.contains("No new run starts"), "{stderr}");
    assert!(stderr.contains("to finish the batch: ") && stderr.contains("--resume"), "{stderr}");
    let written = results_by_id(&out);
    assert!(!written.is_empty() && written.len() < 300, "some lines fit, not all: {}", written.len());

    // Still full: the resume fails the same way, losing nothing it wrote.
    let output = fanout(true);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    assert!(results_by_id(&out).len() >= written.len());

    disk.grow(4 * 1024 * 1024);
    let output = fanout(true);
    assert_eq!(output.status.code(), Some(0), "space returned: {}", text(&output.stderr));
    let finished = results_by_id(&out);
    assert_eq!(finished.len(), 300, "every task has its result");
    assert!(finished.values().all(|lines| lines.len() == 1), "each exactly once");
    assert!(finished.values().all(|lines| lines[0]["stop_reason"] == "completed"));
}

#[test]
fn a_reader_of_stdout_that_went_away_fails_the_batch_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let (tasks, config) = (tasks(dir.path(), 50), echo_config(dir.path(), "5ms"));
    // A pipe whose reader is gone before the first line.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut child = subagents()
        .arg("fanout")
        .arg(&tasks)
        .arg("--config")
        .arg(&config)
        .args(["--provider", "echo", "--home"])
        .arg(dir.path().join("home"))
        .stdin(Stdio::null())
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = Vec::new();
    std::io::Read::read_to_end(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    let output = std::process::Output { status: child.wait().unwrap(), stdout: Vec::new(), stderr };
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("results lost: stdout was closed by its reader"), "{stderr}");
    assert!(stderr.contains("run the batch with --out FILE"), "{stderr}");
}

#[test]
fn a_full_disk_under_trace_stops_the_trace_once_and_the_exit_says_it_is_incomplete() {
    let dir = tempfile::tempdir().unwrap();
    let disk = SmallDisk::mount(32 * 1024);
    let (tasks, config) = (tasks(dir.path(), 400), echo_config(dir.path(), "0ms"));
    let output = run(subagents()
        .arg("fanout")
        .arg(&tasks)
        .arg("--config")
        .arg(&config)
        .args(["--provider", "echo", "--out"])
        .arg(dir.path().join("out.jsonl"))
        .arg("--trace")
        .arg(disk.join("trace.json"))
        .arg("--home")
        .arg(dir.path().join("home")));
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.matches("the trace stopped").count(), 1, "one warning: {stderr}");
    assert!(stderr.contains("is incomplete: No space left on device"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(results_by_id(&dir.path().join("out.jsonl")).len(), 400, "the results are whole");
}

#[test]
fn out_through_a_dangling_link_to_the_trace_is_refused_and_a_device_is_a_stream() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = tasks(dir.path(), 2);
    let (trace, link) = (dir.path().join("trace.json"), dir.path().join("out.jsonl"));
    std::os::unix::fs::symlink(&trace, &link).unwrap();
    let output = run(subagents().arg("fanout").arg(&tasks).arg("--out").arg(&link).arg("--trace").arg(&trace));
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("--out and --trace are the same file"), "{}", text(&output.stderr));
    assert!(!trace.exists(), "nothing was created");

    let home = dir.path().join("home");
    let output = run(subagents().arg("fanout").arg(&tasks).args(["--out", "/dev/null", "--home"]).arg(&home));
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let output =
        run(subagents().arg("fanout").arg(&tasks).args(["--out", "/dev/null", "--resume", "--home"]).arg(&home));
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr)
            .contains("/dev/null: a resumed batch reads its results back, and this is not a regular file"),
        "{}",
        text(&output.stderr)
    );
    assert!(!Path::new("/dev/null.runs").exists());
}

#[test]
fn a_task_skipped_for_a_repeated_id_does_not_stop_the_resume_of_the_untouched_file() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = write_file(
        dir.path(),
        "tasks.jsonl",
        "{\"id\": \"dup\", \"prompt\": \"one\"}\n{\"id\": \"dup\", \"prompt\": \"two\"}\n{\"prompt\": \"three\"}\n",
    );
    let out = dir.path().join("out.jsonl");
    let fanout = |extra: &[&str]| run(subagents().arg("fanout").arg(&tasks).arg("--out").arg(&out).args(extra));
    let output = fanout(&[]);
    assert_eq!(output.status.code(), Some(1), "a skipped line: {}", text(&output.stderr));
    let output = fanout(&["--resume"]);
    let stderr = text(&output.stderr);
    assert!(!stderr.contains("changed since"), "{stderr}");
    assert_eq!(output.status.code(), Some(1), "the repeated id is skipped again, nothing else: {stderr}");
    assert!(stderr.contains("(done before, skipped)"), "{stderr}");
    assert_eq!(results_by_id(&out).values().map(Vec::len).sum::<usize>(), 2);
}

#[test]
fn the_first_line_of_a_repeated_id_runs_whichever_worker_takes_the_lines() {
    // Each id on two lines running side by side: the workers take lines
    // in turn, and the first line of an id must win its claim every time.
    let dir = tempfile::tempdir().unwrap();
    let lines: String = (0..300)
        .map(|i| format!("{{\"id\": \"t{i}\", \"prompt\": \"first\"}}\n{{\"id\": \"t{i}\", \"prompt\": \"second\"}}\n"))
        .collect();
    let (tasks, config, out) =
        (write_file(dir.path(), "tasks.jsonl", lines), echo_config(dir.path(), "0ms"), dir.path().join("out.jsonl"));
    let fanout = |extra: &[&str]| {
        let mut command = subagents();
        command.arg("fanout").arg(&tasks).arg("--config").arg(&config);
        command.args(["--provider", "echo"]).args(["--concurrency", "64"]);
        run(command.arg("--out").arg(&out).arg("--home").arg(dir.path().join("home")).args(extra))
    };
    let output = fanout(&[]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "skipped lines: {stderr}");
    for i in 0..300 {
        let (first, second) = (2 * i + 1, 2 * i + 2);
        assert!(
            stderr.contains(&format!("tasks.jsonl:{second}: skipped: its id \"t{i}\" is line {first}'s too")),
            "{stderr}"
        );
    }
    let by_id = results_by_id(&out);
    assert_eq!(by_id.len(), 300);
    assert!(by_id.values().all(|records| records.len() == 1 && records[0]["output"] == "done: first"), "{by_id:?}");
    let output = fanout(&["--resume"]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    assert_eq!(results_by_id(&out).values().map(Vec::len).sum::<usize>(), 300, "nothing ran again");
}

#[test]
fn resume_reads_an_out_file_in_bounded_memory_and_refuses_what_is_not_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = write_file(dir.path(), "tasks.jsonl", "{\"id\": \"a\", \"prompt\": \"one\"}\n");
    let out = dir.path().join("out.jsonl");
    // A 200 MB line, then a settled line for the task.
    {
        use std::io::Write;
        let mut file = std::io::BufWriter::new(std::fs::File::create(&out).unwrap());
        file.write_all(b"{\"id\": \"junk\", \"output\": \"").unwrap();
        let block = vec![b'y'; 1 << 20];
        for _ in 0..200 {
            file.write_all(&block).unwrap();
        }
        file.write_all(b"\"}\n").unwrap();
    }
    let (status, peak_kib) = super::peak_rss_kib(
        subagents()
            .arg("fanout")
            .arg(&tasks)
            .arg("--out")
            .arg(&out)
            .arg("--resume")
            .arg("--home")
            .arg(dir.path().join("home")),
    );
    assert!(status.success(), "{status:?}");
    assert!(peak_kib < 160 * 1024, "a 200 MB line is never held whole: peak {peak_kib} KiB");

    let zero = dir.path().join("zero");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let output = run(subagents().arg("fanout").arg(&tasks).arg("--out").arg(&zero).arg("--resume"));
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("not a regular file"), "{}", text(&output.stderr));
}

#[test]
fn an_interrupted_batch_settles_nothing_it_stopped_and_resume_runs_exactly_those() {
    let dir = tempfile::tempdir().unwrap();
    let (tasks, config) = (tasks(dir.path(), 60), echo_config(dir.path(), "300ms"));
    let out = dir.path().join("out.jsonl");
    let fanout = |resume: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_subagents"));
        command.env_remove("RUST_LOG").arg("fanout").arg(&tasks).arg("--config").arg(&config);
        command.args(["--provider", "echo", "--concurrency", "10", "--out"]).arg(&out);
        command.arg("--home").arg(dir.path().join("home"));
        if resume {
            command.arg("--resume");
        }
        command
    };
    let peer = LinePeer::spawn(fanout(false), tempfile::tempdir().unwrap());
    crate::common::blocking::wait_until(Duration::from_secs(60), "ten results", || {
        std::fs::read(&out).is_ok_and(|bytes| bytes.iter().filter(|&&b| b == b'\n').count() >= 10)
    });
    peer.signal(libc::SIGINT);
    let mut peer = peer;
    assert_eq!(peer.wait_for_exit(Duration::from_secs(60)).code(), Some(130));
    let stderr = peer.stderr();
    assert!(stderr.contains("to finish the batch: ") && stderr.contains(" --resume"), "{stderr}");
    let first = results_by_id(&out);
    let interrupted: Vec<&String> =
        first.iter().filter(|(_, lines)| lines[0]["interrupted"] == true).map(|(id, _)| id).collect();
    assert!(!interrupted.is_empty(), "runs in flight were stopped: {first:?}");
    // A run stopped in flight says `aborted`; one the interrupt caught while
    // it was still starting says its start's error instead.
    assert!(
        first
            .values()
            .flatten()
            .filter(|r| r["interrupted"] == true)
            .all(|r| r["stop_reason"] == "aborted" || r["error"].is_string()),
        "{first:?}"
    );

    let output = run(&mut fanout(true));
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let finished = results_by_id(&out);
    assert_eq!(finished.len(), 60);
    for (id, lines) in &finished {
        let settled: Vec<&Value> = lines.iter().filter(|r| r["interrupted"] != true).collect();
        assert_eq!(settled.len(), 1, "{id} settled exactly once: {lines:?}");
        assert_eq!(settled[0]["stop_reason"], "completed");
    }
    for id in interrupted {
        assert_eq!(finished[id].len(), 2, "{id}: its interrupted line, then its run on resume");
    }
}

#[test]
fn a_task_line_naming_an_unknown_provider_is_refused_before_anything_runs_with_the_nearest_name() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = write_file(
        dir.path(),
        "tasks.jsonl",
        "{\"prompt\": \"one\"}\n{\"prompt\": \"two\", \"provider\": \"spwan\"}\n",
    );
    // An earlier batch's results, which a refused batch must not touch.
    let out = write_file(dir.path(), "out.jsonl", "{\"id\": \"earlier\"}\n");
    let output = run(subagents().arg("fanout").arg(&tasks).arg("--out").arg(&out));
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("tasks.jsonl:2: unknown provider \"spwan\" (did you mean \"spawn\"? available:"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "{\"id\": \"earlier\"}\n", "nothing ran, nothing truncated");

    let output = run(subagents().arg("fanout").arg(&tasks).args(["--provider", "mokc"]));
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr).contains("unknown provider \"mokc\" (did you mean \"mock\"?"),
        "{}",
        text(&output.stderr)
    );

    // From a pipe the lines cannot be read twice: the line fails at its turn
    // and the batch says it did not run.
    let mut child = subagents()
        .args(["fanout", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), &std::fs::read(&tasks).unwrap()).unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
}

/// Makes a FIFO at `path`.
fn fifo(path: &Path) {
    let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0, "mkfifo");
}

#[test]
fn out_naming_the_pipe_the_tasks_come_from_is_refused_not_read_back_for_ever() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    for out in ["/dev/stdin", "/proc/self/fd/0"] {
        let mut child = subagents()
            .args(["fanout", "-", "--provider", "mock", "--out", out, "--home"])
            .arg(&home)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        std::io::Write::write_all(&mut stdin, b"{\"prompt\": \"one\"}\n{\"prompt\": \"two\"}\n").unwrap();
        drop(stdin);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                child.kill().unwrap();
                child.wait().unwrap();
                panic!("--out {out}: still reading its own results after 30 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert_eq!(status.code(), Some(2), "--out {out}: {stderr}");
        assert!(stderr.contains("the tasks file and --out are the same file"), "--out {out}: {stderr}");
    }
}

#[test]
fn trace_a_fifo_no_one_reads_is_an_error_and_one_read_to_the_end_gets_the_trace() {
    let dir = tempfile::tempdir().unwrap();
    let (tasks, config) = (tasks(dir.path(), 3), echo_config(dir.path(), "0ms"));
    let trace = dir.path().join("trace.fifo");
    fifo(&trace);
    let fanout = |out: &str| {
        run(subagents()
            .arg("fanout")
            .arg(&tasks)
            .arg("--config")
            .arg(&config)
            .args(["--provider", "echo", "--out"])
            .arg(dir.path().join(out))
            .arg("--trace")
            .arg(&trace)
            .arg("--home")
            .arg(dir.path().join("home")))
    };
    // Not a batch that waits for ever before it starts.
    let started = std::time::Instant::now();
    let output = fanout("first.jsonl");
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "no reader, no trace: {stderr}");
    assert!(stderr.contains(&*trace.to_string_lossy()) && stderr.contains("no one reads it"), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(20), "refused after {:?}", started.elapsed());

    // A reader that reads it to the end gets the trace.
    let reader = {
        let trace = trace.clone();
        std::thread::spawn(move || std::fs::read_to_string(trace).unwrap())
    };
    let output = fanout("second.jsonl");
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let written = reader.join().unwrap();
    assert!(written.trim_start().starts_with('[') && written.contains("\"ph\""), "{written}");
}

#[test]
fn out_a_fifo_no_one_reads_is_an_error_and_one_read_to_the_end_is_a_stream() {
    let dir = tempfile::tempdir().unwrap();
    let (tasks, config) = (tasks(dir.path(), 20), echo_config(dir.path(), "0ms"));
    let out = dir.path().join("out.fifo");
    fifo(&out);
    let fanout = || {
        run(subagents()
            .arg("fanout")
            .arg(&tasks)
            .arg("--config")
            .arg(&config)
            .args(["--provider", "echo", "--out"])
            .arg(&out)
            .arg("--home")
            .arg(dir.path().join("home")))
    };
    let output = fanout();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "no reader, no results: {stderr}");
    assert!(stderr.contains(&*out.to_string_lossy()) && stderr.contains("no one reads it"), "{stderr}");

    // A reader that reads it to the end gets every line.
    let reader = {
        let out = out.clone();
        std::thread::spawn(move || std::fs::read_to_string(out).unwrap())
    };
    let output = fanout();
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(reader.join().unwrap().lines().count(), 20);

    // A reader that goes away after one line: the rest are lost, and said so.
    let reader = {
        let out = out.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            std::io::BufRead::read_line(&mut std::io::BufReader::new(std::fs::File::open(out).unwrap()), &mut line)
                .unwrap();
        })
    };
    let many = super::write_file(dir.path(), "many.jsonl", {
        let filler = "x".repeat(1000);
        (0..400).map(|i| format!("{{\"id\": \"t{i}\", \"prompt\": \"{i} {filler}\"}}\n")).collect::<String>()
    });
    let output = run(subagents()
        .arg("fanout")
        .arg(&many)
        .arg("--config")
        .arg(&config)
        .args(["--provider", "echo", "--out"])
        .arg(&out)
        .arg("--home")
        .arg(dir.path().join("home")));
    reader.join().unwrap();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("results lost:") && stderr.contains("was closed by its reader"), "{stderr}");
}
