//! docs/contract.md §11.2 cancellation receipts: cancelling a run from the top reports
//! every run stopped under it (in process, across the `serve` wire) and the
//! processes reaped, and says which branch is unknown rather than guessing.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::blocking::wait_until;
use common::{no_children_left, no_process_mentions, runtime_at};
use serde_json::json;
use subagents::agent::{ScriptMatch, ScriptedModel, Step, Toolset};
use subagents::providers::{AcpConfig, AcpProvider, ChildInfo, InProcessProvider, ProcessConfig, ProcessProvider};
use subagents::seam::Branch;
use subagents::tool::{shared_delegating_toolset, MaxDepth, SubagentTool, SubagentToolConfig, TaskService};
use subagents::{CancellationToken, Parent, Receipt, StartRequest, StopReason, Subagents};

/// Generous bounds: a tree of real processes on a busy 2-core machine.
const WITHIN: Duration = Duration::from_secs(60);

fn process_config(home: &Path) -> ProcessConfig {
    let mut config = ProcessConfig::new("process", home.join("children"));
    config.bin = PathBuf::from(env!("CARGO_BIN_EXE_subagents"));
    // The reply carries the receipts of the child's runs: give it room.
    config.shutdown_timeout = WITHIN;
    config
}

/// A subagent tool called `name`, bound to `provider`, foreground only.
fn delegate(subagents: &Subagents, name: &str, provider: &str, max_depth: MaxDepth) -> SubagentTool {
    let config =
        SubagentToolConfig::new(provider).with_tool_name(name).with_max_depth(max_depth).with_background(false);
    SubagentTool::mount(subagents, config, None).unwrap()
}

/// Sessions under `home` holding at least one event (their prompt).
fn sessions_with_a_turn(home: &Path) -> usize {
    let store = subagents::agent::SessionStore::new(home);
    let Ok(ids) = store.ids() else { return 0 };
    ids.iter().filter(|id| store.read(id).is_ok_and(|(_, events)| !events.is_empty())).count()
}

fn runs(branches: &[Branch]) -> Vec<&Receipt> {
    branches.iter().filter_map(Branch::as_run).collect()
}

fn pid_alive(pid: u32) -> bool {
    // Signal 0 probes; a reaped pid is gone (ESRCH).
    unsafe { libc::kill(pid as i32, 0) == 0 }
}

#[test]
fn a_tree_of_spawn_fork_and_process_children_cancelled_from_the_top_lists_every_run_and_process() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime_at(home.path());
    let subagents = runtime.subagents();
    // top (spawn) ─┬─ MID (fork) ── process child ─┬─ g1 (its own spawn)
    //              └─ LEAF (spawn)                 └─ g2 (its own spawn)
    let model = Arc::new(
        ScriptedModel::new()
            .script(
                ScriptMatch::PromptContains("TOP".into()),
                vec![
                    Step::tool_calls([
                        ("delegate_fork", json!({"description": "the middle", "prompt": "MID"})),
                        ("delegate_spawn", json!({"description": "a leaf", "prompt": "LEAF"})),
                    ]),
                    Step::text("top done"),
                ],
            )
            .script(
                ScriptMatch::PromptContains("MID".into()),
                vec![
                    // The serve child's demo model splits this in two `[slow]` runs.
                    Step::tool_call(
                        "delegate_process",
                        json!({"description": "out of process", "prompt": "g1 [slow]; g2 [slow]"}),
                    ),
                    Step::text("mid done"),
                ],
            )
            .script(ScriptMatch::PromptContains("LEAF".into()), vec![Step::text("leaf done").after(WITHIN * 10)]),
    );
    let factory_subagents = subagents.clone();
    let factory = Arc::new(move |child: &ChildInfo| {
        let mut tools = Toolset::new();
        if child.depth == 1 {
            tools.add(delegate(&factory_subagents, "delegate_fork", "fork", MaxDepth::Limit(3))).unwrap();
            tools.add(delegate(&factory_subagents, "delegate_spawn", "spawn", MaxDepth::Limit(3))).unwrap();
        } else if child.depth == 2 {
            tools.add(delegate(&factory_subagents, "delegate_process", "process", MaxDepth::ProviderManaged)).unwrap();
        }
        tools
    });
    subagents.register_provider(ProcessProvider::new(process_config(home.path())).unwrap()).unwrap().keep();
    subagents
        .register_provider(InProcessProvider::spawn("spawn", model.clone()).with_tools(factory.clone()))
        .unwrap()
        .keep();
    subagents.register_provider(InProcessProvider::fork("fork", model).with_tools(factory)).unwrap().keep();

    let starting = subagents.clone();
    let cwd = home.path().to_path_buf();
    let top = runtime
        .block_on(async move {
            starting.start("spawn", StartRequest::new("TOP", Parent::root(cwd), CancellationToken::new())).await
        })
        .unwrap();
    // Every run is live: top, MID, LEAF and the process run here; the served
    // session and its two `[slow]` runs in the child.
    wait_until(WITHIN, "the tree is live", || {
        runtime.live().runs == 4 && sessions_with_a_turn(&home.path().join("children")) == 3
    });

    let receipt = runtime.block_on(async move {
        let receipt = tokio::time::timeout(WITHIN, top.cancel_and_wait()).await.expect("bounded");
        (receipt, top.run_id())
    });
    let (receipt, top_id) = receipt;
    let receipt = receipt.expect("disposed cleanly");

    assert_eq!((receipt.run_id, receipt.provider.as_str()), (top_id, "spawn"));
    assert_eq!(receipt.stop_reason, StopReason::Aborted);
    assert!(receipt.is_complete(), "every branch is known: {receipt:#?}");
    let level1 = runs(&receipt.children);
    let mut providers: Vec<&str> = level1.iter().map(|r| r.provider.as_str()).collect();
    providers.sort();
    assert_eq!(providers, ["fork", "spawn"], "{receipt:#?}");
    let mid = level1.iter().find(|r| r.provider == "fork").unwrap();
    let leaf = level1.iter().find(|r| r.provider == "spawn").unwrap();
    assert_eq!((mid.stop_reason, leaf.stop_reason), (StopReason::Aborted, StopReason::Aborted));
    assert!(leaf.children.is_empty(), "{leaf:#?}");
    let level2 = runs(&mid.children);
    assert_eq!(level2.len(), 1, "{mid:#?}");
    let process = level2[0];
    assert_eq!((process.provider.as_str(), process.stop_reason), ("process", StopReason::Aborted));
    assert!(process.child_id.starts_with("process:process:"), "{process:#?}");
    assert_eq!(process.processes_reaped.len(), 1, "{process:#?}");
    // The served session's own runs, reported over the wire.
    let level3 = runs(&process.children);
    assert_eq!(level3.len(), 2, "{process:#?}");
    for grandchild in &level3 {
        assert_eq!((grandchild.provider.as_str(), grandchild.stop_reason), ("spawn", StopReason::Aborted));
        assert!(grandchild.children.is_empty());
    }
    assert_eq!(receipt.descendants().count(), 5);
    assert_eq!(receipt.stopped_descendants(), 5);
    assert_eq!(receipt.processes_reaped_in_tree(), process.processes_reaped);
    assert!(!pid_alive(process.processes_reaped[0]), "the serve child was reaped");

    // Nothing lives anywhere: this runtime, the child's (its process and
    // group are gone, and its runs were each gathered once quiescent).
    no_children_left(&runtime);
    no_process_mentions(home.path());
    let report = runtime.shutdown_blocking();
    assert!(report.live_after.is_quiescent());
    // The receipt serialises as a plain tree.
    let json = serde_json::to_value(&receipt).unwrap();
    assert_eq!(json["stop_reason"], "aborted");
    assert_eq!(serde_json::from_value::<Receipt>(json).unwrap(), receipt);
}

/// A `process` child that is our binary's wire in shell: it answers
/// `initialize` and `prompt`, then treats `shutdown` as `exit_on_shutdown`
/// says.
fn shell_serve(home: &Path, name: &str, on_shutdown: &str) -> ProcessConfig {
    let cwd = home.join(name);
    std::fs::create_dir_all(&cwd).unwrap();
    let script = format!(
        "read line\n\
         printf '%s\\n' '{{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{{\"protocol_version\":1,\"session_id\":\"sh\"}}}}'\n\
         read line\n\
         printf '%s\\n' '{{\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{{\"reason\":\"completed\"}}}}'\n\
         read line\n\
         {on_shutdown}\n"
    );
    std::fs::write(cwd.join("serve"), script).unwrap();
    let mut config = ProcessConfig::new(name, home.join("children"));
    config.bin = PathBuf::from("/bin/sh");
    config.cwd = Some(cwd);
    config.shutdown_timeout = WITHIN;
    config
}

#[test]
fn a_process_child_that_cannot_report_its_runs_is_an_unknown_branch_not_an_empty_one() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime_at(home.path());
    let subagents = runtime.subagents();
    // Dies on shutdown without a word; an older peer answers `{}`.
    let dies = shell_serve(home.path(), "dies", "exit 0");
    let old = shell_serve(home.path(), "old", "printf '%s\\n' '{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{}}'");
    subagents.register_provider(ProcessProvider::new(dies).unwrap()).unwrap().keep();
    subagents.register_provider(ProcessProvider::new(old).unwrap()).unwrap().keep();
    for (provider, says) in [("dies", "ended before it reported its runs"), ("old", "a peer without receipts")] {
        let (starting, cwd) = (subagents.clone(), home.path().to_path_buf());
        let receipt = runtime.block_on(async move {
            let request = StartRequest::new("anything", Parent::root(cwd), CancellationToken::new());
            let run = starting.start(provider, request).await.unwrap();
            assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Completed);
            run.dispose().await.unwrap();
            run.receipt().await
        });
        assert_eq!((receipt.provider.as_str(), receipt.stop_reason), (provider, StopReason::Completed));
        assert_eq!(receipt.processes_reaped.len(), 1, "{receipt:#?}");
        assert!(!receipt.is_complete());
        let unknown = receipt.unknown_branches();
        assert_eq!(unknown.len(), 1, "{receipt:#?}");
        assert!(unknown[0].contains(says), "{provider}: {}", unknown[0]);
    }
    no_children_left(&runtime);
    no_process_mentions(home.path());
    runtime.shutdown_blocking();
}

#[test]
fn fanout_says_how_many_descendants_ctrl_c_stopped() {
    let home = tempfile::tempdir().unwrap();
    let tasks = home.path().join("tasks.jsonl");
    // One task whose run delegates two `[slow]` parts: two descendants.
    std::fs::write(&tasks, "{\"prompt\": \"first part [slow]; second part [slow]\"}\n").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_subagents"))
        .arg("fanout")
        .arg(&tasks)
        .arg("--home")
        .arg(home.path().join("home"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The task's run and its two children have each begun a turn.
    wait_until(WITHIN, "both descendants are running", || sessions_with_a_turn(&home.path().join("home")) == 3);
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let interrupted = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(interrupted.elapsed() < WITHIN, "fanout did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted: 1 runs stopped; 2 descendants stopped under them"), "{stderr}");
    let line: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!((line["stop_reason"].as_str(), line["stopped_descendants"].as_u64()), (Some("aborted"), Some(2)));
    assert_eq!(line["interrupted"], true, "stopped by the interruption: not settled");
}

#[test]
fn an_acp_run_lists_its_reaped_agent_and_says_its_agents_own_runs_are_unknown() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime_at(home.path());
    let subagents = runtime.subagents();
    let args = vec!["acp".to_owned(), "--home".to_owned(), home.path().join("agent-home").display().to_string()];
    let config = AcpConfig::new("acp", env!("CARGO_BIN_EXE_subagents"), args);
    let provider = runtime.block_on(async move { AcpProvider::new(config).await.unwrap() });
    subagents.register_provider(provider).unwrap().keep();
    let (starting, cwd) = (subagents.clone(), home.path().to_path_buf());
    let receipt = runtime.block_on(async move {
        let request = StartRequest::new("hold on [slow]", Parent::root(cwd), CancellationToken::new());
        let run = starting.start("acp", request).await.unwrap();
        run.cancel_and_wait().await.unwrap()
    });
    assert_eq!((receipt.provider.as_str(), receipt.stop_reason), ("acp", StopReason::Aborted));
    assert_eq!(receipt.processes_reaped.len(), 1, "{receipt:#?}");
    assert!(!pid_alive(receipt.processes_reaped[0]));
    assert_eq!(receipt.unknown_branches(), ["an ACP agent does not report the runs it started"]);
    no_children_left(&runtime);
    no_process_mentions(home.path());
    runtime.shutdown_blocking();
}

#[test]
fn a_disposed_runs_receipt_keeps_each_descendants_own_stop_reason() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime_at(home.path());
    let subagents = runtime.subagents();
    let kit = shared_delegating_toolset(&subagents, &TaskService::new(), "spawn", 3);
    let model = ScriptedModel::new()
        .script(
            ScriptMatch::PromptContains("TOP".into()),
            vec![
                Step::tool_calls([
                    ("subagent", json!({"description": "says yes", "prompt": "say yes"})),
                    ("subagent", json!({"description": "says no", "prompt": "say no"})),
                ]),
                Step::text("top done"),
            ],
        )
        .script(ScriptMatch::PromptContains("say no".into()), vec![Step::refusal("no")]);
    let spawn = InProcessProvider::spawn("spawn", Arc::new(model)).with_tools(Arc::new(move |_: &ChildInfo| kit()));
    subagents.register_provider(spawn).unwrap().keep();
    let (starting, cwd) = (subagents.clone(), home.path().to_path_buf());
    let receipt = runtime.block_on(async move {
        // Nothing is cancelled: one child completes, one refuses.
        let request = StartRequest::new("TOP", Parent::root(cwd), CancellationToken::new());
        let run = starting.start("spawn", request).await.unwrap();
        assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Completed);
        run.dispose().await.unwrap();
        run.receipt().await
    });
    assert_eq!(receipt.stop_reason, StopReason::Completed);
    let mut reasons: Vec<StopReason> = receipt.descendants().map(|r| r.stop_reason).collect();
    reasons.sort_by_key(|r| r.to_string());
    assert_eq!(reasons, [StopReason::Completed, StopReason::Refusal], "{receipt:#?}");
    assert_eq!(receipt.stopped_descendants(), 0, "nothing was stopped");
    assert!(receipt.is_complete());
    no_children_left(&runtime);
    runtime.shutdown_blocking();
}

/// A served session that delegated exits by itself once it answered
/// `shutdown`: the receipts it keeps must not hold its own output open (its
/// children's progress went to that output).
#[test]
fn a_serve_child_that_delegated_exits_by_itself_after_its_shutdown_reply() {
    use std::io::{BufRead, BufReader, Write};
    let home = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_subagents"))
        .args(["serve", "--home"])
        .arg(home.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let cwd = home.path().display().to_string();
    let lines = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
               "params": {"protocol_version": 1, "route": {}, "profile": "default", "patches": [], "cwd": cwd}}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "prompt",
               "params": {"prompt": [{"type": "text", "text": "check a; check b"}]}}),
    ];
    for line in &lines {
        writeln!(stdin, "{line}").unwrap();
    }
    let mut replies = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut wait_for = |id: u64| loop {
        let line = replies.next().expect("the child answers").unwrap();
        let message: serde_json::Value = serde_json::from_str(&line).unwrap();
        if message["id"] == id {
            break message;
        }
    };
    assert_eq!(wait_for(2)["result"]["reason"], "completed");
    writeln!(stdin, "{}", json!({"jsonrpc": "2.0", "id": 3, "method": "shutdown"})).unwrap();
    let reply = wait_for(3);
    assert_eq!(reply["result"]["runs"].as_array().map(Vec::len), Some(2), "{reply}");
    // Stdin stays open: the shutdown alone ends the process.
    let began = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(began.elapsed() < Duration::from_secs(30), "the served session did not exit after shutdown");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(child.wait().unwrap().success());
    drop(stdin);
}
