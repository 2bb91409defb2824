//! `subagents mcp` at the level of its lines, with a raw client: request
//! ids reused while in flight, a client that stops reading, calls sent
//! without `initialize`, and a client whose end of stdout is gone.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use subagents::agent::SessionEvent;
use subagents::StopReason;

use super::support::{session_count, sessions, Raw};
use crate::common::blocking::wait_until;
use crate::common::line_peer::{Reading, ANSWER_WITHIN};

const SLOW: &str = "[slow] take your time";

/// Whether every session's last event is the end of an aborted turn.
fn every_session_ended_aborted(raw: &Raw) -> bool {
    let sessions = sessions(&raw.home());
    !sessions.is_empty()
        && sessions.iter().all(|events| events.last().and_then(SessionEvent::ended) == Some(StopReason::Aborted))
}

#[test]
fn a_request_id_reused_while_in_flight_is_refused_naming_it_and_holds_no_place() {
    let mut raw = Raw::start(&[]);
    raw.handshake();
    raw.call(2, "subagent", json!({"description": "slow", "prompt": SLOW}));
    // More reuses than requests may be in flight at once (1024): a reuse
    // that held a place would soon have every new request refused.
    const REUSES: usize = 1100;
    let reuse = format!(
        "{}\n",
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                                       "params": {"name": "task_list", "arguments": {}}})
    );
    raw.send_raw(reuse.repeat(REUSES).as_bytes());
    raw.call(3, "task_list", json!({}));
    let mut refusals = 0;
    loop {
        let answer = raw.answer();
        if answer["id"] == 3 {
            assert_eq!(answer["result"]["isError"], false, "{answer}");
            break;
        }
        assert_eq!(answer["id"], 2, "{answer}");
        assert_eq!(answer["error"]["code"], -32600, "a reuse is refused, not served: {answer}");
        assert_eq!(answer["error"]["data"]["reason"], "request id 2 is already in flight", "{answer}");
        refusals += 1;
    }
    assert_eq!(refusals, REUSES, "every reuse is answered once");
    // The first request 2 is still answered, and nothing else is waited for.
    let began = Instant::now();
    let rest = raw.close_and_read_rest(Duration::from_secs(20));
    let answers: Vec<&Value> = rest.iter().filter(|m| m.get("method").is_none()).collect();
    assert_eq!(answers.len(), 1, "{answers:?}");
    assert_eq!(answers[0]["id"], 2);
    assert_eq!(answers[0]["result"]["content"][0]["text"], "subagent run was cancelled");
    assert!(raw.wait_for_exit(Duration::from_secs(10)).success());
    assert!(began.elapsed() < Duration::from_secs(10), "EOF waited for a phantom request: {:?}", began.elapsed());
}

#[test]
fn a_client_that_stops_reading_gets_what_fits_and_the_server_exits_by_the_bound_naming_what_it_dropped() {
    let mut raw = Raw::start(&[]);
    raw.handshake();
    raw.read(Reading::Paused);
    // Each answer is a few KiB: more than the pipe holds in all.
    const REQUESTS: u64 = 40;
    for id in 2..2 + REQUESTS {
        raw.request(id, "tools/list", json!({}));
    }
    std::thread::sleep(Duration::from_millis(500));
    let began = Instant::now();
    raw.close_stdin();
    let status = raw.wait_for_exit(Duration::from_secs(45));
    let took = began.elapsed();
    assert!(status.success(), "{status}");
    assert!(took < Duration::from_secs(34), "past the 30 s bound: {took:?}");
    raw.read(Reading::On);
    let delivered: Vec<u64> = raw.read_rest(ANSWER_WITHIN).iter().filter_map(|m| m["id"].as_u64()).collect();
    assert!(delivered.len() < REQUESTS as usize, "the pipe never filled: {delivered:?}");
    let log = raw.stderr();
    let warning = log.lines().find(|line| line.contains("not read by the client")).unwrap_or_else(|| panic!("{log}"));
    let (_, listed) = warning.split_once("not read by the client: ").unwrap();
    let (listed, _) = listed.split_once(';').unwrap();
    let dropped: Vec<u64> = listed.split(", ").map(|id| id.parse().unwrap()).collect();
    for id in 2..2 + REQUESTS {
        assert!(delivered.contains(&id) != dropped.contains(&id), "answer {id}: delivered {delivered:?}, {warning}");
    }
}

#[test]
fn a_call_sent_without_initialize_is_served_and_cancelled_like_any_other() {
    let mut raw = Raw::start(&["--concurrency", "1"]);
    // What a request carries in place of the handshake.
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2025-06-18",
                      "io.modelcontextprotocol/clientCapabilities": {}});
    let call =
        |prompt: &str| json!({"name": "subagent", "arguments": {"description": "d", "prompt": prompt}, "_meta": meta});
    raw.request(1, "tools/call", call(SLOW));
    wait_until(ANSWER_WITHIN, "the slow run to start", || session_count(&raw.home()) == 1);
    raw.notify("notifications/cancelled", json!({"requestId": 1, "reason": "changed my mind"}));
    // The only place was the slow run's: this runs once that one is gone.
    raw.request(2, "tools/call", call("the next thing"));
    let next = raw.answer_within(Duration::from_secs(15));
    assert_eq!(next["id"], 2, "a cancelled call is not answered: {next}");
    let output: Value = serde_json::from_str(next["result"]["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(output["output"], "handled: the next thing");
    let aborted = Some(StopReason::Aborted);
    let ended =
        |raw: &Raw| sessions(&raw.home()).iter().any(|events| events.last().and_then(SessionEvent::ended) == aborted);
    wait_until(ANSWER_WITHIN, "the slow run's session to end aborted", || ended(&raw));
    assert!(raw.exit_status(ANSWER_WITHIN).success());
}

#[test]
fn when_the_clients_end_of_stdout_is_gone_every_call_is_cancelled_and_the_server_exits() {
    let mut raw = Raw::start(&[]);
    raw.handshake();
    raw.call(2, "subagent", json!({"description": "slow", "prompt": SLOW}));
    raw.call(3, "subagent", json!({"description": "later", "prompt": SLOW, "run_in_background": true}));
    assert_eq!(raw.answer()["id"], 3);
    wait_until(ANSWER_WITHIN, "both runs to start", || session_count(&raw.home()) == 2);
    // The reader closes the pipe after the answer it is waiting for.
    raw.read(Reading::HungUp);
    raw.call(4, "task_list", json!({}));
    assert_eq!(raw.answer()["id"], 4);
    std::thread::sleep(Duration::from_millis(100));
    let began = Instant::now();
    for id in 5..10 {
        raw.call(id, "task_list", json!({}));
    }
    let status = raw.wait_for_exit(Duration::from_secs(15));
    assert!(status.success(), "{status}");
    assert!(began.elapsed() < Duration::from_secs(10), "{:?}", began.elapsed());
    let log = raw.stderr();
    assert_eq!(log.matches("stdout is gone").count(), 1, "said once: {log}");
    assert!(log.matches("Broken pipe").count() <= 1, "not once per answer: {log}");
    assert!(every_session_ended_aborted(&raw), "{:?}", sessions(&raw.home()));
}
