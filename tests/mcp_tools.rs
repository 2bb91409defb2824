//! Children using MCP servers' tools: a stand-in server written here on
//! rmcp's server side (this binary re-executed, see `mcp_tools/stand_in.rs`)
//! mounted by in-process providers, through the config and the library.

#[path = "mcp_tools/stand_in.rs"]
mod stand_in;

#[path = "mcp_tools/http.rs"]
mod http;

#[path = "mcp_tools/ts_sdk.rs"]
mod ts_sdk;

#[path = "mcp_tools/hostile.rs"]
mod hostile;

use crate::common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{Within, WAIT_LIMIT};
use subagents::agent::{Agent, McpServer, McpServerConfig, McpTransport, Model, ScriptedModel};
use subagents::config::{Config, Configured};
use subagents::providers::InProcessProvider;
use subagents::tool::TaskService;
use subagents::{CancellationToken, Parent, RunResult, Runtime, StartRequest, StopReason};
use tempfile::TempDir;

/// A runtime, the directory the stand-in servers report in, and a cwd.
struct Fixture {
    runtime: Runtime,
    reports: TempDir,
    _home: TempDir,
    cwd: TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let home = tempfile::tempdir().unwrap();
        let runtime = common::runtime_at(home.path());
        Fixture { runtime, reports: tempfile::tempdir().unwrap(), _home: home, cwd: tempfile::tempdir().unwrap() }
    }

    fn server(&self, isolate: bool) -> McpServerConfig {
        let exe = std::env::current_exe().unwrap();
        let env = vec![(stand_in::DIR_VARIABLE.to_owned(), self.reports.path().display().to_string())];
        let transport = McpTransport::Stdio { command: exe, args: Vec::new(), env, inherit_env: Vec::new(), cwd: None };
        let mut config = McpServerConfig::over("t", transport);
        config.isolate = isolate;
        config
    }

    /// `spawn` on the demo model, its children mounting `servers`.
    fn register(&self, servers: Vec<McpServerConfig>) {
        let model: Arc<dyn Model> = Arc::new(ScriptedModel::demo());
        let provider = InProcessProvider::spawn("spawn", model).with_mcp_servers(servers);
        self.runtime.subagents().register_provider(provider).unwrap().keep();
    }

    /// `spawn` on the demo model, scoping no servers: its children mount
    /// their parent's.
    fn register_inheriting(&self) {
        let model: Arc<dyn Model> = Arc::new(ScriptedModel::demo());
        let provider = InProcessProvider::spawn("spawn", model).in_memory();
        self.runtime.subagents().register_provider(provider).unwrap().keep();
    }

    /// A stand-in server named `name`.
    fn named_server(&self, name: &str, isolate: bool) -> McpServerConfig {
        let mut config = self.server(isolate);
        config.name = name.to_owned();
        config
    }

    /// A parent agent (never prompted) that mounted `servers`' tools,
    /// each server started once.
    fn parent_with(&self, servers: &[McpServer]) -> Agent {
        let servers = servers.to_vec();
        let cwd = self.cwd.path().to_path_buf();
        self.runtime.within(WAIT_LIMIT, "a parent mounting its servers", async move {
            let mut builder = Agent::builder(ScriptedModel::demo()).cwd(cwd);
            for server in &servers {
                for tool in server.tools().await.unwrap() {
                    builder.toolset_mut().add_shared(tool).unwrap();
                }
            }
            builder.build_async().await.unwrap()
        })
    }

    /// One run of `request` on `spawn`, disposed.
    fn run_request(&self, request: StartRequest) -> RunResult {
        common::lifecycle(&self.runtime, &self.runtime.subagents(), "spawn", request)
    }

    fn request(&self, task: &str) -> StartRequest {
        StartRequest::new(task, Parent::root(self.cwd.path()), CancellationToken::new())
    }

    fn run(&self, task: &str) -> RunResult {
        common::lifecycle(&self.runtime, &self.runtime.subagents(), "spawn", self.request(task))
    }

    /// The pids of every stand-in server started so far.
    fn pids(&self) -> Vec<u32> {
        reported(self.reports.path(), "pid-")
    }

    fn shut_down(self) -> Vec<u32> {
        let pids = self.pids();
        self.runtime.shutdown_blocking();
        pids
    }
}

fn reported(dir: &Path, prefix: &str) -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.strip_prefix(prefix)?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids
}

/// Whether `pid` runs (a zombie does not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rfind(')').is_some_and(|i| !stat[i + 1..].trim_start().starts_with('Z')))
}

fn assert_gone(pids: &[u32]) {
    let survivors: Vec<&u32> = pids.iter().filter(|pid| alive(**pid)).collect();
    assert!(survivors.is_empty(), "MCP servers survived: {survivors:?}");
}

/// Waits (bounded) until `condition` holds.
fn wait_for(runtime: &Runtime, what: &str, condition: impl Fn() -> bool + Send + 'static) {
    runtime.within(WAIT_LIMIT, what, async move {
        while !condition() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
}

#[test]
fn a_child_mounted_through_the_config_calls_a_tool_and_reads_results_errors_and_structured_content() {
    let fixture = Fixture::new();
    let file = fixture.reports.path().join("subagents.toml");
    let text = format!(
        "[mcp_servers.t]\ncommand = {:?}\nenv = {{ {} = {:?} }}\ntimeout = \"60s\"\n\n\
         [providers.spawn]\nkind = \"spawn\"\nmcp_servers = [\"t\"]\n",
        std::env::current_exe().unwrap().display().to_string(),
        stand_in::DIR_VARIABLE,
        fixture.reports.path().display().to_string(),
    );
    std::fs::write(&file, text).unwrap();
    let config = Config::read(&file).unwrap();
    assert_eq!(config.provider("spawn").unwrap().mcp_servers(), ["t"]);
    let configured = Configured::new(config, None).unwrap();
    let model = Arc::new(ScriptedModel::demo());
    let home = fixture._home.path();
    configured.register_blocking(&fixture.runtime.subagents(), &TaskService::new(), home, model).unwrap();
    assert!(fixture.pids().is_empty(), "a server starts at its first use, not when registered");
    let task = r#"[tool:mcp__t__echo {"text": "hi"}] [tool:mcp__t__fail] [tool:mcp__t__structured {"n": 21}]"#;
    let result = fixture.run(task);
    assert_eq!(result.stop_reason, StopReason::Completed);
    let text = result.text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[..2], ["mcp__t__echo: echo: hi", "mcp__t__fail error: it failed on purpose"], "{text}");
    let structured = lines[2].strip_prefix("mcp__t__structured: ").expect("the structured result");
    let structured: serde_json::Value = serde_json::from_str(structured).unwrap();
    assert_eq!(structured, serde_json::json!({"n": 21, "doubled": 42}), "structuredContent as its JSON");
    assert_eq!(fixture.pids().len(), 1, "one server for the provider");
    let pids = fixture.shut_down();
    assert_gone(&pids);
}

#[test]
fn a_server_killed_mid_call_is_a_tool_error_the_run_survives_and_the_next_call_restarts_it() {
    let fixture = Fixture::new();
    fixture.register(vec![fixture.server(false)]);
    let subagents = fixture.runtime.subagents();
    let request = fixture.request(r#"[tool:mcp__t__sleep {"ms": 60000}]"#);
    let reports = fixture.reports.path().to_path_buf();
    let result = fixture.runtime.within(WAIT_LIMIT, "a run whose server is killed", async move {
        let run = subagents.start("spawn", request).await.unwrap();
        while reported(&reports, "sleeping-").is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let pid = reported(&reports, "pid-")[0];
        std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status().unwrap();
        let result = run.result().await.unwrap();
        run.dispose().await.unwrap();
        result
    });
    assert_eq!(result.stop_reason, StopReason::Completed, "the run goes on: {:?}", result.text());
    assert!(
        result.text().starts_with("mcp__t__sleep error: the MCP server \"t\" exited during the call"),
        "{}",
        result.text()
    );
    let again = fixture.run(r#"[tool:mcp__t__echo {"text": "back"}]"#);
    assert_eq!(again.text(), "mcp__t__echo: echo: back");
    assert_eq!(fixture.pids().len(), 2, "started again");
    let pids = fixture.shut_down();
    assert_gone(&pids);
}

#[test]
fn cancelling_a_run_sends_the_server_notifications_cancelled_for_its_call() {
    let fixture = Fixture::new();
    fixture.register(vec![fixture.server(false)]);
    assert_eq!(cancelled_mid_call(&fixture, r#"[tool:mcp__t__sleep {"ms": 60000}]"#), StopReason::Aborted);
    let pids = fixture.shut_down();
    assert_gone(&pids);
}

/// Runs `task` (one sleeping call) on `spawn`, cancels it once the server
/// sleeps, and waits until the server saw the cancel: the run's stop reason.
fn cancelled_mid_call(fixture: &Fixture, task: &str) -> StopReason {
    let subagents = fixture.runtime.subagents();
    let request = fixture.request(task);
    let reports = fixture.reports.path().to_path_buf();
    let result = fixture.runtime.within(WAIT_LIMIT, "a cancelled run", async move {
        let run = subagents.start("spawn", request).await.unwrap();
        while reported(&reports, "sleeping-").is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        run.cancel();
        let result = run.result().await.unwrap();
        run.dispose().await.unwrap();
        result
    });
    let reports = fixture.reports.path().to_path_buf();
    wait_for(&fixture.runtime, "the server to see the cancel", move || !reported(&reports, "cancelled-").is_empty());
    result.stop_reason
}

/// Runs `task` on `spawn` until every tool it calls is mounted: the
/// refetch follows a `list_changed` notification, so a run soon after
/// mounts what the server added.
fn once_mounted(fixture: &Fixture, task: &str) -> RunResult {
    let subagents = fixture.runtime.subagents();
    let task = task.to_owned();
    fixture.runtime.within(WAIT_LIMIT, "a run that mounts the added tools", async move {
        loop {
            let run = subagents.start("spawn", fixture_request(&task)).await.unwrap();
            let result = run.result().await.unwrap();
            run.dispose().await.unwrap();
            if !result.text().contains("no tool named") {
                return result;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
}

fn fixture_request(task: &str) -> StartRequest {
    StartRequest::new(task, Parent::root("/tmp"), CancellationToken::new())
}

#[test]
fn a_call_past_its_timeout_is_a_tool_error_and_the_server_is_told_to_stop() {
    let fixture = Fixture::new();
    let mut server = fixture.server(false);
    server.call_timeout = Duration::from_millis(300);
    fixture.register(vec![server]);
    let result = fixture.run(r#"[tool:mcp__t__sleep {"ms": 60000}]"#);
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(result.text(), "mcp__t__sleep error: the MCP server \"t\" did not answer \"sleep\" within 300ms");
    let reports = fixture.reports.path().to_path_buf();
    wait_for(&fixture.runtime, "the server to see the cancel", move || !reported(&reports, "cancelled-").is_empty());
    let pids = fixture.shut_down();
    assert_gone(&pids);
}

#[test]
fn a_changed_tool_list_is_fetched_again_and_later_runs_mount_the_new_tool() {
    let fixture = Fixture::new();
    let server = McpServer::new(fixture.server(false));
    let names = |server: McpServer| async move {
        let tools = server.tools().await.unwrap();
        tools.iter().map(|tool| tool.spec().name).collect::<Vec<_>>()
    };
    let before = fixture.runtime.within(WAIT_LIMIT, "the first list", names(server.clone()));
    assert!(!before.contains(&"mcp__t__added".to_owned()), "{before:?}");
    fixture.register(vec![fixture.server(false)]);
    let changed = fixture.run("[tool:mcp__t__change_tools]");
    assert_eq!(changed.text(), "mcp__t__change_tools: changed");
    let after = once_mounted(&fixture, "[tool:mcp__t__added]");
    assert_eq!(after.text(), "mcp__t__added: the added tool answers");
    fixture.runtime.within(WAIT_LIMIT, "the direct server to close", async move { server.shutdown().await });
    let pids = fixture.shut_down();
    assert_gone(&pids);
}

#[test]
fn fifty_concurrent_calls_from_ten_children_share_one_server_and_all_answer() {
    let fixture = Fixture::new();
    fixture.register(vec![fixture.server(false)]);
    let subagents = fixture.runtime.subagents();
    let parent = Parent::root(fixture.cwd.path());
    let answers = fixture.runtime.within(WAIT_LIMIT, "ten children of five calls each", async move {
        let runs = (0..10).map(|child| {
            let (subagents, parent) = (subagents.clone(), parent.clone());
            async move {
                let task: String =
                    (0..5).map(|call| format!(r#"[tool:mcp__t__echo {{"text": "{child}-{call}"}}] "#)).collect();
                let run = subagents.start("spawn", StartRequest::new(task, parent, CancellationToken::new())).await;
                let run = run.unwrap();
                let result = run.result().await.unwrap();
                run.dispose().await.unwrap();
                result.text()
            }
        });
        futures_util::future::join_all(runs).await
    });
    for (child, answer) in answers.iter().enumerate() {
        let expected: Vec<String> = (0..5).map(|call| format!("mcp__t__echo: echo: {child}-{call}")).collect();
        assert_eq!(answer, &expected.join("\n"));
    }
    assert_eq!(fixture.pids().len(), 1, "one shared server");
    assert_eq!(fixture.runtime.live().processes, 1, "the shared server is a live child until shutdown");
    let pids = fixture.shut_down();
    assert_gone(&pids);
}

#[test]
fn an_isolated_server_is_started_per_run_and_reaped_at_its_dispose() {
    let fixture = Fixture::new();
    fixture.register(vec![fixture.server(true)]);
    for n in 0..3 {
        let result = fixture.run(&format!(r#"[tool:mcp__t__echo {{"text": "{n}"}}]"#));
        assert_eq!(result.text(), format!("mcp__t__echo: echo: {n}"));
    }
    let pids = fixture.pids();
    assert_eq!(pids.len(), 3, "one server per run");
    assert_gone(&pids);
    common::no_children_left(&fixture.runtime);
    fixture.shut_down();
}

#[test]
fn a_child_delegates_through_subagents_mcp_mounted_as_a_server() {
    let fixture = Fixture::new();
    let inner = fixture.reports.path().join("inner");
    let mut server = McpServerConfig::new(
        "self",
        env!("CARGO_BIN_EXE_subagents"),
        vec!["mcp".to_owned(), "--home".to_owned(), inner.display().to_string()],
    );
    server.call_timeout = Duration::from_secs(60);
    fixture.register(vec![server]);
    let task = r#"[tool:mcp__self__subagent {"description": "greet", "prompt": "say hello"}]"#;
    let result = fixture.run(task);
    let (name, structured) = result.text().split_once(": ").map(|(n, s)| (n.to_owned(), s.to_owned())).unwrap();
    assert_eq!(name, "mcp__self__subagent");
    let structured: serde_json::Value = serde_json::from_str(&structured).unwrap();
    assert_eq!(structured["output"], "handled: say hello", "{structured}");
    fixture.shut_down();
    common::no_process_mentions(&inner);
}

#[test]
fn a_server_that_cannot_start_leaves_the_child_without_its_tools_and_the_run_completes() {
    let fixture = Fixture::new();
    fixture.register(vec![McpServerConfig::new("broken", "false", Vec::new()), fixture.server(false)]);
    let result = fixture.run(r#"[tool:mcp__broken__anything] [tool:mcp__t__echo {"text": "still here"}]"#);
    assert_eq!(result.stop_reason, StopReason::Completed);
    let text = result.text();
    assert!(text.starts_with("mcp__broken__anything error: no tool named"), "{text}");
    assert!(text.ends_with("mcp__t__echo: echo: still here"), "the other server's tools are mounted: {text}");
    let pids = fixture.shut_down();
    assert_gone(&pids);
}

#[test]
fn a_provider_naming_an_undefined_server_is_refused_at_its_place() {
    let text =
        "[mcp_servers.files]\ncommand = \"sh\"\n\n[providers.spawn]\nkind = \"spawn\"\nmcp_servers = [\"git\"]\n";
    let error = Config::parse(text, "f.toml").unwrap_err();
    assert_eq!(
        error.to_string(),
        "f.toml:6:16: provider \"spawn\" mounts MCP server \"git\", which no [mcp_servers] table defines"
    );
    let both = "[mcp_servers.web]\nurl = \"http://127.0.0.1:1/mcp\"\ncommand = \"sh\"\n";
    assert!(Config::parse(both, "f.toml").unwrap_err().to_string().contains("both a `command` and a `url`"));
}

fn child_request(parent: &Agent, task: &str) -> StartRequest {
    StartRequest::new(task, parent.as_parent(), CancellationToken::new())
}

/// Closes the parent's servers, then the runtime; every server's pid is gone.
fn close(fixture: Fixture, servers: Vec<McpServer>) {
    let runtime = &fixture.runtime;
    runtime.within(WAIT_LIMIT, "the parent's servers to close", async move {
        futures_util::future::join_all(servers.iter().map(McpServer::shutdown)).await;
    });
    let pids = fixture.shut_down();
    assert_gone(&pids);
}

#[test]
fn a_child_inherits_its_parent_agents_servers_on_the_same_connection() {
    let fixture = Fixture::new();
    fixture.register_inheriting();
    let server = McpServer::new(fixture.server(false));
    let parent = fixture.parent_with(std::slice::from_ref(&server));
    assert_eq!(fixture.pids().len(), 1, "the parent started its server");
    for n in 0..3 {
        let result = fixture.run_request(child_request(&parent, &format!(r#"[tool:mcp__t__echo {{"text": "{n}"}}]"#)));
        assert_eq!(result.text(), format!("mcp__t__echo: echo: {n}"));
    }
    assert_eq!(fixture.pids().len(), 1, "the children share the parent's connection: no second spawn");
    let orphan = fixture.run_request(fixture.request(r#"[tool:mcp__t__echo {"text": "x"}]"#));
    assert!(
        orphan.text().starts_with("mcp__t__echo error: no tool named"),
        "no parent agent, no servers: {}",
        orphan.text()
    );
    close(fixture, vec![server]);
}

#[test]
fn an_inherited_isolated_server_is_started_afresh_for_the_child_and_reaped_at_its_dispose() {
    let fixture = Fixture::new();
    fixture.register_inheriting();
    let server = McpServer::new(fixture.server(true));
    let parent = fixture.parent_with(std::slice::from_ref(&server));
    let result = fixture.run_request(child_request(&parent, r#"[tool:mcp__t__echo {"text": "own"}]"#));
    assert_eq!(result.text(), "mcp__t__echo: echo: own");
    let pids = fixture.pids();
    assert_eq!(pids.len(), 2, "the parent's and the child's own");
    assert!(alive(pids[0]) != alive(pids[1]), "the child's server is reaped at its dispose, the parent's lives");
    close(fixture, vec![server]);
}

#[test]
fn a_provider_scoping_an_empty_list_gives_its_children_none_of_their_parents_servers() {
    let fixture = Fixture::new();
    fixture.register(Vec::new());
    let server = McpServer::new(fixture.server(false));
    let parent = fixture.parent_with(std::slice::from_ref(&server));
    let result = fixture.run_request(child_request(&parent, r#"[tool:mcp__t__echo {"text": "x"}]"#));
    assert!(result.text().starts_with("mcp__t__echo error: no tool named"), "{}", result.text());
    close(fixture, vec![server]);
}

#[test]
fn a_start_request_mounts_the_subset_it_names_and_the_tool_filter_still_applies() {
    let fixture = Fixture::new();
    fixture.register_inheriting();
    let servers =
        vec![McpServer::new(fixture.named_server("t", false)), McpServer::new(fixture.named_server("u", false))];
    let parent = fixture.parent_with(&servers);
    let task = r#"[tool:mcp__t__echo {"text": "t"}] [tool:mcp__u__echo {"text": "u"}] [tool:mcp__u__fail]"#;
    let filter = subagents::seam::ToolFilter::deny(["mcp__u__fail"]);
    let request = child_request(&parent, task).with_mcp_servers(["u"]).with_tool_filter(filter);
    let text = fixture.run_request(request).text();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("mcp__t__echo error: no tool named"), "{text}");
    assert_eq!(lines[1], "mcp__u__echo: echo: u", "{text}");
    assert!(lines[2].starts_with("mcp__u__fail error:") && !lines[2].contains("failed on purpose"), "{text}");
    close(fixture, servers);
}

#[test]
fn a_start_request_naming_a_server_the_child_would_not_have_is_refused_at_start() {
    let fixture = Fixture::new();
    fixture.register_inheriting();
    let server = McpServer::new(fixture.server(false));
    let parent = fixture.parent_with(std::slice::from_ref(&server));
    let subagents = fixture.runtime.subagents();
    let request = child_request(&parent, "x").with_mcp_servers(["t", "git"]);
    let error = fixture.runtime.within(WAIT_LIMIT, "a refused start", async move {
        subagents.start("spawn", request).await.map(|_| ()).unwrap_err()
    });
    assert_eq!(error.code(), "INVALID_REQUEST");
    let message = error.to_string();
    assert!(message.contains("mcp_servers") && message.contains("\"git\"") && message.contains("t"), "{message}");
    common::no_children_left(&fixture.runtime);
    close(fixture, vec![server]);
}

#[test]
fn a_configured_provider_without_mcp_servers_inherits_and_one_with_an_empty_list_mounts_none() {
    let fixture = Fixture::new();
    let text = "[providers.inherits]\nkind = \"spawn\"\n\n[providers.scoped]\nkind = \"spawn\"\nmcp_servers = []\n";
    let configured = Configured::new(Config::parse(text, "f.toml").unwrap(), None).unwrap();
    let model = Arc::new(ScriptedModel::demo());
    let home = fixture._home.path();
    configured.register_blocking(&fixture.runtime.subagents(), &TaskService::new(), home, model).unwrap();
    let server = McpServer::new(fixture.server(false));
    let parent = fixture.parent_with(std::slice::from_ref(&server));
    let subagents = fixture.runtime.subagents();
    let task = r#"[tool:mcp__t__echo {"text": "x"}]"#;
    let inherited = common::lifecycle(&fixture.runtime, &subagents, "inherits", child_request(&parent, task));
    assert_eq!(inherited.text(), "mcp__t__echo: echo: x");
    let scoped = common::lifecycle(&fixture.runtime, &subagents, "scoped", child_request(&parent, task));
    assert!(scoped.text().starts_with("mcp__t__echo error: no tool named"), "{}", scoped.text());
    close(fixture, vec![server]);
}

#[test]
fn an_acp_provider_refuses_a_server_setting_its_agent_would_not_see() {
    let text = "[mcp_servers.files]\ncommand = \"sh\"\ninherit_env = [\"FILES_*\"]\n\n\
                [providers.agent]\nkind = \"acp\"\ncommand = \"sh\"\nmcp_servers = [\"files\"]\n";
    let error = Config::parse(text, "f.toml").unwrap_err().to_string();
    assert!(error.starts_with("f.toml:8:16: acp provider \"agent\" passes MCP server \"files\""), "{error}");
    assert!(error.contains("`inherit_env` would not apply"), "{error}");
    let plain = "[mcp_servers.files]\ncommand = \"sh\"\nenv = { A = \"b\" }\n\n\
                 [providers.agent]\nkind = \"acp\"\ncommand = \"sh\"\nmcp_servers = [\"files\"]\n";
    let config = Config::parse(plain, "f.toml").unwrap();
    assert_eq!(config.provider("agent").unwrap().mcp_servers(), ["files"]);
}

#[test]
fn subagents_acp_mounts_the_servers_its_client_sends_and_its_children_inherit_them() {
    use subagents::providers::{AcpConfig, AcpMcpServer, AcpProvider};
    let fixture = Fixture::new();
    let web = http::HttpServer::start(fixture.reports.path(), None);
    let reports = fixture.reports.path().display().to_string();
    let stdio = AcpMcpServer::stdio("t", std::env::current_exe().unwrap(), Vec::new())
        .with_env(stand_in::DIR_VARIABLE, reports);
    let http = AcpMcpServer::http("web", web.url()).with_header("Authorization", format!("Bearer {}", http::TOKEN));
    let home = fixture._home.path().join("agent-home").display().to_string();
    let mut config =
        AcpConfig::new("agent", env!("CARGO_BIN_EXE_subagents"), vec!["acp".into(), "--home".into(), home]);
    config.mcp_servers = vec![stdio, http];
    let provider = fixture.runtime.block_on(async move { AcpProvider::new(config).await.unwrap() });
    fixture.runtime.subagents().register_provider(provider).unwrap().keep();
    let subagents = fixture.runtime.subagents();
    let task = r#"[tool:mcp__t__echo {"text": "a"}] [tool:mcp__web__echo {"text": "b"}] [tool:subagent {"description": "d", "prompt": "[tool:mcp__t__echo {\"text\": \"child\"}]"}]"#;
    let result = common::lifecycle(&fixture.runtime, &subagents, "agent", fixture.request(task));
    assert_eq!(result.stop_reason, StopReason::Completed, "{:?}", result.text());
    let text = result.text();
    assert!(text.contains("mcp__t__echo: echo: a"), "{text}");
    assert!(text.contains("mcp__web__echo: echo: b"), "{text}");
    assert!(text.contains("echo: child"), "the session's child inherits its servers: {text}");
    let mut pids = fixture.shut_down();
    pids.retain(|pid| *pid != web.pid());
    assert_eq!(pids.len(), 1, "one stdio server for the session, shared with its child");
    assert_gone(&pids);
}

#[test]
fn a_process_child_starts_its_own_copies_of_its_providers_servers_or_its_parents() {
    use subagents::providers::{ProcessConfig, ProcessProvider};
    let fixture = Fixture::new();
    let web = http::HttpServer::start(fixture.reports.path(), None);
    let process = |name: &str, servers: Option<Vec<McpServerConfig>>| {
        let mut config = ProcessConfig::new(name, fixture._home.path().join(name));
        config.bin = env!("CARGO_BIN_EXE_subagents").into();
        config.mcp_servers = servers;
        let provider = ProcessProvider::new(config).unwrap();
        fixture.runtime.subagents().register_provider(provider).unwrap().keep();
    };
    let headers = vec![("Authorization".to_owned(), format!("Bearer {}", http::TOKEN))];
    let http = McpServerConfig::over("web", McpTransport::Http { url: web.url(), headers });
    process("scoped", Some(vec![fixture.server(false), http]));
    process("inheriting", None);
    let subagents = fixture.runtime.subagents();
    let task = r#"[tool:mcp__t__echo {"text": "a"}] [tool:mcp__web__echo {"text": "b"}]"#;
    let scoped = common::lifecycle(&fixture.runtime, &subagents, "scoped", fixture.request(task));
    assert_eq!(scoped.text(), "mcp__t__echo: echo: a\nmcp__web__echo: echo: b");
    let first = fixture.pids();
    assert_eq!(first.len() - 1, 1, "the child started the stdio server (beside the HTTP stand-in)");
    let inherited = McpServer::new(fixture.server(false));
    let parent = fixture.parent_with(std::slice::from_ref(&inherited));
    let request = child_request(&parent, r#"[tool:mcp__t__echo {"text": "inherited"}]"#);
    let result = common::lifecycle(&fixture.runtime, &subagents, "inheriting", request);
    assert_eq!(result.text(), "mcp__t__echo: echo: inherited");
    let request =
        child_request(&parent, r#"[tool:mcp__t__echo {"text": "none"}]"#).with_mcp_servers(Vec::<String>::new());
    let result = common::lifecycle(&fixture.runtime, &subagents, "inheriting", request);
    assert!(result.text().starts_with("mcp__t__echo error: no tool named"), "{}", result.text());
    let refused = child_request(&parent, "hi").with_mcp_servers(["nope"]);
    let refused = fixture.runtime.within(WAIT_LIMIT, "a refused start", async move {
        subagents.start("inheriting", refused).await.err().map(|error| error.to_string())
    });
    assert!(refused.as_deref().is_some_and(|error| error.contains("no MCP server named \"nope\"")), "{refused:?}");
    // The parent's own server, and one copy for the inheriting child.
    let mut pids = fixture.pids();
    pids.retain(|pid| *pid != web.pid());
    assert_eq!(pids.len(), 3, "{pids:?}");
    let parents = pids.iter().filter(|pid| !first.contains(pid)).count();
    assert_eq!(parents, 2);
    drop(web);
    close(fixture, vec![inherited]);
}
