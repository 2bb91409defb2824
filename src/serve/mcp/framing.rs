//! The framing between this process's stdio and the MCP SDK: `subagents
//! mcp` reads and writes its own lines, so that a bad line costs one error
//! reply instead of the session, and so that every request is answered
//! before exit. The SDK sees only well-formed messages, through
//! [`Framed`], our [`Transport`].
//!
//! **Input** is read one line at a time, at most
//! [`MAX_LINE`](crate::child_process::MAX_LINE) (8 MiB) bytes of
//! it kept; blank lines are skipped. Each line is judged before the SDK
//! sees it:
//!
//! | line | answer (never forwarded) |
//! |---|---|
//! | longer than 8 MiB (the rest is read and dropped) | `-32700`, id `null` |
//! | not UTF-8, or not JSON | `-32700`, id `null` |
//! | nested deeper than 128 levels | `-32600` with its id (its top level read alone) |
//! | a batch or a bare value | `-32600`, id `null` |
//! | a request whose id is not a string or an integer | `-32600`, id `null` |
//! | a request that is not JSON-RPC 2.0 | `-32600` with its id |
//! | a request of a known method whose params do not fit it | `-32602` with its id |
//! | a second `initialize` | `-32600` with its id, `data.reason` "already initialized" |
//! | a request whose id is in flight already | `-32600` with that id, `data.reason` "request id 7 is already in flight" |
//! | a request while [`MAX_IN_FLIGHT`] are unanswered | `-32603` with its id |
//! | a malformed notification or answer, or one before the session began | none: there is no one to answer (logged) |
//!
//! Our error replies carry `data: {"reason": …}` in fixed wording, plus
//! for a parse error an `excerpt` of the line's first 64 characters and for
//! bad params the parser's complaint (cut short), never the whole line.
//! Every other line goes to the SDK, which answers an unknown method
//! `-32601` itself.
//!
//! **The session** begins with `initialize`, or, for a client that skips
//! the handshake, with the first request the SDK serves without it (one
//! whose `_meta` names a protocol version this server speaks and the
//! client's capabilities: [`begins_session`]). Before that the SDK reads
//! only requests, and would end on anything else, so notifications are
//! dropped; from then on they are forwarded, `notifications/cancelled`
//! included, with or without a handshake.
//!
//! **Output**: the SDK's lines and ours reach stdout whole, one at a time.
//! A request counts as in flight from the moment it is forwarded until its
//! answer has been written (or dropped: the output is gone), or until the
//! client cancels it (`notifications/cancelled`: the SDK then sends no
//! answer, as MCP asks). A call's progress ends with it: a
//! `notifications/progress` for a token whose call is cancelled or being
//! answered is dropped.
//!
//! **The end of input** (EOF, a failed read, a stop signal, stdout gone:
//! see `serve/framing.rs`) runs two phases, bounded together by
//! `EOF_ANSWER_BOUND` (30 s). *Closing*: the `closing` token is cancelled,
//! which cancels every call in flight and every run they started (each
//! answers as cancelled). *Draining*: wait until no request is in flight,
//! then end the SDK's input, so that the session returns. At the bound the
//! answers still unwritten are dropped and the warning names them: "not
//! read by the client" (computed, waiting on a client that stopped
//! reading) and "still running".

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::sync::{Arc, MutexGuard};

use rmcp::model::{
    ClientJsonRpcMessage, ClientNotification, ClientRequest, GetMeta, JsonRpcMessage, ProgressToken, ProtocolVersion,
    RequestId, ServerJsonRpcMessage, ServerNotification,
};
use rmcp::service::RoleServer;
use rmcp::transport::Transport;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::serve::framing::{drain_at_eof, excerpt, id_list, Ledger, StdinLines};
use crate::serve::pipes::StdoutLines;

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

/// Whether the SDK's session has begun (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Session {
    /// The SDK reads only requests: the handshake, or one that begins a
    /// session without it.
    #[default]
    Waiting,
    /// It has begun: every message reaches the SDK.
    Begun,
}

/// One request in flight.
#[derive(Debug)]
struct Pending {
    /// Its `progressToken`, while its progress may still be sent.
    progress: Option<ProgressToken>,
    /// Its answer is being written: it was computed.
    answering: bool,
}

/// What is in flight.
#[derive(Debug, Default)]
struct Book {
    /// Forwarded requests not yet answered, by id (a client may not reuse
    /// an id while it is in flight: the SDK would lose one of the answers).
    pending: HashMap<RequestId, Pending>,
    /// The progress tokens of the calls in flight.
    progress: HashMap<ProgressToken, RequestId>,
    session: Session,
}

impl Book {
    /// `id` is no longer in flight (answered or cancelled).
    fn settle(&mut self, id: &RequestId) {
        if let Some(pending) = self.pending.remove(id) {
            self.end_progress(pending.progress);
        }
    }

    fn end_progress(&mut self, token: Option<ProgressToken>) {
        if let Some(token) = token {
            self.progress.remove(&token);
        }
    }

    /// The ids in flight, computed (being written) or not.
    fn unanswered(&self) -> String {
        let id = |(id, _): (&RequestId, &Pending)| id.clone().into_json_value().to_string();
        let (unread, running): (Vec<_>, Vec<_>) = self.pending.iter().partition(|(_, pending)| pending.answering);
        let list = |ids: Vec<(&RequestId, &Pending)>| match ids.is_empty() {
            true => "none".to_owned(),
            false => id_list(ids.into_iter().map(id).collect()),
        };
        format!("answers not read by the client: {}; calls still running: {}", list(unread), list(running))
    }
}

/// Stdout, shared by the SDK's lines and our own replies, and the book of
/// requests in flight.
struct Output {
    stdout: StdoutLines,
    ledger: Ledger<Book>,
    /// The protocol versions a session may begin with.
    versions: &'static [ProtocolVersion],
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
/// (run it beside the session; it ends after EOF and draining). `versions`
/// are the protocol versions the server speaks.
pub(super) fn stdio(
    closing: CancellationToken,
    versions: &'static [ProtocolVersion],
) -> (Framed, impl Future<Output = ()> + Send + 'static) {
    let output = Arc::new(Output::new(versions));
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
    let settled = output.ledger.wait_until(|book| book.pending.is_empty());
    drain_at_eof(&closing, &output.stdout, "call", || output.book().unanswered(), settled).await;
    // Dropping `forward` ends the SDK's input: the session returns.
}

impl Output {
    fn new(versions: &'static [ProtocolVersion]) -> Self {
        Output { stdout: StdoutLines::new(), ledger: Ledger::default(), versions }
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        self.ledger.book()
    }

    /// Writes one whole line.
    async fn write(&self, line: String) -> io::Result<()> {
        self.stdout.write(line).await
    }

    /// A message from the SDK: written, then, if it answers a request, that
    /// request is no longer in flight. Progress of a call that has ended is
    /// dropped; once the output is gone every message is dropped quietly
    /// (that was logged once, and the SDK would log each one).
    async fn write_from_sdk(&self, message: ServerJsonRpcMessage) -> io::Result<()> {
        let answers = match &message {
            JsonRpcMessage::Response(response) => Some(response.id.clone()),
            JsonRpcMessage::Error(error) => error.id.clone(),
            JsonRpcMessage::Notification(notification) => {
                if let ServerNotification::ProgressNotification(progress) = &notification.notification {
                    if !self.book().progress.contains_key(&progress.params.progress_token) {
                        tracing::debug!("progress of a call that has ended was dropped");
                        return Ok(());
                    }
                }
                None
            }
            JsonRpcMessage::Request(_) => None,
        };
        if let Some(id) = &answers {
            self.answering(id);
        }
        let line = serde_json::to_string(&message).map_err(io::Error::other)?;
        let written = self.write(line).await;
        if let Some(id) = answers {
            self.settle(&id);
        }
        match written {
            Err(_) if self.stdout.is_gone() => Ok(()),
            written => written,
        }
    }

    /// `id`'s answer is being written: its progress has ended.
    fn answering(&self, id: &RequestId) {
        let mut book = self.book();
        let token = book.pending.get_mut(id).and_then(|pending| {
            pending.answering = true;
            pending.progress.take()
        });
        book.end_progress(token);
    }

    fn settle(&self, id: &RequestId) {
        self.ledger.answered(|book| book.settle(id));
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
                if initialize && book.session == Session::Begun {
                    return reply(Some(&request.id), -32600, "already initialized");
                }
                if book.pending.contains_key(&request.id) {
                    let id = request.id.clone().into_json_value();
                    return reply(Some(&request.id), -32600, &format!("request id {id} is already in flight"));
                }
                if book.pending.len() >= MAX_IN_FLIGHT {
                    let reason = format!("too many requests in flight (at most {MAX_IN_FLIGHT})");
                    return reply(Some(&request.id), -32603, &reason);
                }
                let progress = request.request.get_meta().get_progress_token();
                if let Some(token) = &progress {
                    book.progress.insert(token.clone(), request.id.clone());
                }
                book.pending.insert(request.id.clone(), Pending { progress, answering: false });
                if initialize || begins_session(&request.request, self.versions) {
                    book.session = Session::Begun;
                }
            }
            // Before the session the SDK takes only requests: anything else
            // would end it.
            _ if book.session == Session::Waiting => {
                tracing::warn!("a message before the session began was dropped");
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

/// Whether the SDK takes `request`, arriving before any session, as the
/// beginning of one without the handshake: the SDK's own test, a request
/// other than `ping` or `discover` whose `_meta` carries the client's
/// capabilities and a protocol version among `versions`.
fn begins_session(request: &ClientRequest, versions: &[ProtocolVersion]) -> bool {
    if matches!(request, ClientRequest::PingRequest(_) | ClientRequest::DiscoverRequest(_)) {
        return false;
    }
    let meta = request.get_meta();
    // The SDK asks for every key the newest version requires.
    meta.missing_required_keys(&ProtocolVersion::V_2026_07_28).is_empty()
        && meta.protocol_version().is_some_and(|version| versions.contains(&version))
}

/// A line that is JSON (or not) but not a message the SDK can take.
fn malformed(text: &str, complaint: &serde_json::Error) -> Verdict {
    let value = match serde_json::from_str::<Value>(text) {
        Ok(value) => value,
        Err(error) if error.to_string().starts_with("recursion limit exceeded") => return too_deep(text),
        Err(_) => return Verdict::Reply(parse_error("the line is not valid JSON", text.as_bytes())),
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

/// A line nested deeper than the parser follows (128 levels): answered
/// `-32600` with its id when its top level names one, read without
/// descending into the values beside it.
fn too_deep(text: &str) -> Verdict {
    #[derive(serde::Deserialize)]
    struct TopLevel {
        id: Option<Value>,
        method: Option<serde::de::IgnoredAny>,
    }
    let reason = "the line nests deeper than 128 levels";
    match serde_json::from_str::<TopLevel>(text) {
        Ok(TopLevel { id: Some(id), method: Some(_) }) => match request_id(Some(&id)) {
            Some(id) => reply(Some(&id), -32600, reason),
            None => reply(None, -32600, reason),
        },
        Ok(TopLevel { method: Some(_), .. }) => {
            tracing::warn!("a notification nested too deeply was dropped");
            Verdict::Skip
        }
        _ => reply(None, -32600, reason),
    }
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

    fn output() -> Output {
        Output::new(ProtocolVersion::known_up_to(&ProtocolVersion::V_2025_11_25))
    }

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
        let output = output();
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
        assert_eq!(output.book().pending.len(), 1, "only the first initialize is in flight");
    }

    #[test]
    fn a_request_nested_too_deeply_is_refused_with_its_id() {
        let output = output();
        assert!(matches!(output.judge(initialize(1).as_bytes()), Verdict::Forward(_)));
        let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
        let line = format!(r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"arguments":{deep}}}}}"#);
        let answer = answer_of(output.judge(line.as_bytes()));
        assert_eq!((answer["id"].clone(), answer["error"]["code"].clone()), (json!(7), json!(-32600)), "{answer}");
        assert!(answer["error"]["data"]["reason"].as_str().unwrap().contains("deeper than 128"), "{answer}");
        // Its id first or last, a string id, or none at the top level.
        let line = format!(r#"{{"params":{deep},"method":"tools/call","jsonrpc":"2.0","id":"late"}}"#);
        assert_eq!(answer_of(output.judge(line.as_bytes()))["id"], "late");
        let line = format!(r#"{{"jsonrpc":"2.0","id":{deep},"method":"tools/call"}}"#);
        assert_eq!(answer_of(output.judge(line.as_bytes()))["id"], Value::Null);
        let notification = format!(r#"{{"jsonrpc":"2.0","method":"notifications/progress","params":{deep}}}"#);
        assert!(matches!(output.judge(notification.as_bytes()), Verdict::Skip));
    }

    #[test]
    fn an_unknown_method_reaches_the_sdk_and_a_malformed_notification_is_dropped() {
        let output = output();
        assert!(matches!(output.judge(initialize(1).as_bytes()), Verdict::Forward(_)));
        let unknown = r#"{"jsonrpc":"2.0","id":2,"method":"no/such","params":{}}"#;
        assert!(matches!(output.judge(unknown.as_bytes()), Verdict::Forward(_)));
        let notification = r#"{"jsonrpc":"2.0","method":"notifications/progress","params":7}"#;
        assert!(matches!(output.judge(notification.as_bytes()), Verdict::Skip));
        assert!(matches!(output.judge(b"   "), Verdict::Skip));
    }

    #[test]
    fn a_notification_before_initialize_is_dropped_rather_than_ending_the_session() {
        let output = output();
        let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        assert!(matches!(output.judge(initialized.as_bytes()), Verdict::Skip));
        assert!(matches!(output.judge(initialize(1).as_bytes()), Verdict::Forward(_)));
        assert!(matches!(output.judge(initialized.as_bytes()), Verdict::Forward(_)));
    }

    #[test]
    fn a_cancelled_request_is_no_longer_in_flight_and_an_answer_settles_it_once() {
        let output = output();
        let call = |id: i64| {
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {"name": "task_list"}}).to_string()
        };
        output.judge(initialize(1).as_bytes());
        output.settle(&RequestId::Number(1));
        output.judge(call(2).as_bytes());
        output.judge(call(3).as_bytes());
        assert_eq!(output.book().pending.len(), 2);
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}});
        assert!(matches!(output.judge(cancel.to_string().as_bytes()), Verdict::Forward(_)));
        assert_eq!(output.book().pending.len(), 1);
        output.settle(&RequestId::Number(2));
        assert_eq!(output.book().pending.len(), 1, "a late answer to the cancelled call settles nothing");
        output.settle(&RequestId::Number(3));
        assert_eq!(output.book().pending.len(), 0);
    }

    #[test]
    fn an_id_in_flight_is_refused_when_reused_and_free_again_once_answered() {
        let output = output();
        let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "task_list"}});
        output.judge(initialize(1).as_bytes());
        assert!(matches!(output.judge(call.to_string().as_bytes()), Verdict::Forward(_)));
        let refused = answer_of(output.judge(call.to_string().as_bytes()));
        assert_eq!((refused["id"].clone(), refused["error"]["code"].clone()), (json!(7), json!(-32600)));
        assert_eq!(refused["error"]["data"]["reason"], "request id 7 is already in flight");
        output.settle(&RequestId::Number(7));
        assert!(matches!(output.judge(call.to_string().as_bytes()), Verdict::Forward(_)), "answered: free again");
    }

    #[test]
    fn a_request_with_the_handshake_in_its_meta_begins_the_session() {
        let output = output();
        let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 2}});
        let call = |id: i64, version: &str| {
            let meta = json!({"io.modelcontextprotocol/protocolVersion": version,
                              "io.modelcontextprotocol/clientCapabilities": {}});
            json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                   "params": {"name": "task_list", "_meta": meta}})
            .to_string()
        };
        let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}).to_string();
        for waiting in [ping, call(2, "1999-01-01")] {
            assert!(matches!(output.judge(waiting.as_bytes()), Verdict::Forward(_)));
            assert!(matches!(output.judge(cancel.to_string().as_bytes()), Verdict::Skip), "not yet: {waiting}");
        }
        output.settle(&RequestId::Number(2));
        assert!(matches!(output.judge(call(2, "2025-06-18").as_bytes()), Verdict::Forward(_)));
        assert!(matches!(output.judge(cancel.to_string().as_bytes()), Verdict::Forward(_)));
        assert!(!output.book().pending.contains_key(&RequestId::Number(2)), "the cancel settled it");
    }

    #[test]
    fn progress_is_live_while_its_call_is_and_ends_when_the_answer_is_written() {
        let output = output();
        output.judge(initialize(1).as_bytes());
        output.settle(&RequestId::Number(1));
        let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                          "params": {"name": "task_list", "_meta": {"progressToken": "p"}}});
        output.judge(call.to_string().as_bytes());
        let token = ProgressToken(rmcp::model::NumberOrString::String("p".into()));
        assert!(output.book().progress.contains_key(&token));
        output.answering(&RequestId::Number(2));
        assert!(!output.book().progress.contains_key(&token), "no progress once the answer is on its way");
        assert!(output.book().unanswered().contains("not read by the client: 2;"), "{}", output.book().unanswered());
        output.settle(&RequestId::Number(2));
        assert!(output.book().pending.is_empty());
    }
}
