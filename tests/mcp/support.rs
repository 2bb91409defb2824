//! The two clients `tests/mcp.rs` drives `subagents mcp` with: the SDK's
//! own ([`Served`]) and raw lines ([`Raw`], on the harness's [`LinePeer`],
//! whose reader can be paused or hung up to play a slow client or one whose
//! output is gone); and what a test reads after the fact (the server's log,
//! the children's sessions).

use std::fs::File;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};

use rmcp::model::{CallToolRequest, CallToolRequestParams, CallToolResult, ClientRequest, ProgressNotificationParam};
use rmcp::service::{NotificationContext, PeerRequestOptions, RoleClient, RunningService};
use rmcp::{ClientHandler, ServiceExt};
use serde_json::{json, Value};
use subagents::agent::{SessionError, SessionEvent, SessionStore};
use tempfile::TempDir;

use crate::common;
use crate::common::line_peer::{LinePeer, ANSWER_WITHIN};

/// The SDK client's handler: it keeps every progress notification.
#[derive(Clone, Default)]
pub struct Recorder {
    pub progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
}

impl Recorder {
    pub fn messages(&self) -> Vec<String> {
        self.progress.lock().unwrap().iter().filter_map(|p| p.message.clone()).collect()
    }
}

impl ClientHandler for Recorder {
    async fn on_progress(&self, params: ProgressNotificationParam, _context: NotificationContext<RoleClient>) {
        self.progress.lock().unwrap().push(params);
    }
}

/// `subagents mcp` in `dir` (its home `dir/home`, its stderr
/// `dir/stderr.log`) with `extra` flags and `env`, stdin and stdout piped.
fn mcp_command(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Command {
    let stderr = File::create(dir.join("stderr.log")).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_subagents"));
    command.arg("mcp").arg("--home").arg(dir.join("home")).args(extra).envs(env.iter().copied());
    command.current_dir(dir).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(stderr);
    command
}

/// `subagents mcp --home <tempdir>/home …` run from the tempdir, stderr in
/// `<tempdir>/stderr.log`, connected to the SDK's client.
pub struct Served {
    pub client: RunningService<RoleClient, Recorder>,
    pub recorder: Recorder,
    pub server: tokio::process::Child,
    pub dir: TempDir,
}

impl Served {
    pub async fn start(extra: &[&str]) -> Served {
        Served::start_with(extra, &[]).await
    }

    /// [`Served::start`] with these variables set for the server.
    pub async fn start_with(extra: &[&str], env: &[(&str, &str)]) -> Served {
        let dir = tempfile::tempdir().unwrap();
        let mut server =
            tokio::process::Command::from(mcp_command(dir.path(), extra, env)).kill_on_drop(true).spawn().unwrap();
        let transport = (server.stdout.take().unwrap(), server.stdin.take().unwrap());
        let recorder = Recorder::default();
        let client = recorder.clone().serve(transport).await.expect("the server initializes");
        Served { client, recorder, server, dir }
    }

    pub async fn call(&self, name: &str, arguments: Value) -> CallToolResult {
        let Value::Object(arguments) = arguments else { panic!("arguments must be an object") };
        let call = self.client.call_tool(CallToolRequestParams::new(name.to_owned()).with_arguments(arguments));
        tokio::time::timeout(ANSWER_WITHIN, call).await.expect("answered in time").expect("a tool result")
    }

    /// Closes the client (stdin EOF for the server) and waits for its exit.
    pub async fn close(mut self) -> (ExitStatus, TempDir) {
        self.client.cancel().await.unwrap();
        let status = tokio::time::timeout(ANSWER_WITHIN, self.server.wait()).await.expect("exited in time").unwrap();
        (status, self.dir)
    }
}

/// Starts a `[slow]` call (a minute-long answer) and returns its handle.
pub async fn slow_call(served: &Served) -> rmcp::service::RequestHandle<RoleClient> {
    let Value::Object(arguments) = json!({"description": "slow", "prompt": "[slow] take your time"}) else {
        unreachable!()
    };
    let params = CallToolRequestParams::new("subagent").with_arguments(arguments);
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
    served.client.peer().send_request_with_option(request, PeerRequestOptions::no_options()).await.unwrap()
}

/// The one text block of a result.
pub fn text(result: &CallToolResult) -> String {
    let [block] = result.content.as_slice() else { panic!("one content block: {result:?}") };
    block.as_text().expect("a text block").text.clone()
}

pub fn answer(result: &CallToolResult) -> Value {
    assert_ne!(result.is_error, Some(true), "{result:?}");
    serde_json::from_str(&text(result)).unwrap()
}

/// `subagents serve` children started under `dir`.
pub fn serve_children(dir: &Path) -> Vec<(u32, String)> {
    common::processes_mentioning(dir).into_iter().filter(|(_, cmdline)| cmdline.contains(" serve ")).collect()
}

/// The ids of the runs' sessions under `home`: every session but the
/// client's root (the only one without a parent; it never prompts).
fn run_session_ids(home: &Path) -> Vec<String> {
    let store = SessionStore::new(home);
    let Ok(ids) = store.ids() else { return Vec::new() };
    ids.into_iter()
        // A session whose header is not written yet is no run's session yet.
        .filter(|id| match store.summarize(id) {
            Ok(summary) => summary.header.parent_session.is_some(),
            Err(SessionError::NotFound(_)) => false,
            Err(_) => true,
        })
        .collect()
}

/// How many runs' session files there are under `home` (some perhaps
/// still being written).
pub fn session_count(home: &Path) -> usize {
    run_session_ids(home).len()
}

/// Every run's session under `home`, as its events.
pub fn sessions(home: &Path) -> Vec<Vec<SessionEvent>> {
    let store = SessionStore::new(home);
    run_session_ids(home).into_iter().map(|id| store.read(&id).unwrap_or_else(|e| panic!("{id}: {e}")).1).collect()
}

/// A raw client: lines on `subagents mcp`'s stdin, lines off its stdout,
/// whatever a [`LinePeer`] does besides.
pub struct Raw(LinePeer);

impl Raw {
    pub fn start(extra: &[&str]) -> Raw {
        Raw::start_with(extra, &[])
    }

    /// [`Raw::start`] with these variables set for the server.
    pub fn start_with(extra: &[&str], env: &[(&str, &str)]) -> Raw {
        let dir = tempfile::tempdir().unwrap();
        Raw(LinePeer::spawn(mcp_command(dir.path(), extra, env), dir))
    }

    pub fn home(&self) -> std::path::PathBuf {
        self.dir.path().join("home")
    }

    pub fn call(&mut self, id: u64, name: &str, arguments: Value) {
        self.request(id, "tools/call", json!({"name": name, "arguments": arguments}));
    }

    pub fn handshake(&mut self) {
        let params =
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}});
        self.request(1, "initialize", params);
        let initialized = self.answer();
        assert_eq!(initialized["result"]["serverInfo"]["name"], "subagents", "{initialized}");
        self.send_raw(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n");
    }
}

impl std::ops::Deref for Raw {
    type Target = LinePeer;

    fn deref(&self) -> &LinePeer {
        &self.0
    }
}

impl std::ops::DerefMut for Raw {
    fn deref_mut(&mut self) -> &mut LinePeer {
        &mut self.0
    }
}

pub fn code_and_id(answer: &Value) -> (Value, Value) {
    (answer["error"]["code"].clone(), answer["id"].clone())
}
