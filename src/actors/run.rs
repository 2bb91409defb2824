//! The run actor: owns one child from launch to quiescence.
//!
//! Life of a run, every transition in [`RunActor`]'s methods; each
//! `Phase` owns what only it has, the child from `Running` on:
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
//! The actor is made on the start path ([`RunActor::spawn`]), which hands
//! the provider its launch there and then: a launch and a run that are done
//! at once (a mock's, a scripted model's first reply) are published and
//! settled before the actor's task is first polled, so a whole lifecycle
//! costs the caller two task switches (to the actor at dispose, and back).
//! Long work — the launch, the child's run, its dispose hook — runs as
//! futures spawned in the actor's context, so `Cancel` and `Dispose` never
//! wait behind it. Every provider future is wrapped by [`contained`]: a
//! panic becomes a settled `Error` (or a rejected start) with a safe
//! diagnostic. What the actor owes its callers (start reply, result,
//! quiescence) is paid from `Drop`, so it is paid even if the actor dies.

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use futures_util::future::BoxFuture;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span};

use super::control::{CaptureStructured, Control, Mailbox, RunControl, SendMessage};
use super::core::Core;
use super::entry::ProviderRunLease;
use super::run_shared::{RunShared, Settlement};
use super::slot::{Held, Slot};
use crate::contain::{contained, contained_call, Panicked};
use crate::live::ActorLease;
use crate::seam::{
    Admission, BudgetLease, CaptureError, Category, Child, Diagnostic, DisposeError, Failure, Hop, Launch, LaunchError,
    LocalAgent, ProviderContext, RunResult, Stage, StartError, StartRequest, SteeringError, StopReason, SubagentError,
};
use crate::telemetry;

/// A provider's launch outcome, `Err` holding a contained panic.
type LaunchOutcome = Result<Result<Box<dyn Child>, LaunchError>, Panicked>;

/// A child's run outcome, `Err` holding a contained panic.
type RunOutcome = Result<Settlement, Panicked>;

/// A child's dispose hook outcome, `Err` holding a contained panic.
type HookOutcome = Result<Result<(), Failure>, Panicked>;

/// What the start path learns when a child is published.
pub(crate) struct Published {
    pub local_agent: Option<LocalAgent>,
    pub steering: bool,
    pub continuation: bool,
}

/// What a running child captured (boxed: a run actor lives inline in its
/// task, and most children capture nothing).
type Captured = Option<Box<serde_json::Value>>;

/// Where a run is in its life. Each phase owns what only it has: there is
/// a child from `Running` on, a capture only while the result is unsettled,
/// a dispose outcome only once `Disposed`.
enum Phase {
    /// The provider is creating the child.
    Starting,
    /// The child is working; `structured` is what it captured, if anything.
    Running { child: Box<dyn Child>, structured: Captured },
    /// Cancel requested; waiting (at most the cancel grace) for the child.
    Cancelling { child: Box<dyn Child>, structured: Captured },
    /// The result is settled; the child awaits dispose.
    Settled { child: Box<dyn Child> },
    /// Dispose requested; waiting (at most the cancel grace) for the child's run to end.
    DisposingAwaitRun { child: Box<dyn Child>, structured: Captured },
    /// The child's dispose hook is running.
    DisposingRelease { child: Box<dyn Child> },
    /// Done; the actor is stopping. `outcome` is how the release went; the
    /// child, when there was one, gives its stop report in `Drop`.
    Disposed { child: Option<Box<dyn Child>>, outcome: Result<(), Box<DisposeError>> },
}

impl Phase {
    fn child(&self) -> Option<&dyn Child> {
        match self {
            Phase::Running { child, .. }
            | Phase::Cancelling { child, .. }
            | Phase::Settled { child }
            | Phase::DisposingAwaitRun { child, .. }
            | Phase::DisposingRelease { child } => Some(&**child),
            Phase::Disposed { child, .. } => child.as_deref(),
            Phase::Starting => None,
        }
    }

    /// What is left at the end of the line: the child, if one was created,
    /// and how its release went (`Disposed` knows already; else `outcome`).
    fn into_remains(self, outcome: Result<(), DisposeError>) -> (Option<Box<dyn Child>>, Result<(), DisposeError>) {
        match self {
            Phase::Disposed { child, outcome } => (child, outcome.map_err(|error| *error)),
            Phase::Running { child, .. }
            | Phase::Cancelling { child, .. }
            | Phase::Settled { child }
            | Phase::DisposingAwaitRun { child, .. }
            | Phase::DisposingRelease { child } => (Some(child), outcome),
            Phase::Starting => (None, outcome),
        }
    }
}

/// Where the start path waits for a publication.
type PublishReply = oneshot::Sender<Result<Published, StartError>>;

/// What the caller of `start` is owed (a refusal boxed: the actor lives
/// inline in its task, whose allocation is kept small). Unless the run was published, the
/// reply is sent from `Drop`, once everything the start made is released.
enum StartReply {
    /// The start path is making the actor: a publication goes back to it
    /// by return; anything else makes it wait for a reply (`attach`).
    Creating,
    /// Nothing published yet: a run that ends now refuses `RUNTIME_STOPPED`.
    Awaited(PublishReply),
    /// The start is refused with this error (told once a reply is attached).
    Refused(Option<PublishReply>, Box<StartError>),
    /// The run was handed to the caller (who may have stopped waiting).
    Published,
}

impl StartReply {
    /// Hand the run to the caller; false when nobody waits for it any more.
    fn publish(&mut self, published: Published) -> bool {
        match std::mem::replace(self, StartReply::Published) {
            StartReply::Awaited(reply) => reply.send(Ok(published)).is_ok(),
            earlier => {
                *self = earlier;
                false
            }
        }
    }

    /// Refuse the start with `error` (the last refusal is the one told).
    fn refuse(&mut self, error: StartError) {
        let reply = match std::mem::replace(self, StartReply::Published) {
            StartReply::Creating | StartReply::Refused(None, _) => None,
            StartReply::Awaited(reply) | StartReply::Refused(Some(reply), _) => Some(reply),
            StartReply::Published => return,
        };
        *self = StartReply::Refused(reply, Box::new(error));
    }

    /// The start path waits on `reply` for what the actor has to say.
    fn attach(&mut self, reply: PublishReply) {
        *self = match std::mem::replace(self, StartReply::Published) {
            StartReply::Refused(None, error) => StartReply::Refused(Some(reply), error),
            _ => StartReply::Awaited(reply),
        };
    }
}

/// Everything a run actor is created with.
pub(crate) struct RunSpawn {
    pub core: Arc<Core>,
    pub shared: Arc<RunShared>,
    pub request: Box<StartRequest>,
    /// The run's own token (a child of the request's signal).
    pub token: CancellationToken,
    pub depth: u32,
    /// The lease the child holds in its delegation budget, if any.
    pub budget: Option<BudgetLease>,
    /// The child's place in its delegation budget, held until quiescence
    /// (boxed: the actor lives inline in its task, and most runs have none).
    pub admission: Option<Box<Admission>>,
}

/// How the start path learns that its run was published.
pub(crate) enum Launched {
    /// The child was created and published while the actor was being made.
    Now(Published),
    /// The launch waits, or failed: the actor answers here.
    Later(oneshot::Receiver<Result<Published, StartError>>),
}

pub(crate) struct RunActor {
    phase: Phase,
    /// `run{run_id, provider, parent, depth, label}`: entered while the child's
    /// futures are polled, and the parent of what the actor itself logs.
    span: Span,
    core: Arc<Core>,
    shared: Arc<RunShared>,
    token: CancellationToken,
    launching: Slot<LaunchOutcome>,
    running: Slot<RunOutcome>,
    releasing: Slot<HookOutcome>,
    start_reply: StartReply,
    /// Released first in `Drop`, before the signals that wake anybody.
    leases: Option<(ActorLease, ProviderRunLease)>,
    /// The child's place in its delegation budget (width until quiescence;
    /// the run itself is given back if the start is refused).
    admission: Option<Box<Admission>>,
    /// When the actor was created, if its debug lines are on then: their
    /// duration (a run made while they were off says zero). Reading the
    /// clock twice was 2% of a mock run's time.
    began: Option<Instant>,
}

impl RunActor {
    /// Makes the run's actor on this worker and hands the provider its
    /// launch at once; the run is in the run table when this returns.
    pub(crate) fn spawn(spawn: RunSpawn) -> (Arc<RunControl>, Launched) {
        // The context by hand, not `Actor::create`: that makes a second
        // address to return (two allocations), and the run has its own.
        let mut ctx = Context::new();
        let control = Arc::new(RunControl {
            token: spawn.token.clone(),
            depth: spawn.depth,
            shared: spawn.shared.clone(),
            mailbox: ctx.address(),
        });
        spawn.core.insert_run(spawn.shared.run_id, control.clone());
        // The parent's route to its approver, else the runtime's, with
        // this run on the end of its path. A route that reaches no one
        // needs no path (its requests are rejected unseen): most runs pay
        // nothing here.
        let route = spawn.request.parent.approvals.clone().unwrap_or_else(|| spawn.core.approvals());
        let approvals = match route.has_approver() {
            true => route.under(Hop {
                provider: spawn.shared.provider().to_owned(),
                label: spawn.request.label.clone(),
                depth: spawn.request.child_depth(),
            }),
            false => route,
        };
        let context = ProviderContext {
            run: control.clone(),
            home: spawn.core.home().clone(),
            live: spawn.core.live().clone(),
            budget: spawn.budget,
            approvals,
        };
        let mut actor = RunActor::new(spawn.core, spawn.shared, &spawn.request, spawn.token.clone(), spawn.admission);
        let launched = match actor.launch(spawn.request, spawn.token, context, &mut ctx) {
            Some(published) => Launched::Now(published),
            None => {
                let (reply, answer) = oneshot::channel();
                actor.start_reply.attach(reply);
                Launched::Later(answer)
            }
        };
        actix::spawn(ctx.into_future(actor));
        (control, launched)
    }

    fn new(
        core: Arc<Core>,
        shared: Arc<RunShared>,
        request: &StartRequest,
        token: CancellationToken,
        admission: Option<Box<Admission>>,
    ) -> Self {
        let leases = (ActorLease::run(core.live()), ProviderRunLease::new(shared.entry.clone()));
        // At WARN, so it is enabled whenever warnings are: a warning from
        // inside a run always says which run wrote it.
        let span = telemetry::gen_ai_span!(
            WARN,
            "run",
            run_id = shared.run_id,
            provider = shared.provider(),
            parent = shared.parent_session.as_deref(),
            depth = request.child_depth(),
            label = tracing::field::Empty,
        );
        // Its parent: the caller's span, or a peer's in another process.
        if let Some(remote) = &request.trace_parent {
            crate::telemetry::adopt_parent(remote, &span);
        }
        // A label may be the model's words: never on a span that is exported.
        if let Some(label) = request.label.as_deref().filter(|_| !telemetry::records_gen_ai()) {
            span.record("label", label);
        }
        let (provider, info) = (&shared.entry.provider, &shared.entry.info);
        let requested = request.agent_options.as_ref().and_then(|options| options.model.as_deref());
        let model = requested.or(info.route_defaults.model.as_deref());
        telemetry::invoke_agent(&span, provider.name(), shared.run_id, provider.runs_out_of_process(), model);
        RunActor {
            token,
            phase: Phase::Starting,
            span,
            core,
            shared,
            launching: Slot::empty(),
            running: Slot::empty(),
            releasing: Slot::empty(),
            start_reply: StartReply::Creating,
            leases: Some(leases),
            admission,
            // The global hint, not `enabled!`: that asks the layers, and a
            // per-layer filter asked then keeps its answer for the next
            // span made on this thread, which it loses (an exporter's).
            began: (tracing::level_filters::LevelFilter::current() >= tracing::Level::DEBUG).then(Instant::now),
        }
    }

    /// Hands the provider its launch (from the start path, before the
    /// actor's task is first polled): `Some` when the child was created at
    /// once and is published now; else the actor answers the start later.
    /// The launch is put together inside the provider's call: moving it
    /// (the whole request) through here would copy hundreds of bytes.
    fn launch(
        &mut self,
        request: Box<StartRequest>,
        cancel: CancellationToken,
        context: ProviderContext,
        ctx: &mut Context<Self>,
    ) -> Option<Published> {
        let provider = self.shared.entry.provider.clone();
        let launch = move || provider.launch(Launch { request: *request, cancel, context });
        let launching = self.launching.hold(self.core.id(), &self.span, contained(launch));
        let published = match launching {
            Ok(outcome) => {
                let published = self.on_launched(outcome, ctx);
                if published.is_some() {
                    self.start_reply = StartReply::Published;
                }
                published
            }
            Err(held) => {
                ctx.spawn(held.into_actor(self).map(|outcome, actor, ctx| {
                    let Some(published) = outcome.and_then(|outcome| actor.on_launched(outcome, ctx)) else {
                        return;
                    };
                    if !actor.start_reply.publish(published) {
                        // The caller gave up on `start`: nobody owns this run, so release it.
                        actor.begin_dispose(ctx);
                    }
                }));
                None
            }
        };
        // Watch the token only while there is something to cancel: a run
        // that settled at once is cancelled, if ever, by its dispose.
        if matches!(self.phase, Phase::Starting | Phase::Running { .. }) {
            let watcher =
                self.token.clone().cancelled_owned().into_actor(self).map(|(), actor, ctx| actor.on_cancelled(ctx));
            ctx.spawn(watcher);
        }
        published
    }

    fn provider(&self) -> &str {
        self.shared.provider()
    }

    fn diagnostic(&self, stage: Stage, category: Category) -> Diagnostic {
        Diagnostic::new(self.provider(), stage, category)
    }

    /// Moves the phase out for a transition, leaving `Starting` (which owns
    /// nothing) until the caller puts the next phase in.
    fn take_phase(&mut self) -> Phase {
        std::mem::replace(&mut self.phase, Phase::Starting)
    }

    /// The provider created the child (or failed to): `Some` with what the
    /// start path publishes when the child runs.
    fn on_launched(&mut self, outcome: LaunchOutcome, ctx: &mut Context<Self>) -> Option<Published> {
        if !matches!(self.phase, Phase::Starting) {
            return None;
        }
        let child = match outcome {
            Ok(Ok(child)) => child,
            Ok(Err(error)) => {
                self.reject(self.launch_error(error), ctx);
                return None;
            }
            Err(panic) => {
                tracing::error!(parent: &self.span, %panic, "provider launch panicked");
                let diagnostic = self.diagnostic(Stage::Initialize, Category::Panicked).with_detail(panic.to_string());
                let provider = self.provider().to_owned();
                self.reject(StartError::StartupFailed { provider, diagnostic }, ctx);
                return None;
            }
        };
        if self.token.is_cancelled() {
            // Cancelled between creation and publication: dispose, then reject.
            self.start_reply.refuse(StartError::Aborted { provider: self.provider().to_owned() });
            self.phase = Phase::DisposingAwaitRun { child, structured: None };
            self.release_child(ctx);
            return None;
        }
        self.shared.set_child_id(child.id());
        tracing::debug!(parent: &self.span, child = %self.shared.child_id(), "run started");
        let local_agent = child.local_agent();
        if let Some(agent) = &local_agent {
            telemetry::conversation(&self.span, agent.session_id());
            // Before the child runs: it may delegate at once.
            self.shared.set_family(self.core.open_family(agent.session_id()));
        }
        let published =
            Published { local_agent, steering: child.supports_steering(), continuation: child.supports_continuation() };
        // The result is boxed as it comes out of the child's future.
        let boxed = |result| -> Settlement { Box::new(Ok(result)) };
        // In the span from the first call: a provider may send its prompt
        // before the future is polled, and the span's context goes with it.
        let run = self.span.in_scope(|| {
            let run = contained(|| futures_util::FutureExt::map(child.run(), boxed));
            self.running.hold(self.core.id(), &self.span, run)
        });
        self.phase = Phase::Running { child, structured: None };
        self.drive(run, ctx, |actor, outcome, ctx| {
            if let Some(outcome) = outcome {
                actor.on_run_finished(outcome, ctx)
            }
        });
        Some(published)
    }

    /// Hand `done` the output of a provider future that was done at once
    /// (`Slot::hold` polled it), else spawn the held future. `done` gets its
    /// output, or `None` when the slot was cleared first.
    fn drive<T: 'static>(
        &mut self,
        held: Result<T, Held<T>>,
        ctx: &mut Context<Self>,
        done: fn(&mut Self, Option<T>, &mut Context<Self>),
    ) {
        match held {
            Ok(outcome) => done(self, Some(outcome), ctx),
            Err(held) => {
                ctx.spawn(held.into_actor(self).map(move |outcome, actor, ctx| done(actor, outcome, ctx)));
            }
        }
    }

    fn launch_error(&self, error: LaunchError) -> StartError {
        let provider = self.provider().to_owned();
        match error {
            LaunchError::Aborted => StartError::Aborted { provider },
            LaunchError::Failed { stage, category } => {
                StartError::StartupFailed { diagnostic: self.diagnostic(stage, category), provider }
            }
            LaunchError::Diagnosed(diagnostic) => StartError::StartupFailed { diagnostic, provider },
            LaunchError::Invalid { field, reason } => StartError::InvalidRequest { field, reason },
        }
    }

    /// The start fails while `Starting` (there is no child yet): stop now;
    /// `Drop` replies once everything is released.
    fn reject(&mut self, error: StartError, ctx: &mut Context<Self>) {
        tracing::debug!(parent: &self.span, %error, duration = ?self.age(), "run refused");
        telemetry::run_failed(&self.span, error.code());
        self.start_reply.refuse(error);
        self.phase = Phase::Disposed { child: None, outcome: Ok(()) };
        ctx.stop();
    }

    fn on_cancelled(&mut self, ctx: &mut Context<Self>) {
        let grace = self.core.config().cancel_grace;
        match self.take_phase() {
            Phase::Starting => {
                self.phase = Phase::Starting;
                // A provider that ignores its token is abandoned after the grace.
                ctx.run_later(grace, |actor, ctx| {
                    if matches!(actor.phase, Phase::Starting) {
                        tracing::warn!(parent: &actor.span, "launch ignored cancellation; abandoned");
                        let provider = actor.provider().to_owned();
                        actor.reject(StartError::Aborted { provider }, ctx);
                    }
                });
            }
            Phase::Running { child, structured } => {
                self.phase = Phase::Cancelling { child, structured };
                self.cancel_child();
                ctx.run_later(grace, |actor, _ctx| match actor.take_phase() {
                    Phase::Cancelling { child, .. } => {
                        actor.phase = Phase::Settled { child };
                        actor.settle(actor.grace_ran_out());
                    }
                    other => actor.phase = other,
                });
            }
            other => self.phase = other,
        }
    }

    /// The result of a child still running when its cancel grace ran out:
    /// `Aborted`, and a `timed-out` diagnostic that tells it from one that
    /// stopped when asked.
    fn grace_ran_out(&self) -> RunResult {
        let grace = self.core.config().cancel_grace;
        tracing::debug!(parent: &self.span, ?grace, "the child ignored cancel for its grace");
        let diagnostic = self
            .diagnostic(Stage::SessionRun, Category::TimedOut)
            .with_reason(format!("the child was still running {grace:?} after it was told to stop"));
        RunResult { diagnostic: Some(diagnostic), ..RunResult::empty(StopReason::Aborted) }
    }

    fn cancel_child(&self) {
        if let Some(child) = self.phase.child() {
            if let Err(panic) = contained_call(|| child.cancel()) {
                tracing::error!(parent: &self.span, %panic, "child cancel panicked");
            }
        }
    }

    fn on_run_finished(&mut self, outcome: RunOutcome, ctx: &mut Context<Self>) {
        let result = outcome.unwrap_or_else(|panic| {
            tracing::error!(parent: &self.span, %panic, "child run panicked");
            let diagnostic = self.diagnostic(Stage::SessionRun, Category::Panicked).with_detail(panic.to_string());
            Box::new(Ok(RunResult::failed(diagnostic)))
        });
        match self.take_phase() {
            Phase::Running { child, structured } | Phase::Cancelling { child, structured } => {
                self.phase = Phase::Settled { child };
                self.settle_with(with_capture(result, structured));
            }
            Phase::DisposingAwaitRun { child, structured } => {
                self.phase = Phase::DisposingAwaitRun { child, structured: None };
                self.settle_with(with_capture(result, structured));
                self.release_child(ctx);
            }
            other => self.phase = other,
        }
    }

    /// Deliver the result (only the first call counts). A cancelled run
    /// that did not complete is `Aborted`.
    fn settle(&self, result: RunResult) {
        if self.shared.settled().is_none() {
            self.settle_with(Box::new(Ok(result)));
        }
    }

    /// [`settle`](Self::settle) with a result boxed where it was made.
    fn settle_with(&self, mut settlement: Settlement) {
        if self.shared.settled().is_some() {
            return;
        }
        if let Ok(result) = &mut *settlement {
            if self.token.is_cancelled() && result.stop_reason != StopReason::Completed {
                result.stop_reason = StopReason::Aborted;
            }
            self.log_end(result.stop_reason);
            telemetry::run_ended(&self.span, result);
        }
        self.shared.settle(settlement);
    }

    /// The run's end line (`RUST_LOG=subagents=debug`), once, as it settles.
    fn log_end(&self, stop_reason: StopReason) {
        tracing::debug!(parent: &self.span, child = %self.shared.child_id(), stop_reason = stop_reason.as_str(), duration = ?self.age(), "run ended");
    }

    /// How long the actor has lived, for its debug lines.
    fn age(&self) -> std::time::Duration {
        self.began.map(|began| began.elapsed()).unwrap_or_default()
    }

    fn begin_dispose(&mut self, ctx: &mut Context<Self>) {
        let grace = self.core.config().cancel_grace;
        match self.take_phase() {
            Phase::Starting => {
                self.phase = Phase::Starting;
                self.token.cancel();
            }
            Phase::Running { child, structured } => {
                self.phase = Phase::DisposingAwaitRun { child, structured };
                self.token.cancel();
                self.cancel_child();
                ctx.run_later(grace, |actor, ctx| actor.release_after_grace(ctx));
            }
            Phase::Cancelling { child, structured } => {
                self.phase = Phase::DisposingAwaitRun { child, structured };
                self.token.cancel();
                ctx.run_later(grace, |actor, ctx| actor.release_after_grace(ctx));
            }
            Phase::Settled { child } => {
                self.phase = Phase::DisposingAwaitRun { child, structured: None };
                self.token.cancel();
                self.release_child(ctx);
            }
            other => self.phase = other,
        }
    }

    /// The cancel grace of a dispose ran out: a run still going settles
    /// timed out, then the child is released.
    fn release_after_grace(&mut self, ctx: &mut Context<Self>) {
        if matches!(self.phase, Phase::DisposingAwaitRun { .. }) {
            self.settle(self.grace_ran_out());
        }
        self.release_child(ctx);
    }

    /// Stop waiting for the child's run and call its dispose hook (bounded).
    fn release_child(&mut self, ctx: &mut Context<Self>) {
        let child = match self.take_phase() {
            Phase::DisposingAwaitRun { child, .. } => child,
            other => return self.phase = other,
        };
        self.running.clear();
        self.settle(RunResult::empty(StopReason::Aborted));
        let hook = self.releasing.hold(self.core.id(), &self.span, contained(|| child.dispose()));
        self.phase = Phase::DisposingRelease { child };
        // A hook that is done at once needs no timer and no spawned future.
        let hook = match hook {
            Ok(outcome) => return self.on_released(Some(outcome), ctx),
            Err(held) => held,
        };
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
        let (child, mut outcome) = self.take_phase().into_remains(Ok(()));
        if let Some(diagnostic) = failure {
            tracing::warn!(parent: &self.span, %diagnostic, "child did not dispose cleanly");
            outcome = Err(DisposeError::DisposeFailed { provider: self.provider().to_owned(), diagnostic });
        }
        self.phase = Phase::Disposed { child, outcome: outcome.map_err(Box::new) };
        ctx.stop();
    }
}

/// A completed result without a structured value of its own carries what
/// the child captured.
fn with_capture(mut settlement: Settlement, structured: Captured) -> Settlement {
    if let Ok(result) = &mut *settlement {
        if result.stop_reason == StopReason::Completed && result.structured.is_none() {
            result.structured = structured.map(|value| *value);
        }
    }
    settlement
}

impl Actor for RunActor {
    type Context = Context<Self>;
}

/// The run's mailbox, as the run table, the caller's handles and the
/// child's context hold it.
impl Mailbox for Addr<RunActor> {
    fn control(&self, control: Control) {
        self.do_send(control);
    }

    fn steer(&self, message: SendMessage) -> BoxFuture<'static, Result<(), SteeringError>> {
        let sent = self.send(message);
        Box::pin(async move { sent.await.unwrap_or(Err(SteeringError::Disposed)) })
    }

    fn capture(&self, value: CaptureStructured) -> BoxFuture<'static, Result<(), CaptureError>> {
        let sent = self.send(value);
        Box::pin(async move { sent.await.unwrap_or(Err(CaptureError::NotRunning)) })
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
        let (child, dispose_outcome) = self.take_phase().into_remains(Ok(()));
        if let Some(child) = child {
            match contained_call(|| child.stop_report()) {
                Ok(report) => self.shared.set_stop_report(report),
                Err(panic) => tracing::error!(parent: &self.span, %panic, "child stop report panicked"),
            }
        }
        if let Some(family) = self.shared.family() {
            self.core.close_family(family);
        }
        drop(self.leases.take());
        let start_reply = std::mem::replace(&mut self.start_reply, StartReply::Published);
        if let Some(mut admission) = self.admission.take() {
            if !matches!(start_reply, StartReply::Published) {
                // A refused start never had a child: its run goes back to the budget.
                admission.refund_run();
            }
        }
        match start_reply {
            // A rejected start settles nothing and emits nothing.
            StartReply::Creating => {}
            StartReply::Awaited(reply) => {
                let _ = reply.send(Err(StartError::RuntimeStopped));
            }
            StartReply::Refused(reply, error) => {
                if let Some(reply) = reply {
                    let _ = reply.send(Err(*error));
                }
            }
            StartReply::Published => {
                if self.shared.settled().is_none() {
                    self.log_end(StopReason::Error);
                    telemetry::run_failed(&self.span, SubagentError::RuntimeStopped.code());
                    self.shared.settle(Box::new(Err(SubagentError::RuntimeStopped)));
                }
            }
        }
        self.shared.set_quiescent(dispose_outcome);
    }
}

impl Handler<Control> for RunActor {
    type Result = ();

    fn handle(&mut self, msg: Control, ctx: &mut Context<Self>) {
        match msg {
            Control::Dispose => self.begin_dispose(ctx),
            Control::ForceStop => {
                self.token.cancel();
                if !matches!(self.phase, Phase::Starting) {
                    self.settle(RunResult::empty(StopReason::Aborted));
                }
                let forced = DisposeError::DisposeFailed {
                    provider: self.provider().to_owned(),
                    diagnostic: self.diagnostic(Stage::Shutdown, Category::TimedOut),
                };
                // A run already `Disposed` keeps the outcome it had.
                let (child, outcome) = self.take_phase().into_remains(Err(forced));
                self.phase = Phase::Disposed { child, outcome: outcome.map_err(Box::new) };
                ctx.stop();
            }
        }
    }
}

impl Handler<SendMessage> for RunActor {
    type Result = ResponseFuture<Result<(), SteeringError>>;

    fn handle(&mut self, msg: SendMessage, _ctx: &mut Context<Self>) -> Self::Result {
        let Phase::Running { child, .. } = &self.phase else {
            return Box::pin(async { Err(SteeringError::NotRunning) });
        };
        let provider = self.provider().to_owned();
        let delivery = contained(|| child.send_message(msg.0)).instrument(self.span.clone());
        Box::pin(async move {
            delivery.await.unwrap_or_else(|panic| {
                tracing::error!(%provider, %panic, "child send_message panicked"); // inside the run's span
                Err(SteeringError::ChildFailed)
            })
        })
    }
}

impl Handler<CaptureStructured> for RunActor {
    type Result = Result<(), CaptureError>;

    fn handle(&mut self, msg: CaptureStructured, _ctx: &mut Context<Self>) -> Self::Result {
        match &mut self.phase {
            Phase::Running { structured: slot @ None, .. } => {
                *slot = Some(Box::new(msg.0));
                Ok(())
            }
            Phase::Running { .. } => Err(CaptureError::AlreadyCaptured),
            _ => Err(CaptureError::NotRunning),
        }
    }
}
