//! The A2A edges against hostile peers: an agent that redirects the
//! provider's credentials elsewhere, replaces an artifact over and over or
//! fails with terminal escapes; clients that never finish their requests
//! or fill the server's task store; a bearer scheme in lower case.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use subagents::StopReason;

use super::{
    artifact, card, frame, io, message, post, post_raw, provider_for, reason, rpc, run_on, server, server_with, status,
    task,
};
use crate::common;
use crate::common::loopback::{self, ok, Loopback, Reply};
use crate::common::Within;

const SECRET: &str = "key-SECRET-456";

/// The provider's credentials: a bearer token and an API key.
fn with_credentials(config: &mut subagents::providers::A2aConfig) {
    config.headers.push(("Authorization".into(), format!("Bearer {SECRET}")));
    config.headers.push(("x-api-key".into(), SECRET.into()));
}

/// A `307` to `location`.
fn redirect(location: String) -> Reply {
    loopback::status(307, vec![("location", location)], json!({}))
}

/// Whether any request `agent` received carried the secret.
fn saw_secret(agent: &Loopback) -> bool {
    agent.requests.lock().unwrap().iter().any(|request| request.headers.iter().any(|(_, value)| value.contains(SECRET)))
}

#[test]
fn a_card_redirected_to_another_origin_is_refused_and_gets_no_credentials() {
    let io = io();
    let elsewhere = io.block_on(Loopback::start_for(|origin| vec![ok(card(origin, true))]));
    let location = format!("{}/.well-known/agent-card.json", elsewhere.origin);
    let agent = io.block_on(Loopback::start(vec![redirect(location)]));
    let runtime = common::runtime();
    let subagents = runtime.subagents();
    subagents.register_provider(provider_for(&agent.origin, with_credentials)).unwrap().keep();
    let error = runtime.within(common::WAIT_LIMIT, "a start on a redirected card", async move {
        match subagents.start("agent", common::request("hi")).await {
            Ok(_) => panic!("a start on a card redirected to another origin succeeded"),
            Err(error) => error,
        }
    });
    assert_eq!(error.code(), "STARTUP_FAILED", "{error}");
    let said = error.to_string();
    assert!(said.contains("redirected to another origin") && said.contains(&elsewhere.origin), "{said}");
    assert!(!saw_secret(&elsewhere), "the other origin received the credentials");
    assert!(elsewhere.requests.lock().unwrap().is_empty(), "the redirect was not followed at all");
    runtime.shutdown_blocking();
}

#[test]
fn a_call_redirected_to_another_origin_fails_the_run_and_gets_no_credentials() {
    let io = io();
    let elsewhere = io.block_on(Loopback::start(vec![Reply::Stream {
        frames: vec![frame(json!({"task": {"id": "task-7", "status": {"state": "TASK_STATE_COMPLETED"}}}))],
        hang: true,
    }]));
    let location = format!("{}/rpc", elsewhere.origin);
    let agent = io.block_on(Loopback::start_for(|origin| vec![ok(card(origin, true)), redirect(location)]));
    let runtime = common::runtime();
    let result = run_on(&runtime, provider_for(&agent.origin, with_credentials), common::request("hi"));
    assert_eq!(result.stop_reason, StopReason::Error);
    let said = reason(&result);
    assert!(said.contains("redirected to another origin") && said.contains(&elsewhere.origin), "{said}");
    assert!(!saw_secret(&elsewhere), "the other origin received the credentials");
    assert!(elsewhere.requests.lock().unwrap().is_empty(), "the redirect was not followed at all");
    runtime.shutdown_blocking();
}

#[test]
fn a_redirect_within_the_origin_is_followed_with_the_headers() {
    let io = io();
    let agent = io.block_on(Loopback::start_for(|origin| {
        let frames = vec![frame(task("TASK_STATE_WORKING")), frame(status("TASK_STATE_COMPLETED", "moved"))];
        vec![
            redirect(format!("{origin}/moved/agent-card.json")),
            ok(card(origin, true)),
            Reply::Stream { frames, hang: true },
        ]
    }));
    let runtime = common::runtime();
    let result = run_on(&runtime, provider_for(&agent.origin, with_credentials), common::request("hi"));
    assert_eq!(result.stop_reason, StopReason::Completed, "{:?}", result.diagnostic);
    let requests = agent.requests.lock().unwrap();
    assert_eq!(requests[1].path, "/moved/agent-card.json");
    assert_eq!(requests[1].header("x-api-key"), Some(SECRET));
    drop(requests);
    runtime.shutdown_blocking();
}

#[test]
fn an_artifact_replaced_many_times_counts_once_against_the_bound() {
    let io = io();
    let agent = io.block_on(Loopback::start_for(|origin| {
        let mut frames = vec![frame(task("TASK_STATE_WORKING"))];
        for round in 0..8 {
            let text = format!("{round}").repeat(300);
            frames.push(frame(artifact("draft", json!([{"text": text}]), false)));
        }
        frames.push(frame(status("TASK_STATE_COMPLETED", "done")));
        vec![ok(card(origin, true)), Reply::Stream { frames, hang: true }]
    }));
    let runtime = common::runtime();
    let provider = provider_for(&agent.origin, |config| config.limits.max_artifact_bytes = 1024);
    let result = run_on(&runtime, provider, common::request("draft it"));
    assert_eq!(result.stop_reason, StopReason::Completed, "{:?}", result.diagnostic);
    assert_eq!(result.text(), "7".repeat(300), "the last replacement is the artifact held");
    runtime.shutdown_blocking();
}

#[test]
fn an_agents_failure_reason_reaches_our_servers_clients_without_escapes_or_bidi_controls() {
    let io = io();
    let hostile = "disk\u{1b}[2J full\u{1b}]52;c;cm0gLXJmIH4=\u{7} \u{202e}exe.txt";
    let agent = io.block_on(Loopback::start_for(|origin| {
        let frames = vec![frame(task("TASK_STATE_WORKING")), frame(status("TASK_STATE_FAILED", hostile))];
        vec![ok(card(origin, true)), Reply::Stream { frames, hang: true }]
    }));
    let config =
        format!("[providers.far]\nkind = \"a2a\"\nurl = \"{}\"\n\n[tool]\nproviders = [\"far\"]\n", agent.origin);
    let server = server_with(&config, &[], &[]);
    let (status, body) = post(&server.addr, &rpc("SendMessage", message("save it", None)), None);
    assert_eq!(status, 200, "{body}");
    let sent: Value = serde_json::from_str(&body).unwrap();
    let task = &sent["result"]["task"];
    assert_eq!(task["status"]["state"], "TASK_STATE_FAILED", "{sent}");
    let said = task["status"]["message"]["parts"][0]["text"].as_str().unwrap_or_default();
    assert!(said.contains("disk full exe.txt"), "the agent's words stay: {said:?}");
    for trace in ["\u{1b}", "[2J", "]52;", "cm0gLXJm", "\u{202e}"] {
        assert!(!said.contains(trace), "{trace:?} reached the status message: {said:?}");
    }
}

/// A connection that sent its headers and 10 of the 100 body bytes it announced.
fn stalled_body(addr: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).unwrap();
    let head = format!(
        "POST / HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"jsonrpc\""
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream
}

/// How long until the server closed `stream` (with or without an answer),
/// failing if it is still open after `limit`; what it answered.
fn closed_within(stream: &mut TcpStream, limit: Duration) -> (Duration, String) {
    stream.set_read_timeout(Some(limit)).unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    match stream.read_to_end(&mut answer) {
        Ok(_) => {}
        Err(error) if error.kind() == ErrorKind::ConnectionReset => {}
        Err(error) => panic!("the connection was still open after {:?}: {error}", started.elapsed()),
    }
    (started.elapsed(), String::from_utf8_lossy(&answer).into_owned())
}

#[test]
fn clients_that_never_finish_their_bodies_cannot_hold_the_server() {
    let server = server(&["--max-connections", "4", "--body-timeout-secs", "3"], &[]);
    let mut stalled: Vec<TcpStream> = (0..6).map(|_| stalled_body(&server.addr)).collect();
    std::thread::sleep(Duration::from_millis(300));
    // Every slot holds a request that will never be whole: a whole one
    // still gets one, well before the stalled bodies time out.
    let started = Instant::now();
    let (status, body) = post(&server.addr, &rpc("GetTask", json!({"id": "none"})), None);
    assert_eq!(status, 200, "{body}");
    assert!(started.elapsed() < Duration::from_secs(2), "answered after {:?}", started.elapsed());
    // The oldest unfinished request made room: closed, before its own timeout.
    closed_within(&mut stalled[0], Duration::from_secs(2));
    // A body that never finishes is cut off within its bound, saying so.
    let mut late = stalled_body(&server.addr);
    let (closed_after, answer) = closed_within(&mut late, Duration::from_secs(10));
    assert!(closed_after < Duration::from_secs(6), "closed after {closed_after:?}");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("the request body did not arrive within 3 s"), "{answer}");
}

#[test]
fn ended_tasks_are_bounded_in_bytes_as_well_as_in_number() {
    let server = server(&["--max-task-mib", "1"], &[]);
    // Each task holds its message and its echo: about 400 KiB.
    let text = "x".repeat(200 * 1024);
    let ids: Vec<String> = (0..5)
        .map(|_| {
            let (status, body) = post(&server.addr, &rpc("SendMessage", message(&text, None)), None);
            assert_eq!(status, 200);
            let sent: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(sent["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED", "the task as it ended");
            sent["result"]["task"]["id"].as_str().unwrap().to_owned()
        })
        .collect();
    let (_, body) = post(&server.addr, &rpc("ListTasks", json!({})), None);
    let total = serde_json::from_str::<Value>(&body).unwrap()["result"]["totalSize"].as_u64().unwrap();
    assert!((1..=2).contains(&total), "{total} tasks of ~400 KiB kept under 1 MiB");
    let get = |id: &str| serde_json::from_str::<Value>(&post(&server.addr, &rpc("GetTask", json!({"id": id})), None).1);
    let newest = get(&ids[4]).unwrap();
    let output = newest["result"]["artifacts"][0]["parts"][0]["text"].as_str().unwrap_or_default();
    assert_eq!(output.len(), "hello from the mock: ".len() + text.len(), "the newest is kept whole");
    assert_eq!(get(&ids[0]).unwrap()["error"]["code"], -32001, "the oldest ended task left");
}

#[test]
fn bearer_auth_takes_the_scheme_in_any_case() {
    let server = server(&["--token-env", "A2A_SERVER_TOKEN"], &[("A2A_SERVER_TOKEN", "open-sesame")]);
    let ping = rpc("GetTask", json!({"id": "none"}));
    for header in ["bearer open-sesame", "BEARER open-sesame", "Bearer  open-sesame"] {
        let (status, body) = post_raw(&server.addr, &ping, &format!("Authorization: {header}\r\n"));
        assert_eq!(status, 200, "{header:?}: {body}");
    }
    for header in ["Basic open-sesame", "Bearer", "Beareropen-sesame", "bearer open-sesame2"] {
        let (status, _) = post_raw(&server.addr, &ping, &format!("Authorization: {header}\r\n"));
        assert_eq!(status, 401, "{header:?}");
    }
}
