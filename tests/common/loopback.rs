//! A stand-in model endpoint on 127.0.0.1: each accepted connection reads
//! one HTTP request (recorded: path, headers, JSON body) and answers the
//! next scripted [`Reply`]. The HTTP adapters' tests speak each API's wire
//! through it; nothing leaves the machine.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the server answers to one request.
pub enum Reply {
    /// A whole response.
    Whole { status: u16, headers: Vec<(&'static str, String)>, body: String },
    /// Server-sent event frames, written as given 5 ms apart; then hang
    /// until the client closes (`hang`), or close.
    Stream { frames: Vec<String>, hang: bool },
    /// Accept, read the request, never answer.
    Silent,
    /// `head` (status line and headers), then `chunk` every `every` until
    /// the client goes away: an endpoint that never stops talking.
    Endless { head: String, chunk: Vec<u8>, every: Duration },
}

/// A 200 with a JSON body.
pub fn ok(body: Value) -> Reply {
    Reply::Whole { status: 200, headers: Vec::new(), body: body.to_string() }
}

/// An error status with a JSON body and headers.
pub fn status(status: u16, headers: Vec<(&'static str, String)>, body: Value) -> Reply {
    Reply::Whole { status, headers, body: body.to_string() }
}

/// One named server-sent event: `event: NAME` and its data on one line.
pub fn event(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// An endless server-sent event stream writing `chunk` every `every`.
pub fn endless_stream(chunk: impl Into<Vec<u8>>, every: Duration) -> Reply {
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n".to_owned();
    Reply::Endless { head, chunk: chunk.into(), every }
}

/// One request as the server read it.
pub struct Recorded {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl Recorded {
    /// The value of header `name`, if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str())
    }
}

pub struct Loopback {
    /// `http://127.0.0.1:PORT`, no trailing slash.
    pub origin: String,
    pub requests: Arc<Mutex<Vec<Recorded>>>,
    /// The client closed a connection the server held open.
    pub client_closed: Arc<AtomicBool>,
}

impl Loopback {
    pub async fn start(replies: Vec<Reply>) -> Loopback {
        Loopback::start_for(|_| replies).await
    }

    /// Like [`Loopback::start`], the replies scripted once the origin is
    /// known (an A2A card names its own URL).
    pub async fn start_for(script: impl FnOnce(&str) -> Vec<Reply>) -> Loopback {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap());
        let replies = script(&origin);
        let requests = Arc::new(Mutex::new(Vec::new()));
        let client_closed = Arc::new(AtomicBool::new(false));
        let replies = Arc::new(Mutex::new(VecDeque::from(replies)));
        let (log, closed) = (requests.clone(), client_closed.clone());
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let reply = replies.lock().unwrap().pop_front();
                let (log, closed) = (log.clone(), closed.clone());
                tokio::spawn(serve(socket, reply, log, closed));
            }
        });
        Loopback { origin, requests, client_closed }
    }

    /// The JSON bodies received so far, in order.
    pub fn bodies(&self) -> Vec<Value> {
        self.requests.lock().unwrap().iter().map(|r| r.body.clone()).collect()
    }

    /// Whether the client closed a held connection within 10 s.
    pub async fn saw_client_close(&self) -> bool {
        super::eventually(Duration::from_secs(10), || self.client_closed.load(Ordering::SeqCst)).await
    }
}

async fn serve(mut socket: TcpStream, reply: Option<Reply>, log: Arc<Mutex<Vec<Recorded>>>, closed: Arc<AtomicBool>) {
    let mut buffer = Vec::new();
    let head_end = loop {
        let mut chunk = [0u8; 4096];
        let n = socket.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            return;
        }
        buffer.extend_from_slice(&chunk[..n]);
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).to_string();
    let mut lines = head.lines();
    let path = lines.next().and_then(|line| line.split(' ').nth(1)).unwrap_or_default().to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(key, value)| (key.trim().to_owned(), value.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(key, _)| key.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    while buffer.len() < head_end + length {
        let mut chunk = [0u8; 4096];
        let n = socket.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            return;
        }
        buffer.extend_from_slice(&chunk[..n]);
    }
    let body = serde_json::from_slice(&buffer[head_end..head_end + length]).unwrap_or(Value::Null);
    log.lock().unwrap().push(Recorded { path, headers, body });
    match reply {
        None | Some(Reply::Silent) => {
            let _ = socket.read(&mut [0u8; 16]).await;
        }
        Some(Reply::Endless { head, chunk, every }) => {
            let _ = socket.write_all(head.as_bytes()).await;
            // A write fails once the client has closed the connection.
            while socket.write_all(&chunk).await.is_ok() && socket.flush().await.is_ok() {
                tokio::time::sleep(every).await;
            }
            closed.store(true, Ordering::SeqCst);
        }
        Some(Reply::Whole { status, headers, body }) => {
            let mut response = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
                body.len()
            );
            for (name, value) in headers {
                response.push_str(&format!("{name}: {value}\r\n"));
            }
            response.push_str("\r\n");
            response.push_str(&body);
            let _ = socket.write_all(response.as_bytes()).await;
        }
        Some(Reply::Stream { frames, hang }) => {
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
            let _ = socket.write_all(head.as_bytes()).await;
            for frame in frames {
                let _ = socket.write_all(frame.as_bytes()).await;
                let _ = socket.flush().await;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            if hang {
                // Wait for the client to go away: read returns 0 or fails.
                let mut sink = [0u8; 64];
                loop {
                    match socket.read(&mut sink).await {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                }
                closed.store(true, Ordering::SeqCst);
            }
        }
    }
}

/// `future`'s output; a test that would hang fails after 20 s instead.
pub async fn within_20_s<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), future).await.expect("bounded by the adapter, not by the test")
}
