//! One turn of the agent loop.
//!
//! request → assistant message → tool calls → results → … until the model
//! finishes, hits its token limit, refuses, is cancelled, or fails. Whatever
//! ends the turn, the log stays well formed: every tool call gets a result
//! (calls that never ran get an error result saying why), a `TurnEnd` with
//! the reason closes the turn (every event is already on disk). A turn whose
//! future is dropped mid-way is closed as `Aborted` the same way.
//!
//! An agent holding a delegation budget ([`AgentBuilder::budget`](super::AgentBuilder::budget))
//! charges each model usage report to it. Once the budget's tokens are
//! spent (here or elsewhere in the tree) the turn makes no more model calls
//! and runs no more tool calls: it ends `MaxTokens` (an answer that spent
//! them but asked for no tools still completes). At the budget's deadline
//! it ends `Aborted`. Either way it keeps the output it has so far.

use std::sync::{Arc, Mutex};

use futures_util::future::{join_all, Either};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::model::Finish;
use super::model::{CallMeter, ChunkSink, ModelError, ModelReply, ModelRequest};
use super::session::{SessionError, SessionEvent, ToolCall};
use super::tools::{ToolContext, ToolOutput};
use super::{Agent, AgentInner};
use crate::seam::ToolCallStatus;
use crate::seam::{AgentOptions, BudgetLease, Category, ContentBlock, ProgressUpdate, RunUsage, StopReason};
use crate::telemetry;

/// How a turn ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TurnOutcome {
    /// Why it ended.
    pub stop_reason: StopReason,
    /// The last non-empty assistant text of the turn, else the streamed
    /// text, else empty.
    pub output: String,
    /// What failed, for `Error` turns (a model, tool-loop or session
    /// failure). Not safe to show as a diagnostic: it may quote a payload.
    pub error: Option<TurnError>,
    /// Model calls made in the turn.
    pub model_calls: u32,
    /// What the turn's model calls spent: tokens as the model reported
    /// them, calls, HTTP attempts, time waited on the route's limits.
    pub usage: RunUsage,
}

/// How a turn ended, and what failed if it failed.
type Ending = (StopReason, Option<TurnError>);

/// Why a turn failed. The message is for logs: it may quote a payload, so
/// it is not a safe diagnostic; `reason` is (fixed wording, see
/// [`Diagnostic`](crate::seam::Diagnostic)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TurnError {
    /// What failed.
    pub kind: TurnErrorKind,
    /// What happened.
    pub message: String,
    /// The same in fixed wording, safe to show ("the model endpoint answered 404").
    pub reason: String,
}

/// What failed in a turn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TurnErrorKind {
    /// The model call failed.
    Model,
    /// The turn made as many model calls as it may.
    StepLimit,
    /// The session could not be written.
    Session,
}

impl TurnError {
    fn session(error: &SessionError) -> Self {
        TurnError {
            kind: TurnErrorKind::Session,
            message: error.to_string(),
            reason: "the session could not be written".to_owned(),
        }
    }

    /// The diagnostic category of this failure: a failed model call is
    /// `model`, anything else the child's own failure.
    pub fn category(&self) -> Category {
        match self.kind {
            TurnErrorKind::Model => Category::Model,
            _ => Category::ChildError,
        }
    }
}

impl std::fmt::Display for TurnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A live update from a running turn.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum AgentUpdate {
    /// Streamed answer text.
    Text(String),
    /// A tool call is about to run.
    ToolCall {
        /// The call id.
        id: String,
        /// The tool's name.
        name: String,
        /// Its arguments, as the model wrote them.
        arguments: serde_json::Value,
    },
    /// A tool call finished.
    ToolResult {
        /// The call id.
        id: String,
        /// The tool's name.
        name: String,
        /// Whether it failed.
        is_error: bool,
    },
    /// A running tool reported progress ([`ToolContext::progress`]): a
    /// subagent tool passes on what its child does.
    ToolProgress {
        /// The call id.
        id: String,
        /// What happened.
        update: ProgressUpdate,
    },
    /// The turn ended.
    TurnEnd(StopReason),
}

impl AgentUpdate {
    /// The tool call this update reports on, as its name and new status;
    /// `None` for text, a tool's own progress and turn ends.
    pub fn tool_call(&self) -> Option<(&str, ToolCallStatus)> {
        match self {
            AgentUpdate::ToolCall { name, .. } => Some((name, ToolCallStatus::Pending)),
            AgentUpdate::ToolResult { name, is_error: false, .. } => Some((name, ToolCallStatus::Completed)),
            AgentUpdate::ToolResult { name, is_error: true, .. } => Some((name, ToolCallStatus::Failed)),
            AgentUpdate::Text(_) | AgentUpdate::ToolProgress { .. } | AgentUpdate::TurnEnd(_) => None,
        }
    }
}

/// Runs one turn; `cancel` is this turn's token. Call it once the turn
/// holds the agent's turn lock: the prompt is recorded at once, so the
/// turn's state does not carry it while the model answers.
pub(crate) fn run(
    inner: &Arc<AgentInner>,
    prompt: Vec<ContentBlock>,
    cancel: CancellationToken,
) -> impl std::future::Future<Output = TurnOutcome> + Send + '_ {
    let mut turn = Turn {
        inner,
        open_calls: Vec::new(),
        output: String::new(),
        model_calls: 0,
        usage: RunUsage::default(),
        ended: false,
        started: std::time::Instant::now(),
    };
    match turn.append(SessionEvent::User { content: prompt }) {
        Err(error) => Either::Left(std::future::ready(turn.end(StopReason::Error, Some(TurnError::session(&error))))),
        Ok(()) => Either::Right(async move {
            let (reason, error) = turn.drive(&cancel).await;
            turn.end(reason, error)
        }),
    }
}

struct Turn<'a> {
    inner: &'a Arc<AgentInner>,
    /// Calls of the latest assistant message still waiting for a result.
    open_calls: Vec<ToolCall>,
    output: String,
    model_calls: u32,
    usage: RunUsage,
    ended: bool,
    /// When the turn began, for its length in the session.
    started: std::time::Instant,
}

impl<'a> Turn<'a> {
    /// An `async` block, not an `async fn`: the turn and its token are
    /// held once in the state, not once as arguments and again as locals.
    #[allow(clippy::manual_async_fn, reason = "an async fn would hold its arguments twice")]
    fn drive<'t>(
        &'t mut self,
        cancel: &'t CancellationToken,
    ) -> impl std::future::Future<Output = Ending> + Send + use<'a, 't> {
        async move {
            let inner = self.inner;
            let streamed = Arc::new(Mutex::new(String::new()));
            let chunks = self.chunk_sink(&streamed);
            loop {
                // Read each step: a tool may open the agent's budget mid-turn.
                let budget = inner.budget();
                let deadline = budget.and_then(BudgetLease::deadline);
                if cancel.is_cancelled() || deadline.is_some_and(|d| d <= std::time::Instant::now()) {
                    return (StopReason::Aborted, None);
                }
                if budget.is_some_and(BudgetLease::tokens_spent) {
                    // Spent by this agent or elsewhere in its tree: no more calls.
                    return (StopReason::MaxTokens, None);
                }
                if self.model_calls >= inner.max_steps {
                    return (
                        StopReason::Error,
                        Some(TurnError {
                            kind: TurnErrorKind::StepLimit,
                            message: format!("the turn reached its limit of {} model calls", inner.max_steps),
                            reason: format!("the turn reached its limit of {} model calls", inner.max_steps),
                        }),
                    );
                }
                let steering = inner.take_steering();
                for content in steering {
                    if let Err(error) = self.append(SessionEvent::User { content }) {
                        return (StopReason::Error, Some(TurnError::session(&error)));
                    }
                }
                // A block of its own: the call's span, meter and reply are
                // not part of the turn's state while its tools run.
                let (spent, ended) = {
                    let meter = CallMeter::default();
                    self.model_calls += 1;
                    let span = self.model_call_span();
                    // The request is built in the call, so the turn's state does not
                    // keep its room while the model answers (the model owns it).
                    let reply = tokio::select! {
                        biased;
                        _ = cancel.cancelled() => Err(ModelError::Cancelled),
                        // The budget's time is up: stop with what the turn has.
                        () = until(deadline) => Err(ModelError::Cancelled),
                        reply = in_span(span.as_deref(), inner.model.complete(self.request(&chunks, &meter), cancel.clone())) => reply,
                    };
                    if let Some(span) = span.as_deref() {
                        // What the route cost this call: its HTTP attempts
                        // (a 429 retried is one more; none for a model that
                        // makes no request) and its wait on the limiter.
                        span.record("subagents.model.attempts", meter.attempts());
                        span.record("subagents.limit.wait_ms", meter.limit_wait().as_millis() as u64);
                    }
                    chat_ended(span, &reply);
                    let tokens = reply.as_ref().ok().and_then(|reply| reply.usage).unwrap_or_default();
                    self.usage += RunUsage {
                        input_tokens: tokens.input_tokens,
                        output_tokens: tokens.output_tokens,
                        cache_read_tokens: tokens.cache_read_tokens,
                        cache_write_tokens: tokens.cache_write_tokens,
                        model_calls: 1,
                        attempts: meter.attempts(),
                        limit_wait_ms: u64::try_from(meter.limit_wait().as_millis()).unwrap_or(u64::MAX),
                    };
                    // Charged before the answer is read further: an answer that
                    // stops the turn (its token limit, a refusal) spent them too.
                    let spent = match (inner.budget(), reply.as_ref().ok().and_then(|reply| reply.usage)) {
                        (Some(lease), Some(usage)) => lease.charge_tokens(usage.total()),
                        _ => false,
                    };
                    (spent, self.take_reply(reply, &streamed))
                };
                if let Some(ending) = ended {
                    return ending;
                }
                if spent {
                    // The budget's tokens are spent: stop with what the turn has.
                    return (StopReason::MaxTokens, None);
                }
                if self.open_calls.is_empty() {
                    // A message steered in during this last model call still
                    // gets an answer in this turn.
                    if inner.no_steering() {
                        return (StopReason::Completed, None);
                    }
                    continue;
                }
                // Boxed: held inline, its state would size every turn's
                // future, also the many that wait on a model call.
                match Box::pin(self.run_tools(cancel, deadline)).await {
                    Ok(true) => return (StopReason::Completed, None),
                    Ok(false) => {}
                    Err(reason) => return reason,
                }
            }
        }
    }

    /// The model call's span, after its opening telemetry. Kept (boxed)
    /// only when enabled: a span no subscriber wants would be 40 bytes of
    /// the turn's state for nothing while the model answers.
    fn model_call_span(&self) -> Option<Box<tracing::Span>> {
        let inner = self.inner;
        let span = telemetry::gen_ai_span!(
            DEBUG,
            "model_call",
            model = inner.model.name(),
            step = self.model_calls,
            subagents.model.attempts = tracing::field::Empty,
            subagents.limit.wait_ms = tracing::field::Empty,
        );
        telemetry::chat(&span, inner.model.name());
        (!span.is_disabled()).then(|| Box::new(span))
    }

    /// The model call's request: the conversation so far, the tools, the route.
    fn request(&self, chunks: &Option<ChunkSink>, meter: &CallMeter) -> ModelRequest {
        let inner = self.inner;
        ModelRequest {
            session_id: inner.id.to_string(),
            system: inner.system.clone(),
            messages: inner.session().events().into(),
            tools: inner.tools.visible_specs(),
            options: AgentOptions::clone(&inner.options),
            chunks: chunks.clone(),
            meter: meter.clone(),
        }
    }

    /// Records the model's answer (its calls become the open ones); the
    /// turn's end when the answer (or its failure) ends it. A function of
    /// its own so the reply is not part of the turn's state while its
    /// tools run.
    fn take_reply(&mut self, reply: Result<ModelReply, ModelError>, streamed: &Mutex<String>) -> Option<Ending> {
        let reply = match reply {
            Ok(reply) => reply,
            Err(ModelError::Cancelled) => return Some((StopReason::Aborted, None)),
            Err(error) => {
                let streamed = self.inner.lock(streamed).clone();
                if self.output.is_empty() {
                    self.output = streamed;
                }
                let error =
                    TurnError { kind: TurnErrorKind::Model, message: error.to_string(), reason: error.safe_reason() };
                return Some((StopReason::Error, Some(error)));
            }
        };
        if !reply.text.is_empty() {
            self.output.clone_from(&reply.text);
        }
        let calls = reply.tool_calls.clone();
        let assistant = SessionEvent::Assistant { text: reply.text, tool_calls: reply.tool_calls };
        if let Err(error) = self.append(assistant) {
            return Some((StopReason::Error, Some(TurnError::session(&error))));
        }
        self.open_calls = calls;
        stop_reason_of(reply.finish).map(|reason| (reason, None))
    }

    /// Runs the open calls in order, consecutive concurrent ones together.
    /// `Ok(true)` when a tool ended the turn.
    /// The budget's `deadline` ends the turn `Aborted` like a cancel.
    async fn run_tools(
        &mut self,
        cancel: &CancellationToken,
        deadline: Option<std::time::Instant>,
    ) -> Result<bool, Ending> {
        let inner = self.inner;
        let calls = std::mem::take(&mut self.open_calls);
        let mut ended_by: Option<String> = None;
        let mut index = 0;
        while index < calls.len() {
            if cancel.is_cancelled() {
                self.open_calls = calls[index..].to_vec();
                return Err((StopReason::Aborted, None));
            }
            if let Some(ender) = &ended_by {
                let denied = ToolOutput::error(format!("not run: {ender:?} already ended the turn"));
                self.record_result(&calls[index], denied)
                    .map_err(|e| (StopReason::Error, Some(TurnError::session(&e))))?;
                index += 1;
                continue;
            }
            let mut batch_end = index + 1;
            if inner.tools.concurrent(&calls[index].name) {
                while batch_end < calls.len() && inner.tools.concurrent(&calls[batch_end].name) {
                    batch_end += 1;
                }
            }
            let batch = &calls[index..batch_end];
            for call in batch {
                self.update(AgentUpdate::ToolCall {
                    id: call.id.clone(),
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                });
            }
            let runs = batch.iter().map(|call| {
                let context = ToolContext {
                    agent: Agent { inner: inner.clone() },
                    session_id: inner.id.clone(),
                    cwd: inner.cwd.clone(),
                    call_id: call.id.clone(),
                    cancel: cancel.clone(),
                };
                let span = telemetry::gen_ai_span!(DEBUG, "tool_call", tool = %call.name, call_id = %call.id,);
                telemetry::execute_tool(&span, &call.name, &call.id);
                inner.tools.execute(call, context).instrument(span)
            });
            let outputs = tokio::select! {
                biased;
                _ = cancel.cancelled() => {
                    self.open_calls = calls[index..].to_vec();
                    return Err((StopReason::Aborted, None));
                }
                () = until(deadline) => {
                    self.open_calls = calls[index..].to_vec();
                    return Err((StopReason::Aborted, None));
                }
                outputs = join_all(runs) => outputs,
            };
            for (call, output) in batch.iter().zip(outputs) {
                if output.ends_turn && ended_by.is_none() {
                    ended_by = Some(call.name.clone());
                }
                self.record_result(call, output).map_err(|e| (StopReason::Error, Some(TurnError::session(&e))))?;
            }
            index = batch_end;
        }
        Ok(ended_by.is_some())
    }

    fn record_result(&mut self, call: &ToolCall, output: ToolOutput) -> Result<(), SessionError> {
        self.update(AgentUpdate::ToolResult {
            id: call.id.clone(),
            name: call.name.clone(),
            is_error: output.is_error,
        });
        self.append(SessionEvent::ToolResult {
            call_id: call.id.clone(),
            name: call.name.clone(),
            content: output.content,
            is_error: output.is_error,
        })
    }

    /// Closes the turn: results for calls that never ran, then the turn end.
    fn end(&mut self, reason: StopReason, mut error: Option<TurnError>) -> TurnOutcome {
        self.ended = true;
        let inner = self.inner;
        let unanswered = std::mem::take(&mut self.open_calls);
        for call in &unanswered {
            self.update(AgentUpdate::ToolResult { id: call.id.clone(), name: call.name.clone(), is_error: true });
        }
        {
            let mut session = inner.session();
            for call in unanswered {
                let content = format!("not run: the turn ended ({reason})");
                let result = SessionEvent::ToolResult { call_id: call.id, name: call.name, content, is_error: true };
                if let Err(e) = session.append(result) {
                    error.get_or_insert(TurnError::session(&e));
                }
            }
            let duration_ms = Some(self.started.elapsed().as_millis().try_into().unwrap_or(u64::MAX));
            let closed = session.append(SessionEvent::TurnEnd { reason, duration_ms, usage: Some(self.usage) });
            if let Err(e) = closed {
                tracing::warn!(session = %inner.id, error = %e, "could not persist a turn end");
                error.get_or_insert(TurnError::session(&e));
            }
        }
        self.update(AgentUpdate::TurnEnd(reason));
        TurnOutcome {
            stop_reason: reason,
            output: std::mem::take(&mut self.output),
            error,
            model_calls: self.model_calls,
            usage: self.usage,
        }
    }

    fn append(&self, event: SessionEvent) -> Result<(), SessionError> {
        self.inner.session().append(event)
    }

    fn update(&self, update: AgentUpdate) {
        if let Some(sink) = &self.inner.on_update {
            sink(&update);
        }
    }

    /// Streamed text is kept (the output of a turn that fails mid-stream)
    /// and forwarded to the update sink.
    fn chunk_sink(&self, streamed: &Arc<Mutex<String>>) -> Option<ChunkSink> {
        let streamed = streamed.clone();
        let updates = self.inner.on_update.clone();
        Some(Arc::new(move |chunk: &str| {
            streamed.lock().unwrap_or_else(|e| e.into_inner()).push_str(chunk);
            if let Some(sink) = &updates {
                sink(&AgentUpdate::Text(chunk.to_owned()));
            }
        }))
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.end(StopReason::Aborted, None);
        }
    }
}

/// The model call's closing telemetry.
fn chat_ended(span: Option<Box<tracing::Span>>, reply: &Result<ModelReply, ModelError>) {
    let span = span.map_or_else(tracing::Span::none, |span| *span);
    match reply {
        Ok(reply) => telemetry::chat_answered(
            &span,
            reply.finish.convention_name(),
            reply.usage.as_ref().map(|usage| (usage.input_tokens, usage.output_tokens)),
        ),
        Err(error) => telemetry::chat_failed(&span, error.kind()),
    }
}

/// `future` polled (and dropped) inside `span`, if there is one: what
/// `Instrument` does, holding a reference to the span where `Instrument`
/// holds a copy of it.
fn in_span<F: std::future::Future + Unpin>(span: Option<&tracing::Span>, future: F) -> InSpan<'_, F> {
    InSpan { span, future: Some(future) }
}

struct InSpan<'a, F> {
    span: Option<&'a tracing::Span>,
    /// `None` once dropped (inside the span).
    future: Option<F>,
}

impl<F: std::future::Future + Unpin> std::future::Future for InSpan<'_, F> {
    type Output = F::Output;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<F::Output> {
        let this = &mut *self;
        let _entered = this.span.map(tracing::Span::enter);
        let future = this.future.as_mut().expect("an InSpan is not polled after it resolved");
        std::pin::Pin::new(future).poll(cx)
    }
}

impl<F> Drop for InSpan<'_, F> {
    fn drop(&mut self) {
        let _entered = self.span.map(tracing::Span::enter);
        drop(self.future.take());
    }
}

/// Resolves at `deadline`, never without one. The timer is boxed: a turn
/// without a deadline (most) holds no timer's room in its state.
fn until(deadline: Option<std::time::Instant>) -> impl std::future::Future<Output = ()> {
    let timer = deadline.map(|deadline| Box::pin(tokio::time::sleep_until(deadline.into())));
    async move {
        match timer {
            Some(timer) => timer.await,
            None => std::future::pending().await,
        }
    }
}

/// The turn's end when the model itself stopped short.
fn stop_reason_of(finish: Finish) -> Option<StopReason> {
    match finish {
        Finish::MaxTokens => Some(StopReason::MaxTokens),
        Finish::Refusal => Some(StopReason::Refusal),
        Finish::Stop | Finish::ToolCalls => None,
    }
}
