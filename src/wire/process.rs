//! The `serve` protocol: newline-delimited JSON-RPC 2.0 over a child's
//! stdio, and the parent's end of a connection.
//!
//! Parent → child requests: `initialize {protocol_version, route, profile,
//! patches, cwd, budget?, parent_session?, traceparent?, tracestate?,
//! mcp_servers?}` → `{protocol_version, session_id}`; `prompt {prompt}` →
//! `{reason, usage?}` once the turn ended (`usage`: what the turn's model
//! calls spent, a [`RunUsage`](crate::seam::RunUsage); an older peer omits it); `shutdown` → `{runs?}` (the child then
//! exits): `runs` is added by peers that report receipts, the
//! [`Branch`](crate::seam::Branch)es of every run the session started, gathered
//! once each is quiescent (an older peer's `{}` leaves that branch unknown).
//! Parent → child notification: `cancel`. Child → parent notification:
//! `event {type: text_delta | assistant_message | tool_call | turn_end, …}`.
//! Turn-end reasons ([`TurnEndReason`]): `completed`, `max-tokens`,
//! `blocked`, `aborted`, `error`; tool call statuses ([`ToolCallStatus`]):
//! `pending`, `completed`, `failed`.
//!
//! **Approvals.** A parent whose run reaches an approver says so in
//! `initialize` (`approvals: true`; sent only then, as an older child
//! refuses fields it does not know). Its child may then ask: child →
//! parent request `permission {request}` (a
//! [`PermissionRequest`](crate::seam::PermissionRequest) whose `asker` is
//! the path within the child's runtime) with a string id (`approval-N`),
//! answered by a response `{verdict, by}` (an
//! [`Answer`](crate::seam::Answer)); and the notification
//! `permission_withdrawn {id}` when the child stops waiting (its own
//! timeout, its run's cancel), after which an answer to that id is
//! ignored. A parent that does not know `permission` ignores it, and a
//! child that was not told `approvals` never asks.
//!
//! **Limits.** A parent that holds limiters for model routes lends them in
//! `initialize` (`limits: [route names]`, and `model_route`: the route the
//! session's model is on; sent only then). The child's model calls on a
//! lent route then ask the parent's limiter first (`limit/admit` and the
//! notifications after it, in [`super::limit`]). A child that does not know
//! the fields refuses the `initialize` (-32602); the parent asks again
//! without them, and that child keeps its own limits.

pub(crate) mod profile;

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::AnyDelimiterCodecError;

use super::limit::LimitAsk;
use crate::child_process::lines;
pub(crate) use crate::seam::ToolCallStatus;
use crate::seam::{AgentOptions, Budget, ProgressUpdate, StopReason};

/// The protocol version both ends speak.
pub(crate) const PROTOCOL_VERSION: u32 = 1;

/// `initialize` parameters: the route crosses as an explicit whitelist.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Initialize {
    /// Must equal [`PROTOCOL_VERSION`].
    pub protocol_version: u32,
    /// Model route: provider, model, max_tokens, reasoning_effort only.
    pub route: AgentOptions,
    /// The child's named profile.
    pub profile: String,
    /// Ordered JSON merge patches over the profile.
    pub patches: Vec<Value>,
    /// The child's working directory (absolute).
    pub cwd: std::path::PathBuf,
    /// What is left of the delegation budget the child holds: the child
    /// runtime opens it for its own subtree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// The delegating session in the parent's runtime: the child's session
    /// names it as its parent, so the lineage crosses the process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_session: Option<String>,
    /// The W3C trace context of the parent's run, sent only while its
    /// spans are exported: the child's span joins that trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// Its vendor state, when the trace has any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
    /// The MCP servers the child's session mounts (absent: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp_servers: Vec<WireMcpServer>,
    /// The parent answers `permission` requests: its run reaches an
    /// approver (absent: it does not, and the child's requests find no one).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub approvals: bool,
    /// The routes whose limiter the parent lends, by name: the child's
    /// model calls on a route of that name ask the parent's limiter too
    /// (absent: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<String>,
    /// Which of `limits` the session's own model is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_route: Option<String>,
}

/// The child's request for permission.
pub(crate) const PERMISSION: &str = "permission";

/// The child stopped waiting for an answer (`{id}`).
pub(crate) const PERMISSION_WITHDRAWN: &str = "permission_withdrawn";

/// What a child asks of its parent, as the parent's reader hands it on.
#[derive(Debug)]
pub(crate) enum ChildAsk {
    /// `permission`: the request's id and its parameters, not yet read.
    Ask {
        /// The child's id for it.
        id: Value,
        /// `{request}`.
        params: Value,
    },
    /// `permission_withdrawn`: the child no longer waits on `id`.
    Withdrawn {
        /// The id it asked with.
        id: Value,
    },
}

/// One MCP server a child's session mounts, as the parent resolved it: a
/// stdio server's `command` (with the variables it inherits from the
/// parent sent in `env`), or a streamable HTTP server's `url`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WireMcpServer {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<std::path::PathBuf>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<(String, String)>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<std::path::PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<(String, String)>,
    pub initialize_timeout_ms: u64,
    pub call_timeout_ms: u64,
    pub max_result_bytes: usize,
}

/// A child event, streamed while a turn runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum ChildEvent {
    /// Streamed answer text.
    TextDelta {
        /// The text.
        text: String,
    },
    /// A finished assistant message.
    AssistantMessage {
        /// Its text.
        text: String,
    },
    /// A tool call changed status.
    ToolCall {
        /// The tool.
        name: String,
        /// `pending`, `completed` or `failed`.
        status: ToolCallStatus,
    },
    /// Progress of a run the child delegated to, as its own runtime saw it.
    Delegated {
        /// The update, one level down.
        update: ProgressUpdate,
    },
    /// The turn ended.
    TurnEnd {
        /// Why.
        reason: TurnEndReason,
    },
}

/// Why a served turn ended, spelled as the wire spells it; both ends map
/// it to and from [`StopReason`] here, and nowhere else.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TurnEndReason {
    /// `completed`.
    Completed,
    /// `max-tokens`.
    MaxTokens,
    /// `blocked`: the child refused.
    Blocked,
    /// `aborted`: cancelled.
    Aborted,
    /// `error`, and any reason this end does not know.
    #[serde(other)]
    Error,
}

impl From<StopReason> for TurnEndReason {
    fn from(stop: StopReason) -> Self {
        match stop {
            StopReason::Completed => TurnEndReason::Completed,
            StopReason::MaxTokens => TurnEndReason::MaxTokens,
            StopReason::Refusal => TurnEndReason::Blocked,
            StopReason::Aborted => TurnEndReason::Aborted,
            StopReason::Error => TurnEndReason::Error,
        }
    }
}

impl From<TurnEndReason> for StopReason {
    fn from(reason: TurnEndReason) -> Self {
        match reason {
            TurnEndReason::Completed => StopReason::Completed,
            TurnEndReason::MaxTokens => StopReason::MaxTokens,
            TurnEndReason::Blocked => StopReason::Refusal,
            TurnEndReason::Aborted => StopReason::Aborted,
            TurnEndReason::Error => StopReason::Error,
        }
    }
}

/// Why a call to the child failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WireError {
    /// The child answered with a JSON-RPC error: its code and message
    /// (at most 1 KiB, not yet made safe to show).
    #[error("the child answered with JSON-RPC error {0}")]
    Remote(i64, String),
    /// The child broke the protocol (garbage, an oversized line, …).
    #[error("the child broke the protocol")]
    Protocol,
    /// The connection closed (the child exited).
    #[error("the connection to the child closed")]
    Closed,
}

type Pending = Rc<RefCell<HashMap<u64, oneshot::Sender<Result<Value, WireError>>>>>;

/// The parent's end: requests with replies, notifications, and the
/// child's events. Lives on the run actor's thread.
pub(crate) struct Connection {
    outgoing: RefCell<Option<mpsc::UnboundedSender<String>>>,
    pending: Pending,
    next_id: RefCell<u64>,
    /// Set when the child broke the protocol.
    broken: Rc<RefCell<bool>>,
    writer: RefCell<Option<tokio::task::JoinHandle<()>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Connection {
    /// Starts the reader and writer tasks on the current local set.
    pub(crate) fn start(
        stdin: ChildStdin,
        stdout: ChildStdout,
        events: mpsc::UnboundedSender<ChildEvent>,
        asks: Option<mpsc::UnboundedSender<ChildAsk>>,
        limits: Option<mpsc::Sender<LimitAsk>>,
    ) -> Connection {
        let (outgoing, mut lines) = mpsc::unbounded_channel::<String>();
        let writer = tokio::task::spawn_local(async move {
            let mut stdin = stdin;
            while let Some(line) = lines.recv().await {
                if stdin.write_all(line.as_bytes()).await.is_err() || stdin.flush().await.is_err() {
                    break;
                }
            }
            // Dropping stdin here is the child's EOF.
        });
        let pending: Pending = Rc::default();
        let broken = Rc::new(RefCell::new(false));
        let reader = tokio::task::spawn_local(read_loop(stdout, pending.clone(), broken.clone(), events, asks, limits));
        Connection {
            outgoing: RefCell::new(Some(outgoing)),
            pending,
            next_id: RefCell::new(1),
            broken,
            writer: RefCell::new(Some(writer)),
            reader,
        }
    }

    fn send_line(&self, message: Value) -> bool {
        let mut line = message.to_string();
        line.push('\n');
        self.outgoing.borrow().as_ref().is_some_and(|out| out.send(line).is_ok())
    }

    /// Sends a request and waits for its reply.
    pub(crate) async fn request(&self, method: &str, params: Value) -> Result<Value, WireError> {
        let id = {
            let mut next = self.next_id.borrow_mut();
            *next += 1;
            *next - 1
        };
        if self.reader.is_finished() {
            // The reader drained every pending request when it stopped;
            // nothing would ever answer this one.
            return Err(if self.is_broken() { WireError::Protocol } else { WireError::Closed });
        }
        let (reply, replied) = oneshot::channel();
        self.pending.borrow_mut().insert(id, reply);
        if !self.send_line(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})) {
            self.pending.borrow_mut().remove(&id);
            return Err(WireError::Closed);
        }
        replied.await.unwrap_or(Err(WireError::Closed))
    }

    /// Sends a notification.
    pub(crate) fn notify(&self, method: &str, params: Value) {
        self.send_line(json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// A way to answer the child's requests that does not keep its input
    /// open: once [`Connection::close_input`] ran, answers go nowhere.
    pub(crate) fn replier(&self) -> Replier {
        Replier(self.outgoing.borrow().as_ref().map(mpsc::UnboundedSender::downgrade))
    }

    /// Whether the child broke the protocol.
    pub(crate) fn is_broken(&self) -> bool {
        *self.broken.borrow()
    }

    /// Closes the child's stdin (after queued lines are written).
    pub(crate) async fn close_input(&self) {
        self.outgoing.borrow_mut().take();
        let writer = self.writer.borrow_mut().take();
        if let Some(writer) = writer {
            let _ = writer.await;
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.reader.abort();
        if let Some(writer) = self.writer.borrow_mut().take() {
            writer.abort();
        }
    }
}

/// Answers to a child's requests, on a connection that may have closed.
#[derive(Clone, Debug)]
pub(crate) struct Replier(Option<mpsc::WeakUnboundedSender<String>>);

impl Replier {
    /// A replier whose lines go to `out` (a test's stand-in for the wire).
    #[cfg(test)]
    pub(crate) fn for_test(out: &mpsc::UnboundedSender<String>) -> Replier {
        Replier(Some(out.downgrade()))
    }

    /// Sends `result` as the response to the child's request `id`.
    pub(crate) fn reply(&self, id: &Value, result: Value) {
        let mut line = json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string();
        line.push('\n');
        if let Some(out) = self.0.as_ref().and_then(mpsc::WeakUnboundedSender::upgrade) {
            let _ = out.send(line);
        }
    }

    /// Answers the child's request `id` with JSON-RPC error `code`.
    pub(crate) fn refuse(&self, id: &Value, code: i64, message: &str) {
        let error = json!({"code": code, "message": message});
        let mut line = json!({"jsonrpc": "2.0", "id": id, "error": error}).to_string();
        line.push('\n');
        if let Some(out) = self.0.as_ref().and_then(mpsc::WeakUnboundedSender::upgrade) {
            let _ = out.send(line);
        }
    }
}

async fn read_loop(
    stdout: ChildStdout,
    pending: Pending,
    broken: Rc<RefCell<bool>>,
    events: mpsc::UnboundedSender<ChildEvent>,
    asks: Option<mpsc::UnboundedSender<ChildAsk>>,
    limits: Option<mpsc::Sender<LimitAsk>>,
) {
    let mut lines = lines(stdout);
    loop {
        let line = match lines.next().await {
            Some(Ok(line)) => line,
            None | Some(Err(AnyDelimiterCodecError::Io(_))) => break,
            Some(Err(AnyDelimiterCodecError::MaxChunkLengthExceeded)) => {
                tracing::warn!("a child wrote a line longer than the protocol allows");
                *broken.borrow_mut() = true;
                break;
            }
        };
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let Ok(message) = serde_json::from_slice::<Value>(&line) else {
            tracing::warn!("a child wrote a line that is not JSON");
            *broken.borrow_mut() = true;
            break;
        };
        let method = message.get("method").and_then(Value::as_str);
        if let (Some(PERMISSION | PERMISSION_WITHDRAWN), Some(asks)) = (method, &asks) {
            let id = message.get("id").cloned().unwrap_or(Value::Null);
            let ask = match method {
                Some(PERMISSION) => ChildAsk::Ask { id, params: message["params"].clone() },
                _ => ChildAsk::Withdrawn { id: message["params"]["id"].clone() },
            };
            let _ = asks.send(ask);
        } else if let (Some(method), Some(limits)) = (method.filter(|m| LimitAsk::is_limit(m)), &limits) {
            // Waited for: a child that asks faster than its asks are
            // answered is read no faster.
            let ask = LimitAsk::read(method, message.get("id"), &message["params"]);
            let _ = limits.send(ask).await;
        } else if let Some(id) = message.get("id").and_then(Value::as_u64).filter(|_| method.is_none()) {
            let Some(reply) = pending.borrow_mut().remove(&id) else {
                // A response to a request never made: the child is confused.
                tracing::warn!(id, "a child answered a request that was never made");
                *broken.borrow_mut() = true;
                break;
            };
            let outcome = match (message.get("result"), message.get("error")) {
                (Some(result), None) => Ok(result.clone()),
                (None, Some(error)) => {
                    let message = crate::seam::cut(error["message"].as_str().unwrap_or_default(), 1024).to_owned();
                    Err(WireError::Remote(error["code"].as_i64().unwrap_or(0), message))
                }
                _ => Err(WireError::Protocol),
            };
            let _ = reply.send(outcome);
        } else if method == Some("event") {
            match serde_json::from_value::<ChildEvent>(message["params"].clone()) {
                Ok(event) => {
                    let _ = events.send(event);
                }
                Err(_) => tracing::debug!("ignoring an unknown child event"),
            }
        }
    }
    let failure = if *broken.borrow() { WireError::Protocol } else { WireError::Closed };
    for (_, reply) in pending.borrow_mut().drain() {
        let _ = reply.send(Err(failure.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_and_statuses_keep_their_wire_spelling_and_an_unknown_reason_is_an_error() {
        let reasons = [
            (StopReason::Completed, "completed"),
            (StopReason::MaxTokens, "max-tokens"),
            (StopReason::Refusal, "blocked"),
            (StopReason::Aborted, "aborted"),
            (StopReason::Error, "error"),
        ];
        for (stop, spelled) in reasons {
            let reason = TurnEndReason::from(stop);
            assert_eq!(serde_json::to_value(reason).unwrap(), json!(spelled));
            assert_eq!(StopReason::from(serde_json::from_value::<TurnEndReason>(json!(spelled)).unwrap()), stop);
        }
        assert_eq!(serde_json::from_value::<TurnEndReason>(json!("exploded")).unwrap(), TurnEndReason::Error);
        for status in [ToolCallStatus::Pending, ToolCallStatus::Completed, ToolCallStatus::Failed] {
            assert_eq!(serde_json::to_value(status).unwrap(), json!(status.as_str()));
        }
        let event = ChildEvent::ToolCall { name: "read_file".into(), status: ToolCallStatus::Failed };
        assert_eq!(
            serde_json::to_value(event).unwrap(),
            json!({"type": "tool_call", "name": "read_file", "status": "failed"})
        );
    }
}
