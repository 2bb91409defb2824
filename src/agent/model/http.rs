//! What every HTTP model adapter shares (OpenAI chat completions, OpenAI
//! Responses, Anthropic Messages): one bounded way to send a request, retry
//! it, and read its answer, so that each adapter is only its wire mapping.
//!
//! - [`Endpoint::send`] is the one place every try of every HTTP adapter
//!   goes through: each try first passes the model's [`Limiter`] (its
//!   route's, shared by every model of the route) and is recorded on the
//!   request's [`CallMeter`]; transient statuses (the adapter says which),
//!   refused connections and timeouts are retried with exponential backoff
//!   and jitter, a `Retry-After` (or `retry-after-ms`) honoured, every wait
//!   capped at [`MAX_BACKOFF`]. A 429 or 529 that says when to come back
//!   (those headers, or a provider's rate-limit reset headers: one parser,
//!   [`retry_delay`]) cools the whole route down until then, so every call
//!   on it waits, not this one alone. Any other status fails at once with
//!   one line of the endpoint's message, read from at most
//!   `max_error_body_bytes`. [`Endpoint::call`] wraps a whole call: the
//!   tries, the answer read, and the limiter settled with the tokens the
//!   answer reports.
//! - [`Endpoint::read_whole`] and [`Events`] read an answer: a whole body or
//!   a server-sent event stream, each bounded in bytes as a whole and in the
//!   time between two chunks. [`Endpoint::complete`] is an adapter's whole
//!   call: its body sent, its answer read whole or streamed into the
//!   adapter's [`Answer`] (its wire's reading of the payloads), text passed
//!   to the listener as it comes.
//! - `config` declares each adapter's configuration and gives each model
//!   its handle and `Model` impl (`http_config!`, `http_model!`); `wire`
//!   holds what the wires spell alike.
//! - [`bounded_call`] holds one model call to its deadline and drops it the
//!   moment the caller cancels; dropping the request closes its connection.
//! - [`CallLimits`] bounds an answer's tool calls and their arguments, the
//!   same way whatever wire they arrive on.

mod config;
mod text;
mod wire;

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use serde::Serialize;
use serde_json::{Map, Value};
use tokio_util::sync::CancellationToken;

pub(super) use config::{http_config, http_model, Defaults};
pub(super) use text::{describe, excerpt, one_line};
pub(super) use wire::{
    arguments_text, functions, kind_of, not_read, read_event, user_content, Content, Function, WireText, WireTools,
};

use super::limit::{retry_delay, Limiter, Permit, RouteLimits};
use super::{CallMeter, ChunkSink, ModelError, ModelReply, ModelRequest, Oversize};

/// Longest streamed line accepted; a longer one is a malformed stream.
const MAX_LINE: usize = 4 * 1024 * 1024;
/// The longest wait between two tries.
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(30);
const MIB: u64 = 1 << 20;

/// The bounds one adapter holds its endpoint to (see `OpenAiConfig` for
/// what each means and its default).
#[derive(Clone, Copy, Debug)]
pub(super) struct Bounds {
    pub(super) timeout: Duration,
    pub(super) max_retries: u32,
    pub(super) retry_backoff: Duration,
    pub(super) max_answer_bytes: usize,
    pub(super) max_error_body_bytes: usize,
    pub(super) calls: CallLimits,
    pub(super) call_deadline: Duration,
    /// The limits of the endpoint's own limiter (until a route's replaces it).
    pub(super) limits: RouteLimits,
}

impl Bounds {
    /// Refuses the bounds that would fail every call at zero (no tool
    /// calls, or no error text, are choices one may make).
    fn check(&self) -> Result<(), ModelError> {
        let zero = if self.max_answer_bytes == 0 {
            "max_answer_bytes"
        } else if self.call_deadline.is_zero() {
            "call_deadline"
        } else {
            return Ok(());
        };
        Err(ModelError::Config(format!("{zero} is 0: every model call would fail")))
    }
}

/// The bounds the `SUBAGENTS_MODEL_*` variables set, each where set; every
/// HTTP adapter's `from_env` reads the same ones.
#[derive(Default)]
pub(super) struct EnvBounds {
    pub(super) max_answer_bytes: Option<usize>,
    pub(super) max_error_body_bytes: Option<usize>,
    pub(super) max_tool_calls: Option<usize>,
    pub(super) max_tool_argument_bytes: Option<usize>,
    pub(super) call_deadline: Option<Duration>,
    /// `SUBAGENTS_MODEL_RPM`, `_TPM` and `_MAX_CONCURRENT`.
    pub(super) limits: RouteLimits,
    /// `SUBAGENTS_MODEL_MAX_TOKENS`: the OpenAI adapters' answer limit.
    pub(super) max_tokens: Option<u32>,
}

impl EnvBounds {
    /// Reads them; a value that is not a whole number is refused by name.
    pub(super) fn read() -> Result<Self, ModelError> {
        let number = |name: &str, unit: u64| -> Result<Option<u64>, ModelError> {
            let Some(value) = env_var(name) else { return Ok(None) };
            let number = value.trim().parse::<u64>().ok().and_then(|n| n.checked_mul(unit));
            number.map(Some).ok_or_else(|| ModelError::Config(format!("{name} must be a whole number, not {value:?}")))
        };
        let bytes = |n: Option<u64>| n.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        let small = |n: Option<u64>| n.map(|n| u32::try_from(n).unwrap_or(u32::MAX));
        Ok(EnvBounds {
            max_answer_bytes: bytes(number("SUBAGENTS_MODEL_MAX_ANSWER_MIB", MIB)?),
            max_error_body_bytes: bytes(number("SUBAGENTS_MODEL_MAX_ERROR_BODY_MIB", MIB)?),
            max_tool_calls: bytes(number("SUBAGENTS_MODEL_MAX_TOOL_CALLS", 1)?),
            max_tool_argument_bytes: bytes(number("SUBAGENTS_MODEL_MAX_TOOL_ARGUMENTS_MIB", MIB)?),
            call_deadline: number("SUBAGENTS_MODEL_DEADLINE_SECS", 1)?.map(Duration::from_secs),
            limits: RouteLimits {
                requests_per_minute: small(number("SUBAGENTS_MODEL_RPM", 1)?),
                tokens_per_minute: number("SUBAGENTS_MODEL_TPM", 1)?,
                max_concurrent: small(number("SUBAGENTS_MODEL_MAX_CONCURRENT", 1)?),
            },
            max_tokens: small(number("SUBAGENTS_MODEL_MAX_TOKENS", 1)?),
        })
    }
}

/// An environment variable that is set to something besides blanks.
pub(super) fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The bounds on one answer's tool calls, checked the same way whether the
/// answer came whole or streamed, whatever its wire.
#[derive(Clone, Copy, Debug)]
pub(super) struct CallLimits {
    pub(super) calls: usize,
    pub(super) argument_bytes: usize,
}

impl CallLimits {
    /// Refuses an answer that would hold `calls` tool calls.
    pub(super) fn check_calls(self, calls: usize) -> Result<(), ModelError> {
        if calls > self.calls {
            return Err(ModelError::Oversized(Oversize::ToolCalls(self.calls)));
        }
        Ok(())
    }

    /// Refuses arguments that would be `bytes` long.
    pub(super) fn check_arguments(self, bytes: usize) -> Result<(), ModelError> {
        if bytes > self.argument_bytes {
            return Err(ModelError::Oversized(Oversize::ToolArgumentBytes(self.argument_bytes)));
        }
        Ok(())
    }
}

/// Arguments arrive as a JSON string; invalid JSON is kept as a string so
/// the tool layer can tell the model.
pub(super) fn parse_arguments(raw: &str) -> Value {
    if raw.trim().is_empty() {
        return Value::Object(Map::new());
    }
    serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_owned()))
}

/// One count of an answer's usage (`#[serde(default, deserialize_with =
/// "token_count")]` on an `Option<u64>`): what is not a whole number from
/// 0 (negative, fractional, a string) reads as absent, so a nonsense count
/// costs the count, never the answer it came with.
pub(super) fn token_count<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    Ok(<Value as serde::Deserialize>::deserialize(deserializer)?.as_u64())
}

/// Statuses worth another try on any endpoint: it may answer differently
/// soon.
pub(super) fn transient(status: u16) -> bool {
    matches!(status, 408 | 425 | 429 | 500 | 502 | 503 | 504)
}

/// Statuses that say the route is over its limit (529: overloaded).
fn rate_limited(status: u16) -> bool {
    matches!(status, 429 | 529)
}

/// One adapter's answer, as its wire spells it: read whole, or fed a
/// stream's payloads one at a time until it has ended.
pub(super) trait Answer: Sized {
    /// An answer about to be streamed, its tool calls held to `limits`.
    fn new(limits: CallLimits) -> Self;
    /// A whole (non-streamed) body's answer.
    fn whole(body: &[u8], limits: CallLimits) -> Result<ModelReply, ModelError>;
    /// Takes one streamed payload; its text goes to `sink` as it comes.
    fn event(&mut self, data: &[u8], sink: Option<&ChunkSink>) -> Result<(), ModelError>;
    /// Whether the stream said its last word: nothing more is read.
    fn ended(&self) -> bool;
    /// Whether the answer got as far as its ending, once the stream closed.
    fn finished(&self) -> bool {
        self.ended()
    }
    /// The reply the answer makes.
    fn into_reply(self) -> Result<ModelReply, ModelError>;
}

/// What the limiter needs of one call besides its body: the answer's
/// token limit (with the body's size, the tokens charged ahead), where its
/// tries are recorded, and when to stop waiting.
pub(super) struct Call<'a> {
    pub(super) max_tokens: u64,
    pub(super) meter: &'a CallMeter,
    pub(super) cancel: &'a CancellationToken,
}

/// Threads with an HTTP client of their own in each endpoint; the
/// threads past them share one.
const CLIENT_SLOTS: usize = 8;

/// An endpoint's HTTP clients: one for each thread that calls it (the
/// first [`CLIENT_SLOTS`] threads of the process to make any model call),
/// and one the later threads share. A pooled connection lives on the
/// runtime that opened it, so with a client per thread a run's request and
/// its answer stay on the run's worker instead of crossing to another's.
struct Clients {
    connect_timeout: Duration,
    /// Built on a thread's first call.
    slots: [std::sync::OnceLock<reqwest::Client>; CLIENT_SLOTS],
    shared: reqwest::Client,
}

impl Clients {
    fn new(connect_timeout: Duration) -> Result<Self, ModelError> {
        let shared = Self::build(connect_timeout)?;
        let clients = Clients { connect_timeout, slots: Default::default(), shared };
        // The building thread takes the shared one (a build reads the
        // system's root certificates: milliseconds).
        if let Some(cell) = clients.slots.get(Self::slot()) {
            let _ = cell.set(clients.shared.clone());
        }
        Ok(clients)
    }

    fn build(connect_timeout: Duration) -> Result<reqwest::Client, ModelError> {
        reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .build()
            .map_err(|e| ModelError::Config(format!("cannot build the HTTP client: {e}")))
    }

    /// The calling thread's slot: threads are numbered as they first ask.
    fn slot() -> usize {
        thread_local! {
            static SLOT: usize = {
                static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
                NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            };
        }
        SLOT.with(|slot| *slot)
    }

    /// The calling thread's client.
    fn here(&self) -> &reqwest::Client {
        let Some(cell) = self.slots.get(Self::slot()) else { return &self.shared };
        // The shared client's settings built once already: a later build
        // fails only if the machine does, and then the shared one serves.
        cell.get_or_init(|| Self::build(self.connect_timeout).unwrap_or_else(|_| self.shared.clone()))
    }
}

/// One endpoint URL, the headers every request carries (its key among
/// them, marked sensitive), the bounds, and the limiter every try passes.
pub(super) struct Endpoint {
    clients: Clients,
    base_url: String,
    /// Parsed once: a URL string would be parsed again for every request.
    url: reqwest::Url,
    headers: HeaderMap,
    bounds: Bounds,
    transient: fn(u16) -> bool,
    limiter: Limiter,
    /// The request's tools as the adapter's wire spells them, written out
    /// once per tool list.
    tools: WireTools,
}

impl Endpoint {
    /// `path` under `base_url`, which must be http or https; `transient`
    /// says which error statuses are retried.
    pub(super) fn new(
        base_url: &str,
        path: &str,
        headers: HeaderMap,
        bounds: Bounds,
        transient: fn(u16) -> bool,
    ) -> Result<Self, ModelError> {
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Err(ModelError::Config(format!("base URL {base_url:?} must start with http:// or https://")));
        }
        bounds.check()?;
        crate::tls::install_crypto_provider();
        let clients = Clients::new(bounds.timeout.min(Duration::from_secs(30)))?;
        let url = format!("{}/{path}", base_url.trim_end_matches('/'));
        let url = reqwest::Url::parse(&url).map_err(|e| ModelError::Config(format!("base URL {base_url:?}: {e}")))?;
        let limiter = Limiter::new(bounds.limits);
        let tools = WireTools::default();
        Ok(Endpoint { clients, base_url: base_url.to_owned(), url, headers, bounds, transient, limiter, tools })
    }

    /// Every try passes `limiter` instead of the endpoint's own.
    pub(super) fn with_limiter(mut self, limiter: Limiter) -> Self {
        self.limiter = limiter;
        self
    }

    pub(super) fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// Where the adapter's bodies take their tools from.
    pub(super) fn tools(&self) -> &WireTools {
        &self.tools
    }

    /// Whether the endpoint's host accepts a connection (within the
    /// timeout, at most 5 s): a cheap check before a batch of runs.
    pub(super) async fn check_reachable(&self) -> Result<(), ModelError> {
        let url = reqwest::Url::parse(&self.base_url).map_err(|e| ModelError::Config(e.to_string()))?;
        let host = url.host_str().ok_or_else(|| ModelError::Config("the base URL has no host".to_owned()))?;
        let port = url.port_or_known_default().unwrap_or(443);
        let bound = self.bounds.timeout.min(Duration::from_secs(5));
        match tokio::time::timeout(bound, tokio::net::TcpStream::connect((host, port))).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(ModelError::Transport(format!("{host}:{port}: {error}"))),
            Err(_) => Err(ModelError::Timeout(bound)),
        }
    }

    /// One whole call: `body` sent as [`Endpoint::send`] does, the answer
    /// read by `read`, and the try that was answered settled with the
    /// tokens the answer reports (an answer without usage keeps the
    /// estimate charged).
    pub(super) async fn call<Read, Reading>(
        &self,
        body: &impl Serialize,
        call: Call<'_>,
        read: Read,
    ) -> Result<ModelReply, ModelError>
    where
        Read: FnOnce(reqwest::Response) -> Reading,
        Reading: Future<Output = Result<ModelReply, ModelError>>,
    {
        let (response, permit) = self.send(body, call).await?;
        let reply = read(response).await;
        if let Ok(ModelReply { usage: Some(usage), .. }) = &reply {
            permit.settle(usage.total());
        }
        reply
    }

    /// One adapter's call: `body` sent as [`Endpoint::call`] does, charged
    /// `max_tokens` ahead, and its answer read as `A`: streamed when
    /// `stream` is asked and the endpoint streams, else whole (its text
    /// then reaches the request's listener at once).
    pub(super) async fn complete<A: Answer>(
        &self,
        body: &impl Serialize,
        max_tokens: u64,
        stream: bool,
        request: &ModelRequest,
        cancel: &CancellationToken,
    ) -> Result<ModelReply, ModelError> {
        let call = Call { max_tokens, meter: &request.meter, cancel };
        let sink = request.chunks.as_ref();
        self.call(body, call, |response| async move {
            if stream && is_event_stream(&response) {
                return self.read_stream::<A>(response, sink).await;
            }
            let reply = A::whole(&self.read_whole(response).await?, self.bounds.calls)?;
            if let (Some(sink), false) = (sink, reply.text.is_empty()) {
                sink(&reply.text);
            }
            Ok(reply)
        })
        .await
    }

    /// A streamed answer, read until it ends; a stream that closes before
    /// the answer finished broke off.
    async fn read_stream<A: Answer>(
        &self,
        response: reqwest::Response,
        sink: Option<&ChunkSink>,
    ) -> Result<ModelReply, ModelError> {
        let mut events = self.events(response);
        let mut answer = A::new(self.bounds.calls);
        while !answer.ended() {
            match events.next_data().await? {
                Some(data) => answer.event(&data, sink)?,
                None => break,
            }
        }
        if !answer.finished() {
            return Err(ModelError::BrokeOff("the stream ended before the answer finished".to_owned()));
        }
        answer.into_reply()
    }

    /// Posts `body`, retrying what is worth retrying, and returns the first
    /// successful response (its headers read, its body not yet) with the
    /// limiter's permit for it, held until its answer is read. Each try is
    /// admitted by the limiter first, charged the body's bytes / 4 plus
    /// the answer's token limit.
    pub(super) async fn send(
        &self,
        body: &impl Serialize,
        call: Call<'_>,
    ) -> Result<(reqwest::Response, Permit), ModelError> {
        let bounds = &self.bounds;
        let body = serde_json::to_vec(body)
            .map(bytes::Bytes::from)
            .map_err(|e| ModelError::Config(format!("cannot encode the request: {e}")))?;
        // About four bytes a token, and the longest answer the call allows.
        let estimate = (body.len() as u64 / 4).saturating_add(call.max_tokens);
        let mut attempt = 0;
        loop {
            let permit = self.limiter.admit(estimate, call.cancel).await.map_err(|_| ModelError::Cancelled)?;
            call.meter.attempt(permit.waited());
            let request = self
                .clients
                .here()
                .post(self.url.clone())
                .headers(self.headers.clone())
                .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
                .body(body.clone());
            let retry_after = match tokio::time::timeout(bounds.timeout, request.send()).await {
                Err(_) if attempt < bounds.max_retries => {
                    drop(permit); // no slot held through the backoff
                    None
                }
                Err(_) => return Err(ModelError::Timeout(bounds.timeout)),
                Ok(Ok(response)) if response.status().is_success() => {
                    self.limiter.answered(&permit);
                    return Ok((response, permit));
                }
                Ok(Ok(response)) => {
                    let status = response.status().as_u16();
                    let told = self.after_refusal(status, response.headers());
                    if rate_limited(status) {
                        self.limiter.refused(&permit, told.is_some());
                        // Refused unworked: it used no tokens.
                        permit.settle(0);
                    } else {
                        drop(permit);
                    }
                    if !(self.transient)(status) || attempt >= bounds.max_retries {
                        let message = self.error_excerpt(response).await;
                        return Err(ModelError::Status { status, message });
                    }
                    told
                }
                Ok(Err(error)) if attempt < bounds.max_retries && (error.is_connect() || error.is_timeout()) => {
                    drop(permit);
                    None
                }
                Ok(Err(error)) => return Err(ModelError::Transport(describe(&error))),
            };
            let delay = match retry_after {
                // The endpoint said when; a little more spreads the callers
                // it said it to at once.
                Some(after) => after + jitter(after / 10),
                None => {
                    let backoff = bounds.retry_backoff.saturating_mul(1 << attempt.min(16));
                    backoff / 2 + jitter(backoff / 2)
                }
            };
            let delay = delay.min(MAX_BACKOFF);
            tracing::debug!(attempt, ?delay, "retrying the model call");
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }

    /// How long this call waits after a refusal before trying again, when
    /// the endpoint said. A 429 or 529 that says when to come back pauses
    /// the whole route instead (the next admission waits for it), so the
    /// call itself waits no longer.
    fn after_refusal(&self, status: u16, headers: &HeaderMap) -> Option<Duration> {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let told = retry_delay(header, SystemTime::now())?;
        if rate_limited(status) {
            self.limiter.cool_down_until(tokio::time::Instant::now() + told);
            return Some(Duration::ZERO);
        }
        Some(told)
    }

    /// The endpoint's message from an error status's body, of which at
    /// most `max_error_body_bytes` are read: one line is all that is kept.
    async fn error_excerpt(&self, response: reqwest::Response) -> String {
        let read = read_at_most(response, self.bounds.max_error_body_bytes);
        let body = match tokio::time::timeout(self.bounds.timeout, read).await {
            Ok(Ok((bytes, _))) => bytes,
            _ => return "(no readable body)".to_owned(),
        };
        // Every one of these APIs puts it at `error.message`.
        let message = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
        one_line(&message)
    }

    /// A whole (non-streamed) body, refused past `max_answer_bytes` as soon
    /// as that is known (its declared length, or the bytes so far).
    pub(super) async fn read_whole(&self, response: reqwest::Response) -> Result<Vec<u8>, ModelError> {
        let bound = self.bounds.max_answer_bytes;
        let too_large = ModelError::Oversized(Oversize::AnswerBytes(bound));
        if response.content_length().is_some_and(|length| length > bound as u64) {
            return Err(too_large);
        }
        match tokio::time::timeout(self.bounds.timeout, read_at_most(response, bound)).await {
            Err(_) => Err(ModelError::Timeout(self.bounds.timeout)),
            Ok(Err(error)) => Err(ModelError::BrokeOff(describe(&error))),
            Ok(Ok((_, false))) => Err(too_large),
            Ok(Ok((bytes, true))) => Ok(bytes),
        }
    }

    /// The response's server-sent events, bounded as [`Events`] says.
    pub(super) fn events(&self, response: reqwest::Response) -> Events {
        Events {
            response,
            pending: Vec::new(),
            start: 0,
            received: 0,
            timeout: self.bounds.timeout,
            max_bytes: self.bounds.max_answer_bytes,
        }
    }
}

/// Whether a response is a server-sent event stream.
pub(super) fn is_event_stream(response: &reqwest::Response) -> bool {
    response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// A server-sent event stream, read one `data:` payload at a time.
///
/// Each `data:` line is taken as one whole payload, as every one of these
/// APIs sends them (one JSON object a line); `event:` and `id:` fields,
/// comments and blank lines are skipped: the payloads name their own type.
/// Every byte counts towards `max_answer_bytes`, comments and blank lines
/// too, so a stream is bounded as a whole, not only by what it adds to the
/// answer; each wait for a chunk is bounded by the timeout.
pub(super) struct Events {
    response: reqwest::Response,
    pending: Vec<u8>,
    start: usize,
    received: usize,
    timeout: Duration,
    max_bytes: usize,
}

impl Events {
    /// The next payload, trimmed; `None` once the stream ends.
    pub(super) async fn next_data(&mut self) -> Result<Option<Vec<u8>>, ModelError> {
        loop {
            while let Some(offset) = self.pending[self.start..].iter().position(|&b| b == b'\n') {
                let line = &self.pending[self.start..self.start + offset];
                self.start += offset + 1;
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                if let Some(data) = line.strip_prefix(b"data:") {
                    return Ok(Some(data.trim_ascii().to_vec()));
                }
            }
            self.pending.drain(..self.start);
            self.start = 0;
            if self.pending.len() > MAX_LINE {
                return Err(ModelError::Malformed(format!("a streamed line exceeds {MAX_LINE} bytes")));
            }
            let chunk = match tokio::time::timeout(self.timeout, self.response.chunk()).await {
                Err(_) => return Err(ModelError::Timeout(self.timeout)),
                Ok(Ok(None)) => return Ok(None),
                Ok(Err(error)) => return Err(ModelError::BrokeOff(describe(&error))),
                Ok(Ok(Some(chunk))) => chunk,
            };
            self.received = self.received.saturating_add(chunk.len());
            if self.received > self.max_bytes {
                return Err(ModelError::Oversized(Oversize::AnswerBytes(self.max_bytes)));
            }
            self.pending.extend_from_slice(&chunk);
        }
    }
}

/// `call` held to `deadline` and dropped the moment `cancel` trips (which
/// closes its connection).
pub(super) async fn bounded_call<T>(
    cancel: CancellationToken,
    deadline: Duration,
    call: impl Future<Output = Result<T, ModelError>>,
) -> Result<T, ModelError> {
    tokio::select! {
        biased;
        _ = cancel.cancelled() => Err(ModelError::Cancelled),
        reply = tokio::time::timeout(deadline, call) => reply.unwrap_or(Err(ModelError::Deadline(deadline))),
    }
}

/// Up to `bound` bytes of `response`'s body, and whether that was all of
/// it. Past the bound nothing more is read: dropping the response closes
/// the connection.
async fn read_at_most(mut response: reqwest::Response, bound: usize) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = bound - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return Ok((body, false));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, true))
}

/// A random part of `up_to`, so that callers that failed together do not
/// all come back together.
fn jitter(up_to: Duration) -> Duration {
    // Each `RandomState` is freshly keyed: a random number without a crate.
    let random = std::collections::hash_map::RandomState::new().build_hasher().finish();
    up_to.mul_f64((random >> 11) as f64 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_its_bound_and_varies() {
        let bound = Duration::from_millis(100);
        let draws: Vec<Duration> = (0..64).map(|_| jitter(bound)).collect();
        assert!(draws.iter().all(|d| *d <= bound), "{draws:?}");
        assert!(draws.iter().any(|d| *d != draws[0]), "64 equal draws: {draws:?}");
        assert_eq!(jitter(Duration::ZERO), Duration::ZERO);
    }
}
