//! docs/contract.md §11.3 delegation budget: one lease of depth, width, total runs,
//! tokens and deadline, set on a root and inherited down the tree; the next
//! start that would exceed it is refused before any child exists
//! (`BUDGET_EXHAUSTED`), and a child out of tokens or time stops with its
//! partial output.

use crate::common;
use common::in_process_runtime as runtime;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use serde_json::json;
use subagents::agent::{Agent, ModelReply, ScriptedModel, SessionEvent, Step, Tool};
use subagents::providers::{ChildInfo, InProcessProvider, MockProvider};
use subagents::seam::{BudgetLease, BudgetLimit};
use subagents::tool::{shared_delegating_toolset, MaxDepth, SubagentTool, SubagentToolConfig, TaskService};
use subagents::{
    Budget, CancellationToken, Parent, Runtime, StartError, StartRequest, StopReason, SubagentEvent, Subagents,
};

/// The text of the latest tool result of the current turn, if any.
fn latest_result(messages: &[SessionEvent]) -> Option<&str> {
    let turn_start = messages.iter().rposition(|e| matches!(e, SessionEvent::User { .. }))?;
    messages[turn_start..].iter().rev().find_map(|event| match event {
        SessionEvent::ToolResult { content, .. } => Some(content.as_str()),
        _ => None,
    })
}

/// A runaway model: every agent delegates again, whatever its children
/// answered, until it reads a budget refusal; then it answers with it.
fn runaway(delay: Duration) -> ScriptedModel {
    let step = Step::respond(|request| match latest_result(&request.messages) {
        Some(result) if result.contains("BUDGET_EXHAUSTED") => Ok(ModelReply::text(format!("stopped: {result}"))),
        _ => Ok(subagents::agent::ModelReply {
            text: String::new(),
            tool_calls: vec![subagents::agent::ToolCall {
                id: "call_0".to_owned(),
                name: "subagent".to_owned(),
                arguments: json!({"description": "more of the same", "prompt": "keep delegating"}),
            }],
            finish: subagents::agent::Finish::ToolCalls,
            usage: None,
        }),
    });
    ScriptedModel::new().fallback(if delay.is_zero() { step } else { step.after(delay) })
}

/// A runtime whose `spawn` children run `model` and may delegate to `spawn`
/// (up to the representable depth: only the budget stops them), and a root
/// agent on the same model and kit.
struct Tree {
    runtime: Runtime,
    subagents: Subagents,
    home: tempfile::TempDir,
    model: Arc<ScriptedModel>,
}

impl Tree {
    fn new(model: ScriptedModel) -> Tree {
        let home = tempfile::tempdir().unwrap();
        let runtime = runtime(home.path());
        let subagents = runtime.subagents();
        let model = Arc::new(model);
        let kit = shared_delegating_toolset(&subagents, &TaskService::new(), "spawn", 1000);
        let spawn = InProcessProvider::spawn("spawn", model.clone()).with_tools(Arc::new(move |_: &ChildInfo| kit()));
        subagents.register_provider(spawn).unwrap().keep();
        Tree { runtime, subagents, home, model }
    }

    /// The root agent, with a `subagent` tool configured by `config`.
    fn root(&self, config: SubagentToolConfig, lease: Option<BudgetLease>) -> Agent {
        let tool: Arc<dyn Tool> = Arc::new(SubagentTool::mount(&self.subagents, config, None).unwrap());
        let mut builder = Agent::builder_shared(self.model.clone()).cwd(self.home.path());
        builder.toolset_mut().add_shared(tool).unwrap();
        if let Some(lease) = lease {
            builder = builder.budget(lease);
        }
        builder.build().unwrap()
    }

    fn config() -> SubagentToolConfig {
        SubagentToolConfig::new("spawn").with_max_depth(MaxDepth::Limit(1000)).with_background(false)
    }

    /// Runs one root turn and counts the runs the tree started.
    fn drive(&self, root: &Agent) -> (subagents::agent::TurnOutcome, usize) {
        let mut events = self.subagents.subscribe();
        let outcome = self.runtime.block_on({
            let root = root.clone();
            async move { root.prompt("start the work").await }
        });
        let starts = std::iter::from_fn(|| events.try_recv())
            .filter(|event| matches!(event, Ok(SubagentEvent::Start(_))))
            .count();
        // A turn stopped at its deadline drops its children's runs, which
        // dispose themselves: wait for that, generously.
        let runtime_live = self.subagents.clone();
        let quiet = self.runtime.block_on(async move {
            common::eventually(Duration::from_secs(20), || runtime_live.live().is_quiescent()).await
        });
        assert!(quiet, "nothing left behind: {:?}", self.runtime.live());
        (outcome, starts)
    }
}

#[test]
fn a_runaway_model_is_stopped_at_the_total_runs_limit_and_reads_the_refusal() {
    let tree = Tree::new(runaway(Duration::ZERO));
    // Set on the tool's config: the root opens it at its first delegation.
    let root = tree.root(Tree::config().with_budget(Budget::new().with_runs(5)), None);
    let (outcome, starts) = tree.drive(&root);
    assert_eq!(starts, 5, "exactly the budget's runs were started");
    assert_eq!(outcome.stop_reason, StopReason::Completed);
    assert!(
        outcome.output.contains(
            "delegation refused (BUDGET_EXHAUSTED): budget exhausted: total runs 5 of 5 used; no subagent was started"
        ),
        "the deepest child read the refusal and it came back up the tree: {}",
        outcome.output
    );
    assert_eq!(root.budget().unwrap().runs_used(), 5);
}

#[test]
fn a_runaway_model_is_stopped_at_the_depth_limit() {
    let tree = Tree::new(runaway(Duration::ZERO));
    let root = tree.root(Tree::config(), Some(Budget::new().with_depth(3).lease()));
    let (outcome, starts) = tree.drive(&root);
    assert_eq!(starts, 3, "three levels below the root");
    assert!(
        outcome.output.contains("budget exhausted: depth: the child would be 4 levels down, of 3 allowed"),
        "{}",
        outcome.output
    );
}

#[test]
fn a_runaway_model_is_stopped_at_the_token_limit_with_max_tokens() {
    let tree = Tree::new(runaway(Duration::ZERO));
    let lease = Budget::new().with_tokens(200).lease();
    let root = tree.root(Tree::config(), Some(lease.clone()));
    let (outcome, starts) = tree.drive(&root);
    assert_eq!(outcome.stop_reason, StopReason::MaxTokens, "the root stops with what it has");
    assert!(lease.tokens_used() >= 200, "the tree reported {} tokens", lease.tokens_used());
    assert!((1..100).contains(&starts), "the tree stopped growing: {starts} runs");
    // The child that spent the last tokens stopped MaxTokens; its parent
    // read that, and stopped at its own next model call.
    let results: Vec<String> =
        common::tool_results(&root.events()).into_iter().map(|(_, content, _)| content).collect();
    assert!(
        results.iter().any(|r| r.contains("hit its token limit")) || results.is_empty(),
        "the root saw its child stop on the token limit: {results:?}"
    );
}

#[test]
fn a_runaway_model_is_stopped_at_the_deadline_with_aborted() {
    // Each model call takes 50 ms; the tree has 400 ms.
    let tree = Tree::new(runaway(Duration::from_millis(50)));
    let lease = Budget::new().with_deadline(Duration::from_millis(400)).lease();
    let root = tree.root(Tree::config(), Some(lease));
    let began = Instant::now();
    let (outcome, starts) = tree.drive(&root);
    assert_eq!(outcome.stop_reason, StopReason::Aborted);
    assert!(began.elapsed() < Duration::from_secs(60), "bounded: {:?}", began.elapsed());
    assert!(starts >= 1, "the tree did some work before its time was up");
}

#[test]
fn concurrent_siblings_never_exceed_the_width() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let subagents = runtime.subagents();
    let mock = MockProvider::new("mock").with_reply("done").with_delay(Duration::from_millis(300));
    subagents.register_provider(mock).unwrap().keep();
    // One model reply asks for ten children at once.
    let calls: Vec<_> =
        (0..10).map(|n| ("subagent", json!({"description": "part", "prompt": format!("part {n}")}))).collect();
    let model = ScriptedModel::new().fallback(Step::text("all done"));
    let model = model.script(subagents::agent::ScriptMatch::Any, vec![Step::tool_calls(calls)]);
    let config = SubagentToolConfig::new("mock").with_background(false).with_budget(Budget::new().with_width(3));
    let tool: Arc<dyn Tool> = Arc::new(SubagentTool::mount(&subagents, config, None).unwrap());
    let mut builder = Agent::builder(model).cwd(home.path());
    builder.toolset_mut().add_shared(tool).unwrap();
    let root = builder.build().unwrap();
    let mut events = subagents.subscribe();
    let outcome = runtime.block_on({
        let root = root.clone();
        async move { root.prompt("split the work").await }
    });
    assert_eq!(outcome.stop_reason, StopReason::Completed);
    let (mut live, mut peak, mut started) = (0i64, 0i64, 0);
    while let Some(event) = events.try_recv() {
        match event {
            Ok(SubagentEvent::Start(_)) => {
                live += 1;
                started += 1;
                peak = peak.max(live);
            }
            Ok(SubagentEvent::End(_)) => live -= 1,
            _ => {}
        }
    }
    assert!(peak <= 3, "at most three siblings ran at once: {peak}");
    let results: Vec<String> =
        common::tool_results(&root.events()).into_iter().map(|(_, content, _)| content).collect();
    let refused = results.iter().filter(|r| r.contains("budget exhausted: width 3 of 3 concurrent children")).count();
    assert_eq!(started + refused, 10, "every call was admitted or refused: {results:?}");
    assert!(refused >= 1, "ten at once cannot all fit in three");
    assert_eq!(root.budget().unwrap().live_children(), 0, "every child gave its place back");
}

/// `count` starts of `request` at once, from `threads` threads (each its
/// own tokio runtime), so admissions race for real.
fn start_at_once(
    subagents: &Subagents,
    threads: usize,
    count: usize,
    request: impl Fn() -> StartRequest + Send + Sync + 'static,
) -> Vec<Result<subagents::Run, StartError>> {
    let request = Arc::new(request);
    let barrier = Arc::new(std::sync::Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (subagents, request, barrier) = (subagents.clone(), request.clone(), barrier.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(async move {
                    let requests: Vec<_> = (0..count / threads).map(|_| request()).collect();
                    barrier.wait();
                    join_all(requests.into_iter().map(|r| subagents.start("mock", r))).await
                })
            })
        })
        .collect();
    handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
}

fn start(runtime: &Runtime, subagents: &Subagents, request: StartRequest) -> Result<subagents::Run, StartError> {
    let subagents = subagents.clone();
    runtime.block_on(async move { subagents.start("mock", request).await })
}

fn dispose_all(runtime: &Runtime, runs: Vec<subagents::Run>) {
    runtime.block_on(async move {
        join_all(runs.iter().map(|run| run.dispose())).await.into_iter().for_each(|d| d.unwrap());
    });
}

#[test]
fn exactly_the_total_runs_are_admitted_of_a_thousand_concurrent_starts() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("mock").with_reply("ok")).unwrap().keep();
    let lease = Budget::new().with_runs(137).lease();
    let cwd = home.path().to_path_buf();
    let shared = lease.clone();
    let outcomes = start_at_once(&subagents, 8, 1000, move || {
        StartRequest::new("go", Parent::root(&cwd), CancellationToken::new()).with_budget_lease(shared.clone())
    });
    let (runs, refused): (Vec<_>, Vec<_>) = outcomes.into_iter().partition(Result::is_ok);
    assert_eq!(runs.len(), 137, "no over-admission, no under-admission");
    for error in refused.into_iter().map(Result::unwrap_err) {
        assert_eq!(error.code(), "BUDGET_EXHAUSTED");
        assert!(matches!(error, StartError::BudgetExhausted(e) if e.limit == BudgetLimit::Runs && e.of == 137));
    }
    assert_eq!(lease.runs_used(), 137);
    dispose_all(&runtime, runs.into_iter().map(Result::unwrap).collect());
    assert!(runtime.live().is_quiescent());
}

#[test]
fn exactly_the_width_is_admitted_of_a_thousand_concurrent_starts_and_freed_on_dispose() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let subagents = runtime.subagents();
    // Children that stay live until disposed.
    subagents.register_provider(MockProvider::new("mock").with_delay(Duration::from_secs(600))).unwrap().keep();
    let lease = Budget::new().with_width(50).lease();
    let cwd = home.path().to_path_buf();
    let shared = lease.clone();
    let outcomes = start_at_once(&subagents, 8, 1000, move || {
        StartRequest::new("go", Parent::root(&cwd), CancellationToken::new()).with_budget_lease(shared.clone())
    });
    let (runs, refused): (Vec<_>, Vec<_>) = outcomes.into_iter().partition(Result::is_ok);
    assert_eq!(runs.len(), 50);
    assert!(refused.iter().all(|r| matches!(r, Err(StartError::BudgetExhausted(e)) if e.limit == BudgetLimit::Width)));
    assert_eq!(lease.live_children(), 50);
    assert_eq!(lease.runs_used(), 50, "a refused start used no run");
    dispose_all(&runtime, runs.into_iter().map(Result::unwrap).collect());
    assert_eq!(lease.live_children(), 0, "dispose gave every place back");
    let cwd = home.path().to_path_buf();
    let again = StartRequest::new("go", Parent::root(&cwd), CancellationToken::new()).with_budget_lease(lease.clone());
    let run = start(&runtime, &subagents, again).expect("room again");
    dispose_all(&runtime, vec![run]);
}

#[test]
fn a_refused_start_emits_nothing_and_leaves_nothing_behind() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let subagents = runtime.subagents();
    let mock = MockProvider::new("mock").with_reply("ok");
    subagents.register_provider(mock.clone()).unwrap().keep();
    let lease = Budget::new().with_runs(1).lease();
    let request = || {
        StartRequest::new("go", Parent::root(home.path()), CancellationToken::new()).with_budget_lease(lease.clone())
    };
    let first = start(&runtime, &subagents, request()).unwrap();
    let mut events = subagents.subscribe();
    let error = start(&runtime, &subagents, request()).unwrap_err();
    assert_eq!(error.code(), "BUDGET_EXHAUSTED");
    assert_eq!(error.to_string(), "budget exhausted: total runs 1 of 1 used");
    assert!(events.try_recv().is_none(), "no event for a refused start");
    assert_eq!(mock.launched(), 1, "no child was launched");
    dispose_all(&runtime, vec![first]);
    assert!(runtime.live().is_quiescent());
}

#[test]
fn a_start_the_provider_fails_gives_its_run_back() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let subagents = runtime.subagents();
    let mock = MockProvider::new("mock")
        .with_fault(subagents::providers::FaultStage::BeforePublication, subagents::providers::Fault::Error);
    subagents.register_provider(mock).unwrap().keep();
    let lease = Budget::new().with_runs(1).with_width(1).lease();
    let request =
        StartRequest::new("go", Parent::root(home.path()), CancellationToken::new()).with_budget_lease(lease.clone());
    let error = start(&runtime, &subagents, request).unwrap_err();
    assert_eq!(error.code(), "STARTUP_FAILED");
    assert_eq!((lease.runs_used(), lease.live_children()), (0, 0), "the failed start holds nothing");
}

#[test]
fn a_budget_and_max_depth_both_bind() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("mock").with_reply("ok")).unwrap().keep();
    let lease = Budget::new().with_depth(5).lease();
    // max_depth still refuses first, as INVALID_REQUEST, whatever the budget.
    let deep = StartRequest::new("go", Parent::root(home.path()).with_depth(2), CancellationToken::new())
        .with_max_depth(2)
        .with_budget_lease(lease.clone());
    let error = start(&runtime, &subagents, deep).unwrap_err();
    assert_eq!(error.code(), "INVALID_REQUEST");
    assert_eq!(lease.runs_used(), 0);
}

#[test]
fn a_process_child_inherits_what_is_left_and_enforces_it_for_its_subtree() {
    use subagents::providers::{ProcessConfig, ProcessProvider};
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let subagents = runtime.subagents();
    let mut config = ProcessConfig::new("process", home.path().join("children"));
    config.bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_subagents"));
    subagents.register_provider(ProcessProvider::new(config).unwrap()).unwrap().keep();
    // The child process takes one of the three runs and is one level down;
    // it may start two more below it, and no grandchild may delegate.
    let run = |prompt: &str, budget: Budget| {
        let request =
            StartRequest::new(prompt, Parent::root(home.path()), CancellationToken::new()).with_budget(budget);
        common::lifecycle(&runtime, &subagents, "process", request)
    };
    let run_with = |budget: Budget| run("check a; check b; check c", budget);
    let result = run_with(Budget::new().with_runs(3).with_depth(2));
    assert_eq!(result.stop_reason, StopReason::Completed);
    let text = result.text();
    assert_eq!(text.matches("- handled: check").count(), 2, "two of three parts ran: {text}");
    assert_eq!(text.matches("budget exhausted: total runs 2 of 2 used").count(), 1, "the third was refused: {text}");
    // Depth: the process child is the only level the budget allows.
    let result = run_with(Budget::new().with_depth(1));
    let text = result.text();
    assert_eq!(text.matches("budget exhausted: depth").count(), 3, "no part may be delegated: {text}");
    // Tokens and time cross too: the child stops on them mid-run.
    let spent = run_with(Budget::new().with_tokens(1));
    assert_eq!(spent.stop_reason, StopReason::MaxTokens, "{spent:?}");
    let began = Instant::now();
    let late = run("[delay:600000] wait for it", Budget::new().with_deadline(Duration::from_millis(300)));
    assert_eq!(late.stop_reason, StopReason::Aborted, "{late:?}");
    assert!(began.elapsed() < Duration::from_secs(60), "the deadline ended it: {:?}", began.elapsed());
    common::no_children_left(&runtime);
}

/// A reply with some text and a `list_dir` call, reporting `tokens`: half
/// plain input, a quarter read from the cache, the rest written to it.
fn working(text: &str, tokens: u64) -> Step {
    let (input_tokens, cache_read_tokens) = (tokens / 2, tokens / 4);
    Step::Reply(ModelReply {
        text: text.to_owned(),
        tool_calls: vec![subagents::agent::ToolCall {
            id: "call_0".to_owned(),
            name: "list_dir".to_owned(),
            arguments: json!({}),
        }],
        finish: subagents::agent::Finish::ToolCalls,
        usage: Some(subagents::agent::Usage {
            input_tokens,
            output_tokens: 0,
            cache_read_tokens,
            cache_write_tokens: tokens - input_tokens - cache_read_tokens,
        }),
    })
}

#[test]
fn an_agent_that_spends_the_tokens_mid_turn_stops_max_tokens_with_its_partial_output() {
    let home = tempfile::tempdir().unwrap();
    let model = ScriptedModel::new().script(
        subagents::agent::ScriptMatch::Any,
        vec![working("first part", 60), working("second part", 60), Step::text("never reached")],
    );
    let lease = Budget::new().with_tokens(100).lease();
    let agent = Agent::builder(model).cwd(home.path()).builtin_tools().budget(lease.clone()).build().unwrap();
    let outcome = tokio::runtime::Runtime::new().unwrap().block_on(agent.prompt("do the work"));
    assert_eq!(outcome.stop_reason, StopReason::MaxTokens);
    assert_eq!(outcome.output, "second part", "the partial output is kept");
    assert_eq!(outcome.model_calls, 2);
    // Cache tokens count: the budget charges what the outcome reports.
    assert_eq!(lease.tokens_used(), 120);
    assert_eq!((outcome.usage.tokens(), outcome.usage.cache_read_tokens, outcome.usage.model_calls), (120, 30, 2));
    let results: Vec<String> =
        common::tool_results(&agent.events()).into_iter().map(|(_, content, _)| content).collect();
    assert_eq!(results.len(), 2, "the first call ran, the second got its result without running: {results:?}");
    assert!(results[1].starts_with("not run: the turn ended (max-tokens)"), "{results:?}");
}

#[test]
fn an_agent_working_at_its_deadline_stops_aborted_with_its_partial_output() {
    let home = tempfile::tempdir().unwrap();
    let model = ScriptedModel::new().script(
        subagents::agent::ScriptMatch::Any,
        vec![working("first part", 1), Step::text("too late").after(Duration::from_secs(600))],
    );
    let lease = Budget::new().with_deadline(Duration::from_millis(200)).lease();
    let agent = Agent::builder(model).cwd(home.path()).builtin_tools().budget(lease).build().unwrap();
    let began = Instant::now();
    let outcome = tokio::runtime::Runtime::new().unwrap().block_on(agent.prompt("do the work"));
    assert_eq!(outcome.stop_reason, StopReason::Aborted);
    assert_eq!(outcome.output, "first part");
    assert!(began.elapsed() < Duration::from_secs(60), "the deadline, not the model, ended it");
}

#[test]
fn an_answer_that_ends_the_turn_at_its_token_limit_is_charged_too() {
    let home = tempfile::tempdir().unwrap();
    let cut_short = Step::Reply(ModelReply {
        text: "half an answer".to_owned(),
        tool_calls: Vec::new(),
        finish: subagents::agent::Finish::MaxTokens,
        usage: Some(subagents::agent::Usage { input_tokens: 40, output_tokens: 10, ..Default::default() }),
    });
    let model = ScriptedModel::new().script(subagents::agent::ScriptMatch::Any, vec![cut_short]);
    let lease = Budget::new().with_tokens(1_000).lease();
    let agent = Agent::builder(model).cwd(home.path()).budget(lease.clone()).build().unwrap();
    let outcome = tokio::runtime::Runtime::new().unwrap().block_on(agent.prompt("do the work"));
    assert_eq!(outcome.stop_reason, StopReason::MaxTokens);
    assert_eq!((lease.tokens_used(), outcome.usage.tokens()), (50, 50), "the budget counts what the result reports");
}
