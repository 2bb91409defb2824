//! Cancellation receipts: what cancelling or disposing a run stopped
//! ([`Receipt`], [`Branch`]) and what a provider's child reports of it
//! ([`StopReport`]).

use serde::{Deserialize, Serialize};

use super::{RunUsage, StopReason};

/// What cancelling or disposing a run stopped (`Run::cancel_and_wait`).
///
/// A [`Receipt`] is a tree. Its root is the run itself (ids, provider, final
/// stop reason, the processes reaped for it); its [`Branch`]es are the runs
/// started under it, each a receipt of its own, or an explicit
/// [`Branch::Unknown`] where the runtime cannot know what was there (an ACP
/// agent's own runs, a `serve` child that died before it reported, a lost
/// remote worker's runs). A receipt never pretends: when a branch is unknown it
/// says so and why.
///
/// Where the branches come from:
/// - in-process descendants (`spawn`, `fork`, and any provider whose child
///   exposes a local agent) through session lineage: every run whose
///   parent session is a run's session is that run's child. Each one is
///   listed once it is quiescent, with its settled stop reason;
/// - a provider's own report ([`StopReport`], from `Child::stop_report`):
///   the processes it reaped and the runs its child reported over its wire
///   (the `process` provider's `serve` children report theirs in their
///   `shutdown` reply, a `remote` worker its local run's tree with the
///   result).
///
/// Run ids in a branch reported over a wire were minted by the runtime that
/// ran them (the child process's), not by this one.
///
/// ```
/// use subagents::seam::Branch;
/// use subagents::{Receipt, StopReason};
///
/// use subagents::seam::RunUsage;
///
/// let spent = RunUsage { input_tokens: 40, output_tokens: 2, model_calls: 1, ..RunUsage::default() };
/// let grandchild = Receipt::new(3, "s-3", "spawn", StopReason::Aborted).with_usage(spent);
/// let child = Receipt::new(2, "process:p:s-1", "process", StopReason::Aborted)
///     .with_processes_reaped(vec![4242])
///     .with_children(vec![Branch::Run(grandchild), Branch::unknown("not reported")]);
/// let top = Receipt::new(1, "s-0", "spawn", StopReason::Aborted).with_children(vec![Branch::Run(child)]);
/// assert_eq!(top.descendants().count(), 2);
/// assert_eq!(top.stopped_descendants(), 2);
/// assert_eq!(top.processes_reaped_in_tree(), vec![4242]);
/// assert_eq!(top.usage_in_tree().tokens(), 42);
/// assert_eq!(top.unknown_branches(), vec!["not reported"]);
/// assert!(!top.is_complete());
/// let json = serde_json::to_value(&top).unwrap();
/// assert_eq!(json["children"][0]["kind"], "run");
/// assert_eq!(serde_json::from_value::<Receipt>(json).unwrap(), top);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// The run id its runtime minted (for a branch reported over a wire,
    /// the child runtime's numbering).
    pub run_id: u64,
    /// The child's own name (`Run::child_id`).
    pub child_id: String,
    /// The provider that ran it.
    pub provider: String,
    /// Its final stop reason (`aborted` when the cancel stopped it; a run
    /// that had already ended keeps its own).
    pub stop_reason: StopReason,
    /// The process ids reaped when it was disposed (empty for in-process
    /// runs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes_reaped: Vec<u32>,
    /// What its own model calls spent (its result's usage).
    #[serde(default, skip_serializing_if = "RunUsage::is_empty")]
    pub usage: RunUsage,
    /// The runs it started, and the branches that cannot be known.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<Branch>,
}

/// A branch of a [`Receipt`]: a run, or a part of the tree that cannot be
/// known.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Branch {
    /// A run started under the parent, with its own subtree.
    Run(Receipt),
    /// Runs may have been here, but nobody could say: `reason` says why.
    Unknown {
        /// Why this branch is unknown (fixed wording, no payloads).
        reason: String,
    },
}

impl Branch {
    /// An unknown branch.
    pub fn unknown(reason: impl Into<String>) -> Self {
        Branch::Unknown { reason: reason.into() }
    }

    /// The run, when this branch is one.
    pub fn as_run(&self) -> Option<&Receipt> {
        match self {
            Branch::Run(receipt) => Some(receipt),
            Branch::Unknown { .. } => None,
        }
    }
}

impl Receipt {
    /// A receipt of one run with nothing under it.
    pub fn new(run_id: u64, child_id: impl Into<String>, provider: impl Into<String>, stop_reason: StopReason) -> Self {
        Receipt {
            run_id,
            child_id: child_id.into(),
            provider: provider.into(),
            stop_reason,
            processes_reaped: Vec::new(),
            usage: RunUsage::default(),
            children: Vec::new(),
        }
    }

    /// This receipt with what the run's own model calls spent.
    pub fn with_usage(mut self, usage: RunUsage) -> Self {
        self.usage = usage;
        self
    }

    /// This receipt with the processes reaped for the run.
    pub fn with_processes_reaped(mut self, pids: Vec<u32>) -> Self {
        self.processes_reaped = pids;
        self
    }

    /// This receipt with its branches.
    pub fn with_children(mut self, children: Vec<Branch>) -> Self {
        self.children = children;
        self
    }

    /// Every run under this one, depth first (not this one).
    pub fn descendants(&self) -> impl Iterator<Item = &Receipt> + '_ {
        let mut stack: Vec<&Receipt> = self.children.iter().rev().filter_map(Branch::as_run).collect();
        std::iter::from_fn(move || {
            let next = stack.pop()?;
            stack.extend(next.children.iter().rev().filter_map(Branch::as_run));
            Some(next)
        })
    }

    /// How many runs under this one the cancel stopped (they ended
    /// `aborted`).
    pub fn stopped_descendants(&self) -> usize {
        self.descendants().filter(|r| r.stop_reason == StopReason::Aborted).count()
    }

    /// Every process reaped in the tree, this run's first.
    pub fn processes_reaped_in_tree(&self) -> Vec<u32> {
        let mut pids = self.processes_reaped.clone();
        pids.extend(self.descendants().flat_map(|r| r.processes_reaped.iter().copied()));
        pids
    }

    /// What the whole tree spent: this run and every known run under it
    /// (an unknown branch's spending is not known, so not counted).
    pub fn usage_in_tree(&self) -> RunUsage {
        self.usage + self.descendants().map(|r| r.usage).sum()
    }

    /// The reasons of every unknown branch in the tree.
    pub fn unknown_branches(&self) -> Vec<&str> {
        std::iter::once(self)
            .chain(self.descendants())
            .flat_map(|r| r.children.iter())
            .filter_map(|branch| match branch {
                Branch::Unknown { reason } => Some(reason.as_str()),
                Branch::Run(_) => None,
            })
            .collect()
    }

    /// Whether every branch is known.
    pub fn is_complete(&self) -> bool {
        self.unknown_branches().is_empty()
    }
}

/// What a provider's child reports when it is released (see
/// `Child::stop_report`): the processes it reaped and the runs it started
/// beyond the runtime's sight (reported over its wire), or an unknown
/// branch. In-process descendants are found by the runtime through session
/// lineage and need no report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StopReport {
    /// Process ids reaped by the child's dispose.
    pub processes_reaped: Vec<u32>,
    /// Runs under the child the runtime cannot see for itself.
    pub children: Vec<Branch>,
}

impl StopReport {
    /// Nothing to report.
    pub fn new() -> Self {
        StopReport::default()
    }

    /// This report with a reaped process.
    pub fn with_process(mut self, pid: u32) -> Self {
        self.processes_reaped.push(pid);
        self
    }

    /// This report with branches.
    pub fn with_children(mut self, children: impl IntoIterator<Item = Branch>) -> Self {
        self.children.extend(children);
        self
    }

    /// Whether there is nothing in it.
    pub fn is_empty(&self) -> bool {
        self.processes_reaped.is_empty() && self.children.is_empty()
    }
}
