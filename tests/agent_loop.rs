//! docs/contract.md §10.4, §10.5 tools and loop: every stop reason, tool validation, gates,
//! filters, scoping, concurrency, cancellation, steering, persona.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use serde_json::{json, Value};
use subagents::agent::{
    Agent, AgentUpdate, FnTool, ScriptMatch, ScriptedModel, SessionEvent, Step, SystemPrompt, Tool, ToolContext,
    ToolOutput, ToolSpec, Toolset,
};
use subagents::seam::ToolFilter;
use subagents::StopReason;

use crate::common::tool_results;

fn scripted(steps: Vec<Step>) -> ScriptedModel {
    ScriptedModel::new().script(ScriptMatch::Any, steps).recording()
}

fn add_tool() -> impl Tool {
    FnTool::new(
        "add",
        "Adds two integers.",
        json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
               "required": ["a", "b"], "additionalProperties": false}),
        |args| ToolOutput::ok((args["a"].as_i64().unwrap() + args["b"].as_i64().unwrap()).to_string()),
    )
}

fn last_turn_end(agent: &Agent) -> Option<StopReason> {
    agent.events().iter().rev().find_map(|event| match event {
        SessionEvent::TurnEnd { reason, .. } => Some(*reason),
        _ => None,
    })
}

/// A tool that waits (honouring cancellation) and counts overlap.
struct SlowTool {
    name: &'static str,
    concurrent: bool,
    delay: Duration,
    running: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

impl SlowTool {
    fn new(name: &'static str, concurrent: bool, delay: Duration) -> Self {
        SlowTool { name, concurrent, delay, running: Arc::default(), peak: Arc::default() }
    }
}

impl Tool for SlowTool {
    fn spec(&self) -> ToolSpec {
        ToolSpec { name: self.name.into(), description: "waits".into(), parameters: json!({"type": "object"}) }
    }

    fn concurrent(&self) -> bool {
        self.concurrent
    }

    fn call(&self, _arguments: Value, context: ToolContext) -> BoxFuture<'_, ToolOutput> {
        Box::pin(async move {
            let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
            self.peak.fetch_max(now, Ordering::SeqCst);
            tokio::select! {
                _ = context.cancel.cancelled() => {}
                _ = tokio::time::sleep(self.delay) => {}
            }
            self.running.fetch_sub(1, Ordering::SeqCst);
            ToolOutput::ok("waited")
        })
    }
}

#[tokio::test]
async fn a_plain_answer_completes_with_the_last_text() {
    let agent = Agent::builder(scripted(vec![Step::text("the answer")])).build().unwrap();
    let outcome = agent.prompt("question").await;
    assert_eq!(outcome.stop_reason, StopReason::Completed);
    assert_eq!(outcome.output, "the answer");
    assert_eq!(outcome.model_calls, 1);
    assert_eq!(last_turn_end(&agent), Some(StopReason::Completed));
}

#[tokio::test]
async fn a_tool_call_round_trips_and_the_model_sees_its_result() {
    let model = scripted(vec![Step::tool_call("add", json!({"a": 2, "b": 3})), Step::text("it is 5")]);
    let agent = Agent::builder(model.clone()).tool(add_tool()).build().unwrap();
    let outcome = agent.prompt("add 2 and 3").await;
    assert_eq!(outcome.stop_reason, StopReason::Completed);
    assert_eq!(outcome.output, "it is 5");
    assert_eq!(outcome.model_calls, 2);
    assert_eq!(tool_results(&agent.events()), vec![("add".into(), "5".into(), false)]);
    let second = &model.requests()[1];
    assert!(matches!(second.messages.last(), Some(SessionEvent::ToolResult { content, .. }) if content == "5"));
    assert_eq!(second.tools[0].name, "add");
}

#[tokio::test]
async fn max_tokens_and_refusal_end_the_turn_with_their_reason() {
    let agent = Agent::builder(scripted(vec![Step::max_tokens("partial ans")])).build().unwrap();
    let outcome = agent.prompt("long task").await;
    assert_eq!((outcome.stop_reason, outcome.output.as_str()), (StopReason::MaxTokens, "partial ans"));
    assert_eq!(last_turn_end(&agent), Some(StopReason::MaxTokens));

    let agent = Agent::builder(scripted(vec![Step::refusal("I will not")])).build().unwrap();
    let outcome = agent.prompt("bad task").await;
    assert_eq!((outcome.stop_reason, outcome.output.as_str()), (StopReason::Refusal, "I will not"));
    assert_eq!(last_turn_end(&agent), Some(StopReason::Refusal));
}

#[tokio::test]
async fn a_model_failure_ends_the_turn_error_with_the_reason_recorded() {
    let agent = Agent::builder(scripted(vec![Step::error("the model fell over")])).build().unwrap();
    let outcome = agent.prompt("anything").await;
    assert_eq!(outcome.stop_reason, StopReason::Error);
    assert_eq!(outcome.error.as_ref().map(|e| e.message.as_str()), Some("the model fell over"));
    assert_eq!(last_turn_end(&agent), Some(StopReason::Error));
    // The agent stays usable: the next turn runs normally (the script is spent).
    assert_eq!(agent.prompt("again").await.stop_reason, StopReason::Completed);
}

#[tokio::test]
async fn a_runaway_tool_loop_stops_at_the_step_limit() {
    let model = ScriptedModel::new().fallback(Step::tool_call("add", json!({"a": 1, "b": 1})));
    let agent = Agent::builder(model).tool(add_tool()).max_steps(4).build().unwrap();
    let outcome = agent.prompt("loop forever").await;
    assert_eq!(outcome.stop_reason, StopReason::Error);
    assert_eq!(outcome.model_calls, 4);
    assert!(outcome.error.unwrap().message.contains("limit of 4 model calls"));
}

#[tokio::test]
async fn cancelling_during_a_model_call_aborts_promptly() {
    let model = scripted(vec![Step::text("too late").after(Duration::from_secs(30))]);
    let agent = Agent::builder(model).build().unwrap();
    let canceller = agent.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        canceller.cancel();
    });
    let started = Instant::now();
    let outcome = agent.prompt("slow").await;
    assert_eq!(outcome.stop_reason, StopReason::Aborted);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(last_turn_end(&agent), Some(StopReason::Aborted));
    // Cancel hit that turn only.
    assert_eq!(agent.prompt("next").await.stop_reason, StopReason::Completed);
}

#[tokio::test]
async fn cancelling_during_a_tool_leaves_no_call_without_a_result() {
    let model = scripted(vec![Step::tool_calls([("slow", json!({})), ("add", json!({"a": 1, "b": 2}))])]);
    let agent = Agent::builder(model)
        .tool(SlowTool::new("slow", false, Duration::from_secs(30)))
        .tool(add_tool())
        .build()
        .unwrap();
    let canceller = agent.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        canceller.cancel();
    });
    let outcome = agent.prompt("do both").await;
    assert_eq!(outcome.stop_reason, StopReason::Aborted);
    let results = tool_results(&agent.events());
    assert_eq!(results.len(), 2, "each call has a result: {results:?}");
    assert!(results.iter().all(|(_, content, is_error)| *is_error && content.contains("not run")));
    assert_eq!(last_turn_end(&agent), Some(StopReason::Aborted));
}

#[tokio::test]
async fn a_cancel_token_from_the_builder_cancels_every_turn() {
    let token = subagents::CancellationToken::new();
    let model = scripted(vec![Step::text("late").after(Duration::from_secs(30))]);
    let agent = Agent::builder(model).cancel_token(token.clone()).build().unwrap();
    token.cancel();
    assert_eq!(agent.prompt("a").await.stop_reason, StopReason::Aborted);
    assert_eq!(agent.prompt("b").await.stop_reason, StopReason::Aborted);
}

#[tokio::test]
async fn invalid_arguments_reach_the_model_as_a_tool_error_listing_each_violation() {
    let model = scripted(vec![
        Step::tool_call("add", json!({"a": "two", "c": 1})),
        Step::tool_call("add", json!({"a": 2, "b": 2})),
        Step::text("4"),
    ]);
    let agent = Agent::builder(model.clone()).tool(add_tool()).build().unwrap();
    let outcome = agent.prompt("add").await;
    assert_eq!(outcome.stop_reason, StopReason::Completed);
    let results = tool_results(&agent.events());
    let (_, error, is_error) = &results[0];
    assert!(is_error);
    assert!(error.contains("$.a"), "{error}");
    assert!(error.contains("\"b\" is a required property"), "{error}");
    assert!(error.contains("'c' was unexpected"), "additional property listed: {error}");
    assert_eq!(results[1], ("add".into(), "4".into(), false), "the model retried in the same turn");
}

#[tokio::test]
async fn arguments_that_are_not_json_are_a_tool_error() {
    let model = scripted(vec![Step::tool_call("add", Value::String("{a: 1".into())), Step::text("gave up")]);
    let agent = Agent::builder(model).tool(add_tool()).build().unwrap();
    agent.prompt("add").await;
    let (_, error, is_error) = &tool_results(&agent.events())[0];
    assert!(*is_error && error.contains("not valid JSON"), "{error}");
}

#[tokio::test]
async fn a_gate_sees_and_denies_even_tool_names_the_model_invented() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut tools = Toolset::new();
    tools.add(add_tool()).unwrap();
    let log = seen.clone();
    tools.add_gate(move |call: &subagents::agent::ToolCall| {
        log.lock().unwrap().push(call.name.clone());
        if call.name == "delete_everything" {
            Err("destructive tools are not allowed".to_owned())
        } else {
            Ok(())
        }
    });
    let model = scripted(vec![
        Step::tool_calls([("delete_everything", json!({})), ("made_up", json!({})), ("add", json!({"a": 1, "b": 1}))]),
        Step::text("ok"),
    ]);
    let agent = Agent::builder(model).toolset(tools).build().unwrap();
    agent.prompt("go").await;
    assert_eq!(*seen.lock().unwrap(), ["delete_everything", "made_up", "add"]);
    let results = tool_results(&agent.events());
    assert!(results[0].1.contains("denied: destructive tools are not allowed"), "{:?}", results[0]);
    assert!(results[1].1.contains("no tool named \"made_up\"; available: add"), "{:?}", results[1]);
    assert_eq!(results[2], ("add".into(), "2".into(), false));
}

#[tokio::test]
async fn a_filtered_tool_is_hidden_from_the_model_and_denied_when_called_anyway() {
    let mut tools = Toolset::new();
    tools.add(add_tool()).unwrap();
    tools.add(SlowTool::new("slow", false, Duration::ZERO)).unwrap();
    tools.set_filter(ToolFilter::deny(["slow"]));
    let model = scripted(vec![Step::tool_call("slow", json!({})), Step::text("ok")]);
    let agent = Agent::builder(model.clone()).toolset(tools).build().unwrap();
    agent.prompt("go").await;
    let names: Vec<_> = model.requests()[0].tools.iter().map(|t| t.name.clone()).collect();
    assert_eq!(names, ["add"]);
    let (_, error, is_error) = &tool_results(&agent.events())[0];
    assert!(*is_error && error.contains("\"slow\" is not available to this agent"), "{error}");
}

#[tokio::test]
async fn one_agents_tools_are_invisible_to_another() {
    let model = scripted(vec![Step::tool_call("add", json!({"a": 1, "b": 1})), Step::text("done")]);
    let with_tool = Agent::builder(model.clone()).tool(add_tool()).build().unwrap();
    let without = Agent::builder(model.clone()).build().unwrap();
    with_tool.prompt("first").await;
    without.prompt("second").await;
    let requests = model.requests();
    let for_without: Vec<_> = requests.iter().filter(|r| r.session_id == without.id()).collect();
    assert!(for_without.iter().all(|r| r.tools.is_empty()));
    assert!(tool_results(&without.events())[0].1.contains("no tool named \"add\""));
    assert_eq!(tool_results(&with_tool.events())[0].1, "2");
}

#[tokio::test]
async fn concurrent_tools_overlap_and_exclusive_tools_do_not() {
    let parallel = SlowTool::new("parallel", true, Duration::from_millis(200));
    let peak = parallel.peak.clone();
    let model = scripted(vec![Step::tool_calls((0..3).map(|_| ("parallel", json!({})))), Step::text("ok")]);
    let agent = Agent::builder(model).tool(parallel).build().unwrap();
    assert_eq!(agent.prompt("go").await.stop_reason, StopReason::Completed);
    assert_eq!(peak.load(Ordering::SeqCst), 3, "three concurrent calls ran together");

    let exclusive = SlowTool::new("exclusive", false, Duration::from_millis(20));
    let peak = exclusive.peak.clone();
    let model = scripted(vec![Step::tool_calls((0..3).map(|_| ("exclusive", json!({})))), Step::text("ok")]);
    let agent = Agent::builder(model).tool(exclusive).build().unwrap();
    agent.prompt("go").await;
    assert_eq!(peak.load(Ordering::SeqCst), 1);
    assert_eq!(tool_results(&agent.events()).len(), 3);
}

#[tokio::test]
async fn a_tool_that_ends_the_turn_stops_the_loop_and_later_calls_are_denied() {
    let finish = FnTool::new("finish", "Ends the turn.", json!({"type": "object"}), |_| {
        ToolOutput::ok("captured").ending_turn()
    })
    .exclusive();
    let model = scripted(vec![
        Step::tool_calls([("add", json!({"a": 1, "b": 1})), ("finish", json!({})), ("add", json!({"a": 2, "b": 2}))]),
        Step::text("must not be asked"),
    ]);
    let agent = Agent::builder(model.clone()).tool(add_tool()).tool(finish).build().unwrap();
    let outcome = agent.prompt("go").await;
    assert_eq!(outcome.stop_reason, StopReason::Completed);
    assert_eq!(outcome.model_calls, 1, "no model call after the turn ended");
    let results = tool_results(&agent.events());
    assert_eq!(results[0], ("add".into(), "2".into(), false), "calls before it run");
    assert_eq!(results[1], ("finish".into(), "captured".into(), false));
    assert!(results[2].2 && results[2].1.contains("already ended the turn"), "{:?}", results[2]);
}

#[tokio::test]
async fn a_panicking_tool_is_a_tool_error_and_the_turn_goes_on() {
    let boom = FnTool::new("boom", "Panics.", json!({"type": "object"}), |_| panic!("tool bug"));
    let model = scripted(vec![Step::tool_call("boom", json!({})), Step::text("recovered")]);
    let agent = Agent::builder(model).tool(boom).build().unwrap();
    let outcome = agent.prompt("go").await;
    assert_eq!((outcome.stop_reason, outcome.output.as_str()), (StopReason::Completed, "recovered"));
    assert!(tool_results(&agent.events())[0].1.contains("failed unexpectedly"));
}

#[tokio::test]
async fn read_file_and_list_dir_stay_inside_the_working_directory() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "secret").unwrap();
    let cwd = tempfile::tempdir().unwrap();
    std::fs::write(cwd.path().join("notes.txt"), "inside").unwrap();
    std::fs::create_dir(cwd.path().join("sub")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret.txt"), cwd.path().join("link.txt")).unwrap();
    let outside_path = outside.path().join("secret.txt").display().to_string();
    let inside_absolute = cwd.path().join("notes.txt").display().to_string();
    let model = scripted(vec![
        Step::tool_calls([
            ("read_file", json!({"path": "notes.txt"})),
            ("read_file", json!({"path": "sub/../notes.txt"})),
            ("read_file", json!({"path": inside_absolute})),
            ("read_file", json!({"path": "../secret.txt"})),
            ("read_file", json!({"path": outside_path})),
            ("read_file", json!({"path": "link.txt"})),
            ("list_dir", json!({})),
            ("list_dir", json!({"path": ".."})),
        ]),
        Step::text("done"),
    ]);
    let agent = Agent::builder(model).cwd(cwd.path()).builtin_tools().build().unwrap();
    agent.prompt("look around").await;
    let results = tool_results(&agent.events());
    assert_eq!(results[0], ("read_file".into(), "inside".into(), false));
    assert_eq!(results[1].1, "inside");
    assert_eq!(results[2].1, "inside", "an absolute path under the cwd is fine");
    for refused in [&results[3], &results[4], &results[5], &results[7]] {
        assert!(refused.2 && refused.1.contains("outside the session's working directory"), "{refused:?}");
    }
    assert_eq!(results[6], ("list_dir".into(), "link.txt\nnotes.txt\nsub/".into(), false));
}

#[tokio::test]
async fn a_persona_replaces_the_default_section_and_is_recorded() {
    let model = scripted(vec![Step::text("ok")]);
    let agent = Agent::builder(model.clone()).persona("You are a pirate.").build().unwrap();
    agent.prompt("hi").await;
    let system = &model.requests()[0].system;
    assert!(system.starts_with("You are a pirate."), "{system}");
    assert!(!system.contains(SystemPrompt::default().get(SystemPrompt::PERSONA).unwrap()));
    assert!(system.contains(SystemPrompt::default().get(SystemPrompt::TOOLS).unwrap()), "other sections stay");
    assert_eq!(agent.header().persona.as_deref(), Some("You are a pirate."));
}

#[tokio::test]
async fn a_steering_message_reaches_the_model_at_its_next_call() {
    let gate = SlowTool::new("wait", false, Duration::from_millis(100));
    let model = scripted(vec![Step::tool_call("wait", json!({})), Step::text("adjusted")]);
    let agent = Agent::builder(model.clone()).tool(gate).build().unwrap();
    let steerer = agent.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(30)).await;
        steerer.steer("focus on tests");
    });
    agent.prompt("start").await;
    let second = &model.requests()[1];
    assert_eq!(second.last_user_text().as_deref(), Some("focus on tests"));
}

#[tokio::test]
async fn idle_waits_for_queued_turns_and_a_dropped_turn_is_closed_aborted() {
    let model = scripted(vec![Step::text("a").after(Duration::from_millis(100)), Step::text("b")]);
    let agent = Agent::builder(model).build().unwrap();
    let (first, second) = (agent.clone(), agent.clone());
    let a = tokio::spawn(async move { first.prompt("one").await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let b = tokio::spawn(async move { second.prompt("two").await });
    tokio::time::sleep(Duration::from_millis(10)).await;
    agent.idle().await;
    assert!(a.is_finished() && b.is_finished());
    assert_eq!(a.await.unwrap().output, "a");
    assert_eq!(b.await.unwrap().output, "b");

    let slow = Agent::builder(scripted(vec![Step::text("x").after(Duration::from_secs(30))])).build().unwrap();
    let turn = slow.prompt("never finishes");
    let _ = tokio::time::timeout(Duration::from_millis(20), turn).await;
    assert_eq!(last_turn_end(&slow), Some(StopReason::Aborted));
}

#[tokio::test]
async fn updates_report_tool_calls_and_the_turn_end() {
    let updates = Arc::new(Mutex::new(Vec::new()));
    let sink = updates.clone();
    let model = scripted(vec![Step::tool_call("add", json!({"a": 1, "b": 2})), Step::text("3")]);
    let agent = Agent::builder(model)
        .tool(add_tool())
        .on_update(Arc::new(move |u: &AgentUpdate| sink.lock().unwrap().push(u.clone())))
        .build()
        .unwrap();
    agent.prompt("go").await;
    let updates = updates.lock().unwrap();
    assert_eq!(
        *updates,
        [
            AgentUpdate::ToolCall { id: "call_0".into(), name: "add".into(), arguments: json!({"a": 1, "b": 2}) },
            AgentUpdate::ToolResult { id: "call_0".into(), name: "add".into(), is_error: false },
            AgentUpdate::Text("3".into()),
            AgentUpdate::TurnEnd(StopReason::Completed),
        ]
    );
}

#[test]
fn tool_schemas_are_checked_when_added_compiled_on_demand_and_reported_to_the_model() {
    let not_an_object = FnTool::new("bad", "Bad.", json!("a string"), |_| ToolOutput::ok(""));
    assert!(matches!(Toolset::new().add(not_an_object), Err(subagents::agent::ToolError::InvalidSchema { .. })));
    let mut tools = Toolset::new();
    tools.add(FnTool::new("broken", "Broken.", json!({"type": 5}), |_| ToolOutput::ok("ran"))).unwrap();
    assert!(
        matches!(tools.compile_all(), Err(subagents::agent::ToolError::InvalidSchema { name, .. }) if name == "broken")
    );
    let model = scripted(vec![Step::tool_call("broken", json!({})), Step::text("ok")]);
    let agent = Agent::builder(model).toolset(tools).build().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(agent.prompt("go"));
    let (_, error, is_error) = &tool_results(&agent.events())[0];
    assert!(*is_error && error.contains("invalid parameter schema"), "{error}");
}
