//! One delivery of one run, held by a worker from pickup to ack.
//!
//! The states, in order: claim (or skip), pre-checks (tombstone, caller
//! lease), the live child (in-progress acks and checks every tick), then
//! dispose, settle by compare-and-set on the claim, announce, ack. Each
//! exit path says what happens to the delivery:
//!
//! | exit | the delivery |
//! |---|---|
//! | malformed request | terminated (never redelivered) |
//! | already settled | acked (the result is announced again) |
//! | a newer delivery claimed it | left alone (that delivery owns it) |
//! | broker unreachable at claim | nak'd after a second |
//! | result written | acked |
//! | result fenced (claim superseded) | left alone |
//! | handed back on drain | nak'd at once |
//! | the worker's disk is full | nak'd, redelivered after 2 s (to a worker with room) |

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::kv::{Operation, UpdateErrorKind};
use async_nats::jetstream::{AckKind, Message};
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::{lock, Route, Shared};
use crate::seam::{Branch, Category, Diagnostic, Parent, RunResult, Stage, StartRequest, StopReason};
use crate::wire::remote::broker::{cancel_key, check_name, detached_key, state_key, OPERATION_TIMEOUT};
use crate::wire::remote::{self as wire, Claim, Holder, RunRecord, RunRequest, Settled, MAX_MESSAGE_BYTES, VERSION};

/// How long a finished run keeps trying to write its result through a
/// broker outage before leaving the delivery to be redelivered.
const SETTLE_PATIENCE: Duration = Duration::from_secs(60);

/// Takes one delivery from pickup to its exit.
pub(super) async fn hold(shared: Arc<Shared>, message: Message, _permit: OwnedSemaphorePermit) {
    let Some(attempt) = message.info().ok().map(|info| info.delivered.max(1) as u64) else {
        tracing::warn!("dropped a run delivery without JetStream metadata");
        return;
    };
    let request = match wire::decode::<RunRequest>(&message.payload) {
        Ok(request) if check_name("run", &request.run).is_ok() && check_name("caller", &request.caller).is_ok() => {
            request
        }
        Ok(_) => return terminate(&message, "a run request with an unusable run or caller id").await,
        Err(error) => return terminate(&message, &error.to_string()).await,
    };
    let held = Held { shared, message, request, attempt, claim: 0, orphaned_since: Mutex::new(None) };
    held.run().await
}

async fn terminate(message: &Message, why: &str) {
    tracing::warn!(why, "dropped a malformed run request");
    let _ = message.ack_with(AckKind::Term).await;
}

enum Claimed {
    Owned(u64),
    Settled(Box<Settled>),
    Stale,
    Unavailable,
}

enum Exit {
    /// The result, the child's session, whether it was released, and the
    /// receipt's branches of what ran under the run here.
    Finished(Box<RunResult>, Option<String>, bool, Vec<Branch>),
    Superseded,
    HandBack(HandBack),
}

/// Why a worker hands a run back to the pool.
#[derive(Clone, Copy)]
enum HandBack {
    /// The worker is draining (SIGTERM) and the grace ran out.
    Drain,
    /// The worker's disk or quota is full: another worker has room.
    NoRoom,
}

enum Check {
    Fine,
    Superseded,
    Cancel(Stop),
}

/// Why a worker stops a run its caller still holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// The caller cancelled it (its tombstone).
    Cancelled,
    /// The caller's lease expired.
    LeaseExpired,
}

impl Stop {
    fn why(self) -> &'static str {
        match self {
            Stop::Cancelled => "cancelled by its caller",
            Stop::LeaseExpired => "its caller's lease expired",
        }
    }

    /// What the aborted run's result says: a caller that lost its lease
    /// learns why its run was stopped when it is back.
    fn diagnostic(self, provider: &str) -> Option<Diagnostic> {
        (self == Stop::LeaseExpired).then(|| {
            Diagnostic::new(provider, Stage::SessionRun, Category::LeaseExpired).with_reason(
                "the worker stopped the run: its caller's lease on the broker expired (the caller was out of touch for longer than the lease TTL)",
            )
        })
    }
}

struct Held {
    shared: Arc<Shared>,
    message: Message,
    request: RunRequest,
    attempt: u64,
    /// The revision of this delivery's claim on `state.<run>`.
    claim: u64,
    /// A detached run: since when no caller has held it (as this delivery saw).
    orphaned_since: Mutex<Option<Instant>>,
}

impl Held {
    async fn run(mut self) {
        match self.claim().await {
            Claimed::Owned(revision) => self.claim = revision,
            Claimed::Settled(settled) => {
                self.announce(&settled).await;
                let _ = self.message.double_ack().await;
                return;
            }
            Claimed::Stale => return,
            Claimed::Unavailable => {
                let _ = self.message.ack_with(AckKind::Nak(Some(Duration::from_secs(1)))).await;
                return;
            }
        }
        let remote_cancel = CancellationToken::new();
        lock(&self.shared.live).insert(self.request.run.clone(), remote_cancel.clone());
        let exit = self.live(remote_cancel).await;
        lock(&self.shared.live).remove(&self.request.run);
        match exit {
            Exit::Finished(result, session, disposed, runs) => self.settle(*result, session, disposed, runs).await,
            Exit::Superseded => {
                self.shared.count(|r| r.fenced += 1);
                tracing::warn!(run = %self.request.run, attempt = self.attempt, "run superseded by a newer delivery; its child was cancelled and its result fenced out");
            }
            Exit::HandBack(why) => {
                self.shared.count(|r| r.handed_back += 1);
                let (why, delay) = match why {
                    HandBack::Drain => ("the worker is draining", None),
                    HandBack::NoRoom => ("the worker's disk is full", Some(super::PAUSED_REDELIVERY)),
                };
                tracing::warn!(run = %self.request.run, why, "run handed back to the pool");
                let _ = self.message.ack_with(AckKind::Nak(delay)).await;
            }
        }
    }

    /// Claims `state.<run>` for this delivery by compare-and-set.
    async fn claim(&self) -> Claimed {
        let broker = &self.shared.broker;
        let key = state_key(&self.request.run);
        let claim = RunRecord::Claimed(Claim { v: VERSION, attempt: self.attempt, worker: self.shared.worker.clone() });
        let bytes = wire::encode(&claim, MAX_MESSAGE_BYTES).expect("a claim is small");
        for _ in 0..5 {
            let Ok(Ok(entry)) = tokio::time::timeout(OPERATION_TIMEOUT, broker.runs.entry(key.clone())).await else {
                return Claimed::Unavailable;
            };
            let written = match entry {
                None => broker.runs.create(&key, bytes.clone().into()).await.map_err(|e| {
                    use async_nats::jetstream::kv::CreateErrorKind;
                    e.kind() == CreateErrorKind::AlreadyExists
                }),
                Some(entry) => {
                    if entry.operation == Operation::Put {
                        match RunRecord::decode(&entry.value) {
                            Ok(RunRecord::Settled(settled)) => return Claimed::Settled(settled),
                            Ok(RunRecord::Claimed(other)) if other.attempt >= self.attempt => return Claimed::Stale,
                            Ok(RunRecord::Claimed(_)) => {}
                            Err(error) => tracing::warn!(%error, "overwriting an unreadable run state"),
                        }
                    }
                    broker
                        .runs
                        .update(&key, bytes.clone().into(), entry.revision)
                        .await
                        .map_err(|e| e.kind() == UpdateErrorKind::WrongLastRevision)
                }
            };
            match written {
                Ok(revision) => return Claimed::Owned(revision),
                // Someone wrote in between: look again.
                Err(true) => continue,
                Err(false) => return Claimed::Unavailable,
            }
        }
        Claimed::Unavailable
    }

    /// Runs the child unless the run was cancelled or its caller is gone.
    async fn live(&self, remote_cancel: CancellationToken) -> Exit {
        if let Check::Cancel(stop) = self.check(false).await {
            tracing::debug!(run = %self.request.run, why = stop.why(), "settling a run without running it");
            let result = RunResult {
                diagnostic: stop.diagnostic(&self.shared.provider),
                ..RunResult::empty(StopReason::Aborted)
            };
            return Exit::Finished(Box::new(result), None, true, Vec::new());
        }
        let signal = CancellationToken::new();
        let run = match self.start(signal.clone()).await {
            Ok(run) => run,
            Err(error) => {
                let reason = match self.shared.home_unwritable().await {
                    Some(home) if home.full => return Exit::HandBack(HandBack::NoRoom),
                    Some(home) => format!("the worker cannot write its home: {}", home.cause),
                    None => format!("the worker refused the run: {error}"),
                };
                let diagnostic = Diagnostic::new(&self.shared.provider, Stage::Initialize, Category::StartupFailed)
                    .with_reason(reason);
                return Exit::Finished(Box::new(RunResult::failed(diagnostic)), None, true, Vec::new());
            }
        };
        lock(&self.shared.routes).insert(
            run.run_id(),
            Route {
                run: self.request.run.clone(),
                caller: self.request.caller.clone(),
                attempt: self.attempt,
                window: (Instant::now(), 0),
            },
        );
        let exit = self.watch(&run, &signal, &remote_cancel).await;
        lock(&self.shared.routes).remove(&run.run_id());
        let disposed = run.dispose().await.is_ok();
        match exit {
            Ok(mut result) => {
                // A failed run, or a child whose session could not be
                // released, may have met a home that cannot be written: the
                // worker pauses if so. A run that completed keeps its result.
                let failed = result.stop_reason == StopReason::Error;
                if failed || !disposed {
                    match self.shared.home_unwritable().await {
                        Some(home) if failed && home.full => return Exit::HandBack(HandBack::NoRoom),
                        Some(home) if failed => {
                            let diagnostic = result.diagnostic.get_or_insert_with(|| {
                                Diagnostic::new(&self.shared.provider, Stage::SessionRun, Category::ChildError)
                            });
                            diagnostic.reason = Some(format!("the worker cannot write its home: {}", home.cause));
                        }
                        _ => {}
                    }
                }
                let session = session_of(run.child_id());
                // The local run and everything under it, for the caller's receipt.
                let runs = vec![Branch::Run(run.receipt().await)];
                Exit::Finished(Box::new(result), Some(session), disposed, runs)
            }
            Err(exit) => exit,
        }
    }

    /// Starts the local child, acking progress while it starts (a
    /// `process` child takes a process start and a handshake).
    async fn start(&self, signal: CancellationToken) -> Result<crate::Run, crate::StartError> {
        let start = self.shared.subagents.start(&self.shared.provider, self.start_request(signal));
        tokio::pin!(start);
        let mut tick = tokio::time::interval(self.shared.tick);
        tick.tick().await;
        loop {
            tokio::select! {
                started = &mut start => return started,
                _ = tick.tick() => {
                    let _ = self.message.ack_with(AckKind::Progress).await;
                }
            }
        }
    }

    /// Waits for the child, acking progress and checking every tick.
    async fn watch(
        &self,
        run: &crate::Run,
        signal: &CancellationToken,
        remote_cancel: &CancellationToken,
    ) -> Result<RunResult, Exit> {
        let mut tick = tokio::time::interval(self.shared.tick);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let result = run.result();
        tokio::pin!(result);
        let mut stopped = None;
        loop {
            tokio::select! {
                result = &mut result => {
                    let mut result = result.map_err(|_| Exit::HandBack(HandBack::Drain))?;
                    if let (Some(stop), StopReason::Aborted) = (stopped, result.stop_reason) {
                        result.diagnostic = result.diagnostic.or_else(|| Stop::diagnostic(stop, &self.shared.provider));
                    }
                    return Ok(result);
                }
                _ = remote_cancel.cancelled(), if !signal.is_cancelled() => signal.cancel(),
                _ = self.shared.hand_back.cancelled() => {
                    signal.cancel();
                    return Err(Exit::HandBack(HandBack::Drain));
                }
                _ = tick.tick() => {
                    // Checked before acking: a superseded delivery must not
                    // keep the new one's timer alive.
                    match self.check(true).await {
                        Check::Superseded => {
                            signal.cancel();
                            return Err(Exit::Superseded);
                        }
                        Check::Cancel(stop) if !signal.is_cancelled() => {
                            tracing::debug!(run = %self.request.run, why = stop.why(), "cancelling a live run");
                            stopped = Some(stop);
                            signal.cancel();
                        }
                        _ => {}
                    }
                    let _ = self.message.ack_with(AckKind::Progress).await;
                }
            }
        }
    }

    /// Whether the run should go on: its claim stands (when `claimed`),
    /// no tombstone, its caller alive. An unanswered lookup is no verdict.
    async fn check(&self, claimed: bool) -> Check {
        let broker = &self.shared.broker;
        if claimed {
            let state = tokio::time::timeout(OPERATION_TIMEOUT, broker.runs.entry(state_key(&self.request.run))).await;
            match state {
                Ok(Ok(Some(entry))) if entry.revision != self.claim => return Check::Superseded,
                Ok(Ok(None)) => return Check::Superseded,
                _ => {}
            }
        }
        let tombstone = tokio::time::timeout(OPERATION_TIMEOUT, broker.runs.get(cancel_key(&self.request.run))).await;
        if let Ok(Ok(Some(_))) = tombstone {
            return Check::Cancel(Stop::Cancelled);
        }
        if !self.held_by_a_caller().await {
            return Check::Cancel(Stop::LeaseExpired);
        }
        Check::Fine
    }

    /// Whether a live caller still wants the run: its own caller's lease
    /// stands; or, for a detached run, the lease of the caller that holds
    /// it now (one that attached since) stands, or the run has had no
    /// holder for less than its detach TTL.
    async fn held_by_a_caller(&self) -> bool {
        if self.shared.caller_alive(&self.request.caller).await {
            return true;
        }
        let Some(ttl) = self.request.detach_ttl_ms.map(Duration::from_millis) else { return false };
        if let Some(holder) = self.holder().await.filter(|holder| *holder != self.request.caller) {
            if self.shared.caller_alive(&holder).await {
                *lock(&self.orphaned_since) = None;
                // Its progress goes to the caller that holds it now.
                for route in lock(&self.shared.routes).values_mut().filter(|route| route.run == self.request.run) {
                    route.caller.clone_from(&holder);
                }
                return true;
            }
        }
        let since = *lock(&self.orphaned_since).get_or_insert_with(Instant::now);
        since.elapsed() < ttl
    }

    /// The caller that holds this detached run now, if the broker says.
    async fn holder(&self) -> Option<String> {
        let key = detached_key(&self.request.run);
        let entry = tokio::time::timeout(OPERATION_TIMEOUT, self.shared.broker.runs.get(key)).await;
        let Ok(Ok(Some(bytes))) = entry else { return None };
        wire::decode::<Holder>(&bytes).ok().map(|holder| holder.caller)
    }

    fn start_request(&self, signal: CancellationToken) -> StartRequest {
        let request = &self.request;
        let mut parent = Parent::root(&self.shared.cwd).with_depth(request.parent.depth);
        parent.session_id = request.parent.session.clone();
        if request.approvals {
            // The run's subtree asks its caller, through the broker.
            let subject = self.shared.broker.names.approval_subject(&request.caller);
            let client = self.shared.broker.client.clone();
            let approver = super::asking::CallerApprover::new(client, subject, request.run.clone());
            parent = parent.with_approvals(crate::seam::Approvals::new(Arc::new(approver)));
        }
        let mut start = StartRequest::with_blocks(request.prompt.clone(), parent, signal);
        start.label = request.label.clone();
        start.persona = request.persona.clone();
        start.tool_filter = request.tool_filter.clone();
        start.output_schema = request.output_schema.clone();
        start.max_depth = request.max_depth;
        start.agent_options = request.agent_options.clone();
        start.trace_parent =
            crate::seam::TraceContext::received(request.traceparent.as_deref(), request.tracestate.as_deref());
        if let Some(budget) = request.budget {
            // What the caller had left, opened here: its clock starts when
            // this delivery starts the run.
            start = start.with_budget(budget.relayed());
        }
        start
    }

    /// Writes the result by compare-and-set on this delivery's claim,
    /// announces it, then acks. Retries through a broker outage.
    async fn settle(&self, mut result: RunResult, session: Option<String>, disposed: bool, runs: Vec<Branch>) {
        result.child_session = session;
        let mut settled = Settled {
            v: VERSION,
            run: self.request.run.clone(),
            attempt: self.attempt,
            worker: Some(self.shared.worker.clone()),
            result,
            disposed,
            runs: Some(runs),
        };
        let bytes = match wire::encode(&RunRecord::Settled(Box::new(settled.clone())), MAX_MESSAGE_BYTES) {
            Ok(bytes) => bytes,
            Err(size) => {
                let diagnostic = Diagnostic::new(&self.shared.provider, Stage::SessionRun, Category::Protocol)
                    .with_reason(format!("the result was {size} bytes, over the remote wire's cap"));
                settled.result =
                    RunResult { child_session: settled.result.child_session.take(), ..RunResult::failed(diagnostic) };
                wire::encode(&RunRecord::Settled(Box::new(settled.clone())), MAX_MESSAGE_BYTES)
                    .expect("a failure is small")
            }
        };
        let key = state_key(&self.request.run);
        let deadline = Instant::now() + SETTLE_PATIENCE;
        while Instant::now() < deadline {
            let written = tokio::time::timeout(
                OPERATION_TIMEOUT,
                self.shared.broker.runs.update(&key, bytes.clone().into(), self.claim),
            )
            .await;
            match written {
                Ok(Ok(_)) => {
                    self.shared.count(|r| r.settled += 1);
                    self.announce(&settled).await;
                    let _ = tokio::time::timeout(OPERATION_TIMEOUT, self.message.double_ack()).await;
                    return;
                }
                Ok(Err(error)) if error.kind() == UpdateErrorKind::WrongLastRevision => {
                    // Our own write may have landed with its answer lost.
                    if self.written_by_us().await {
                        self.announce(&settled).await;
                        let _ = tokio::time::timeout(OPERATION_TIMEOUT, self.message.double_ack()).await;
                        return;
                    }
                    self.shared.count(|r| r.fenced += 1);
                    tracing::warn!(run = %self.request.run, attempt = self.attempt, "result fenced out: a newer delivery owns the run");
                    return;
                }
                _ => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
        tracing::warn!(run = %self.request.run, "could not write a run's result; it will be redelivered");
    }

    async fn written_by_us(&self) -> bool {
        let entry = self.shared.broker.runs.entry(state_key(&self.request.run)).await;
        let Ok(Some(entry)) = entry else { return false };
        matches!(
            RunRecord::decode(&entry.value),
            Ok(RunRecord::Settled(s)) if s.attempt == self.attempt && s.worker.as_deref() == Some(&self.shared.worker)
        )
    }

    /// Tells the caller at once (core NATS); its sweep finds the stored
    /// result anyway if this is lost.
    async fn announce(&self, settled: &Settled) {
        let Ok(bytes) = wire::encode(settled, MAX_MESSAGE_BYTES) else { return };
        let mut callers = vec![self.request.caller.clone()];
        // A detached run is told to whoever holds it now as well.
        if self.request.detach_ttl_ms.is_some() {
            callers.extend(self.holder().await.filter(|holder| *holder != self.request.caller));
        }
        for caller in callers {
            let subject = self.shared.broker.names.result_subject(&caller);
            let _ = self.shared.broker.client.publish(subject, bytes.clone().into()).await;
        }
    }
}

/// The session id inside a local run id (`process:<name>:<session>`; a
/// `spawn` run id is the session id).
fn session_of(run_id: &str) -> String {
    run_id.rsplit(':').next().unwrap_or(run_id).to_owned()
}
