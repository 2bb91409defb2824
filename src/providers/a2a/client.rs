//! The bounded HTTP side of the provider: the agent card, one JSON-RPC
//! call, and a JSON-RPC call answered by a server-sent event stream. Every
//! read is capped in bytes and every wait in time; what goes wrong is an
//! [`A2aError`], whose [`A2aError::safe_reason`] is the only wording that
//! reaches a diagnostic.

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE};
use serde_json::{json, Value};

use super::wire::{self, AgentCard};

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
    ) -> Result<Client, String> {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            let name =
                HeaderName::from_bytes(name.as_bytes()).map_err(|_| format!("header name {name:?} is invalid"))?;
            let mut value = HeaderValue::from_str(value)
                .map_err(|_| format!("the value of header {name} is not a header value"))?;
            value.set_sensitive(true);
            map.insert(name, value);
        }
        map.insert(HeaderName::from_static("a2a-version"), HeaderValue::from_static(wire::VERSION));
        install_crypto_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
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

    /// One JSON-RPC call whose answer is one JSON body: its `result`.
    pub(crate) async fn call(
        &self,
        endpoint: &str,
        method: &str,
        params: Value,
        wait: Duration,
    ) -> Result<Value, A2aError> {
        let exchange = async {
            let response = self.post(endpoint, method, params, "application/json").await?;
            let body = read_bounded(response, self.bounds.max_event_bytes, "answer").await?;
            let response: wire::Response =
                serde_json::from_slice(&body).map_err(|e| A2aError::Malformed(format!("{method} answer: {e}")))?;
            result_of(response)
        };
        tokio::time::timeout(wait, exchange).await.map_err(|_| A2aError::Timeout("answer", wait))?
    }

    /// A JSON-RPC call answered by an event stream (or, as the binding
    /// allows for an error, by one JSON body, read as a one-event stream).
    pub(crate) async fn stream(&self, endpoint: &str, method: &str, params: Value) -> Result<Events, A2aError> {
        let bound = self.bounds.first_event_timeout;
        let response = tokio::time::timeout(bound, self.post(endpoint, method, params, "text/event-stream"))
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
            let response: wire::Response =
                serde_json::from_slice(&body).map_err(|e| A2aError::Malformed(format!("{method} answer: {e}")))?;
            return Err(match result_of(response) {
                Err(error) => error,
                Ok(_) => A2aError::Malformed(format!("{method} answered one JSON body, not an event stream")),
            });
        }
        let since = tokio::time::Instant::now();
        Ok(Events { response, pending: Vec::new(), data: Vec::new(), first: true, since, bounds: self.bounds })
    }

    async fn post(
        &self,
        endpoint: &str,
        method: &str,
        params: Value,
        accept: &'static str,
    ) -> Result<reqwest::Response, A2aError> {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let response = self
            .http
            .post(endpoint)
            .headers(self.headers.clone())
            .header(ACCEPT, HeaderValue::from_static(accept))
            .json(&body)
            .send()
            .await
            .map_err(transport)?;
        if !response.status().is_success() {
            return Err(A2aError::Status(response.status().as_u16()));
        }
        Ok(response)
    }
}

fn transport(error: reqwest::Error) -> A2aError {
    A2aError::Transport(error.to_string())
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

/// A server-sent event stream of JSON-RPC responses, one `result` (a
/// `StreamResponse`) at a time. An event is its `data:` lines joined, up to
/// a blank line; each is bounded in bytes, and the time from one event (or
/// from the response) to the next by the idle (or first-event) timeout.
pub(crate) struct Events {
    response: reqwest::Response,
    pending: Vec<u8>,
    data: Vec<u8>,
    first: bool,
    /// When the last event (or the response) arrived.
    since: tokio::time::Instant,
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
                    let response: wire::Response =
                        serde_json::from_slice(&data).map_err(|e| A2aError::Malformed(format!("stream event: {e}")))?;
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

fn install_crypto_provider() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    // An embedding application may have installed its own provider already.
    INSTALL.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
