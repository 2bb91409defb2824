//! What the tools tell a client beyond their answers: annotations that say
//! which calls only read (so a client may run them side by side), the cap
//! on background tasks, progress that ends with its call and never holds
//! the answer back, why a run failed, and the run behind a structured
//! answer.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use subagents::agent::SessionEvent;
use subagents::StopReason;

use super::support::{answer, sessions, text, Raw, Served};
use crate::common::blocking::wait_until;
use crate::common::line_peer::ANSWER_WITHIN;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tool_says_whether_it_only_reads_and_subagent_does_while_its_children_only_read() {
    let hints = |tools: &[rmcp::model::Tool], name: &str| {
        let tool = tools.iter().find(|tool| tool.name == name).unwrap();
        let annotations = tool.annotations.clone().unwrap_or_else(|| panic!("{name} has annotations"));
        (
            annotations.read_only_hint,
            annotations.destructive_hint,
            annotations.idempotent_hint,
            annotations.open_world_hint,
        )
    };
    for provider in ["spawn", "fork", "process"] {
        let served = Served::start(&["--provider", provider]).await;
        let tools = served.client.list_all_tools().await.unwrap();
        // The children read files, list directories and delegate to
        // children like themselves: nothing they do changes anything.
        assert_eq!(hints(&tools, "subagent"), (Some(true), None, Some(false), Some(false)), "{provider}");
        assert_eq!(hints(&tools, "task_output"), (Some(true), None, None, Some(false)), "{provider}");
        assert_eq!(hints(&tools, "task_list"), (Some(true), None, None, Some(false)), "{provider}");
        assert_eq!(hints(&tools, "task_kill"), (Some(false), Some(true), Some(true), Some(false)), "{provider}");
        assert!(served.close().await.0.success());
    }
    // Children on a model endpoint reach beyond this machine, whichever
    // API it speaks.
    let endpoint = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", endpoint.local_addr().unwrap());
    let models = [
        ("openai:gpt-test", "SUBAGENTS_BASE_URL"),
        ("openai-responses:gpt-test", "SUBAGENTS_BASE_URL"),
        ("anthropic:claude-test", "ANTHROPIC_BASE_URL"),
    ];
    for (model, variable) in models {
        let served = Served::start_with(&["--model", model], &[(variable, &url)]).await;
        let tools = served.client.list_all_tools().await.unwrap();
        assert_eq!(hints(&tools, "subagent"), (Some(true), None, Some(false), Some(true)), "{model}");
        assert!(served.close().await.0.success());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_tasks_past_the_cap_are_a_tool_error_the_model_reads_and_a_finished_one_frees_a_place() {
    let served = Served::start(&["--max-background-tasks", "2"]).await;
    let background =
        |n: u32| json!({"description": format!("task {n}"), "prompt": "[slow] wait", "run_in_background": true});
    let first = answer(&served.call("subagent", background(1)).await);
    answer(&served.call("subagent", background(2)).await);
    let refused = served.call("subagent", background(3)).await;
    assert_eq!(refused.is_error, Some(true), "{refused:?}");
    assert_eq!(
        text(&refused),
        "background task refused: this session already has 2 running (the most at once); \
         collect one with task_output or stop one with task_kill, or run this one in the foreground"
    );
    let task_id = first["task_id"].as_str().unwrap();
    assert_eq!(answer(&served.call("task_kill", json!({"task_id": task_id})).await)["outcome"], "requested");
    let killed = answer(&served.call("task_output", json!({"task_id": task_id, "timeout_ms": 20000})).await);
    assert_eq!(killed["status"], "killed", "{killed}");
    assert_eq!(answer(&served.call("subagent", background(4)).await)["kind"], "background");
    assert!(served.close().await.0.success());
}

/// When each line of a raw client arrived, with the line.
fn timed_lines_until_answer(raw: &Raw, id: u64) -> Vec<(Instant, Value)> {
    let mut lines = Vec::new();
    loop {
        let line: Value = serde_json::from_str(&raw.next_line()).unwrap();
        let done = line["id"] == id;
        lines.push((Instant::now(), line));
        if done {
            return lines;
        }
    }
}

fn progress_call(raw: &mut Raw, id: u64, token: &str, prompt: &str) {
    let arguments = json!({"description": "work", "prompt": prompt});
    raw.request(
        id,
        "tools/call",
        json!({"name": "subagent", "arguments": arguments, "_meta": {"progressToken": token}}),
    );
}

#[test]
fn no_progress_follows_a_cancelled_call() {
    let mut raw = Raw::start(&[]);
    raw.handshake();
    // It delegates both parts at once (progress), then waits on them.
    progress_call(&mut raw, 2, "p2", "one [slow]; two [slow]");
    let notice = raw.next_line();
    assert!(notice.contains("notifications/progress") && notice.contains("p2"), "{notice}");
    raw.notify("notifications/cancelled", json!({"requestId": 2}));
    let aborted = Some(StopReason::Aborted);
    wait_until(ANSWER_WITHIN, "the run to end aborted", || {
        sessions(&raw.home()).iter().any(|e| e.last().and_then(SessionEvent::ended) == aborted)
    });
    // Longer than progress waits between two notifications.
    std::thread::sleep(Duration::from_millis(400));
    raw.request(3, "ping", json!({}));
    let after: Vec<Value> = timed_lines_until_answer(&raw, 3).into_iter().map(|(_, line)| line).collect();
    assert_eq!(after.len(), 1, "only the ping's answer: {after:?}");
}

#[test]
fn the_last_progress_of_a_call_does_not_hold_its_answer_back() {
    let mut raw = Raw::start(&[]);
    raw.handshake();
    let mut gaps = Vec::new();
    for id in 2..7 {
        // The second child answers a little later: more progress to send.
        progress_call(&mut raw, id, &format!("p{id}"), "check the parser; check the docs [delay:50]");
        let lines = timed_lines_until_answer(&raw, id);
        let (answered, answer) = lines.last().unwrap();
        assert!(answer["result"]["isError"] == false, "{answer}");
        let first = lines.iter().find(|(_, line)| line["method"] == "notifications/progress").expect("progress");
        assert!(lines.len() > 2, "the run reported more than once: {lines:?}");
        gaps.push(answered.duration_since(first.0));
    }
    // Progress is sent at most every 200 ms; the answer waits for none of it.
    let quickest = gaps.iter().min().unwrap();
    assert!(*quickest < Duration::from_millis(200), "answers came {gaps:?} after the first progress");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_run_tells_the_model_why_in_fixed_words() {
    let served = Served::start(&[]).await;
    let failed = served.call("subagent", json!({"description": "doomed", "prompt": "[fail] try anyway"})).await;
    assert_eq!(failed.is_error, Some(true), "{failed:?}");
    assert_eq!(text(&failed), "subagent run failed: the scripted model failed");
    assert!(served.close().await.0.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_structured_answer_names_its_run_and_kind_in_meta_beside_structured_content() {
    let served = Served::start(&[]).await;
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    let result = served
        .call("subagent", json!({"description": "a city", "prompt": "name a city", "output_schema": schema}))
        .await;
    assert!(result.structured_content.is_some(), "{result:?}");
    let meta = Value::Object(result.meta.clone().expect("_meta").0);
    let text = answer(&result);
    assert_eq!(meta["kind"], "foreground", "{meta}");
    assert_eq!(meta["run_id"], text["run_id"], "{meta}");
    assert!(served.close().await.0.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configured_acp_provider_serves_the_clients_calls_in_parallel() {
    let config_dir = tempfile::tempdir().unwrap();
    let config = config_dir.path().join("agents.toml");
    let file = format!(
        "[providers.echo]\nkind = \"mock\"\nreply = \"echo: \"\necho_prompt = true\n\n\
         [providers.agent]\nkind = \"acp\"\ncommand = \"{}\"\nargs = [\"acp\", \"--home\", \"{}\"]\n\
         reuse = \"pooled\"\npool = {{ size = 2 }}\n",
        env!("CARGO_BIN_EXE_subagents"),
        config_dir.path().join("acp-home").display()
    );
    std::fs::write(&config, file).unwrap();
    let config = config.display().to_string();
    let served = Served::start(&["--config", &config, "--provider", "agent"]).await;
    let calls =
        (0..4).map(|n| served.call("subagent", json!({"description": "one task", "prompt": format!("task {n}")})));
    let answers = futures_util::future::join_all(calls).await;
    for (n, result) in answers.iter().enumerate() {
        let answer = answer(result);
        assert_eq!(answer["output"], format!("handled: task {n}"), "{answer}");
        assert!(answer["run_id"].as_str().unwrap().starts_with("acp:agent:"), "{answer}");
    }
    let (status, _dir) = served.close().await;
    assert!(status.success());
}

#[test]
fn a_process_child_s_text_reaches_the_client_and_its_sessions_hang_under_the_client_s_root() {
    let mut raw = Raw::start(&["--provider", "process"]);
    raw.handshake();
    progress_call(&mut raw, 2, "p2", "check the parser; check the docs");
    let lines = timed_lines_until_answer(&raw, 2);
    let (_, answer) = lines.last().unwrap();
    assert!(answer["result"]["isError"] == false, "{answer}");
    let progress: Vec<String> = lines
        .iter()
        .filter(|(_, line)| line["method"] == "notifications/progress")
        .map(|(_, line)| line["params"]["message"].as_str().unwrap_or_default().to_owned())
        .collect();
    // The child's own answer text, streamed, not only its start and end.
    assert!(progress.iter().any(|message| message.contains("handled: check the docs")), "{progress:?}");
    // The client's root, the process child and the child's own two
    // children: one tree.
    let subagents = |args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
            .arg("sessions")
            .args(args)
            .arg("--home")
            .arg(raw.home())
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_slice::<Value>(&output.stdout).unwrap()
    };
    let listed = subagents(&["list", "--json"]);
    let listed = listed["sessions"].as_array().cloned().unwrap_or_default();
    let parents: Vec<&Value> = listed.iter().map(|session| &session["parent"]).collect();
    let root = listed
        .iter()
        .find(|session| session["parent"].is_null() && parents.contains(&&session["id"]))
        .unwrap_or_else(|| panic!("a root with children: {listed:?}"));
    let tree = subagents(&["tree", root["id"].as_str().unwrap(), "--json"]);
    let child = &tree["children"][0];
    assert_eq!(tree["children"].as_array().map(Vec::len), Some(1), "{tree}");
    assert_eq!(child["children"].as_array().map(Vec::len), Some(2), "the child's two children: {tree}");
}
