//! The runs' spans in the OpenTelemetry GenAI conventions: a spawn tree
//! read back from the SDK's in-memory exporter (names, kinds, attributes,
//! parent links), and the binary's OTLP/HTTP export to a stand-in
//! collector on loopback.

use crate::common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Within;
use opentelemetry::trace::{SpanId, SpanKind, TracerProvider as _};
use opentelemetry::Value;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use subagents::agent::ScriptedModel;
use subagents::tool::TaskService;
use subagents::{CancellationToken, Parent, Runtime, StartRequest, StopReason};
use tracing_subscriber::layer::SubscriberExt;

fn attributes(span: &SpanData) -> HashMap<String, Value> {
    span.attributes.iter().map(|kv| (kv.key.as_str().to_owned(), kv.value.clone())).collect()
}

fn attribute(span: &SpanData, key: &str) -> Option<String> {
    attributes(span).get(key).map(|value| value.as_str().into_owned())
}

#[test]
fn a_delegating_spawn_run_exports_a_tree_of_invoke_agent_chat_and_execute_tool_spans() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
    let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("test"));
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).unwrap();
    subagents::telemetry::record_gen_ai(true);

    let home = tempfile::tempdir().unwrap();
    let runtime = Runtime::builder().workers(1).home(home.path()).build().unwrap();
    let subagents = runtime.subagents();
    let tasks = TaskService::new();
    subagents::tool::register_delegating_spawn(&subagents, &tasks, Arc::new(ScriptedModel::demo())).unwrap();
    let cwd = home.path().to_path_buf();
    let run_id = runtime.within(common::WAIT_LIMIT, "the delegating run", async move {
        let parent = Parent::root(&cwd);
        let request = StartRequest::new("review the parser; check the docs", parent, CancellationToken::new());
        let run = subagents.start("spawn", request).await.unwrap();
        let result = run.result().await.unwrap();
        assert_eq!(result.stop_reason, StopReason::Completed, "{result:?}");
        run.dispose().await.unwrap();
        run.run_id()
    });
    runtime.shutdown_blocking();
    provider.force_flush().unwrap();
    // The subscriber is global and other tests of this binary run beside
    // this one: keep the spans of this run's trace.
    let spans = exporter.get_finished_spans().unwrap();
    let trace = spans
        .iter()
        .find(|s| s.name.starts_with("invoke_agent ") && attribute(s, "gen_ai.agent.id") == Some(run_id.to_string()))
        .map(|root| root.span_context.trace_id());
    let spans: Vec<SpanData> = spans.into_iter().filter(|s| Some(s.span_context.trace_id()) == trace).collect();
    let named = |prefix: &str| spans.iter().filter(|s| s.name.starts_with(prefix)).collect::<Vec<_>>();

    let agents = named("invoke_agent ");
    assert_eq!(
        agents.len(),
        3,
        "the run and its two children: {:?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    let root = agents.iter().find(|s| attribute(s, "gen_ai.agent.id") == Some(run_id.to_string())).expect("the root");
    assert_eq!(root.name, "invoke_agent spawn");
    assert_eq!(root.parent_span_id, SpanId::INVALID, "the root run has no parent span");
    for agent in &agents {
        assert_eq!(agent.span_kind, SpanKind::Internal, "spawn runs in this process");
        assert_eq!(attribute(agent, "gen_ai.operation.name").as_deref(), Some("invoke_agent"));
        assert_eq!(attribute(agent, "gen_ai.agent.name").as_deref(), Some("spawn"));
        assert!(attribute(agent, "gen_ai.conversation.id").is_some_and(|id| !id.is_empty()), "{agent:?}");
        assert!(attribute(agent, "error.type").is_none());
        // The run's token totals, from its usage as it ended.
        let tokens = |key: &str| match attributes(agent).get(key) {
            Some(Value::I64(count)) => *count,
            other => panic!("{key} is {other:?}"),
        };
        assert!(tokens("gen_ai.usage.input_tokens") > 0 && tokens("gen_ai.usage.output_tokens") > 0, "{agent:?}");
        assert_eq!(agent.span_context.trace_id(), root.span_context.trace_id(), "one trace");
    }

    let tools = named("execute_tool ");
    let delegations: Vec<_> = tools.iter().filter(|s| s.name == "execute_tool subagent").collect();
    assert_eq!(delegations.len(), 2, "the root delegated twice");
    for tool in &delegations {
        assert_eq!(tool.parent_span_id, root.span_context.span_id(), "a tool call is inside its run");
        assert_eq!(attribute(tool, "gen_ai.operation.name").as_deref(), Some("execute_tool"));
        assert_eq!(attribute(tool, "gen_ai.tool.name").as_deref(), Some("subagent"));
    }
    let children: Vec<_> = agents.iter().filter(|s| s.span_context.span_id() != root.span_context.span_id()).collect();
    let mut parents: Vec<SpanId> = children.iter().map(|child| child.parent_span_id).collect();
    let mut calls: Vec<SpanId> = delegations.iter().map(|tool| tool.span_context.span_id()).collect();
    parents.sort_by_key(|id| u64::from_be_bytes(id.to_bytes()));
    calls.sort_by_key(|id| u64::from_be_bytes(id.to_bytes()));
    assert_eq!(parents, calls, "each child run is inside the tool call that started it");

    let chats = named("chat ");
    assert!(chats.len() >= 4, "the root's two model calls and one per child: {}", chats.len());
    let run_ids: Vec<SpanId> = agents.iter().map(|s| s.span_context.span_id()).collect();
    for chat in &chats {
        assert_eq!(chat.span_kind, SpanKind::Client);
        assert!(run_ids.contains(&chat.parent_span_id), "a model call is inside its run");
        assert_eq!(attribute(chat, "gen_ai.operation.name").as_deref(), Some("chat"));
        assert!(attribute(chat, "gen_ai.provider.name").is_some());
        assert!(attribute(chat, "gen_ai.request.model").is_some());
        assert!(attribute(chat, "gen_ai.response.finish_reasons").is_some());
        let usage = attributes(chat);
        assert!(usage.contains_key("gen_ai.usage.input_tokens") && usage.contains_key("gen_ai.usage.output_tokens"));
        // The route's figures: a scripted model makes no HTTP attempt and
        // never waits on a limiter.
        assert_eq!(attribute(chat, "subagents.model.attempts").as_deref(), Some("0"), "{usage:?}");
        assert_eq!(attribute(chat, "subagents.limit.wait_ms").as_deref(), Some("0"), "{usage:?}");
    }
    // No message content on any span: not the prompt, not a child's task.
    for span in &spans {
        for (key, value) in attributes(span) {
            let value = value.as_str();
            assert!(!value.contains("review the parser") && !value.contains("check the docs"), "{key}={value}");
        }
    }
}

/// Each request a collector received: its path and body.
type Received = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// A stand-in OTLP/HTTP collector: answers every POST with 200 and keeps
/// each request's path and body. Bounded: it stops after `limit` requests.
fn collector(limit: usize) -> (String, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let received = Arc::new(Mutex::new(Vec::new()));
    let keep = received.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(limit) {
            let Ok(stream) = stream else { continue };
            stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut reader = BufReader::new(stream);
            let mut request_line = String::new();
            if reader.read_line(&mut request_line).is_err() {
                continue;
            }
            let mut length = 0usize;
            loop {
                let mut header = String::new();
                if reader.read_line(&mut header).is_err() || header.trim().is_empty() {
                    break;
                }
                if let Some((name, value)) = header.split_once(':') {
                    if name.eq_ignore_ascii_case("content-length") {
                        length = value.trim().parse().unwrap_or(0);
                    }
                }
            }
            let mut body = vec![0; length.min(16 << 20)];
            if reader.read_exact(&mut body).is_err() {
                continue;
            }
            let path = request_line.split_whitespace().nth(1).unwrap_or("").to_owned();
            keep.lock().unwrap().push((path, body));
            let mut stream = reader.into_inner();
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });
    (url, received)
}

/// Runs the binary with `args` and `--otlp` to a stand-in collector; every
/// body it posted, joined.
fn exported(args: &[&str]) -> Vec<u8> {
    posted(collector(64), args).concat()
}

/// Runs the binary with `args` and `--otlp` to `url`; each body posted
/// there (by it and by any child exporting to the same collector).
fn posted((url, received): (String, Received), args: &[&str]) -> Vec<Vec<u8>> {
    let home = tempfile::tempdir().unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_subagents"));
    command
        .env_remove("SUBAGENTS_HOME")
        .env_remove("SUBAGENTS_CONFIG")
        .env_remove("RUST_LOG")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env("OTEL_SERVICE_NAME", "otlp-test-service")
        .current_dir(home.path())
        .args(args)
        .arg("--home")
        .arg(home.path())
        .arg("--otlp")
        .arg(&url);
    let output = common::output_within(&mut command, common::WAIT_LIMIT, "subagents --otlp");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(!stderr.contains("OTLP"), "the export went through: {stderr}");
    let received = received.lock().unwrap();
    assert!(!received.is_empty(), "the exporter posted to the collector before exit");
    let paths: Vec<&str> = received.iter().map(|(path, _)| path.as_str()).collect();
    assert!(paths.iter().all(|path| *path == "/v1/traces"), "{paths:?}");
    received.iter().map(|(_, body)| body.clone()).collect()
}

/// How often `needle` occurs in `bytes`: protobuf keeps strings as they are.
fn occurrences(bytes: &[u8], needle: &str) -> usize {
    bytes.windows(needle.len()).filter(|window| *window == needle.as_bytes()).count()
}

#[test]
fn fanout_with_otlp_posts_the_spawn_tree_to_the_collector() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = dir.path().join("tasks.jsonl");
    std::fs::write(&tasks, "{\"prompt\": \"review the parser; check the docs\"}\n").unwrap();
    let bodies = exported(&["fanout", tasks.to_str().unwrap()]);
    assert_eq!(occurrences(&bodies, "invoke_agent spawn"), 3, "the task's run and its two children");
    assert_eq!(occurrences(&bodies, "execute_tool subagent"), 2);
    assert!(occurrences(&bodies, "chat ") >= 4);
    assert!(occurrences(&bodies, "otlp-test-service") >= 1, "the service is OTEL_SERVICE_NAME");
    assert_eq!(occurrences(&bodies, "review the parser"), 0, "no message content is exported");
}

#[test]
fn run_with_otlp_roots_its_runs_under_the_parent_agent() {
    let bodies = exported(&["run", "review the parser; check the docs"]);
    assert_eq!(occurrences(&bodies, "invoke_agent parent"), 1);
    assert_eq!(occurrences(&bodies, "invoke_agent spawn"), 2);
    assert_eq!(occurrences(&bodies, "execute_tool subagent"), 2);
    assert_eq!(occurrences(&bodies, "check the docs"), 0, "no message content is exported");
}

/// One span of an OTLP export, as far as these tests read it.
#[derive(Debug)]
struct Exported {
    trace_id: Vec<u8>,
    span_id: Vec<u8>,
    parent_span_id: Vec<u8>,
    name: String,
}

/// The protobuf fields of `bytes` (number, length-delimited payload);
/// other wire types are skipped.
fn fields(mut bytes: &[u8]) -> Vec<(u64, &[u8])> {
    fn varint(bytes: &mut &[u8]) -> u64 {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (byte, rest) = bytes.split_first().expect("a complete varint");
            *bytes = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
        }
        value
    }
    let mut found = Vec::new();
    while !bytes.is_empty() {
        let key = varint(&mut bytes);
        match key & 7 {
            0 => drop(varint(&mut bytes)),
            1 => bytes = &bytes[8..],
            5 => bytes = &bytes[4..],
            2 => {
                let length = varint(&mut bytes) as usize;
                found.push((key >> 3, &bytes[..length]));
                bytes = &bytes[length..];
            }
            other => panic!("wire type {other} in an OTLP body"),
        }
    }
    found
}

/// The spans of OTLP/protobuf `ExportTraceServiceRequest` bodies.
fn spans_of(bodies: &[Vec<u8>]) -> Vec<Exported> {
    fn nested(bytes: &[u8], number: u64) -> Vec<&[u8]> {
        fields(bytes).into_iter().filter(|(n, _)| *n == number).map(|(_, payload)| payload).collect()
    }
    let mut spans = Vec::new();
    for body in bodies {
        for resource in nested(body, 1) {
            for scope in nested(resource, 2) {
                for span in nested(scope, 2) {
                    let field =
                        |number| nested(span, number).first().map(|payload| payload.to_vec()).unwrap_or_default();
                    spans.push(Exported {
                        trace_id: field(1),
                        span_id: field(2),
                        parent_span_id: field(4),
                        name: String::from_utf8(field(5)).unwrap(),
                    });
                }
            }
        }
    }
    spans
}

/// Runs `subagents run --otlp` delegating to `provider` (a configuration
/// table for `[providers.child]`, without its `env`), whose children in
/// other processes export to the same collector: every span of theirs
/// named `served` is in the parent's trace, each under one of the
/// parent's runs.
fn children_join_the_parents_trace(provider: &str, served: &str) {
    let (url, received) = collector(64);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("subagents.toml");
    // The child exports to the same collector, told through its environment.
    let text = format!("[providers.child]\n{provider}env = {{ OTEL_EXPORTER_OTLP_ENDPOINT = {url:?} }}\n");
    std::fs::write(&config, text).unwrap();
    let args =
        ["run", "--config", config.to_str().unwrap(), "--provider", "child", "review the parser; check the docs"];
    let spans = spans_of(&posted((url, received), &args));
    let names: Vec<&str> = spans.iter().map(|span| span.name.as_str()).collect();

    let root = spans.iter().find(|span| span.name == "invoke_agent parent").expect("the parent agent's span");
    let runs: Vec<&Exported> = spans.iter().filter(|span| span.name == "invoke_agent child").collect();
    let sessions: Vec<&Exported> = spans.iter().filter(|span| span.name == served).collect();
    assert_eq!(runs.len(), 2, "the parent delegated twice: {names:?}");
    assert_eq!(sessions.len(), 2, "each child exported its turn's span: {names:?}");
    for span in runs.iter().chain(&sessions) {
        assert_eq!(span.trace_id, root.trace_id, "one trace across the processes: {span:?}");
    }
    let mut run_ids: Vec<&[u8]> = runs.iter().map(|run| run.span_id.as_slice()).collect();
    let mut parents: Vec<&[u8]> = sessions.iter().map(|session| session.parent_span_id.as_slice()).collect();
    run_ids.sort();
    parents.sort();
    assert_eq!(parents, run_ids, "each child's span is inside the parent's run that started it");
    // The child's model calls are inside its span.
    let session_ids: Vec<&[u8]> = sessions.iter().map(|session| session.span_id.as_slice()).collect();
    let chats: Vec<&Exported> =
        spans.iter().filter(|span| span.trace_id == root.trace_id && span.name.starts_with("chat ")).collect();
    assert!(
        chats.iter().any(|chat| session_ids.contains(&chat.parent_span_id.as_slice())),
        "a child's chat span hangs under its span: {names:?}"
    );
}

#[test]
fn run_with_otlp_on_a_process_provider_joins_each_child_process_to_the_parents_trace() {
    let bin = env!("CARGO_BIN_EXE_subagents");
    children_join_the_parents_trace(&format!("kind = \"process\"\nbin = {bin:?}\n"), "invoke_agent default");
}

#[test]
fn run_with_otlp_on_an_acp_provider_joins_each_prompt_to_the_parents_trace() {
    let bin = env!("CARGO_BIN_EXE_subagents");
    children_join_the_parents_trace(
        &format!("kind = \"acp\"\ncommand = {bin:?}\nargs = [\"acp\"]\n"),
        "invoke_agent acp",
    );
}

#[test]
fn run_with_otlp_on_the_remote_provider_joins_each_workers_run_to_the_parents_trace() {
    use crate::remote::support::{one_at_a_time, Server, Worker};
    let _serial = one_at_a_time();
    let (url, received) = collector(64);
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let mut worker = Worker::start(dir.path(), &server.url(), "w1", &["--otlp", &url]);
    let nats = server.url();
    let args = ["run", "--provider", "remote", "--nats", &nats, "review the parser; check the docs"];
    posted((url, received.clone()), &args);
    // The worker exports what is left as it stops.
    assert!(worker.terminate(common::WAIT_LIMIT).is_some_and(|status| status.success()), "{}", worker.log());
    let bodies: Vec<Vec<u8>> = received.lock().unwrap().iter().map(|(_, body)| body.clone()).collect();
    let spans = spans_of(&bodies);
    let names: Vec<&str> = spans.iter().map(|span| span.name.as_str()).collect();

    let root = spans.iter().find(|span| span.name == "invoke_agent parent").expect("the parent agent's span");
    let calls: Vec<&Exported> = spans.iter().filter(|span| span.name == "invoke_agent remote").collect();
    assert_eq!(calls.len(), 2, "the parent delegated twice: {names:?}");
    let on_worker: Vec<&Exported> = spans
        .iter()
        .filter(|span| {
            span.name.starts_with("invoke_agent ") && calls.iter().any(|call| call.span_id == span.parent_span_id)
        })
        .collect();
    assert_eq!(on_worker.len(), 2, "each worker run is inside the caller's run that sent it: {names:?}");
    assert!(on_worker.iter().chain(&calls).all(|span| span.trace_id == root.trace_id), "one trace: {on_worker:?}");
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[test]
fn subagents_mcp_runs_a_calls_work_inside_the_trace_its_meta_names() {
    let (url, received) = collector(64);
    let mut server = crate::mcp::support::Raw::start(&["--otlp", &url]);
    server.handshake();
    let (trace_id, caller_span) = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331");
    let arguments = serde_json::json!({"description": "two checks", "prompt": "check the parser; check the docs"});
    let meta = serde_json::json!({"traceparent": format!("00-{trace_id}-{caller_span}-01")});
    server.request(2, "tools/call", serde_json::json!({"name": "subagent", "arguments": arguments, "_meta": meta}));
    let answer = server.answer();
    assert!(answer["result"]["isError"] != true, "{answer}");
    server.close_stdin();
    assert!(server.wait_for_exit(common::WAIT_LIMIT).success(), "{}", server.stderr());
    let bodies: Vec<Vec<u8>> = received.lock().unwrap().iter().map(|(_, body)| body.clone()).collect();
    let spans = spans_of(&bodies);
    let names: Vec<&str> = spans.iter().map(|span| span.name.as_str()).collect();
    // The served call's span, its parent the caller's (the run's own
    // delegations are `execute_tool subagent` spans too, further down).
    let call = spans
        .iter()
        .find(|span| span.name == "execute_tool subagent" && hex(&span.parent_span_id) == caller_span)
        .unwrap_or_else(|| panic!("no span under the caller's: {names:?}"));
    assert_eq!(hex(&call.trace_id), trace_id, "the call joined the caller's trace");
    let runs: Vec<&Exported> = spans
        .iter()
        .filter(|span| span.name.starts_with("invoke_agent ") && span.parent_span_id == call.span_id)
        .collect();
    assert_eq!(runs.len(), 1, "the call's run is inside it: {names:?}");
    let agents: Vec<&Exported> = spans.iter().filter(|span| span.name.starts_with("invoke_agent ")).collect();
    assert_eq!(agents.len(), 3, "the call's run and its two children: {names:?}");
    assert!(agents.iter().all(|run| hex(&run.trace_id) == trace_id), "one trace: {agents:?}");
}
