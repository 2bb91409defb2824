//! Streamable HTTP MCP servers: the stand-in serving its tools over HTTP
//! on loopback (a process of its own, so a test can kill it and bring it
//! back at the same URL), mounted by `spawn` children.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{cancelled_mid_call, once_mounted, reported, stand_in, Fixture};
use crate::common::{self, Within, WAIT_LIMIT};
use std::sync::Arc;
use subagents::agent::ScriptedModel;
use subagents::agent::{McpServer, McpServerConfig, McpServerError, McpTransport};
use subagents::config::{Config, Configured};
use subagents::tool::TaskService;
use subagents::StopReason;

pub(super) const TOKEN: &str = "s3cret";

/// The stand-in serving HTTP; killed when dropped.
pub(super) struct HttpServer {
    child: Child,
    port: u16,
}

impl HttpServer {
    /// On a free port, or on `port`.
    pub(super) fn start(reports: &Path, port: Option<u16>) -> HttpServer {
        let port_file = reports.join(format!("port-{}", port.unwrap_or(0)));
        let _ = std::fs::remove_file(&port_file);
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .env(stand_in::DIR_VARIABLE, reports)
            .env(stand_in::HTTP_VARIABLE, &port_file)
            .env(stand_in::TOKEN_VARIABLE, TOKEN)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(port) = port {
            command.env(stand_in::PORT_VARIABLE, port.to_string());
        }
        HttpServer::spawn(command, &port_file, "the HTTP stand-in")
    }

    /// Spawns `command`, a server that writes its port to `port_file` once
    /// it listens.
    pub(super) fn spawn(mut command: Command, port_file: &Path, what: &str) -> HttpServer {
        let child = command.spawn().unwrap();
        let deadline = Instant::now() + WAIT_LIMIT;
        let port = loop {
            if let Some(port) = std::fs::read_to_string(port_file).ok().and_then(|text| text.parse().ok()) {
                break port;
            }
            assert!(Instant::now() < deadline, "{what} did not listen within {WAIT_LIMIT:?}");
            std::thread::sleep(Duration::from_millis(10));
        };
        HttpServer { child, port }
    }

    pub(super) fn port(&self) -> u16 {
        self.port
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(super) fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The server at `url` with the stand-in's token.
fn with_token(name: &str, url: String) -> McpServerConfig {
    let headers = vec![("Authorization".to_owned(), format!("Bearer {TOKEN}"))];
    McpServerConfig::over(name, McpTransport::Http { url, headers })
}

fn write_config(dir: &Path, text: &str) -> PathBuf {
    let file = dir.join("subagents.toml");
    std::fs::write(&file, text).unwrap();
    file
}

#[test]
fn a_child_mounts_a_streamable_http_server_from_the_config_with_its_header() {
    let fixture = Fixture::new();
    let server = HttpServer::start(fixture.reports.path(), None);
    let _token = common::env::lock();
    std::env::set_var("STAND_IN_BEARER", TOKEN);
    let text = format!(
        "[mcp_servers.web]\nurl = {:?}\nheaders = {{ Authorization = \"Bearer ${{STAND_IN_BEARER}}\" }}\n\
         timeout = \"60s\"\n\n[providers.spawn]\nkind = \"spawn\"\nmcp_servers = [\"web\"]\n",
        server.url()
    );
    let config = Config::read(&write_config(fixture.reports.path(), &text)).unwrap();
    std::env::remove_var("STAND_IN_BEARER");
    let configured = Configured::new(config, None).unwrap();
    let model = Arc::new(ScriptedModel::demo());
    let home = fixture._home.path();
    configured.register_blocking(&fixture.runtime.subagents(), &TaskService::new(), home, model).unwrap();
    let task = r#"[tool:mcp__web__echo {"text": "hi"}] [tool:mcp__web__fail] [tool:mcp__web__structured {"n": 21}]"#;
    let result = fixture.run(task);
    assert_eq!(result.stop_reason, StopReason::Completed);
    let text = result.text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[..2], ["mcp__web__echo: echo: hi", "mcp__web__fail error: it failed on purpose"], "{text}");
    let structured: serde_json::Value =
        serde_json::from_str(lines[2].strip_prefix("mcp__web__structured: ").expect("the structured result")).unwrap();
    assert_eq!(structured, serde_json::json!({"n": 21, "doubled": 42}));
    let again = fixture.run(r#"[tool:mcp__web__echo {"text": "again"}]"#);
    assert_eq!(again.text(), "mcp__web__echo: echo: again", "the shared connection serves the next run");
    fixture.runtime.shutdown_blocking();
}

#[test]
fn a_server_refusing_the_header_does_not_start_and_says_so() {
    let fixture = Fixture::new();
    let server = HttpServer::start(fixture.reports.path(), None);
    let wrong = McpServer::new(McpServerConfig::over(
        "web",
        McpTransport::Http { url: server.url(), headers: vec![("Authorization".into(), "Bearer wrong".into())] },
    ));
    let error = fixture.runtime.within(WAIT_LIMIT, "a refused start", async move { wrong.tools().await.err() });
    let Some(McpServerError::DidNotStart { server, reason }) = error else { panic!("started: {error:?}") };
    assert_eq!(server, "web");
    assert_eq!(reason.to_string(), "initialize failed: unexpected server response: HTTP 401 Unauthorized: no token");
    let nowhere = McpServer::new(with_token("web", "http://127.0.0.1:9/mcp".to_owned()));
    let error =
        fixture.runtime.within(WAIT_LIMIT, "a start with nobody listening", async move { nowhere.tools().await.err() });
    assert!(matches!(error, Some(McpServerError::DidNotStart { .. })), "{error:?}");
    fixture.runtime.shutdown_blocking();
}

#[test]
fn a_server_killed_mid_call_is_a_tool_error_and_one_back_at_its_url_answers_the_next_call() {
    let fixture = Fixture::new();
    let mut server = HttpServer::start(fixture.reports.path(), None);
    let port = server.port;
    let mut config = with_token("t", server.url());
    config.call_timeout = Duration::from_secs(120);
    fixture.register(vec![config]);
    let subagents = fixture.runtime.subagents();
    let request = fixture.request(r#"[tool:mcp__t__sleep {"ms": 60000}]"#);
    let reports = fixture.reports.path().to_path_buf();
    let run = fixture.runtime.within(WAIT_LIMIT, "a call to start", async move {
        let run = subagents.start("spawn", request).await.unwrap();
        while reported(&reports, "sleeping-").is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        run
    });
    server.kill();
    let result = fixture.runtime.within(WAIT_LIMIT, "the run to go on", async move {
        let result = run.result().await.unwrap();
        run.dispose().await.unwrap();
        result
    });
    assert_eq!(result.stop_reason, StopReason::Completed, "the run goes on: {:?}", result.text());
    let broke = "mcp__t__sleep error: the connection to the MCP server \"t\" broke during the call to \"sleep\"";
    assert!(result.text().starts_with(broke), "{}", result.text());
    let _back = HttpServer::start(fixture.reports.path(), Some(port));
    let again = fixture.run(r#"[tool:mcp__t__echo {"text": "back"}]"#);
    assert_eq!(again.text(), "mcp__t__echo: echo: back", "a new session with the server back at its URL");
    fixture.runtime.shutdown_blocking();
}

#[test]
fn cancelling_a_run_tells_the_http_server_to_stop_its_call() {
    let fixture = Fixture::new();
    let server = HttpServer::start(fixture.reports.path(), None);
    fixture.register(vec![with_token("t", server.url())]);
    assert_eq!(cancelled_mid_call(&fixture, r#"[tool:mcp__t__sleep {"ms": 60000}]"#), StopReason::Aborted);
    fixture.runtime.shutdown_blocking();
}

#[test]
fn an_isolated_http_server_has_a_session_per_run_and_a_shared_one_a_single_session() {
    for (isolate, sessions) in [(true, 3), (false, 1)] {
        let fixture = Fixture::new();
        let server = HttpServer::start(fixture.reports.path(), None);
        let mut config = with_token("t", server.url());
        config.isolate = isolate;
        fixture.register(vec![config]);
        for _ in 0..3 {
            assert_eq!(fixture.run(r#"[tool:mcp__t__echo {"text": "x"}]"#).text(), "mcp__t__echo: echo: x");
        }
        assert_eq!(reported(fixture.reports.path(), "session-").len(), sessions, "isolate = {isolate}");
        fixture.runtime.shutdown_blocking();
    }
}

#[test]
fn a_header_the_protocol_sets_or_a_value_no_header_can_carry_is_refused_at_its_place() {
    let dir = tempfile::tempdir().unwrap();
    for (headers, expected) in [
        ("{ Accept = \"text/plain\" }", "header \"Accept\" is set by the protocol"),
        ("{ \"Mcp-Session-Id\" = \"x\" }", "is set by the protocol"),
        ("{ Authorization = \"Bearer a\\nb\" }", "a character an HTTP header cannot carry"),
        ("{ \"bad name\" = \"x\" }", "is not an HTTP token"),
    ] {
        let text = format!("[mcp_servers.web]\nurl = \"http://127.0.0.1:1/mcp\"\nheaders = {headers}\n");
        let error = Config::read(&write_config(dir.path(), &text)).unwrap_err().to_string();
        assert!(error.contains(expected) && error.contains(":3:"), "{headers}: {error}");
    }
}

#[test]
fn a_tool_list_changed_over_http_is_fetched_again_and_a_later_run_mounts_the_new_tool() {
    let fixture = Fixture::new();
    let server = HttpServer::start(fixture.reports.path(), None);
    fixture.register(vec![with_token("t", server.url())]);
    assert_eq!(fixture.run("[tool:mcp__t__change_tools]").text(), "mcp__t__change_tools: changed");
    let after = once_mounted(&fixture, "[tool:mcp__t__added]");
    assert_eq!(after.text(), "mcp__t__added: the added tool answers");
    fixture.runtime.shutdown_blocking();
}
