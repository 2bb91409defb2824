//! What a run actor shares with its `Run` handle and the start path: the
//! result, the quiescence signal, the event gate and the run's family —
//! one allocation per run.
//!
//! A run whose child exposes a local agent opens a [`Family`] under its
//! session id when it is launched (before its child can delegate); every
//! run published with that session as its parent is adopted into it. The
//! family lives as long as the run's shared state, so a parent's receipt
//! (`lineage.rs`, which reads families) can be gathered after the parent
//! and its children are gone from the run table. Only runs and scopes that
//! open a family are tracked, so a long-lived root agent that is not a run
//! keeps no list.

use std::sync::{Arc, Mutex, OnceLock, RwLock};

use tokio::sync::Notify;

use super::entry::ProviderEntry;
use super::gate::Gate;
use crate::events::{EventBus, ProgressUpdate, RunEndInfo, RunInfo, RunProgress, SubagentEvent};
use crate::seam::{DisposeError, ProgressSink, RunResult, StopReason, StopReport, SubagentError};

/// A run's settled result, boxed from where it is made: it is hundreds of
/// bytes, and on its way to the run table it passes through every layer
/// of the child's contained future and the run actor.
pub(crate) type Settlement = Box<Result<RunResult, SubagentError>>;

pub(crate) struct RunShared {
    pub run_id: u64,
    pub entry: Arc<ProviderEntry>,
    pub parent_session: Option<String>,
    /// The child's own id, once the provider created it.
    child_id: OnceLock<String>,
    bus: EventBus,
    gate: Gate<SubagentEvent>,
    /// Boxed, like a failed dispose: both are large, and a live run (most
    /// of a fan-out's) has neither yet.
    result: OnceLock<Settlement>,
    quiescent: OnceLock<Result<(), Box<DisposeError>>>,
    changed: Notify,
    /// The caller's own receiver of this run's progress, dropped once the
    /// run is quiescent: a run's shared state may outlive it (a receipt's
    /// lineage keeps it), and the sink holds its caller's resources (an
    /// agent's update stream, a served session's output).
    progress: RwLock<Option<ProgressSink>>,
    /// The runs started under this run's session, when its child has one.
    family: OnceLock<Arc<Family>>,
    /// What the child reported when it was released, when not empty.
    stop_report: OnceLock<Box<StopReport>>,
}

/// The runs published under one session, in start order.
pub(crate) struct Family {
    session: String,
    /// Each adopted run's shared state (its child id is in it).
    children: Mutex<Vec<Arc<RunShared>>>,
}

impl Family {
    pub(crate) fn new(session: impl Into<String>) -> Self {
        Family { session: session.into(), children: Mutex::new(Vec::new()) }
    }

    pub(crate) fn session(&self) -> &str {
        &self.session
    }

    pub(crate) fn adopt(&self, shared: Arc<RunShared>) {
        self.children.lock().unwrap_or_else(|e| e.into_inner()).push(shared);
    }

    /// The runs adopted so far, in start order.
    pub(crate) fn adopted(&self) -> Vec<Arc<RunShared>> {
        self.children.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl RunShared {
    pub(crate) fn new(
        run_id: u64,
        entry: Arc<ProviderEntry>,
        parent_session: Option<String>,
        bus: EventBus,
        progress: Option<ProgressSink>,
    ) -> Self {
        RunShared {
            run_id,
            entry,
            parent_session,
            child_id: OnceLock::new(),
            bus,
            gate: Gate::new(),
            result: OnceLock::new(),
            quiescent: OnceLock::new(),
            changed: Notify::new(),
            progress: RwLock::new(progress),
            family: OnceLock::new(),
            stop_report: OnceLock::new(),
        }
    }

    pub(crate) fn provider(&self) -> &str {
        self.entry.name()
    }

    /// The child's own id (empty until the provider created the child).
    pub(crate) fn child_id(&self) -> &str {
        self.child_id.get().map_or("", String::as_str)
    }

    /// Called by the run actor when the provider created the child.
    pub(crate) fn set_child_id(&self, id: String) {
        let _ = self.child_id.set(id);
    }

    /// The result, once settled.
    pub(crate) async fn result(&self) -> Result<RunResult, SubagentError> {
        self.wait(|shared| shared.result.get().map(|result| (**result).clone())).await
    }

    /// The result, if settled.
    pub(crate) fn settled(&self) -> Option<&Result<RunResult, SubagentError>> {
        self.result.get().map(|result| &**result)
    }

    /// Called by the run actor when its child, which has a session, is launched.
    pub(crate) fn set_family(&self, family: Arc<Family>) {
        let _ = self.family.set(family);
    }

    pub(crate) fn family(&self) -> Option<&Arc<Family>> {
        self.family.get()
    }

    /// Called by the run actor as it stops, before quiescence is announced.
    pub(crate) fn set_stop_report(&self, report: StopReport) {
        if !report.is_empty() {
            let _ = self.stop_report.set(Box::new(report));
        }
    }

    pub(crate) fn stop_report(&self) -> Option<&StopReport> {
        self.stop_report.get().map(|report| &**report)
    }

    /// How dispose went, once the run is quiescent.
    pub(crate) async fn quiescent(&self) -> Result<(), DisposeError> {
        self.wait(|shared| shared.quiescent.get().map(|outcome| outcome.clone().map_err(|error| *error))).await
    }

    async fn wait<T>(&self, read: impl Fn(&Self) -> Option<T>) -> T {
        // Settled already (a result read after it came): no waiter to register.
        if let Some(value) = read(self) {
            return value;
        }
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(value) = read(self) {
                return value;
            }
            changed.await;
        }
    }

    /// Settle the result (first call wins) and send `End` through the gate.
    pub(crate) fn settle(&self, result: Settlement) {
        let end = |result: &Result<RunResult, SubagentError>| RunEndInfo {
            run_id: self.run_id,
            child_id: self.child_id().to_owned(),
            provider: self.provider().to_owned(),
            parent_session: self.parent_session.clone(),
            stop_reason: result.as_ref().map_or(StopReason::Error, |r| r.stop_reason),
            last_message: result.as_ref().ok().map(|r| r.output.clone()),
            diagnostic: result.as_ref().ok().and_then(|r| r.diagnostic.clone()),
        };
        if self.result.get().is_some() {
            return;
        }
        self.end(|| end(&result));
        if self.result.set(result).is_ok() {
            self.changed.notify_waiters();
        }
    }

    pub(crate) fn set_quiescent(&self, outcome: Result<(), DisposeError>) {
        let sink = self.progress.write().unwrap_or_else(|e| e.into_inner()).take();
        drop(sink);
        if self.quiescent.set(outcome.map_err(Box::new)).is_ok() {
            self.changed.notify_waiters();
        }
    }

    /// Called by the start path once the run is published.
    pub(crate) fn publish(&self, info: impl FnOnce() -> RunInfo) {
        let start = || SubagentEvent::Start(Arc::new(info()));
        self.gate.publish(self.bus.is_observed(), start, |event| self.bus.emit(event));
    }
}

impl RunShared {
    /// Progress from the running child.
    pub(crate) fn progress(&self, update: ProgressUpdate) {
        if let Some(sink) = &*self.progress.read().unwrap_or_else(|e| e.into_inner()) {
            sink.send(&update);
        }
        let event = || {
            SubagentEvent::Progress(Arc::new(RunProgress {
                run_id: self.run_id,
                provider: self.provider().to_owned(),
                parent_session: self.parent_session.clone(),
                update,
            }))
        };
        self.gate.progress(self.bus.is_observed(), event, |event| self.bus.emit(event));
    }

    /// Whether progress would reach a listener or the caller's receiver.
    pub(crate) fn observes_progress(&self) -> bool {
        self.bus.is_observed() || self.progress.read().unwrap_or_else(|e| e.into_inner()).is_some()
    }

    fn end(&self, end: impl FnOnce() -> RunEndInfo) {
        let end = || SubagentEvent::End(Arc::new(end()));
        self.gate.end(self.bus.is_observed(), end, |event| self.bus.emit(event));
    }
}
