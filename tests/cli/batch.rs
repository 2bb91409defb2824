//! How a command ends (its exit code, its session after Ctrl-C) and what a
//! batch costs (memory that follows the concurrency, not the file).

use std::io::Write;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::time::Duration;

use super::subagents;

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

/// Runs `command` to its end, polling its peak resident set (VmHWM) from
/// /proc; the last reading before exit is the peak, since VmHWM never falls.
fn peak_rss_kib(command: &mut Command) -> (ExitStatus, u64) {
    let mut child = command.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return (status, peak);
        }
        let status = std::fs::read_to_string(&status_file).unwrap_or_default();
        let high_water = status.lines().find_map(|l| l.strip_prefix("VmHWM:"));
        if let Some(kib) = high_water.and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok()) {
            peak = peak.max(kib);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
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
