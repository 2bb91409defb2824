//! A headless Chromium driven over WebDriver (chromedriver's HTTP API),
//! with a plain HTTP/1.0 client on std's `TcpStream`: no crate of its own.
//!
//! The suite installs Chromium when it is missing, as Debian packages it:
//! `apt-get install -y chromium chromium-driver` (after `apt-get update` if
//! that fails). A machine where neither works fails the test with the
//! command to run; a browser test never skips.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// One browser at a time: each is a few hundred MB and the machine is shared.
static ONE_BROWSER: Mutex<()> = Mutex::new(());

const HOW_TO_INSTALL: &str = "the browser tests need headless Chromium and its driver: \
                              `apt-get update && apt-get install -y chromium chromium-driver` (Debian)";

fn on_path(program: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {program}")]).output().is_ok_and(|out| out.status.success())
}

/// Installs Chromium and chromedriver from the distribution when missing.
fn installed() {
    if on_path("chromedriver") && on_path("chromium") {
        return;
    }
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "chromium", "chromium-driver"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|status| status.success())
    };
    if !install() {
        let _ = Command::new("apt-get").arg("update").status();
        assert!(install(), "apt-get could not install chromium: {HOW_TO_INSTALL}");
    }
    assert!(on_path("chromedriver") && on_path("chromium"), "chromium is still missing: {HOW_TO_INSTALL}");
}

/// An HTTP/1.1 exchange on a connection closed after it (chunked bodies
/// decoded): the status, the headers (names lowercased) and the body.
pub fn http(
    address: SocketAddr,
    method: &str,
    target: &str,
    host: &str,
    body: Option<&Value>,
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let body = body.map(|body| body.to_string()).unwrap_or_default();
    http_with(address, method, target, &[("Host", host), ("Content-Type", "application/json")], &body)
}

/// [`http`] with exactly these request headers (and the body's length).
pub fn http_with(
    address: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let headers: String = headers.iter().map(|(name, value)| format!("{name}: {value}\r\n")).collect();
    let request = format!(
        "{method} {target} HTTP/1.1\r\n{headers}Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    // Read until the body is whole: a server may keep the connection open.
    let mut answer = Vec::new();
    let mut buffer = [0u8; 64 * 1024];
    loop {
        let read = read_some(&mut stream, &mut buffer);
        answer.extend_from_slice(&buffer[..read]);
        if read == 0 || whole(&answer) {
            break;
        }
    }
    let split = answer.windows(4).position(|w| w == b"\r\n\r\n").expect("a whole response head");
    let (status, headers) = head(&answer[..split]);
    let body = answer[split + 4..].to_vec();
    let chunked = headers.iter().any(|(name, value)| name == "transfer-encoding" && value.contains("chunked"));
    (status, headers, if chunked { dechunk(&body) } else { body })
}

/// One read of `stream`, tried again when a signal interrupts it: a socket
/// with a read timeout is never restarted by the kernel, and this process
/// takes SIGCHLD for the children it spawns.
pub fn read_some(stream: &mut TcpStream, buffer: &mut [u8]) -> usize {
    loop {
        match stream.read(buffer) {
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            read => return read.unwrap(),
        }
    }
}

fn head(bytes: &[u8]) -> (u16, Vec<(String, String)>) {
    let head = String::from_utf8_lossy(bytes).into_owned();
    let mut lines = head.lines();
    let status = lines.next().and_then(|line| line.split(' ').nth(1)).and_then(|code| code.parse().ok()).unwrap();
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    (status, headers)
}

/// Whether `answer` holds a whole response (by its length, or its last chunk).
fn whole(answer: &[u8]) -> bool {
    let Some(split) = answer.windows(4).position(|w| w == b"\r\n\r\n") else { return false };
    let (_, headers) = head(&answer[..split]);
    let body = &answer[split + 4..];
    if let Some((_, length)) = headers.iter().find(|(name, _)| name == "content-length") {
        return length.parse::<usize>().is_ok_and(|length| body.len() >= length);
    }
    if headers.iter().any(|(name, value)| name == "transfer-encoding" && value.contains("chunked")) {
        return body.ends_with(b"0\r\n\r\n");
    }
    false
}

fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(end) = body.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&body[..end])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next()?.trim(), 16).ok());
        let Some(size) = size.filter(|&size| size > 0) else { break };
        let start = end + 2;
        out.extend_from_slice(&body[start..(start + size).min(body.len())]);
        body = &body[(start + size + 2).min(body.len())..];
    }
    out
}

/// A WebDriver session on a headless Chromium; ended (and its driver
/// stopped) on drop.
pub struct Browser {
    driver: Child,
    address: SocketAddr,
    session: String,
    _one: MutexGuard<'static, ()>,
}

impl Browser {
    pub fn start() -> Browser {
        let one = ONE_BROWSER.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        installed();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect(HOW_TO_INSTALL);
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        let ready = Instant::now();
        while TcpStream::connect(address).is_err() {
            assert!(ready.elapsed() < Duration::from_secs(60), "chromedriver did not listen within 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut browser = Browser { driver, address, session: String::new(), _one: one };
        let args = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1280,900",
            "--hide-scrollbars",
        ];
        let capabilities =
            json!({"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {"args": args}}}});
        let created = browser.command("POST", "/session", Some(&capabilities));
        browser.session = created["sessionId"].as_str().expect("a WebDriver session").to_owned();
        browser
    }

    /// One WebDriver command; its `value`. An error answer panics.
    fn command(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let answer = self.try_command(method, path, body);
        answer.unwrap_or_else(|error| panic!("WebDriver {method} {path}: {error}"))
    }

    fn try_command(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, Value> {
        let (status, _, bytes) = http(self.address, method, path, &self.address.to_string(), body);
        let answer: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        match status {
            200 => Ok(answer["value"].clone()),
            _ => Err(answer["value"].clone()),
        }
    }

    fn in_session(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    pub fn open(&self, url: &str) {
        self.command("POST", &self.in_session("/url"), Some(&json!({"url": url})));
    }

    /// Runs `script` (a function body; `arguments` holds `args`) in the page.
    pub fn run(&self, script: &str, args: &[Value]) -> Value {
        self.command("POST", &self.in_session("/execute/sync"), Some(&json!({"script": script, "args": args})))
    }

    /// The text of an open alert, if one is open.
    pub fn alert(&self) -> Option<String> {
        self.try_command("GET", &self.in_session("/alert/text"), None).ok().map(|text| text.to_string())
    }

    /// Waits (polling, at most `within`) until `script` returns a truthy
    /// value; that value.
    pub fn wait_for(&self, within: Duration, what: &str, script: &str) -> Value {
        let start = Instant::now();
        loop {
            let value = self.run(script, &[]);
            let truthy = !matches!(&value, Value::Null | Value::Bool(false))
                && value.as_str() != Some("")
                && value.as_f64() != Some(0.0);
            if truthy {
                return value;
            }
            assert!(start.elapsed() < within, "{what}: not within {within:?} (last: {value})");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A screenshot of the window, as PNG, written to `path`.
    pub fn screenshot(&self, path: &Path) {
        let encoded = self.command("GET", &self.in_session("/screenshot"), None);
        let png = decode_base64(encoded.as_str().expect("a base64 screenshot"));
        assert!(png.starts_with(b"\x89PNG"), "a PNG");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.try_command("DELETE", &self.in_session(""), None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn decode_base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let clean: Vec<u8> = text.bytes().filter(|&c| c != b'=' && !c.is_ascii_whitespace()).collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let bits = chunk.iter().enumerate().fold(0u32, |bits, (i, &c)| bits | u32::from(value(c)) << (18 - 6 * i));
        out.extend_from_slice(&bits.to_be_bytes()[1..chunk.len()]);
    }
    out
}
