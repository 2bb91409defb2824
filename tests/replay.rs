//! docs/contract.md §10.3 replay: tapes recorded around any model replay nested parent →
//! child runs, binding live sessions to recorded ones in first-call order.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde_json::{json, Value};
use subagents::agent::{
    Agent, Model, RecordingModel, ReplayModel, ScriptMatch, ScriptedModel, SessionEvent, Step, Tape, TapeAnswer, Tool,
    ToolContext, ToolOutput, ToolSpec,
};
use subagents::StopReason;

/// Runs a child agent on the same model: a parent → child delegation
/// without the runtime.
struct Delegate {
    model: Arc<dyn Model>,
}

impl Tool for Delegate {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "delegate".into(),
            description: "Runs a child agent.".into(),
            parameters: json!({"type": "object", "properties": {"prompt": {"type": "string"}}, "required": ["prompt"]}),
        }
    }

    fn call(&self, arguments: Value, context: ToolContext) -> BoxFuture<'_, ToolOutput> {
        Box::pin(async move {
            let child = Agent::builder_shared(self.model.clone())
                .parent(Some(context.session_id.to_string()), 1)
                .build()
                .unwrap();
            let outcome = child.prompt(arguments["prompt"].as_str().unwrap()).await;
            ToolOutput::ok(outcome.output)
        })
    }
}

fn live_model() -> ScriptedModel {
    ScriptedModel::new()
        .script(
            ScriptMatch::PromptContains("plan the release".into()),
            vec![Step::tool_call("delegate", json!({"prompt": "list the open bugs"})), Step::text("release planned")],
        )
        .script(ScriptMatch::PromptContains("open bugs".into()), vec![Step::text("bug 1, bug 2")])
}

async fn run_parent(model: Arc<dyn Model>, prompt: &str) -> (String, Vec<SessionEvent>) {
    let parent = Agent::builder_shared(model.clone()).tool(Delegate { model }).build().unwrap();
    let outcome = parent.prompt(prompt).await;
    assert_eq!(outcome.stop_reason, StopReason::Completed, "{outcome:?}");
    (outcome.output, parent.events())
}

#[tokio::test]
async fn a_recorded_parent_and_child_replay_from_the_tape_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("release.tape.json");
    let recorder = Arc::new(RecordingModel::writing_to(live_model(), &path));
    let (recorded_output, recorded_events) = run_parent(recorder.clone(), "plan the release").await;
    let tape = Tape::load(&path).unwrap();
    assert_eq!(tape, recorder.tape(), "the file holds every answer");
    assert_eq!(tape.sessions.len(), 2, "parent and child");
    assert_eq!(tape.sessions[0].first_prompt.as_deref(), Some("plan the release"));
    assert_eq!(tape.sessions[1].first_prompt.as_deref(), Some("list the open bugs"));

    let replay: Arc<dyn Model> = Arc::new(ReplayModel::from_file(&path).unwrap());
    let (replayed_output, replayed_events) = run_parent(replay, "plan the release").await;
    assert_eq!(replayed_output, recorded_output);
    assert_eq!(
        timeless(replayed_events.clone()),
        timeless(recorded_events),
        "the parent's whole log replays, the child's answer included"
    );
    assert!(replayed_events.iter().any(|e| matches!(e,
        SessionEvent::ToolResult { content, .. } if content == "bug 1, bug 2")));
}

#[tokio::test]
async fn sessions_bind_in_first_call_order_when_prompts_differ() {
    let recorder = Arc::new(RecordingModel::new(live_model()));
    run_parent(recorder.clone(), "plan the release").await;
    let replay: Arc<dyn Model> = Arc::new(ReplayModel::new(recorder.tape()));
    // A reworded parent prompt matches no recorded first prompt: the parent
    // still binds to the first recorded session, the child to the second.
    let (output, events) = run_parent(replay, "please plan the release now").await;
    assert_eq!(output, "release planned");
    assert!(events.iter().any(|e| matches!(e, SessionEvent::ToolResult { content, .. } if content == "bug 1, bug 2")));
}

#[tokio::test]
async fn failures_are_recorded_and_a_spent_tape_fails_the_turn_clearly() {
    let recorder =
        Arc::new(RecordingModel::new(ScriptedModel::new().script(ScriptMatch::Any, vec![Step::error("overloaded")])));
    let agent = Agent::builder_shared(recorder.clone()).build().unwrap();
    assert_eq!(agent.prompt("try").await.stop_reason, StopReason::Error);
    assert_eq!(recorder.tape().sessions[0].answers, [TapeAnswer::Error("overloaded".into())]);

    let tape = Tape {
        sessions: vec![subagents::agent::TapeSession {
            first_prompt: None,
            answers: vec![TapeAnswer::Error("overloaded".into())],
        }],
    };
    let agent = Agent::builder(ReplayModel::new(tape)).build().unwrap();
    let outcome = agent.prompt("try").await;
    assert_eq!(
        (outcome.stop_reason, outcome.error.as_ref().map(|e| e.message.as_str())),
        (StopReason::Error, Some("overloaded"))
    );
    let outcome = agent.prompt("again").await;
    assert_eq!(outcome.stop_reason, StopReason::Error);
    assert!(outcome.error.unwrap().message.contains("the tape ran out"));

    let stranger = Agent::builder(ReplayModel::new(Tape::default())).build().unwrap();
    assert!(stranger.prompt("hi").await.error.unwrap().message.contains("all are bound"));
}

/// The events with each turn's length left out: a replay spends the same
/// tokens, not the same time.
fn timeless(events: Vec<SessionEvent>) -> Vec<SessionEvent> {
    let strip = |event| match event {
        SessionEvent::TurnEnd { reason, usage, .. } => SessionEvent::TurnEnd { reason, duration_ms: None, usage },
        event => event,
    };
    events.into_iter().map(strip).collect()
}
