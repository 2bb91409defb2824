//! What the binary accepts: flags in range, task lines it can run, a home
//! it can write, output files that cannot clobber each other or the tasks.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::{json_lines, line_numbers, run, subagents, text, write_file};

/// Exit code 2, nothing on stdout, and what stderr says.
fn refused(command: &mut std::process::Command) -> String {
    let output = run(command);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(output.stdout.is_empty(), "no run started: {}", text(&output.stdout));
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

#[test]
fn concurrency_outside_one_to_100000_is_a_usage_error() {
    let home = tempfile::tempdir().unwrap();
    let tasks = write_file(home.path(), "tasks.jsonl", "{\"prompt\": \"one\"}\n");
    for concurrency in ["18446744073709551615", "0", "100001", "-1"] {
        let stderr = refused(
            subagents()
                .args(["fanout", "--provider", "mock", &format!("--concurrency={concurrency}")])
                .arg(&tasks)
                .arg("--home")
                .arg(home.path()),
        );
        assert!(stderr.contains("--concurrency"), "{concurrency}: {stderr}");
        assert!(stderr.contains("Usage") || stderr.contains("--help"), "{concurrency}: a usage hint: {stderr}");
    }
    let output = run(subagents()
        .args(["fanout", "--provider", "mock", "--concurrency", "100000"])
        .arg(&tasks)
        .arg("--home")
        .arg(home.path()));
    assert!(output.status.success(), "the upper bound itself is fine: {}", text(&output.stderr));
}

#[test]
fn bad_utf8_non_object_json_and_overlong_lines_are_skipped_and_the_rest_runs() {
    let home = tempfile::tempdir().unwrap();
    let mut file = Vec::new();
    file.extend_from_slice(b"{\"prompt\": \"first\"}\n");
    file.extend_from_slice(b"{\"prompt\": \"bad \xff\xfe bytes\"}\n");
    file.extend_from_slice(b"[\"prompt\"]\n");
    file.extend_from_slice(b"\"just a string\"\n");
    file.extend_from_slice(format!("{{\"prompt\": \"{}\"}}\n", "x".repeat(300)).as_bytes());
    file.extend_from_slice(b"{\"prompt\": \"last\"}\n");
    let tasks = write_file(home.path(), "tasks.jsonl", file);
    let output = run(subagents()
        .args(["fanout", "--provider", "mock", "--max-line-bytes", "200"])
        .arg(&tasks)
        .arg("--home")
        .arg(home.path()));
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "a skipped task is a task not done: {stderr}");
    for line in 2..=5 {
        assert!(stderr.contains(&format!("tasks.jsonl:{line}: skipped")), "line {line}: {stderr}");
    }
    assert!(stderr.contains("UTF-8"), "{stderr}");
    assert!(stderr.contains("200 bytes"), "the cap is named: {stderr}");
    assert_eq!(line_numbers(&json_lines(&output.stdout)), [1, 6]);
}

#[test]
fn a_line_over_the_default_one_mebibyte_cap_is_skipped() {
    let home = tempfile::tempdir().unwrap();
    let long = format!("{{\"prompt\": \"{}\"}}\n", "x".repeat(1024 * 1024));
    let tasks = write_file(home.path(), "tasks.jsonl", format!("{long}{{\"prompt\": \"short\"}}\n"));
    let output = run(subagents().args(["fanout", "--provider", "mock"]).arg(&tasks).arg("--home").arg(home.path()));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("tasks.jsonl:1: skipped"), "{stderr}");
    assert_eq!(line_numbers(&json_lines(&output.stdout)), [2]);
}

#[test]
fn a_home_that_is_not_a_writable_directory_is_refused_before_any_run() {
    let scratch = tempfile::tempdir().unwrap();
    let tasks = write_file(scratch.path(), "tasks.jsonl", "{\"prompt\": \"one\"}\n");
    let regular_file = write_file(scratch.path(), "a-file", "");
    let mut homes = vec![(regular_file.clone(), "a-file"), (regular_file.join("below"), "a-file/below")];
    // Root writes anywhere: a read-only directory only refuses other users.
    if unsafe { libc::geteuid() } != 0 {
        let read_only = scratch.path().join("read-only");
        std::fs::create_dir(&read_only).unwrap();
        std::fs::set_permissions(&read_only, std::fs::Permissions::from_mode(0o500)).unwrap();
        homes.push((read_only, "read-only"));
    }
    for (home, what) in homes {
        let stderr = refused(subagents().arg("fanout").arg(&tasks).arg("--home").arg(&home));
        assert_eq!(stderr.trim().lines().count(), 1, "{what}: one line: {stderr}");
        assert!(stderr.contains("home"), "{what}: {stderr}");
        assert!(stderr.contains("os error"), "{what}: the OS error is named: {stderr}");
        let stderr = refused(subagents().args(["run", "hi", "--home"]).arg(&home));
        assert!(stderr.contains("os error"), "{what}: {stderr}");
    }
}

#[test]
fn a_sessions_directory_that_is_a_symlink_is_refused_and_its_target_keeps_its_mode() {
    let scratch = tempfile::tempdir().unwrap();
    let tasks = write_file(scratch.path(), "tasks.jsonl", "{\"prompt\": \"one\"}\n");
    let elsewhere = scratch.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o755)).unwrap();
    let home = scratch.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::os::unix::fs::symlink(&elsewhere, home.join("sessions")).unwrap();
    let stderr = refused(subagents().arg("fanout").arg(&tasks).arg("--home").arg(&home));
    assert!(stderr.contains("sessions is a symbolic link"), "{stderr}");
    let stderr = refused(subagents().args(["run", "hi", "--home"]).arg(&home));
    assert!(stderr.contains("sessions is a symbolic link"), "{stderr}");
    let mode = std::fs::metadata(&elsewhere).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o755, "the link's target is not ours to chmod");
    assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0, "nothing was written through the link");
}

#[test]
fn out_and_trace_naming_one_file_or_the_tasks_file_are_refused_up_front() {
    let scratch = tempfile::tempdir().unwrap();
    let home = scratch.path().join("home");
    let tasks_text = "{\"prompt\": \"one\"}\n{\"prompt\": \"two\"}\n";
    let tasks = write_file(scratch.path(), "tasks.jsonl", tasks_text);
    let hard_link = scratch.path().join("same-tasks.jsonl");
    std::fs::hard_link(&tasks, &hard_link).unwrap();
    let results = scratch.path().join("results.jsonl");
    let dotted = scratch.path().join(".").join("results.jsonl");
    let cases: Vec<(&str, &Path, &Path)> = vec![
        ("--out and --trace", &results, &dotted),
        ("--out is the tasks file", &tasks, &results),
        ("--out is a hard link of the tasks file", &hard_link, &results),
        ("--trace is the tasks file", &results, &tasks),
    ];
    for (what, out, trace) in cases {
        let _ = std::fs::remove_file(&results);
        let stderr = refused(
            subagents()
                .args(["fanout", "--provider", "mock"])
                .arg(&tasks)
                .arg("--out")
                .arg(out)
                .arg("--trace")
                .arg(trace)
                .arg("--home")
                .arg(&home),
        );
        assert!(stderr.contains("same file"), "{what}: {stderr}");
        assert_eq!(std::fs::read_to_string(&tasks).unwrap(), tasks_text, "{what}: the tasks file is untouched");
        assert!(!results.exists() || std::fs::read(&results).unwrap().is_empty(), "{what}: nothing was written");
    }
}

#[test]
fn an_unwritable_trace_is_refused_before_any_run() {
    let scratch = tempfile::tempdir().unwrap();
    let tasks = write_file(scratch.path(), "tasks.jsonl", "{\"prompt\": \"one\"}\n");
    for trace in [scratch.path().to_path_buf(), scratch.path().join("no/such/dir/trace.json")] {
        let stderr = refused(
            subagents()
                .args(["fanout", "--provider", "mock"])
                .arg(&tasks)
                .arg("--trace")
                .arg(&trace)
                .arg("--home")
                .arg(scratch.path().join("home")),
        );
        assert!(stderr.contains("cannot create") && stderr.contains("os error"), "{trace:?}: {stderr}");
        assert!(!stderr.contains("runs/s"), "{trace:?}: no batch ran: {stderr}");
    }
}

#[test]
fn a_zero_budget_and_an_empty_prompt_are_usage_errors_and_a_fractional_deadline_is_a_duration() {
    let home = tempfile::tempdir().unwrap();
    let tasks = write_file(home.path(), "tasks.jsonl", "{\"prompt\": \"one\"}\n");
    for flag in ["--budget-depth=0", "--budget-width=0", "--budget-runs=0", "--budget-tokens=0", "--budget-deadline=0s"]
    {
        let stderr = refused(
            subagents().args(["fanout", "--provider", "mock", flag]).arg(&tasks).arg("--home").arg(home.path()),
        );
        assert!(stderr.contains(flag.split('=').next().unwrap()), "{flag}: {stderr}");
    }
    let stderr = refused(subagents().args(["run", "  ", "--home"]).arg(home.path()));
    assert!(stderr.contains("the prompt is empty"), "{stderr}");
    let output = run(subagents()
        .args(["fanout", "--provider", "mock", "--budget-deadline", "1.5s"])
        .arg(&tasks)
        .arg("--home")
        .arg(home.path()));
    assert!(output.status.success(), "1.5s is a deadline: {}", text(&output.stderr));
    assert_eq!(json_lines(&output.stdout)[0]["stop_reason"], "completed");
}

#[test]
fn a_task_budget_must_be_an_object_with_limits_of_at_least_one() {
    let home = tempfile::tempdir().unwrap();
    let lines = "{\"prompt\": \"positional\", \"budget\": [0]}\n{\"prompt\": \"zero\", \"budget\": {\"runs\": 0}}\n\
                 {\"prompt\": \"fine\", \"budget\": {\"runs\": 5}}\n";
    let tasks = write_file(home.path(), "tasks.jsonl", lines);
    let output = run(subagents().args(["fanout", "--provider", "mock"]).arg(&tasks).arg("--home").arg(home.path()));
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "two lines were skipped: {stderr}");
    assert!(stderr.contains(":1: skipped") && stderr.contains("budget must be an object"), "{stderr}");
    assert!(stderr.contains(":2: skipped") && stderr.contains("admits no run"), "{stderr}");
    assert_eq!(line_numbers(&json_lines(&output.stdout)), [3]);
}
