//! Any OpenAI-compatible chat-completions endpoint (OpenAI, DeepSeek, vLLM,
//! Ollama, …), with tool calls and streaming.
//!
//! Configure it in code ([`OpenAiConfig::new`]) or from the environment
//! ([`OpenAiConfig::from_env`]: `SUBAGENTS_BASE_URL`, `SUBAGENTS_MODEL`,
//! `SUBAGENTS_API_KEY`, and the bounds below). A route's `model`,
//! `max_tokens` and `reasoning_effort` override the configured ones per
//! request.
//!
//! How it fails: transient answers (408, 425, 429, 500, 502, 503, 504,
//! 529), refused connections and timeouts are retried with exponential
//! backoff and jitter (honouring `Retry-After`, capped at 30 s) up to
//! `max_retries` times;
//! other statuses (400, 404, 501, 505, …) fail at once with the status and
//! the endpoint's error message, reduced to one line of at most 200
//! characters (an HTML error page becomes its text; only its first
//! `max_error_body_bytes` are read). A body that is not a chat completion
//! is [`ModelError::Malformed`]. `timeout` bounds the wait for the response
//! headers, for a whole non-streamed body, and between two streamed
//! chunks; `call_deadline` bounds the whole call, every retry included, so
//! neither a trickle nor SSE keep-alive comments can stretch it
//! ([`ModelError::Deadline`]). An answer larger than `max_answer_bytes`
//! (its body, or its stream's bytes together), with more than
//! `max_tool_calls` tool calls or with a call's arguments past
//! `max_tool_argument_bytes` fails the call ([`ModelError::Oversized`]) as
//! soon as the bound is passed, so memory stays near the bounds whatever
//! the endpoint sends; such an answer is never retried (it would likely
//! come back the same). [`OpenAiConfig`] lists the bounds, their defaults
//! and their environment variables. Cancellation, a deadline and a refused answer all
//! drop the in-flight request, which closes its connection.
//!
//! Rate limits: every attempt first passes the model's [`Limiter`]
//! (`OpenAiConfig::limits`; share one between models with
//! [`OpenAiModel::with_limiter`]), charged the request's estimated tokens
//! (its bytes / 4, plus `max_tokens`) and settled with the usage the answer
//! reports. A 429 or 529 that says when to come back (`retry-after`,
//! `x-ratelimit-reset-*`) pauses every call on the limiter until then
//! rather than this call alone. Each attempt and its wait is recorded on
//! the request's [`CallMeter`](super::CallMeter).
//!
//! ```no_run
//! use subagents::agent::{Agent, OpenAiConfig, OpenAiModel};
//!
//! let model = OpenAiModel::new(OpenAiConfig::from_env().unwrap()).unwrap();
//! let agent = Agent::builder(model).build().unwrap();
//! ```

use std::sync::Once;
use std::time::{Duration, SystemTime};

use futures_util::future::BoxFuture;
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

mod answer;
mod config;

use answer::{parse_completion, CallLimits, StreamedAnswer};
pub use config::OpenAiConfig;

use super::limit::{jittered, retry_delay, Limiter, Permit};
use super::{CallMeter, ChunkSink, Model, ModelError, ModelReply, ModelRequest, Oversize};
use crate::agent::session::{SessionEvent, ToolCall};
use crate::seam::{text_of, ContentBlock};

/// Longest streamed line accepted; a longer one is a malformed stream.
const MAX_LINE: usize = 4 * 1024 * 1024;
/// Longest error body excerpt kept in an error message.
const ERROR_EXCERPT: usize = 300;
/// Longest error line kept from an endpoint's error body.
const ERROR_LINE: usize = 200;
/// The longest backoff between retries.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The OpenAI-compatible adapter.
pub struct OpenAiModel {
    config: OpenAiConfig,
    url: String,
    name: String,
    client: reqwest::Client,
    limiter: Limiter,
}

impl std::fmt::Debug for OpenAiModel {
    /// The name only: the configuration holds the key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiModel").field("name", &self.name).finish_non_exhaustive()
    }
}

impl OpenAiModel {
    /// An adapter for `config`.
    pub fn new(config: OpenAiConfig) -> Result<Self, ModelError> {
        if !(config.base_url.starts_with("http://") || config.base_url.starts_with("https://")) {
            return Err(ModelError::Config(format!(
                "base URL {:?} must start with http:// or https://",
                config.base_url
            )));
        }
        config.check()?;
        install_crypto_provider();
        let client = reqwest::Client::builder()
            .connect_timeout(config.timeout.min(Duration::from_secs(30)))
            .build()
            .map_err(|e| ModelError::Config(format!("cannot build the HTTP client: {e}")))?;
        let url = format!("{}/chat/completions", config.base_url.trim_end_matches('/'));
        let limiter = Limiter::new(config.limits);
        Ok(OpenAiModel { name: format!("openai:{}", config.model), url, config, client, limiter })
    }

    /// This adapter passing `limiter` instead of its own: models built for
    /// one route share its limits and its cool-downs.
    pub fn with_limiter(mut self, limiter: Limiter) -> Self {
        self.limiter = limiter;
        self
    }

    /// The limiter every attempt passes.
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// Whether the endpoint's host accepts a connection (within the
    /// timeout, at most 5 s): a cheap check before a batch of runs.
    pub async fn check_reachable(&self) -> Result<(), ModelError> {
        let url = reqwest::Url::parse(&self.config.base_url).map_err(|e| ModelError::Config(e.to_string()))?;
        let host = url.host_str().ok_or_else(|| ModelError::Config("the base URL has no host".to_owned()))?;
        let port = url.port_or_known_default().unwrap_or(443);
        let bound = self.config.timeout.min(Duration::from_secs(5));
        match tokio::time::timeout(bound, tokio::net::TcpStream::connect((host, port))).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(ModelError::Transport(format!("{host}:{port}: {error}"))),
            Err(_) => Err(ModelError::Timeout(bound)),
        }
    }

    fn body(&self, request: &ModelRequest) -> Value {
        let mut messages = Vec::with_capacity(request.messages.len() + 1);
        if !request.system.is_empty() {
            messages.push(json!({"role": "system", "content": request.system}));
        }
        for event in request.messages.iter() {
            match event {
                SessionEvent::User { content } => {
                    messages.push(json!({"role": "user", "content": user_content(content)}))
                }
                SessionEvent::Assistant { text, tool_calls } => {
                    let mut message = json!({"role": "assistant", "content": text});
                    if !tool_calls.is_empty() {
                        let calls: Vec<Value> = tool_calls.iter().map(wire_call).collect();
                        message["tool_calls"] = Value::Array(calls);
                    }
                    messages.push(message);
                }
                SessionEvent::ToolResult { call_id, content, .. } => {
                    messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": content}))
                }
                SessionEvent::TurnEnd { .. } => {}
            }
        }
        let options = &request.options;
        let mut body = json!({
            "model": options.model.as_deref().unwrap_or(&self.config.model),
            "messages": messages,
        });
        if !request.tools.is_empty() {
            let tools: Vec<Value> = request
                .tools
                .iter()
                .map(|t| {
                    json!({"type": "function", "function": {
                        "name": t.name, "description": t.description, "parameters": t.parameters}})
                })
                .collect();
            body["tools"] = Value::Array(tools);
        }
        if let Some(max_tokens) = options.max_tokens.or(self.config.max_tokens) {
            body["max_tokens"] = json!(max_tokens);
        }
        if let Some(effort) = &options.reasoning_effort {
            body["reasoning_effort"] = json!(effort);
        }
        if self.config.stream {
            body["stream"] = json!(true);
            body["stream_options"] = json!({"include_usage": true});
        }
        body
    }

    /// Sends the request, retrying what is worth retrying. Each attempt
    /// first passes the limiter; the permit of the one that succeeded is
    /// held until its answer is read.
    async fn send(
        &self,
        body: &[u8],
        estimate: u64,
        meter: &CallMeter,
        cancel: &CancellationToken,
    ) -> Result<(reqwest::Response, Permit), ModelError> {
        let mut attempt = 0;
        loop {
            let permit = self.limiter.admit(estimate, cancel).await.map_err(|_| ModelError::Cancelled)?;
            meter.attempt(permit.waited());
            let mut request = self
                .client
                .post(&self.url)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.to_vec());
            if let Some(key) = &self.config.api_key {
                request = request.bearer_auth(key);
            }
            let retry_after = match tokio::time::timeout(self.config.timeout, request.send()).await {
                Err(_) if attempt < self.config.max_retries => None,
                Err(_) => return Err(ModelError::Timeout(self.config.timeout)),
                Ok(Ok(response)) if response.status().is_success() => return Ok((response, permit)),
                Ok(Ok(response)) => {
                    let status = response.status();
                    let told = self.after_refusal(status.as_u16(), response.headers());
                    if rate_limited(status.as_u16()) {
                        // Refused unworked: it used no tokens.
                        permit.settle(0);
                    } else {
                        drop(permit);
                    }
                    let retryable = transient(status.as_u16());
                    if !retryable || attempt >= self.config.max_retries {
                        let excerpt = self.error_excerpt(response).await;
                        return Err(ModelError::Status { status: status.as_u16(), message: excerpt });
                    }
                    told
                }
                Ok(Err(error)) if attempt < self.config.max_retries && (error.is_connect() || error.is_timeout()) => {
                    None
                }
                Ok(Err(error)) => return Err(ModelError::Transport(describe(&error))),
            };
            let backoff = self.config.retry_backoff.saturating_mul(1 << attempt.min(16));
            let delay = retry_after.unwrap_or_else(|| jittered(backoff)).min(MAX_BACKOFF);
            tracing::debug!(attempt, ?delay, "retrying the model call");
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }

    /// How long this call waits after a transient status before trying
    /// again, when the endpoint said. A 429 or 529 that says when to come
    /// back pauses the whole route instead (the next admission waits for
    /// it), so the call itself waits no longer.
    fn after_refusal(&self, status: u16, headers: &reqwest::header::HeaderMap) -> Option<Duration> {
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
        let read = read_at_most(response, self.config.max_error_body_bytes);
        let body = match tokio::time::timeout(self.config.timeout, read).await {
            Ok(Ok((bytes, _))) => bytes,
            _ => return "(no readable body)".to_owned(),
        };
        let message = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
            .unwrap_or_else(|| String::from_utf8_lossy(&body).into_owned());
        one_line(&message)
    }

    async fn complete_inner(
        &self,
        request: ModelRequest,
        cancel: &CancellationToken,
    ) -> Result<ModelReply, ModelError> {
        let body = serde_json::to_vec(&self.body(&request))
            .map_err(|e| ModelError::Config(format!("cannot encode the request: {e}")))?;
        // About four bytes a token, and the longest answer the call allows.
        let max_tokens = request.options.max_tokens.or(self.config.max_tokens).unwrap_or(0);
        let estimate = body.len() as u64 / 4 + u64::from(max_tokens);
        let (response, permit) = self.send(&body, estimate, &request.meter, cancel).await?;
        let reply = self.read_answer(response, &request).await;
        if let Ok(ModelReply { usage: Some(usage), .. }) = &reply {
            permit.settle(usage.total());
        }
        reply
    }

    async fn read_answer(&self, response: reqwest::Response, request: &ModelRequest) -> Result<ModelReply, ModelError> {
        let is_event_stream = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if self.config.stream && is_event_stream {
            return self.read_stream(response, request.chunks.as_ref()).await;
        }
        let bound = self.config.max_answer_bytes;
        let too_large = ModelError::Oversized(Oversize::AnswerBytes(bound));
        if response.content_length().is_some_and(|length| length > bound as u64) {
            return Err(too_large);
        }
        let bytes = match tokio::time::timeout(self.config.timeout, read_at_most(response, bound)).await {
            Err(_) => return Err(ModelError::Timeout(self.config.timeout)),
            Ok(Err(error)) => return Err(ModelError::BrokeOff(describe(&error))),
            Ok(Ok((_, false))) => return Err(too_large),
            Ok(Ok((bytes, true))) => bytes,
        };
        let reply = parse_completion(&bytes, self.limits())?;
        if let (Some(sink), false) = (&request.chunks, reply.text.is_empty()) {
            sink(&reply.text);
        }
        Ok(reply)
    }

    async fn read_stream(
        &self,
        response: reqwest::Response,
        sink: Option<&ChunkSink>,
    ) -> Result<ModelReply, ModelError> {
        let mut stream = response.bytes_stream();
        let mut pending: Vec<u8> = Vec::new();
        let mut answer = StreamedAnswer::new(self.limits());
        // Every byte counts, comments and blank lines too: a stream is
        // bounded as a whole, not only by what it adds to the answer.
        let mut received = 0usize;
        while !answer.done {
            let chunk = match tokio::time::timeout(self.config.timeout, stream.next()).await {
                Err(_) => return Err(ModelError::Timeout(self.config.timeout)),
                Ok(None) => break,
                Ok(Some(Err(error))) => return Err(ModelError::BrokeOff(describe(&error))),
                Ok(Some(Ok(chunk))) => chunk,
            };
            received = received.saturating_add(chunk.len());
            if received > self.config.max_answer_bytes {
                return Err(ModelError::Oversized(Oversize::AnswerBytes(self.config.max_answer_bytes)));
            }
            pending.extend_from_slice(&chunk);
            let mut start = 0;
            while let Some(offset) = pending[start..].iter().position(|&b| b == b'\n') {
                answer.line(&pending[start..start + offset], sink)?;
                start += offset + 1;
                if answer.done {
                    break;
                }
            }
            pending.drain(..start);
            if pending.len() > MAX_LINE {
                return Err(ModelError::Malformed(format!("a streamed line exceeds {MAX_LINE} bytes")));
            }
        }
        if !answer.done && answer.finish_reason.is_none() {
            return Err(ModelError::BrokeOff("the stream ended before the answer finished".to_owned()));
        }
        answer.into_reply()
    }

    fn limits(&self) -> CallLimits {
        CallLimits { calls: self.config.max_tool_calls, argument_bytes: self.config.max_tool_argument_bytes }
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

impl Model for OpenAiModel {
    fn name(&self) -> &str {
        &self.name
    }

    fn complete(
        &self,
        request: ModelRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'_, Result<ModelReply, ModelError>> {
        Box::pin(async move {
            let deadline = self.config.call_deadline;
            tokio::select! {
                biased;
                _ = cancel.cancelled() => Err(ModelError::Cancelled),
                reply = tokio::time::timeout(deadline, self.complete_inner(request, &cancel)) => {
                    reply.unwrap_or(Err(ModelError::Deadline(deadline)))
                }
            }
        })
    }
}

fn wire_call(call: &ToolCall) -> Value {
    let arguments = match &call.arguments {
        Value::String(raw) => raw.clone(),
        other => other.to_string(),
    };
    json!({"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}})
}

fn user_content(content: &[ContentBlock]) -> Value {
    if content.iter().all(|block| block.as_text().is_some()) {
        return json!(text_of(content));
    }
    let parts: Vec<Value> = content
        .iter()
        .map(|block| match block {
            ContentBlock::Image { mime_type, data } => {
                json!({"type": "image_url", "image_url": {"url": format!("data:{mime_type};base64,{data}")}})
            }
            other => json!({"type": "text", "text": other.as_text().unwrap_or_default()}),
        })
        .collect();
    Value::Array(parts)
}

/// Statuses worth another try: the endpoint may answer differently soon.
fn transient(status: u16) -> bool {
    matches!(status, 408 | 425 | 429 | 500 | 502 | 503 | 504 | 529)
}

/// Statuses that say the route is over its limit (529: overloaded).
fn rate_limited(status: u16) -> bool {
    matches!(status, 429 | 529)
}

/// An error body as one line of at most [`ERROR_LINE`] characters: markup
/// (an HTML error page) dropped, entities of the common kind decoded,
/// whitespace and control characters collapsed.
fn one_line(body: &str) -> String {
    let mut text = String::with_capacity(body.len().min(4 * ERROR_LINE));
    let mut in_tag = false;
    let mut skipping = None::<&str>; // inside <script> or <style>
    let lower = body.to_ascii_lowercase();
    let mut index = 0;
    for (at, c) in body.char_indices() {
        if at < index {
            continue;
        }
        if let Some(end) = skipping {
            if lower[at..].starts_with(end) {
                skipping = None;
                index = at + end.len();
            }
            continue;
        }
        match c {
            '<' => {
                in_tag = true;
                if lower[at..].starts_with("<script") {
                    skipping = Some("</script>");
                } else if lower[at..].starts_with("<style") {
                    skipping = Some("</style>");
                }
                text.push(' ');
            }
            '>' if in_tag => in_tag = false,
            _ if in_tag => {}
            c if c.is_control() || c.is_whitespace() => text.push(' '),
            c => text.push(c),
        }
        if text.len() > 8 * ERROR_LINE {
            break;
        }
    }
    let text = text
        .replace("&nbsp;", " ")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&");
    let collapsed = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match collapsed.char_indices().nth(ERROR_LINE) {
        Some((cut, _)) => format!("{}…", &collapsed[..cut]),
        None => collapsed,
    }
}

/// A transport error without the request URL (it may carry credentials).
fn describe(error: &reqwest::Error) -> String {
    let kind = if error.is_connect() {
        "connection failed"
    } else if error.is_timeout() {
        "timed out"
    } else if error.is_body() || error.is_decode() {
        "the response body broke off"
    } else {
        "request failed"
    };
    let mut source = std::error::Error::source(error);
    let mut detail = String::new();
    while let Some(cause) = source {
        detail = cause.to_string();
        source = cause.source();
    }
    if detail.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}: {}", excerpt(&detail))
    }
}

fn excerpt(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(ERROR_EXCERPT) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

fn install_crypto_provider() {
    static INSTALL: Once = Once::new();
    // An embedding application may have installed its own provider already;
    // either way one is in place afterwards.
    INSTALL.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}
