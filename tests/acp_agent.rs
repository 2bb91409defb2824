//! SPEC §7, "As an ACP agent": `subagents acp` driven over raw
//! newline-delimited JSON-RPC on its stdin and stdout, the way any ACP
//! client would — permission by offered option and kind, session-unique
//! tool call ids, the safe diagnostic of a failed turn.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tempfile::TempDir;

/// How long any single answer may take.
const ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// A raw ACP client talking to `subagents acp --home <tempdir>/home`, with
/// the tempdir as its cwd and stderr kept in `<tempdir>/stderr.log`.
struct Peer {
    dir: TempDir,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Peer {
    fn start(extra: &[&str]) -> Peer {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("visible.txt"), "x").unwrap();
        let stderr = File::create(dir.path().join("stderr.log")).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_subagents"))
            .arg("acp")
            .arg("--home")
            .arg(dir.path().join("home"))
            .args(extra)
            .current_dir(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { break };
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Peer { stdin: child.stdin.take(), dir, child, lines }
    }

    fn cwd(&self) -> &Path {
        self.dir.path()
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        self.stdin.as_mut().expect("stdin is open").write_all(bytes).unwrap();
    }

    fn send(&mut self, message: Value) {
        self.send_raw(format!("{message}\n").as_bytes());
    }

    fn request(&mut self, id: u64, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
    }

    fn next_line(&self) -> String {
        match self.lines.recv_timeout(ANSWER_WITHIN) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => panic!("no line within {ANSWER_WITHIN:?}"),
            Err(RecvTimeoutError::Disconnected) => panic!("stdout ended (the agent exited)"),
        }
    }

    fn next(&self) -> Value {
        serde_json::from_str(&self.next_line()).unwrap()
    }

    /// Reads up to the answer to `id`, answering permission requests with
    /// `permit` (it gets the request's params and returns the chosen option
    /// id). Returns the answer and the `session/update` params before it.
    fn answer_to(&mut self, id: u64, mut permit: impl FnMut(&Value) -> String) -> (Value, Vec<Value>) {
        let mut updates = Vec::new();
        loop {
            let message = self.next();
            match message["method"].as_str() {
                Some("session/update") => updates.push(message["params"].clone()),
                Some("session/request_permission") => {
                    let option = permit(&message["params"]);
                    let outcome = json!({"outcome": {"outcome": "selected", "optionId": option}});
                    self.send(json!({"jsonrpc": "2.0", "id": message["id"], "result": outcome}));
                }
                Some(other) => panic!("unexpected request {other}"),
                None if message["id"] == json!(id) => return (message, updates),
                None => panic!("an answer to another request: {message}"),
            }
        }
    }

    /// `initialize` (id 1) and `session/new` (id 2); the session id.
    fn handshake(&mut self) -> String {
        self.request(1, "initialize", json!({"protocolVersion": 1}));
        let (initialized, _) = self.answer_to(1, no_permission);
        assert!(initialized.get("result").is_some(), "{initialized}");
        let cwd = self.cwd().display().to_string();
        self.request(2, "session/new", json!({"cwd": cwd, "mcpServers": []}));
        let (session, _) = self.answer_to(2, no_permission);
        session["result"]["sessionId"].as_str().expect("a session id").to_owned()
    }

    fn prompt(&mut self, id: u64, session: &str, text: &str) {
        let prompt = json!([{"type": "text", "text": text}]);
        self.request(id, "session/prompt", json!({"sessionId": session, "prompt": prompt}));
    }

    fn exit_status(&mut self, within: Duration) -> ExitStatus {
        drop(self.stdin.take());
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "still running after {within:?}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap()
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn no_permission(params: &Value) -> String {
    panic!("no permission request expected: {params}")
}

/// The text the agent streamed.
fn text_of(updates: &[Value]) -> String {
    updates
        .iter()
        .filter(|u| u["update"]["sessionUpdate"] == "agent_message_chunk")
        .filter_map(|u| u["update"]["content"]["text"].as_str())
        .collect()
}

/// Every tool call id in `updates`, as (kind, id).
fn tool_call_ids(updates: &[Value]) -> Vec<(String, String)> {
    updates
        .iter()
        .filter_map(|u| {
            let kind = u["update"]["sessionUpdate"].as_str()?;
            let id = u["update"]["toolCallId"].as_str()?;
            Some((kind.to_owned(), id.to_owned()))
        })
        .collect()
}

#[test]
fn an_option_id_never_offered_does_not_run_the_tool() {
    let mut peer = Peer::start(&["--approve", "list_dir"]);
    let session = peer.handshake();
    let mut offered = Vec::new();
    peer.prompt(3, &session, "list the files");
    let (answer, updates) = peer.answer_to(3, |params| {
        offered = params["options"].as_array().unwrap().iter().map(|o| o["optionId"].clone()).collect();
        "allowXYZ-not-offered".to_owned()
    });
    assert!(!offered.is_empty() && !offered.contains(&json!("allowXYZ-not-offered")), "{offered:?}");
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let text = text_of(&updates);
    assert!(text.contains("did not allow") && !text.contains("visible.txt"), "the tool ran: {text}");
    let failed =
        updates.iter().any(|u| u["update"]["sessionUpdate"] == "tool_call_update" && u["update"]["status"] == "failed");
    assert!(failed, "{updates:?}");
}

#[test]
fn allow_always_is_remembered_for_that_tool_for_the_rest_of_the_session() {
    let mut peer = Peer::start(&["--approve", "list_dir"]);
    let session = peer.handshake();
    let mut asked = 0;
    for (id, choice) in [(3, "allow-once"), (4, "allow-always"), (5, "none: it must not ask")] {
        peer.prompt(id, &session, "list the files");
        let (answer, updates) = peer.answer_to(id, |_| {
            asked += 1;
            choice.to_owned()
        });
        assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
        assert!(text_of(&updates).contains("visible.txt"), "prompt {id}: {}", text_of(&updates));
    }
    assert_eq!(asked, 2, "allow-once asks again next time; allow-always does not");
}

#[test]
fn tool_call_ids_are_unique_across_a_sessions_prompts_and_match_the_permission_request() {
    let mut peer = Peer::start(&["--approve", "list_dir"]);
    let session = peer.handshake();
    let mut per_prompt = Vec::new();
    for id in [3, 4] {
        let mut asked_for = Vec::new();
        peer.prompt(id, &session, "list the files");
        let (_, updates) = peer.answer_to(id, |params| {
            asked_for.push(params["toolCall"]["toolCallId"].as_str().unwrap().to_owned());
            "allow-once".to_owned()
        });
        let calls = tool_call_ids(&updates);
        let started: Vec<&String> = calls.iter().filter(|(kind, _)| kind == "tool_call").map(|(_, id)| id).collect();
        assert_eq!(started.len(), 1, "{calls:?}");
        assert!(calls.iter().all(|(_, id)| id == started[0]), "tool_call and its updates share the id: {calls:?}");
        assert_eq!(asked_for, vec![started[0].clone()], "the permission request names the same call");
        per_prompt.push(started[0].clone());
    }
    assert_ne!(per_prompt[0], per_prompt[1], "a toolCallId repeated within the session");
}

#[test]
fn a_failed_turn_answers_with_the_safe_diagnostic_and_logs_it() {
    let mut peer = Peer::start(&[]);
    let session = peer.handshake();
    peer.prompt(3, &session, "[fail] summarise private-words-7781");
    let (answer, _) = peer.answer_to(3, no_permission);
    let error = &answer["error"];
    assert_eq!(error["code"], -32603, "{answer}");
    assert_eq!(
        error["data"],
        json!({"stage": "session-run", "category": "model", "reason": "the scripted model failed"}),
        "{answer}"
    );
    assert!(!answer.to_string().contains("private-words-7781"), "the prompt leaked: {answer}");
    assert!(peer.exit_status(ANSWER_WITHIN).success());
    let stderr = peer.stderr();
    assert!(stderr.contains("WARN") && stderr.contains("the scripted model failed"), "{stderr}");
    assert!(!stderr.contains("private-words-7781"), "{stderr}");
}
