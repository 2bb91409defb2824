//! The run actor: owns one child from launch to quiescence.
//!
//! Life of a run, every transition in [`RunActor`]'s methods:
//!
//! ```text
//! Starting ──launch ok──▶ Running ──child finished──▶ Settled
//!    │                       │ cancel                    │
//!    │ launch failed         ▼                           │
//!    │ or cancelled      Cancelling ──finished/grace──▶ Settled
//!    ▼                       │                           │
//!  (stops; start rejects)    └──────── Dispose ──────────┴──▶ Disposing ──▶ Disposed (actor stops)
//! ```
//!
//! Long work — the launch, the child's run, its dispose hook — runs as
//! futures spawned in the actor's context, so `Cancel` and `Dispose` never
//! wait behind it. Every provider future is wrapped by [`contained`]: a
//! panic becomes a settled `Error` (or a rejected start) with a safe
//! diagnostic. What the actor owes its callers (start reply, result,
//! quiescence) is paid from `Drop`, so it is paid even if the actor dies.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Instant;

use actix::prelude::*;
use futures_util::future::LocalBoxFuture;
use futures_util::FutureExt;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span};

use super::control::{Control, SendMessage};
use super::core::poll_in_runtime;
use super::core::Core;
use super::entry::ProviderRunLease;
use super::run_shared::{CaptureStructured, RunShared};
use crate::contain::{contained, contained_call};
use crate::live::ActorLease;
use crate::seam::{
    Admission, CaptureError, Category, Child, Diagnostic, Failure, Launch, LaunchError, LocalAgent, RunResult, Stage,
    StopReason, SubagentError,
};
use crate::telemetry;

/// A provider future the actor can drop on the spot, wherever it was
/// spawned: `ctx.cancel_future` and `ctx.stop()` drop spawned futures only
/// later, after the actor itself, and quiescence must not be announced
/// while a child's future (and what it holds) still exists.
struct Slot<T>(Rc<RefCell<Option<LocalBoxFuture<'static, T>>>>);

impl<T> Slot<T> {
    fn empty() -> Self {
        Slot(Rc::new(RefCell::new(None)))
    }

    /// Put `future` in the slot; the returned future polls it from there,
    /// inside the run's span.
    fn hold(&self, runtime: u64, span: &Span, future: LocalBoxFuture<'static, T>) -> Held<T> {
        *self.0.borrow_mut() = Some(future);
        Held { slot: self.0.clone(), runtime, span: span.clone() }
    }

    /// Drop the held future now.
    fn clear(&self) {
        let taken = self.0.borrow_mut().take();
        drop(taken);
    }
}

/// Resolves with the held future's output, or `None` once it was cleared.
/// A child's futures are polled as tasks of the runtime `runtime` (a child
/// that delegates starts its runs in place) and inside the run's `span`, so
/// whatever the provider logs (a model call, a tool call, a bad protocol
/// line) says which run it belongs to.
struct Held<T> {
    slot: Rc<RefCell<Option<LocalBoxFuture<'static, T>>>>,
    runtime: u64,
    span: Span,
}

impl<T> Future for Held<T> {
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<T>> {
        let _entered = self.span.enter();
        let mut slot = self.slot.borrow_mut();
        let Some(future) = slot.as_mut() else {
            return Poll::Ready(None);
        };
        let outcome = std::task::ready!(poll_in_runtime(self.runtime, || future.as_mut().poll(cx)));
        *slot = None;
        Poll::Ready(Some(outcome))
    }
}

type LaunchOutcome = Result<Result<Box<dyn Child>, LaunchError>, String>;

/// What the start path learns when a child is published.
pub(crate) struct Published {
    pub id: String,
    pub local_agent: Option<LocalAgent>,
    pub steering: bool,
    pub continuation: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RunState {
    /// The provider is creating the child.
    Starting,
    /// The child is working.
    Running,
    /// Cancel requested; waiting (at most the cancel grace) for the child.
    Cancelling,
    /// The result is settled; the child awaits dispose.
    Settled,
    /// Dispose requested; waiting (at most the cancel grace) for the child's run to end.
    DisposingAwaitRun,
    /// The child's dispose hook is running.
    DisposingRelease,
    /// Done; the actor is stopping.
    Disposed,
}

/// A child's dispose hook outcome, `Err` holding a contained panic.
type HookOutcome = Result<Result<(), Failure>, String>;

/// Everything a run actor is created with.
pub(crate) struct RunSpawn {
    pub core: Arc<Core>,
    pub shared: Arc<RunShared>,
    pub launch: Box<Launch>,
    pub publish: oneshot::Sender<Result<Published, SubagentError>>,
    /// The child's place in its delegation budget, held until quiescence
    /// (boxed: the actor lives inline in its task, and most runs have none).
    pub admission: Option<Box<Admission>>,
}

pub(crate) struct RunActor {
    state: RunState,
    /// `run{run_id, provider, parent, depth, label}`: entered while the child's
    /// futures are polled, and the parent of what the actor itself logs.
    span: Span,
    core: Arc<Core>,
    shared: Arc<RunShared>,
    child_id: String,
    token: CancellationToken,
    /// Boxed: the actor lives inline in its task, and a launch is large.
    launch: Option<Box<Launch>>,
    child: Option<Box<dyn Child>>,
    launching: Slot<LaunchOutcome>,
    running: Slot<Result<RunResult, String>>,
    releasing: Slot<HookOutcome>,
    publish: Option<oneshot::Sender<Result<Published, SubagentError>>>,
    start_failure: Option<SubagentError>,
    dispose_outcome: Result<(), SubagentError>,
    leases: Option<(ActorLease, ProviderRunLease)>,
    /// The child's place in its delegation budget (width until quiescence;
    /// the run itself is given back if the start is refused).
    admission: Option<Box<Admission>>,
    /// The structured result the child captured, if any.
    structured: Option<serde_json::Value>,
    /// When the actor was created: the lifecycle lines' duration.
    began: Instant,
}

impl RunActor {
    pub(crate) fn new(spawn: RunSpawn) -> Self {
        let leases = (ActorLease::run(spawn.core.live()), ProviderRunLease::new(spawn.shared.entry.clone()));
        // At WARN, so it is enabled whenever warnings are: a warning from
        // inside a run always says which run wrote it.
        let span = tracing::warn_span!(
            "run",
            run_id = spawn.shared.run_id,
            provider = spawn.shared.provider(),
            parent = spawn.shared.parent_session.as_deref(),
            depth = spawn.launch.request.child_depth(),
            label = tracing::field::Empty,
            otel.name = tracing::field::Empty,
            otel.kind = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
            gen_ai.operation.name = tracing::field::Empty,
            gen_ai.agent.name = tracing::field::Empty,
            gen_ai.agent.id = tracing::field::Empty,
            gen_ai.conversation.id = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        // A label may be the model's words: never on a span that is exported.
        if let Some(label) = spawn.launch.request.label.as_deref().filter(|_| !telemetry::records_gen_ai()) {
            span.record("label", label);
        }
        let provider = &spawn.shared.entry.provider;
        telemetry::invoke_agent(&span, provider.name(), spawn.shared.run_id, provider.runs_out_of_process());
        RunActor {
            state: RunState::Starting,
            span,
            token: spawn.launch.cancel.clone(),
            core: spawn.core,
            shared: spawn.shared,
            child_id: String::new(),
            launch: Some(spawn.launch),
            child: None,
            launching: Slot::empty(),
            running: Slot::empty(),
            releasing: Slot::empty(),
            publish: Some(spawn.publish),
            start_failure: None,
            dispose_outcome: Ok(()),
            leases: Some(leases),
            admission: spawn.admission,
            structured: None,
            began: Instant::now(),
        }
    }

    fn provider(&self) -> &str {
        self.shared.provider()
    }

    fn diagnostic(&self, stage: Stage, category: Category) -> Diagnostic {
        Diagnostic::new(self.provider(), stage, category)
    }

    fn on_launched(&mut self, outcome: LaunchOutcome, ctx: &mut Context<Self>) {
        if self.state != RunState::Starting {
            return;
        }
        let child = match outcome {
            Ok(Ok(child)) => child,
            Ok(Err(error)) => return self.reject(self.launch_error(error), ctx),
            Err(panic) => {
                tracing::error!(parent: &self.span, %panic, "provider launch panicked");
                let diagnostic = self.diagnostic(Stage::Initialize, Category::Panicked);
                let provider = self.provider().to_owned();
                return self.reject(SubagentError::StartupFailed { provider, diagnostic }, ctx);
            }
        };
        if self.token.is_cancelled() {
            // Cancelled between creation and publication: dispose, then reject.
            self.start_failure = Some(SubagentError::Aborted { provider: self.provider().to_owned() });
            self.child = Some(child);
            self.state = RunState::DisposingAwaitRun;
            return self.release_child(ctx);
        }
        self.child_id = child.id();
        tracing::debug!(parent: &self.span, child = %self.child_id, "run started");
        let local_agent = child.local_agent();
        if let Some(agent) = &local_agent {
            telemetry::conversation(&self.span, agent.session_id());
            // Before the child runs: it may delegate at once.
            self.shared.set_family(self.core.open_family(agent.session_id()));
        }
        let published = Published {
            id: self.child_id.clone(),
            local_agent,
            steering: child.supports_steering(),
            continuation: child.supports_continuation(),
        };
        let run = self.running.hold(self.core.id(), &self.span, contained(|| child.run()));
        self.child = Some(child);
        self.state = RunState::Running;
        self.drive(run, ctx, |actor, outcome, ctx| {
            if let Some(outcome) = outcome {
                actor.on_run_finished(outcome, ctx)
            }
        });
        let delivered = self.publish.take().is_some_and(|publish| publish.send(Ok(published)).is_ok());
        if !delivered {
            // The caller gave up on `start`: nobody owns this run, so release it.
            self.begin_dispose(ctx);
        }
    }

    /// Poll `held` once inline — a provider future that is done at once
    /// needs no spawned future — else spawn it. `done` gets its output, or
    /// `None` when the slot was cleared first.
    fn drive<T: 'static>(
        &mut self,
        mut held: Held<T>,
        ctx: &mut Context<Self>,
        done: fn(&mut Self, Option<T>, &mut Context<Self>),
    ) {
        match (&mut held).now_or_never() {
            Some(outcome) => done(self, outcome, ctx),
            None => {
                ctx.spawn(held.into_actor(self).map(move |outcome, actor, ctx| done(actor, outcome, ctx)));
            }
        }
    }

    fn launch_error(&self, error: LaunchError) -> SubagentError {
        let provider = self.provider().to_owned();
        match error {
            LaunchError::Aborted => SubagentError::Aborted { provider },
            LaunchError::Failed { stage, category } => {
                SubagentError::StartupFailed { diagnostic: self.diagnostic(stage, category), provider }
            }
            LaunchError::Diagnosed(diagnostic) => SubagentError::StartupFailed { diagnostic, provider },
            LaunchError::Invalid { field, reason } => SubagentError::InvalidRequest { field, reason },
        }
    }

    /// The start fails: stop now; `Drop` replies once everything is released.
    fn reject(&mut self, error: SubagentError, ctx: &mut Context<Self>) {
        tracing::debug!(parent: &self.span, %error, duration = ?self.began.elapsed(), "run refused");
        telemetry::run_failed(&self.span, error.code());
        self.start_failure = Some(error);
        self.state = RunState::Disposed;
        ctx.stop();
    }

    fn on_cancelled(&mut self, ctx: &mut Context<Self>) {
        let grace = self.core.config().cancel_grace;
        match self.state {
            RunState::Starting => {
                // A provider that ignores its token is abandoned after the grace.
                ctx.run_later(grace, |actor, ctx| {
                    if actor.state == RunState::Starting {
                        tracing::warn!(parent: &actor.span, "launch ignored cancellation; abandoned");
                        let provider = actor.provider().to_owned();
                        actor.reject(SubagentError::Aborted { provider }, ctx);
                    }
                });
            }
            RunState::Running => {
                self.state = RunState::Cancelling;
                self.cancel_child();
                ctx.run_later(grace, |actor, _ctx| {
                    if actor.state == RunState::Cancelling {
                        actor.state = RunState::Settled;
                        actor.settle(RunResult::empty(StopReason::Aborted));
                    }
                });
            }
            _ => {}
        }
    }

    fn cancel_child(&self) {
        if let Some(child) = &self.child {
            if let Err(panic) = contained_call(|| child.cancel()) {
                tracing::error!(parent: &self.span, %panic, "child cancel panicked");
            }
        }
    }

    fn on_run_finished(&mut self, outcome: Result<RunResult, String>, ctx: &mut Context<Self>) {
        let result = outcome.unwrap_or_else(|panic| {
            tracing::error!(parent: &self.span, %panic, "child run panicked");
            RunResult::failed(self.diagnostic(Stage::SessionRun, Category::Panicked))
        });
        match self.state {
            RunState::Running | RunState::Cancelling => {
                self.state = RunState::Settled;
                self.settle(result);
            }
            RunState::DisposingAwaitRun => {
                self.settle(result);
                self.release_child(ctx);
            }
            _ => {}
        }
    }

    /// Deliver the result (only the first call counts). A cancelled run
    /// that did not complete is `Aborted`.
    fn settle(&mut self, mut result: RunResult) {
        if self.token.is_cancelled() && result.stop_reason != StopReason::Completed {
            result.stop_reason = StopReason::Aborted;
        }
        if result.stop_reason == StopReason::Completed && result.structured.is_none() {
            result.structured = self.structured.take();
        }
        if self.shared.settled().is_none() {
            self.log_end(result.stop_reason);
            telemetry::run_ended(&self.span, &result);
        }
        self.shared.settle(Ok(result), &self.child_id);
    }

    /// The run's end line (`RUST_LOG=subagents=debug`), once, as it settles.
    fn log_end(&self, stop_reason: StopReason) {
        let duration = self.began.elapsed();
        tracing::debug!(parent: &self.span, child = %self.child_id, stop_reason = stop_reason.as_str(), ?duration, "run ended");
    }

    fn begin_dispose(&mut self, ctx: &mut Context<Self>) {
        match self.state {
            RunState::Starting => self.token.cancel(),
            RunState::Running | RunState::Cancelling => {
                let was_running = self.state == RunState::Running;
                self.state = RunState::DisposingAwaitRun;
                self.token.cancel();
                if was_running {
                    self.cancel_child();
                }
                ctx.run_later(self.core.config().cancel_grace, |actor, ctx| actor.release_child(ctx));
            }
            RunState::Settled => {
                self.state = RunState::DisposingAwaitRun;
                self.token.cancel();
                self.release_child(ctx);
            }
            RunState::DisposingAwaitRun | RunState::DisposingRelease | RunState::Disposed => {}
        }
    }

    /// Stop waiting for the child's run and call its dispose hook (bounded).
    fn release_child(&mut self, ctx: &mut Context<Self>) {
        if self.state != RunState::DisposingAwaitRun {
            return;
        }
        self.state = RunState::DisposingRelease;
        self.running.clear();
        self.settle(RunResult::empty(StopReason::Aborted));
        let Some(child) = &self.child else {
            self.state = RunState::Disposed;
            return ctx.stop();
        };
        let mut hook = self.releasing.hold(self.core.id(), &self.span, contained(|| child.dispose()));
        // A hook that is done at once needs no timer and no spawned future.
        if let Some(outcome) = (&mut hook).now_or_never() {
            return self.on_released(outcome, ctx);
        }
        // Unlike launch and run, the hook is bounded: `drive` cannot serve.
        let bounded = tokio::time::timeout(self.core.config().dispose_timeout, hook);
        ctx.spawn(bounded.into_actor(self).map(|outcome, actor, ctx| {
            // A hook that outlived its bound is dropped before the actor stops.
            actor.releasing.clear();
            actor.on_released(outcome.ok().flatten(), ctx)
        }));
    }

    /// The dispose hook finished (`None`: it timed out); stop.
    fn on_released(&mut self, outcome: Option<HookOutcome>, ctx: &mut Context<Self>) {
        let failure = match outcome {
            Some(Ok(Ok(()))) => None,
            Some(Ok(Err(failure))) => Some(self.diagnostic(failure.stage, failure.category)),
            Some(Err(panic)) => {
                tracing::error!(parent: &self.span, %panic, "child dispose panicked");
                Some(self.diagnostic(Stage::Dispose, Category::Panicked))
            }
            None => Some(self.diagnostic(Stage::Dispose, Category::TimedOut)),
        };
        if let Some(diagnostic) = failure {
            tracing::warn!(parent: &self.span, %diagnostic, "child did not dispose cleanly");
            self.dispose_outcome =
                Err(SubagentError::DisposeFailed { provider: self.provider().to_owned(), diagnostic });
        }
        self.state = RunState::Disposed;
        ctx.stop();
    }
}

impl Actor for RunActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let Some(launch) = self.launch.take() else { return };
        self.shared.bind_capture(ctx.address().downgrade().recipient());
        let provider = self.shared.entry.provider.clone();
        let launching = self.launching.hold(self.core.id(), &self.span, contained(move || provider.launch(*launch)));
        self.drive(launching, ctx, |actor, outcome, ctx| {
            if let Some(outcome) = outcome {
                actor.on_launched(outcome, ctx)
            }
        });
        // Watch the token only while there is something to cancel: a run
        // that settled inline is cancelled, if ever, by its dispose.
        if matches!(self.state, RunState::Starting | RunState::Running) {
            let watcher =
                self.token.clone().cancelled_owned().into_actor(self).map(|(), actor, ctx| actor.on_cancelled(ctx));
            ctx.spawn(watcher);
        }
    }
}

impl Drop for RunActor {
    fn drop(&mut self) {
        // Release the counters first: whoever wakes on the signals below must
        // already see this run gone.
        self.core.remove_run(self.shared.run_id);
        self.launching.clear();
        self.running.clear();
        self.releasing.clear();
        if let Some(child) = self.child.take() {
            match contained_call(|| child.stop_report()) {
                Ok(report) => self.shared.set_stop_report(report),
                Err(panic) => tracing::error!(parent: &self.span, %panic, "child stop report panicked"),
            }
        }
        if let Some(family) = self.shared.family() {
            self.core.close_family(family);
        }
        drop(self.leases.take());
        if let Some(mut admission) = self.admission.take() {
            if self.publish.is_some() {
                // A refused start never had a child: its run goes back to the budget.
                admission.refund_run();
            }
        }
        if let Some(publish) = self.publish.take() {
            // A rejected start settles nothing and emits nothing.
            let error = self.start_failure.take().unwrap_or(SubagentError::RuntimeStopped);
            let _ = publish.send(Err(error));
        } else {
            if self.shared.settled().is_none() {
                self.log_end(StopReason::Error);
                telemetry::run_failed(&self.span, SubagentError::RuntimeStopped.code());
            }
            self.shared.settle(Err(SubagentError::RuntimeStopped), &self.child_id);
        }
        self.shared.set_quiescent(std::mem::replace(&mut self.dispose_outcome, Ok(())));
    }
}

impl Handler<Control> for RunActor {
    type Result = ();

    fn handle(&mut self, msg: Control, ctx: &mut Context<Self>) {
        match msg {
            Control::Dispose => self.begin_dispose(ctx),
            Control::ForceStop => {
                self.token.cancel();
                if self.state != RunState::Starting {
                    self.settle(RunResult::empty(StopReason::Aborted));
                }
                if self.state != RunState::Disposed {
                    self.dispose_outcome = Err(SubagentError::DisposeFailed {
                        provider: self.provider().to_owned(),
                        diagnostic: self.diagnostic(Stage::Shutdown, Category::TimedOut),
                    });
                }
                self.state = RunState::Disposed;
                ctx.stop();
            }
        }
    }
}

impl Handler<SendMessage> for RunActor {
    type Result = ResponseFuture<Result<(), SubagentError>>;

    fn handle(&mut self, msg: SendMessage, _ctx: &mut Context<Self>) -> Self::Result {
        let child = match (&self.state, &self.child) {
            (RunState::Running, Some(child)) => child,
            _ => return Box::pin(async { Err(SubagentError::invalid("message", "the run is no longer running")) }),
        };
        let provider = self.provider().to_owned();
        let delivery = contained(|| child.send_message(msg.0)).instrument(self.span.clone());
        Box::pin(async move {
            delivery.await.unwrap_or_else(|panic| {
                tracing::error!(%provider, %panic, "child send_message panicked"); // inside the run's span
                Err(SubagentError::invalid("message", "the child failed to take the message"))
            })
        })
    }
}

impl Handler<CaptureStructured> for RunActor {
    type Result = Result<(), CaptureError>;

    fn handle(&mut self, msg: CaptureStructured, _ctx: &mut Context<Self>) -> Self::Result {
        match self.state {
            RunState::Running if self.structured.is_none() => {
                self.structured = Some(msg.0);
                Ok(())
            }
            RunState::Running => Err(CaptureError::AlreadyCaptured),
            _ => Err(CaptureError::NotRunning),
        }
    }
}
