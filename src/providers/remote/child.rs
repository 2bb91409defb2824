//! One remote run on the caller's side: the launch (publish durably, roll
//! back on failure or cancel; or, for a detached run started earlier,
//! attach to it) and the [`Child`] the run actor drives, the same for both.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

use super::caller::{Caller, Deadline, SlotReceivers};
use crate::agent::ids;
use crate::seam::{
    Branch, BudgetLease, Category, Child, Detached, Diagnostic, Failure, Launch, LaunchError, ProviderContext,
    RunResult, RunUsage, Stage, StopReason, StopReport,
};
use crate::wire::remote::broker::{check_name, OPERATION_TIMEOUT};
use crate::wire::remote::{self as wire, Lineage, RunRecord, RunRequest, Settled, MAX_MESSAGE_BYTES, VERSION};

/// The launch-time knobs a child needs from the provider's config.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    pub publish_timeout: Duration,
    pub dispose_wait: Duration,
    /// How long a detached run outlives the last caller that held it.
    pub detached_ttl: Duration,
}

/// Publishes the run and returns once JetStream has stored it (or, for
/// [`Detached::Attach`], finds the run started earlier). A broker known
/// unreachable, or a pool known silent, past its bound fails the start at
/// once, before anything is sent. Every other failure and a cancel roll
/// back (tombstone, delete, forget) on the I/O runtime: the rollback
/// completes even if nobody waits for it, and the start does not wait for
/// it (against a dead broker it only times out).
pub(crate) async fn launch(
    caller: Arc<Caller>,
    io: Handle,
    timing: Timing,
    launch: Launch,
) -> Result<Box<dyn Child>, LaunchError> {
    let Launch { request, cancel, context } = launch;
    if cancel.is_cancelled() {
        return Err(LaunchError::Aborted);
    }
    if let Some(detached) = &request.detached {
        check_name("run", detached.run_id()).map_err(|reason| LaunchError::Invalid { field: "detached", reason })?;
    }
    // An attach needs no worker: a stored result is collected without one.
    let needs_worker = !matches!(request.detached, Some(Detached::Attach(_)));
    caller.refusal(needs_worker).map_err(LaunchError::Diagnosed)?;
    let (run, detached) = match request.detached {
        Some(Detached::Attach(run)) => return attach(caller, io, timing, run, cancel, context).await,
        Some(Detached::Start(run)) => (run, true),
        None => (ids::remote_run_id(), false),
    };
    // We are inside the run's span: the worker's run joins its trace.
    let trace = crate::telemetry::current_trace();
    let wire_request = RunRequest {
        v: VERSION,
        run: run.clone(),
        caller: caller.id.clone(),
        prompt: request.prompt,
        parent: Lineage { session: request.parent.session_id.clone(), depth: request.parent.depth },
        label: request.label,
        persona: request.persona,
        tool_filter: request.tool_filter,
        output_schema: request.output_schema,
        max_depth: request.max_depth,
        agent_options: request.agent_options,
        budget: context.budget().map(BudgetLease::remaining),
        detach_ttl_ms: detached.then(|| u64::try_from(timing.detached_ttl.as_millis()).unwrap_or(u64::MAX)),
        traceparent: trace.as_ref().map(|trace| trace.traceparent.clone()),
        tracestate: trace.and_then(|trace| trace.tracestate),
        approvals: context.approvals().has_approver(),
    };
    let bytes = wire::encode(&wire_request, MAX_MESSAGE_BYTES).map_err(|size| LaunchError::Invalid {
        field: "prompt",
        reason: format!("the run request is {size} bytes; the remote wire carries at most {MAX_MESSAGE_BYTES}"),
    })?;
    if wire_request.approvals {
        // Until dispose (or the run's cancel) its worker's questions are
        // asked here; a request that cannot be sent registers nothing.
        caller.answer_for(&run, context.approvals().clone(), cancel.child_token());
    }
    let (slot, receivers) = caller.register(&run);
    let (told, published) = tokio::sync::oneshot::channel();
    // The launch's verdict on a stored run: `true` once it handed the
    // child over; dropped when it gave up (cancelled, or dropped itself).
    let (kept, launched) = tokio::sync::oneshot::channel::<bool>();
    io.spawn({
        let (caller, run, cancel) = (caller.clone(), run.clone(), cancel.clone());
        async move {
            // One deadline for every write of the start.
            let deadline = Deadline::after(timing.publish_timeout);
            // A detached run's holder exists before its request does, so an
            // attach can tell a run that was never stored from one queued.
            let held = if detached { caller.put_holder(&run, 0, deadline).await } else { Ok(()) };
            let published = match held {
                Ok(()) => caller.publish(&run, bytes, deadline).await,
                Err(error) => Err(error),
            };
            let published = match published {
                // Best effort: an attach that finds no sequence restarts the run.
                Ok(seq) if detached && !cancel.is_cancelled() => {
                    let _ = caller.put_holder(&run, seq, deadline.at_least(OPERATION_TIMEOUT)).await;
                    Ok(seq)
                }
                published => published,
            };
            if let Err(error) = &published {
                tracing::warn!(provider = %caller.provider, %error, "the broker did not acknowledge a remote run");
            }
            let stored = published.is_ok();
            // Whether the run lives on is the launch's to say, not the
            // token's: a cancel of a run already launched (a dispose right
            // after its start) is that run's cancel, and must not take its
            // slot from under its child.
            let handed_over = told.send(published).is_ok() && stored && launched.await.unwrap_or(false);
            if !handed_over {
                // The request may be stored even if its ack was lost: the
                // tombstone makes sure no worker ever runs it.
                caller.cancel(&run, 1).await;
                caller.delete_request(&run).await;
                caller.forget_slot(&run, &slot);
                caller.stop_answering(&run);
            }
        }
    });
    let published = tokio::select! {
        biased;
        published = published => published,
        // The rollback above still runs: this launch's verdict is dropped.
        _ = cancel.cancelled() => return Err(LaunchError::Aborted),
    };
    match published {
        Ok(Ok(_)) if !cancel.is_cancelled() => {
            let _ = kept.send(true);
        }
        Ok(Ok(_)) => return Err(LaunchError::Aborted),
        Ok(Err(diagnostic)) => return Err(LaunchError::Diagnosed(diagnostic)),
        Err(_) => return Err(LaunchError::Failed { stage: Stage::Initialize, category: Category::StartupFailed }),
    }
    Ok(child(caller, io, timing, run, receivers, cancel, context))
}

/// Attaches to detached run `run`, started earlier (by this caller or
/// one that is gone): a stored result settles it at once; a run claimed
/// or queued is held by this caller from now on. A run the broker does
/// not know, or whose start was never acknowledged (tombstoned here so it
/// never runs), is `RunUnknown`.
async fn attach(
    caller: Arc<Caller>,
    io: Handle,
    timing: Timing,
    run: String,
    cancel: CancellationToken,
    context: ProviderContext,
) -> Result<Box<dyn Child>, LaunchError> {
    // The slot first, so that no result announced from now on is unheard.
    let (_slot, receivers) = caller.register(&run);
    let found = io.spawn({
        let (caller, run) = (caller.clone(), run.clone());
        async move {
            let deadline = tokio::time::Instant::now() + timing.publish_timeout;
            let unreachable = |what: &str| {
                Diagnostic::new(&caller.provider, Stage::Initialize, Category::BrokerUnreachable)
                    .with_reason(format!("the broker did not answer for the run to attach to ({what})"))
            };
            let unknown = |why: &str| {
                Diagnostic::new(&caller.provider, Stage::Initialize, Category::RunUnknown).with_reason(why.to_owned())
            };
            let (state, holder) = loop {
                caller.refusal(false)?;
                match (caller.state(&run).await, caller.holder(&run).await) {
                    (Ok(state), Ok(holder)) => break (state, holder),
                    _ if tokio::time::Instant::now() >= deadline => return Err(unreachable("its state")),
                    _ => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            };
            let seq = holder.as_ref().map_or(0, |holder| holder.stream_seq);
            match (state, holder) {
                (Some(RunRecord::Settled(settled)), _) => {
                    caller.deliver(*settled);
                    return Ok(());
                }
                // A worker holds it now (or did, and its redelivery will).
                (Some(RunRecord::Claimed(_)), _) => {}
                // Queued: its request is in the stream.
                (None, Some(_)) if seq > 0 => {}
                (None, Some(_)) => {
                    // Its publish was never acknowledged: it may be stored
                    // or not; the tombstone makes sure it never runs.
                    caller.cancel(&run, 10).await;
                    return Err(unknown(
                        "the run's start was never acknowledged by the broker; it was cancelled there",
                    ));
                }
                (None, None) => {
                    return Err(unknown("the broker does not know the run (never stored, or past its retention)"))
                }
            }
            caller.note_stream_seq(&run, seq);
            let deadline = Deadline::after(timing.publish_timeout);
            caller.put_holder(&run, seq, deadline).await.map_err(|_| unreachable("its holder"))?;
            Ok(())
        }
    });
    // Bounded by `publish_timeout` and a few broker operations; a cancel
    // meanwhile is honoured once it is known what there is to cancel.
    let found = found.await;
    if cancel.is_cancelled() {
        if let Ok(Ok(())) = found {
            // Attached, then cancelled: the run is this caller's to stop.
            let (stopping, run) = (caller.clone(), run.clone());
            let _ = io.spawn(async move { stopping.cancel(&run, 10).await }).await;
        }
        caller.forget(&run);
        return Err(LaunchError::Aborted);
    }
    match found {
        Ok(Ok(())) => Ok(child(caller, io, timing, run, receivers, cancel, context)),
        Ok(Err(diagnostic)) => {
            caller.forget(&run);
            Err(LaunchError::Diagnosed(diagnostic))
        }
        Err(_) => {
            caller.forget(&run);
            Err(LaunchError::Failed { stage: Stage::Initialize, category: Category::StartupFailed })
        }
    }
}

/// The child of a run stored (or attached to) on the broker.
fn child(
    caller: Arc<Caller>,
    io: Handle,
    timing: Timing,
    run: String,
    receivers: SlotReceivers,
    cancel: CancellationToken,
    context: ProviderContext,
) -> Box<dyn Child> {
    Box::new(RemoteChild {
        id: format!("remote:{}:{run}", caller.provider),
        settled: receivers.settled.clone(),
        receivers: RefCell::new(Some(receivers)),
        run,
        caller,
        io,
        cancel,
        context,
        cancel_sent: Rc::new(Cell::new(false)),
        dispose_wait: timing.dispose_wait,
        never_ran: Rc::new(Cell::new(false)),
    })
}

struct RemoteChild {
    id: String,
    run: String,
    caller: Arc<Caller>,
    io: Handle,
    receivers: RefCell<Option<SlotReceivers>>,
    settled: tokio::sync::watch::Receiver<Option<Arc<Settled>>>,
    cancel: CancellationToken,
    context: ProviderContext,
    cancel_sent: Rc<Cell<bool>>,
    dispose_wait: Duration,
    /// Set when dispose found the run never claimed: nothing ran under it.
    never_ran: Rc<Cell<bool>>,
}

impl RemoteChild {
    /// Sends the cancel once; the returned handle resolves when the
    /// tombstone is written (or given up on).
    fn send_cancel(&self) -> Option<tokio::task::JoinHandle<bool>> {
        send_cancel(&self.cancel_sent, &self.caller, &self.io, &self.run)
    }
}

fn send_cancel(
    sent: &Cell<bool>,
    caller: &Arc<Caller>,
    io: &Handle,
    run: &str,
) -> Option<tokio::task::JoinHandle<bool>> {
    if sent.replace(true) {
        return None;
    }
    let (caller, run) = (caller.clone(), run.to_owned());
    Some(io.spawn(async move { caller.cancel(&run, 10).await }))
}

impl Child for RemoteChild {
    fn id(&self) -> String {
        self.id.clone()
    }

    fn run(&self) -> LocalBoxFuture<'static, RunResult> {
        let SlotReceivers { mut settled, mut progress } =
            self.receivers.borrow_mut().take().expect("run is called once");
        let (cancel, sent, caller, io, run) =
            (self.cancel.clone(), self.cancel_sent.clone(), self.caller.clone(), self.io.clone(), self.run.clone());
        let context = self.context.clone();
        let deadline = context.budget().and_then(|budget| budget.deadline()).map(tokio::time::Instant::from_std);
        Box::pin(async move {
            let mut progressing = true;
            // Set once the budget's deadline passed: until when the worker
            // may still report the run aborted.
            let mut report_by: Option<tokio::time::Instant> = None;
            loop {
                if let Some(settled) = settled.borrow_and_update().clone() {
                    return settled.result.clone();
                }
                tokio::select! {
                    changed = settled.changed() => {
                        if changed.is_err() {
                            // The slot is gone: only a provider shutdown does that.
                            let diagnostic = Diagnostic::new(&caller.provider, Stage::SessionRun, Category::Protocol)
                                .with_reason("the remote provider stopped before the run settled");
                            return RunResult::failed(diagnostic);
                        }
                    }
                    update = progress.recv(), if progressing => match update {
                        Some(update) => context.progress(update),
                        None => progressing = false,
                    },
                    _ = cancel.cancelled(), if !sent.get() => {
                        // Keep waiting: the worker reports the aborted run
                        // (or the runtime's cancel grace settles it).
                        send_cancel(&sent, &caller, &io, &run);
                    }
                    // A worker counts the budget from when it starts the
                    // run; the time spent waiting for one counts here.
                    _ = sleep_until_some(deadline), if report_by.is_none() => {
                        send_cancel(&sent, &caller, &io, &run);
                        report_by = Some(tokio::time::Instant::now() + DEADLINE_REPORT_GRACE);
                    }
                    _ = sleep_until_some(report_by) => {
                        let diagnostic = match caller.stall_of(&run) {
                            Some(stall) => stall.deadline_diagnostic(&caller.provider, &caller.pool),
                            None => Diagnostic::new(&caller.provider, Stage::SessionRun, Category::TimedOut)
                                .with_reason("the budget's deadline passed before the worker reported the run"),
                        };
                        caller.settle_here(&run, RunResult { diagnostic: Some(diagnostic), ..RunResult::empty(StopReason::Aborted) });
                        report_by = None;
                    }
                }
            }
        })
    }

    fn stop_report(&self) -> StopReport {
        // The worker reports its local run's receipt with the result.
        if self.never_ran.get() {
            return StopReport::new();
        }
        let runs = self.settled.borrow().as_ref().and_then(|settled| settled.runs.clone());
        let mut runs = runs.unwrap_or_else(|| vec![Branch::unknown(WORKER_RUNS_UNKNOWN)]);
        // The worker's local run is this run carried out there: what its
        // model calls spent is this run's result's usage, counted on this
        // run's receipt already; under it, only its subtree is new.
        for branch in &mut runs {
            if let Branch::Run(local) = branch {
                local.usage = RunUsage::default();
            }
        }
        StopReport::new().with_children(runs)
    }

    fn dispose(&self) -> LocalBoxFuture<'static, Result<(), Failure>> {
        // What its worker still asks is rejected from now on.
        self.caller.stop_answering(&self.run);
        let mut settled = self.settled.clone();
        let cancelling = if settled.borrow().is_none() { self.send_cancel() } else { None };
        let (caller, io, run, wait) = (self.caller.clone(), self.io.clone(), self.run.clone(), self.dispose_wait);
        let never_ran = self.never_ran.clone();
        Box::pin(async move {
            let known = settled.borrow().clone();
            let outcome = match known {
                Some(settled) => receipt(&settled),
                None => {
                    if let Some(cancelling) = cancelling {
                        let _ = cancelling.await;
                    }
                    // With the tombstone written, a run nobody claimed yet
                    // will never run: nothing to wait for.
                    let (asked, run_id) = (caller.clone(), run.clone());
                    let state = io.spawn(async move { asked.state(&run_id).await }).await;
                    match state {
                        Ok(Ok(None)) => {
                            never_ran.set(true);
                            let (caller, run) = (caller.clone(), run.clone());
                            let _ = io.spawn(async move { caller.delete_request(&run).await }).await;
                            Ok(())
                        }
                        Ok(Ok(Some(RunRecord::Settled(settled)))) => receipt(&settled),
                        // Claimed: the worker writes its result only after
                        // it released its child, so the result is the receipt.
                        _ => wait_for_the_worker(&caller, &io, &run, &mut settled, wait).await,
                    }
                }
            };
            caller.forget(&run);
            outcome
        })
    }
}

/// The longest a dispose waits for the result of a worker that still
/// answers (a slow machine, a child slow to release), beyond which it is
/// reported lost all the same: every wait has a bound (the runtime's
/// dispose timeout is usually the tighter one).
const LIVE_WORKER_DISPOSE_PATIENCE: Duration = Duration::from_secs(60);

/// The least time between two looks at whether the worker holding a run
/// still answers: a short `dispose_wait` does not make a dispose ask the
/// pool hundreds of times a second.
const LIVE_WORKER_RECHECK: Duration = Duration::from_millis(250);

/// Waits for the result of the worker holding `run` (its child released):
/// `wait` at a time, and on while that worker answers the pool's status
/// request (a slow worker is not a lost one), up to
/// [`LIVE_WORKER_DISPOSE_PATIENCE`]. A worker that is silent, or a run
/// claimed by no one, is reported lost.
async fn wait_for_the_worker(
    caller: &Arc<Caller>,
    io: &Handle,
    run: &str,
    settled: &mut tokio::sync::watch::Receiver<Option<Arc<Settled>>>,
    wait: Duration,
) -> Result<(), Failure> {
    let give_up_at = tokio::time::Instant::now() + LIVE_WORKER_DISPOSE_PATIENCE.max(wait);
    let mut wait = wait;
    let mut announced = true;
    loop {
        if announced {
            match tokio::time::timeout(wait, settled.wait_for(Option::is_some)).await {
                Ok(Ok(report)) => return report.as_deref().map_or(Ok(()), receipt),
                // The run's slot is gone (its provider is stopping): the
                // run's state record still tells.
                Ok(Err(_)) => announced = false,
                Err(_) => {}
            }
        } else {
            tokio::time::sleep(wait).await;
        }
        if tokio::time::Instant::now() >= give_up_at {
            break;
        }
        let (asked, run_id) = (caller.clone(), run.to_owned());
        let holder = match io.spawn(async move { asked.state(&run_id).await }).await {
            Ok(Ok(Some(RunRecord::Settled(settled)))) => return receipt(&settled),
            Ok(Ok(Some(RunRecord::Claimed(claim)))) => claim.worker,
            _ => break,
        };
        let asked = caller.clone();
        let alive = io.spawn(async move { asked.worker_answers(&holder).await }).await.unwrap_or(false);
        if !alive {
            break;
        }
        tracing::debug!(run = %run, "the worker holding a remote run is slow to report it disposed, but alive: waiting on");
        wait = wait.max(LIVE_WORKER_RECHECK);
    }
    tracing::warn!(run = %run, "the worker holding a remote run did not report its child disposed");
    Err(Failure::new(Stage::Dispose, Category::WorkerLost))
}

/// How long a run past its budget's deadline waits for its worker to
/// report it aborted (with what it has) before it settles here.
const DEADLINE_REPORT_GRACE: Duration = Duration::from_secs(1);

/// Sleeps until `at`, or forever without one.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Why a remote run's own runs are an unknown branch of its receipt.
const WORKER_RUNS_UNKNOWN: &str =
    "no worker reported what ran under the remote run (it was lost, it is an older worker, or the run had not settled)";

/// A settled run's dispose receipt: whether the worker released its child.
fn receipt(settled: &Settled) -> Result<(), Failure> {
    if settled.disposed {
        Ok(())
    } else {
        Err(Failure::new(Stage::Dispose, Category::ChildError))
    }
}
