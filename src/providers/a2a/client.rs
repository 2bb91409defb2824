//! The bounded HTTP side of the provider: the agent card, one call, and a
//! call answered by a server-sent event stream, in either binding the
//! provider speaks (JSON-RPC, HTTP+JSON). Every
//! read is capped in bytes and every wait in time; what goes wrong is an
//! [`A2aError`], whose [`A2aError::safe_reason`] is the only wording that
//! reaches a diagnostic.

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE};
use serde_json::{json, Value};

use super::A2aError as SetupError;
use crate::wire::a2a::{self as wire, method, AgentCard};

/// Why talking to the agent failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum A2aError {
    /// The agent could not be reached, or its connection broke.
    #[error("transport: {0}")]
    Transport(String),
    /// It answered an HTTP status other than success.
    #[error("HTTP status {0}")]
    Status(u16),
    /// It said nothing for this long where something was due.
    #[error("no answer within {1:?} ({0})")]
    Timeout(&'static str, Duration),
    /// It sent more than the bound allows.
    #[error("{0} exceeds {1} bytes")]
    Oversized(&'static str, usize),
    /// It sent something that is not what A2A 1.0 says.
    #[error("malformed: {0}")]
    Malformed(String),
    /// It answered a JSON-RPC error.
    #[error("JSON-RPC error {code}: {message}")]
    Rpc { code: i64, message: String },
    /// It redirected the request to another origin (`scheme://host:port`),
    /// which the configured headers must not reach.
    #[error("redirected to another origin, {0}")]
    CrossOrigin(String),
}

impl A2aError {
    /// Fixed wording with the facts that are safe to show: never the
    /// agent's payload (a JSON-RPC error's code, not its message).
    pub(crate) fn safe_reason(&self) -> String {
        match self {
            A2aError::Transport(_) => "the A2A agent could not be reached or its connection broke".to_owned(),
            A2aError::Status(status) => format!("the A2A agent answered HTTP {status}"),
            A2aError::Timeout(what, after) => format!("the A2A agent sent no {what} within {} s", after.as_secs_f64()),
            A2aError::Oversized(what, bound) => format!("the A2A agent's {what} exceeds {bound} bytes"),
            A2aError::Malformed(_) => "the A2A agent answered something that is not A2A 1.0".to_owned(),
            A2aError::Rpc { code, .. } => format!("the A2A agent answered JSON-RPC error {code}"),
            A2aError::CrossOrigin(origin) => format!(
                "the A2A agent redirected to another origin, {origin}: refused, since the provider's headers \
                 would go there (give that URL in the configuration if it is to be trusted)"
            ),
        }
    }

    /// Whether a stream that ended this way may be re-attached to.
    pub(crate) fn is_broken_connection(&self) -> bool {
        matches!(self, A2aError::Transport(_))
    }
}

/// The bounds of every exchange with one agent.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    pub(crate) card_timeout: Duration,
    pub(crate) first_event_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) max_card_bytes: usize,
    pub(crate) max_event_bytes: usize,
}

/// Which of the card's bindings a run speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Binding {
    /// JSON-RPC 2.0 at one URL, events wrapped in JSON-RPC responses.
    JsonRpc,
    /// HTTP+JSON: a path per method, events bare `StreamResponse`s, errors
    /// as HTTP statuses with a `google.rpc.Status` body.
    HttpJson,
}

/// The interface a run talks to.
#[derive(Clone, Debug)]
pub(crate) struct Endpoint {
    pub(crate) url: String,
    pub(crate) binding: Binding,
}

impl Endpoint {
    /// The HTTP+JSON verb and URL of `method` on task `params.id`.
    fn route(&self, method: &str, params: &Value) -> Result<(reqwest::Method, reqwest::Url), A2aError> {
        let mut url = reqwest::Url::parse(&self.url)
            .map_err(|_| A2aError::Malformed("the card's interface URL is not a URL".to_owned()))?;
        let id = params["id"].as_str().unwrap_or_default();
        let (verb, segments): (reqwest::Method, Vec<String>) = match method {
            method::SEND_MESSAGE => (reqwest::Method::POST, vec!["message:send".to_owned()]),
            method::SEND_STREAMING_MESSAGE => (reqwest::Method::POST, vec!["message:stream".to_owned()]),
            method::GET_TASK => (reqwest::Method::GET, vec!["tasks".to_owned(), id.to_owned()]),
            method::CANCEL_TASK => (reqwest::Method::POST, vec!["tasks".to_owned(), format!("{id}:cancel")]),
            method::SUBSCRIBE_TO_TASK => (reqwest::Method::GET, vec!["tasks".to_owned(), format!("{id}:subscribe")]),
            other => return Err(A2aError::Malformed(format!("{other} has no HTTP+JSON route here"))),
        };
        {
            let mut path = url
                .path_segments_mut()
                .map_err(|_| A2aError::Malformed("the card's interface URL cannot take a path".to_owned()))?;
            path.pop_if_empty();
            for segment in &segments {
                path.push(segment);
            }
        }
        Ok((verb, url))
    }
}

/// One agent's HTTP client: its headers (auth among them, sensitive) and bounds.
pub(crate) struct Client {
    http: reqwest::Client,
    headers: HeaderMap,
    bounds: Bounds,
}

impl Client {
    pub(crate) fn new(
        headers: &[(String, String)],
        connect_timeout: Duration,
        bounds: Bounds,
    ) -> Result<Client, SetupError> {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| SetupError::HeaderName(name.clone()))?;
            let mut value = HeaderValue::from_str(value).map_err(|_| SetupError::HeaderValue(name.to_string()))?;
            value.set_sensitive(true);
            map.insert(name, value);
        }
        map.insert(HeaderName::from_static("a2a-version"), HeaderValue::from_static(wire::VERSION));
        crate::tls::install_crypto_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .redirect(same_origin_redirects())
            .build()
            .map_err(SetupError::Client)?;
        Ok(Client { http, headers: map, bounds })
    }

    /// `GET {base}/.well-known/agent-card.json`, bounded by the card's
    /// timeout and size.
    pub(crate) async fn card(&self, base: &str) -> Result<AgentCard, A2aError> {
        let url = format!("{}/{}", base.trim_end_matches('/'), wire::CARD_PATH);
        let bound = self.bounds.card_timeout;
        let exchange = async {
            let response = self.http.get(&url).headers(self.headers.clone()).send().await.map_err(transport)?;
            if !response.status().is_success() {
                return Err(A2aError::Status(response.status().as_u16()));
            }
            read_bounded(response, self.bounds.max_card_bytes, "agent card").await
        };
        let body =
            tokio::time::timeout(bound, exchange).await.map_err(|_| A2aError::Timeout("agent card", bound))??;
        serde_json::from_slice(&body).map_err(|e| A2aError::Malformed(format!("agent card: {e}")))
    }

    /// One call whose answer is one JSON body: its `result` (JSON-RPC), or
    /// the body itself (HTTP+JSON).
    pub(crate) async fn call(
        &self,
        endpoint: &Endpoint,
        method: &str,
        params: Value,
        wait: Duration,
    ) -> Result<Value, A2aError> {
        let exchange = async {
            let response = self.send(endpoint, method, params, "application/json").await?;
            let body = read_bounded(response, self.bounds.max_event_bytes, "answer").await?;
            let malformed = |e: serde_json::Error| A2aError::Malformed(format!("{method} answer: {e}"));
            match endpoint.binding {
                Binding::HttpJson => serde_json::from_slice(&body).map_err(malformed),
                Binding::JsonRpc => result_of(serde_json::from_slice(&body).map_err(malformed)?),
            }
        };
        tokio::time::timeout(wait, exchange).await.map_err(|_| A2aError::Timeout("answer", wait))?
    }

    /// A call answered by an event stream (or, as the JSON-RPC binding
    /// allows for an error, by one JSON body, read as that error).
    pub(crate) async fn stream(&self, endpoint: &Endpoint, method: &str, params: Value) -> Result<Events, A2aError> {
        let bound = self.bounds.first_event_timeout;
        let response = tokio::time::timeout(bound, self.send(endpoint, method, params, "text/event-stream"))
            .await
            .map_err(|_| A2aError::Timeout("first event", bound))??;
        let is_stream = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !is_stream {
            let body = tokio::time::timeout(bound, read_bounded(response, self.bounds.max_event_bytes, "event"))
                .await
                .map_err(|_| A2aError::Timeout("first event", bound))??;
            let response: Option<wire::Response> = serde_json::from_slice(&body).ok();
            return Err(match response.map(result_of) {
                Some(Err(error)) => error,
                _ => A2aError::Malformed(format!("{method} answered one JSON body, not an event stream")),
            });
        }
        let since = tokio::time::Instant::now();
        let wrapped = endpoint.binding == Binding::JsonRpc;
        Ok(Events { response, pending: Vec::new(), data: Vec::new(), first: true, since, wrapped, bounds: self.bounds })
    }

    async fn send(
        &self,
        endpoint: &Endpoint,
        method: &str,
        params: Value,
        accept: &'static str,
    ) -> Result<reqwest::Response, A2aError> {
        let request = match endpoint.binding {
            Binding::JsonRpc => {
                let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
                self.http.post(&endpoint.url).json(&body)
            }
            Binding::HttpJson => {
                let (verb, url) = endpoint.route(method, &params)?;
                let post = verb == reqwest::Method::POST;
                let request = self.http.request(verb, url);
                if post {
                    request.json(&params)
                } else {
                    request
                }
            }
        };
        let response = request
            .headers(self.headers.clone())
            .header(ACCEPT, HeaderValue::from_static(accept))
            .send()
            .await
            .map_err(transport)?;
        if !response.status().is_success() {
            let status = response.status().as_u16();
            return Err(match endpoint.binding {
                Binding::HttpJson => http_json_error(status, response).await,
                Binding::JsonRpc => A2aError::Status(status),
            });
        }
        Ok(response)
    }
}

/// An HTTP+JSON error: the A2A error its `ErrorInfo` names, where this
/// crate acts on it, else the status. At most 64 KiB of it are read.
async fn http_json_error(status: u16, response: reqwest::Response) -> A2aError {
    let body = read_bounded(response, 64 * 1024, "error").await.unwrap_or_default();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let details = body["error"]["details"].as_array().cloned().unwrap_or_default();
    let reason = details.iter().find_map(|detail| detail["reason"].as_str().map(str::to_owned));
    let (code, message) = match reason.as_deref() {
        Some("UNSUPPORTED_OPERATION") => (wire::code::UNSUPPORTED_OPERATION, "unsupported operation"),
        Some("TASK_NOT_FOUND") => (wire::code::TASK_NOT_FOUND, "task not found"),
        _ => return A2aError::Status(status),
    };
    A2aError::Rpc { code, message: message.to_owned() }
}

/// Most redirects followed for one request.
const MAX_REDIRECTS: usize = 10;

/// A redirect to another origin, refused by [`same_origin_redirects`].
#[derive(Debug, thiserror::Error)]
#[error("a redirect to another origin, {0}")]
struct CrossOrigin(String);

/// Redirects followed only within the origin the request was sent to.
/// Every request carries the configured headers, credentials among them,
/// and reqwest strips only `Authorization` and cookies when a redirect
/// leaves the host: an `x-api-key` would go along. So a redirect to
/// another scheme, host or port fails the call instead, naming that origin.
fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let origin = attempt.url().origin();
        let sent_to = attempt.previous().first().map(reqwest::Url::origin);
        if sent_to.is_some_and(|sent_to| sent_to != origin) {
            return attempt.error(CrossOrigin(origin.ascii_serialization()));
        }
        match attempt.previous().len() > MAX_REDIRECTS {
            true => attempt.error(format!("more than {MAX_REDIRECTS} redirects")),
            false => attempt.follow(),
        }
    })
}

fn transport(error: reqwest::Error) -> A2aError {
    let refused = std::error::Error::source(&error).and_then(|source| source.downcast_ref::<CrossOrigin>());
    match refused {
        Some(CrossOrigin(origin)) => A2aError::CrossOrigin(origin.clone()),
        None => A2aError::Transport(error.to_string()),
    }
}

fn result_of(response: wire::Response) -> Result<Value, A2aError> {
    match (response.result, response.error) {
        (_, Some(error)) => Err(A2aError::Rpc { code: error.code, message: error.message }),
        (Some(result), None) => Ok(result),
        (None, None) => Err(A2aError::Malformed("a JSON-RPC response with neither result nor error".to_owned())),
    }
}

/// Up to `bound` bytes of the body; past it, [`A2aError::Oversized`] (and
/// the connection is dropped unread).
async fn read_bounded(mut response: reqwest::Response, bound: usize, what: &'static str) -> Result<Vec<u8>, A2aError> {
    if response.content_length().is_some_and(|length| length > bound as u64) {
        return Err(A2aError::Oversized(what, bound));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(transport)? {
        if body.len() + chunk.len() > bound {
            return Err(A2aError::Oversized(what, bound));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A server-sent event stream, one `StreamResponse` at a time (each the
/// `result` of a JSON-RPC response, or bare in HTTP+JSON). An event is its `data:` lines joined, up to
/// a blank line; each is bounded in bytes, and the time from one event (or
/// from the response) to the next by the idle (or first-event) timeout.
pub(crate) struct Events {
    response: reqwest::Response,
    pending: Vec<u8>,
    data: Vec<u8>,
    first: bool,
    /// When the last event (or the response) arrived.
    since: tokio::time::Instant,
    /// Each event a JSON-RPC response (else a bare `StreamResponse`).
    wrapped: bool,
    bounds: Bounds,
}

impl Events {
    /// The next event's `result`; `None` once the stream ends.
    pub(crate) async fn next(&mut self) -> Result<Option<Value>, A2aError> {
        loop {
            while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                let line = line.strip_suffix(b"\n").unwrap_or(&line);
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                if line.is_empty() {
                    if self.data.is_empty() {
                        continue;
                    }
                    let data = std::mem::take(&mut self.data);
                    self.first = false;
                    self.since = tokio::time::Instant::now();
                    let malformed = |e: serde_json::Error| A2aError::Malformed(format!("stream event: {e}"));
                    if !self.wrapped {
                        return serde_json::from_slice(&data).map(Some).map_err(malformed);
                    }
                    let response: wire::Response = serde_json::from_slice(&data).map_err(malformed)?;
                    return result_of(response).map(Some);
                }
                if let Some(value) = line.strip_prefix(b"data:") {
                    let value = value.strip_prefix(b" ").unwrap_or(value);
                    if !self.data.is_empty() {
                        self.data.push(b'\n');
                    }
                    self.data.extend_from_slice(value);
                }
                // `event:`, `id:`, `retry:` and comments name nothing the payload does not.
            }
            if self.pending.len() + self.data.len() > self.bounds.max_event_bytes {
                return Err(A2aError::Oversized("stream event", self.bounds.max_event_bytes));
            }
            let (what, wait) = match self.first {
                true => ("first event", self.bounds.first_event_timeout),
                false => ("event", self.bounds.idle_timeout),
            };
            // Counted from the last event, so comments and blank lines
            // (keep-alives) do not hold a silent task open for ever.
            let deadline = self.since + wait;
            match tokio::time::timeout_at(deadline, self.response.chunk()).await {
                Err(_) => return Err(A2aError::Timeout(what, wait)),
                Ok(Err(error)) => return Err(transport(error)),
                Ok(Ok(None)) => return Ok(None),
                Ok(Ok(Some(chunk))) => self.pending.extend_from_slice(&chunk),
            }
        }
    }
}
