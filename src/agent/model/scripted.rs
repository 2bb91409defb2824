//! The scripted model: deterministic answers, no key, no network.
//!
//! Scripts are lists of [`Step`]s. A session is bound to the first script
//! whose [`ScriptMatch`] fits it on its first call (by session id, or by a
//! phrase in the prompt of that call) and then walks that script one step per
//! call; each session has its own cursor, so concurrent sessions never
//! interfere. A session with no script, or past its script's end, gets the
//! fallback step (by default [`Step::Echo`]). A reply that carries no
//! [`Usage`] reports a rough one (four bytes a token), so token budgets
//! can be tested without a real model.
//!
//! ```
//! use subagents::agent::{ScriptMatch, ScriptedModel, Step};
//!
//! let model = ScriptedModel::new()
//!     .script(ScriptMatch::PromptContains("weather".into()), vec![Step::text("sunny")])
//!     .fallback(Step::text("I can only talk about the weather"));
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dashmap::DashMap;
use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::{ChunkSink, Finish, Model, ModelError, ModelReply, ModelRequest, Usage};
use crate::agent::session::ToolCall;

/// One scripted answer.
#[derive(Clone)]
#[non_exhaustive]
pub enum Step {
    /// Answer with a reply as given.
    Reply(ModelReply),
    /// Answer `"handled: " + the latest user text`.
    Echo,
    /// Fail the call.
    Error(String),
    /// Wait (honouring cancellation), then take the inner step.
    Delay(Duration, Box<Step>),
    /// Wait as long as the rule reads from the request (honouring
    /// cancellation; no wait when it answers `None`), then take the inner
    /// step.
    DelayBy(DelayRule, Box<Step>),
    /// Compute the answer from the request (a programmable script).
    Respond(Responder),
}

impl std::fmt::Debug for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Reply(reply) => f.debug_tuple("Reply").field(reply).finish(),
            Step::Echo => f.write_str("Echo"),
            Step::Error(message) => f.debug_tuple("Error").field(message).finish(),
            Step::Delay(delay, step) => f.debug_tuple("Delay").field(delay).field(step).finish(),
            Step::DelayBy(_, step) => f.debug_tuple("DelayBy").field(&"..").field(step).finish(),
            Step::Respond(_) => f.write_str("Respond(..)"),
        }
    }
}

/// Computes a scripted answer from the request.
pub type Responder = Arc<dyn Fn(&ModelRequest) -> Result<ModelReply, ModelError> + Send + Sync>;

/// Reads from a request how long to wait before answering it.
pub type DelayRule = Arc<dyn Fn(&ModelRequest) -> Option<Duration> + Send + Sync>;

impl Step {
    /// A finished text answer.
    pub fn text(text: impl Into<String>) -> Self {
        Step::Reply(ModelReply::text(text))
    }

    /// Tool calls `(name, arguments)`, with ids `call_<n>`.
    pub fn tool_calls<S: Into<String>>(calls: impl IntoIterator<Item = (S, serde_json::Value)>) -> Self {
        let tool_calls = calls
            .into_iter()
            .enumerate()
            .map(|(n, (name, arguments))| ToolCall { id: format!("call_{n}"), name: name.into(), arguments })
            .collect();
        Step::Reply(ModelReply { text: String::new(), tool_calls, finish: Finish::ToolCalls, usage: None })
    }

    /// One tool call.
    pub fn tool_call(name: impl Into<String>, arguments: serde_json::Value) -> Self {
        Step::tool_calls([(name.into(), arguments)])
    }

    /// A refusal with its text.
    pub fn refusal(text: impl Into<String>) -> Self {
        Step::Reply(ModelReply { finish: Finish::Refusal, ..ModelReply::text(text) })
    }

    /// A partial answer cut by the token limit.
    pub fn max_tokens(text: impl Into<String>) -> Self {
        Step::Reply(ModelReply { finish: Finish::MaxTokens, ..ModelReply::text(text) })
    }

    /// A failing call.
    pub fn error(message: impl Into<String>) -> Self {
        Step::Error(message.into())
    }

    /// An answer computed from each request.
    pub fn respond(
        responder: impl Fn(&ModelRequest) -> Result<ModelReply, ModelError> + Send + Sync + 'static,
    ) -> Self {
        Step::Respond(Arc::new(responder))
    }

    /// This step, after a delay.
    pub fn after(self, delay: Duration) -> Self {
        Step::Delay(delay, Box::new(self))
    }

    /// This step, after as long as `rule` reads from each request.
    pub fn after_requested(self, rule: impl Fn(&ModelRequest) -> Option<Duration> + Send + Sync + 'static) -> Self {
        Step::DelayBy(Arc::new(rule), Box::new(self))
    }
}

/// A reply that reports no usage gets a rough one, four bytes a token (at
/// least one each way): the latest user text in, the answer and its tool
/// calls out. Enough for a delegation budget's token limit to bite in tests.
/// `prompt_bytes` is the length of the request's latest user text.
fn with_estimated_usage(mut reply: ModelReply, prompt_bytes: usize) -> ModelReply {
    if reply.usage.is_none() {
        let tokens = |bytes: usize| u64::try_from(bytes / 4 + 1).unwrap_or(u64::MAX);
        let prompt = prompt_bytes;
        let calls: usize = reply.tool_calls.iter().map(|c| c.name.len() + c.arguments.to_string().len()).sum();
        let usage =
            Usage { input_tokens: tokens(prompt), output_tokens: tokens(reply.text.len() + calls), ..Usage::default() };
        reply.usage = Some(usage);
    }
    reply
}

/// Which sessions a script is for.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum ScriptMatch {
    /// Exactly this session id.
    Session(String),
    /// Sessions whose first prompt (the latest user message at their first
    /// call) contains this text.
    PromptContains(String),
    /// Every session.
    Any,
}

impl ScriptMatch {
    fn fits(&self, request: &ModelRequest) -> bool {
        match self {
            ScriptMatch::Session(id) => *id == request.session_id,
            ScriptMatch::PromptContains(phrase) => request.last_user_text().is_some_and(|t| t.contains(phrase)),
            ScriptMatch::Any => true,
        }
    }
}

/// One per live session, so kept small (`u32`s: a script has fewer steps
/// and a model fewer scripts than that).
struct Binding {
    calls: u64,
    /// The index of its script, if one fits.
    script: Option<u32>,
    cursor: u32,
}

/// Deterministic scripts keyed by session. Cheap to clone (shared state).
#[derive(Clone)]
pub struct ScriptedModel {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ScriptedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScriptedModel")
            .field("scripts", &self.inner.scripts.len())
            .field("calls", &self.calls())
            .finish()
    }
}

struct Inner {
    scripts: Vec<(ScriptMatch, Vec<Step>)>,
    fallback: Step,
    /// Keyed by a boxed id (16 bytes a slot, not a `String`'s 24).
    bindings: DashMap<Box<str>, Binding>,
    calls: AtomicU64,
    requests: Option<Mutex<Vec<ModelRequest>>>,
}

impl Default for ScriptedModel {
    fn default() -> Self {
        Self::new()
    }
}

impl ScriptedModel {
    /// No scripts: every session gets [`Step::Echo`].
    pub fn new() -> Self {
        ScriptedModel {
            inner: Arc::new(Inner {
                scripts: Vec::new(),
                fallback: Step::Echo,
                bindings: DashMap::new(),
                calls: AtomicU64::new(0),
                requests: None,
            }),
        }
    }

    fn edit(mut self, f: impl FnOnce(&mut Inner)) -> Self {
        f(Arc::get_mut(&mut self.inner).expect("configure a ScriptedModel before sharing it"));
        self
    }

    /// Adds a script; earlier scripts win when several fit.
    pub fn script(self, matching: ScriptMatch, steps: Vec<Step>) -> Self {
        self.edit(|inner| inner.scripts.push((matching, steps)))
    }

    /// The step for sessions without a script or past its end.
    pub fn fallback(self, step: Step) -> Self {
        self.edit(|inner| inner.fallback = step)
    }

    /// Keeps every request for [`ScriptedModel::requests`].
    pub fn recording(self) -> Self {
        self.edit(|inner| inner.requests = Some(Mutex::new(Vec::new())))
    }

    /// Calls answered so far, across sessions.
    pub fn calls(&self) -> u64 {
        self.inner.calls.load(Ordering::Relaxed)
    }

    /// Calls answered so far for one session (after the session closed,
    /// only while [`ScriptedModel::recording`]).
    pub fn calls_for(&self, session_id: &str) -> u64 {
        self.inner.bindings.get(session_id).map_or(0, |b| b.calls)
    }

    /// The requests seen, oldest first (only with [`ScriptedModel::recording`]).
    pub fn requests(&self) -> Vec<ModelRequest> {
        self.inner.requests.as_ref().map(|r| r.lock().unwrap_or_else(|e| e.into_inner()).clone()).unwrap_or_default()
    }

    /// The session's next step, borrowed from the script (or the
    /// fallback): a call's future walks it without a copy.
    fn next_step(&self, request: &ModelRequest) -> &Step {
        let inner = &*self.inner;
        let (script, cursor) = {
            let mut binding = inner.bindings.entry(request.session_id.as_str().into()).or_insert_with(|| Binding {
                calls: 0,
                script: inner.scripts.iter().position(|(m, _)| m.fits(request)).and_then(|i| u32::try_from(i).ok()),
                cursor: 0,
            });
            binding.calls += 1;
            let cursor = binding.cursor;
            binding.cursor = cursor.saturating_add(1);
            (binding.script, cursor)
        };
        let step = |script: u32| inner.scripts[script as usize].1.get(cursor as usize);
        script.and_then(step).unwrap_or(&inner.fallback)
    }
}

/// What a step chain ends in when nothing after its fixed delays reads
/// the request: the call lets the request go before it waits.
enum FixedEnd<'a> {
    Reply(&'a ModelReply),
    /// The echo's text, made from the request up front.
    Echo(String),
    Error(&'a str),
}

impl<'a> FixedEnd<'a> {
    /// `None` when a step in the chain reads the request (a delay rule, a
    /// responder).
    fn of(mut step: &'a Step, request: &ModelRequest) -> Option<Self> {
        loop {
            match step {
                Step::Delay(_, inner) => step = inner,
                Step::Reply(reply) => return Some(FixedEnd::Reply(reply)),
                Step::Echo => {
                    let prompt = request.last_user_text().unwrap_or_default();
                    return Some(FixedEnd::Echo(format!("handled: {prompt}")));
                }
                Step::Error(message) => return Some(FixedEnd::Error(message)),
                Step::DelayBy(..) | Step::Respond(_) => return None,
            }
        }
    }
}

/// Waits out the leading [`Step::Delay`]s of `step` (honouring `cancel`,
/// checked before each step as well); the first step that is not one.
async fn wait_through<'a>(mut step: &'a Step, cancel: &CancellationToken) -> Result<&'a Step, ModelError> {
    loop {
        if cancel.is_cancelled() {
            return Err(ModelError::Cancelled);
        }
        let Step::Delay(delay, inner) = step else { return Ok(step) };
        tokio::select! {
            _ = cancel.cancelled() => return Err(ModelError::Cancelled),
            _ = tokio::time::sleep(*delay) => step = inner,
        }
    }
}

/// A scripted answer "streams" as one chunk.
fn stream(chunks: Option<&ChunkSink>, reply: &ModelReply) {
    if let (Some(sink), false) = (chunks, reply.text.is_empty()) {
        sink(&reply.text);
    }
}

impl Model for ScriptedModel {
    fn name(&self) -> &str {
        "scripted"
    }

    /// Drops the session's script cursor, unless the model is recording
    /// (then per-session counts stay readable).
    fn session_closed(&self, session_id: &str) {
        if self.inner.requests.is_none() {
            self.inner.bindings.remove(session_id);
        }
    }

    fn complete(
        &self,
        request: ModelRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'_, Result<ModelReply, ModelError>> {
        self.inner.calls.fetch_add(1, Ordering::Relaxed);
        let step = self.next_step(&request);
        if let Some(requests) = &self.inner.requests {
            requests.lock().unwrap_or_else(|e| e.into_inner()).push(request.clone());
        }
        let prompt_bytes = request.last_user_text().map_or(0, |text| text.len());
        if let Some(end) = FixedEnd::of(step, &request) {
            // The request is dropped here, not held while the call waits:
            // a run waiting on a long scripted delay keeps no copy of its
            // conversation.
            let chunks = request.chunks.clone();
            return Box::pin(async move {
                wait_through(step, &cancel).await?;
                let reply = match end {
                    FixedEnd::Reply(reply) => reply.clone(),
                    FixedEnd::Echo(text) => ModelReply::text(text),
                    FixedEnd::Error(message) => return Err(ModelError::Scripted(message.to_owned())),
                };
                stream(chunks.as_ref(), &reply);
                Ok(with_estimated_usage(reply, prompt_bytes))
            });
        }
        Box::pin(async move {
            let mut step = step;
            let reply = loop {
                if cancel.is_cancelled() {
                    return Err(ModelError::Cancelled);
                }
                match step {
                    Step::Delay(..) => step = wait_through(step, &cancel).await?,
                    Step::DelayBy(rule, inner) => {
                        if let Some(delay) = rule(&request) {
                            tokio::select! {
                                _ = cancel.cancelled() => return Err(ModelError::Cancelled),
                                _ = tokio::time::sleep(delay) => {}
                            }
                        }
                        step = inner;
                    }
                    Step::Reply(reply) => break reply.clone(),
                    Step::Echo => {
                        let prompt = request.last_user_text().unwrap_or_default();
                        break ModelReply::text(format!("handled: {prompt}"));
                    }
                    Step::Error(message) => return Err(ModelError::Scripted(message.clone())),
                    Step::Respond(responder) => break responder(&request)?,
                }
            };
            stream(request.chunks.as_ref(), &reply);
            Ok(with_estimated_usage(reply, prompt_bytes))
        })
    }
}
