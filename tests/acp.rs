//! docs/contract.md §7.6 `acp`: an ACP client over real child processes — our own binary
//! as the agent (`subagents acp`) and small shell agents (`acp/stand_ins.rs`)
//! for cancellation, the ladder and its EOF phase, and hostile output.
//! After every test no child is left.

use crate::common;
use crate::stand_ins;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{lifecycle, no_children_left, no_process_mentions, request_in, runtime_at as runtime};
use serde_json::json;
use stand_ins::{ignores_eof, logged, logged_at, session_news, shell_agent, shell_agent_advertising};
use subagents::providers::{AcpConfig, AcpMcpServer, AcpProvider};
use subagents::seam::{Category, Policy, Rules};
use subagents::{Runtime, StopReason, Subagents};

/// Our own binary as the ACP agent, with its home under `home`.
fn own_agent(name: &str, home: &Path, extra: &[&str]) -> AcpConfig {
    let mut args = vec!["acp".to_owned(), "--home".to_owned(), home.join("agent-home").display().to_string()];
    args.extend(extra.iter().map(|a| a.to_string()));
    let mut config = AcpConfig::new(name, env!("CARGO_BIN_EXE_subagents"), args);
    config.dispose_eof_grace = Duration::from_secs(5);
    config
}

fn register(runtime: &Runtime, config: AcpConfig) -> Subagents {
    let subagents = runtime.subagents();
    let provider = runtime.block_on(async move { AcpProvider::new(config).await.unwrap() });
    subagents.register_provider(provider).unwrap().keep();
    subagents
}

#[test]
fn our_own_binary_answers_over_acp_and_delegates_in_its_own_process() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let subagents = register(&runtime, own_agent("acp", home.path(), &[]));
    let info = subagents.provider("acp").unwrap();
    assert!(info.capabilities.persona, "persona comes from the advertised systemPrompt");
    assert!(!info.capabilities.output_schema && !info.capabilities.depth_limit && !info.capabilities.tool_filter);

    let mut events = subagents.subscribe();
    let plain = lifecycle(&runtime, &subagents, "acp", request_in("summarise the log", home.path()));
    let mut chunks = String::new();
    while let Some(Ok(event)) = events.try_recv() {
        if let subagents::SubagentEvent::Progress(progress) = event {
            if let subagents::seam::ProgressUpdate::MessageChunk { text } = &progress.update {
                chunks.push_str(text);
            }
        }
    }
    assert_eq!(chunks, "handled: summarise the log", "the child's updates are Progress events");
    assert_eq!((plain.stop_reason, plain.text()), (StopReason::Completed, "handled: summarise the log".to_owned()));
    // parent → ACP child → that child's own in-process grandchildren.
    let nested = lifecycle(&runtime, &subagents, "acp", request_in("check a; check b", home.path()));
    assert!(
        nested.text().contains("- handled: check a") && nested.text().contains("- handled: check b"),
        "{}",
        nested.text()
    );
    let refused = runtime.block_on({
        let (subagents, cwd) = (subagents.clone(), home.path().to_path_buf());
        async move { subagents.start("acp", request_in("x", &cwd).with_output_schema(json!({"type": "object"}))).await }
    });
    assert_eq!(refused.unwrap_err().code(), "UNSUPPORTED_CAPABILITY");
    no_children_left(&runtime);
    no_process_mentions(home.path());
}

#[test]
fn a_grandchilds_progress_reaches_the_top_caller_as_delegated_updates() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let subagents = register(&runtime, own_agent("acp", home.path(), &[]));
    let mut events = subagents.subscribe();
    // parent → acp provider → `subagents acp` child → its in-process
    // grandchildren, whose text the child streams into its subagent tool
    // calls' content.
    let nested = lifecycle(&runtime, &subagents, "acp", request_in("check a; check b", home.path()));
    assert_eq!(nested.stop_reason, StopReason::Completed);
    let (mut delegated, mut own) = (String::new(), String::new());
    while let Some(Ok(event)) = events.try_recv() {
        let subagents::SubagentEvent::Progress(progress) = event else { continue };
        match (&progress.update, progress.update.innermost()) {
            (
                subagents::seam::ProgressUpdate::Delegated { .. },
                subagents::seam::ProgressUpdate::MessageChunk { text },
            ) => {
                assert_eq!(progress.update.depth(), 1, "one level below the acp child");
                delegated.push_str(text);
            }
            (subagents::seam::ProgressUpdate::MessageChunk { text }, _) => own.push_str(text),
            _ => {}
        }
    }
    for grandchild in ["handled: check a", "handled: check b"] {
        assert!(delegated.contains(grandchild), "each grandchild's answer arrives as Delegated: {delegated:?}");
        assert_eq!(delegated.matches(grandchild).count(), 1, "growing content is passed on once: {delegated:?}");
    }
    assert!(!own.is_empty() && !own.starts_with("handled: check"), "the child's own text stays undelegated: {own:?}");
    no_children_left(&runtime);
}

#[test]
fn a_persona_travels_as_the_sessions_system_prompt() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let subagents = register(&runtime, own_agent("acp", home.path(), &[]));
    let result =
        lifecycle(&runtime, &subagents, "acp", request_in("review", home.path()).with_persona("You are terse."));
    assert_eq!(result.stop_reason, StopReason::Completed);
    let sessions = home.path().join("agent-home/sessions");
    let header = std::fs::read_dir(&sessions)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .find(|text| text.contains("You are terse."));
    assert!(header.is_some(), "the child's session header records the persona");
    no_children_left(&runtime);
    no_process_mentions(home.path());
}

#[test]
fn permission_requests_are_answered_by_policy_and_kind() {
    let home = tempfile::tempdir().unwrap();
    std::fs::write(home.path().join("visible.txt"), "x").unwrap();
    let runtime = runtime(home.path());
    let mut allow = own_agent("allow", home.path(), &["--approve", "list_dir"]);
    allow.permission = Rules::new(Policy::Allow);
    let reject = own_agent("reject", home.path(), &["--approve", "list_dir"]);
    let subagents = register(&runtime, allow);
    register(&runtime, reject);
    let allowed = lifecycle(&runtime, &subagents, "allow", request_in("list the files", home.path()));
    let rejected = lifecycle(&runtime, &subagents, "reject", request_in("list the files", home.path()));
    assert!(allowed.text().contains("visible.txt"), "{}", allowed.text());
    assert!(rejected.text().contains("did not allow"), "{}", rejected.text());
    no_children_left(&runtime);
    no_process_mentions(home.path());
}

#[test]
fn cancel_settles_aborted_even_when_the_child_ignores_it_and_the_ladder_reaps_it() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    // Reads the prompt, never answers, ignores session/cancel and EOF.
    let config = shell_agent(home.path(), "stubborn", "cat > /dev/null\nsleep 1000");
    let subagents = register(&runtime, config);
    let cwd = home.path().to_path_buf();
    let (result, disposed, took) = runtime.block_on(async move {
        let run = subagents.start("stubborn", request_in("work", &cwd)).await.unwrap();
        let began = Instant::now();
        run.cancel();
        let result = run.result().await.unwrap();
        let disposed = run.dispose().await;
        (result, disposed, began.elapsed())
    });
    assert_eq!(result.stop_reason, StopReason::Aborted);
    assert!(disposed.is_ok(), "{disposed:?}");
    assert!(took >= Duration::from_millis(300), "EOF alone did not stop it: {took:?}");
    assert!(took < Duration::from_secs(8), "{took:?}");
    no_children_left(&runtime);
    no_process_mentions(home.path());
}

#[test]
fn a_child_that_fails_the_handshake_is_reaped_before_start_rejects() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    // Passes the probe (one initialize), then dies at the next start.
    let marker = home.path().join("probed");
    let script = format!(
        "if [ -e '{marker}' ]; then exit 4; fi\ntouch '{marker}'\nread -r line\nid=$(printf '%s' \"$line\" | sed -E 's/.*\"id\":(\"[^\"]*\"|[0-9]+).*/\\1/')\nprintf '{{\"jsonrpc\":\"2.0\",\"id\":%s,\"result\":{{\"protocolVersion\":1,\"agentCapabilities\":{{}}}}}}\\n' \"$id\"\ncat > /dev/null",
        marker = marker.display()
    );
    let path = home.path().join("dies-later");
    std::fs::write(&path, format!("{script}\n")).unwrap();
    let config = AcpConfig::new("dies-later", "/bin/sh", vec![path.display().to_string()]);
    let subagents = register(&runtime, config);
    let cwd = home.path().to_path_buf();
    let error =
        runtime.block_on(async move { subagents.start("dies-later", request_in("x", &cwd)).await.unwrap_err() });
    assert_eq!(error.code(), "STARTUP_FAILED");
    no_children_left(&runtime);
    no_process_mentions(home.path());
}

#[test]
fn hostile_output_ends_the_run_with_a_clear_error_and_bounded_memory() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let children = [
        ("garbage", "read -r line\necho 'this is not json'\ncat > /dev/null"),
        ("truncated", "read -r line\nprintf '%s' '{\"jsonrpc\":\"2.0\",\"id\":'"),
        ("huge-line", "read -r line\nhead -c 100000000 /dev/zero | tr '\\0' 'a'\ncat > /dev/null"),
    ];
    for (name, then) in children {
        let subagents = register(&runtime, shell_agent(home.path(), name, then));
        let began = Instant::now();
        let result = lifecycle(&runtime, &subagents, name, request_in("go", home.path()));
        assert!(began.elapsed() < Duration::from_secs(20), "{name} hung");
        assert_eq!(result.stop_reason, StopReason::Error, "{name}");
        let category = result.diagnostic.unwrap().category;
        assert!(matches!(category, Category::Protocol | Category::ChildCrashed), "{name}: {category:?}");
        no_children_left(&runtime);
        no_process_mentions(home.path());
    }
}

#[test]
fn a_bad_cwd_is_refused_before_anything_is_spawned() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let subagents = register(&runtime, own_agent("acp", home.path(), &[]));
    let error = runtime.block_on(async move {
        subagents.start("acp", request_in("x", &PathBuf::from("/no/such/dir"))).await.unwrap_err()
    });
    assert_eq!(error.code(), "INVALID_REQUEST");
    no_children_left(&runtime);
    no_process_mentions(home.path());
}

#[test]
fn a_finished_run_of_an_agent_that_ignores_eof_is_disposed_within_a_second() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    // The default graces: 6 s after EOF at most, 500 ms once idle.
    let subagents = register(&runtime, ignores_eof(home.path(), "deaf-to-eof"));
    let cwd = home.path().to_path_buf();
    let (result, disposed, took) = runtime.block_on(async move {
        let run = subagents.start("deaf-to-eof", request_in("work", &cwd)).await.unwrap();
        let result = run.result().await.unwrap();
        let began = Instant::now();
        let disposed = run.dispose().await;
        (result, disposed, began.elapsed())
    });
    assert_eq!((result.stop_reason, result.text()), (StopReason::Completed, "done".to_owned()));
    assert!(disposed.is_ok(), "{disposed:?}");
    assert!(took < Duration::from_millis(1_500), "a finished agent is not owed the full EOF grace: {took:?}");
    let (eof, term) = (logged_at(home.path(), "deaf-to-eof", "eof"), logged_at(home.path(), "deaf-to-eof", "sigterm"));
    let waited = term.zip(eof).map(|(term, eof)| term.saturating_sub(eof));
    assert!(
        waited.is_some_and(|waited| waited < Duration::from_millis(1_200)),
        "it saw EOF, lived on, and the ladder SIGTERMed it: {:?}",
        logged(home.path(), "deaf-to-eof")
    );
    no_children_left(&runtime);
    no_process_mentions(home.path());
}

#[test]
fn an_agent_with_a_prompt_in_flight_at_dispose_gets_the_full_eof_grace_before_sigterm() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    // Takes the prompt and never answers it (nor session/cancel), lives on
    // after EOF.
    let then = "trap 'note sigterm; exit 0' TERM\ntake\ncat > /dev/null\nnote eof\nsleep 1000";
    let mut config = shell_agent(home.path(), "busy", then);
    config.dispose_eof_grace = Duration::from_secs(2);
    config.dispose_idle_eof_grace = Duration::from_millis(100);
    let subagents = register(&runtime, config);
    let cwd = home.path().to_path_buf();
    let (result, disposed, took) = runtime.block_on(async move {
        let run = subagents.start("busy", request_in("work", &cwd)).await.unwrap();
        run.cancel();
        let result = run.result().await.unwrap();
        let began = Instant::now();
        let disposed = run.dispose().await;
        (result, disposed, began.elapsed())
    });
    assert_eq!(result.stop_reason, StopReason::Aborted, "settled by the runtime's cancel grace");
    assert!(disposed.is_ok(), "{disposed:?}");
    let (eof, term) = (logged_at(home.path(), "busy", "eof"), logged_at(home.path(), "busy", "sigterm"));
    let waited = term.zip(eof).map(|(term, eof)| term.saturating_sub(eof));
    // The agent notes EOF a moment after we close its stdin: 100 ms of slack.
    assert!(
        waited.is_some_and(|waited| waited >= Duration::from_millis(1_900)),
        "SIGTERMed only after the full 2 s, not the 100 ms idle grace: {:?}",
        logged(home.path(), "busy")
    );
    assert!(took >= Duration::from_secs(2) && took < Duration::from_secs(8), "{took:?}");
    no_children_left(&runtime);
    no_process_mentions(home.path());
}

#[test]
fn an_agent_still_writing_after_its_answer_finishes_its_writes_and_exits_unsignalled() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    // Answers at once, then writes a late line every 100 ms for a second
    // (past EOF, past the idle grace), then exits on its own.
    let then = "trap 'note sigterm; exit 0' TERM\ntake\nchunk done\nanswer '{\"stopReason\":\"end_turn\"}'\n\
                for i in 1 2 3 4 5 6 7 8 9 10; do sleep 0.1; chunk \"late $i\"; done\nnote finished";
    let mut config = shell_agent(home.path(), "chatty", then);
    config.dispose_eof_grace = Duration::from_secs(6);
    config.dispose_idle_eof_grace = Duration::from_millis(500);
    let subagents = register(&runtime, config);
    let cwd = home.path().to_path_buf();
    let (result, disposed, took) = runtime.block_on(async move {
        let run = subagents.start("chatty", request_in("work", &cwd)).await.unwrap();
        let result = run.result().await.unwrap();
        let began = Instant::now();
        let disposed = run.dispose().await;
        (result, disposed, began.elapsed())
    });
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert!(disposed.is_ok(), "{disposed:?}");
    let events: Vec<String> = logged(home.path(), "chatty").into_iter().map(|(event, _)| event).collect();
    assert_eq!(events, ["finished"], "its late lines were read to the end and it was never signalled");
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(6), "it exited on its own: {took:?}");
    no_children_left(&runtime);
    no_process_mentions(home.path());
}

/// A stand-in's script for one turn: it takes the prompt, sends one chunk
/// and ends the turn, then reads its stdin to the end.
const ONE_TURN: &str = r#"take
chunk done
answer '{"stopReason":"end_turn"}'
cat > /dev/null"#;

#[test]
fn an_acp_child_is_given_exactly_its_providers_mcp_servers_in_session_new_and_a_request_picks_among_them() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let mut config = shell_agent(home.path(), "mcp", ONE_TURN);
    let files = AcpMcpServer::stdio("files", "/opt/mcp-files", vec!["--root".to_owned(), "/srv".to_owned()]);
    config.mcp_servers =
        vec![files.with_env("FILES_MODE", "read-only"), AcpMcpServer::stdio("git", "/opt/mcp-git", vec![])];
    let subagents = register(&runtime, config);
    assert!(subagents.provider("mcp").unwrap().capabilities.mcp_servers);

    let every = lifecycle(&runtime, &subagents, "mcp", request_in("x", home.path()));
    let one = lifecycle(&runtime, &subagents, "mcp", request_in("x", home.path()).with_mcp_servers(["git"]));
    let none =
        lifecycle(&runtime, &subagents, "mcp", request_in("x", home.path()).with_mcp_servers(Vec::<String>::new()));
    assert!([every, one, none].iter().all(|result| result.stop_reason == StopReason::Completed));
    let sent: Vec<serde_json::Value> =
        session_news(home.path(), "mcp").iter().map(|line| line["params"]["mcpServers"].clone()).collect();
    let files = json!({"name": "files", "command": "/opt/mcp-files", "args": ["--root", "/srv"],
                       "env": [{"name": "FILES_MODE", "value": "read-only"}]});
    let git = json!({"name": "git", "command": "/opt/mcp-git", "args": [], "env": []});
    assert_eq!(sent, [json!([files, git]), json!([git]), json!([])]);

    let unknown = request_in("x", home.path()).with_mcp_servers(["files", "web"]);
    let error = runtime.block_on(async move { subagents.start("mcp", unknown).await.unwrap_err() });
    assert_eq!(error.code(), "INVALID_REQUEST");
    assert!(error.to_string().contains("\"web\""), "{error}");
    assert_eq!(session_news(home.path(), "mcp").len(), 3, "a refused start spawns nothing");
    no_children_left(&runtime);
}

#[test]
fn an_http_mcp_server_is_refused_for_an_agent_that_does_not_advertise_http() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let mut config = shell_agent(home.path(), "stdio-only", "cat > /dev/null");
    config.mcp_servers = vec![AcpMcpServer::http("web", "http://127.0.0.1:9/mcp")];
    let refused = runtime.block_on(async move { AcpProvider::new(config).await.unwrap_err() });
    let message = refused.to_string();
    assert!(message.contains("\"web\"") && message.contains("mcpCapabilities.http"), "{message}");
    no_children_left(&runtime);
}

#[test]
fn a_configured_http_server_reaches_an_agent_advertising_http_with_its_headers_expanded() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let script =
        shell_agent_advertising(home.path(), "web", r#"{"mcpCapabilities":{"http":true}}"#, ONE_TURN).args[0].clone();
    let file = format!(
        "[mcp_servers.web]\nurl = \"http://127.0.0.1:9/mcp\"\nheaders = {{ X-Home = \"${{HOME}}\" }}\n\n\
         [providers.web]\nkind = \"acp\"\ncommand = \"/bin/sh\"\nargs = [{script:?}]\nmcp_servers = [\"web\"]\n"
    );
    let config = subagents::config::Config::parse(&file, "f.toml").unwrap();
    let configured = subagents::config::Configured::new(config, None).unwrap();
    let subagents = runtime.subagents();
    let model = std::sync::Arc::new(subagents::agent::ScriptedModel::demo());
    let tasks = subagents::tool::TaskService::new();
    configured.register_blocking(&subagents, &tasks, home.path(), model).unwrap();
    let result = lifecycle(&runtime, &subagents, "web", request_in("x", home.path()));
    assert_eq!(result.stop_reason, StopReason::Completed);
    let sent = &session_news(home.path(), "web")[0]["params"]["mcpServers"];
    let home_dir = std::env::var("HOME").unwrap();
    let expected = json!([{"type": "http", "name": "web", "url": "http://127.0.0.1:9/mcp",
                           "headers": [{"name": "X-Home", "value": home_dir}]}]);
    assert_eq!(sent, &expected);
    runtime.shutdown_blocking();
}

/// The conformance kit (`subagents::testing`) over the acp provider with
/// our own binary as the agent: every rule kept, and no agent left. (It
/// found that `subagents acp` lost a `session/cancel` read before the
/// prompt's turn first ran, so a cancel or dispose right after start
/// needed the runtime's grace.)
#[test]
fn the_acp_provider_passes_the_conformance_kit() {
    use subagents::seam::Provider;
    use subagents::testing::Conformance;
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let config = own_agent("acp", home.path(), &[]);
    let provider: std::sync::Arc<dyn Provider> =
        std::sync::Arc::new(runtime.block_on(async move { AcpProvider::new(config).await.unwrap() }));
    runtime.shutdown_blocking();
    crate::common::passes_the_kit_with_a_slow_prompt(Conformance::shared(move || provider.clone()), home.path());
}
