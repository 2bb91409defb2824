//! What the binary accepts: flags in range, task lines it can run, a home
//! it can write, output files that cannot clobber each other or the tasks.

use super::{run, subagents, text, write_file};

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
