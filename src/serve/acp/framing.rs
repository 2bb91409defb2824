//! The framing between this process's stdio and the ACP crate: `subagents
//! acp` reads and writes its own lines, so that a bad line costs one error
//! reply instead of the process, and so that every request is answered
//! before exit. The crate sees only well-formed messages, through an
//! in-memory line channel ([`Lines`]).
//!
//! **Input** is read one line at a time, at most
//! [`MAX_LINE`](crate::child_process::MAX_LINE) (8 MiB) bytes of
//! it kept; blank lines are skipped. Each line is judged before the crate
//! sees it:
//!
//! | line | answer (never forwarded) |
//! |---|---|
//! | longer than 8 MiB (the rest is read and dropped) | `-32700`, id `null` |
//! | not UTF-8, or not JSON | `-32700`, id `null` |
//! | JSON but not a JSON-RPC message (a batch, a bad `jsonrpc`, …) | the crate's own error (`-32600`), with the request's id when it has a string or integer one, else `null` |
//! | a malformed answer to one of our requests | none: there is no one to answer (logged) |
//! | a request with id `null` | `-32600`, id `null` |
//! | a request whose `params` are not an object (every ACP request takes one) | `-32602` with its id |
//! | a second `initialize` after one succeeded | `-32600` with its id, `data.reason` "already initialized" |
//! | a request while [`MAX_IN_FLIGHT`] are unanswered | `-32603` with its id |
//!
//! Our error replies carry `data: {"reason": …}` in fixed wording, plus
//! for a parse error an `excerpt` of the line's first 64 characters, never
//! the whole line. Every other line goes to the crate. An `initialize` is
//! forwarded alone: the next line is read only once it has been answered,
//! so a client may write `session/new` right behind it.
//!
//! **Output**: the crate's lines and ours reach stdout whole, one at a
//! time. A request counts as in flight from the moment it is forwarded
//! until its answer has been written.
//!
//! **The end of input** (EOF, a failed read, a stop signal, stdout gone:
//! see `serve/framing.rs`) runs two phases, bounded together. *Closing*: the
//! `closing` token is cancelled, which cancels every turn of every session
//! now and later (a prompt cut off this way answers `cancelled`) and turns
//! a pending permission request into "not allowed". *Draining*: wait up to
//! `EOF_ANSWER_BOUND` (30 s) until no request is in flight, then end the crate's
//! input, so that the connection returns.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::sync::{Arc, MutexGuard};

use agent_client_protocol::{Error, ErrorCode, Lines, RawJsonRpcId, RawJsonRpcMessage, RawJsonRpcParams};
use agent_client_protocol::{RawJsonRpcRequest, TransportFrame};
use futures_util::{Sink, Stream};
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::serve::framing::{drain_at_eof, excerpt, id_list, Ledger, StdinLines};
use crate::serve::pipes::StdoutLines;

/// The most requests unanswered at once: it bounds what the crate queues
/// and what EOF waits for. Past it a request is refused at once.
pub(super) const MAX_IN_FLIGHT: usize = 1024;

/// Lines queued for the crate before reading stdin waits for it.
const FORWARD_QUEUE: usize = 64;

/// Where the handshake stands. `initialize` is ours to sequence: the crate
/// refuses requests that arrive before its answer went out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
enum Handshake {
    /// No `initialize` has succeeded yet.
    #[default]
    Waiting,
    /// This `initialize` is with the crate; nothing else is read meanwhile.
    Answering(RawJsonRpcId),
    /// One succeeded; another is refused.
    Done,
}

/// What is in flight.
#[derive(Debug, Default)]
struct Book {
    /// Forwarded request ids not yet answered, each with how many times it
    /// is in flight (a client may reuse an id).
    pending: HashMap<RawJsonRpcId, usize>,
    in_flight: usize,
    handshake: Handshake,
}

/// Stdout, shared by the crate's lines and our own replies, and the book of
/// requests in flight.
struct Output {
    stdout: StdoutLines,
    ledger: Ledger<Book>,
}

/// What becomes of one input line.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// Nothing to do (a blank line, a malformed answer).
    Skip,
    /// Answer it ourselves with this line.
    Reply(String),
    /// Hand it to the crate.
    Forward(String),
    /// Hand it to the crate and read on once it is answered.
    Initialize(String, RawJsonRpcId),
}

/// The transport for the crate's connection, and the input task that feeds
/// it (run it beside the connection; it ends after EOF and draining).
pub(super) fn stdio(
    closing: CancellationToken,
) -> (
    Lines<
        impl Sink<String, Error = io::Error> + Send + 'static,
        impl Stream<Item = io::Result<String>> + Send + 'static,
    >,
    impl Future<Output = ()> + Send + 'static,
) {
    let output = Arc::new(Output::new());
    let (forward, forwarded) = mpsc::channel::<String>(FORWARD_QUEUE);
    let incoming = futures_util::stream::unfold(forwarded, |mut forwarded| async move {
        forwarded.recv().await.map(|line| (Ok(line), forwarded))
    });
    let outgoing = futures_util::sink::unfold(output.clone(), |output, line: String| async move {
        output.write_from_agent(line).await?;
        Ok::<_, io::Error>(output)
    });
    (Lines::new(outgoing, incoming), read_input(output, forward, closing))
}

/// Reads stdin until EOF, answering bad lines and forwarding the rest; then
/// closes and drains (see the module docs).
async fn read_input(output: Arc<Output>, forward: mpsc::Sender<String>, closing: CancellationToken) {
    let mut lines = StdinLines::new();
    while let Some(line) = lines.next(&output.stdout, parse_error).await {
        let delivered = match output.judge(line) {
            Verdict::Skip => true,
            Verdict::Reply(reply) => output.write(reply).await.is_ok(),
            Verdict::Forward(line) => forward.send(line).await.is_ok(),
            Verdict::Initialize(line, id) => {
                let sent = forward.send(line).await.is_ok();
                if sent {
                    output.ledger.wait_until(|book| book.handshake != Handshake::Answering(id.clone())).await;
                }
                sent
            }
        };
        if !delivered {
            break;
        }
    }
    let settled = output.ledger.wait_until(|book| book.in_flight == 0);
    let unanswered = || {
        let ids = output.book().pending.keys().map(|id| serde_json::to_string(id).unwrap_or_default()).collect();
        format!("requests unanswered: {}", id_list(ids))
    };
    drain_at_eof(&closing, &output.stdout, "turn", unanswered, settled).await;
    // Dropping `forward` ends the crate's input: the connection returns.
}

impl Output {
    fn new() -> Self {
        Output { stdout: StdoutLines::new(), ledger: Ledger::default() }
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        self.ledger.book()
    }

    /// Writes one whole line.
    async fn write(&self, line: String) -> io::Result<()> {
        self.stdout.write(line).await
    }

    /// A line from the crate: written, then, if it answers a request, that
    /// request is no longer in flight.
    /// Once the output is gone the line is dropped quietly (that was logged
    /// once) and its request still settles, so that the drain ends.
    async fn write_from_agent(&self, line: String) -> io::Result<()> {
        let answer = serde_json::from_str::<Envelope>(&line).ok().and_then(Envelope::answer);
        let written = self.write(line).await;
        if let Some((id, succeeded)) = answer {
            self.settle(&id, succeeded);
        }
        match written {
            Err(_) if self.stdout.is_gone() => Ok(()),
            written => written,
        }
    }

    fn settle(&self, id: &RawJsonRpcId, succeeded: bool) {
        self.ledger.answered(|book| {
            if let Some(count) = book.pending.get_mut(id) {
                *count -= 1;
                if *count == 0 {
                    book.pending.remove(id);
                }
                book.in_flight -= 1;
            }
            if book.handshake == Handshake::Answering(id.clone()) {
                book.handshake = if succeeded { Handshake::Done } else { Handshake::Waiting };
            }
        });
    }

    fn judge(&self, line: Vec<u8>) -> Verdict {
        let text = match String::from_utf8(line) {
            Ok(text) => text,
            Err(error) => return Verdict::Reply(parse_error("the line is not valid UTF-8", error.as_bytes())),
        };
        if text.trim().is_empty() {
            return Verdict::Skip;
        }
        match TransportFrame::parse_json(&text) {
            TransportFrame::Single(RawJsonRpcMessage::Request(request)) => self.judge_request(request, text),
            TransportFrame::Malformed { error, .. } => malformed(&text, error),
            // Notifications, and the client's answers to our requests.
            _ => Verdict::Forward(text),
        }
    }

    fn judge_request(&self, request: RawJsonRpcRequest, text: String) -> Verdict {
        let RawJsonRpcRequest { id, method, params } = request;
        if id == RawJsonRpcId::Null {
            // Its answer could not be told from a reply to an unreadable id.
            return reply(id, Error::invalid_request(), "a request id must be a string or an integer");
        }
        if !matches!(params, Some(RawJsonRpcParams::Object(_))) {
            return reply(id, Error::invalid_params(), "params must be an object");
        }
        let mut book = self.book();
        let initialize = &*method == "initialize";
        if initialize && book.handshake != Handshake::Waiting {
            return reply(id, Error::invalid_request(), "already initialized");
        }
        if book.in_flight >= MAX_IN_FLIGHT {
            let reason = format!("too many requests in flight (at most {MAX_IN_FLIGHT})");
            return reply(id, Error::internal_error(), &reason);
        }
        *book.pending.entry(id.clone()).or_default() += 1;
        book.in_flight += 1;
        if initialize {
            book.handshake = Handshake::Answering(id.clone());
            Verdict::Initialize(text, id)
        } else {
            Verdict::Forward(text)
        }
    }
}

/// A line that is JSON but not a JSON-RPC message.
fn malformed(text: &str, error: Error) -> Verdict {
    if error.code == ErrorCode::PARSE_ERROR {
        return Verdict::Reply(parse_error("the line is not valid JSON", text.as_bytes()));
    }
    let value: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    let object = value.as_object();
    let call_shaped = object.is_some_and(|o| o.contains_key("method"));
    if !call_shaped && object.is_some_and(|o| o.contains_key("result") || o.contains_key("error")) {
        tracing::warn!("a malformed answer from the client was dropped");
        return Verdict::Skip;
    }
    let id = object.and_then(|o| o.get("id")).map_or(RawJsonRpcId::Null, |id| match id {
        Value::String(id) => RawJsonRpcId::Str(id.clone()),
        Value::Number(id) => id.as_i64().map_or(RawJsonRpcId::Null, RawJsonRpcId::Number),
        _ => RawJsonRpcId::Null,
    });
    let params = object.and_then(|o| o.get("params"));
    if call_shaped && params.is_some_and(|p| !p.is_object()) {
        return reply(id, Error::invalid_params(), "params must be an object");
    }
    Verdict::Reply(error_line(id, error))
}

fn reply(id: RawJsonRpcId, error: Error, reason: &str) -> Verdict {
    Verdict::Reply(error_line(id, error.data(json!({ "reason": reason }))))
}

/// A `-32700` reply (id `null`) quoting at most the line's first
/// `EXCERPT_CHARS` (64) characters.
fn parse_error(reason: &str, line: &[u8]) -> String {
    let excerpt = excerpt(line);
    error_line(RawJsonRpcId::Null, Error::parse_error().data(json!({ "reason": reason, "excerpt": excerpt })))
}

fn error_line(id: RawJsonRpcId, error: Error) -> String {
    serde_json::to_string(&RawJsonRpcMessage::response(id, Err(error))).unwrap_or_else(|_| {
        r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32603,"message":"Internal error"}}"#.to_owned()
    })
}

/// Just enough of an outgoing line to see whether it answers a request
/// (the rest, a result included, is skipped unparsed).
#[derive(Deserialize)]
struct Envelope {
    method: Option<IgnoredAny>,
    id: Option<RawJsonRpcId>,
    error: Option<IgnoredAny>,
}

impl Envelope {
    /// The id it answers and whether it succeeded, if it is an answer.
    fn answer(self) -> Option<(RawJsonRpcId, bool)> {
        match (self.method, self.id) {
            (None, Some(id)) => Some((id, self.error.is_none())),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply_of(verdict: Verdict) -> Value {
        match verdict {
            Verdict::Reply(line) => serde_json::from_str(&line).unwrap(),
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    #[test]
    fn a_second_initialize_is_refused_only_after_one_succeeded() {
        let output = Output::new();
        let init = |id: i64| format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"initialize","params":{{}}}}"#);
        assert!(matches!(output.judge(init(1).into_bytes()), Verdict::Initialize(_, _)));
        output.settle(&RawJsonRpcId::Number(1), false);
        assert!(matches!(output.judge(init(2).into_bytes()), Verdict::Initialize(_, _)), "a failed one may be retried");
        output.settle(&RawJsonRpcId::Number(2), true);
        let refused = reply_of(output.judge(init(3).into_bytes()));
        assert_eq!((refused["id"].clone(), refused["error"]["code"].clone()), (json!(3), json!(-32600)));
        assert_eq!(output.book().in_flight, 0);
    }

    #[test]
    fn bad_params_are_invalid_params_with_the_id_whether_or_not_the_crate_parses_them() {
        let output = Output::new();
        for line in [
            r#"{"jsonrpc":"2.0","id":"a","method":"initialize","params":5}"#,
            r#"{"jsonrpc":"2.0","id":"a","method":"initialize","params":[1]}"#,
            r#"{"jsonrpc":"2.0","id":"a","method":"session/new"}"#,
        ] {
            let answer = reply_of(output.judge(line.as_bytes().to_vec()));
            assert_eq!((answer["id"].clone(), answer["error"]["code"].clone()), (json!("a"), json!(-32602)), "{line}");
        }
    }

    #[test]
    fn an_answer_is_read_from_an_envelope_without_its_result() {
        let answer = |line: &str| serde_json::from_str::<Envelope>(line).ok().and_then(Envelope::answer);
        assert_eq!(
            answer(r#"{"jsonrpc":"2.0","id":4,"result":{"big":[1,2,3]}}"#),
            Some((RawJsonRpcId::Number(4), true))
        );
        assert_eq!(
            answer(r#"{"jsonrpc":"2.0","id":"x","error":{"code":1}}"#),
            Some((RawJsonRpcId::Str("x".into()), false))
        );
        assert_eq!(answer(r#"{"jsonrpc":"2.0","id":4,"method":"session/request_permission","params":{}}"#), None);
        assert_eq!(answer(r#"{"jsonrpc":"2.0","method":"session/update","params":{}}"#), None);
    }

    #[test]
    fn requests_past_the_in_flight_limit_are_refused_and_a_reused_id_is_counted_twice() {
        let output = Output::new();
        let prompt = |id: usize| format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"session/prompt","params":{{}}}}"#);
        for id in 0..MAX_IN_FLIGHT - 1 {
            assert!(matches!(output.judge(prompt(id).into_bytes()), Verdict::Forward(_)));
        }
        assert!(matches!(output.judge(prompt(0).into_bytes()), Verdict::Forward(_)), "an id reused in flight");
        let refused = reply_of(output.judge(prompt(5000).into_bytes()));
        assert_eq!((refused["id"].clone(), refused["error"]["code"].clone()), (json!(5000), json!(-32603)));
        output.settle(&RawJsonRpcId::Number(0), true);
        assert_eq!(output.book().pending.get(&RawJsonRpcId::Number(0)), Some(&1), "one of the two still in flight");
        output.settle(&RawJsonRpcId::Number(0), true);
        output.settle(&RawJsonRpcId::Number(0), true);
        assert_eq!(output.book().in_flight, MAX_IN_FLIGHT - 2, "an extra answer settles nothing");
    }
}
