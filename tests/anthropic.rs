//! The Anthropic Messages adapter against a loopback server speaking the
//! API's documented wire (no network): requests, streamed and whole
//! answers, tool use round trips, stop reasons, usage, retries, errors and
//! every bound.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::adapters::{
    a_greeting_streams_to_the_listener, adding_through_the_tool_completes_with_42,
    an_endless_answer_fails_past_its_bound, an_endless_stream_ends_at_the_call_deadline, ask, assert_failed_with,
    cancelling_mid_stream_aborts_and_closes_the_connection, each_fails_without_running_a_call,
    each_stream_ends_the_run_error, endless_after,
};
use common::loopback::{endless_stream, event, ok, status, within_20_s, Loopback, Reply};
use serde_json::{json, Value};
use subagents::agent::{
    Agent, AgentUpdate, AnthropicConfig, AnthropicModel, Finish, Model, ModelError, ModelSpec, Usage,
};
use subagents::seam::AgentOptions;
use subagents::StopReason;

fn config(server: &Loopback) -> AnthropicConfig {
    AnthropicConfig::new(&server.origin, "claude-test")
        .with_api_key("sk-ant-test")
        .with_retries(2, Duration::from_millis(10))
        .with_timeout(Duration::from_secs(10))
}

fn agent_on(config: AnthropicConfig) -> Agent {
    Agent::builder(AnthropicModel::new(config).unwrap()).build().unwrap()
}

/// A streamed message: `message_start`, `blocks` (each a list of events),
/// `message_delta` with `stop_reason` and `usage`, `message_stop`.
fn message(blocks: Vec<String>, stop_reason: &str, usage: Value) -> Vec<String> {
    let start = json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
        "content": [], "model": "claude-test", "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": 10, "output_tokens": 1}}});
    let mut frames = vec![event("message_start", &start), event("ping", &json!({"type": "ping"}))];
    frames.extend(blocks);
    let delta = json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null},
        "usage": usage});
    frames.push(event("message_delta", &delta));
    frames.push(event("message_stop", &json!({"type": "message_stop"})));
    frames
}

/// A text block at `index`, its text in `parts`.
fn text_block(index: u64, parts: &[&str]) -> Vec<String> {
    let mut frames = vec![event(
        "content_block_start",
        &json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
    )];
    for part in parts {
        let delta = json!({"type": "content_block_delta", "index": index,
            "delta": {"type": "text_delta", "text": part}});
        frames.push(event("content_block_delta", &delta));
    }
    frames.push(event("content_block_stop", &json!({"type": "content_block_stop", "index": index})));
    frames
}

/// A tool_use block at `index`, its input JSON in `parts`.
fn tool_block(index: u64, id: &str, name: &str, parts: &[&str]) -> Vec<String> {
    let start = json!({"type": "content_block_start", "index": index,
        "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}});
    let mut frames = vec![event("content_block_start", &start)];
    for part in parts {
        let delta = json!({"type": "content_block_delta", "index": index,
            "delta": {"type": "input_json_delta", "partial_json": part}});
        frames.push(event("content_block_delta", &delta));
    }
    frames.push(event("content_block_stop", &json!({"type": "content_block_stop", "index": index})));
    frames
}

fn stream(frames: Vec<String>) -> Reply {
    Reply::Stream { frames, hang: false }
}

/// A whole (non-streamed) message.
fn whole(content: Value, stop_reason: &str) -> Reply {
    ok(json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-test",
        "content": content, "stop_reason": stop_reason, "stop_sequence": null,
        "usage": {"input_tokens": 5, "output_tokens": 3}}))
}

#[tokio::test]
async fn a_streamed_answer_reaches_listeners_and_the_request_carries_key_version_system_and_max_tokens() {
    let usage = json!({"output_tokens": 2});
    let server = Loopback::start(vec![
        stream(message(text_block(0, &["Hel", "lo"]), "end_turn", usage.clone())),
        stream(message(text_block(0, &["again"]), "end_turn", usage)),
    ])
    .await;
    let model = AnthropicModel::new(config(&server)).unwrap();
    assert_eq!(model.name(), "anthropic:claude-test");
    a_greeting_streams_to_the_listener(Agent::builder(model).persona("You greet.")).await;

    {
        let requests = server.requests.lock().unwrap();
        let first = &requests[0];
        assert_eq!(first.path, "/v1/messages");
        assert_eq!(first.header("x-api-key"), Some("sk-ant-test"));
        assert_eq!(first.header("anthropic-version"), Some("2023-06-01"));
        assert_eq!(first.header("authorization"), None, "the key goes in x-api-key only");
        let body = &first.body;
        assert_eq!(
            (&body["model"], &body["max_tokens"], &body["stream"]),
            (&json!("claude-test"), &json!(4096), &json!(true))
        );
        assert!(body["system"].as_str().unwrap().starts_with("You greet."), "the system prompt is top-level");
        assert_eq!(body["messages"], json!([{"role": "user", "content": [{"type": "text", "text": "greet"}]}]));
        assert!(body.get("tools").is_none());
    }

    // A route's model and token limit override the configured ones.
    let route = AgentOptions { model: Some("claude-routed".into()), max_tokens: Some(64), ..Default::default() };
    let routed = Agent::builder(AnthropicModel::new(config(&server)).unwrap()).options(route).build().unwrap();
    assert_eq!(routed.prompt("again").await.output, "again");
    let body = &server.bodies()[1];
    assert_eq!((&body["model"], &body["max_tokens"]), (&json!("claude-routed"), &json!(64)));
}

#[tokio::test]
async fn a_tool_use_round_trips_through_the_agent_as_a_tool_result_in_the_next_request() {
    let usage = json!({"output_tokens": 9});
    let mut first = text_block(0, &["Adding."]);
    first.extend(tool_block(1, "toolu_a", "add", &["{\"a\": 2", ", \"b\": 40}"]));
    let server = Loopback::start(vec![
        stream(message(first, "tool_use", usage.clone())),
        stream(message(text_block(0, &["42"]), "end_turn", usage)),
    ])
    .await;
    adding_through_the_tool_completes_with_42(AnthropicModel::new(config(&server)).unwrap()).await;

    let bodies = server.bodies();
    let tool = &bodies[0]["tools"][0];
    assert_eq!((&tool["name"], &tool["description"]), (&json!("add"), &json!("Adds.")));
    assert_eq!(tool["input_schema"]["required"], json!(["a", "b"]));
    let messages = bodies[1]["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3, "{messages:?}");
    assert_eq!(
        messages[1],
        json!({"role": "assistant", "content": [
            {"type": "text", "text": "Adding."},
            {"type": "tool_use", "id": "toolu_a", "name": "add", "input": {"a": 2, "b": 40}}]})
    );
    assert_eq!(
        messages[2],
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_a", "content": "42", "is_error": false}]})
    );
}

#[tokio::test]
async fn every_stop_reason_maps_to_its_finish() {
    let text = json!([{"type": "text", "text": "so far"}]);
    let call = json!([{"type": "tool_use", "id": "toolu_1", "name": "list_dir", "input": {"path": "."}}]);
    let cases = [
        ("end_turn", &text, Finish::Stop),
        ("stop_sequence", &text, Finish::Stop),
        ("max_tokens", &text, Finish::MaxTokens),
        ("tool_use", &call, Finish::ToolCalls),
        ("end_turn", &call, Finish::ToolCalls),
        // A paused turn is not resumed: it ends as cut short.
        ("pause_turn", &text, Finish::MaxTokens),
        ("refusal", &text, Finish::Refusal),
    ];
    let server =
        Loopback::start(cases.iter().map(|(reason, content, _)| whole((*content).clone(), reason)).collect()).await;
    let model = AnthropicModel::new(config(&server).with_stream(false)).unwrap();
    for (reason, _, finish) in cases {
        let reply = ask(&model, "go").await.unwrap();
        assert_eq!(reply.finish, finish, "{reason}");
        if finish == Finish::ToolCalls {
            assert_eq!(reply.tool_calls[0].arguments, json!({"path": "."}));
        } else {
            assert_eq!(reply.text, "so far", "{reason}");
        }
    }
    assert!(server.bodies().iter().all(|body| body.get("stream").is_none()));

    // Streamed, the stop reason comes in message_delta.
    let server =
        Loopback::start(vec![stream(message(text_block(0, &["cut"]), "max_tokens", json!({"output_tokens": 1})))])
            .await;
    let outcome = agent_on(config(&server)).prompt("go").await;
    assert_eq!((outcome.stop_reason, outcome.output.as_str()), (StopReason::MaxTokens, "cut"));
}

#[tokio::test]
async fn usage_keeps_cache_reads_and_writes_apart_from_the_input_tokens() {
    let start = json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
        "content": [], "model": "claude-test", "usage": {"input_tokens": 10, "output_tokens": 1,
        "cache_creation_input_tokens": 20, "cache_read_input_tokens": 30}}});
    let mut frames = vec![event("message_start", &start)];
    frames.extend(text_block(0, &["cached"]));
    let delta = json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 15}});
    frames.push(event("message_delta", &delta));
    frames.push(event("message_stop", &json!({"type": "message_stop"})));
    let server = Loopback::start(vec![
        stream(frames),
        ok(json!({"type": "message", "role": "assistant", "content": [{"type": "text", "text": "whole"}],
            "stop_reason": "end_turn", "usage": {"input_tokens": 4, "output_tokens": 2,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 6}})),
    ])
    .await;
    let reply = ask(&AnthropicModel::new(config(&server)).unwrap(), "hi").await.unwrap();
    assert_eq!(reply.text, "cached");
    let expected = Usage { input_tokens: 10, output_tokens: 15, cache_read_tokens: 30, cache_write_tokens: 20 };
    assert_eq!(reply.usage, Some(expected), "the cumulative output count, the cached input beside the rest");
    assert_eq!(expected.total(), 75, "the four kinds do not overlap");
    let reply = ask(&AnthropicModel::new(config(&server).with_stream(false)).unwrap(), "hi").await.unwrap();
    let expected = Usage { input_tokens: 4, output_tokens: 2, cache_read_tokens: 6, cache_write_tokens: 0 };
    assert_eq!(reply.usage, Some(expected));
}

#[tokio::test]
async fn a_mid_stream_error_event_ends_the_run_error_keeping_the_streamed_text_and_is_not_retried() {
    let mut frames = message(Vec::new(), "end_turn", json!({}));
    frames.truncate(2); // message_start, ping
    frames.extend(text_block(0, &["partial"]).into_iter().take(2));
    let error = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
    frames.push(event("error", &error));
    let server = Loopback::start(vec![stream(frames), whole(json!([]), "end_turn")]).await;
    let agent = Agent::builder(AnthropicModel::new(config(&server)).unwrap())
        .on_update(Arc::new(|_: &AgentUpdate| {}))
        .build()
        .unwrap();
    let outcome = within_20_s(agent.prompt("hi")).await;
    assert_eq!((outcome.stop_reason, outcome.output.as_str()), (StopReason::Error, "partial"));
    let error = outcome.error.unwrap();
    assert!(error.message.contains("overloaded_error: Overloaded"), "{}", error.message);
    assert_eq!(error.reason, "the model endpoint's answer broke off before it finished");
    assert_eq!(server.bodies().len(), 1);
}

#[tokio::test]
async fn a_429_and_a_529_are_retried_after_their_retry_after() {
    let overloaded = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
    let limited = json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}});
    let server = Loopback::start(vec![
        status(429, vec![("retry-after", "1".into())], limited),
        status(529, vec![("retry-after", "0".into())], overloaded.clone()),
        whole(json!([{"type": "text", "text": "finally"}]), "end_turn"),
    ])
    .await;
    let started = Instant::now();
    let outcome = within_20_s(agent_on(config(&server)).prompt("hi")).await;
    assert_eq!((outcome.stop_reason, outcome.output.as_str()), (StopReason::Completed, "finally"));
    assert_eq!(server.bodies().len(), 3);
    assert!(started.elapsed() >= Duration::from_millis(950), "the retry-after was waited: {:?}", started.elapsed());

    let busy = || status(529, Vec::new(), overloaded.clone());
    let server = Loopback::start(vec![busy(), busy(), busy()]).await;
    let outcome = within_20_s(agent_on(config(&server)).prompt("hi")).await;
    assert_eq!(outcome.error.unwrap().message, "the model endpoint answered 529: Overloaded");
    assert_eq!(server.bodies().len(), 3, "one try and two retries");
}

#[tokio::test]
async fn a_400_fails_at_once_with_one_line_of_the_endpoints_message() {
    let invalid = json!({"type": "error", "error": {"type": "invalid_request_error",
        "message": "messages.0.content:\n  text content blocks must be non-empty"}});
    let server = Loopback::start(vec![status(400, Vec::new(), invalid), whole(json!([]), "end_turn")]).await;
    let outcome = within_20_s(agent_on(config(&server)).prompt("hi")).await;
    assert_failed_with(&outcome, "the model endpoint answered 400");
    assert_eq!(
        outcome.error.unwrap().message,
        "the model endpoint answered 400: messages.0.content: text content blocks must be non-empty"
    );
    assert_eq!(server.bodies().len(), 1, "a client error is not retried");
}

#[tokio::test]
async fn a_stream_past_the_answer_bound_fails_and_closes_the_connection() {
    let delta =
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "y".repeat(8192)}});
    // The block the deltas add to comes first.
    let endless = endless_after(&text_block(0, &[])[0], event("content_block_delta", &delta));
    an_endless_answer_fails_past_its_bound(endless, |server| {
        agent_on(config(server).with_max_answer_bytes(256 * 1024))
    })
    .await;

    let big = whole(json!([{"type": "text", "text": "x".repeat(300 * 1024)}]), "end_turn");
    let server = Loopback::start(vec![big]).await;
    let config = config(&server).with_stream(false).with_max_answer_bytes(64 * 1024);
    let outcome = within_20_s(agent_on(config).prompt("hi")).await;
    assert_failed_with(&outcome, "the model's answer is larger than 64 KiB");
}

#[tokio::test]
async fn more_tool_calls_than_the_cap_or_arguments_past_their_bound_fail_without_running_any() {
    let calls: Vec<String> = (0..5).flat_map(|i| tool_block(i, &format!("toolu_{i}"), "list_dir", &["{}"])).collect();
    let arguments = format!("{{\"path\": \"{}\"}}", "a".repeat(4096));
    let pieces: Vec<&str> = arguments.as_bytes().chunks(512).map(|c| std::str::from_utf8(c).unwrap()).collect();
    let cases = [
        (message(calls, "tool_use", json!({})), "the model's answer asks for more than 3 tool calls"),
        (
            message(tool_block(0, "toolu_0", "list_dir", &pieces), "tool_use", json!({})),
            "a tool call's arguments are larger than 1 KiB",
        ),
    ];
    let cases = cases.map(|(frames, reason)| (vec![stream(frames), whole(json!([]), "end_turn")], reason));
    each_fails_without_running_a_call(cases, "list", |server| agent_on(config(server).with_tool_call_limits(3, 1024)))
        .await;
}

#[tokio::test]
async fn cancelling_mid_stream_closes_the_connection_and_aborts_the_turn() {
    let mut frames = message(Vec::new(), "end_turn", json!({}));
    frames.truncate(1);
    frames.extend(text_block(0, &["thinking"]).into_iter().take(2));
    let server = Loopback::start(vec![Reply::Stream { frames, hang: true }]).await;
    cancelling_mid_stream_aborts_and_closes_the_connection(&server, AnthropicModel::new(config(&server)).unwrap())
        .await;
}

#[tokio::test]
async fn malformed_events_and_a_stream_without_its_stop_end_the_run_error() {
    let delta = |index: u64| {
        event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": "x"}}),
        )
    };
    let cases = [
        (vec!["event: message_start\ndata: {not json\n\n".to_owned()], "malformed model response"),
        (vec![event("message_start", &json!({"message": {}}))], "malformed model response"),
        (vec![delta(7)], "malformed model response"),
        (text_block(0, &["half"]), "ended before the answer finished"),
    ];
    each_stream_ends_the_run_error(cases, |server| agent_on(config(server).with_retries(0, Duration::ZERO))).await;
    let server = Loopback::start(vec![ok(json!({"type": "message", "content": "text"}))]).await;
    let outcome = within_20_s(agent_on(config(&server).with_stream(false)).prompt("hi")).await;
    assert!(outcome.error.unwrap().message.starts_with("malformed model response"));
}

#[tokio::test]
async fn pings_forever_end_at_the_call_deadline() {
    let pings = endless_stream(event("ping", &json!({"type": "ping"})), Duration::from_millis(10));
    an_endless_stream_ends_at_the_call_deadline(pings, |server| {
        agent_on(config(server).with_call_deadline(Duration::from_millis(500)))
    })
    .await;
}

#[tokio::test]
async fn a_reasoning_effort_is_refused_rather_than_dropped() {
    let server = Loopback::start(vec![whole(json!([{"type": "text", "text": "never"}]), "end_turn")]).await;
    let route = AgentOptions { reasoning_effort: Some("high".into()), ..Default::default() };
    let agent = Agent::builder(AnthropicModel::new(config(&server)).unwrap()).options(route).build().unwrap();
    let outcome = agent.prompt("hi").await;
    assert_failed_with(&outcome, "the model is misconfigured");
    assert!(outcome.error.unwrap().message.contains("reasoning_effort"));
    assert!(server.bodies().is_empty(), "nothing was sent");
}

#[test]
fn the_spec_and_the_environment_configure_it() {
    let mut environment = common::env::lock();
    assert_eq!(ModelSpec::parse("anthropic:claude-x").unwrap(), ModelSpec::Anthropic(Some("claude-x".into())));
    let refused = ModelSpec::parse("anthropic:").unwrap_err().to_string();
    for form in ["scripted", "openai:NAME", "openai-responses:NAME", "anthropic:NAME"] {
        assert!(refused.contains(form), "{refused}");
    }
    environment.set("ANTHROPIC_BASE_URL", "http://127.0.0.1:9");
    environment.set("ANTHROPIC_API_KEY", "sk-ant-env");
    environment.set("ANTHROPIC_MAX_TOKENS", "2048");
    environment.set("SUBAGENTS_MODEL_MAX_TOOL_CALLS", "16");
    let config = AnthropicConfig::from_env_for(Some("claude-x")).unwrap();
    assert_eq!((config.base_url.as_str(), config.model.as_str()), ("http://127.0.0.1:9", "claude-x"));
    assert_eq!((config.api_key.as_deref(), config.max_tokens, config.max_tool_calls), (Some("sk-ant-env"), 2048, 16));
    assert!(!format!("{config:?}").contains("sk-ant-env"), "the key is redacted from Debug");
    let model = ModelSpec::parse("anthropic:claude-x").unwrap().build().unwrap();
    assert_eq!(model.name(), "anthropic:claude-x");
    environment.set("ANTHROPIC_MAX_TOKENS", "many");
    let refused = AnthropicConfig::from_env_for(Some("claude-x")).unwrap_err().to_string();
    assert!(refused.contains("ANTHROPIC_MAX_TOKENS must be a whole number"), "{refused}");
    for name in ["ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_MAX_TOKENS", "SUBAGENTS_MODEL_MAX_TOOL_CALLS"] {
        environment.remove(name);
    }
    environment.remove("ANTHROPIC_MODEL");
    assert!(matches!(AnthropicConfig::from_env(), Err(ModelError::Config(_))), "a model must be named");
    assert_eq!(AnthropicConfig::from_env_for(Some("m")).unwrap().base_url, "https://api.anthropic.com");
}
