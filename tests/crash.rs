//! Crash consistency and hostile input at process boundaries.
//!
//! - `kill -9` of a `serve` child mid-turn: the run settles `Error`, and the
//!   child's session reloads with every complete event and no torn one.
//! - `kill -9` of a parent process mid-run: its sessions reload the same way.
//! - A runtime shutdown with a child process mid-turn leaves no process; a
//!   `serve` child whose parent vanishes (stdin EOF) exits on its own.
//! - Random and mutated JSON-RPC lines fed to `subagents serve` each get a
//!   reply (a result or a JSON-RPC error) and never hang it; random lines
//!   from a `process` or an ACP child end the parent's run cleanly.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::blocking::eventually;
use common::runtime_at as runtime;
use proptest::prelude::*;
use subagents::agent::{SessionEvent, SessionStore};
use subagents::providers::{AcpConfig, AcpProvider, ProcessConfig, ProcessProvider};
use subagents::seam::Category;
use subagents::{CancellationToken, Parent, StartRequest, StopReason};

fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_subagents"))
}

fn process_provider(name: &str, home: &Path) -> ProcessProvider {
    let mut config = ProcessConfig::new(name, home.join("children"));
    config.bin = binary();
    config.dispose_eof_grace = Duration::from_secs(2);
    ProcessProvider::new(config).unwrap()
}

fn pids_mentioning(marker: &Path) -> Vec<u32> {
    common::processes_mentioning(marker).into_iter().map(|(pid, _)| pid).collect()
}

/// `subagents serve --home HOME` with piped stdin and stdout.
fn serve(home: &Path) -> std::process::Child {
    Command::new(binary())
        .args(["serve", "--home"])
        .arg(home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Every session under `home` loads (a torn last line is dropped; an
/// earlier broken line would fail the load). With `prompted`, each must
/// also hold its first user message (a kill between a session's header and
/// its first event legitimately leaves none).
fn sessions_reload_with(home: &Path, prompted: bool) -> usize {
    let store = SessionStore::new(home);
    let Ok(ids) = store.ids() else { return 0 };
    let mut count = 0;
    for id in ids {
        let loaded = match store.load(&id) {
            Ok(loaded) => loaded,
            // Killed between creating the file and writing its header.
            Err(subagents::agent::SessionError::NotFound(_)) if !prompted => continue,
            Err(error) => panic!("session {id} does not reload: {error}"),
        };
        assert!(
            !prompted || loaded.session.events().iter().any(|e| matches!(e, SessionEvent::User { .. })),
            "session {id} lost its prompt"
        );
        count += 1;
    }
    count
}

#[test]
fn kill_9_of_a_serve_child_mid_turn_settles_error_and_its_session_reloads() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let subagents = runtime.subagents();
    subagents.register_provider(process_provider("process", home.path())).unwrap().keep();
    let children = home.path().join("children");
    let (cwd, watch) = (home.path().to_path_buf(), children.clone());
    let result = runtime.block_on(async move {
        let run = subagents.start("process", StartRequest::new("[slow] think", Parent::root(&cwd), Default::default()));
        let run = run.await.unwrap();
        // Mid-turn: the child has written its prompt and waits on its model.
        let sessions = watch.join("sessions");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_dir(&sessions).map_or(0, |d| d.count()) == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        for pid in pids_mentioning(&watch) {
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        let result = run.result().await.unwrap();
        run.dispose().await.unwrap();
        result
    });
    assert_eq!(result.stop_reason, StopReason::Error);
    assert_eq!(result.diagnostic.unwrap().category, Category::ChildCrashed);
    assert_eq!(sessions_reload(&children), 1);
    assert!(pids_mentioning(&children).is_empty());
    assert_eq!(runtime.live().processes, 0);
}

#[test]
fn runtime_shutdown_reaps_a_child_process_mid_turn() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let subagents = runtime.subagents();
    subagents.register_provider(process_provider("process", home.path())).unwrap().keep();
    let cwd = home.path().to_path_buf();
    let run = runtime.block_on(async move {
        subagents.start("process", StartRequest::new("[slow] think", Parent::root(&cwd), Default::default())).await
    });
    let run = run.unwrap();
    let children = home.path().join("children");
    assert_eq!(pids_mentioning(&children).len(), 1, "the child is running");
    let report = runtime.shutdown_blocking();
    assert!(report.live_after.is_quiescent(), "{:?}", report.live_after);
    assert!(pids_mentioning(&children).is_empty(), "no child survives its parent's runtime");
    drop(run);
    assert_eq!(sessions_reload(&children), 1);
}

#[test]
fn a_serve_child_whose_parent_vanishes_exits_on_its_own() {
    let home = tempfile::tempdir().unwrap();
    let (mut child, stdin, _stdout) = serve_thinking(home.path());
    std::thread::sleep(Duration::from_millis(100));
    drop(stdin); // the parent is gone
    assert!(eventually(Duration::from_secs(10), || child.try_wait().unwrap().is_some()), "the orphan kept running");
    assert_eq!(sessions_reload(home.path()), 1);
    let (_, events) = SessionStore::new(home.path()).read(&first_session(home.path())).unwrap();
    assert_eq!(events.last().and_then(SessionEvent::ended), Some(StopReason::Aborted), "flushed on the way out");
}

#[test]
fn a_serve_child_told_to_stop_by_a_signal_ends_its_turn_on_disk_and_exits_0() {
    for (signal, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM"), (libc::SIGHUP, "SIGHUP")] {
        let home = tempfile::tempdir().unwrap();
        let (mut child, stdin, _stdout) = serve_thinking(home.path());
        let session = first_session(home.path());
        let prompted = || {
            let events = SessionStore::new(home.path()).read(&session).map(|(_, events)| events).unwrap_or_default();
            events.iter().any(|event| matches!(event, SessionEvent::User { .. }))
        };
        assert!(eventually(Duration::from_secs(10), prompted), "{name}: the turn took its prompt");
        let began = Instant::now();
        unsafe { libc::kill(child.id() as i32, signal) };
        // Stdin stays open: the signal alone ends it.
        assert!(eventually(Duration::from_secs(10), || child.try_wait().unwrap().is_some()), "{name}: still running");
        assert!(began.elapsed() < Duration::from_secs(3), "{name}: {:?}", began.elapsed());
        assert!(child.wait().unwrap().success(), "{name}");
        let (_, events) = SessionStore::new(home.path()).read(&session).unwrap();
        assert_eq!(events.last().and_then(SessionEvent::ended), Some(StopReason::Aborted), "{name}");
        drop(stdin);
    }
}

/// A `serve` child under `home`, initialized and thinking on a `[slow]`
/// prompt (its session exists), with its stdin and stdout still open.
fn serve_thinking(
    home: &Path,
) -> (std::process::Child, std::process::ChildStdin, BufReader<std::process::ChildStdout>) {
    let mut child = serve(home);
    let mut stdin = child.stdin.take().unwrap();
    let init = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocol_version": 1, "route": {}, "profile": "default", "patches": [], "cwd": home}});
    let prompt = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "prompt",
        "params": {"prompt": [{"type": "text", "text": "[slow] think"}]}});
    writeln!(stdin, "{init}\n{prompt}").unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert!(line.contains("\"session_id\""), "{line}");
    (child, stdin, stdout)
}

fn sessions_reload(home: &Path) -> usize {
    sessions_reload_with(home, true)
}

fn first_session(home: &Path) -> String {
    SessionStore::new(home).ids().unwrap().swap_remove(0)
}

#[test]
fn kill_9_of_a_parent_process_mid_run_leaves_sessions_that_reload() {
    let home = tempfile::tempdir().unwrap();
    let tasks = home.path().join("tasks.jsonl");
    let mut file = std::fs::File::create(&tasks).unwrap();
    for n in 0..20 {
        writeln!(file, "{{\"prompt\": \"[slow] task {n}\"}}").unwrap();
        writeln!(file, "{{\"prompt\": \"quick task {n}\"}}").unwrap();
    }
    drop(file);
    let mut parent = Command::new(binary())
        .args(["fanout", "--concurrency", "8", "--home"])
        .arg(home.path())
        .arg(&tasks)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let store = SessionStore::new(home.path());
    assert!(eventually(Duration::from_secs(20), || store.ids().map_or(0, |ids| ids.len()) >= 8));
    parent.kill().unwrap(); // SIGKILL
    parent.wait().unwrap();
    assert!(sessions_reload_with(home.path(), false) >= 8);
}

/// A fresh home holding `lines` as `output.txt`, the random output a
/// stand-in child writes, and that file's path.
fn written_output(lines: &[String]) -> (tempfile::TempDir, PathBuf) {
    let home = tempfile::tempdir().unwrap();
    let output = home.path().join("output.txt");
    std::fs::write(&output, lines.join("\n")).unwrap();
    (home, output)
}

/// A run on the provider `random`, from `cwd`, settles `error` within 20 s
/// and leaves no process behind once disposed.
fn a_random_run_ends_in_error_and_leaves_no_process(
    runtime: &subagents::Runtime,
    cwd: &Path,
) -> Result<(), TestCaseError> {
    let subagents = runtime.subagents();
    let cwd = cwd.to_path_buf();
    let began = Instant::now();
    let result = runtime.block_on(async move {
        let request = StartRequest::new("go", Parent::root(&cwd), CancellationToken::new());
        let run = subagents.start("random", request).await.unwrap();
        let result = run.result().await.unwrap();
        run.dispose().await.unwrap();
        result
    });
    prop_assert!(began.elapsed() < Duration::from_secs(20));
    prop_assert_eq!(result.stop_reason, StopReason::Error);
    prop_assert_eq!(runtime.live().processes, 0);
    Ok(())
}

/// Sends `lines` to a fresh `subagents serve`, then EOF; every reply must
/// be a JSON-RPC result or error, and the process must exit in time.
fn serve_survives(lines: &[String]) -> Result<(), TestCaseError> {
    let home = tempfile::tempdir().unwrap();
    let mut child = serve(home.path());
    {
        let mut stdin = child.stdin.take().unwrap();
        for line in lines {
            // A child may stop reading (an oversized line ends the session).
            if writeln!(stdin, "{line}").is_err() {
                break;
            }
        }
    }
    let exited = eventually(Duration::from_secs(20), || child.try_wait().unwrap().is_some());
    if !exited {
        let _ = child.kill();
    }
    prop_assert!(exited, "serve hung on {lines:?}");
    let mut output = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut output).unwrap();
    for reply in output.lines() {
        let value: serde_json::Value = serde_json::from_str(reply).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let is_event = value["method"] == "event";
        prop_assert!(is_event || value.get("result").is_some() || value["error"]["code"].is_i64(), "{reply}");
    }
    Ok(())
}

fn hostile_line() -> impl Strategy<Value = String> {
    let valid = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocol_version":1,"route":{},"profile":"default","patches":[],"cwd":"/tmp"}}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"prompt","params":{"prompt":[{"type":"text","text":"hi"}]}}"#,
        r#"{"jsonrpc":"2.0","method":"cancel"}"#,
        r#"{"jsonrpc":"2.0","id":3,"method":"shutdown"}"#,
    ];
    prop_oneof![
        // Random printable garbage.
        "[ -~]{0,80}",
        // Valid messages with a byte cut off or replaced.
        (0..valid.len(), any::<prop::sample::Index>(), any::<char>()).prop_map(move |(n, at, c)| {
            let mut line: Vec<char> = valid[n].chars().collect();
            let i = at.index(line.len());
            line[i] = c;
            line.into_iter().filter(|c| *c != '\n').collect()
        }),
        (0..valid.len(), any::<prop::sample::Index>()).prop_map(move |(n, at)| {
            let line = valid[n];
            line[..at.index(line.len())].to_owned()
        }),
        // Well-formed JSON of the wrong shape.
        Just(r#"{"jsonrpc":"2.0","id":9,"method":"prompt","params":{"prompt":7}}"#.to_owned()),
        Just(r#"[1,2,3]"#.to_owned()),
        Just(r#"{"jsonrpc":"2.0","id":{"nested":true},"method":"initialize","params":null}"#.to_owned()),
        // Valid messages as they are.
        (0..valid.len()).prop_map(move |n| valid[n].to_owned()),
    ]
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(16)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn serve_answers_or_rejects_every_hostile_line(lines in prop::collection::vec(hostile_line(), 1..12)) {
        serve_survives(&lines)?;
    }

    #[test]
    fn random_child_output_ends_a_process_run_cleanly(lines in prop::collection::vec("[ -~]{0,60}", 1..6)) {
        let (home, output) = written_output(&lines);
        // Run by the shell as `sh serve --home …` from `home`: a freshly
        // written script exec'd directly can fail with ETXTBSY.
        let script = home.path().join("serve");
        std::fs::write(&script, format!(
            "#!/bin/sh\nread line\nprintf '%s\\n' '{{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{{\"protocol_version\":1,\"session_id\":\"r\"}}}}'\nread line\ncat '{}'\n",
            output.display()
        )).unwrap();
        let mut config = ProcessConfig::new("random", home.path().join("children"));
        config.bin = PathBuf::from("/bin/sh");
        config.cwd = Some(home.path().to_path_buf());
        config.shutdown_timeout = Duration::from_millis(50);
        config.dispose_eof_grace = Duration::from_millis(200);
        config.dispose_grace = Duration::from_millis(200);
        let runtime = runtime(home.path());
        let subagents = runtime.subagents();
        subagents.register_provider(ProcessProvider::new(config).unwrap()).unwrap().keep();
        a_random_run_ends_in_error_and_leaves_no_process(&runtime, home.path())?;
    }

    #[test]
    fn random_acp_agent_output_ends_the_run_cleanly(lines in prop::collection::vec("[ -~]{0,60}", 1..6)) {
        let (home, output) = written_output(&lines);
        let script = home.path().join("agent");
        std::fs::write(&script, format!(
            r#"#!/bin/sh
reply() {{
  read -r line || exit 0
  id=$(printf '%s' "$line" | sed -E 's/.*"id":("[^"]*"|[0-9]+).*/\1/')
  printf '{{"jsonrpc":"2.0","id":%s,"result":%s}}\n' "$id" "$1"
}}
reply '{{"protocolVersion":1,"agentCapabilities":{{}}}}'
reply '{{"sessionId":"s1"}}'
read -r line
cat '{}'
"#,
            output.display()
        )).unwrap();
        // The provider's probe runs the script once (initialize only); the
        // run gets a fresh process.
        let runtime = runtime(home.path());
        let subagents = runtime.subagents();
        let mut config = AcpConfig::new("random", "/bin/sh", vec![script.display().to_string()]);
        config.dispose_eof_grace = Duration::from_millis(200);
        config.dispose_grace = Duration::from_millis(200);
        let provider = runtime.block_on(async move { AcpProvider::new(config).await.unwrap() });
        subagents.register_provider(provider).unwrap().keep();
        a_random_run_ends_in_error_and_leaves_no_process(&runtime, home.path())?;
    }
}

/// Sends `lines` to a fresh `subagents serve`, closes stdin, and returns
/// every reply line once the process exited.
fn serve_replies(lines: &[&str]) -> Vec<String> {
    let home = tempfile::tempdir().unwrap();
    let mut child = serve(home.path());
    {
        let mut stdin = child.stdin.take().unwrap();
        for line in lines {
            writeln!(stdin, "{line}").unwrap();
        }
    }
    assert!(eventually(Duration::from_secs(20), || child.try_wait().unwrap().is_some()), "serve hung");
    let mut output = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut output).unwrap();
    output.lines().map(str::to_owned).filter(|line| !line.contains(r#""method":"event""#)).collect()
}

#[test]
fn serve_answers_every_non_request_with_invalid_request_and_echoes_ids_exactly() {
    let replies = serve_replies(&[
        "42",
        "[]",
        r#"[{"jsonrpc":"2.0","id":1,"method":"shutdown"}]"#,
        r#"{"jsonrpc":"2.0","id":{"a":1},"method":"prompt"}"#,
        r#"{"jsonrpc":"2.0","id":18446744073709551616,"method":"prompt"}"#,
        r#"{"jsonrpc":"2.0","id":1.5,"method":"prompt"}"#,
        r#"{"jsonrpc":"2.0","id":true,"method":"prompt"}"#,
        r#"{"jsonrpc":"2.0","id":18446744073709551615,"method":"nope"}"#,
        r#"{"jsonrpc":"2.0","id":-9223372036854775808,"method":"nope"}"#,
        r#"{"jsonrpc":"2.0","id":"relative","method":"initialize","params":{"protocol_version":1,"route":{},"profile":"default","patches":[],"cwd":"some/dir"}}"#,
        r#"{"jsonrpc":"2.0","id":"shut","method":"shutdown"}"#,
    ]);
    assert_eq!(replies.len(), 11, "{replies:#?}");
    for reply in &replies[..7] {
        let reply: serde_json::Value = serde_json::from_str(reply).unwrap();
        assert_eq!((&reply["id"], &reply["error"]["code"]), (&serde_json::Value::Null, &serde_json::json!(-32600)));
    }
    // Ids are echoed as written, never turned into floats.
    assert!(replies[7].contains(r#""id":18446744073709551615"#) && replies[7].contains("-32601"), "{}", replies[7]);
    assert!(replies[8].contains(r#""id":-9223372036854775808"#) && replies[8].contains("-32601"), "{}", replies[8]);
    assert!(replies[9].contains(r#""id":"relative""#) && replies[9].contains("-32602"), "{}", replies[9]);
    assert!(replies[9].contains("absolute"), "{}", replies[9]);
    // The receipt of a session that ran nothing: no runs, and it says so.
    assert!(
        replies[10].contains(r#""id":"shut""#) && replies[10].contains(r#""result":{"runs":[]}"#),
        "{}",
        replies[10]
    );
}
