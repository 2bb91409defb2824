//! The OpenAI Responses adapter against a loopback server speaking the
//! API's documented wire (no network): requests, streamed and whole
//! answers, function call round trips, endings, usage, retries, errors and
//! every bound.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::adapters::{
    a_greeting_streams_to_the_listener, adding_through_the_tool_completes_with_42,
    an_endless_answer_fails_past_its_bound, an_endless_stream_ends_at_the_call_deadline, ask, assert_failed_with,
    cancelling_mid_stream_aborts_and_closes_the_connection, each_fails_without_running_a_call,
    each_stream_ends_the_run_error, endless_after, keep_alive_forever, openai_config,
};
use common::loopback::{event, ok, status, within_20_s, Loopback, Reply};
use serde_json::{json, Value};
use subagents::agent::{Agent, AgentUpdate, Finish, Model, ModelSpec, OpenAiConfig, OpenAiResponsesModel, Usage};
use subagents::seam::AgentOptions;
use subagents::StopReason;

fn config(server: &Loopback) -> OpenAiConfig {
    openai_config(server, "gpt-test")
}

fn agent_on(config: OpenAiConfig) -> Agent {
    Agent::builder(OpenAiResponsesModel::new(config).unwrap()).build().unwrap()
}

fn usage() -> Value {
    json!({"input_tokens": 12, "input_tokens_details": {"cached_tokens": 8}, "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 17})
}

/// A response object with `status` and `output`.
fn response(status: &str, output: Value) -> Value {
    json!({"id": "resp_1", "object": "response", "status": status, "model": "gpt-test", "output": output,
        "usage": usage()})
}

/// `event`'s frame with its type in the data, as the API sends it.
fn frame(kind: &str, mut data: Value) -> String {
    data["type"] = json!(kind);
    event(kind, &data)
}

/// A streamed response: created, `items` (each a list of frames), then
/// the final event (`response.completed`, …) with `ending`.
fn streamed(items: Vec<String>, last: &str, ending: Value) -> Vec<String> {
    let mut frames = vec![frame("response.created", json!({"response": response("in_progress", json!([]))}))];
    frames.push(frame("response.in_progress", json!({"response": response("in_progress", json!([]))})));
    frames.extend(items);
    frames.push(frame(last, json!({"response": ending})));
    frames
}

/// A message item at `index`, its text in `parts`.
fn message_item(index: u64, parts: &[&str]) -> Vec<String> {
    let id = format!("msg_{index}");
    let item = json!({"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []});
    let mut frames = vec![frame("response.output_item.added", json!({"output_index": index, "item": item}))];
    let part = json!({"item_id": id, "output_index": index, "content_index": 0,
        "part": {"type": "output_text", "text": "", "annotations": []}});
    frames.push(frame("response.content_part.added", part));
    for delta in parts {
        let data = json!({"item_id": id, "output_index": index, "content_index": 0, "delta": delta});
        frames.push(frame("response.output_text.delta", data));
    }
    let text: String = parts.concat();
    frames.push(frame(
        "response.output_text.done",
        json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
    ));
    let done = json!({"type": "message", "id": id, "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}]});
    frames.push(frame("response.output_item.done", json!({"output_index": index, "item": done})));
    frames
}

/// A function call item at `index`, its arguments in `parts`.
fn call_item(index: u64, call_id: &str, name: &str, parts: &[&str]) -> Vec<String> {
    let id = format!("fc_{index}");
    let item = json!({"type": "function_call", "id": id, "call_id": call_id, "name": name, "arguments": "",
        "status": "in_progress"});
    let mut frames = vec![frame("response.output_item.added", json!({"output_index": index, "item": item}))];
    for delta in parts {
        let data = json!({"item_id": id, "output_index": index, "delta": delta});
        frames.push(frame("response.function_call_arguments.delta", data));
    }
    let arguments: String = parts.concat();
    let done = json!({"item_id": id, "output_index": index, "arguments": arguments});
    frames.push(frame("response.function_call_arguments.done", done));
    let whole = json!({"type": "function_call", "id": id, "call_id": call_id, "name": name,
        "arguments": arguments, "status": "completed"});
    frames.push(frame("response.output_item.done", json!({"output_index": index, "item": whole})));
    frames
}

fn completed(items: Vec<String>) -> Reply {
    Reply::Stream { frames: streamed(items, "response.completed", response("completed", json!([]))), hang: false }
}

fn text_output(text: &str) -> Value {
    json!([{"type": "message", "id": "msg_0", "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}]}])
}

#[tokio::test]
async fn a_streamed_answer_reaches_listeners_and_the_request_carries_instructions_input_and_route() {
    let server = Loopback::start(vec![completed(message_item(0, &["Hel", "lo"]))]).await;
    let model = OpenAiResponsesModel::new(config(&server)).unwrap();
    assert_eq!(model.name(), "openai-responses:gpt-test");
    let route = AgentOptions {
        model: Some("gpt-routed".into()),
        max_tokens: Some(64),
        reasoning_effort: Some("low".into()),
        ..Default::default()
    };
    a_greeting_streams_to_the_listener(Agent::builder(model).persona("You greet.").options(route)).await;

    let requests = server.requests.lock().unwrap();
    assert_eq!(requests[0].path, "/v1/responses");
    assert_eq!(requests[0].header("authorization"), Some("Bearer sk-test"));
    let body = &requests[0].body;
    assert_eq!((&body["model"], &body["max_output_tokens"]), (&json!("gpt-routed"), &json!(64)));
    assert_eq!(body["reasoning"], json!({"effort": "low"}));
    assert_eq!((&body["stream"], &body["store"]), (&json!(true), &json!(false)));
    assert!(body["instructions"].as_str().unwrap().starts_with("You greet."));
    assert_eq!(body["input"], json!([{"type": "message", "role": "user", "content": "greet"}]));
}

#[tokio::test]
async fn a_function_call_round_trips_through_the_agent_as_its_output_in_the_next_request() {
    let server = Loopback::start(vec![
        completed(call_item(0, "call_a", "add", &["{\"a\": 2", ", \"b\": 40}"])),
        completed(message_item(0, &["42"])),
    ])
    .await;
    adding_through_the_tool_completes_with_42(OpenAiResponsesModel::new(config(&server)).unwrap()).await;

    let bodies = server.bodies();
    let tool = &bodies[0]["tools"][0];
    assert_eq!(
        (&tool["type"], &tool["name"], &tool["description"]),
        (&json!("function"), &json!("add"), &json!("Adds."))
    );
    assert_eq!(tool["parameters"]["required"], json!(["a", "b"]));
    let input = bodies[1]["input"].as_array().unwrap();
    assert_eq!(input.len(), 3, "{input:?}");
    assert_eq!(
        (&input[1]["type"], &input[1]["call_id"], &input[1]["name"]),
        (&json!("function_call"), &json!("call_a"), &json!("add"))
    );
    let arguments: Value = serde_json::from_str(input[1]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"a": 2, "b": 40}));
    assert_eq!(input[2], json!({"type": "function_call_output", "call_id": "call_a", "output": "42"}));
}

#[tokio::test]
async fn every_ending_maps_to_its_finish_and_usage_keeps_cached_tokens_apart() {
    let incomplete = |reason: &str| {
        let mut body = response("incomplete", text_output("so far"));
        body["incomplete_details"] = json!({"reason": reason});
        ok(body)
    };
    let refusal = json!([{"type": "message", "id": "msg_0", "status": "completed", "role": "assistant",
        "content": [{"type": "refusal", "refusal": "I cannot help"}]}]);
    let call = json!([{"type": "function_call", "id": "fc_0", "call_id": "call_1", "name": "list_dir",
        "arguments": "{\"path\": \".\"}", "status": "completed"}]);
    let server = Loopback::start(vec![
        ok(response("completed", text_output("so far"))),
        incomplete("max_output_tokens"),
        incomplete("content_filter"),
        ok(response("completed", refusal)),
        ok(response("completed", call)),
    ])
    .await;
    let model = OpenAiResponsesModel::new(config(&server).with_stream(false)).unwrap();
    let reply = ask(&model, "a").await.unwrap();
    assert_eq!((reply.finish, reply.text.as_str()), (Finish::Stop, "so far"));
    // The API's 12 input tokens include the 8 cached ones.
    let expected = Usage { input_tokens: 4, output_tokens: 5, cache_read_tokens: 8, cache_write_tokens: 0 };
    assert_eq!(reply.usage, Some(expected), "cached tokens are taken out of the input");
    assert_eq!(ask(&model, "b").await.unwrap().finish, Finish::MaxTokens);
    assert_eq!(ask(&model, "c").await.unwrap().finish, Finish::Refusal);
    let reply = ask(&model, "d").await.unwrap();
    assert_eq!((reply.finish, reply.text.as_str()), (Finish::Refusal, "I cannot help"));
    let reply = ask(&model, "e").await.unwrap();
    assert_eq!(reply.finish, Finish::ToolCalls);
    assert_eq!((reply.tool_calls[0].id.as_str(), &reply.tool_calls[0].arguments), ("call_1", &json!({"path": "."})));

    // Streamed, the ending and the usage come with the final event.
    let mut ending = response("incomplete", json!([]));
    ending["incomplete_details"] = json!({"reason": "max_output_tokens"});
    let frames = streamed(message_item(0, &["cut"]), "response.incomplete", ending);
    let server = Loopback::start(vec![Reply::Stream { frames, hang: false }]).await;
    let reply = ask(&OpenAiResponsesModel::new(config(&server)).unwrap(), "f").await.unwrap();
    assert_eq!((reply.finish, reply.text.as_str(), reply.usage), (Finish::MaxTokens, "cut", Some(expected)));
}

#[tokio::test]
async fn a_failed_response_and_an_error_event_end_the_run_error_keeping_the_streamed_text() {
    let mut failed = response("failed", json!([]));
    failed["error"] = json!({"code": "server_error", "message": "The model failed."});
    let error = frame("error", json!({"code": "rate_limit_exceeded", "message": "Too many.", "param": null}));
    let cases = [
        (
            streamed(message_item(0, &["partial"])[..3].to_vec(), "response.failed", failed),
            "server_error: The model failed.",
        ),
        ([&message_item(0, &["partial"])[..3], &[error]].concat(), "rate_limit_exceeded: Too many."),
    ];
    for (frames, expected) in cases {
        let server = Loopback::start(vec![Reply::Stream { frames, hang: false }, ok(json!({}))]).await;
        let agent = Agent::builder(OpenAiResponsesModel::new(config(&server)).unwrap())
            .on_update(Arc::new(|_: &AgentUpdate| {}))
            .build()
            .unwrap();
        let outcome = within_20_s(agent.prompt("hi")).await;
        assert_eq!((outcome.stop_reason, outcome.output.as_str()), (StopReason::Error, "partial"));
        let message = outcome.error.unwrap().message;
        assert!(message.contains(expected), "{message}");
        assert_eq!(server.bodies().len(), 1, "not retried");
    }
}

#[tokio::test]
async fn a_429_is_retried_after_its_retry_after_and_a_400_fails_at_once_with_its_message() {
    let limited =
        json!({"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}});
    let server = Loopback::start(vec![
        status(429, vec![("retry-after-ms", "300".into())], limited),
        ok(response("completed", text_output("finally"))),
    ])
    .await;
    let started = Instant::now();
    let outcome = within_20_s(agent_on(config(&server)).prompt("hi")).await;
    assert_eq!((outcome.stop_reason, outcome.output.as_str()), (StopReason::Completed, "finally"));
    assert_eq!(server.bodies().len(), 2);
    assert!(started.elapsed() >= Duration::from_millis(290), "the retry-after-ms was waited: {:?}", started.elapsed());

    let invalid = json!({"error": {"message": "Unknown parameter: 'input[0].foo'.", "type": "invalid_request_error",
        "param": "input[0].foo", "code": "unknown_parameter"}});
    let server = Loopback::start(vec![status(400, Vec::new(), invalid), ok(json!({}))]).await;
    let outcome = within_20_s(agent_on(config(&server)).prompt("hi")).await;
    assert_failed_with(&outcome, "the model endpoint answered 400");
    assert_eq!(outcome.error.unwrap().message, "the model endpoint answered 400: Unknown parameter: 'input[0].foo'.");
    assert_eq!(server.bodies().len(), 1);
}

#[tokio::test]
async fn answers_past_their_bounds_fail_without_running_any_call() {
    // An endless stream of text deltas, after the item they add to.
    let delta =
        frame("response.output_text.delta", json!({"output_index": 0, "content_index": 0, "delta": "y".repeat(8192)}));
    let endless = endless_after(&message_item(0, &[])[0], delta);
    an_endless_answer_fails_past_its_bound(endless, |server| {
        agent_on(config(server).with_max_answer_bytes(256 * 1024))
    })
    .await;

    let calls: Vec<String> = (0..5).flat_map(|i| call_item(i, &format!("call_{i}"), "list_dir", &["{}"])).collect();
    let arguments = format!("{{\"path\": \"{}\"}}", "a".repeat(4096));
    let pieces: Vec<&str> = arguments.as_bytes().chunks(512).map(|c| std::str::from_utf8(c).unwrap()).collect();
    let cases = [
        (calls, "the model's answer asks for more than 3 tool calls"),
        (call_item(0, "call_0", "list_dir", &pieces), "a tool call's arguments are larger than 1 KiB"),
    ];
    let done = || ok(response("completed", text_output("done")));
    let cases = cases.map(|(items, reason)| (vec![completed(items), done()], reason));
    each_fails_without_running_a_call(cases, "list", |server| agent_on(config(server).with_tool_call_limits(3, 1024)))
        .await;
}

#[tokio::test]
async fn cancelling_mid_stream_closes_the_connection_and_aborts_the_turn() {
    let mut frames = streamed(Vec::new(), "response.completed", json!({}));
    frames.truncate(1);
    frames.extend(message_item(0, &["thinking"])[..3].to_vec());
    let server = Loopback::start(vec![Reply::Stream { frames, hang: true }]).await;
    let model = OpenAiResponsesModel::new(config(&server)).unwrap();
    cancelling_mid_stream_aborts_and_closes_the_connection(&server, model).await;
}

#[tokio::test]
async fn malformed_events_and_a_stream_without_its_ending_end_the_run_error() {
    let orphan = frame("response.function_call_arguments.delta", json!({"output_index": 3, "delta": "{}"}));
    let cases = [
        (vec!["event: response.created\ndata: {not json\n\n".to_owned()], "malformed model response"),
        (vec![event("response.created", &json!({"response": {}}))], "malformed model response"),
        (vec![orphan], "malformed model response"),
        (message_item(0, &["half"]), "ended before the answer finished"),
    ];
    each_stream_ends_the_run_error(cases, |server| agent_on(config(server).with_retries(0, Duration::ZERO))).await;
    let server = Loopback::start(vec![ok(json!({"object": "response", "status": "completed"}))]).await;
    let outcome = within_20_s(agent_on(config(&server).with_stream(false)).prompt("hi")).await;
    assert!(outcome.error.unwrap().message.starts_with("malformed model response"));
}

#[tokio::test]
async fn keep_alive_comments_forever_end_at_the_call_deadline() {
    let deadline = |server: &Loopback| agent_on(config(server).with_call_deadline(Duration::from_millis(500)));
    an_endless_stream_ends_at_the_call_deadline(keep_alive_forever(), deadline).await;
}

#[test]
fn the_spec_takes_the_openai_environment() {
    let mut environment = common::env::lock();
    let spec = ModelSpec::parse("openai-responses:gpt-x").unwrap();
    assert_eq!(spec, ModelSpec::OpenAiResponses(Some("gpt-x".into())));
    assert_eq!((spec.route_provider(), spec.model_name()), (Some("openai-responses"), Some("gpt-x")));
    assert!(ModelSpec::parse("openai-responses:").is_err());
    environment.set("SUBAGENTS_BASE_URL", "http://127.0.0.1:9/v1");
    let model = spec.build().unwrap();
    assert_eq!(model.name(), "openai-responses:gpt-x");
    environment.remove("SUBAGENTS_BASE_URL");
}
