//! How `subagents mcp` starts and stops: what it refuses before serving
//! (exit 2, as `run` and `fanout` do), and how a signal ends it (the way
//! stdin EOF does: every run stopped with its reason on record, exit 0).

use std::fs::File;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use subagents::agent::SessionEvent;
use subagents::StopReason;

use super::support::{session_count, sessions, Raw};
use crate::common::blocking::wait_until;
use crate::common::line_peer::ANSWER_WITHIN;

/// `subagents mcp ARGS` with `env`, stdin closed at once: its exit code and
/// what it said on stderr.
fn start(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_subagents"))
        .arg("mcp")
        .args(args)
        .envs(env.iter().copied())
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut status = None;
    wait_until(ANSWER_WITHIN, "subagents mcp to exit", || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    (status.unwrap().code(), std::fs::read_to_string(log).unwrap())
}

#[test]
fn a_home_that_cannot_take_sessions_or_an_unreachable_model_endpoint_is_exit_2_before_serving() {
    let scratch = tempfile::tempdir().unwrap();
    let regular_file = scratch.path().join("a-file");
    std::fs::write(&regular_file, "").unwrap();
    let below = regular_file.join("below");
    let mut homes = vec![regular_file.display().to_string(), below.display().to_string()];
    // Root writes anywhere: a read-only directory only refuses other users.
    if unsafe { libc::geteuid() } != 0 {
        use std::os::unix::fs::PermissionsExt;
        let read_only = scratch.path().join("read-only");
        std::fs::create_dir(&read_only).unwrap();
        std::fs::set_permissions(&read_only, std::fs::Permissions::from_mode(0o500)).unwrap();
        homes.push(read_only.display().to_string());
    }
    for home in &homes {
        let (code, stderr) = start(&["--home", home], &[]);
        assert_eq!(code, Some(2), "{home}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{home}: one line: {stderr}");
        assert!(stderr.contains("is not a writable directory") && stderr.contains("os error"), "{home}: {stderr}");
    }

    // A port nothing listens on.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("http://127.0.0.1:{port}/v1");
    let home = scratch.path().join("home").display().to_string();
    for provider in ["spawn", "process"] {
        let args = ["--home", &home, "--provider", provider, "--model", "openai:gpt-test"];
        let (code, stderr) = start(&args, &[("SUBAGENTS_BASE_URL", &url)]);
        assert_eq!(code, Some(2), "{provider}: {stderr}");
        assert!(stderr.contains(&format!("model endpoint {url} is unreachable")), "{provider}: {stderr}");
    }
    // Reachable, it serves (and EOF ends it at once).
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let (code, stderr) = start(&["--home", &home, "--model", "openai:gpt-test"], &[("SUBAGENTS_BASE_URL", &url)]);
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn sigint_sigterm_and_sighup_end_the_server_as_eof_does_and_every_run_records_its_stop() {
    for (signal, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM"), (libc::SIGHUP, "SIGHUP")] {
        let mut raw = Raw::start(&[]);
        raw.handshake();
        raw.call(2, "subagent", json!({"description": "slow", "prompt": "[slow] take your time"}));
        raw.call(3, "subagent", json!({"description": "later", "prompt": "[slow] and you", "run_in_background": true}));
        assert_eq!(raw.answer()["id"], 3, "{name}");
        wait_until(ANSWER_WITHIN, "both runs to start", || session_count(&raw.home()) == 2);
        let prompted = |events: &Vec<SessionEvent>| events.iter().any(|e| matches!(e, SessionEvent::User { .. }));
        wait_until(ANSWER_WITHIN, "both runs to take their prompt", || {
            let sessions = sessions(&raw.home());
            sessions.len() == 2 && sessions.iter().all(prompted)
        });
        let began = Instant::now();
        raw.signal(signal);
        let status = raw.wait_for_exit(Duration::from_secs(10));
        let took = began.elapsed();
        assert!(status.success(), "{name}: {status}");
        assert!(took < Duration::from_secs(3), "{name}: {took:?}");
        let rest = raw.read_rest(ANSWER_WITHIN);
        let answered = rest.iter().find(|m| m["id"] == 2).unwrap_or_else(|| panic!("{name}: {rest:?}"));
        assert_eq!(answered["result"]["content"][0]["text"], "subagent run was cancelled", "{name}");
        for events in sessions(&raw.home()) {
            assert_eq!(events.last().and_then(SessionEvent::ended), Some(StopReason::Aborted), "{name}");
        }
    }
}
