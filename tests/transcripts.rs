//! docs/contract.md §7.6 `acp`, transcripts: an ACP child's session
//! updates are kept in the parent's home as that child's session, linked
//! by lineage — `subagents sessions tree` of the parent reaches it, `show`
//! reads its text, thoughts, plan, tool calls and permission requests; a
//! tool call the agent reports failed is counted in the result and shown
//! in the tree; a chatty agent's transcript is cut at its cap with a marker.

use crate::common;
use crate::stand_ins;

use std::path::Path;
use std::process::{Command, Output};

use common::{lifecycle, no_children_left, runtime_at as runtime};
use stand_ins::shell_agent;
use subagents::agent::{SessionEvent, SessionHeader, SessionStore};
use subagents::providers::AcpProvider;
use subagents::{CancellationToken, Parent, Runtime, StartRequest, StopReason};

/// A parent session in `home`'s store, with one finished turn.
fn parent_session(home: &Path, id: &str) {
    let store = SessionStore::new(home);
    let mut session = store.create(SessionHeader::new(id, home)).unwrap();
    session.append(SessionEvent::TurnEnd { reason: StopReason::Completed, duration_ms: None, usage: None }).unwrap();
    session.close().unwrap();
}

fn register(runtime: &Runtime, config: subagents::providers::AcpConfig) {
    let provider = runtime.block_on(async move { AcpProvider::new(config).await.unwrap() });
    runtime.subagents().register_provider(provider).unwrap().keep();
}

fn under(parent: &str, prompt: &str, home: &Path) -> StartRequest {
    StartRequest::new(prompt, Parent::root(home).with_session(parent), CancellationToken::new())
}

fn sessions(home: &Path, args: &[&str]) -> (Option<i32>, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_subagents"));
    command.env_remove("RUST_LOG").arg("sessions").args(args).arg("--home").arg(home);
    let Output { status, stdout, stderr } = common::output_within(&mut command, common::WAIT_LIMIT, "sessions");
    (status.code(), format!("{}{}", String::from_utf8_lossy(&stdout), String::from_utf8_lossy(&stderr)))
}

/// An agent that thinks, talks, plans, asks permission for a tool call
/// that then fails, and ends its turn.
const BUSY: &str = r#"take
printf '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"agent_thought_chunk","content":{"type":"text","text":"the sandbox may be missing"}}}}\n'
chunk 'Looking at the parser.'
printf '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"plan","entries":[{"content":"run the tests","priority":"high","status":"pending"}]}}}\n'
printf '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"tool_call","toolCallId":"t1","title":"Run cargo test","kind":"execute","status":"pending","rawInput":{"command":"cargo test"}}}}\n'
printf '{"jsonrpc":"2.0","id":"p1","method":"session/request_permission","params":{"sessionId":"s1","toolCall":{"toolCallId":"t1","title":"Run cargo test"},"options":[{"optionId":"yes","name":"Allow","kind":"allow_once"},{"optionId":"no","name":"Reject","kind":"reject_once"}]}}\n'
read -r permission
printf '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"tool_call_update","toolCallId":"t1","status":"failed","content":[{"type":"content","content":{"type":"text","text":"bubblewrap is unavailable"}}]}}}\n'
chunk 'Could not run the tests.'
answer '{"stopReason":"end_turn"}'
cat > /dev/null"#;

#[test]
fn an_acp_childs_transcript_is_a_session_under_its_parent_with_its_tool_calls_and_permission_requests() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    parent_session(home.path(), "parent-1");
    register(&runtime, shell_agent(home.path(), "busy", BUSY));
    let result = lifecycle(&runtime, &runtime.subagents(), "busy", under("parent-1", "fix the parser", home.path()));
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(result.tool_calls_failed, 1, "the failed tool call is counted: {result:?}");
    no_children_left(&runtime);
    drop(runtime);

    let (code, tree) = sessions(home.path(), &["tree", "parent"]);
    assert_eq!(code, Some(0), "{tree}");
    assert!(tree.contains("└─ acp:busy:s1 busy (depth 1, completed, 1 tool call failed)"), "{tree}");
    let (code, shown) = sessions(home.path(), &["show", "acp:busy"]);
    assert_eq!(code, Some(0), "{shown}");
    let expected = [
        "user: fix the parser",
        "assistant: thinking: the sandbox may be missing",
        "assistant: Looking at the parser.",
        "assistant: plan:",
        "→ Run cargo test [t1] {\"command\":\"cargo test\"}",
        "← permission [t1] result: asked to run Run cargo test; options: Allow (AllowOnce), Reject (RejectOnce); answered: Reject (RejectOnce)",
        "← Run cargo test [t1] error: bubblewrap is unavailable",
        "assistant: Could not run the tests.",
        "— turn end: completed",
    ];
    let mut at = 0;
    for line in expected {
        let found = shown[at..].find(line).unwrap_or_else(|| panic!("{line:?} in order in:\n{shown}"));
        at += found + line.len();
    }
}

#[test]
fn a_chatty_agents_transcript_is_cut_at_its_cap_with_a_marker() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    parent_session(home.path(), "parent-2");
    // 100 answers of 60 KB, each followed by a tool call: 6 MB in all.
    let then = r#"take
big=$(head -c 60000 /dev/zero | tr '\0' 'x')
i=0
while [ $i -lt 100 ]; do
  chunk "$big"
  printf '{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s1","update":{"sessionUpdate":"tool_call","toolCallId":"c%s","title":"look","status":"completed"}}}\n' $i
  i=$((i+1))
done
answer '{"stopReason":"end_turn"}'
cat > /dev/null"#;
    register(&runtime, shell_agent(home.path(), "chatty", then));
    let result = lifecycle(&runtime, &runtime.subagents(), "chatty", under("parent-2", "talk", home.path()));
    assert_eq!(result.stop_reason, StopReason::Completed);
    drop(runtime);
    let store = SessionStore::new(home.path());
    let stored = store.inspect("acp:chatty:s1").unwrap();
    assert!(stored.bytes < 4_400_000, "bounded: {} bytes", stored.bytes);
    let marker = stored.events.iter().any(
        |event| matches!(event, SessionEvent::Assistant { text, .. } if text.contains("the transcript was cut here")),
    );
    assert!(marker, "a marker says where it was cut");
    assert!(matches!(
        stored.events.last(),
        Some(SessionEvent::TurnEnd { reason: StopReason::Completed, duration_ms: None, usage: None })
    ));
}

#[test]
fn fanouts_result_line_counts_the_tool_calls_the_agent_reported_failed() {
    let dir = tempfile::tempdir().unwrap();
    let agent = shell_agent(dir.path(), "busy", BUSY);
    let config = format!("[providers.agent]\nkind = \"acp\"\ncommand = \"/bin/sh\"\nargs = [{:?}]\n", agent.args[0]);
    std::fs::write(dir.path().join("subagents.toml"), config).unwrap();
    std::fs::write(dir.path().join("tasks.jsonl"), "{\"prompt\": \"fix the parser\"}\n").unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_subagents"));
    command.env_remove("RUST_LOG").env_remove("SUBAGENTS_HOME").current_dir(dir.path());
    command.args(["fanout", "tasks.jsonl", "--config", "subagents.toml", "--home", "home"]);
    let output = common::output_within(&mut command, common::WAIT_LIMIT, "fanout");
    let line: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap_or_default();
    assert_eq!(line["stop_reason"], "completed", "{line}");
    assert_eq!(line["tool_calls_failed"], 1, "a completed run still says a tool call failed: {line}");
}
