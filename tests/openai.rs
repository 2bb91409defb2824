//! docs/contract.md §10.3 the OpenAI-compatible adapter, against a loopback HTTP server
//! started inside each test (no network).

use crate::common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::adapters::{
    a_greeting_streams_to_the_listener, adding_through_the_tool_completes_with_42,
    an_endless_stream_ends_at_the_call_deadline, assert_failed_with,
    cancelling_mid_stream_aborts_and_closes_the_connection, keep_alive_forever, openai_config,
};
use common::loopback::{endless_stream, ok, within_20_s, Loopback, Reply};
use serde_json::{json, Value};
use subagents::agent::{Agent, AgentUpdate, Model, ModelError, OpenAiConfig, OpenAiModel, SessionEvent};
use subagents::seam::AgentOptions;
use subagents::StopReason;

fn completion(message: Value, finish_reason: &str) -> Value {
    json!({
        "id": "cmpl-1", "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7}
    })
}

fn delta(delta: Value, finish_reason: Option<&str>) -> Value {
    json!({"choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]})
}

/// A chat-completions stream: each chunk a `data:` line, then `data:
/// [DONE]` if `done`; then hang until the client closes (`hang`), or close.
fn chat_stream(events: Vec<Value>, done: bool, hang: bool) -> Reply {
    let mut frames: Vec<String> = events.iter().map(|event| format!("data: {event}\n\n")).collect();
    if done {
        frames.push("data: [DONE]\n\n".to_owned());
    }
    Reply::Stream { frames, hang }
}

fn config(server: &Loopback) -> OpenAiConfig {
    openai_config(server, "test-model")
}

fn agent_on(config: OpenAiConfig) -> Agent {
    Agent::builder(OpenAiModel::new(config).unwrap()).build().unwrap()
}

#[tokio::test]
async fn a_plain_reply_completes_and_the_request_carries_route_and_key() {
    let server = Loopback::start(vec![ok(completion(json!({"role": "assistant", "content": "four"}), "stop"))]).await;
    let model = OpenAiModel::new(config(&server).with_stream(false)).unwrap();
    assert_eq!(model.name(), "openai:test-model");
    let route = AgentOptions { model: Some("routed-model".into()), max_tokens: Some(64), ..Default::default() };
    let agent = Agent::builder(model).options(route).persona("You count.").build().unwrap();
    let outcome = agent.prompt("two plus two").await;
    assert_eq!((outcome.stop_reason, outcome.output.as_str()), (StopReason::Completed, "four"));

    let requests = server.requests.lock().unwrap();
    assert_eq!(requests[0].header("authorization"), Some("Bearer sk-test"));
    let body = &requests[0].body;
    assert_eq!(body["model"], "routed-model", "the route's model overrides the configured one");
    assert_eq!(body["max_tokens"], 64);
    assert_eq!(body["messages"][0]["role"], "system");
    assert!(body["messages"][0]["content"].as_str().unwrap().starts_with("You count."));
    assert_eq!(body["messages"][1], json!({"role": "user", "content": "two plus two"}));
    assert!(body.get("tools").is_none() && body.get("stream").is_none());
}

#[tokio::test]
async fn a_streamed_reply_reaches_listeners_chunk_by_chunk() {
    let server = Loopback::start(vec![chat_stream(
        vec![
            delta(json!({"role": "assistant", "content": ""}), None),
            delta(json!({"content": "Hel"}), None),
            delta(json!({"content": "lo"}), None),
            delta(json!({}), Some("stop")),
            json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}),
        ],
        true,
        false,
    )])
    .await;
    a_greeting_streams_to_the_listener(Agent::builder(OpenAiModel::new(config(&server)).unwrap())).await;
    assert_eq!(server.bodies()[0]["stream"], true);
}

#[tokio::test]
async fn a_streamed_tool_call_round_trips_through_the_agent() {
    let server = Loopback::start(vec![
        chat_stream(
            vec![
                delta(
                    json!({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                    "function": {"name": "add", "arguments": "{\"a\": 2"}}]}),
                    None,
                ),
                delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": ", \"b\": 40}"}}]}), None),
                delta(json!({}), Some("tool_calls")),
            ],
            true,
            false,
        ),
        chat_stream(vec![delta(json!({"content": "42"}), None), delta(json!({}), Some("stop"))], true, false),
    ])
    .await;
    adding_through_the_tool_completes_with_42(OpenAiModel::new(config(&server)).unwrap()).await;

    let bodies = server.bodies();
    assert_eq!(bodies[0]["tools"][0]["function"]["name"], "add");
    assert_eq!(bodies[0]["tools"][0]["type"], "function");
    let messages = bodies[1]["messages"].as_array().unwrap();
    let assistant = &messages[messages.len() - 2];
    assert_eq!(assistant["tool_calls"][0]["id"], "call_a");
    let arguments: Value =
        serde_json::from_str(assistant["tool_calls"][0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"a": 2, "b": 40}));
    assert_eq!(messages[messages.len() - 1], json!({"role": "tool", "tool_call_id": "call_a", "content": "42"}));
}

#[tokio::test]
async fn a_429_is_retried_after_its_retry_after_and_then_succeeds() {
    let server = Loopback::start(vec![
        Reply::Whole {
            status: 429,
            headers: vec![("retry-after", "0".into())],
            body: json!({"error": {"message": "slow down"}}).to_string(),
        },
        Reply::Whole { status: 503, headers: Vec::new(), body: "busy".into() },
        ok(completion(json!({"role": "assistant", "content": "finally"}), "stop")),
    ])
    .await;
    let outcome = agent_on(config(&server).with_stream(false)).prompt("hi").await;
    assert_eq!((outcome.stop_reason, outcome.output.as_str()), (StopReason::Completed, "finally"));
    assert_eq!(server.bodies().len(), 3);
    assert_eq!((outcome.usage.model_calls, outcome.usage.attempts), (1, 3), "the turn counts every attempt");
}

#[tokio::test]
async fn retries_run_out_with_the_status_and_the_endpoints_message() {
    let busy =
        || Reply::Whole { status: 500, headers: Vec::new(), body: json!({"error": {"message": "boom"}}).to_string() };
    let server = Loopback::start(vec![busy(), busy(), busy()]).await;
    let outcome = agent_on(config(&server)).prompt("hi").await;
    assert_eq!(outcome.stop_reason, StopReason::Error);
    assert_eq!(outcome.error.as_ref().map(|e| e.message.as_str()), Some("the model endpoint answered 500: boom"));
    assert_eq!(server.bodies().len(), 3, "one try and two retries");

    let server = Loopback::start(vec![Reply::Whole { status: 401, headers: Vec::new(), body: "{}".into() }]).await;
    let outcome = agent_on(config(&server)).prompt("hi").await;
    assert!(outcome.error.unwrap().message.contains("answered 401"));
    assert_eq!(server.bodies().len(), 1, "a client error is not retried");
}

#[tokio::test]
async fn a_malformed_body_ends_the_turn_error_with_a_clear_message() {
    for body in ["this is not json", r#"{"choices": []}"#, r#"{"choices": [{"message": 5}]}"#] {
        let server = Loopback::start(vec![Reply::Whole { status: 200, headers: Vec::new(), body: body.into() }]).await;
        let agent = agent_on(config(&server).with_stream(false));
        let outcome = agent.prompt("hi").await;
        assert_eq!(outcome.stop_reason, StopReason::Error, "{body}");
        assert!(outcome.error.as_ref().unwrap().message.starts_with("malformed model response"), "{outcome:?}");
        assert_eq!(agent.events().last().and_then(SessionEvent::ended), Some(StopReason::Error));
    }
    let server = Loopback::start(vec![chat_stream(vec![json!("x")], false, false)]).await;
    let outcome = agent_on(config(&server)).prompt("hi").await;
    assert_eq!(outcome.stop_reason, StopReason::Error);
}

#[tokio::test]
async fn a_stream_that_breaks_off_is_an_error_keeping_the_streamed_text() {
    let server =
        Loopback::start(vec![chat_stream(vec![delta(json!({"content": "partial"}), None)], false, false)]).await;
    let outcome = agent_on(config(&server)).prompt("hi").await;
    assert_eq!((outcome.stop_reason, outcome.output.as_str()), (StopReason::Error, "partial"));
    assert!(outcome.error.unwrap().message.contains("ended before the answer finished"));
}

#[tokio::test]
async fn cancelling_mid_stream_closes_the_connection_and_aborts_the_turn() {
    let server =
        Loopback::start(vec![chat_stream(vec![delta(json!({"content": "thinking"}), None)], false, true)]).await;
    cancelling_mid_stream_aborts_and_closes_the_connection(&server, OpenAiModel::new(config(&server)).unwrap()).await;
}

#[tokio::test]
async fn finish_reasons_map_to_max_tokens_and_refusal() {
    let server = Loopback::start(vec![
        ok(completion(json!({"role": "assistant", "content": "cut o"}), "length")),
        ok(completion(json!({"role": "assistant", "content": null, "refusal": "I cannot help"}), "stop")),
        ok(completion(json!({"role": "assistant", "content": ""}), "content_filter")),
    ])
    .await;
    let agent = agent_on(config(&server).with_stream(false));
    let outcome = agent.prompt("a").await;
    assert_eq!((outcome.stop_reason, outcome.output.as_str()), (StopReason::MaxTokens, "cut o"));
    let outcome = agent.prompt("b").await;
    assert_eq!((outcome.stop_reason, outcome.output.as_str()), (StopReason::Refusal, "I cannot help"));
    assert_eq!(agent.prompt("c").await.stop_reason, StopReason::Refusal);
}

#[tokio::test]
async fn an_unreachable_endpoint_and_a_silent_one_fail_without_hanging() {
    let closed_port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let closed =
        OpenAiConfig::new(format!("http://127.0.0.1:{closed_port}/v1"), "m").with_retries(1, Duration::from_millis(5));
    let outcome = agent_on(closed).prompt("hi").await;
    assert_eq!(outcome.stop_reason, StopReason::Error);
    assert!(outcome.error.unwrap().message.contains("could not be reached"));

    let server = Loopback::start(vec![Reply::Silent]).await;
    let config = config(&server).with_retries(0, Duration::ZERO).with_timeout(Duration::from_millis(200));
    let outcome = agent_on(config).prompt("hi").await;
    assert_eq!(outcome.stop_reason, StopReason::Error);
    assert!(outcome.error.unwrap().message.contains("timed out"));
}

#[test]
fn configuration_and_bounds_come_from_the_environment_and_bad_values_are_refused() {
    let mut environment = common::env::lock();
    environment.remove("SUBAGENTS_MODEL");
    assert!(matches!(OpenAiConfig::from_env(), Err(ModelError::Config(_))));
    environment.set("SUBAGENTS_MODEL", "deepseek-chat");
    environment.set("SUBAGENTS_BASE_URL", "http://127.0.0.1:9/v1");
    environment.set("SUBAGENTS_API_KEY", "sk-env");
    let config = OpenAiConfig::from_env().unwrap();
    assert_eq!((config.model.as_str(), config.base_url.as_str()), ("deepseek-chat", "http://127.0.0.1:9/v1"));
    assert_eq!(config.api_key.as_deref(), Some("sk-env"));
    assert!(!format!("{config:?}").contains("sk-env"), "the key is redacted from Debug");
    assert_eq!((config.max_answer_bytes, config.max_tool_calls), (64 << 20, 128), "the default bounds");
    assert_eq!(config.call_deadline, Duration::from_secs(600));

    let bounds = [
        ("SUBAGENTS_MODEL_MAX_ANSWER_MIB", "8"),
        ("SUBAGENTS_MODEL_MAX_ERROR_BODY_MIB", "2"),
        ("SUBAGENTS_MODEL_MAX_TOOL_CALLS", "16"),
        ("SUBAGENTS_MODEL_MAX_TOOL_ARGUMENTS_MIB", "3"),
        ("SUBAGENTS_MODEL_DEADLINE_SECS", "90"),
        ("SUBAGENTS_MODEL_RPM", "300"),
        ("SUBAGENTS_MODEL_TPM", "90000"),
        ("SUBAGENTS_MODEL_MAX_CONCURRENT", "8"),
        ("SUBAGENTS_MODEL_MAX_TOKENS", "512"),
    ];
    for (name, value) in bounds {
        environment.set(name, value);
    }
    let config = OpenAiConfig::from_env().unwrap();
    assert_eq!(
        (config.max_answer_bytes, config.max_error_body_bytes, config.max_tool_calls, config.max_tool_argument_bytes),
        (8 << 20, 2 << 20, 16, 3 << 20)
    );
    assert_eq!(config.call_deadline, Duration::from_secs(90));
    let limits = config.limits;
    assert_eq!(
        (limits.requests_per_minute, limits.tokens_per_minute, limits.max_concurrent, config.max_tokens),
        (Some(300), Some(90_000), Some(8), Some(512)),
        "the environment-configured route takes rate limits too"
    );
    assert_eq!(OpenAiModel::new(config).unwrap().limiter().limits(), limits);
    environment.set("SUBAGENTS_MODEL_MAX_TOOL_CALLS", "lots");
    let refused = OpenAiConfig::from_env().unwrap_err().to_string();
    assert!(refused.contains("SUBAGENTS_MODEL_MAX_TOOL_CALLS must be a whole number"), "{refused}");
    environment.set("SUBAGENTS_MODEL_MAX_TOOL_CALLS", "16");
    environment.set("SUBAGENTS_MODEL_DEADLINE_SECS", "0");
    let refused = OpenAiModel::new(OpenAiConfig::from_env().unwrap()).unwrap_err().to_string();
    assert!(refused.contains("call_deadline is 0"), "a bound that fails every call is refused: {refused}");
    for name in ["SUBAGENTS_MODEL", "SUBAGENTS_BASE_URL", "SUBAGENTS_API_KEY"].into_iter().chain(bounds.map(|b| b.0)) {
        environment.remove(name);
    }
    assert!(matches!(OpenAiModel::new(OpenAiConfig::new("ftp://x", "m")), Err(ModelError::Config(_))));
}

#[tokio::test]
async fn a_non_transient_server_status_is_not_retried_and_an_html_page_becomes_one_short_line() {
    let page = format!(
        "<!DOCTYPE html>\n<html><head><title>501 Not Implemented</title><style>body {{ color: red }}</style>\
         <script>var secret = 1;</script></head>\n<body>\n<h1>Not&nbsp;Implemented</h1>\n<p>{}</p></body></html>",
        "padding ".repeat(100)
    );
    for status in [501, 505] {
        let server = Loopback::start(vec![
            Reply::Whole { status, headers: Vec::new(), body: page.clone() },
            ok(completion(json!({"role": "assistant", "content": "never"}), "stop")),
        ])
        .await;
        let outcome = agent_on(config(&server)).prompt("hi").await;
        assert_eq!(outcome.stop_reason, StopReason::Error);
        assert_eq!(server.bodies().len(), 1, "{status} is not transient: no retry");
        let error = outcome.error.unwrap();
        let line = error.message.strip_prefix(&format!("the model endpoint answered {status}: ")).unwrap();
        assert!(line.starts_with("501 Not Implemented Not Implemented padding"), "{line}");
        assert!(!line.contains('<') && !line.contains('\n') && !line.contains("secret") && !line.contains("color"));
        assert!(line.chars().count() <= 201, "{} chars", line.chars().count());
        assert_eq!(error.reason, format!("the model endpoint answered {status}"), "the safe reason names the status");
    }
}

/// An assistant message with `n` calls of `list_dir`, each with `arguments`.
fn tool_calls(n: usize, arguments: &str) -> Vec<Value> {
    (0..n)
        .map(|i| {
            json!({"index": i, "id": format!("call_{i}"), "type": "function",
            "function": {"name": "list_dir", "arguments": arguments}})
        })
        .collect()
}

#[tokio::test]
async fn a_body_past_the_answer_bound_ends_the_run_error_and_is_not_kept() {
    let big = completion(json!({"role": "assistant", "content": "x".repeat(300 * 1024)}), "stop");
    let server = Loopback::start(vec![ok(big)]).await;
    let agent = agent_on(config(&server).with_stream(false).with_max_answer_bytes(64 * 1024));
    let outcome = within_20_s(agent.prompt("hi")).await;
    assert_failed_with(&outcome, "the model's answer is larger than 64 KiB");
    assert_eq!(server.bodies().len(), 1, "a refused answer is not retried");
    let kept = agent.events();
    assert!(!kept.iter().any(|e| matches!(e, SessionEvent::Assistant { .. })), "nothing of it reaches the session");
}

#[tokio::test]
async fn a_stream_past_the_answer_bound_ends_the_run_error_and_closes_the_connection() {
    let chunk = format!("data: {}\n\n", delta(json!({"content": "y".repeat(8 * 1024)}), None));
    let server = Loopback::start(vec![endless_stream(chunk, Duration::from_millis(1))]).await;
    let agent = agent_on(config(&server).with_max_answer_bytes(256 * 1024));
    let outcome = within_20_s(agent.prompt("hi")).await;
    assert_failed_with(&outcome, "the model's answer is larger than 256 KiB");
    assert!(outcome.output.len() <= 256 * 1024, "the streamed text so far is kept, no more");
    assert!(common::eventually(Duration::from_secs(10), || server.client_closed.load(Ordering::SeqCst)).await);
}

#[tokio::test]
async fn an_error_body_is_read_only_up_to_its_bound_for_the_message() {
    // A 400 declaring a gigabyte of HTML and sending it forever.
    let head = "HTTP/1.1 400 Bad Request\r\ncontent-type: text/html\r\ncontent-length: 1000000000\r\n\r\n<p>";
    let server = Loopback::start(vec![Reply::Endless {
        head: head.to_owned(),
        chunk: b"too big ".repeat(1024),
        every: Duration::from_millis(1),
    }])
    .await;
    let started = Instant::now();
    let agent = agent_on(config(&server).with_max_error_body_bytes(16 * 1024));
    let outcome = within_20_s(agent.prompt("hi")).await;
    assert!(started.elapsed() < Duration::from_secs(5), "read to the bound, not to the timeout");
    assert_failed_with(&outcome, "the model endpoint answered 400");
    let message = outcome.error.unwrap().message;
    assert!(message.starts_with("the model endpoint answered 400: too big too big"), "{message}");
    assert!(common::eventually(Duration::from_secs(10), || server.client_closed.load(Ordering::SeqCst)).await);
}

#[tokio::test]
async fn an_answer_with_more_tool_calls_than_the_cap_fails_without_running_any() {
    let whole = ok(completion(
        json!({"role": "assistant", "content": null, "tool_calls": tool_calls(1000, "{}")}),
        "tool_calls",
    ));
    let streamed = chat_stream(vec![delta(json!({"tool_calls": tool_calls(1000, "{}")}), None)], true, false);
    for (reply, stream) in [(whole, false), (streamed, true)] {
        let done = ok(completion(json!({"role": "assistant", "content": "done"}), "stop"));
        let server = Loopback::start(vec![reply, done]).await;
        let agent = agent_on(config(&server).with_stream(stream));
        let outcome = within_20_s(agent.prompt("list everything")).await;
        assert_failed_with(&outcome, "the model's answer asks for more than 128 tool calls");
        assert_eq!(server.bodies().len(), 1, "stream {stream}: the turn stops at the refused answer");
        assert!(!agent.events().iter().any(|e| matches!(e, SessionEvent::ToolResult { .. })), "no call ran");
    }
}

#[tokio::test]
async fn tool_call_arguments_past_their_bound_fail_the_model_call() {
    let arguments = format!("{{\"path\": \"{}\"}}", "a".repeat(4096));
    let whole = ok(completion(
        json!({"role": "assistant", "content": null, "tool_calls": tool_calls(1, &arguments)}),
        "tool_calls",
    ));
    // Streamed, the arguments grow piece by piece past the bound.
    let mut pieces = vec![delta(json!({"tool_calls": tool_calls(1, "")}), None)];
    for piece in arguments.as_bytes().chunks(512) {
        let piece = std::str::from_utf8(piece).unwrap();
        pieces.push(delta(json!({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}), None));
    }
    pieces.push(delta(json!({}), Some("tool_calls")));
    let streamed = chat_stream(pieces, true, false);
    for (reply, stream) in [(whole, false), (streamed, true)] {
        let done = ok(completion(json!({"role": "assistant", "content": "done"}), "stop"));
        let server = Loopback::start(vec![reply, done]).await;
        let agent = agent_on(config(&server).with_stream(stream).with_tool_call_limits(128, 1024));
        let outcome = within_20_s(agent.prompt("list a")).await;
        assert_failed_with(&outcome, "a tool call's arguments are larger than 1 KiB");
        assert_eq!(server.bodies().len(), 1, "stream {stream}");
    }
}

#[tokio::test]
async fn keep_alive_comments_forever_end_at_the_call_deadline() {
    let deadline = |server: &Loopback| agent_on(config(server).with_call_deadline(Duration::from_millis(500)));
    an_endless_stream_ends_at_the_call_deadline(keep_alive_forever(), deadline).await;
}

#[tokio::test]
async fn a_server_that_never_sends_headers_fails_at_the_call_deadline_retries_included() {
    let server = Loopback::start(vec![Reply::Silent, Reply::Silent, Reply::Silent, Reply::Silent]).await;
    let started = Instant::now();
    let config = config(&server)
        .with_timeout(Duration::from_secs(3))
        .with_retries(3, Duration::from_millis(10))
        .with_call_deadline(Duration::from_millis(500));
    let outcome = within_20_s(agent_on(config).prompt("hi")).await;
    // Four tries of 3 s each would take 12 s.
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    assert_failed_with(&outcome, "the model call passed its deadline of 0.5 s");
}

#[tokio::test]
async fn a_runs_budget_deadline_ends_a_call_and_its_retries_as_aborted() {
    let server = Loopback::start(vec![Reply::Silent, Reply::Silent, Reply::Silent, Reply::Silent]).await;
    let started = Instant::now();
    let config = config(&server).with_timeout(Duration::from_secs(3)).with_retries(3, Duration::from_millis(10));
    let budget = subagents::Budget::new().with_deadline(Duration::from_millis(300)).lease();
    let agent = Agent::builder(OpenAiModel::new(config).unwrap()).budget(budget).build().unwrap();
    let outcome = within_20_s(agent.prompt("hi")).await;
    assert_eq!(outcome.stop_reason, StopReason::Aborted, "{outcome:?}");
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
}

#[tokio::test]
async fn a_stream_that_ends_before_its_finish_is_an_answer_that_broke_off_not_an_unreachable_endpoint() {
    let server = Loopback::start(vec![chat_stream(
        vec![delta(json!({"role": "assistant", "content": "Hel"}), None)],
        false,
        false,
    )])
    .await;
    let config = config(&server).with_retries(0, Duration::ZERO);
    let agent =
        Agent::builder(OpenAiModel::new(config).unwrap()).on_update(Arc::new(|_: &AgentUpdate| {})).build().unwrap();
    let outcome = agent.prompt("greet").await;
    assert_eq!(outcome.stop_reason, StopReason::Error);
    let error = outcome.error.unwrap();
    assert!(error.message.contains("broke off"), "{}", error.message);
    assert!(!error.message.contains("could not be reached"), "{}", error.message);
}
