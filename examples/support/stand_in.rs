//! A loopback stand-in for the HTTP model APIs, shared by the examples that
//! measure the adapters: it answers every request at once with a fixed
//! answer in the shape its path's API expects, and keeps the first body it
//! was sent (so a bare client can send exactly the same bytes).
#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub const CHAT: &str = r#"{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"done"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":1}}"#;
pub const RESPONSES: &str = r#"{"id":"r","object":"response","status":"completed","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"done"}]}],"usage":{"input_tokens":9,"output_tokens":1}}"#;
pub const MESSAGES: &str = r#"{"id":"m","type":"message","role":"assistant","content":[{"type":"text","text":"done"}],"stop_reason":"end_turn","usage":{"input_tokens":9,"output_tokens":1}}"#;

/// The first request body the stand-in was sent, once one came.
pub type FirstBody = Arc<Mutex<Option<Vec<u8>>>>;

/// Serves HTTP/1.1 keep-alive connections until the listener fails.
pub async fn serve(listener: TcpListener, first_body: FirstBody) {
    while let Ok((socket, _)) = listener.accept().await {
        tokio::spawn(connection(socket, first_body.clone()));
    }
}

async fn connection(mut socket: TcpStream, first_body: FirstBody) {
    let mut buffer = Vec::with_capacity(8192);
    let mut chunk = [0u8; 8192];
    loop {
        // One request: its head, then the body its length names.
        let head_end = loop {
            if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_ascii_lowercase();
        let length = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:").and_then(|v| v.trim().parse::<usize>().ok()))
            .unwrap_or(0);
        while buffer.len() < head_end + length {
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        {
            let mut first = first_body.lock().unwrap();
            if first.is_none() {
                *first = Some(buffer[head_end..head_end + length].to_vec());
            }
        }
        let path = head.split_whitespace().nth(1).unwrap_or("");
        let body = if path.ends_with("/responses") {
            RESPONSES
        } else if path.ends_with("/messages") {
            MESSAGES
        } else {
            CHAT
        };
        buffer.drain(..head_end + length);
        let reply = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        if socket.write_all(reply.as_bytes()).await.is_err() {
            return;
        }
    }
}
