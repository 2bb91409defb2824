//! Hostile MCP servers: one that paginates `tools/list` for ever, one that
//! floods `notifications/tools/list_changed`, one whose tools cannot be
//! mounted, one that never answers `initialize`, and ones that leave a
//! grandchild in a session of its own or an orphan.

use std::time::Duration;

use subagents::agent::{McpServerConfig, McpTransport};
use subagents::StopReason;

use super::{alive, assert_gone, reported, stand_in, Fixture};
use crate::common;

impl Fixture {
    /// A stand-in server misbehaving as `mode` (`STAND_IN_MCP_HOSTILE`).
    fn hostile(&self, mode: &str, isolate: bool) -> McpServerConfig {
        let mut config = self.server(isolate);
        if let McpTransport::Stdio { env, .. } = &mut config.transport {
            env.push((stand_in::HOSTILE_VARIABLE.to_owned(), mode.to_owned()));
        }
        config
    }
}

#[test]
fn a_server_paginating_for_ever_is_listed_to_the_page_bound_and_its_tools_answer() {
    let fixture = Fixture::new();
    let mut server = fixture.hostile("paginate", false);
    server.initialize_timeout = Duration::from_secs(5);
    fixture.register(vec![server]);
    let result = fixture.run(r#"[tool:mcp__t__echo {"text": "listed"}] [tool:mcp__t__list_count]"#);
    assert_eq!(result.stop_reason, StopReason::Completed);
    let text = result.text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "mcp__t__echo: echo: listed", "{text}");
    let (pages, _) = list_counts(lines[1]);
    assert_eq!(pages, 64, "one listing of at most 64 pages");
    let pids = fixture.shut_down();
    assert_gone(&pids);
}

#[test]
fn a_flood_of_list_changed_notifications_is_listed_one_refresh_at_a_time_and_calls_still_answer() {
    let fixture = Fixture::new();
    fixture.register(vec![fixture.server(false)]);
    let flood = fixture.run(r#"[tool:mcp__t__flood {"n": 5000}]"#);
    assert_eq!(flood.text(), "mcp__t__flood: flooded");
    let counted = fixture.run(r#"[tool:mcp__t__echo {"text": "still answers"}] [tool:mcp__t__list_count]"#);
    let text = counted.text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "mcp__t__echo: echo: still answers", "{text}");
    let (lists, most_at_once) = list_counts(lines[1]);
    assert_eq!(most_at_once, 1, "one listing at a time ({lists} in all)");
    // Each listing takes the notifications that came during the one before.
    assert!(lists < 1_000, "5,000 notifications made {lists} listings");
    let pids = fixture.shut_down();
    assert_gone(&pids);
}

/// `list_count`'s answer: listings in all, and the most at once.
fn list_counts(line: &str) -> (usize, usize) {
    let counts = line.strip_prefix("mcp__t__list_count: ").unwrap_or_else(|| panic!("{line}"));
    let (all, most) = counts.split_once(' ').unwrap();
    (all.parse().unwrap(), most.parse().unwrap())
}

#[test]
fn a_call_of_a_tool_left_out_or_of_a_server_that_never_initialized_says_why() {
    let fixture = Fixture::new();
    // `sleep` reads nothing and answers nothing: no initialize.
    let mut silent = McpServerConfig::new("h", "sleep", vec!["30".to_owned()]);
    silent.initialize_timeout = Duration::from_millis(300);
    fixture.register(vec![silent, fixture.hostile("huge_schema", false)]);
    let result = fixture.run("[tool:mcp__h__echo] [tool:mcp__t__huge] [tool:mcp__t__nothing]");
    assert_eq!(result.stop_reason, StopReason::Completed);
    let text = result.text();
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with(
            "mcp__h__echo error: no tool named \"mcp__h__echo\": the MCP server \"h\" did not start: no answer to \
             initialize within 300ms; available: "
        ),
        "{text}"
    );
    assert!(
        lines[1].starts_with(
            "mcp__t__huge error: no tool named \"mcp__t__huge\": the MCP server \"t\" lists \"huge\", but it was \
             left out: its input schema is"
        ),
        "{text}"
    );
    assert!(lines[1].contains("over the 65536 a tool may have"), "{text}");
    assert!(
        lines[2].starts_with(
            "mcp__t__nothing error: no tool named \"mcp__t__nothing\": the MCP server \"t\" does not list"
        ),
        "{text}"
    );
    let pids = fixture.shut_down();
    assert_gone(&pids);
}

#[test]
fn a_grandchild_a_server_started_in_a_session_of_its_own_is_gone_after_the_dispose() {
    let fixture = Fixture::new();
    fixture.register(vec![fixture.server(true)]);
    let result = fixture.run("[tool:mcp__t__daemon]");
    assert!(result.text().starts_with("mcp__t__daemon: "), "{}", result.text());
    assert_grandchild_gone(
        fixture.reports.path(),
        "the server's grandchild in its own session survived the run's dispose",
    );
    let pids = fixture.shut_down();
    assert_gone(&pids);
}

/// Asserts that the grandchild the stand-in reported is gone (killing it
/// if not, so a failing test leaves nothing behind).
fn assert_grandchild_gone(reports: &std::path::Path, what: &str) {
    let grandchildren = reported(reports, "grandchild-");
    assert_eq!(grandchildren.len(), 1, "the stand-in started one grandchild");
    let survived = alive(grandchildren[0]);
    if survived {
        std::process::Command::new("kill").args(["-KILL", &grandchildren[0].to_string()]).status().unwrap();
    }
    assert!(!survived, "{what}");
}

#[test]
fn the_binary_adopts_the_orphan_of_a_double_fork_and_leaves_nothing_when_it_ends() {
    let (reports, home) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let config = reports.path().join("subagents.toml");
    let text = format!(
        "[mcp_servers.t]\ncommand = {:?}\nenv = {{ {} = {:?} }}\n\n\
         [providers.spawn]\nkind = \"spawn\"\nmcp_servers = [\"t\"]\n",
        std::env::current_exe().unwrap().display().to_string(),
        stand_in::DIR_VARIABLE,
        reports.path().display().to_string(),
    );
    std::fs::write(&config, text).unwrap();
    let task = r#"[tool:subagent {"description": "d", "prompt": "[tool:mcp__t__orphan]"}]"#;
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"));
    command.args(["run", task, "--config"]).arg(&config).arg("--home").arg(home.path()).env_remove("RUST_LOG");
    let output = common::output_within(&mut command, common::WAIT_LIMIT, "subagents run");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_grandchild_gone(
        reports.path(),
        &format!("the orphan of the server's double fork outlived the binary: {stderr}"),
    );
    assert_gone(&reported(reports.path(), "pid-"));
}

#[test]
fn a_process_childs_call_of_a_server_that_never_initialized_says_why() {
    use subagents::providers::{ProcessConfig, ProcessProvider};
    let fixture = Fixture::new();
    let mut silent = McpServerConfig::new("h", "sleep", vec!["30".to_owned()]);
    silent.initialize_timeout = Duration::from_millis(300);
    let mut config = ProcessConfig::new("process", fixture._home.path().join("process"));
    config.bin = env!("CARGO_BIN_EXE_subagents").into();
    config.mcp_servers = Some(vec![silent]);
    fixture.runtime.subagents().register_provider(ProcessProvider::new(config).unwrap()).unwrap().keep();
    let request = fixture.request("[tool:mcp__h__echo]");
    let result = common::lifecycle(&fixture.runtime, &fixture.runtime.subagents(), "process", request);
    assert!(
        result.text().starts_with(
            "mcp__h__echo error: no tool named \"mcp__h__echo\": the MCP server \"h\" did not start: no answer to \
             initialize within 300ms"
        ),
        "{}",
        result.text()
    );
    fixture.shut_down();
}
