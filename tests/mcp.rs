//! docs/contract.md §9.3: `subagents mcp`, the real binary, driven by the MCP SDK's own client
//! (`rmcp`) the way an editor or a coding agent would — tools and their
//! schemas, progress of a call's whole tree, background tasks, fan-out
//! under `--concurrency`, cancellation, structured answers — and by raw
//! lines on its stdin for what a client library never sends: malformed
//! lines, bad calls, an oversized line, EOF in the middle of a run.
//!
//! `mcp/support.rs` holds the two clients.

#[path = "mcp/lifecycle.rs"]
mod lifecycle;
#[path = "mcp/lines.rs"]
mod lines;
#[path = "mcp/support.rs"]
pub(crate) mod support;
#[path = "mcp/tools.rs"]
mod tools;

use crate::common;

use std::time::{Duration, Instant};

use common::eventually;
use common::line_peer::ANSWER_WITHIN;
use rmcp::model::CancelledNotificationParam;
use rmcp::service::ServiceError;
use serde_json::{json, Value};
use subagents::agent::SessionEvent;
use subagents::schema::CompiledSchema;
use subagents::StopReason;
use support::{answer, code_and_id, serve_children, sessions, slow_call, text, Raw, Served};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initialize_advertises_tools_and_lists_four_with_valid_object_schemas() {
    let served = Served::start(&[]).await;
    let info = served.client.peer_info().expect("the server answered initialize");
    assert_eq!(info.server_info.as_ref().map(|s| s.name.as_str()), Some("subagents"));
    assert!(info.capabilities.tools.is_some(), "{info:?}");
    let tools = served.client.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|tool| &*tool.name).collect();
    assert_eq!(names, ["subagent", "task_output", "task_list", "task_kill"]);
    for tool in &tools {
        let schema = Value::Object((*tool.input_schema).clone());
        assert_eq!(schema["type"], "object", "{}", tool.name);
        CompiledSchema::compile(&schema).unwrap_or_else(|e| panic!("{}: {e}", tool.name));
    }
    let subagent = &tools[0].input_schema["properties"];
    for property in ["description", "prompt", "run_in_background", "output_schema", "persona"] {
        assert!(subagent.get(property).is_some(), "{property} missing: {subagent:?}");
    }
    assert!(subagent["prompt"]["description"].as_str().unwrap().contains("standalone"), "{subagent:?}");
    let (status, _dir) = served.close().await;
    assert!(status.success(), "{status}");

    // A process child takes neither a schema nor a persona: not offered.
    let served = Served::start(&["--provider", "process"]).await;
    let tools = served.client.list_all_tools().await.unwrap();
    let subagent = &tools[0].input_schema["properties"];
    assert!(subagent.get("output_schema").is_none() && subagent.get("persona").is_none(), "{subagent:?}");
    assert!(served.close().await.0.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreground_call_reports_its_whole_tree_as_progress_and_answers_its_output() {
    let served = Served::start(&[]).await;
    let result = served
        .call("subagent", json!({"description": "two checks", "prompt": "check the parser; check the docs"}))
        .await;
    let answer = answer(&result);
    assert_eq!(answer["kind"], "foreground");
    let output = answer["output"].as_str().unwrap();
    assert!(output.contains("handled: check the parser") && output.contains("handled: check the docs"), "{output}");
    assert!(answer["run_id"].is_string());
    let recorder = served.recorder.clone();
    assert!(
        eventually(Duration::from_secs(5), || recorder.messages().join("\n").contains("[two checks] completed")).await
    );
    let messages = recorder.messages().join("\n");
    for expected in [
        "[two checks] tool subagent: pending",
        "[two checks] started [check the parser]",
        "[check the parser] handled: check the parser",
        "[check the docs] completed",
    ] {
        assert!(messages.contains(expected), "{expected:?} not in:\n{messages}");
    }
    let counts: Vec<f64> = recorder.progress.lock().unwrap().iter().map(|p| p.progress).collect();
    assert!(counts.windows(2).all(|pair| pair[0] < pair[1]), "progress only grows: {counts:?}");
    assert!(served.close().await.0.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_call_returns_a_task_id_at_once_and_task_output_collects_it() {
    let served = Served::start(&[]).await;
    let started = answer(
        &served
            .call(
                "subagent",
                json!({"description": "later", "prompt": "summarise the plan", "run_in_background": true}),
            )
            .await,
    );
    assert_eq!(started["kind"], "background");
    let task_id = started["task_id"].as_str().unwrap().to_owned();
    let collected = answer(&served.call("task_output", json!({"task_id": task_id, "timeout_ms": 20000})).await);
    assert_eq!(collected["status"], "completed", "{collected}");
    assert_eq!(collected["output"], "handled: summarise the plan");
    let listed = answer(&served.call("task_list", json!({})).await);
    assert_eq!(listed["tasks"][0]["task_id"], task_id.as_str(), "{listed}");
    assert_eq!(listed["tasks"][0]["label"], "later");
    let killed = answer(&served.call("task_kill", json!({"task_id": task_id})).await);
    assert_eq!(killed["outcome"], "already-finished");
    // Another session's task, or none: to this session it does not exist.
    let unknown = served.call("task_output", json!({"task_id": "task-99"})).await;
    assert_eq!(unknown.is_error, Some(true));
    assert_eq!(text(&unknown), "no task \"task-99\" for this session");
    assert!(served.close().await.0.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_calls_are_all_answered_four_at_a_time() {
    let served = Served::start(&["--concurrency", "4"]).await;
    let calls = (0..20).map(|n| {
        served.call("subagent", json!({"description": format!("task {n}"), "prompt": format!("task number {n}")}))
    });
    let results = futures_util::future::join_all(calls).await;
    for (n, result) in results.iter().enumerate() {
        assert_eq!(answer(result)["output"], format!("handled: task number {n}"));
    }
    let queued = served
        .recorder
        .messages()
        .iter()
        .filter(|m| m.contains("queued until a run slot frees up (at most 4 at once)"))
        .count();
    assert!(queued > 0, "with 20 calls and 4 places some queued: {:?}", served.recorder.messages());
    assert!(served.close().await.0.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_call_cancels_its_run_and_frees_its_place() {
    let served = Served::start(&["--concurrency", "1"]).await;
    let slow = slow_call(&served).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let cancel = CancelledNotificationParam::new(Some(slow.id.clone()), Some("changed my mind".to_owned()));
    served.client.peer().notify_cancelled(cancel).await.unwrap();
    let cancelled = tokio::time::timeout(ANSWER_WITHIN, slow.await_response()).await.expect("resolved in time");
    assert!(matches!(cancelled, Err(ServiceError::Cancelled { .. })), "{cancelled:?}");
    // The only place was the slow run's: a new call runs only once that
    // run has been disposed.
    let began = Instant::now();
    let next = answer(&served.call("subagent", json!({"description": "next", "prompt": "the next thing"})).await);
    assert_eq!(next["output"], "handled: the next thing");
    assert!(began.elapsed() < Duration::from_secs(10), "{:?}", began.elapsed());
    // The run ended aborted (its progress ended with the call: no word).
    let slow =
        sessions(&served.dir.path().join("home")).into_iter().find(|events| format!("{events:?}").contains("[slow]"));
    assert_eq!(slow.and_then(|events| events.last().and_then(SessionEvent::ended)), Some(StopReason::Aborted));
    assert!(served.close().await.0.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_call_on_the_process_provider_leaves_no_child_process() {
    let served = Served::start(&["--provider", "process"]).await;
    let slow = slow_call(&served).await;
    let dir = served.dir.path().to_path_buf();
    assert!(eventually(ANSWER_WITHIN, || !serve_children(&dir).is_empty()).await, "the child process started");
    served.client.peer().notify_cancelled(CancelledNotificationParam::new(Some(slow.id.clone()), None)).await.unwrap();
    assert!(
        eventually(Duration::from_secs(15), || serve_children(&dir).is_empty()).await,
        "{:?}",
        serve_children(&dir)
    );
    assert!(matches!(slow.await_response().await, Err(ServiceError::Cancelled { .. })));
    let listed = answer(&served.call("task_list", json!({})).await);
    assert_eq!(listed, json!({"tasks": []}), "the server serves on");
    let (status, dir) = served.close().await;
    assert!(status.success());
    common::no_process_mentions(dir.path());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_structured_call_answers_structured_content_matching_its_schema() {
    let served = Served::start(&[]).await;
    let schema = json!({
        "type": "object",
        "properties": {"city": {"type": "string"}, "population": {"type": "integer"}, "kind": {"enum": ["town", "city"]}},
        "required": ["city", "population", "kind"],
        "additionalProperties": false
    });
    let result = served
        .call("subagent", json!({"description": "a city", "prompt": "name a city", "output_schema": schema, "persona": "You are a geographer."}))
        .await;
    let structured = result.structured_content.clone().expect("structuredContent");
    let violations = CompiledSchema::compile(&schema).unwrap().violations(&structured);
    assert!(violations.is_empty(), "{violations:?}: {structured}");
    assert_eq!(answer(&result)["structured"], structured, "the text carries it too");
    assert!(served.close().await.0.success());
}

#[test]
fn malformed_lines_and_bad_calls_each_get_one_error_and_the_server_serves_on() {
    let mut raw = Raw::start(&[]);
    raw.handshake();
    raw.send_raw(b"this is not json\n");
    assert_eq!(code_and_id(&raw.answer()), (json!(-32700), Value::Null));
    raw.send_raw(b"[{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/list\"}]\n");
    assert_eq!(code_and_id(&raw.answer()), (json!(-32600), Value::Null));
    raw.request(3, "tools/call", json!(5));
    assert_eq!(code_and_id(&raw.answer()), (json!(-32602), json!(3)));
    raw.request(4, "tools/call", json!({"arguments": {}}));
    assert_eq!(code_and_id(&raw.answer()), (json!(-32602), json!(4)), "a call without a tool name");
    raw.call(5, "no_such_tool", json!({}));
    let unknown = raw.answer();
    assert_eq!(code_and_id(&unknown), (json!(-32602), json!(5)));
    assert_eq!(unknown["error"]["data"]["available"], json!(["subagent", "task_output", "task_list", "task_kill"]));
    raw.call(6, "subagent", json!({"prompt": 7, "colour": "red"}));
    let bad = raw.answer();
    assert_eq!(code_and_id(&bad), (json!(-32602), json!(6)));
    let violations: Vec<&str> =
        bad["error"]["data"]["violations"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert_eq!(violations.len(), 3, "{violations:?}");
    assert!(violations.iter().any(|v| v.contains("description")), "{violations:?}");
    assert!(violations.iter().any(|v| v.starts_with("$.prompt")), "{violations:?}");
    assert!(violations.iter().any(|v| v.contains("colour")), "{violations:?}");
    let outside = json!({"type": "object", "properties": {"n": {"type": ["integer", "null"]}}});
    raw.call(7, "subagent", json!({"description": "d", "prompt": "p", "output_schema": outside}));
    let schema = raw.answer();
    assert_eq!(code_and_id(&schema), (json!(-32602), json!(7)));
    assert!(
        schema["error"]["data"]["violations"][0].as_str().unwrap().starts_with("$.output_schema.properties.n.type"),
        "{schema}"
    );
    raw.request(8, "no/such/method", json!({}));
    assert_eq!(code_and_id(&raw.answer()), (json!(-32601), json!(8)));
    raw.request(
        9,
        "initialize",
        json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "again", "version": "0"}}),
    );
    let again = raw.answer();
    assert_eq!(code_and_id(&again), (json!(-32600), json!(9)));
    assert_eq!(again["error"]["data"]["reason"], "already initialized");
    raw.request(10, "tools/list", json!({}));
    let listed = raw.answer();
    assert_eq!(listed["id"], 10);
    assert_eq!(listed["result"]["tools"].as_array().map(Vec::len), Some(4), "{listed}");
    assert!(raw.exit_status(ANSWER_WITHIN).success());
}

#[test]
fn an_over_long_line_costs_one_short_parse_error_and_bounded_memory() {
    let mut raw = Raw::start(&[]);
    raw.handshake();
    let line = vec![b'a'; 40 << 20];
    raw.send_raw(&line);
    raw.send_raw(b"\n");
    drop(line);
    raw.request(2, "tools/list", json!({}));
    let refused = raw.next_line();
    assert!(refused.len() < 400, "the reply echoes the line: {} bytes", refused.len());
    let refused: Value = serde_json::from_str(&refused).unwrap();
    assert_eq!(code_and_id(&refused), (json!(-32700), Value::Null), "{refused}");
    assert_eq!(raw.answer()["id"], 2, "the server serves on");
    let peak = raw.peak_rss();
    assert!(peak < 100 << 20, "peak RSS {} MiB for a 40 MiB line", peak >> 20);
    assert!(raw.exit_status(ANSWER_WITHIN).success());
}

#[test]
fn eof_mid_run_answers_the_call_cancelled_and_exits_0_with_no_process_left() {
    let mut raw = Raw::start(&["--provider", "process"]);
    raw.handshake();
    raw.call(2, "subagent", json!({"description": "slow", "prompt": "[slow] take your time"}));
    raw.call(3, "subagent", json!({"description": "slow too", "prompt": "[slow] and you", "run_in_background": true}));
    let background = raw.answer();
    assert_eq!(background["id"], 3, "{background}");
    let deadline = Instant::now() + ANSWER_WITHIN;
    while serve_children(raw.dir.path()).len() < 2 {
        assert!(Instant::now() < deadline, "both children started: {:?}", serve_children(raw.dir.path()));
        std::thread::sleep(Duration::from_millis(20));
    }
    let began = Instant::now();
    let rest = raw.close_and_read_rest(Duration::from_secs(40));
    let answers: Vec<&Value> = rest.iter().filter(|m| m.get("method").is_none()).collect();
    assert_eq!(answers.len(), 1, "{rest:?}");
    assert_eq!(answers[0]["id"], 2);
    assert_eq!(answers[0]["result"]["isError"], true, "{}", answers[0]);
    assert_eq!(answers[0]["result"]["content"][0]["text"], "subagent run was cancelled");
    assert!(raw.exit_status(Duration::from_secs(30)).success());
    assert!(began.elapsed() < Duration::from_secs(40), "{:?}", began.elapsed());
    common::no_process_mentions(raw.dir.path());
}
