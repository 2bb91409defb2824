//! docs/contract.md §6, §7.3–§7.5 (spawn, fork, in-process details), §8: in-process children
//! through the public API.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::{json, Value};
use subagents::agent::{
    Agent, FnTool, ScriptMatch, ScriptedModel, SessionEvent, SessionStore, Step, SystemPrompt, Tool, ToolContext,
    ToolOutput, ToolSpec, Toolset,
};
use subagents::providers::{ChildInfo, InProcessProvider, ModelRoutes};
use subagents::seam::{AgentOptions, Category, ToolFilter};
use subagents::{CancellationToken, Parent, Runtime, StartRequest, StopReason, Subagents};

struct Fixture {
    runtime: Runtime,
    home: tempfile::TempDir,
    cwd: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let home = tempfile::tempdir().unwrap();
        let runtime = common::in_process_runtime(home.path());
        Fixture { runtime, home, cwd: tempfile::tempdir().unwrap() }
    }

    fn register(&self, provider: InProcessProvider) {
        self.runtime.subagents().register_provider(provider).unwrap().keep();
    }

    fn parent(&self) -> Parent {
        Parent::root(self.cwd.path())
    }

    fn request(&self, prompt: &str) -> StartRequest {
        StartRequest::new(prompt, self.parent(), CancellationToken::new())
    }

    fn store(&self) -> SessionStore {
        SessionStore::new(self.home.path())
    }

    /// Every session the home holds, as a fresh store lists them.
    fn session_ids(&self) -> Vec<String> {
        self.store().ids().unwrap()
    }
}

fn scripted(model: ScriptedModel) -> Arc<ScriptedModel> {
    Arc::new(model.recording())
}

fn city_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["city", "population"],
        "additionalProperties": false
    })
}

fn child_agent(run: &subagents::Run) -> Agent {
    run.agent().expect("in-process children are local agents")
}

#[test]
fn spawn_publishes_the_session_before_start_returns() {
    let fixture = Fixture::new();
    fixture.register(InProcessProvider::spawn("spawn", scripted(ScriptedModel::new())));
    let subagents = fixture.runtime.subagents();
    let parent = fixture.parent().with_session("parent-session").with_depth(2);
    let store = fixture.store();
    let (header, result) = fixture.runtime.block_on(async move {
        let run = subagents.start("spawn", StartRequest::new("work", parent, CancellationToken::new())).await.unwrap();
        // Published: the session file and its header exist right now.
        let (header, _) = store.read(run.child_id()).unwrap();
        assert_eq!(child_agent(&run).id(), run.child_id(), "the run id is the child session id");
        let result = run.result().await.unwrap();
        run.dispose().await.unwrap();
        (header, result)
    });
    assert_eq!(header.parent_session.as_deref(), Some("parent-session"));
    assert_eq!(header.depth, 3);
    assert_eq!(header.cwd, fixture.cwd.path());
    assert_eq!((result.stop_reason, result.text()), (StopReason::Completed, "handled: work".to_owned()));
    // Disposed: the turn end is on disk.
    let (_, events) = fixture.store().read(&header.id).unwrap();
    assert!(
        matches!(
            events.last(),
            Some(SessionEvent::TurnEnd { reason: StopReason::Completed, duration_ms: Some(_), usage: Some(_) })
        ),
        "{events:?}"
    );
    assert!(fixture.runtime.live().is_quiescent());
}

#[test]
fn the_route_is_the_parents_overridden_field_by_field_and_picks_the_model() {
    let fixture = Fixture::new();
    let default = scripted(ScriptedModel::new());
    let special = scripted(ScriptedModel::new().fallback(Step::text("from the special model")));
    let routes = ModelRoutes::new(default.clone()).with("special", special.clone());
    fixture.register(InProcessProvider::spawn("spawn", default.clone()).with_models(routes));
    let subagents = fixture.runtime.subagents();
    let parent_route = AgentOptions {
        model: Some("parent-model".into()),
        max_tokens: Some(100),
        reasoning_effort: Some("low".into()),
        ..Default::default()
    };
    let parent = fixture.parent().with_route(parent_route);
    let (plain, routed, unknown) = fixture.runtime.block_on(async move {
        let over = AgentOptions { model: Some("child-model".into()), ..Default::default() };
        let request = StartRequest::new("a", parent.clone(), CancellationToken::new()).with_agent_options(over);
        let run = subagents.start("spawn", request).await.unwrap();
        let plain = run.result().await.unwrap();
        run.dispose().await.unwrap();
        let special_route = AgentOptions { provider: Some("special".into()), ..Default::default() };
        let request =
            StartRequest::new("b", parent.clone(), CancellationToken::new()).with_agent_options(special_route);
        let run = subagents.start("spawn", request).await.unwrap();
        let routed = run.result().await.unwrap();
        run.dispose().await.unwrap();
        let missing = AgentOptions { provider: Some("nowhere".into()), ..Default::default() };
        let request = StartRequest::new("c", parent, CancellationToken::new()).with_agent_options(missing);
        (plain, routed, subagents.start("spawn", request).await.unwrap_err())
    });
    assert_eq!(plain.stop_reason, StopReason::Completed);
    let options = &default.requests()[0].options;
    assert_eq!(options.model.as_deref(), Some("child-model"), "the request's field wins");
    assert_eq!(options.max_tokens, Some(100), "the parent's other fields stay");
    assert_eq!(options.reasoning_effort.as_deref(), Some("low"));
    assert_eq!(routed.text(), "from the special model");
    assert_eq!(special.calls(), 1);
    assert_eq!(unknown.code(), "INVALID_REQUEST");
    assert!(unknown.to_string().contains("nowhere"), "{unknown}");
    assert_eq!(fixture.session_ids().len(), 2, "the refused start left no session behind");
}

#[test]
fn a_persona_replaces_the_default_persona_section() {
    let fixture = Fixture::new();
    let model = scripted(ScriptedModel::new());
    fixture.register(InProcessProvider::spawn("spawn", model.clone()));
    let subagents = fixture.runtime.subagents();
    let request = fixture.request("review").with_persona("You are a meticulous security reviewer.");
    let header = fixture.runtime.block_on(async move {
        let run = subagents.start("spawn", request).await.unwrap();
        run.result().await.unwrap();
        let header = child_agent(&run).header();
        run.dispose().await.unwrap();
        header
    });
    let system = &model.requests()[0].system;
    assert!(system.starts_with("You are a meticulous security reviewer."), "{system}");
    assert!(!system.contains(SystemPrompt::default().get(SystemPrompt::PERSONA).unwrap()));
    assert_eq!(header.persona.as_deref(), Some("You are a meticulous security reviewer."));
}

#[test]
fn a_filtered_tool_is_hidden_and_denied_even_when_the_model_calls_it() {
    let fixture = Fixture::new();
    std::fs::write(fixture.cwd.path().join("plan.txt"), "the plan").unwrap();
    let model = scripted(ScriptedModel::new().script(
        ScriptMatch::Any,
        vec![
            Step::tool_calls([("read_file", json!({"path": "plan.txt"})), ("list_dir", json!({}))]),
            Step::text("done"),
        ],
    ));
    fixture.register(InProcessProvider::spawn("spawn", model.clone()));
    let subagents = fixture.runtime.subagents();
    let request = fixture.request("look").with_tool_filter(ToolFilter::deny(["read_file"]));
    let events = fixture.runtime.block_on(async move {
        let run = subagents.start("spawn", request).await.unwrap();
        run.result().await.unwrap();
        let events = child_agent(&run).events();
        run.dispose().await.unwrap();
        events
    });
    let visible: Vec<_> = model.requests()[0].tools.iter().map(|t| t.name.clone()).collect();
    assert_eq!(visible, ["list_dir"]);
    let results = common::tool_results(&events);
    assert!(results[0].2 && results[0].1.contains("\"read_file\" is not available"), "{:?}", results[0]);
    assert!(!results[1].2, "the permitted tool ran");
}

/// Delegates through the runtime from inside a child: a real nested chain.
struct Delegate {
    subagents: Subagents,
    provider: &'static str,
    max_depth: u32,
    refusals: Arc<Mutex<Vec<String>>>,
}

impl Tool for Delegate {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "delegate".into(),
            description: "Delegates to a subagent.".into(),
            parameters: json!({"type": "object", "properties": {"prompt": {"type": "string"}}, "required": ["prompt"]}),
        }
    }

    fn call(&self, arguments: Value, context: ToolContext) -> BoxFuture<'_, ToolOutput> {
        Box::pin(async move {
            let prompt = arguments["prompt"].as_str().unwrap_or("go").to_owned();
            let request = StartRequest::new(prompt, context.agent.as_parent(), CancellationToken::new())
                .with_max_depth(self.max_depth);
            match self.subagents.start(self.provider, request).await {
                Ok(run) => {
                    let result = run.result().await.unwrap();
                    run.dispose().await.unwrap();
                    ToolOutput::ok(result.text())
                }
                Err(error) => {
                    self.refusals.lock().unwrap().push(format!("{}: {error}", error.code()));
                    ToolOutput::error(error.to_string())
                }
            }
        })
    }
}

#[test]
fn a_depth_chain_is_refused_one_level_past_the_cap_before_the_child_exists() {
    let fixture = Fixture::new();
    let model =
        scripted(ScriptedModel::new().script(
            ScriptMatch::Any,
            vec![Step::tool_call("delegate", json!({"prompt": "go deeper"})), Step::text("ok")],
        ));
    let refusals = Arc::new(Mutex::new(Vec::new()));
    let subagents = fixture.runtime.subagents();
    let (tool_subagents, tool_refusals) = (subagents.clone(), refusals.clone());
    let factory = Arc::new(move |_: &ChildInfo| {
        let mut tools = Toolset::new();
        let delegate = Delegate {
            subagents: tool_subagents.clone(),
            provider: "spawn",
            max_depth: 2,
            refusals: tool_refusals.clone(),
        };
        tools.add(delegate).unwrap();
        tools
    });
    fixture.register(InProcessProvider::spawn("spawn", model.clone()).with_tools(factory.clone()));
    let root = Agent::builder_shared(model.clone())
        .cwd(fixture.cwd.path())
        .toolset(factory(&ChildInfo {
            session_id: String::new(),
            parent_session: None,
            depth: 0,
            cwd: fixture.cwd.path().into(),
        }))
        .build()
        .unwrap();
    let outcome = fixture.runtime.block_on(async move { root.prompt("start the chain").await });
    assert_eq!(outcome.stop_reason, StopReason::Completed);
    let refusals = refusals.lock().unwrap();
    assert_eq!(refusals.len(), 1, "{refusals:?}");
    assert!(refusals[0].starts_with("INVALID_REQUEST"), "{}", refusals[0]);
    assert!(refusals[0].contains("depth 3") && refusals[0].contains("max_depth 2"), "{}", refusals[0]);
    let mut depths: Vec<(u32, bool)> = fixture
        .session_ids()
        .iter()
        .map(|id| {
            let (header, _) = fixture.store().read(id).unwrap();
            (header.depth, header.parent_session.is_some())
        })
        .collect();
    depths.sort();
    assert_eq!(depths, [(1, true), (2, true)], "two children exist; the third never did");
}

#[test]
fn a_cancel_between_creation_and_publication_disposes_the_child_and_rejects() {
    let fixture = Fixture::new();
    let signal = CancellationToken::new();
    let trip = signal.clone();
    // The tool factory runs while the child is being created: cancelling
    // there lands between creation and publication.
    let factory = Arc::new(move |_: &ChildInfo| {
        trip.cancel();
        Toolset::new()
    });
    fixture.register(InProcessProvider::spawn("spawn", scripted(ScriptedModel::new())).with_tools(factory));
    let subagents = fixture.runtime.subagents();
    let request = StartRequest::new("never runs", fixture.parent(), signal);
    let error = fixture.runtime.block_on(async move { subagents.start("spawn", request).await.unwrap_err() });
    assert_eq!(error.code(), "ABORTED");
    assert!(fixture.session_ids().is_empty(), "the child's session was rolled back: {:?}", fixture.session_ids());
    let live = fixture.runtime.live();
    assert!(live.is_quiescent(), "{live:?}");
}

fn fork_parent_model() -> Arc<ScriptedModel> {
    // Scripts bind per session on its first call; earlier scripts win.
    scripted(
        ScriptedModel::new()
            .script(ScriptMatch::PromptContains("what was the code word".into()), vec![Step::text("")])
            .script(
                ScriptMatch::PromptContains("remember the code word".into()),
                vec![
                    Step::text("noted: kiwi"),
                    Step::tool_call("delegate", json!({"prompt": "what was the code word?"})),
                    Step::text("parent done"),
                ],
            ),
    )
}

#[test]
fn a_fork_taken_mid_turn_inherits_completed_turns_only_and_never_echoes_them() {
    let fixture = Fixture::new();
    let model = fork_parent_model();
    let refusals = Arc::new(Mutex::new(Vec::new()));
    let subagents = fixture.runtime.subagents();
    fixture.register(InProcessProvider::fork("fork", model.clone()));
    let delegate = Delegate { subagents: subagents.clone(), provider: "fork", max_depth: 3, refusals };
    let parent = Agent::builder_shared(model.clone()).cwd(fixture.cwd.path()).tool(delegate).build().unwrap();
    let parent_id = parent.id().to_owned();
    let (first, second) = fixture.runtime.block_on(async move {
        let first = parent.prompt("remember the code word kiwi").await;
        let second = parent.prompt("delegate now").await;
        (first, second)
    });
    assert_eq!((first.stop_reason, second.stop_reason), (StopReason::Completed, StopReason::Completed));
    let child_request =
        model.requests().into_iter().find(|r| r.session_id != parent_id).expect("the fork child called the model");
    let texts: Vec<String> = child_request
        .messages
        .iter()
        .map(|event| match event {
            SessionEvent::User { content } => format!("user: {}", subagents::seam::text_of(content)),
            SessionEvent::Assistant { text, tool_calls } => format!("assistant: {text} ({} calls)", tool_calls.len()),
            SessionEvent::ToolResult { .. } => "tool result".to_owned(),
            SessionEvent::TurnEnd { reason, .. } => format!("turn end: {reason}"),
        })
        .collect();
    assert_eq!(
        texts,
        [
            "user: remember the code word kiwi",
            "assistant: noted: kiwi (0 calls)",
            "turn end: completed",
            "user: what was the code word?",
        ],
        "the open turn (delegate now + its tool call) is not copied"
    );
    // The child answered with empty text: its result is empty, never the
    // seeded "noted: kiwi".
    let child_result = common::tool_results(&model.requests().last().unwrap().messages);
    assert_eq!(child_result[0], ("delegate".into(), String::new(), false));
}

#[test]
fn a_fork_of_a_parent_without_a_completed_turn_is_like_spawn_and_a_stored_parent_works_too() {
    let fixture = Fixture::new();
    let model = scripted(ScriptedModel::new());
    fixture.register(InProcessProvider::fork("fork", model.clone()));
    fixture.register(InProcessProvider::spawn("spawn", model.clone()));
    let subagents = fixture.runtime.subagents();
    assert!(subagents.provider("fork").unwrap().inherits_parent_context);
    assert!(!subagents.provider("spawn").unwrap().inherits_parent_context);

    // A stored parent session (no live agent in the request).
    let stored = Agent::builder_shared(model.clone()).store(fixture.store()).cwd(fixture.cwd.path()).build().unwrap();
    let stored_id = stored.id().to_owned();
    let fresh = Agent::builder_shared(model.clone()).cwd(fixture.cwd.path()).build().unwrap();
    let fresh_parent = fresh.as_parent();
    let cwd = fixture.cwd.path().to_path_buf();
    let counts = fixture.runtime.block_on(async move {
        stored.prompt("an earlier turn").await;
        let mut counts = Vec::new();
        for (provider, parent) in [
            ("fork", fresh_parent),
            ("fork", Parent::root(&cwd).with_session(stored_id.clone())),
            ("spawn", Parent::root(&cwd).with_session(stored_id)),
        ] {
            let run = subagents.start(provider, StartRequest::new("task", parent, CancellationToken::new())).await;
            let run = run.unwrap();
            run.result().await.unwrap();
            counts.push(child_agent(&run).events().len());
            run.dispose().await.unwrap();
        }
        counts
    });
    // user + assistant + turn end of the child's own turn; plus 3 seeded events
    // from the stored parent's completed turn for the second fork.
    assert_eq!(counts, [3, 6, 3]);

    let subagents = fixture.runtime.subagents();
    let missing = Parent::root(fixture.cwd.path()).with_session("no-such-session");
    let error = fixture.runtime.block_on(async move {
        subagents.start("fork", StartRequest::new("task", missing, CancellationToken::new())).await.unwrap_err()
    });
    assert_eq!(error.code(), "INVALID_REQUEST");
}

async fn structured_run(
    subagents: &Subagents,
    request: StartRequest,
) -> (subagents::RunResult, Vec<SessionEvent>, String) {
    let run = subagents.start("spawn", request).await.unwrap();
    let result = run.result().await.unwrap();
    let events = child_agent(&run).events();
    let id = run.child_id().to_owned();
    run.dispose().await.unwrap();
    (result, events, id)
}

#[test]
fn a_valid_capture_ends_the_turn_without_another_model_call() {
    let fixture = Fixture::new();
    let value = json!({"city": "Lisbon", "population": 545000});
    let model = scripted(ScriptedModel::new().script(
        ScriptMatch::Any,
        vec![Step::tool_call("structured_output", value.clone()), Step::text("must not be asked")],
    ));
    fixture.register(InProcessProvider::spawn("spawn", model.clone()));
    let subagents = fixture.runtime.subagents();
    let request = fixture.request("capital of Portugal").with_output_schema(city_schema());
    let (result, _, id) = fixture.runtime.block_on(async move { structured_run(&subagents, request).await });
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(result.structured, Some(value));
    assert_eq!(model.calls_for(&id), 1, "no model call after the capture");
    let tools = &model.requests()[0].tools;
    let capture = tools.iter().find(|t| t.name == "structured_output").unwrap();
    assert_eq!(capture.parameters, city_schema(), "the schema travels verbatim");
    assert!(model.requests()[0].system.contains("structured_output"), "the instruction is in the system prompt");
}

#[test]
fn invalid_arguments_are_a_tool_error_and_the_model_retries_in_turn() {
    let fixture = Fixture::new();
    let model = scripted(ScriptedModel::new().script(
        ScriptMatch::Any,
        vec![
            Step::tool_call("structured_output", json!({"city": 7})),
            Step::tool_call("structured_output", json!({"city": "Oslo", "population": 700000})),
        ],
    ));
    fixture.register(InProcessProvider::spawn("spawn", model.clone()));
    let subagents = fixture.runtime.subagents();
    let request = fixture.request("capital of Norway").with_output_schema(city_schema());
    let (result, events, id) = fixture.runtime.block_on(async move { structured_run(&subagents, request).await });
    assert_eq!(result.structured, Some(json!({"city": "Oslo", "population": 700000})));
    assert_eq!(model.calls_for(&id), 2);
    let results = common::tool_results(&events);
    assert!(results[0].2, "{:?}", results[0]);
    assert!(results[0].1.contains("$.city") && results[0].1.contains("population"), "{}", results[0].1);
    let turn_ends = events.iter().filter(|e| matches!(e, SessionEvent::TurnEnd { .. })).count();
    assert_eq!(turn_ends, 1, "the retry happened inside the same turn");
}

#[test]
fn calls_before_the_capture_run_and_calls_after_it_are_denied() {
    let fixture = Fixture::new();
    std::fs::write(fixture.cwd.path().join("data.txt"), "facts").unwrap();
    let model = scripted(ScriptedModel::new().script(
        ScriptMatch::Any,
        vec![Step::tool_calls([
            ("read_file", json!({"path": "data.txt"})),
            ("structured_output", json!({"city": "Rome", "population": 2800000})),
            ("list_dir", json!({})),
            ("structured_output", json!({"city": "Milan", "population": 1400000})),
        ])],
    ));
    fixture.register(InProcessProvider::spawn("spawn", model.clone()));
    let subagents = fixture.runtime.subagents();
    let request = fixture.request("capital of Italy").with_output_schema(city_schema());
    let (result, events, _) = fixture.runtime.block_on(async move { structured_run(&subagents, request).await });
    assert_eq!(result.structured, Some(json!({"city": "Rome", "population": 2800000})));
    let results = common::tool_results(&events);
    assert_eq!(results[0], ("read_file".into(), "facts".into(), false));
    assert!(!results[1].2);
    assert!(results[2].2 && results[2].1.contains("already ended the turn"), "{:?}", results[2]);
    assert!(results[3].2, "a second capture is denied too");
}

#[test]
fn a_finish_without_a_capture_is_nudged_then_settles_error() {
    let fixture = Fixture::new();
    let nudged = scripted(ScriptedModel::new().script(
        ScriptMatch::PromptContains("nudge works".into()),
        vec![Step::text("here you go"), Step::tool_call("structured_output", json!({"city": "Bern", "population": 1}))],
    ));
    let never = scripted(ScriptedModel::new().fallback(Step::text("I refuse to use tools")));
    fixture.register(InProcessProvider::spawn("spawn", nudged.clone()));
    fixture.register(InProcessProvider::spawn("never", never.clone()).with_structured_nudge_retries(2));
    let subagents = fixture.runtime.subagents();
    let (first, second) = (
        fixture.request("nudge works").with_output_schema(city_schema()),
        fixture.request("no capture").with_output_schema(city_schema()),
    );
    let (nudged_result, never_result, never_id) = fixture.runtime.block_on(async move {
        let (nudged_result, _, _) = structured_run(&subagents, first).await;
        let run = subagents.start("never", second).await.unwrap();
        let result = run.result().await.unwrap();
        let id = run.child_id().to_owned();
        run.dispose().await.unwrap();
        (nudged_result, result, id)
    });
    assert_eq!(nudged_result.stop_reason, StopReason::Completed);
    assert_eq!(nudged_result.structured, Some(json!({"city": "Bern", "population": 1})));
    assert_eq!(never_result.stop_reason, StopReason::Error);
    assert_eq!(never_result.structured, None);
    assert_eq!(never_result.diagnostic.unwrap().category, Category::MissingStructuredOutput);
    assert_eq!(never.calls_for(&never_id), 3, "the first answer and two nudges");
}

#[test]
fn a_cancel_after_a_capture_less_finish_settles_aborted() {
    let fixture = Fixture::new();
    let model = scripted(ScriptedModel::new().script(
        ScriptMatch::Any,
        vec![Step::text("done, no capture"), Step::text("late").after(Duration::from_secs(30))],
    ));
    fixture.register(InProcessProvider::spawn("spawn", model.clone()));
    let subagents = fixture.runtime.subagents();
    let request = fixture.request("work").with_output_schema(city_schema());
    let result = fixture.runtime.block_on(async move {
        let run = subagents.start("spawn", request).await.unwrap();
        let agent = child_agent(&run);
        // Wait for the capture-less finish (the first turn end), then cancel
        // during the nudge.
        assert!(common::eventually(Duration::from_secs(10), || agent.events().len() >= 3).await);
        run.cancel();
        let result = run.result().await.unwrap();
        run.dispose().await.unwrap();
        result
    });
    assert_eq!(result.stop_reason, StopReason::Aborted);
}

#[test]
fn concurrent_structured_children_each_see_their_own_schema_and_plain_ones_none() {
    let fixture = Fixture::new();
    let schema_a = json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]});
    let schema_b = json!({"type": "object", "properties": {"b": {"type": "integer"}}, "required": ["b"]});
    let model = scripted(
        ScriptedModel::new()
            .script(
                ScriptMatch::PromptContains("child A".into()),
                vec![Step::tool_call("structured_output", json!({"a": "alpha"})).after(Duration::from_millis(30))],
            )
            .script(
                ScriptMatch::PromptContains("child B".into()),
                vec![Step::tool_call("structured_output", json!({"b": 2})).after(Duration::from_millis(30))],
            ),
    );
    fixture.register(InProcessProvider::spawn("spawn", model.clone()));
    let subagents = fixture.runtime.subagents();
    let a = fixture.request("child A").with_output_schema(schema_a.clone());
    let b = fixture.request("child B").with_output_schema(schema_b.clone());
    let plain = fixture.request("plain child");
    let filtered = fixture.request("child A filtered").with_output_schema(schema_a.clone());
    let filtered = filtered.with_tool_filter(ToolFilter::allow(["read_file"]));
    let (ra, rb, rp, rf) = fixture.runtime.block_on(async move {
        let (ra, rb) = tokio::join!(structured_run(&subagents, a), structured_run(&subagents, b));
        let rp = structured_run(&subagents, plain).await;
        let rf = structured_run(&subagents, filtered).await;
        (ra, rb, rp, rf)
    });
    assert_eq!(ra.0.structured, Some(json!({"a": "alpha"})));
    assert_eq!(rb.0.structured, Some(json!({"b": 2})));
    assert_eq!(rf.0.structured, Some(json!({"a": "alpha"})), "a filter never hides the capture tool");
    let capture_schema = |id: &str| {
        let request = model.requests().into_iter().find(|r| r.session_id == id).unwrap();
        request.tools.iter().find(|t| t.name == "structured_output").map(|t| t.parameters.clone())
    };
    assert_eq!(capture_schema(&ra.2), Some(schema_a));
    assert_eq!(capture_schema(&rb.2), Some(schema_b));
    assert_eq!(capture_schema(&rp.2), None, "a plain child never sees the tool");
    assert_eq!(rp.0.structured, None);
}

#[test]
fn steering_reaches_a_running_child_at_its_next_model_call() {
    let fixture = Fixture::new();
    let wait = FnTool::new("wait", "Waits.", json!({"type": "object"}), |_| {
        std::thread::sleep(Duration::from_millis(100));
        ToolOutput::ok("waited")
    });
    let wait = Arc::new(wait);
    let factory = Arc::new(move |_: &ChildInfo| {
        let mut tools = Toolset::new();
        tools.add_shared(wait.clone()).unwrap();
        tools
    });
    let model = scripted(
        ScriptedModel::new()
            .script(ScriptMatch::Any, vec![Step::tool_call("wait", json!({})).after(Duration::from_millis(50))]),
    );
    fixture.register(InProcessProvider::spawn("spawn", model.clone()).with_tools(factory));
    let subagents = fixture.runtime.subagents();
    let request = fixture.request("long job");
    fixture.runtime.block_on(async move {
        let run = subagents.start("spawn", request).await.unwrap();
        let steering = run.steering().expect("in-process runs accept messages");
        steering.send("also check the tests").await.unwrap();
        run.result().await.unwrap();
        run.dispose().await.unwrap();
    });
    let requests = model.requests();
    assert_eq!(requests[1].last_user_text().as_deref(), Some("also check the tests"));
}

#[test]
fn a_continuation_resumes_the_same_session_at_the_same_depth() {
    let fixture = Fixture::new();
    let model = scripted(ScriptedModel::new());
    fixture.register(InProcessProvider::spawn("spawn", model.clone()));
    let subagents = fixture.runtime.subagents();
    let parent = fixture.parent().with_session("root").with_depth(1);
    let (first_id, second_id, second_text, depth) = fixture.runtime.block_on(async move {
        let run = subagents.start("spawn", StartRequest::new("first", parent, CancellationToken::new())).await.unwrap();
        run.result().await.unwrap();
        let continuation = run.continuation().expect("in-process runs can be continued");
        run.dispose().await.unwrap();
        let next = continuation.start("second", CancellationToken::new()).await.unwrap();
        let result = next.result().await.unwrap();
        let depth = child_agent(&next).header().depth;
        let ids = (run.child_id().to_owned(), next.child_id().to_owned());
        next.dispose().await.unwrap();
        (ids.0, ids.1, result.text(), depth)
    });
    assert_eq!(first_id, second_id, "the same session");
    assert_eq!(second_text, "handled: second");
    assert_eq!(depth, 2, "depth unchanged");
    let last = model.requests().pop().unwrap();
    assert_eq!(last.messages.len(), 4, "the continued turn sees the first one: {:?}", last.messages);
    let (header, events) = fixture.store().read(&first_id).unwrap();
    assert_eq!((header.depth, header.parent_session.as_deref()), (2, Some("root")));
    assert_eq!(events.iter().filter(|e| matches!(e, SessionEvent::TurnEnd { .. })).count(), 2);
    assert_eq!(fixture.session_ids().len(), 1);
}

#[test]
fn spawn_and_fork_coexist_and_model_failures_settle_error_with_a_safe_diagnostic() {
    let fixture = Fixture::new();
    let failing = scripted(ScriptedModel::new().fallback(Step::error("upstream exploded with secret details")));
    fixture.register(InProcessProvider::spawn("spawn", scripted(ScriptedModel::new())));
    fixture.register(InProcessProvider::fork("fork", failing));
    let subagents = fixture.runtime.subagents();
    assert_eq!(subagents.provider_names(), ["spawn", "fork"]);
    let (a, b) = (fixture.request("a"), fixture.request("b"));
    let (ok, failed) = fixture.runtime.block_on(async move {
        let (x, y) = tokio::join!(subagents.start("spawn", a), subagents.start("fork", b));
        let (x, y) = (x.unwrap(), y.unwrap());
        let results = (x.result().await.unwrap(), y.result().await.unwrap());
        x.dispose().await.unwrap();
        y.dispose().await.unwrap();
        results
    });
    assert_eq!(ok.stop_reason, StopReason::Completed);
    assert_eq!(failed.stop_reason, StopReason::Error);
    let diagnostic = failed.diagnostic.unwrap();
    assert_eq!((diagnostic.provider.as_str(), diagnostic.category), ("fork", Category::Model));
    assert!(!serde_json::to_string(&diagnostic).unwrap().contains("secret"));
}

#[test]
fn a_cancelled_child_settles_aborted_and_dispose_leaves_nothing_running() {
    let fixture = Fixture::new();
    let model = scripted(ScriptedModel::new().fallback(Step::text("late").after(Duration::from_secs(30))));
    fixture.register(InProcessProvider::spawn("spawn", model).in_memory());
    let subagents = fixture.runtime.subagents();
    let signal = CancellationToken::new();
    let request = StartRequest::new("slow", fixture.parent(), signal.clone());
    let result = fixture.runtime.block_on(async move {
        let run = subagents.start("spawn", request).await.unwrap();
        signal.cancel();
        let result = run.result().await.unwrap();
        run.dispose().await.unwrap();
        result
    });
    assert_eq!(result.stop_reason, StopReason::Aborted);
    let written = std::fs::read_dir(fixture.home.path().join("sessions")).map_or(0, |entries| entries.count());
    assert_eq!(written, 0, "in-memory sessions write no files");
    assert!(fixture.runtime.live().is_quiescent());
}

#[test]
fn a_continuation_keeps_the_tool_filter_and_disposes_the_previous_run() {
    let fixture = Fixture::new();
    let model = scripted(ScriptedModel::new());
    fixture.register(InProcessProvider::spawn("spawn", model.clone()));
    let subagents = fixture.runtime.subagents();
    let request = fixture.request("first").with_tool_filter(ToolFilter::deny(["read_file"]));
    let live_between = fixture.runtime.block_on(async move {
        let run = subagents.start("spawn", request).await.unwrap();
        run.result().await.unwrap();
        let continuation = run.continuation().unwrap();
        let next = continuation.start("second", CancellationToken::new()).await.unwrap();
        let live_between = subagents.live().runs;
        next.result().await.unwrap();
        next.dispose().await.unwrap();
        run.dispose().await.unwrap(); // already disposed by the continuation: idempotent
        live_between
    });
    assert_eq!(live_between, 1, "the previous run was disposed before the continuation started");
    let requests = model.requests();
    let tools = |n: usize| requests[n].tools.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
    assert_eq!(tools(0), ["list_dir"]);
    assert_eq!(tools(1), ["list_dir"], "the continuation keeps the filter");
}

#[test]
fn a_tool_filter_naming_a_tool_the_child_lacks_is_invalid_before_the_child_exists() {
    let fixture = Fixture::new();
    let model = scripted(ScriptedModel::new());
    fixture.register(InProcessProvider::spawn("spawn", model.clone()));
    let subagents = fixture.runtime.subagents();
    let (allow, deny) = (
        fixture.request("look").with_tool_filter(ToolFilter::allow(["write_file"])),
        fixture.request("look").with_tool_filter(ToolFilter::deny(["read_file", "shell"])),
    );
    let errors = fixture.runtime.block_on(async move {
        let allow = subagents.start("spawn", allow).await.expect_err("refused");
        let deny = subagents.start("spawn", deny).await.expect_err("refused");
        (allow, deny)
    });
    for (error, name) in [(&errors.0, "write_file"), (&errors.1, "shell")] {
        assert_eq!(error.code(), "INVALID_REQUEST", "{error}");
        assert!(error.to_string().contains(name) && error.to_string().contains("read_file"), "{error}");
    }
    assert!(fixture.session_ids().is_empty(), "no child session was created");
    assert_eq!(model.calls(), 0);
    assert!(fixture.runtime.live().is_quiescent());
}

#[test]
fn a_continuation_takes_the_options_of_a_start_and_keeps_the_parent() {
    let fixture = Fixture::new();
    // The demo model fills a structured-output schema when it sees one.
    let model = scripted(ScriptedModel::demo());
    fixture.register(InProcessProvider::spawn("spawn", model.clone()));
    let subagents = fixture.runtime.subagents();
    let parent = fixture.parent().with_session("root").with_depth(1);
    let mut events = subagents.subscribe();
    let (result, header_cwd) = fixture.runtime.block_on(async move {
        let run = subagents.start("spawn", StartRequest::new("first", parent, CancellationToken::new())).await.unwrap();
        run.result().await.unwrap();
        let continuation = run.continuation().unwrap();
        let request = StartRequest::new("second", Parent::root("/ignored"), CancellationToken::new())
            .with_label("the second turn")
            .with_persona("You are terse.")
            .with_output_schema(
                json!({"type": "object", "properties": {"verdict": {"type": "string"}}, "required": ["verdict"]}),
            );
        let next = continuation.start_with(request).await.unwrap();
        let result = next.result().await.unwrap();
        let header_cwd = child_agent(&next).header().cwd;
        next.dispose().await.unwrap();
        (result, header_cwd)
    });
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert!(result.structured.as_ref().is_some_and(|v| v["verdict"].is_string()), "{result:?}");
    assert_eq!(header_cwd, fixture.cwd.path(), "the session keeps its cwd");
    let last = model.requests().pop().unwrap();
    assert!(last.system.starts_with("You are terse."), "the persona applies: {}", last.system);
    let mut second_start = None;
    while let Some(Ok(event)) = events.try_recv() {
        if let subagents::SubagentEvent::Start(info) = event {
            if info.label.as_deref() == Some("the second turn") {
                second_start = Some(info);
            }
        }
    }
    let info = second_start.expect("the continuation's Start carries its label");
    assert_eq!(info.parent_session.as_deref(), Some("root"), "the parent is the previous run's");
}

/// Set in the copy of this test binary that the test below starts in an
/// empty working directory.
const NO_HOME_CHILD: &str = "SUBAGENTS_TEST_NO_HOME_CHILD";

#[test]
fn a_runtime_told_no_home_writes_nothing_to_the_working_directory_and_removes_its_own() {
    if std::env::var_os(NO_HOME_CHILD).is_some() {
        // The child: a runtime without `.home()` runs a spawn child whose
        // session is persisted, then shuts down; it prints where it kept it.
        let runtime = Runtime::builder().workers(1).build().unwrap();
        let subagents = runtime.subagents();
        subagents.register_provider(InProcessProvider::spawn("spawn", scripted(ScriptedModel::new()))).unwrap().keep();
        let cwd = std::env::current_dir().unwrap();
        let result = runtime.block_on(async move {
            let request = StartRequest::new("hello", Parent::root(cwd), CancellationToken::new());
            subagents.run_to_end("spawn", request).await.unwrap()
        });
        assert_eq!(result.stop_reason, StopReason::Completed);
        let home = runtime.home();
        assert!(SessionStore::new(&home).ids().unwrap().len() == 1, "the session was kept under {home:?}");
        println!("home={}", home.display());
        runtime.shutdown_blocking();
        return;
    }
    let cwd = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "in_process::a_runtime_told_no_home_writes_nothing_to_the_working_directory_and_removes_its_own",
        ])
        .args(["--nocapture", "--test-threads", "1"])
        .current_dir(cwd.path())
        .env(NO_HOME_CHILD, "1")
        .env_remove("SUBAGENTS_HOME")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    let home = stdout
        .lines()
        .find_map(|line| line.split_once("home=").map(|(_, home)| home))
        .unwrap_or_else(|| panic!("no home named: {stdout}"));
    let home = std::path::Path::new(home);
    assert!(!home.starts_with(cwd.path()), "{home:?} is under the working directory");
    assert!(!home.exists(), "{home:?} outlived its runtime");
    let left: Vec<_> = std::fs::read_dir(cwd.path()).unwrap().flatten().map(|entry| entry.file_name()).collect();
    assert!(left.is_empty(), "the runtime wrote {left:?} to its working directory");
}

/// The conformance kit (`subagents::testing`) over both in-process
/// providers on the demo model, whose `[delay:MS]` keeps a run working
/// long enough to be cancelled mid-way.
#[cfg(feature = "testing")]
#[test]
fn spawn_and_fork_pass_the_conformance_kit_and_spawn_the_seeded_faults() {
    use subagents::testing::{conformance, Verdict};
    for fork in [false, true] {
        let report = conformance(move || {
            let model = Arc::new(ScriptedModel::demo());
            let provider =
                if fork { InProcessProvider::fork("fork", model) } else { InProcessProvider::spawn("spawn", model) };
            provider.in_memory()
        })
        .long_prompt("Say hello. [delay:5000]")
        .cancel_grace(Duration::from_millis(500))
        .run_blocking();
        report.assert_conformant();
        assert_eq!(report.with_verdict(Verdict::NotExercised).count(), 0, "{report}");
    }
    let faults =
        subagents::testing::faults(|| InProcessProvider::spawn("spawn", Arc::new(ScriptedModel::demo())).in_memory());
    faults.seeds(0..4).run_blocking().assert_held();
}
