//! The HTTP side of the server: hyper's HTTP/1 connections in their
//! [`slots`](super::slots), the card, the bearer check, request bodies
//! bounded in bytes and in time, event streams, and the phased shutdown.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::header::{HeaderValue, AUTHORIZATION, CONNECTION, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::sync::broadcast;

use super::rpc::{to_value, Answer, Service, Stream};
use super::slots::{Answering, Slots, Standing};
use super::{card, A2aServeOptions};
use crate::serve::signals::StopSignals;
use crate::serve::ServeError;
use crate::wire::a2a::{self as wire, code, AgentCard, StreamResponse};

/// Largest request body read.
const MAX_REQUEST_BYTES: usize = 4 << 20;
/// How long a client may take to send a request's headers (the first
/// request's, or the next one's on a kept-alive connection) before its
/// connection is closed: a client that opens connections and sends
/// nothing cannot hold the connection slots.
pub(crate) const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// What every connection shares.
struct Door {
    service: Arc<Service>,
    card: Bytes,
    token: Option<String>,
    /// How long a request's body may take once its headers arrived.
    body_timeout: std::time::Duration,
}

pub(super) async fn serve(
    service: Arc<Service>,
    options: &A2aServeOptions,
    ready: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    let mut signals = StopSignals::register();
    let listener = tokio::net::TcpListener::bind(options.listen)
        .await
        .map_err(|e| ServeError::Options(format!("cannot listen on {}: {e}", options.listen)))?;
    let bound = listener.local_addr().map_err(ServeError::Runtime)?;
    let url = options.public_url.clone().unwrap_or_else(|| format!("http://{bound}/"));
    let card: AgentCard = card(&service.skills, &url, options.token.is_some());
    let card = Bytes::from(serde_json::to_vec(&card).unwrap_or_default());
    let door = Arc::new(Door {
        service: service.clone(),
        card,
        token: options.token.clone(),
        body_timeout: options.body_timeout,
    });
    ready(bound);
    let slots = Slots::new(options.max_connections);
    let mut connections = tokio::task::JoinSet::new();
    let signal = loop {
        tokio::select! {
            signal = signals.recv() => break signal,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let Some(slot) = slots.admit() else {
                    tracing::warn!("{} A2A connections are answering requests: closing a new one", options.max_connections);
                    drop(stream);
                    continue;
                };
                let door = door.clone();
                connections.spawn(async move {
                    let standing = slot.standing();
                    let handler = hyper::service::service_fn(move |request| {
                        let (door, standing) = (door.clone(), standing.clone());
                        async move { Ok::<_, Infallible>(door.answer(request, standing).await) }
                    });
                    let connection = hyper::server::conn::http1::Builder::new()
                        .timer(hyper_util::rt::TokioTimer::new())
                        .header_read_timeout(HEADER_TIMEOUT)
                        .serve_connection(TokioIo::new(stream), handler);
                    tokio::select! {
                        ended = connection => if let Err(error) = ended {
                            tracing::debug!(%error, "an A2A connection ended with an error");
                        },
                        () = slot.evicted() => {
                            tracing::debug!("closed an A2A connection without a whole request to make room for a new one");
                        }
                    }
                });
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    };
    drop(listener);
    // Phase "cancel": live runs end, and their streams hear it.
    tracing::info!(signal, "stopping: cancelling the live tasks");
    for task in service.store.live() {
        service.store.cancel(&task);
    }
    let settled = async {
        while !service.store.live().is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    if tokio::time::timeout(options.shutdown_grace, settled).await.is_err() {
        tracing::warn!("some tasks did not settle within the shutdown grace");
    }
    // Phase "close": every stream still open gets the task as it stands.
    service.closing.cancel();
    let drained = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(std::time::Duration::from_secs(1), drained).await.is_err() {
        connections.abort_all();
    }
    Ok(())
}

impl Door {
    async fn answer(&self, request: Request<Incoming>, standing: Arc<Standing>) -> Response<Body> {
        let path = request.uri().path();
        if request.method() == Method::GET && path.trim_start_matches('/') == wire::CARD_PATH {
            return json_response(StatusCode::OK, self.card.clone());
        }
        if request.method() != Method::POST || path != "/" {
            return json_response(StatusCode::NOT_FOUND, Bytes::from_static(b"{\"error\":\"not found\"}"));
        }
        if !self.authorized(request.headers().get(AUTHORIZATION)) {
            let mut response =
                json_response(StatusCode::UNAUTHORIZED, Bytes::from_static(b"{\"error\":\"unauthorized\"}"));
            response.headers_mut().insert(WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return response;
        }
        let version = request.headers().get(wire::VERSION_HEADER).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let read = Limited::new(request.into_body(), MAX_REQUEST_BYTES).collect();
        let body = match tokio::time::timeout(self.body_timeout, read).await {
            Ok(Ok(body)) => body.to_bytes(),
            Ok(Err(_)) => {
                return rpc_error(Value::Null, code::INVALID_REQUEST, "the request body is unreadable or exceeds 4 MiB")
            }
            Err(_) => return body_timed_out(self.body_timeout),
        };
        // Whole: from here until its response is sent, the connection
        // keeps its slot.
        let answering = Answering::begin(standing);
        self.respond(version, body).await.map(|body| Held { body, _answering: answering }.boxed_unsync())
    }

    /// The answer to a whole request.
    async fn respond(&self, version: Option<String>, body: Bytes) -> Response<Body> {
        let request: wire::Request = match serde_json::from_slice(&body) {
            Ok(request) => request,
            Err(_) => return rpc_error(Value::Null, code::PARSE_ERROR, "the body is not a JSON-RPC request"),
        };
        if let Some(version) = version.filter(|v| !(v == "1" || v.starts_with("1."))) {
            let message = format!("A2A-Version {version} is not supported: this server speaks 1.0");
            return rpc_error(request.id, code::VERSION_NOT_SUPPORTED, &message);
        }
        match self.service.handle(request).await {
            Answer::Json(response) => {
                json_response(StatusCode::OK, Bytes::from(serde_json::to_vec(&response).unwrap_or_default()))
            }
            Answer::Stream(stream) => self.event_stream(*stream),
        }
    }

    fn authorized(&self, header: Option<&HeaderValue>) -> bool {
        let Some(token) = &self.token else { return true };
        let Some(given) = header.and_then(|value| bearer_token(value.as_bytes())) else { return false };
        // Compared in time that does not depend on where they differ.
        let expected = token.as_bytes();
        given.len() == expected.len() && given.iter().zip(expected).fold(0u8, |diff, (a, b)| diff | (a ^ b)) == 0
    }

    fn event_stream(&self, stream: Stream) -> Response<Body> {
        let closing = self.service.closing.clone();
        let service = self.service.clone();
        let Stream { id, first, feed, task_id } = stream;
        let ended = ends(&first);
        let state = Follow { id, first: Some(first), feed, task_id, done: ended, service };
        let events = futures_util::stream::unfold(state, move |mut state| {
            let closing = closing.clone();
            async move {
                let event = state.next(&closing).await?;
                let frame = Frame::data(sse_frame(&state.id, &event));
                Some((Ok::<_, Infallible>(frame), state))
            }
        });
        let mut response = Response::new(StreamBody::new(events).boxed_unsync());
        response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        response.headers_mut().insert("cache-control", HeaderValue::from_static("no-cache"));
        response
    }
}

/// The token of an `Authorization` value of the bearer scheme: the scheme
/// in any case, then one or more spaces (RFC 9110 §11.4).
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked("Bearer".len())?;
    let spaces = rest.iter().take_while(|&&byte| byte == b' ').count();
    (scheme.eq_ignore_ascii_case(b"Bearer") && spaces > 0).then(|| &rest[spaces..])
}

/// A response body that keeps its connection answering (in its slot)
/// until it is sent or dropped; otherwise the body itself.
struct Held {
    body: Body,
    _answering: Answering,
}

impl hyper::body::Body for Held {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Pin::new(&mut self.body).poll_frame(context)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// One stream's place: what it sent, and whether the task has ended.
struct Follow {
    id: Value,
    first: Option<StreamResponse>,
    feed: broadcast::Receiver<StreamResponse>,
    task_id: String,
    done: bool,
    service: Arc<Service>,
}

impl Follow {
    async fn next(&mut self, closing: &tokio_util::sync::CancellationToken) -> Option<StreamResponse> {
        if let Some(first) = self.first.take() {
            return Some(first);
        }
        if self.done {
            return None;
        }
        let event = tokio::select! {
            event = self.feed.recv() => match event {
                Ok(event) => event,
                // Fell behind: the task as it stands says all it missed.
                Err(broadcast::error::RecvError::Lagged(_)) => self.snapshot()?,
                Err(broadcast::error::RecvError::Closed) => return None,
            },
            _ = closing.cancelled() => {
                self.done = true;
                return self.snapshot();
            }
        };
        self.done = ends(&event);
        Some(event)
    }

    fn snapshot(&self) -> Option<StreamResponse> {
        let task = self.service.store.get(&self.task_id)?;
        Some(StreamResponse { task: Some(task), ..StreamResponse::default() })
    }
}

/// Whether a stream ends after this event: the task is terminal or waits
/// for its client.
fn ends(event: &StreamResponse) -> bool {
    let state = match (&event.task, &event.status_update) {
        (Some(task), _) => task.status.state,
        (None, Some(update)) => update.status.state,
        _ => return event.message.is_some(),
    };
    state.is_terminal() || state.is_interrupted()
}

fn sse_frame(id: &Value, event: &StreamResponse) -> Bytes {
    let response = wire::Response::result(id.clone(), to_value(event));
    let mut frame = b"data: ".to_vec();
    frame.extend_from_slice(&serde_json::to_vec(&response).unwrap_or_default());
    frame.extend_from_slice(b"\n\n");
    Bytes::from(frame)
}

fn json_response(status: StatusCode, body: Bytes) -> Response<Body> {
    let mut response = Response::new(Full::new(body).boxed_unsync());
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A `408` with a JSON-RPC error, closing the connection: its body did
/// not arrive within `bound`.
fn body_timed_out(bound: std::time::Duration) -> Response<Body> {
    let message = format!("the request body did not arrive within {} s", bound.as_secs_f64());
    let response = wire::Response::error(Value::Null, code::INVALID_REQUEST, &message);
    let body = Bytes::from(serde_json::to_vec(&response).unwrap_or_default());
    let mut response = json_response(StatusCode::REQUEST_TIMEOUT, body);
    response.headers_mut().insert(CONNECTION, HeaderValue::from_static("close"));
    response
}

fn rpc_error(id: Value, code: i64, message: &str) -> Response<Body> {
    let response = wire::Response::error(id, code, message);
    json_response(StatusCode::OK, Bytes::from(serde_json::to_vec(&response).unwrap_or_default()))
}
