//! docs/contract.md §7.7, the ACP agent: `subagents acp` driven over raw
//! newline-delimited JSON-RPC on its stdin and stdout, the way any ACP
//! client would — permission by offered option and kind, session-unique
//! tool call ids, the safe diagnostic of a failed turn, bounded lines, a bad
//! line costing one error reply, every request answered at EOF, and the
//! handshake's rules.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::line_peer::{LinePeer, ANSWER_WITHIN};

/// A raw ACP client talking to `subagents acp --home <tempdir>/home` (or
/// `$SUBAGENTS_HOME` set to it), with
/// the tempdir as its cwd and stderr kept in `<tempdir>/stderr.log`.
struct Peer(LinePeer);

/// How the agent is told its home: `--home`, or only `$SUBAGENTS_HOME`.
enum Home {
    Flag,
    Variable,
}

impl Peer {
    fn start(extra: &[&str]) -> Peer {
        Peer::spawn(extra, Home::Flag)
    }

    fn spawn(extra: &[&str], home: Home) -> Peer {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("visible.txt"), "x").unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_subagents"));
        command.arg("acp").env_remove("SUBAGENTS_HOME");
        match home {
            Home::Flag => command.arg("--home").arg(dir.path().join("home")),
            Home::Variable => command.env("SUBAGENTS_HOME", dir.path().join("home")),
        };
        command.args(extra).current_dir(dir.path());
        Peer(LinePeer::spawn(command, dir))
    }

    fn cwd(&self) -> &Path {
        self.dir.path()
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
}

impl std::ops::Deref for Peer {
    type Target = LinePeer;

    fn deref(&self) -> &LinePeer {
        &self.0
    }
}

impl std::ops::DerefMut for Peer {
    fn deref_mut(&mut self) -> &mut LinePeer {
        &mut self.0
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
fn an_over_long_line_costs_one_short_parse_error_and_bounded_memory() {
    let mut peer = Peer::start(&[]);
    let line = vec![b'a'; 40 << 20];
    peer.send_raw(&line);
    peer.send_raw(b"\n");
    drop(line);
    peer.request(1, "initialize", json!({"protocolVersion": 1}));
    let refused = peer.next_line();
    assert!(refused.len() < 400, "the reply echoes the line: {} bytes", refused.len());
    let refused: Value = serde_json::from_str(&refused).unwrap();
    assert_eq!((refused["id"].clone(), refused["error"]["code"].clone()), (Value::Null, json!(-32700)), "{refused}");
    let (initialized, _) = peer.answer_to(1, no_permission);
    assert!(initialized.get("result").is_some(), "the agent serves on: {initialized}");
    let peak = peer.peak_rss();
    assert!(peak < 100 << 20, "peak RSS {} MiB for a 40 MiB line", peak >> 20);
    assert!(peer.exit_status(ANSWER_WITHIN).success());
}

#[test]
fn invalid_utf8_costs_one_parse_error_and_the_agent_keeps_serving() {
    let mut peer = Peer::start(&[]);
    peer.send_raw(
        b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1,\"x\":\"\xff\"}}\n",
    );
    peer.request(2, "initialize", json!({"protocolVersion": 1}));
    let refused = peer.next();
    assert_eq!((refused["id"].clone(), refused["error"]["code"].clone()), (Value::Null, json!(-32700)), "{refused}");
    let (initialized, _) = peer.answer_to(2, no_permission);
    assert!(initialized.get("result").is_some(), "{initialized}");
    assert!(peer.exit_status(ANSWER_WITHIN).success());
}

#[test]
fn at_eof_every_request_in_flight_is_answered_exactly_once_then_the_agent_exits_0() {
    let mut peer = Peer::start(&[]);
    let session = peer.handshake();
    // A slow turn first (the scripted model binds `[slow]` on a session's
    // first prompt), so every other prompt is queued behind it at EOF.
    let ids: Vec<u64> = (100..400).collect();
    let mut burst = String::new();
    for &id in &ids {
        let text = if id == 100 { "[slow] hold the line".to_owned() } else { format!("task {id}") };
        let prompt = json!([{"type": "text", "text": text}]);
        let request = json!({"jsonrpc": "2.0", "id": id, "method": "session/prompt",
                             "params": {"sessionId": session, "prompt": prompt}});
        burst.push_str(&format!("{request}\n"));
    }
    peer.send_raw(burst.as_bytes());
    let began = Instant::now();
    let rest = peer.close_and_read_rest(Duration::from_secs(60));
    let mut answers: HashMap<u64, Vec<Value>> = HashMap::new();
    for message in rest.into_iter().filter(|m| m.get("method").is_none()) {
        answers.entry(message["id"].as_u64().expect("a numeric id")).or_default().push(message);
    }
    for id in &ids {
        let answered = answers.remove(id).unwrap_or_default();
        assert_eq!(answered.len(), 1, "request {id} answered {} times", answered.len());
        assert_eq!(answered[0]["result"]["stopReason"], "cancelled", "{id} was cut off by EOF: {}", answered[0]);
    }
    assert!(answers.is_empty(), "answers to ids never sent: {:?}", answers.keys());
    assert!(peer.exit_status(Duration::from_secs(30)).success());
    assert!(began.elapsed() < Duration::from_secs(60), "{:?}", began.elapsed());
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

#[test]
fn a_second_initialize_is_refused_with_its_id() {
    let mut peer = Peer::start(&[]);
    peer.request(1, "initialize", json!({"protocolVersion": 1}));
    let (first, _) = peer.answer_to(1, no_permission);
    assert!(first.get("result").is_some(), "{first}");
    peer.request(2, "initialize", json!({"protocolVersion": 1}));
    let (second, _) = peer.answer_to(2, no_permission);
    assert_eq!(second["error"]["code"], -32600, "{second}");
    assert_eq!(second["error"]["data"]["reason"], "already initialized", "{second}");
}

#[test]
fn initialize_with_non_object_params_is_invalid_params_with_its_id_and_may_be_retried() {
    let mut peer = Peer::start(&[]);
    for (id, params) in [(7, json!(5)), (8, json!([1])), (9, json!("x"))] {
        peer.request(id, "initialize", params);
        let (refused, _) = peer.answer_to(id, no_permission);
        assert_eq!(refused["error"]["code"], -32602, "{refused}");
    }
    peer.request(10, "initialize", json!({"protocolVersion": 1}));
    let (initialized, _) = peer.answer_to(10, no_permission);
    assert!(initialized.get("result").is_some(), "{initialized}");
}

#[test]
fn initialize_and_session_new_may_be_written_back_to_back() {
    let mut peer = Peer::start(&[]);
    let cwd = peer.cwd().display().to_string();
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}});
    let new_session = json!({"jsonrpc": "2.0", "id": 2, "method": "session/new",
                             "params": {"cwd": cwd, "mcpServers": []}});
    peer.send_raw(format!("{initialize}\n{new_session}\n").as_bytes());
    let (initialized, _) = peer.answer_to(1, no_permission);
    assert!(initialized.get("result").is_some(), "{initialized}");
    let (session, _) = peer.answer_to(2, no_permission);
    assert!(session["result"]["sessionId"].is_string(), "{session}");
}

/// The text content of every `tool_call_update` of `call_id`, in order.
fn progress_of(updates: &[Value], call_id: &str) -> Vec<String> {
    updates
        .iter()
        .filter(|u| u["update"]["sessionUpdate"] == "tool_call_update" && u["update"]["toolCallId"] == call_id)
        .filter_map(|u| u["update"]["content"].as_array())
        .flat_map(|content| content.iter().filter_map(|c| c["content"]["text"].as_str().map(str::to_owned)))
        .collect()
}

#[test]
fn a_subagent_call_shows_what_the_child_was_asked_and_streams_what_it_does() {
    let mut peer = Peer::start(&[]);
    let session = peer.handshake();
    // The demo model delegates each `;`-separated part; its children list
    // the directory when a task mentions files.
    peer.prompt(3, &session, "list the files here; summarise the changelog");
    let (answer, updates) = peer.answer_to(3, no_permission);
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    let calls: Vec<&Value> = updates.iter().filter(|u| u["update"]["sessionUpdate"] == "tool_call").collect();
    assert_eq!(calls.len(), 2, "{updates:?}");
    let asked = calls.iter().find(|c| c["update"]["title"] == "subagent: list the files here").expect("a titled call");
    assert_eq!(asked["update"]["kind"], "think");
    assert_eq!(asked["update"]["rawInput"]["prompt"], "list the files here");
    let call_id = asked["update"]["toolCallId"].as_str().unwrap();
    let progress = progress_of(&updates, call_id);
    let last = progress.last().unwrap_or_else(|| panic!("the child's activity is streamed: {updates:?}"));
    assert!(last.contains("[list_dir: "), "the child's own tool call shows: {last}");
    assert!(last.contains("visible.txt"), "the child's text shows: {last}");
}

#[test]
fn a_stop_signal_ends_the_agent_as_eof_does_with_the_turn_answered_and_on_disk() {
    use subagents::agent::{SessionEvent, SessionStore};
    for (signal, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM"), (libc::SIGHUP, "SIGHUP")] {
        let mut peer = Peer::start(&[]);
        let session = peer.handshake();
        peer.prompt(3, &session, "[slow] hold the line");
        let home = peer.cwd().join("home");
        let store = SessionStore::new(&home);
        let prompted = || {
            let events = store.read(&session).map(|(_, events)| events).unwrap_or_default();
            events.iter().any(|event| matches!(event, SessionEvent::User { .. }))
        };
        let deadline = Instant::now() + ANSWER_WITHIN;
        while !prompted() {
            assert!(Instant::now() < deadline, "{name}: the turn never took its prompt");
            std::thread::sleep(Duration::from_millis(20));
        }
        let began = Instant::now();
        assert_eq!(unsafe { libc::kill(peer.child.id() as i32, signal) }, 0);
        // Stdin stays open: the signal alone ends it.
        let (answer, _) = peer.answer_to(3, no_permission);
        assert_eq!(answer["result"]["stopReason"], "cancelled", "{name}: {answer}");
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = peer.child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "{name}: still running after the signal");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "{name}: {status}");
        assert!(began.elapsed() < Duration::from_secs(3), "{name}: {:?}", began.elapsed());
        let (_, events) = store.read(&session).unwrap();
        assert_eq!(events.last().and_then(SessionEvent::ended), Some(subagents::StopReason::Aborted), "{name}");
    }
}

#[test]
fn without_home_the_sessions_are_kept_under_subagents_home_like_every_command() {
    use subagents::agent::SessionStore;
    let mut peer = Peer::spawn(&[], Home::Variable);
    let session = peer.handshake();
    peer.prompt(3, &session, "say hello");
    let (answer, _) = peer.answer_to(3, no_permission);
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
    peer.close_and_read_rest(ANSWER_WITHIN);
    assert!(peer.exit_status(ANSWER_WITHIN).success(), "{}", peer.stderr());
    let store = SessionStore::new(peer.cwd().join("home"));
    assert!(store.read(&session).is_ok(), "the session is under $SUBAGENTS_HOME: {}", peer.stderr());
    assert!(!peer.cwd().join(".subagents").exists(), "nothing under the working directory's .subagents");
}

/// Opens `count` sessions, prompts each once and, with `close`, closes each
/// (requests written in bursts of `burst` sessions, ids from `next_id`);
/// the sessions' ids.
fn sessions_served(peer: &mut Peer, (count, burst): (usize, usize), next_id: &mut u64, close: bool) -> Vec<String> {
    let cwd = peer.cwd().display().to_string();
    let mut take_id = || {
        *next_id += 1;
        *next_id
    };
    let answers = |peer: &mut Peer, requests: Vec<(u64, &str, Value)>| -> Vec<Value> {
        let burst: String = requests
            .iter()
            .map(|(id, method, params)| {
                format!("{}\n", json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            })
            .collect();
        peer.send_raw(burst.as_bytes());
        requests.iter().map(|(id, _, _)| peer.answer_to(*id, no_permission).0).collect()
    };
    let mut sessions = Vec::new();
    for chunk in 0..count.div_ceil(burst) {
        let size = burst.min(count - chunk * burst);
        let news = (0..size).map(|_| (take_id(), "session/new", json!({"cwd": cwd, "mcpServers": []}))).collect();
        let ids: Vec<String> = answers(peer, news)
            .iter()
            .map(|answer| answer["result"]["sessionId"].as_str().unwrap_or_else(|| panic!("{answer}")).to_owned())
            .collect();
        let prompts = ids
            .iter()
            .map(|id| {
                (
                    take_id(),
                    "session/prompt",
                    json!({"sessionId": id, "prompt": [{"type": "text", "text": "say hello"}]}),
                )
            })
            .collect();
        for answer in answers(peer, prompts) {
            assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
        }
        if close {
            let closes = ids.iter().map(|id| (take_id(), "session/close", json!({"sessionId": id}))).collect();
            for answer in answers(peer, closes) {
                assert!(answer.get("result").is_some(), "session/close: {answer}");
            }
        }
        sessions.extend(ids);
    }
    sessions
}

#[test]
fn a_closed_session_is_given_back_and_a_long_lived_agent_does_not_grow_with_every_session_it_served() {
    let mut peer = Peer::start(&[]);
    peer.request(1, "initialize", json!({"protocolVersion": 1}));
    let (initialized, _) = peer.answer_to(1, no_permission);
    let capabilities = &initialized["result"]["agentCapabilities"]["sessionCapabilities"];
    assert!(capabilities["close"].is_object(), "session/close advertised: {initialized}");
    let mut next_id = 10;
    let closed = sessions_served(&mut peer, (1, 50), &mut next_id, true);
    peer.prompt(5, &closed[0], "say hello");
    let (refused, _) = peer.answer_to(5, no_permission);
    assert_eq!(refused["error"]["code"], -32602, "a closed session is gone: {refused}");
    peer.request(6, "session/close", json!({"sessionId": closed[0]}));
    let (again, _) = peer.answer_to(6, no_permission);
    assert_eq!(again["error"]["code"], -32602, "closed once: {again}");

    sessions_served(&mut peer, (100, 50), &mut next_id, true);
    let settled = peer.rss();
    sessions_served(&mut peer, (600, 50), &mut next_id, true);
    let grown = peer.rss().saturating_sub(settled);
    assert!(grown < 4 << 20, "600 sessions served and closed grew the agent by {} KiB", grown >> 10);
    assert!(peer.exit_status(ANSWER_WITHIN).success());
}

#[test]
fn sessions_never_closed_are_bounded_the_least_recently_used_given_back_first() {
    let mut peer = Peer::start(&["--max-sessions", "8"]);
    peer.request(1, "initialize", json!({"protocolVersion": 1}));
    peer.answer_to(1, no_permission);
    let mut next_id = 10;
    let first = sessions_served(&mut peer, (2, 4), &mut next_id, false);
    // The first session is used again: the second is now the least recently used.
    peer.prompt(3, &first[0], "say hello");
    assert_eq!(peer.answer_to(3, no_permission).0["result"]["stopReason"], "end_turn");
    sessions_served(&mut peer, (7, 4), &mut next_id, false);
    peer.prompt(4, &first[1], "say hello");
    let (evicted, _) = peer.answer_to(4, no_permission);
    assert_eq!(evicted["error"]["code"], -32602, "past 8 sessions the least recently used is closed: {evicted}");
    peer.prompt(5, &first[0], "say hello");
    assert_eq!(peer.answer_to(5, no_permission).0["result"]["stopReason"], "end_turn", "a recent session is kept");

    sessions_served(&mut peer, (100, 4), &mut next_id, false);
    let settled = peer.rss();
    sessions_served(&mut peer, (600, 4), &mut next_id, false);
    let grown = peer.rss().saturating_sub(settled);
    assert!(grown < 4 << 20, "600 sessions past the bound grew the agent by {} KiB", grown >> 10);
    assert!(peer.exit_status(ANSWER_WITHIN).success());
}
