//! The A2A edges against hostile peers: an agent that redirects the
//! provider's credentials elsewhere, replaces an artifact over and over or
//! fails with terminal escapes; clients that never finish their requests
//! or fill the server's task store; a bearer scheme in lower case.

use serde_json::Value;

use super::{card, frame, io, message, post, rpc, server_with, status, task};
use crate::common::loopback::{ok, Loopback, Reply};

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
