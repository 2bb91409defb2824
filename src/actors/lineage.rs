//! Session lineage for receipts: the receipt of a run gathered once it is
//! quiescent, with the runs started under its session.
//!
//! Which runs those are is the run's [`Family`], kept in its shared state
//! (`run_shared.rs`): this file only reads families, so the arrow between
//! the two points one way. The serve side opens a family for its own
//! session the same way (`Subagents::lineage_scope`).
//!
//! A descendant is listed only once it is quiescent, with the stop reason
//! it settled with; one that does not become quiescent within
//! [`DESCENDANT_QUIESCENCE_BOUND`] (its owner never disposed it) is an
//! unknown branch, not a guess.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::time::Instant;

use super::run_shared::{Family, RunShared};
use crate::seam::{Branch, Receipt, RunUsage, StopReason};

/// How long a receipt waits, in all, for descendants to become quiescent.
/// Their owners dispose them as the cancel travels down the tree, so this
/// only bounds a descendant somebody forgot to dispose.
pub(crate) const DESCENDANT_QUIESCENCE_BOUND: Duration = Duration::from_secs(30);

/// The branches of every run adopted into `family` so far, each gathered
/// once it is quiescent (all of them by `deadline`).
pub(crate) fn branches(family: &Family, deadline: Instant) -> BoxFuture<'static, Vec<Branch>> {
    let children = family.adopted();
    Box::pin(async move {
        let mut branches = Vec::with_capacity(children.len());
        for shared in children {
            branches.push(branch_of(&shared, deadline).await);
        }
        branches
    })
}

/// A descendant's branch: its receipt once quiescent, else unknown.
async fn branch_of(shared: &Arc<RunShared>, deadline: Instant) -> Branch {
    if tokio::time::timeout_at(deadline, shared.quiescent()).await.is_err() {
        return Branch::unknown(format!(
            "run {} ({}) was not quiescent within {} s of its parent's; its outcome is not known",
            shared.run_id,
            shared.provider(),
            DESCENDANT_QUIESCENCE_BOUND.as_secs()
        ));
    }
    Branch::Run(receipt_of(shared, deadline).await)
}

/// The receipt of a quiescent run: its settled stop reason, what its child
/// reported, and its family's branches.
pub(crate) async fn receipt_of(shared: &RunShared, deadline: Instant) -> Receipt {
    let (stop_reason, usage) = match shared.settled() {
        Some(Ok(result)) => (result.stop_reason, result.usage),
        // Settled as an infrastructure fault (the runtime stopped under it).
        Some(Err(_)) | None => (StopReason::Error, RunUsage::default()),
    };
    let mut children = match shared.family() {
        Some(family) => branches(family, deadline).await,
        None => Vec::new(),
    };
    let mut receipt = Receipt::new(shared.run_id, shared.child_id(), shared.provider(), stop_reason).with_usage(usage);
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
