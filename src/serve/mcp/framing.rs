//! The framing between this process's stdio and the MCP SDK: `subagents
//! mcp` reads and writes its own lines, so that a bad line costs one error
//! reply instead of the session, and so that every request is answered
//! before exit. The SDK sees only well-formed messages, through
//! [`Framed`], our [`Transport`].
//!
//! **Input** is read one line at a time, at most
//! [`MAX_LINE`](crate::providers::child_process::MAX_LINE) (8 MiB) bytes of
//! it kept; blank lines are skipped. Each line is judged before the SDK
//! sees it:
//!
//! | line | answer (never forwarded) |
//! |---|---|
//! | longer than 8 MiB (the rest is read and dropped) | `-32700`, id `null` |
//! | not UTF-8, or not JSON | `-32700`, id `null` |
//! | a batch or a bare value | `-32600`, id `null` |
//! | a request whose id is not a string or an integer | `-32600`, id `null` |
//! | a request that is not JSON-RPC 2.0 | `-32600` with its id |
//! | a request of a known method whose params do not fit it | `-32602` with its id |
//! | a second `initialize` | `-32600` with its id, `data.reason` "already initialized" |
//! | a request while [`MAX_IN_FLIGHT`] are unanswered | `-32603` with its id |
//! | a malformed notification or answer, or one before `initialize` | none: there is no one to answer (logged) |
//!
//! Our error replies carry `data: {"reason": …}` in fixed wording, plus
//! for a parse error an `excerpt` of the line's first 64 characters and for
//! bad params the parser's complaint (cut short), never the whole line.
//! Every other line goes to the SDK, which answers an unknown method
//! `-32601` itself.
//!
//! **Output**: the SDK's lines and ours reach stdout whole, one at a time.
//! A request counts as in flight from the moment it is forwarded until its
//! answer has been written, or until the client cancels it
//! (`notifications/cancelled`: the SDK then sends no answer, as MCP asks).
//!
//! **EOF** (or a failed read) runs two bounded phases. *Closing*: the
//! `closing` token is cancelled, which cancels every call in flight and
//! every run they started (each answers as cancelled). *Draining*: wait up
//! to `EOF_ANSWER_BOUND` (30 s) until no request is in flight, then end the
//! SDK's input, so that the session returns.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use rmcp::model::{
    ClientJsonRpcMessage, ClientNotification, ClientRequest, JsonRpcMessage, RequestId, ServerJsonRpcMessage,
};
use rmcp::service::RoleServer;
use rmcp::transport::Transport;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::serve::framing::{drain_at_eof, excerpt, StdinLines, StdoutLines};

/// The most requests unanswered at once: it bounds what the SDK holds and
/// what EOF waits for. Past it a request is refused at once.
pub(super) const MAX_IN_FLIGHT: usize = 1024;

/// How much of the parser's complaint about bad params a reply quotes.
const COMPLAINT_CHARS: usize = 240;

/// Messages queued for the SDK before reading stdin waits for it.
const FORWARD_QUEUE: usize = 64;

/// The methods MCP defines for a client's requests: bad params for one of
/// these are `-32602`; any other method reaches the SDK (`-32601`).
const KNOWN_METHODS: [&str; 14] = [
    "initialize",
    "ping",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/templates/list",
    "resources/read",
    "resources/subscribe",
    "resources/unsubscribe",
    "completion/complete",
    "logging/setLevel",
    "tasks/get",
];

/// What is in flight.
#[derive(Debug, Default)]
struct Book {
    /// Forwarded request ids not yet answered, each with how many times it
    /// is in flight (a client may reuse an id).
    pending: HashMap<RequestId, usize>,
    in_flight: usize,
    /// An `initialize` has been forwarded: the SDK answers it, and it
    /// fails only when no protocol version can be agreed, which ends the
    /// session anyway.
    initialized: bool,
}

/// Stdout, shared by the SDK's lines and our own replies, and the book of
/// requests in flight.
struct Output {
    stdout: StdoutLines,
    book: Mutex<Book>,
    /// Bumped after every settled request, to wake waits on the book.
    answered: watch::Sender<u64>,
}

/// What becomes of one input line.
#[derive(Debug)]
enum Verdict {
    /// Nothing to do (a blank line, a malformed notification).
    Skip,
    /// Answer it ourselves with this line.
    Reply(String),
    /// Hand it to the SDK.
    Forward(Box<ClientJsonRpcMessage>),
}

/// The SDK's transport: messages judged sound, and stdout.
pub(super) struct Framed {
    output: Arc<Output>,
    incoming: mpsc::Receiver<ClientJsonRpcMessage>,
}

/// The transport for the SDK's session, and the input task that feeds it
/// (run it beside the session; it ends after EOF and draining).
pub(super) fn stdio(closing: CancellationToken) -> (Framed, impl Future<Output = ()> + Send + 'static) {
    let output = Arc::new(Output::new());
    let (forward, incoming) = mpsc::channel(FORWARD_QUEUE);
    (Framed { output: output.clone(), incoming }, read_input(output, forward, closing))
}

impl Transport<RoleServer> for Framed {
    type Error = io::Error;

    fn send(&mut self, item: ServerJsonRpcMessage) -> impl Future<Output = Result<(), io::Error>> + Send + 'static {
        let output = self.output.clone();
        async move { output.write_from_sdk(item).await }
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        self.incoming.recv().await
    }

    async fn close(&mut self) -> Result<(), io::Error> {
        self.incoming.close();
        Ok(())
    }
}

/// Reads stdin until EOF, answering bad lines and forwarding the rest; then
/// closes and drains (see the module docs).
async fn read_input(output: Arc<Output>, forward: mpsc::Sender<ClientJsonRpcMessage>, closing: CancellationToken) {
    let mut lines = StdinLines::new();
    while let Some(line) = lines.next(&output.stdout, parse_error).await {
        let delivered = match output.judge(&line) {
            Verdict::Skip => true,
            Verdict::Reply(reply) => output.write(reply).await.is_ok(),
            Verdict::Forward(message) => forward.send(*message).await.is_ok(),
        };
        if !delivered {
            break;
        }
    }
    let settled = output.wait_until(|book| book.in_flight == 0);
    drain_at_eof(&closing, "call", || output.book().in_flight, settled).await;
    // Dropping `forward` ends the SDK's input: the session returns.
}

impl Output {
    fn new() -> Self {
        Output { stdout: StdoutLines::new(), book: Mutex::default(), answered: watch::Sender::new(0) }
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes one whole line.
    async fn write(&self, line: String) -> io::Result<()> {
        self.stdout.write(line).await
    }

    /// A message from the SDK: written, then, if it answers a request, that
    /// request is no longer in flight.
    async fn write_from_sdk(&self, message: ServerJsonRpcMessage) -> io::Result<()> {
        let answers = match &message {
            JsonRpcMessage::Response(response) => Some(response.id.clone()),
            JsonRpcMessage::Error(error) => error.id.clone(),
            _ => None,
        };
        let line = serde_json::to_string(&message).map_err(io::Error::other)?;
        let written = self.write(line).await;
        if let Some(id) = answers {
            self.settle(&id);
        }
        written
    }

    fn settle(&self, id: &RequestId) {
        let mut book = self.book();
        if let Some(count) = book.pending.get_mut(id) {
            *count -= 1;
            if *count == 0 {
                book.pending.remove(id);
            }
            book.in_flight -= 1;
        }
        drop(book);
        self.answered.send_modify(|answers| *answers += 1);
    }

    /// Waits until `done` holds for the book.
    async fn wait_until(&self, done: impl Fn(&Book) -> bool) {
        // Subscribed before the check, so an answer in between still wakes us.
        let mut answered = self.answered.subscribe();
        while !done(&self.book()) {
            if answered.changed().await.is_err() {
                return;
            }
        }
    }

    fn judge(&self, line: &[u8]) -> Verdict {
        let Ok(text) = std::str::from_utf8(line) else {
            return Verdict::Reply(parse_error("the line is not valid UTF-8", line));
        };
        if text.trim().is_empty() {
            return Verdict::Skip;
        }
        match serde_json::from_str::<ClientJsonRpcMessage>(text) {
            Ok(message) => self.admit(message),
            Err(complaint) => malformed(text, &complaint),
        }
    }

    /// A well-formed message: forwarded, unless it is a request we refuse
    /// or a message the SDK cannot take yet.
    fn admit(&self, message: ClientJsonRpcMessage) -> Verdict {
        let mut book = self.book();
        match &message {
            JsonRpcMessage::Request(request) => {
                // The SDK takes a known method whose params do not fit it
                // for a custom one, and would answer "method not found".
                if let ClientRequest::CustomRequest(custom) = &request.request {
                    if KNOWN_METHODS.contains(&custom.method.as_str()) {
                        let reason = format!("the params do not fit {}", custom.method);
                        return reply(Some(&request.id), -32602, &reason);
                    }
                }
                let initialize = matches!(request.request, ClientRequest::InitializeRequest(_));
                if initialize && book.initialized {
                    return reply(Some(&request.id), -32600, "already initialized");
                }
                if book.in_flight >= MAX_IN_FLIGHT {
                    let reason = format!("too many requests in flight (at most {MAX_IN_FLIGHT})");
                    return reply(Some(&request.id), -32603, &reason);
                }
                *book.pending.entry(request.id.clone()).or_default() += 1;
                book.in_flight += 1;
                book.initialized |= initialize;
            }
            // Before the handshake the SDK takes only requests: anything
            // else would end the session.
            _ if !book.initialized => {
                tracing::warn!("a message before initialize was dropped");
                return Verdict::Skip;
            }
            JsonRpcMessage::Notification(notification) => {
                if let ClientNotification::CancelledNotification(cancelled) = &notification.notification {
                    // The SDK sends no answer to a cancelled request.
                    if let Some(id) = &cancelled.params.request_id {
                        drop(book);
                        self.settle(id);
                    }
                }
            }
            JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_) => {}
        }
        Verdict::Forward(Box::new(message))
    }
}

/// A line that is JSON (or not) but not a message the SDK can take.
fn malformed(text: &str, complaint: &serde_json::Error) -> Verdict {
    let Ok(value) = serde_json::from_str::<Value>(text) else {
        return Verdict::Reply(parse_error("the line is not valid JSON", text.as_bytes()));
    };
    let Some(object) = value.as_object() else {
        return reply(None, -32600, "a batch or a bare value is not a JSON-RPC message");
    };
    let Some(method) = object.get("method").and_then(Value::as_str) else {
        if object.contains_key("result") || object.contains_key("error") {
            tracing::warn!("a malformed answer from the client was dropped");
            return Verdict::Skip;
        }
        return reply(request_id(object.get("id")).as_ref(), -32600, "not a JSON-RPC message");
    };
    let Some(id) = object.get("id") else {
        tracing::warn!(method, "a malformed notification was dropped");
        return Verdict::Skip;
    };
    let Some(id) = request_id(Some(id)) else {
        return reply(None, -32600, "a request id must be a string or an integer");
    };
    if object.get("jsonrpc") != Some(&json!("2.0")) {
        return reply(Some(&id), -32600, "not a JSON-RPC 2.0 request");
    }
    if KNOWN_METHODS.contains(&method) {
        let complaint: String = complaint.to_string().chars().take(COMPLAINT_CHARS).collect();
        let data = json!({"reason": format!("the params do not fit {method}"), "complaint": complaint});
        return Verdict::Reply(error_line(Some(&id), -32602, "Invalid params", data));
    }
    reply(Some(&id), -32600, "not a well-formed request")
}

/// A JSON-RPC id we can answer to: a string or an integer.
fn request_id(id: Option<&Value>) -> Option<RequestId> {
    match id? {
        Value::String(id) => Some(RequestId::String(id.as_str().into())),
        Value::Number(id) => id.as_i64().map(RequestId::Number),
        _ => None,
    }
}

fn reply(id: Option<&RequestId>, code: i64, reason: &str) -> Verdict {
    let message = match code {
        -32600 => "Invalid Request",
        -32602 => "Invalid params",
        _ => "Internal error",
    };
    Verdict::Reply(error_line(id, code, message, json!({ "reason": reason })))
}

/// A `-32700` reply (id `null`) quoting at most the line's first
/// `EXCERPT_CHARS` (64) characters.
fn parse_error(reason: &str, line: &[u8]) -> String {
    let excerpt = excerpt(line);
    error_line(None, -32700, "Parse error", json!({ "reason": reason, "excerpt": excerpt }))
}

fn error_line(id: Option<&RequestId>, code: i64, message: &str, data: Value) -> String {
    let id = id.cloned().map_or(Value::Null, RequestId::into_json_value);
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message, "data": data}}).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer_of(verdict: Verdict) -> Value {
        match verdict {
            Verdict::Reply(line) => serde_json::from_str(&line).unwrap(),
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    fn initialize(id: i64) -> String {
        let params = json!({"protocolVersion": "2025-06-18", "capabilities": {},
                            "clientInfo": {"name": "test", "version": "0"}});
        json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": params}).to_string()
    }

    #[test]
    fn bad_lines_get_the_code_and_id_the_table_promises() {
        let output = Output::new();
        assert!(matches!(output.judge(initialize(1).as_bytes()), Verdict::Forward(_)));
        let cases = [
            ("not json", Value::Null, -32700),
            ("[1, 2]", Value::Null, -32600),
            ("7", Value::Null, -32600),
            (r#"{"jsonrpc":"2.0","id":{"a":1},"method":"tools/list"}"#, Value::Null, -32600),
            (r#"{"jsonrpc":"1.0","id":3,"method":"tools/list"}"#, json!(3), -32600),
            (r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":5}"#, json!(4), -32602),
            (r#"{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"arguments":{}}}"#, json!("x"), -32602),
            (&initialize(5), json!(5), -32600),
        ];
        for (line, id, code) in cases {
            let answer = answer_of(output.judge(line.as_bytes()));
            assert_eq!((answer["id"].clone(), answer["error"]["code"].clone()), (id, json!(code)), "{line}");
            assert!(answer["error"]["data"]["reason"].is_string(), "{answer}");
        }
        assert_eq!(output.book().in_flight, 1, "only the first initialize is in flight");
    }

    #[test]
    fn an_unknown_method_reaches_the_sdk_and_a_malformed_notification_is_dropped() {
        let output = Output::new();
        assert!(matches!(output.judge(initialize(1).as_bytes()), Verdict::Forward(_)));
        let unknown = r#"{"jsonrpc":"2.0","id":2,"method":"no/such","params":{}}"#;
        assert!(matches!(output.judge(unknown.as_bytes()), Verdict::Forward(_)));
        let notification = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":7}"#;
        assert!(matches!(output.judge(notification.as_bytes()), Verdict::Skip));
        assert!(matches!(output.judge(b"   "), Verdict::Skip));
    }

    #[test]
    fn a_notification_before_initialize_is_dropped_rather_than_ending_the_session() {
        let output = Output::new();
        let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        assert!(matches!(output.judge(initialized.as_bytes()), Verdict::Skip));
        assert!(matches!(output.judge(initialize(1).as_bytes()), Verdict::Forward(_)));
        assert!(matches!(output.judge(initialized.as_bytes()), Verdict::Forward(_)));
    }

    #[test]
    fn a_cancelled_request_is_no_longer_in_flight_and_an_answer_settles_it_once() {
        let output = Output::new();
        let call = |id: i64| {
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "task_list"}}).to_string()
        };
        output.judge(initialize(1).as_bytes());
        output.settle(&RequestId::Number(1));
        output.judge(call(2).as_bytes());
        output.judge(call(3).as_bytes());
        assert_eq!(output.book().in_flight, 2);
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}});
        assert!(matches!(output.judge(cancel.to_string().as_bytes()), Verdict::Forward(_)));
        assert_eq!(output.book().in_flight, 1);
        output.settle(&RequestId::Number(2));
        assert_eq!(output.book().in_flight, 1, "a late answer to the cancelled call settles nothing");
        output.settle(&RequestId::Number(3));
        assert_eq!(output.book().in_flight, 0);
    }
}
