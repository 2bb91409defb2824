//! The web view's HTTP side: hyper's HTTP/1 connections, capped; the token
//! and host checks; the fixed table of paths (nothing is read from disk by
//! a path); the headers every answer carries; the JSON answers and the
//! event stream.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use super::approvals::{verdict_of, Waiting};
use super::board::Board;
use super::gate::{self, Gate};
use super::history::History;
use crate::CancellationToken;

type Body = UnsyncBoxBody<Bytes, Infallible>;

const PAGE: &str = include_str!("page/index.html");
const SCRIPT: &str = include_str!("page/app.js");
const STYLE: &str = include_str!("page/app.css");

/// What every answer carries: no script but ours, no other origin, no
/// framing, no sniffing, no referrer (the URL holds the token), no cache.
const SECURITY_HEADERS: [(&str, &str); 6] = [
    (
        "content-security-policy",
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; \
         object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
    ("cache-control", "no-store"),
    ("cross-origin-resource-policy", "same-origin"),
];

/// How long a client may take to send a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// The most rows one page of runs holds.
const MAX_PAGE: usize = 500;
/// Events of one stream are at most this often (changes in between are
/// sent together).
const STREAM_EVERY: Duration = Duration::from_millis(250);
/// A comment on an idle stream, so proxies and the browser keep it.
const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// The longest query string read.
const MAX_QUERY: usize = 4096;
/// How long the body of an answer from the page may take to arrive.
const BODY_WITHIN: Duration = Duration::from_secs(5);
/// The largest body of an answer from the page.
const MAX_ANSWER_BODY: usize = 4096;
/// The header that carries the token of a request that changes something.
const TOKEN_HEADER: &str = "x-subagents-token";

/// What every connection shares.
pub(super) struct Door {
    token: String,
    address: SocketAddr,
    board: Option<Board>,
    history: Arc<History>,
    /// The requests parked in the home, when there is one.
    waiting: Option<Arc<Waiting>>,
    streams: Arc<Semaphore>,
    page: Bytes,
    stop: CancellationToken,
}

impl Door {
    pub(super) fn new(
        token: String,
        address: SocketAddr,
        board: Option<Board>,
        home: Option<std::path::PathBuf>,
        max_streams: usize,
    ) -> Door {
        // The token is letters, digits, `-` and `_` (checked): safe in the page.
        let page = Bytes::from(PAGE.replace("__TOKEN__", &token));
        Door {
            token,
            address,
            board,
            waiting: home.clone().map(|home| Arc::new(Waiting::new(home))),
            history: Arc::new(History::new(home)),
            streams: Arc::new(Semaphore::new(max_streams.max(1))),
            page,
            stop: CancellationToken::new(),
        }
    }
}

pub(super) async fn serve(
    listener: tokio::net::TcpListener,
    door: Door,
    max_connections: usize,
    stop: CancellationToken,
) {
    let door = Arc::new(Door { stop: stop.clone(), ..door });
    if let Some(waiting) = &door.waiting {
        tokio::spawn(waiting.clone().keep_reading(stop.clone()));
    }
    // Connections without the token have a budget of their own: they can
    // never take the places of those with it (see `gate.rs`).
    let gate = Gate::new(max_connections, max_connections);
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let place = gate.enter();
                connections.spawn(connection(door.clone(), gate.clone(), place, stream));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    let drained = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(1), drained).await.is_err() {
        connections.abort_all();
    }
}

/// One connection: its head read within [`gate::HEAD_WITHIN`] while it
/// holds an unproven place; then, with the token, served on a proven place
/// and kept alive, else answered once within
/// [`gate::UNPROVEN_SERVE_WITHIN`] and closed.
async fn connection(door: Arc<Door>, gate: Arc<Gate>, place: gate::Unproven, mut stream: tokio::net::TcpStream) {
    let mut head = Vec::with_capacity(1024);
    let whole = tokio::select! {
        read = tokio::time::timeout(gate::HEAD_WITHIN, gate::read_head(&mut stream, &mut head)) => {
            read.ok().flatten().is_some()
        }
        // Its place is taken: served still if its head has come.
        () = place.closed.cancelled() => gate::read_head_now(&stream, &mut head),
    };
    if !whole {
        return;
    }
    let proven = door.carries_token(&head).then(|| gate.prove()).flatten();
    let handler = {
        let door = door.clone();
        hyper::service::service_fn(move |request| {
            let door = door.clone();
            async move { Ok::<_, Infallible>(door.answer(request).await) }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(hyper_util::rt::TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT).max_buf_size(gate::MAX_HEAD);
    let io = TokioIo::new(gate::Rewind::new(head, stream));
    let served = match proven {
        Some(_permit) => {
            drop(place);
            let connection = builder.keep_alive(true).serve_connection(io, handler);
            tokio::select! {
                served = connection => served.err(),
                () = door.stop.cancelled() => None,
            }
        }
        None => {
            let connection = builder.keep_alive(false).serve_connection(io, handler);
            tokio::select! {
                served = tokio::time::timeout(gate::UNPROVEN_SERVE_WITHIN, connection) => served.ok().and_then(Result::err),
                () = place.closed.cancelled() => None,
                () = door.stop.cancelled() => None,
            }
        }
    };
    if let Some(error) = served {
        tracing::debug!(%error, "a web view connection ended with an error");
    }
}

impl Door {
    /// Whether a request head carries the token: in its query, or in the
    /// [`TOKEN_HEADER`].
    fn carries_token(&self, head: &[u8]) -> bool {
        let Ok(head) = std::str::from_utf8(head) else { return false };
        let mut lines = head.split("\r\n");
        let target = lines.next().and_then(|line| line.split(' ').nth(1)).unwrap_or_default();
        let in_query = target
            .split_once('?')
            .and_then(|(_, query)| parse_query(query))
            .is_some_and(|query| self.authorized(query.get("token").map(String::as_str)));
        in_query
            || lines.filter_map(|line| line.split_once(':')).any(|(name, value)| {
                name.trim().eq_ignore_ascii_case(TOKEN_HEADER) && self.authorized(Some(value.trim()))
            })
    }

    async fn answer(&self, request: Request<Incoming>) -> Response<Body> {
        let mut response = match request.uri().path() {
            "/api/approve" => self.approve(request).await,
            _ => self.route(&request).await,
        };
        for (name, value) in SECURITY_HEADERS {
            response.headers_mut().insert(name, HeaderValue::from_static(value));
        }
        response
    }

    async fn route(&self, request: &Request<Incoming>) -> Response<Body> {
        if request.method() != Method::GET {
            return text(StatusCode::METHOD_NOT_ALLOWED, "only GET is served");
        }
        if !self.host_allowed(request.headers().get(HOST)) {
            return text(StatusCode::MISDIRECTED_REQUEST, "this server answers only to its own address");
        }
        let query = match request.uri().query().map(parse_query) {
            Some(None) => return text(StatusCode::BAD_REQUEST, "the query is malformed or too long"),
            Some(Some(query)) => query,
            None => HashMap::new(),
        };
        if !self.authorized(query.get("token").map(String::as_str)) {
            return text(StatusCode::UNAUTHORIZED, "open the address the server printed: it carries the token");
        }
        let number =
            |key: &str, default: usize| query.get(key).and_then(|v| v.parse::<usize>().ok()).unwrap_or(default);
        let word = |key: &str| query.get(key).map(String::as_str).unwrap_or_default().to_owned();
        match request.uri().path() {
            "/" => asset("text/html; charset=utf-8", self.page.clone()),
            "/app.js" => asset("text/javascript; charset=utf-8", Bytes::from_static(SCRIPT.as_bytes())),
            "/app.css" => asset("text/css; charset=utf-8", Bytes::from_static(STYLE.as_bytes())),
            "/api/live" => json_ok(&match &self.board {
                Some(board) => board.snapshot(),
                None => json!({"board": false, "approvals": self.waiting.is_some()}),
            }),
            "/api/approvals" => match &self.waiting {
                Some(waiting) => json_ok(&waiting.now()),
                None => text(StatusCode::NOT_FOUND, "no home: no parked requests to show"),
            },
            "/api/runs" => json_ok(&self.runs(number("offset", 0), number("limit", 100), &word("filter"), &word("q"))),
            "/api/events" => self.events(),
            "/api/sessions" => {
                let (offset, limit, filter) = (number("offset", 0), number("limit", 100).min(MAX_PAGE), word("q"));
                self.blocking(move |history, _| Some(Ok(history.sessions(offset, limit, &filter)))).await
            }
            "/api/roots" => {
                let (offset, limit) = (number("offset", 0), number("limit", 50).min(MAX_PAGE));
                self.blocking(move |history, _| Some(Ok(history.roots(offset, limit)))).await
            }
            "/api/search" => {
                let query = word("q");
                self.blocking(move |history, _| Some(Ok(history.search(&query)))).await
            }
            "/api/session" => {
                let id = word("id");
                if !valid_id(&id) {
                    return text(StatusCode::BAD_REQUEST, "a session id is letters, digits, `-`, `_`, `.` or `:`");
                }
                self.blocking(move |history, board| history.transcript(&id, board.as_ref())).await
            }
            "/api/tree" => {
                let id = word("id");
                if !valid_id(&id) {
                    return text(StatusCode::BAD_REQUEST, "a session id is letters, digits, `-`, `_`, `.` or `:`");
                }
                self.blocking(move |history, board| history.tree(&id, board.as_ref()).map(Ok)).await
            }
            _ => text(StatusCode::NOT_FOUND, "not found"),
        }
    }

    /// `POST /api/approve` with `{"id": ID, "answer": "allow"|"always"|"reject"}`:
    /// answers a parked request as `subagents approve` does (the first
    /// answer wins). The token must come in the [`TOKEN_HEADER`], the body
    /// must be JSON, and a browser's request from another origin is
    /// refused: a page elsewhere can neither send nor read it.
    async fn approve(&self, request: Request<Incoming>) -> Response<Body> {
        if request.method() != Method::POST {
            return text(StatusCode::METHOD_NOT_ALLOWED, "an answer is a POST");
        }
        let headers = request.headers();
        if !self.host_allowed(headers.get(HOST)) {
            return text(StatusCode::MISDIRECTED_REQUEST, "this server answers only to its own address");
        }
        if !self.authorized(headers.get(TOKEN_HEADER).and_then(|value| value.to_str().ok())) {
            return text(StatusCode::UNAUTHORIZED, "an answer carries the token in its x-subagents-token header");
        }
        if !same_origin(headers) {
            return text(StatusCode::FORBIDDEN, "an answer from another origin is refused");
        }
        let media_type = headers.get(CONTENT_TYPE).and_then(|value| value.to_str().ok());
        let media_type = media_type.and_then(|value| value.split(';').next()).map(str::trim);
        if media_type != Some("application/json") {
            return text(StatusCode::UNSUPPORTED_MEDIA_TYPE, "an answer is JSON");
        }
        let Some(waiting) = self.waiting.clone() else {
            return text(StatusCode::NOT_FOUND, "no home: no parked requests to answer");
        };
        let body = http_body_util::Limited::new(request.into_body(), MAX_ANSWER_BODY).collect();
        let body = match tokio::time::timeout(BODY_WITHIN, body).await {
            Ok(Ok(body)) => body.to_bytes(),
            Ok(Err(_)) => return text(StatusCode::PAYLOAD_TOO_LARGE, "an answer is a small JSON object"),
            Err(_) => {
                // What is left of the body is not waited for: the connection goes.
                let mut response = text(StatusCode::REQUEST_TIMEOUT, "an answer's body came too slowly");
                response.headers_mut().insert(hyper::header::CONNECTION, HeaderValue::from_static("close"));
                return response;
            }
        };
        let asked: Value = serde_json::from_slice(&body).unwrap_or_default();
        let (Some(id), Some(verdict)) = (
            asked.get("id").and_then(Value::as_str).map(str::to_owned),
            asked.get("answer").and_then(Value::as_str).and_then(verdict_of),
        ) else {
            return json_status(
                StatusCode::BAD_REQUEST,
                &json!({"error": "an answer is {\"id\": ID, \"answer\": \"allow\" | \"always\" | \"reject\"}"}),
            );
        };
        match tokio::task::spawn_blocking(move || waiting.answer(&id, verdict)).await {
            Ok(Ok(answered)) => json_ok(&answered),
            Ok(Err(error @ (crate::batch::AnswerError::NotPending(_) | crate::batch::AnswerError::Gone(_)))) => {
                json_status(StatusCode::CONFLICT, &json!({"error": error.to_string()}))
            }
            Ok(Err(error @ crate::batch::AnswerError::NotAnId(_))) => {
                json_status(StatusCode::BAD_REQUEST, &json!({"error": error.to_string()}))
            }
            Ok(Err(error)) => json_status(StatusCode::INTERNAL_SERVER_ERROR, &json!({"error": error.to_string()})),
            Err(_) => json_status(StatusCode::INTERNAL_SERVER_ERROR, &json!({"error": "the answer failed"})),
        }
    }

    /// Runs a read of the store off the runtime's thread; `None` is a 404.
    async fn blocking(
        &self,
        read: impl FnOnce(&History, Option<Board>) -> Option<Result<Value, String>> + Send + 'static,
    ) -> Response<Body> {
        let (history, board) = (self.history.clone(), self.board.clone());
        match tokio::task::spawn_blocking(move || read(&history, board)).await {
            Ok(Some(Ok(value))) => json_ok(&value),
            Ok(Some(Err(why))) => json_status(StatusCode::UNPROCESSABLE_ENTITY, &json!({"error": why})),
            Ok(None) => json_status(StatusCode::NOT_FOUND, &json!({"error": "no such session"})),
            Err(_) => json_status(StatusCode::INTERNAL_SERVER_ERROR, &json!({"error": "the read failed"})),
        }
    }

    fn runs(&self, offset: usize, limit: usize, filter: &str, query: &str) -> Value {
        let Some(board) = &self.board else { return json!({"total": 0, "offset": 0, "rows": []}) };
        let state = board.lock();
        let limit = limit.clamp(1, MAX_PAGE);
        let wanted = |row: &&super::board::Row| {
            let kept = match filter {
                "failed" => row.failed(),
                "completed" => row.outcome == "completed",
                _ => true,
            };
            let text = |field: &Option<String>| field.as_deref().is_some_and(|value| value.contains(query));
            kept && (query.is_empty()
                || text(&row.label)
                || text(&row.id)
                || text(&row.detail)
                || row.outcome.contains(query))
        };
        if filter.is_empty() && query.is_empty() {
            let rows: Vec<_> = state.rows.iter().skip(offset).take(limit).map(|row| state.listed(row)).collect();
            return json!({"total": state.rows.len(), "offset": offset, "rows": rows});
        }
        let matching: Vec<_> = state.rows.iter().filter(wanted).collect();
        let rows: Vec<_> = matching.iter().skip(offset).take(limit).map(|row| state.listed(row)).collect();
        json!({"total": matching.len(), "offset": offset, "rows": rows})
    }

    /// The board's snapshot now, then again after every change (at most
    /// every [`STREAM_EVERY`]), as server-sent events.
    fn events(&self) -> Response<Body> {
        if self.board.is_none() && self.waiting.is_none() {
            return text(StatusCode::NOT_FOUND, "no batch to follow and no home: nothing changes here");
        }
        let Ok(permit) = self.streams.clone().try_acquire_owned() else {
            return text(StatusCode::SERVICE_UNAVAILABLE, "too many open views: close one");
        };
        let stream = Stream {
            changes: self.board.as_ref().map(Board::changes),
            board: self.board.clone(),
            waiting: self.waiting.as_ref().map(|waiting| waiting.changes()),
            _permit: permit,
            first: true,
            stop: self.stop.clone(),
        };
        let events = futures_util::stream::unfold(stream, |mut stream| async move {
            let frame = stream.next().await?;
            Some((Ok::<_, Infallible>(Frame::data(frame)), stream))
        });
        let mut response = Response::new(StreamBody::new(events).boxed_unsync());
        response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        response.headers_mut().insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
        response
    }

    fn authorized(&self, given: Option<&str>) -> bool {
        let (Some(given), expected) = (given, self.token.as_bytes()) else { return false };
        // Compared in time that does not depend on where they differ.
        given.len() == expected.len() && given.bytes().zip(expected).fold(0u8, |diff, (a, b)| diff | (a ^ b)) == 0
    }

    /// On loopback, the `Host` must be a loopback name with our port: a
    /// page of another site that rebinds its name to 127.0.0.1 is refused.
    fn host_allowed(&self, host: Option<&HeaderValue>) -> bool {
        if !self.address.ip().is_loopback() {
            return true;
        }
        let Some(host) = host.and_then(|value| value.to_str().ok()) else { return false };
        let port = self.address.port().to_string();
        let Some((name, given_port)) = host.rsplit_once(':') else { return false };
        given_port == port && matches!(name, "127.0.0.1" | "localhost" | "[::1]")
    }
}

/// One open event stream, holding its place among the capped streams:
/// `live` events of the board, `approvals` events of the parked requests.
struct Stream {
    board: Option<Board>,
    changes: Option<watch::Receiver<u64>>,
    waiting: Option<watch::Receiver<Arc<Value>>>,
    _permit: OwnedSemaphorePermit,
    first: bool,
    stop: CancellationToken,
}

impl Stream {
    async fn next(&mut self) -> Option<Bytes> {
        if std::mem::take(&mut self.first) {
            return Some(self.frame(true, true));
        }
        tokio::select! {
            changed = changed(&mut self.changes) => {
                changed.ok()?;
                // Changes in the next moment go out together.
                tokio::time::sleep(STREAM_EVERY).await;
                Some(self.frame(true, false))
            }
            changed = changed(&mut self.waiting) => {
                changed.ok()?;
                Some(self.frame(false, true))
            }
            () = tokio::time::sleep(KEEP_ALIVE) => Some(Bytes::from_static(b": still here\n\n")),
            () = self.stop.cancelled() => None,
        }
    }

    /// The events of what changed (marked seen).
    fn frame(&mut self, live: bool, approvals: bool) -> Bytes {
        let mut frame = Vec::new();
        if let (true, Some(board), Some(changes)) = (live, &self.board, &mut self.changes) {
            changes.mark_unchanged();
            event(&mut frame, "live", &board.snapshot());
        }
        if let (true, Some(waiting)) = (approvals, &mut self.waiting) {
            let list = waiting.borrow_and_update().clone();
            event(&mut frame, "approvals", &list);
        }
        Bytes::from(frame)
    }
}

/// A change of `receiver`; never, when there is none.
async fn changed<T>(receiver: &mut Option<watch::Receiver<T>>) -> Result<(), watch::error::RecvError> {
    match receiver {
        Some(receiver) => receiver.changed().await,
        None => std::future::pending().await,
    }
}

fn event(frame: &mut Vec<u8>, name: &str, data: &Value) {
    frame.extend_from_slice(format!("event: {name}\ndata: ").as_bytes());
    frame.extend_from_slice(&serde_json::to_vec(data).unwrap_or_default());
    frame.extend_from_slice(b"\n\n");
}

/// Whether a browser says the request comes from this page's own origin:
/// an `Origin` naming another host, or `Sec-Fetch-Site` other than
/// `same-origin`, is another site's. (A client that is not a browser sends
/// neither, and still needs the token.)
fn same_origin(headers: &hyper::HeaderMap) -> bool {
    let header = |name: &str| headers.get(name).map(|value| value.to_str().unwrap_or("\u{0}"));
    if let Some(site) = header("sec-fetch-site") {
        if site != "same-origin" {
            return false;
        }
    }
    match (header("origin"), header(HOST.as_str())) {
        (None, _) => true,
        (Some(origin), Some(host)) => origin == format!("http://{host}"),
        (Some(_), None) => false,
    }
}

/// The query's pairs, percent-decoded; `None` when too long or not UTF-8.
fn parse_query(query: &str) -> Option<HashMap<String, String>> {
    if query.len() > MAX_QUERY {
        return None;
    }
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .take(32)
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            Some((decode(key)?, decode(value)?))
        })
        .collect()
}

fn decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = std::str::from_utf8(bytes.get(index + 1..index + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                index += 2;
            }
            byte => out.push(byte),
        }
        index += 1;
    }
    String::from_utf8(out).ok()
}

/// A session or child id as runs mint them: no path can be made of it.
fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 200
        && !id.starts_with('.')
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

fn asset(content_type: &'static str, body: Bytes) -> Response<Body> {
    let mut response = Response::new(Full::new(body).boxed_unsync());
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn text(status: StatusCode, message: &'static str) -> Response<Body> {
    let mut response = asset("text/plain; charset=utf-8", Bytes::from_static(message.as_bytes()));
    *response.status_mut() = status;
    response
}

fn json_ok(value: &Value) -> Response<Body> {
    json_status(StatusCode::OK, value)
}

fn json_status(status: StatusCode, value: &Value) -> Response<Body> {
    let mut response = asset("application/json", Bytes::from(serde_json::to_vec(value).unwrap_or_default()));
    *response.status_mut() = status;
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_percent_decoded_and_a_bad_escape_refused() {
        let query = parse_query("token=ab%2Fc&q=a+b&empty").unwrap();
        assert_eq!((query["token"].as_str(), query["q"].as_str(), query["empty"].as_str()), ("ab/c", "a b", ""));
        assert!(parse_query("q=%zz").is_none());
        assert!(parse_query("q=%ff").is_none(), "not UTF-8");
    }

    #[test]
    fn ids_that_could_name_a_path_are_refused() {
        assert!(valid_id("532264b8-88c8-4de6-8932-25b5a213c785") && valid_id("mock:echo:3"));
        for id in ["", "../x", "..", "a/b", ".hidden", "a\\b", "a%2fb"] {
            assert!(!valid_id(id), "{id}");
        }
    }
}
