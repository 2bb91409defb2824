//! docs/contract.md §9: the model-facing subagent tool and background tasks, driven by
//! agents on the scripted model.

use std::sync::Arc;
use std::time::Duration;

use crate::common::{self, tool_results};
use serde_json::{json, Value};
use subagents::agent::{Agent, ScriptMatch, ScriptedModel, SessionEvent, Step, ToolError, Toolset};
use subagents::providers::{InProcessProvider, MockProvider};
use subagents::seam::{Capabilities, Capability};
use subagents::tool::{KillOutcome, MaxDepth, SubagentTool, SubagentToolConfig, TaskService, TaskStatus};
use subagents::{Runtime, StopReason, Subagents};

fn runtime() -> (Runtime, tempfile::TempDir) {
    let home = tempfile::tempdir().unwrap();
    (common::in_process_runtime(home.path()), home)
}

fn delegate(prompt: &str) -> Step {
    Step::tool_call("subagent", json!({"description": "a small task", "prompt": prompt}))
}

/// A parent whose model calls `calls` then answers "parent done".
fn parent(model: ScriptedModel, tools: Vec<Arc<dyn subagents::agent::Tool>>) -> Agent {
    let mut builder = Agent::builder(model.recording()).cwd(std::env::temp_dir());
    for tool in tools {
        builder.toolset_mut().add_shared(tool).unwrap();
    }
    builder.build().unwrap()
}

fn mount(
    subagents: &Subagents,
    config: SubagentToolConfig,
    tasks: Option<TaskService>,
) -> Arc<dyn subagents::agent::Tool> {
    Arc::new(SubagentTool::mount(subagents, config, tasks).unwrap())
}

#[test]
fn a_foreground_run_returns_its_output_and_is_disposed() {
    let (runtime, _home) = runtime();
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("mock").with_reply("child says hi")).unwrap().keep();
    let tool = mount(&subagents, SubagentToolConfig::new("mock").with_background(false), None);
    let agent =
        parent(ScriptedModel::new().script(ScriptMatch::Any, vec![delegate("greet"), Step::text("done")]), vec![tool]);
    let outcome = runtime.block_on({
        let agent = agent.clone();
        async move { agent.prompt("go").await }
    });
    assert_eq!(outcome.stop_reason, StopReason::Completed);
    let (_, content, is_error) = &tool_results(&agent.events())[0];
    assert!(!is_error);
    let value: Value = serde_json::from_str(content).unwrap();
    assert_eq!(value["kind"], "foreground");
    assert_eq!(value["output"], "child says hi");
    assert!(value["run_id"].as_str().unwrap().starts_with("mock:mock:"));
    assert!(runtime.live().is_quiescent(), "the run was disposed: {:?}", runtime.live());
}

#[test]
fn each_non_completed_stop_is_a_tool_error_with_its_text() {
    let (runtime, _home) = runtime();
    let subagents = runtime.subagents();
    let cases = [
        (StopReason::Error, "subagent run failed"),
        (StopReason::MaxTokens, "subagent run hit its token limit before finishing"),
        (StopReason::Refusal, "subagent declined the task"),
    ];
    for (reason, text) in cases {
        let name = format!("mock-{reason}");
        subagents.register_provider(MockProvider::new(&name).with_stop_reason(reason)).unwrap().keep();
        let tool = mount(&subagents, SubagentToolConfig::new(&name).with_background(false), None);
        let agent =
            parent(ScriptedModel::new().script(ScriptMatch::Any, vec![delegate("x"), Step::text("ok")]), vec![tool]);
        runtime.block_on({
            let agent = agent.clone();
            async move { agent.prompt("go").await }
        });
        let (_, content, is_error) = tool_results(&agent.events()).remove(0);
        assert_eq!((content, is_error), (text.to_owned(), true), "{reason}");
    }
    assert!(runtime.live().is_quiescent());
}

#[test]
fn cancelling_the_calling_turn_cancels_the_foreground_run() {
    let (runtime, _home) = runtime();
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("slow").with_delay(Duration::from_secs(30))).unwrap().keep();
    let tool = mount(&subagents, SubagentToolConfig::new("slow").with_background(false), None);
    let agent = parent(ScriptedModel::new().script(ScriptMatch::Any, vec![delegate("wait")]), vec![tool]);
    let live = subagents.clone();
    let outcome = runtime.block_on({
        let agent = agent.clone();
        async move {
            let canceller = agent.clone();
            actix::spawn(async move {
                while live.live().runs == 0 {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                canceller.cancel();
            });
            agent.prompt("go").await
        }
    });
    assert_eq!(outcome.stop_reason, StopReason::Aborted);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !runtime.live().is_quiescent() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(runtime.live().is_quiescent(), "the child was cancelled and disposed: {:?}", runtime.live());
}

#[test]
fn the_prompt_wording_follows_whether_the_child_inherits_the_conversation() {
    let (runtime, _home) = runtime();
    let subagents = runtime.subagents();
    let model: Arc<ScriptedModel> = Arc::new(ScriptedModel::new());
    subagents.register_provider(InProcessProvider::spawn("spawn", model.clone())).unwrap().keep();
    subagents.register_provider(InProcessProvider::fork("fork", model)).unwrap().keep();
    let wording = |provider: &str| {
        let tool = SubagentTool::mount(&subagents, SubagentToolConfig::new(provider).with_background(false), None);
        let spec = subagents::agent::Tool::spec(&tool.unwrap());
        spec.parameters["properties"]["prompt"]["description"].as_str().unwrap().to_owned()
    };
    assert!(wording("spawn").contains("complete, standalone prompt"));
    assert!(wording("fork").contains("inherits this conversation; state only what is new"));
    let tasks = TaskService::new();
    let with_background = SubagentTool::mount(&subagents, SubagentToolConfig::new("spawn"), Some(tasks)).unwrap();
    let spec = subagents::agent::Tool::spec(&with_background);
    assert!(spec.parameters["properties"]["run_in_background"].is_object());
    assert_eq!(spec.parameters["required"], json!(["description", "prompt"]));
    runtime.shutdown_blocking();
}

#[test]
fn the_tool_follows_its_provider_being_removed_and_added() {
    let (runtime, _home) = runtime();
    let subagents = runtime.subagents();
    let registration = subagents.register_provider(MockProvider::new("mock")).unwrap();
    let tool = mount(&subagents, SubagentToolConfig::new("mock").with_background(false), None);
    let model = ScriptedModel::new().recording();
    let mut builder = Agent::builder(model.clone()).cwd(std::env::temp_dir());
    builder.toolset_mut().add_shared(tool).unwrap();
    let agent = builder.build().unwrap();
    let names =
        |request: &subagents::agent::ModelRequest| request.tools.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
    assert_eq!(agent.tool_specs().len(), 1);
    registration.remove();
    assert!(agent.tool_specs().is_empty(), "gone with its provider");
    runtime.block_on({
        let agent = agent.clone();
        async move { agent.prompt("first").await }
    });
    assert!(names(&model.requests()[0]).is_empty());
    subagents.register_provider(MockProvider::new("mock")).unwrap().keep();
    runtime.block_on({
        let agent = agent.clone();
        async move { agent.prompt("second").await }
    });
    assert_eq!(names(&model.requests()[1]), ["subagent"], "back with its provider");
}

#[test]
fn tool_names_are_unique_and_several_providers_can_be_exposed_at_once() {
    let (runtime, _home) = runtime();
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("fast").with_reply("from fast")).unwrap().keep();
    subagents.register_provider(MockProvider::new("careful").with_reply("from careful")).unwrap().keep();
    let fast = SubagentTool::mount(&subagents, SubagentToolConfig::new("fast").with_background(false), None).unwrap();
    let duplicate = SubagentTool::mount(&subagents, SubagentToolConfig::new("careful").with_background(false), None);
    let mut tools = Toolset::new();
    tools.add(fast).unwrap();
    assert!(matches!(tools.add(duplicate.unwrap()), Err(ToolError::Duplicate(name)) if name == "subagent"));
    let careful = SubagentToolConfig::new("careful").with_tool_name("careful_subagent").with_background(false);
    tools.add(SubagentTool::mount(&subagents, careful, None).unwrap()).unwrap();
    let model = ScriptedModel::new().script(
        ScriptMatch::Any,
        vec![
            Step::tool_calls([
                ("subagent", json!({"description": "d", "prompt": "a"})),
                ("careful_subagent", json!({"description": "d", "prompt": "b"})),
            ]),
            Step::text("ok"),
        ],
    );
    let agent = Agent::builder(model).cwd(std::env::temp_dir()).toolset(tools).build().unwrap();
    runtime.block_on({
        let agent = agent.clone();
        async move { agent.prompt("go").await }
    });
    let outputs: Vec<Value> =
        tool_results(&agent.events()).iter().map(|(_, c, _)| serde_json::from_str(c).unwrap()).collect();
    assert_eq!(outputs[0]["output"], "from fast");
    assert_eq!(outputs[1]["output"], "from careful");
}

#[test]
fn mounting_checks_the_configuration_against_the_provider() {
    let (runtime, _home) = runtime();
    let subagents = runtime.subagents();
    let plain = MockProvider::new("plain").with_capabilities(Capabilities::none());
    subagents.register_provider(plain).unwrap().keep();
    let depth = SubagentTool::mount(&subagents, SubagentToolConfig::new("plain").with_background(false), None);
    let error = depth.unwrap_err();
    assert_eq!(error.code(), "UNSUPPORTED_CAPABILITY");
    assert!(error.to_string().contains(Capability::DepthLimit.name()));
    let managed = SubagentToolConfig::new("plain").with_max_depth(MaxDepth::ProviderManaged).with_background(false);
    assert!(SubagentTool::mount(&subagents, managed.clone(), None).is_ok());
    let persona = managed.clone().with_persona("terse");
    assert_eq!(SubagentTool::mount(&subagents, persona, None).unwrap_err().code(), "UNSUPPORTED_CAPABILITY");
    let missing = SubagentTool::mount(&subagents, SubagentToolConfig::new("nowhere"), None);
    assert_eq!(missing.unwrap_err().code(), "NO_PROVIDER");
    let background = managed.with_background(true);
    assert_eq!(SubagentTool::mount(&subagents, background, None).unwrap_err().code(), "INVALID_REQUEST");
}

#[test]
fn max_depth_zero_forbids_delegation_with_a_clear_tool_error() {
    let (runtime, _home) = runtime();
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("mock")).unwrap().keep();
    let config = SubagentToolConfig::new("mock").with_max_depth(MaxDepth::Limit(0)).with_background(false);
    let agent = parent(
        ScriptedModel::new().script(ScriptMatch::Any, vec![delegate("x"), Step::text("ok")]),
        vec![mount(&subagents, config, None)],
    );
    runtime.block_on({
        let agent = agent.clone();
        async move { agent.prompt("go").await }
    });
    let (_, error, is_error) = &tool_results(&agent.events())[0];
    assert!(*is_error && error.contains("depth 1") && error.contains("max_depth 0"), "{error}");
}

fn background_call(prompt: &str) -> Step {
    Step::tool_call("subagent", json!({"description": "bg", "prompt": prompt, "run_in_background": true}))
}

#[test]
fn a_background_run_returns_a_task_id_at_once_and_is_collected_later() {
    let (runtime, _home) = runtime();
    let subagents = runtime.subagents();
    let slow = MockProvider::new("mock").with_reply("background result").with_delay(Duration::from_millis(300));
    subagents.register_provider(slow).unwrap().keep();
    let tasks = TaskService::new();
    let tool = mount(&subagents, SubagentToolConfig::new("mock"), Some(tasks.clone()));
    let agent = parent(
        ScriptedModel::new().script(ScriptMatch::Any, vec![background_call("work"), Step::text("started")]),
        vec![tool],
    );
    let started = std::time::Instant::now();
    runtime.block_on({
        let agent = agent.clone();
        async move { agent.prompt("go").await }
    });
    assert!(started.elapsed() < Duration::from_millis(300), "the turn did not wait for the run");
    let value: Value = serde_json::from_str(&tool_results(&agent.events())[0].1).unwrap();
    assert_eq!(value["kind"], "background");
    let task_id = value["task_id"].as_str().unwrap().to_owned();
    let owner = agent.id().to_owned();

    let (early, done, listed, stranger, kill_after) = runtime.block_on({
        let tasks = tasks.clone();
        async move {
            let early = tasks.output(&owner, &task_id, true, Duration::from_millis(10)).await.unwrap();
            let done = tasks.output(&owner, &task_id, true, Duration::from_secs(10)).await.unwrap();
            let listed = tasks.list(&owner);
            let stranger = tasks.output("another-session", &task_id, false, Duration::ZERO).await;
            let kill_after = tasks.kill(&owner, &task_id, None).unwrap();
            (early, done, listed, stranger, kill_after)
        }
    });
    assert_eq!(early.status, TaskStatus::Running, "a timed-out wait leaves the task running");
    assert_eq!(done.status, TaskStatus::Completed);
    assert_eq!(done.output.as_deref(), Some("background result"));
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].label, "bg");
    assert!(stranger.is_err(), "another session cannot see the task");
    assert_eq!(kill_after, KillOutcome::AlreadyFinished);
    assert!(runtime.live().is_quiescent());
}

#[test]
fn killing_a_background_task_stops_its_run_and_other_sessions_cannot() {
    let (runtime, _home) = runtime();
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("mock").with_delay(Duration::from_secs(30))).unwrap().keep();
    let tasks = TaskService::new();
    let tool = mount(&subagents, SubagentToolConfig::new("mock"), Some(tasks.clone()));
    let [output_tool, list_tool, kill_tool] = tasks.tools();
    let model = ScriptedModel::new().script(
        ScriptMatch::Any,
        vec![
            background_call("long"),
            Step::tool_call("task_list", json!({})),
            Step::tool_call("task_kill", json!({"task_id": "task-1", "reason": "no longer needed"})),
            Step::tool_call("task_output", json!({"task_id": "task-1", "timeout_ms": 10000})),
            Step::text("stopped it"),
        ],
    );
    let agent = parent(model, vec![tool, output_tool.clone(), list_tool, kill_tool.clone()]);
    runtime.block_on({
        let agent = agent.clone();
        async move { agent.prompt("go").await }
    });
    let results = tool_results(&agent.events());
    assert!(results[1].1.contains("\"status\":\"running\""), "{}", results[1].1);
    assert!(results[2].1.contains("\"outcome\":\"requested\""), "{}", results[2].1);
    let final_state: Value = serde_json::from_str(&results[3].1).unwrap();
    assert_eq!(final_state["status"], "killed");
    assert!(final_state["error"].as_str().unwrap().contains("no longer needed"));
    assert!(runtime.live().is_quiescent(), "the killed run was disposed: {:?}", runtime.live());

    // Another session's agent, with the same tools, sees no such task.
    let stranger = parent(
        ScriptedModel::new().script(
            ScriptMatch::Any,
            vec![Step::tool_call("task_kill", json!({"task_id": "task-1"})), Step::text("ok")],
        ),
        vec![output_tool, kill_tool],
    );
    runtime.block_on({
        let stranger = stranger.clone();
        async move { stranger.prompt("go").await }
    });
    let (_, content, is_error) = tool_results(&stranger.events()).remove(0);
    assert_eq!((content, is_error), ("no task \"task-1\" for this session".to_owned(), true));
}

#[test]
fn a_background_run_outlives_the_calling_turn_and_posts_one_notice() {
    let (runtime, _home) = runtime();
    let subagents = runtime.subagents();
    let slow = MockProvider::new("mock").with_reply("late news").with_delay(Duration::from_millis(200));
    subagents.register_provider(slow).unwrap().keep();
    let tasks = TaskService::new();
    let tool = mount(&subagents, SubagentToolConfig::new("mock"), Some(tasks.clone()));
    let model = ScriptedModel::new().script(
        ScriptMatch::Any,
        vec![background_call("work"), Step::text("first turn over").after(Duration::from_secs(30))],
    );
    let model = model.recording();
    let mut builder = Agent::builder(model.clone()).cwd(std::env::temp_dir());
    builder.toolset_mut().add_shared(tool).unwrap();
    let agent = builder.build().unwrap();
    let owner = agent.id().to_owned();
    let status = runtime.block_on({
        let agent = agent.clone();
        let tasks = tasks.clone();
        async move {
            // Cancel the calling turn right after the tool returned.
            let canceller = agent.clone();
            actix::spawn(async move {
                tokio::time::sleep(Duration::from_millis(50)).await;
                canceller.cancel();
            });
            assert_eq!(agent.prompt("go").await.stop_reason, StopReason::Aborted);
            // Watch without collecting (a waiting task_output collects, and
            // then no notice is needed).
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while tasks.list(&owner)[0].status == TaskStatus::Running && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            // Two more turns: the notice arrives once.
            agent.prompt("next").await;
            agent.prompt("and next").await;
            tasks.output(&owner, "task-1", false, Duration::ZERO).await.unwrap().status
        }
    });
    assert_eq!(status, TaskStatus::Completed, "the tool call's cancellation did not reach the background run");
    let notices: usize = model
        .requests()
        .iter()
        .map(|r| {
            r.messages
                .iter()
                .filter(|e| matches!(e, SessionEvent::User { content } if subagents::seam::text_of(content).contains("Background task task-1")))
                .count()
        })
        .max()
        .unwrap();
    // Collected through output() before the notice was read? The notice was
    // posted at completion (before collection), so it is in the log once.
    assert_eq!(notices, 1);
}

#[test]
fn shutting_the_owner_down_cancels_and_awaits_its_tasks() {
    let (runtime, _home) = runtime();
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("mock").with_delay(Duration::from_secs(30))).unwrap().keep();
    let tasks = TaskService::new();
    let tool = mount(&subagents, SubagentToolConfig::new("mock"), Some(tasks.clone()));
    let model = ScriptedModel::new().script(
        ScriptMatch::Any,
        vec![
            Step::tool_calls([
                ("subagent", json!({"description": "a", "prompt": "a", "run_in_background": true})),
                ("subagent", json!({"description": "b", "prompt": "b", "run_in_background": true})),
            ]),
            Step::text("started"),
        ],
    );
    let agent = parent(model, vec![tool]);
    runtime.block_on({
        let agent = agent.clone();
        let tasks = tasks.clone();
        async move {
            agent.prompt("go").await;
            assert_eq!(tasks.running(), 2);
            agent.shutdown().await.unwrap();
            assert_eq!(tasks.running(), 0);
            assert!(tasks.list(agent.id()).is_empty(), "the owner's tasks are forgotten");
        }
    });
    assert!(runtime.live().is_quiescent(), "{:?}", runtime.live());
}

#[test]
fn an_agent_at_its_depth_cap_is_not_offered_the_subagent_tool() {
    let (runtime, _home) = runtime();
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("mock")).unwrap().keep();
    let offered_at = |depth: u32, max_depth: MaxDepth| {
        let config = SubagentToolConfig::new("mock").with_max_depth(max_depth).with_background(false);
        let mut builder = Agent::builder(ScriptedModel::new()).cwd(std::env::temp_dir()).parent(None, depth);
        builder.toolset_mut().add_shared(mount(&subagents, config, None)).unwrap();
        let agent = builder.build().unwrap();
        agent.tool_specs().iter().any(|spec| spec.name == "subagent")
    };
    assert!(offered_at(0, MaxDepth::Limit(3)));
    assert!(offered_at(2, MaxDepth::Limit(3)), "a child at depth 3 is still allowed");
    assert!(!offered_at(3, MaxDepth::Limit(3)), "at the cap a child would have depth 4");
    assert!(!offered_at(0, MaxDepth::Limit(0)), "max_depth 0 forbids delegation");
    assert!(offered_at(7, MaxDepth::ProviderManaged), "no cap is sent, so none is known here");
}

#[test]
fn children_share_one_delegating_kit_without_the_subagent_tool_at_the_cap() {
    use subagents::providers::ChildInfo;
    use subagents::tool::shared_delegating_toolset;
    use subagents::{CancellationToken, Parent, StartRequest};
    let (runtime, home) = runtime();
    let subagents = runtime.subagents();
    let tasks = TaskService::new();
    let kit = shared_delegating_toolset(&subagents, &tasks, "spawn", 3);
    let spawn = InProcessProvider::spawn("spawn", Arc::new(ScriptedModel::new()))
        .with_tools(Arc::new(move |_: &ChildInfo| kit()));
    subagents.register_provider(spawn).unwrap().keep();
    let cwd = home.path().to_path_buf();
    let tools_at = move |parent_depth: u32| {
        let (subagents, cwd) = (subagents.clone(), cwd.clone());
        runtime.block_on(async move {
            let parent = Parent::root(&cwd).with_depth(parent_depth);
            let run =
                subagents.start("spawn", StartRequest::new("hi", parent, CancellationToken::new())).await.unwrap();
            let agent = run.agent().unwrap();
            let names: Vec<String> = agent.tool_specs().into_iter().map(|spec| spec.name).collect();
            run.dispose().await.unwrap();
            names
        })
    };
    let full = ["read_file", "list_dir", "subagent", "task_output", "task_list", "task_kill"];
    assert_eq!(tools_at(0), full, "a child at depth 1 can delegate");
    assert_eq!(tools_at(1), full, "at depth 2 too");
    let at_cap = tools_at(2);
    assert!(!at_cap.contains(&"subagent".to_owned()), "a child at depth 3 is at the cap: {at_cap:?}");
    assert!(at_cap.contains(&"read_file".to_owned()));
}

/// A tool context for `agent` as a root caller, with its own cancellation.
fn root_context(agent: &Agent, cancel: subagents::CancellationToken) -> subagents::agent::ToolContext {
    subagents::agent::ToolContext {
        agent: agent.clone(),
        session_id: agent.id().into(),
        cwd: agent.cwd().into(),
        call_id: "call".to_owned(),
        cancel,
    }
}

#[test]
fn a_run_limit_queues_the_calls_beyond_it_and_a_queued_call_can_be_cancelled() {
    use subagents::tool::{Delegated, Delegation};
    let (runtime, _home) = runtime();
    let subagents = runtime.subagents();
    let mock = MockProvider::new("mock").with_reply("done").with_delay(Duration::from_millis(300));
    subagents.register_provider(mock).unwrap().keep();
    let tool = SubagentTool::mount(&subagents, SubagentToolConfig::new("mock").with_background(false), None)
        .unwrap()
        .with_run_limit(Arc::new(tokio::sync::Semaphore::new(2)));
    let agent = parent(ScriptedModel::new(), vec![]);
    let (elapsed, answers, queued) =
        runtime.block_on(async move {
            let began = std::time::Instant::now();
            let calls = (0..4).map(|n| {
                let (tool, context) = (tool.clone(), root_context(&agent, subagents::CancellationToken::new()));
                async move {
                    tool.delegate(Delegation { prompt: format!("task {n}"), ..Delegation::default() }, &context).await
                }
            });
            let answers = futures_util::future::join_all(calls).await;
            let elapsed = began.elapsed();
            // Both places taken by slow runs: a third call queues, and its
            // cancellation ends it without a run.
            let hold = |n: u32| {
                let (tool, context) = (tool.clone(), root_context(&agent, subagents::CancellationToken::new()));
                async move {
                    tool.delegate(Delegation { prompt: format!("hold {n}"), ..Delegation::default() }, &context).await
                }
            };
            let cancel = subagents::CancellationToken::new();
            let queued_context = root_context(&agent, cancel.clone());
            let queued = async {
                tokio::time::sleep(Duration::from_millis(50)).await;
                cancel.cancel();
                tool.delegate(Delegation { prompt: "queued".into(), ..Delegation::default() }, &queued_context).await
            };
            let (_, _, queued) = tokio::join!(hold(1), hold(2), queued);
            (elapsed, answers, queued)
        });
    assert!(answers.iter().all(|a| matches!(a, Ok(Delegated::Foreground { output, .. }) if output == "done")));
    assert!(elapsed >= Duration::from_millis(600), "two at a time, so two rounds of 300 ms: {elapsed:?}");
    assert_eq!(queued.map_err(|error| error.to_string()), Err("subagent run was cancelled".to_owned()));
    assert!(runtime.live().is_quiescent());
}

#[test]
fn a_delegation_may_ask_for_a_structured_result_where_the_provider_supports_it() {
    use subagents::tool::{Delegated, Delegation};
    let (runtime, home) = runtime();
    let subagents = runtime.subagents();
    subagents.register_provider(InProcessProvider::spawn("spawn", Arc::new(ScriptedModel::demo()))).unwrap().keep();
    subagents.register_provider(MockProvider::new("plain").with_capabilities(Capabilities::none())).unwrap().keep();
    let tool = SubagentTool::mount(&subagents, SubagentToolConfig::new("spawn").with_background(false), None).unwrap();
    let plain = SubagentTool::mount(
        &subagents,
        SubagentToolConfig::new("plain").with_max_depth(MaxDepth::ProviderManaged).with_background(false),
        None,
    )
    .unwrap();
    let agent = Agent::builder(ScriptedModel::new()).cwd(home.path()).build().unwrap();
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    let delegation = Delegation {
        description: "find a city".into(),
        prompt: "name a city".into(),
        output_schema: Some(schema),
        ..Delegation::default()
    };
    let (structured, refused) = runtime.block_on({
        let delegation = delegation.clone();
        async move {
            let context = root_context(&agent, subagents::CancellationToken::new());
            (tool.delegate(delegation.clone(), &context).await, plain.delegate(delegation, &context).await)
        }
    });
    let structured = structured.unwrap();
    let Delegated::Foreground { structured: Some(value), .. } = &structured else { panic!("{structured:?}") };
    assert!(value["city"].is_string(), "{value}");
    assert_eq!(structured.to_json()["structured"], *value);
    let refused = refused.unwrap_err().to_string();
    assert!(refused.starts_with("could not start the subagent") && refused.contains("output_schema"), "{refused}");
    assert!(runtime.live().is_quiescent());
}
