//! The scenarios every HTTP model adapter's tests run alike (OpenAI chat
//! completions, the Responses API, Anthropic Messages), written once:
//! each test file builds its adapter and its wire's frames, and hands them
//! here with the assertions it pins.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use subagents::agent::{
    Agent, AgentBuilder, AgentUpdate, FnTool, Model, ModelError, ModelReply, ModelRequest, OpenAiConfig, SessionEvent,
    Tool, ToolOutput, TurnOutcome,
};
use subagents::seam::AgentOptions;
use subagents::{CancellationToken, ContentBlock, StopReason};

use super::loopback::{within_20_s, Loopback, Reply};

/// The run ended `error` with `reason` as its safe diagnostic reason.
pub fn assert_failed_with(outcome: &TurnOutcome, reason: &str) {
    assert_eq!(outcome.stop_reason, StopReason::Error, "output of {} bytes", outcome.output.len());
    let error = outcome.error.as_ref().unwrap();
    assert_eq!(error.reason, reason, "{error:?}");
}

/// The agent `builder` makes streams "Hello" for "greet" in the chunks
/// "Hel" and "lo", each reaching the listener as it arrives.
pub async fn a_greeting_streams_to_the_listener(builder: AgentBuilder) {
    let chunks = Arc::new(Mutex::new(Vec::new()));
    let sink = chunks.clone();
    let agent = builder
        .on_update(Arc::new(move |update: &AgentUpdate| {
            if let AgentUpdate::Text(text) = update {
                sink.lock().unwrap().push(text.clone());
            }
        }))
        .build()
        .unwrap();
    let outcome = agent.prompt("greet").await;
    assert_eq!((outcome.stop_reason, outcome.output.as_str()), (StopReason::Completed, "Hello"));
    assert_eq!(*chunks.lock().unwrap(), ["Hel", "lo"]);
}

/// An OpenAI configuration of `model` on `server`'s `/v1`, with a key and
/// short bounds for tests.
pub fn openai_config(server: &Loopback, model: &str) -> OpenAiConfig {
    OpenAiConfig::new(format!("{}/v1", server.origin), model)
        .with_api_key("sk-test")
        .with_retries(2, Duration::from_millis(10))
        .with_timeout(Duration::from_secs(10))
}

/// The tool `add(a, b)`.
pub fn add_tool() -> impl Tool {
    FnTool::new(
        "add",
        "Adds.",
        json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}),
        |args| ToolOutput::ok((args["a"].as_i64().unwrap() + args["b"].as_i64().unwrap()).to_string()),
    )
}

/// `model` with [`add_tool`] answers "add 2 and 40" with "42" (its
/// endpoint asks for the call, then answers with the sum).
pub async fn adding_through_the_tool_completes_with_42(model: impl Model) {
    let agent = Agent::builder(model).tool(add_tool()).build().unwrap();
    let outcome = agent.prompt("add 2 and 40").await;
    assert_eq!((outcome.stop_reason, outcome.output.as_str()), (StopReason::Completed, "42"));
}

/// One model call of `prompt`, straight to the adapter.
pub async fn ask(model: &impl Model, prompt: &str) -> Result<ModelReply, ModelError> {
    let request = ModelRequest {
        session_id: "s".to_owned(),
        system: Arc::from("You help."),
        messages: Arc::from(vec![SessionEvent::User { content: vec![ContentBlock::text(prompt)] }]),
        tools: Arc::from(Vec::new()),
        options: AgentOptions::default(),
        chunks: None,
        meter: Default::default(),
    };
    within_20_s(model.complete(request, CancellationToken::new())).await
}

/// `model`, on `server` that streams some text and then hangs, is
/// cancelled at its first chunk: the turn ends aborted and the server
/// sees the connection close.
pub async fn cancelling_mid_stream_aborts_and_closes_the_connection(server: &Loopback, model: impl Model) {
    let (tx, mut first_chunk) = tokio::sync::mpsc::unbounded_channel();
    let agent = Agent::builder(model)
        .on_update(Arc::new(move |update: &AgentUpdate| {
            if matches!(update, AgentUpdate::Text(_)) {
                let _ = tx.send(());
            }
        }))
        .build()
        .unwrap();
    let canceller = agent.clone();
    tokio::spawn(async move {
        first_chunk.recv().await;
        canceller.cancel();
    });
    let outcome = within_20_s(agent.prompt("think")).await;
    assert_eq!(outcome.stop_reason, StopReason::Aborted);
    assert!(server.saw_client_close().await, "the server saw the connection close");
}

/// Each case's replies answer an agent `agent_on` builds for their server:
/// the first answer fails the run with the case's reason, before any tool
/// call it asks for runs and before anything more is asked.
pub async fn each_fails_without_running_a_call<'a>(
    cases: impl IntoIterator<Item = (Vec<Reply>, &'a str)>,
    prompt: &str,
    agent_on: impl Fn(&Loopback) -> Agent,
) {
    for (replies, reason) in cases {
        let server = Loopback::start(replies).await;
        let agent = agent_on(&server);
        let outcome = within_20_s(agent.prompt(prompt)).await;
        assert_failed_with(&outcome, reason);
        assert_eq!(server.bodies().len(), 1, "{reason}");
        assert!(!agent.events().iter().any(|e| matches!(e, SessionEvent::ToolResult { .. })), "no call ran");
    }
}

/// Each case's stream, answering an agent `agent_on` builds for its
/// server, ends the run `error` with a message that holds the case's text.
pub async fn each_stream_ends_the_run_error<'a>(
    cases: impl IntoIterator<Item = (Vec<String>, &'a str)>,
    agent_on: impl Fn(&Loopback) -> Agent,
) {
    for (frames, expected) in cases {
        let server = Loopback::start(vec![Reply::Stream { frames, hang: false }]).await;
        let outcome = within_20_s(agent_on(&server).prompt("hi")).await;
        assert_eq!(outcome.stop_reason, StopReason::Error);
        let message = outcome.error.unwrap().message;
        assert!(message.contains(expected), "{expected}: {message}");
    }
}

/// `reply` (a stream that never ends) answers an agent `agent_on` builds
/// with a call deadline of 0.5 s: the call ends at its deadline, well
/// within 5 s, and the connection is closed.
pub async fn an_endless_stream_ends_at_the_call_deadline(reply: Reply, agent_on: impl Fn(&Loopback) -> Agent) {
    let server = Loopback::start(vec![reply]).await;
    let started = Instant::now();
    let outcome = within_20_s(agent_on(&server).prompt("hi")).await;
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert_failed_with(&outcome, "the model call passed its deadline of 0.5 s");
    assert!(server.saw_client_close().await);
}

/// A stream of SSE keep-alive comments that never ends.
pub fn keep_alive_forever() -> Reply {
    super::loopback::endless_stream(": keep-alive\n\n", Duration::from_millis(10))
}

/// An endless stream that opens with `first` (the block or item its
/// deltas add to) and then sends `chunk` every millisecond.
pub fn endless_after(first: &str, chunk: String) -> Reply {
    let Reply::Endless { mut head, chunk, every } = super::loopback::endless_stream(chunk, Duration::from_millis(1))
    else {
        unreachable!()
    };
    head.push_str(first);
    Reply::Endless { head, chunk, every }
}

/// `reply` (a stream that never ends) answers an agent `agent_on` builds
/// with at most 256 KiB an answer: the run fails past the bound and the
/// connection is closed.
pub async fn an_endless_answer_fails_past_its_bound(reply: Reply, agent_on: impl Fn(&Loopback) -> Agent) {
    let server = Loopback::start(vec![reply]).await;
    let outcome = within_20_s(agent_on(&server).prompt("hi")).await;
    assert_failed_with(&outcome, "the model's answer is larger than 256 KiB");
    assert!(server.saw_client_close().await);
}
