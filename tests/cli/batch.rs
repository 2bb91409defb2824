//! How a command ends (its exit code, its session after Ctrl-C) and what a
//! batch costs (memory that follows the concurrency, not the file).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{peak_rss_kib, run, subagents, text, write_file};

/// `n` mock-sized task lines.
fn many_tasks(dir: &Path, name: &str, n: usize) -> std::path::PathBuf {
    let path = dir.join(name);
    let mut file = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    for n in 0..n {
        writeln!(file, "{{\"prompt\": \"task {n}\"}}").unwrap();
    }
    file.flush().unwrap();
    path
}

#[test]
fn fanout_memory_follows_the_concurrency_not_the_number_of_tasks() {
    let scratch = tempfile::tempdir().unwrap();
    let peak_for = |n: usize| {
        let tasks = many_tasks(scratch.path(), &format!("{n}.jsonl"), n);
        let (status, peak) = peak_rss_kib(
            subagents()
                .args(["fanout", "--provider", "mock", "--concurrency", "1000"])
                .arg(&tasks)
                .arg("--home")
                .arg(scratch.path().join("home")),
        );
        assert!(status.success(), "{n} tasks: {status:?}");
        peak
    };
    let few = peak_for(5_000);
    let many = peak_for(50_000);
    // 45,000 more finished runs may cost their latencies (4 bytes each) and
    // allocator noise, nothing like the 5 KB per run a kept record costs.
    let grown = many.saturating_sub(few);
    assert!(grown < 12 * 1024, "peak RSS grew {grown} KiB from 5,000 to 50,000 tasks ({few} → {many} KiB)");
}

#[test]
fn ctrl_c_during_run_exits_130_and_leaves_a_whole_session() {
    let home = tempfile::tempdir().unwrap();
    // `[slow]` holds the parent's turn open for a minute, cancellably.
    let mut child = subagents()
        .args(["run", "think it over [slow]", "--home"])
        .arg(home.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sessions = home.path().join("sessions");
    let deadline = Instant::now() + Duration::from_secs(20);
    let store = subagents::agent::SessionStore::new(home.path());
    let has_a_turn = || {
        let ids = store.ids().unwrap_or_default();
        ids.iter().any(|id| store.read(id).is_ok_and(|(_, events)| !events.is_empty()))
    };
    while !has_a_turn() {
        assert!(Instant::now() < deadline, "the parent never started its turn");
        std::thread::sleep(Duration::from_millis(20));
    }
    let interrupted = Instant::now();
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let output = loop {
        if child.try_wait().unwrap().is_some() {
            break child.wait_with_output().unwrap();
        }
        assert!(interrupted.elapsed() < Duration::from_secs(10), "run did not exit promptly");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(output.status.code(), Some(130), "{}", text(&output.stderr));
    let ids = store.ids().unwrap();
    assert_eq!(ids.len(), 1, "{ids:?}");
    let stored = store.inspect(&ids[0]).expect("the session loads");
    assert!(!stored.torn, "no torn line");
    let ended = stored.events.iter().any(|e| matches!(e, subagents::agent::SessionEvent::TurnEnd { .. }));
    assert!(ended, "the turn's end was kept: {:?}", stored.events);
    let files: Vec<_> = std::fs::read_dir(&sessions).unwrap().flatten().map(|e| e.path()).collect();
    for file in files {
        let written = std::fs::read_to_string(&file).unwrap();
        assert!(written.is_empty() || written.ends_with('\n'), "whole lines only: {written}");
    }
}

#[test]
fn exit_codes_say_whether_the_work_was_carried_out() {
    let home = tempfile::tempdir().unwrap();
    let code = |command: &mut Command| {
        let output = run(command.arg("--home").arg(home.path()));
        output.status.code()
    };
    let all_complete = write_file(home.path(), "fine.jsonl", "{\"prompt\": \"one\"}\n{\"prompt\": \"two\"}\n");
    let one_fails = write_file(home.path(), "fails.jsonl", "{\"prompt\": \"one\"}\n{\"prompt\": \"two [fail]\"}\n");
    let one_refused = write_file(home.path(), "refused.jsonl", "{\"prompt\": \"no [refuse]\"}\n");
    let skipped_line = write_file(home.path(), "skipped.jsonl", "{\"prompt\": \"one\"}\n[\"not an object\"]\n");
    assert_eq!(code(subagents().arg("fanout").arg(&all_complete)), Some(0));
    // A batch whose every task ran and was written is carried out, whatever
    // each run's stop reason (that is in its result line).
    assert_eq!(code(subagents().arg("fanout").arg(&one_fails)), Some(0));
    assert_eq!(code(subagents().arg("fanout").arg(&one_refused)), Some(0));
    assert_eq!(code(subagents().arg("fanout").arg(&skipped_line)), Some(1), "a skipped line is work not done");
    // --strict: a run that did not complete fails the batch too.
    assert_eq!(code(subagents().args(["fanout", "--strict"]).arg(&all_complete)), Some(0));
    assert_eq!(code(subagents().args(["fanout", "--strict"]).arg(&one_fails)), Some(1));
    assert_eq!(code(subagents().args(["fanout", "--strict"]).arg(&one_refused)), Some(1));
    assert_eq!(code(subagents().args(["run", "hello"])), Some(0));
    assert_eq!(code(subagents().args(["run", "hello [fail]"])), Some(1));
}
