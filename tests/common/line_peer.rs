//! A child process driven by raw lines, the way a client that is not a
//! library speaks JSON-RPC: newline-delimited messages on its stdin, lines
//! off its stdout (read on a thread of their own, which can be paused or
//! hung up to play a slow client or one whose output is gone), its stderr
//! in a file. The ACP agent's and the MCP server's tests build their
//! clients on it.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tempfile::TempDir;

use super::blocking::wait_until;

/// How long any single answer may take.
pub const ANSWER_WITHIN: Duration = Duration::from_secs(30);

/// How a [`LinePeer`] treats the child's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Reading {
    /// Every line, as it comes.
    On = 0,
    /// None for now: the pipe fills and the child's writes block (a line
    /// the reader had already begun still arrives).
    Paused = 1,
    /// None ever again once the next answer (a line with no `method`) has
    /// come: then the pipe is closed. Notifications before it still arrive,
    /// so a hang-up lands where the test means it whatever the timing.
    HungUp = 2,
}

/// A child spoken to in lines; killed and reaped when dropped.
pub struct LinePeer {
    /// The test's directory; the child's stderr is `stderr.log` in it.
    pub dir: TempDir,
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    reading: Arc<AtomicU8>,
}

impl LinePeer {
    /// Starts `command` with its stdin and stdout piped to this peer and its
    /// stderr in `dir/stderr.log`.
    pub fn spawn(mut command: Command, dir: TempDir) -> LinePeer {
        let stderr = File::create(dir.path().join("stderr.log")).unwrap();
        let mut child = command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(stderr).spawn().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let (sender, lines) = mpsc::channel();
        let reading = Arc::new(AtomicU8::new(Reading::On as u8));
        let mode = reading.clone();
        std::thread::spawn(move || loop {
            // Ends with the child's stdout, or at a hang-up (closing it).
            if mode.load(Ordering::SeqCst) == Reading::Paused as u8 {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            let mut line = String::new();
            match stdout.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let line = line.trim_end().to_owned();
                    let answer = serde_json::from_str::<Value>(&line).is_ok_and(|m| m.get("method").is_none());
                    if sender.send(line).is_err() {
                        return;
                    }
                    if answer && mode.load(Ordering::SeqCst) == Reading::HungUp as u8 {
                        return;
                    }
                }
            }
        });
        LinePeer { stdin: child.stdin.take(), dir, child, lines, reading }
    }

    pub fn read(&self, reading: Reading) {
        self.reading.store(reading as u8, Ordering::SeqCst);
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stdin.as_mut().expect("stdin is open").write_all(bytes).unwrap();
    }

    pub fn send(&mut self, message: Value) {
        self.send_raw(format!("{message}\n").as_bytes());
    }

    pub fn request(&mut self, id: u64, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
    }

    pub fn notify(&mut self, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    pub fn next_line(&self) -> String {
        self.next_line_within(ANSWER_WITHIN)
    }

    pub fn next_line_within(&self, within: Duration) -> String {
        match self.lines.recv_timeout(within) {
            Ok(line) => line,
            Err(RecvTimeoutError::Timeout) => panic!("no line within {within:?}"),
            Err(RecvTimeoutError::Disconnected) => panic!("stdout ended (the child exited)"),
        }
    }

    /// The next message, whatever it is.
    pub fn next(&self) -> Value {
        serde_json::from_str(&self.next_line()).unwrap()
    }

    /// The next answer (notifications and requests skipped).
    pub fn answer(&self) -> Value {
        self.answer_within(ANSWER_WITHIN)
    }

    /// The next answer within `within` (notifications and requests skipped).
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

    /// Closes stdin (EOF for the child).
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
        wait_until(within, "the child to exit", || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        status.unwrap()
    }

    /// Sends `signal` to the child.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid; no memory is touched.
        assert_eq!(unsafe { libc::kill(self.child.id() as i32, signal) }, 0, "signal {signal} sent");
    }

    /// What the child logged on stderr.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap()
    }

    /// The child's peak resident memory so far, in bytes.
    pub fn peak_rss(&self) -> u64 {
        self.status_bytes("VmHWM:")
    }

    /// The child's resident memory now, in bytes.
    pub fn rss(&self) -> u64 {
        self.status_bytes("VmRSS:")
    }

    /// A `/proc/PID/status` figure given in kB, in bytes.
    fn status_bytes(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("{field}"));
        let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        kib * 1024
    }
}

impl Drop for LinePeer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
