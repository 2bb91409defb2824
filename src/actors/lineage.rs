//! Session lineage for receipts: which runs were started under which
//! session, and the receipt of a run gathered once it is quiescent.
//!
//! A run whose child exposes a local agent opens a [`Family`] under its
//! session id when it is launched (before its child can delegate); every
//! run published with that session as its parent is adopted into it. The
//! family lives as long as the run's shared state, so a parent's receipt
//! can be gathered after the parent and its children are gone from the run
//! table. The serve side opens a family for its own session the same way
//! (`Subagents::lineage_scope`). Only runs and scopes that open a family are
//! tracked, so a long-lived root agent that is not a run keeps no list.
//!
//! A descendant is listed only once it is quiescent, with the stop reason
//! it settled with; one that does not become quiescent within
//! [`DESCENDANT_QUIESCENCE_BOUND`] (its owner never disposed it) is an
//! unknown branch, not a guess.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::time::Instant;

use super::run_shared::RunShared;
use crate::seam::{Branch, Receipt, RunUsage, StopReason};

/// How long a receipt waits, in all, for descendants to become quiescent.
/// Their owners dispose them as the cancel travels down the tree, so this
/// only bounds a descendant somebody forgot to dispose.
pub(crate) const DESCENDANT_QUIESCENCE_BOUND: Duration = Duration::from_secs(30);

/// The runs published under one session, in start order.
pub(crate) struct Family {
    session: String,
    children: Mutex<Vec<Adopted>>,
}

/// One child of a family: its name and its shared state.
#[derive(Clone)]
struct Adopted {
    child_id: String,
    shared: Arc<RunShared>,
}

impl Family {
    pub(crate) fn new(session: impl Into<String>) -> Self {
        Family { session: session.into(), children: Mutex::new(Vec::new()) }
    }

    pub(crate) fn session(&self) -> &str {
        &self.session
    }

    pub(crate) fn adopt(&self, child_id: &str, shared: Arc<RunShared>) {
        let adopted = Adopted { child_id: child_id.to_owned(), shared };
        self.children.lock().unwrap_or_else(|e| e.into_inner()).push(adopted);
    }

    fn snapshot(&self) -> Vec<Adopted> {
        self.children.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The branches of every run adopted so far, each gathered once it is
    /// quiescent (all of them by `deadline`).
    pub(crate) fn branches(&self, deadline: Instant) -> BoxFuture<'static, Vec<Branch>> {
        let children = self.snapshot();
        Box::pin(async move {
            let mut branches = Vec::with_capacity(children.len());
            for child in children {
                branches.push(branch_of(child, deadline).await);
            }
            branches
        })
    }
}

/// A descendant's branch: its receipt once quiescent, else unknown.
async fn branch_of(child: Adopted, deadline: Instant) -> Branch {
    if tokio::time::timeout_at(deadline, child.shared.quiescent()).await.is_err() {
        return Branch::unknown(format!(
            "run {} ({}) was not quiescent within {} s of its parent's; its outcome is not known",
            child.shared.run_id,
            child.shared.provider(),
            DESCENDANT_QUIESCENCE_BOUND.as_secs()
        ));
    }
    Branch::Run(receipt_of(&child.shared, &child.child_id, deadline).await)
}

/// The receipt of a quiescent run: its settled stop reason, what its child
/// reported, and its family's branches.
pub(crate) async fn receipt_of(shared: &RunShared, child_id: &str, deadline: Instant) -> Receipt {
    let (stop_reason, usage) = match shared.settled() {
        Some(Ok(result)) => (result.stop_reason, result.usage),
        // Settled as an infrastructure fault (the runtime stopped under it).
        Some(Err(_)) | None => (StopReason::Error, RunUsage::default()),
    };
    let mut children = match shared.family() {
        Some(family) => family.branches(deadline).await,
        None => Vec::new(),
    };
    let mut receipt = Receipt::new(shared.run_id, child_id, shared.provider(), stop_reason).with_usage(usage);
    if let Some(report) = shared.stop_report() {
        receipt.processes_reaped = report.processes_reaped.clone();
        children.extend(report.children.iter().cloned());
    }
    receipt.children = children;
    receipt
}

/// The deadline for a receipt gathered now.
pub(crate) fn deadline() -> Instant {
    Instant::now() + DESCENDANT_QUIESCENCE_BOUND
}
