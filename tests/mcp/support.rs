//! The two clients `tests/mcp.rs` drives `subagents mcp` with: the SDK's
//! own ([`Served`]) and raw lines ([`Raw`]), whose reader can be paused or
//! hung up to play a slow client or one whose output is gone; and what a
//! test reads after the fact (the server's log, the children's sessions).

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequest, CallToolRequestParams, CallToolResult, ClientRequest, ProgressNotificationParam};
use rmcp::service::{NotificationContext, PeerRequestOptions, RoleClient, RunningService};
use rmcp::{ClientHandler, ServiceExt};
use serde_json::{json, Value};
use subagents::agent::{SessionEvent, SessionStore};
use tempfile::TempDir;

use crate::common;

/// How long any single answer may take.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(30);

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

/// Waits until `condition` holds, for at most `within`.
pub async fn eventually(within: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if condition() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    condition()
}

/// Blocks until `condition` holds, or panics after `within` saying what it
/// waited for.
pub fn wait_until(within: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !condition() {
        assert!(Instant::now() < deadline, "waited {within:?} for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `subagents serve` children started under `dir`.
pub fn serve_children(dir: &Path) -> Vec<(u32, String)> {
    common::processes_mentioning(dir).into_iter().filter(|(_, cmdline)| cmdline.contains(" serve ")).collect()
}

/// The ids of the runs' sessions under `home`: every session but the
/// client's root (the only one without a parent; it never prompts).
fn run_session_ids(home: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(home.join("sessions")) else { return Vec::new() };
    let store = SessionStore::new(home);
    entries
        .flatten()
        .filter_map(|entry| {
            let path = entry.path();
            let id = path.file_stem()?.to_str()?.to_owned();
            (path.extension()? == "jsonl").then_some(id)
        })
        .filter(|id| store.summarize(id).map_or(true, |summary| summary.header.parent_session.is_some()))
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

/// How a [`Raw`] client treats the server's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Reading {
    /// Every line, as it comes.
    On = 0,
    /// None for now: the pipe fills and the server's writes block (a line
    /// the reader had already begun still arrives).
    Paused = 1,
    /// None ever again: after the line it is reading, the pipe is closed.
    HungUp = 2,
}

/// A raw client: lines on `subagents mcp`'s stdin, lines off its stdout.
pub struct Raw {
    pub dir: TempDir,
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    reading: Arc<AtomicU8>,
}

impl Raw {
    pub fn start(extra: &[&str]) -> Raw {
        Raw::start_with(extra, &[])
    }

    /// [`Raw::start`] with these variables set for the server.
    pub fn start_with(extra: &[&str], env: &[(&str, &str)]) -> Raw {
        let dir = tempfile::tempdir().unwrap();
        let mut child = mcp_command(dir.path(), extra, env).spawn().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let (sender, lines) = mpsc::channel();
        let reading = Arc::new(AtomicU8::new(Reading::On as u8));
        let mode = reading.clone();
        std::thread::spawn(move || loop {
            // Ends with the server's stdout, or at a hang-up (closing it).
            match mode.load(Ordering::SeqCst) {
                1 => {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                2 => return,
                _ => {}
            }
            let mut line = String::new();
            match stdout.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    if sender.send(line.trim_end().to_owned()).is_err() {
                        return;
                    }
                }
            }
        });
        Raw { stdin: child.stdin.take(), dir, child, lines, reading }
    }

    pub fn read(&self, reading: Reading) {
        self.reading.store(reading as u8, Ordering::SeqCst);
    }

    pub fn home(&self) -> std::path::PathBuf {
        self.dir.path().join("home")
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stdin.as_mut().expect("stdin is open").write_all(bytes).unwrap();
    }

    pub fn request(&mut self, id: u64, method: &str, params: Value) {
        self.send_raw(
            format!("{}\n", json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})).as_bytes(),
        );
    }

    pub fn notify(&mut self, method: &str, params: Value) {
        self.send_raw(format!("{}\n", json!({"jsonrpc": "2.0", "method": method, "params": params})).as_bytes());
    }

    pub fn call(&mut self, id: u64, name: &str, arguments: Value) {
        self.request(id, "tools/call", json!({"name": name, "arguments": arguments}));
    }

    pub fn next_line(&self) -> String {
        self.next_line_within(ANSWER_WITHIN)
    }

    pub fn next_line_within(&self, within: Duration) -> String {
        match self.lines.recv_timeout(within) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => panic!("no line within {within:?}"),
            Err(RecvTimeoutError::Disconnected) => panic!("stdout ended (the server exited)"),
        }
    }

    /// The next answer (notifications skipped).
    pub fn answer(&self) -> Value {
        self.answer_within(ANSWER_WITHIN)
    }

    /// The next answer within `within` (notifications skipped).
    pub fn answer_within(&self, within: Duration) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let message: Value = serde_json::from_str(&self.next_line_within(left)).unwrap();
            if message.get("method").is_none() {
                return message;
            }
        }
    }

    pub fn handshake(&mut self) {
        let params =
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}});
        self.request(1, "initialize", params);
        let initialized = self.answer();
        assert_eq!(initialized["result"]["serverInfo"]["name"], "subagents", "{initialized}");
        self.send_raw(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n");
    }

    /// Closes stdin (EOF for the server).
    pub fn close_stdin(&mut self) {
        drop(self.stdin.take());
    }

    /// Every line still to come, until stdout ends (within `within`).
    pub fn read_rest(&self, within: Duration) -> Vec<Value> {
        let deadline = Instant::now() + within;
        let mut rest = Vec::new();
        loop {
            match self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(line) => rest.push(serde_json::from_str(&line).unwrap()),
                Err(RecvTimeoutError::Disconnected) => return rest,
                Err(RecvTimeoutError::Timeout) => panic!("stdout still open after {within:?}"),
            }
        }
    }

    /// Closes stdin and collects every line until stdout ends.
    pub fn close_and_read_rest(&mut self, within: Duration) -> Vec<Value> {
        self.close_stdin();
        self.read_rest(within)
    }

    /// Closes stdin and waits for the exit.
    pub fn exit_status(&mut self, within: Duration) -> ExitStatus {
        self.close_stdin();
        self.wait_for_exit(within)
    }

    /// Waits for the exit, stdin left as it is.
    pub fn wait_for_exit(&mut self, within: Duration) -> ExitStatus {
        let mut status = None;
        wait_until(within, "the server to exit", || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        status.unwrap()
    }

    /// Sends `signal` to the server.
    pub fn signal(&self, signal: i32) {
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0, "signal {signal} sent");
    }

    /// What the server logged on stderr.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap()
    }

    /// The server's peak resident memory so far, in bytes.
    pub fn peak_rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
        let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        kib * 1024
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn code_and_id(answer: &Value) -> (Value, Value) {
    (answer["error"]["code"].clone(), answer["id"].clone())
}
