//! The delegation budget: one lease of depth, width, total runs, tokens and
//! a wall-clock deadline, shared down a delegation tree.
//!
//! A [`Budget`] is the limits, every one optional. Opening it
//! ([`Budget::lease`]) makes a [`BudgetLease`]: a shared ledger (atomics
//! behind an `Arc`) that a root hands to its runs through
//! [`StartRequest::with_budget`](super::StartRequest::with_budget), and that
//! every descendant inherits (an in-process child holds its own lease, one
//! level further down the same ledger, and delegates through it).
//!
//! - **depth**: how many levels below the lease's root a child may be.
//! - **width**: concurrent children of one holder (a parent agent, or the
//!   caller that shares one lease across its starts). A child counts from
//!   admission until its run is quiescent (disposed).
//! - **runs**: total runs admitted in the tree. A start that is refused
//!   later (the provider fails, the signal trips) gives its run back.
//! - **tokens**: the sum of the model usage reports of every in-process
//!   agent holding the lease.
//! - **deadline**: wall-clock time from the moment the lease was opened.
//!
//! The start path checks the lease before any child exists; the next start
//! that would exceed it fails with `BUDGET_EXHAUSTED`
//! ([`SubagentError::BudgetExhausted`](super::SubagentError::BudgetExhausted)),
//! naming the limit and the numbers. Reservation is a compare-exchange loop
//! per counter, so concurrent starts never over-admit. An in-process agent
//! holding the lease makes no model call once its tokens are spent, and runs
//! no tool call of the answer that spent them: its turn ends `MaxTokens`
//! (a final answer that spends them still completes). At the deadline its
//! turn ends `Aborted`. Either way it keeps its partial output.
//!
//! Out of process (`process`, `remote`), the child gets what is left when it
//! starts ([`BudgetLease::remaining`]) and enforces that for its subtree;
//! what it spends there is not charged back to this ledger.
//!
//! ```
//! use std::time::Duration;
//! use subagents::seam::BudgetLimit;
//! use subagents::Budget;
//!
//! let budget = Budget::new().with_runs(2).with_width(1).with_deadline(Duration::from_secs(60));
//! let lease = budget.lease();
//! assert_eq!(lease.remaining().runs, Some(2));
//! let refused = lease.charge_tokens(10);
//! assert!(!refused, "no token limit was set");
//! assert_eq!(BudgetLimit::Runs.to_string(), "total runs");
//! ```

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// The limits of a delegation budget, shared down a delegation tree;
/// `None` is unlimited. Serialised (for the process and remote wires and a
/// `fanout` task line) as `{"depth"?, "width"?, "runs"?, "tokens"?,
/// "deadline_ms"?}`.
///
/// Set it on a root ([`StartRequest::with_budget`](super::StartRequest::with_budget),
/// `SubagentToolConfig::with_budget`, `fanout --budget-*`); every
/// descendant inherits it. The next start that would exceed it fails with
/// `BUDGET_EXHAUSTED` before any child exists, naming the limit and the
/// numbers; an in-process child out of tokens stops `MaxTokens`, one at the
/// deadline `Aborted`, each with its partial output.
///
/// ```
/// use subagents::providers::MockProvider;
/// use subagents::{Budget, CancellationToken, Parent, Runtime, StartRequest};
///
/// let runtime = Runtime::builder().workers(1).build().unwrap();
/// let subagents = runtime.subagents();
/// subagents.register_provider(MockProvider::new("mock")).unwrap().keep();
/// // One lease for both starts: one run in all.
/// let lease = Budget::new().with_runs(1).lease();
/// let error = runtime.block_on(async move {
///     let request = || {
///         StartRequest::new("task", Parent::root("/tmp"), CancellationToken::new()).with_budget_lease(lease.clone())
///     };
///     let run = subagents.start("mock", request()).await.unwrap();
///     let refused = subagents.start("mock", request()).await.unwrap_err();
///     run.dispose().await.unwrap();
///     refused
/// });
/// assert_eq!(error.code(), "BUDGET_EXHAUSTED");
/// assert_eq!(error.to_string(), "budget exhausted: total runs 1 of 1 used");
/// runtime.shutdown_blocking();
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Levels below the lease's root a child may be (1: children, no
    /// grandchildren).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
    /// Concurrent children of one parent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub width: Option<u32>,
    /// Total runs in the tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<u64>,
    /// Total model tokens (input + output) in the tree.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    /// Wall-clock time from the lease's opening.
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "deadline_ms", with = "millis")]
    pub deadline: Option<Duration>,
}

impl Budget {
    /// No limit at all.
    pub fn new() -> Self {
        Budget::default()
    }

    /// At most `levels` levels of delegation below the root.
    pub fn with_depth(mut self, levels: u32) -> Self {
        self.depth = Some(levels);
        self
    }

    /// At most `children` concurrent children per parent.
    pub fn with_width(mut self, children: u32) -> Self {
        self.width = Some(children);
        self
    }

    /// At most `runs` runs in the whole tree.
    pub fn with_runs(mut self, runs: u64) -> Self {
        self.runs = Some(runs);
        self
    }

    /// At most `tokens` model tokens in the whole tree.
    pub fn with_tokens(mut self, tokens: u64) -> Self {
        self.tokens = Some(tokens);
        self
    }

    /// Everything must be done within `deadline` of the lease's opening.
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// Whether no limit is set.
    pub fn is_unlimited(&self) -> bool {
        *self == Budget::default()
    }

    /// Opens a lease on these limits now (the deadline starts counting).
    pub fn lease(self) -> BudgetLease {
        let ledger = Arc::new(Ledger {
            limits: self,
            opened: Instant::now(),
            runs: AtomicU64::new(0),
            tokens: AtomicU64::new(0),
        });
        BudgetLease::holding(vec![Rung { ledger, level: 0 }])
    }

    /// What a relayed child (one the caller already admitted, started again
    /// on a worker through its own start path) may use: the worker's start
    /// takes one more level and one more run of the lease, which the caller
    /// already counted.
    #[cfg(feature = "remote")]
    pub(crate) fn relayed(self) -> Budget {
        Budget { depth: self.depth.map(|d| d.saturating_add(1)), runs: self.runs.map(|r| r.saturating_add(1)), ..self }
    }
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(value: &Option<Duration>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(d) => serializer.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            None => serializer.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(deserializer)?.map(Duration::from_millis))
    }
}

/// Which limit of a [`Budget`] refused a start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BudgetLimit {
    /// [`Budget::depth`].
    Depth,
    /// [`Budget::width`].
    Width,
    /// [`Budget::runs`].
    Runs,
    /// [`Budget::tokens`].
    Tokens,
    /// [`Budget::deadline`].
    Deadline,
}

impl fmt::Display for BudgetLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BudgetLimit::Depth => "depth",
            BudgetLimit::Width => "width",
            BudgetLimit::Runs => "total runs",
            BudgetLimit::Tokens => "tokens",
            BudgetLimit::Deadline => "deadline",
        })
    }
}

/// A refused start: which limit, how much of it is used and what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetExhausted {
    /// The limit that refused.
    pub limit: BudgetLimit,
    /// What is used: levels the child would be down, concurrent children,
    /// runs admitted, tokens reported, milliseconds elapsed.
    pub used: u64,
    /// The limit's value in the same unit.
    pub of: u64,
}

impl fmt::Display for BudgetExhausted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let BudgetExhausted { limit, used, of } = self;
        match limit {
            BudgetLimit::Depth => {
                write!(f, "budget exhausted: depth: the child would be {used} levels down, of {of} allowed")
            }
            BudgetLimit::Width => write!(f, "budget exhausted: width {used} of {of} concurrent children running"),
            BudgetLimit::Runs => write!(f, "budget exhausted: total runs {used} of {of} used"),
            BudgetLimit::Tokens => write!(f, "budget exhausted: tokens {used} of {of} used"),
            BudgetLimit::Deadline => write!(f, "budget exhausted: deadline {used} ms of {of} ms used"),
        }
    }
}

/// The shared counters of one opened budget.
#[derive(Debug)]
struct Ledger {
    limits: Budget,
    opened: Instant,
    runs: AtomicU64,
    tokens: AtomicU64,
}

impl Ledger {
    fn deadline(&self) -> Option<Instant> {
        self.limits.deadline.map(|d| self.opened + d)
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Refuses when the deadline passed or the tokens are spent.
    fn check_open(&self) -> Result<(), BudgetExhausted> {
        if let Some(deadline) = self.limits.deadline {
            let of = u64::try_from(deadline.as_millis()).unwrap_or(u64::MAX);
            if self.opened.elapsed() >= deadline {
                return Err(BudgetExhausted { limit: BudgetLimit::Deadline, used: self.elapsed_ms(), of });
            }
        }
        if let Some(of) = self.limits.tokens {
            let used = self.tokens.load(Ordering::Acquire);
            if used >= of {
                return Err(BudgetExhausted { limit: BudgetLimit::Tokens, used, of });
            }
        }
        Ok(())
    }
}

/// One ledger a holder answers to, and how far below its root the holder is.
#[derive(Clone, Debug)]
struct Rung {
    ledger: Arc<Ledger>,
    level: u32,
}

/// What one holder (a parent agent, or a caller sharing a lease) holds.
#[derive(Debug)]
struct Holder {
    /// Usually one; more when a budget is set below an inherited one (every
    /// ledger binds).
    rungs: Vec<Rung>,
    /// Children of this holder admitted and not yet quiescent.
    children: AtomicU32,
}

/// An opened [`Budget`], shared: clones are the same holder on the same
/// ledger. Open one with [`Budget::lease`]; a run's child holds its own
/// lease on the same ledger ([`ProviderContext::budget`](super::ProviderContext::budget)).
#[derive(Clone, Debug)]
pub struct BudgetLease {
    holder: Arc<Holder>,
}

impl BudgetLease {
    fn holding(rungs: Vec<Rung>) -> Self {
        BudgetLease { holder: Arc::new(Holder { rungs, children: AtomicU32::new(0) }) }
    }

    /// What is left to this lease's holder: levels below it, runs, tokens,
    /// time, and the width each of its children gets. Out-of-process
    /// children start on this.
    pub fn remaining(&self) -> Budget {
        let mut left = Budget::default();
        for Rung { ledger, level } in &self.holder.rungs {
            let limits = &ledger.limits;
            let depth = limits.depth.map(|d| d.saturating_sub(*level));
            let runs = limits.runs.map(|r| r.saturating_sub(ledger.runs.load(Ordering::Acquire)));
            let tokens = limits.tokens.map(|t| t.saturating_sub(ledger.tokens.load(Ordering::Acquire)));
            let deadline = limits.deadline.map(|d| d.saturating_sub(ledger.opened.elapsed()));
            left.depth = min_option(left.depth, depth);
            left.width = min_option(left.width, limits.width);
            left.runs = min_option(left.runs, runs);
            left.tokens = min_option(left.tokens, tokens);
            left.deadline = min_option(left.deadline, deadline);
        }
        left
    }

    /// When this holder's time is up (the earliest deadline it answers to).
    pub fn deadline(&self) -> Option<Instant> {
        self.holder.rungs.iter().filter_map(|r| r.ledger.deadline()).min()
    }

    /// Charges `tokens` from a model usage report to every ledger this
    /// holder answers to; `true` when one of them is now spent (the holder
    /// should stop with what it has).
    pub fn charge_tokens(&self, tokens: u64) -> bool {
        let mut spent = false;
        for Rung { ledger, .. } in &self.holder.rungs {
            let used = ledger.tokens.fetch_add(tokens, Ordering::AcqRel).saturating_add(tokens);
            spent |= ledger.limits.tokens.is_some_and(|max| used >= max);
        }
        spent
    }

    /// Whether a ledger this holder answers to has no tokens left.
    pub fn tokens_spent(&self) -> bool {
        self.holder.rungs.iter().any(|Rung { ledger, .. }| {
            ledger.limits.tokens.is_some_and(|max| ledger.tokens.load(Ordering::Acquire) >= max)
        })
    }

    /// Children of this holder admitted and not yet disposed.
    pub fn live_children(&self) -> u32 {
        self.holder.children.load(Ordering::Acquire)
    }

    /// Runs admitted so far on the ledger this lease was opened on (the
    /// outermost one).
    pub fn runs_used(&self) -> u64 {
        self.holder.rungs.first().map_or(0, |r| r.ledger.runs.load(Ordering::Acquire))
    }

    /// Tokens charged so far on the ledger this lease was opened on.
    pub fn tokens_used(&self) -> u64 {
        self.holder.rungs.first().map_or(0, |r| r.ledger.tokens.load(Ordering::Acquire))
    }

    /// Whether two leases are the same holder.
    pub fn same_holder(&self, other: &BudgetLease) -> bool {
        Arc::ptr_eq(&self.holder, &other.holder)
    }

    fn width(&self) -> Option<u32> {
        self.holder.rungs.iter().filter_map(|r| r.ledger.limits.width).min()
    }
}

fn min_option<T: Ord>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Adds one to `counter` unless it is at `max`; `Err(current)` when full.
fn reserve_u32(counter: &AtomicU32, max: Option<u32>) -> Result<(), u32> {
    let Some(max) = max else {
        counter.fetch_add(1, Ordering::AcqRel);
        return Ok(());
    };
    counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).map(drop)
}

fn reserve_u64(counter: &AtomicU64, max: Option<u64>) -> Result<(), u64> {
    let Some(max) = max else {
        counter.fetch_add(1, Ordering::AcqRel);
        return Ok(());
    };
    counter.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).map(drop)
}

/// An admitted child's place in its holders' budgets: it frees the width
/// when dropped (the run is quiescent) and can give the run back when the
/// start is refused after admission.
#[derive(Debug)]
pub(crate) struct Admission {
    holders: Vec<Arc<Holder>>,
    ledgers: Vec<Arc<Ledger>>,
}

impl Admission {
    /// The start failed after admission: the run never existed.
    pub(crate) fn refund_run(&mut self) {
        for ledger in self.ledgers.drain(..) {
            ledger.runs.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        for holder in &self.holders {
            holder.children.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Admits one child of `holders` (the parent's lease and the request's,
/// when present): checks depth, deadline and tokens, then reserves width
/// and a run, rolling back on the first refusal. `Ok(None)` when no lease
/// applies.
pub(crate) fn admit(holders: &[&BudgetLease]) -> Result<Option<(Admission, BudgetLease)>, BudgetExhausted> {
    if holders.is_empty() {
        return Ok(None);
    }
    let mut rungs: Vec<Rung> = Vec::new();
    for holder in holders {
        for rung in &holder.holder.rungs {
            let level = rung.level.saturating_add(1);
            match rungs.iter_mut().find(|r| Arc::ptr_eq(&r.ledger, &rung.ledger)) {
                Some(seen) => seen.level = seen.level.max(level),
                None => rungs.push(Rung { ledger: rung.ledger.clone(), level }),
            }
        }
    }
    for Rung { ledger, level } in &rungs {
        if let Some(of) = ledger.limits.depth {
            if *level > of {
                return Err(BudgetExhausted { limit: BudgetLimit::Depth, used: u64::from(*level), of: u64::from(of) });
            }
        }
        ledger.check_open()?;
    }
    // From here every reservation is in `admission`, so a refusal rolls
    // back by dropping it.
    let mut admission = Admission { holders: Vec::new(), ledgers: Vec::new() };
    for holder in holders {
        if admission.holders.iter().any(|h| Arc::ptr_eq(h, &holder.holder)) {
            continue;
        }
        let width = holder.width();
        reserve_u32(&holder.holder.children, width).map_err(|used| BudgetExhausted {
            limit: BudgetLimit::Width,
            used: u64::from(used),
            of: u64::from(width.unwrap_or(u32::MAX)),
        })?;
        admission.holders.push(holder.holder.clone());
    }
    for Rung { ledger, .. } in &rungs {
        if let Err(used) = reserve_u64(&ledger.runs, ledger.limits.runs) {
            admission.refund_run();
            return Err(BudgetExhausted { limit: BudgetLimit::Runs, used, of: ledger.limits.runs.unwrap_or(u64::MAX) });
        }
        admission.ledgers.push(ledger.clone());
    }
    Ok(Some((admission, BudgetLease::holding(rungs))))
}

#[cfg(all(test, not(subagents_loom)))]
mod tests {
    use super::*;

    #[test]
    fn runs_are_refused_past_the_limit_and_refunded_on_a_failed_start() {
        let root = Budget::new().with_runs(2).lease();
        let (first, _) = admit(&[&root]).unwrap().unwrap();
        let (mut second, _) = admit(&[&root]).unwrap().unwrap();
        let refused = admit(&[&root]).unwrap_err();
        assert_eq!(refused, BudgetExhausted { limit: BudgetLimit::Runs, used: 2, of: 2 });
        assert_eq!(refused.to_string(), "budget exhausted: total runs 2 of 2 used");
        second.refund_run();
        drop(second);
        assert!(admit(&[&root]).is_ok());
        drop(first);
    }

    #[test]
    fn width_is_freed_when_the_admission_drops() {
        let root = Budget::new().with_width(1).lease();
        let first = admit(&[&root]).unwrap().unwrap();
        let refused = admit(&[&root]).unwrap_err();
        assert_eq!(refused.limit, BudgetLimit::Width);
        assert_eq!(root.live_children(), 1);
        drop(first);
        assert_eq!(root.live_children(), 0);
        assert!(admit(&[&root]).is_ok());
    }

    #[test]
    fn depth_counts_levels_below_the_root_and_the_child_inherits_the_ledger() {
        let root = Budget::new().with_depth(1).with_runs(10).lease();
        let (_admitted, child) = admit(&[&root]).unwrap().unwrap();
        assert_eq!(child.remaining().depth, Some(0));
        assert_eq!(child.remaining().runs, Some(9));
        let refused = admit(&[&child]).unwrap_err();
        assert_eq!(refused, BudgetExhausted { limit: BudgetLimit::Depth, used: 2, of: 1 });
    }

    #[test]
    fn tokens_charged_by_a_child_close_the_ledger() {
        let root = Budget::new().with_tokens(100).lease();
        let (_admitted, child) = admit(&[&root]).unwrap().unwrap();
        assert!(!child.charge_tokens(60));
        assert!(child.charge_tokens(40));
        let refused = admit(&[&root]).unwrap_err();
        assert_eq!(refused.to_string(), "budget exhausted: tokens 100 of 100 used");
    }

    #[test]
    fn a_budget_set_below_an_inherited_one_answers_to_both() {
        let outer = Budget::new().with_runs(1).lease();
        let (_admitted, child) = admit(&[&outer]).unwrap().unwrap();
        let inner = Budget::new().with_runs(5).lease();
        let refused = admit(&[&child, &inner]).unwrap_err();
        assert_eq!(refused.limit, BudgetLimit::Runs);
        assert_eq!(inner.runs_used(), 0, "the refused start gave its run back");
        assert_eq!(inner.live_children(), 0, "and its width");
    }

    #[test]
    fn the_wire_form_names_the_deadline_in_milliseconds() {
        let budget = Budget::new().with_runs(3).with_deadline(Duration::from_millis(1500));
        let wire = serde_json::to_value(budget).unwrap();
        assert_eq!(wire, serde_json::json!({"runs": 3, "deadline_ms": 1500}));
        assert_eq!(serde_json::from_value::<Budget>(wire).unwrap(), budget);
        assert_eq!(serde_json::from_value::<Budget>(serde_json::json!({})).unwrap(), Budget::new());
    }
}

#[cfg(all(test, subagents_loom))]
mod loom_tests {
    use super::*;

    /// Two starts race for the last run: exactly one is admitted, in every
    /// interleaving, and the ledger counts exactly it.
    #[test]
    fn loom_two_starts_for_the_last_run_admit_exactly_one() {
        loom::model(|| {
            let root = Budget::new().with_runs(1).with_width(2).lease();
            let racer = {
                let root = root.clone();
                loom::thread::spawn(move || admit(&[&root]).map(|admitted| admitted.map(|(a, _)| a)).ok())
            };
            let mine = admit(&[&root]).map(|admitted| admitted.map(|(a, _)| a)).ok();
            let theirs = racer.join().unwrap();
            assert_eq!(usize::from(mine.is_some()) + usize::from(theirs.is_some()), 1);
            assert_eq!(root.runs_used(), 1);
        });
    }

    /// A child leaving while another is admitted on a width of one: the
    /// newcomer is admitted only once the place is free, and the count of
    /// live children matches the admissions held.
    #[test]
    fn loom_a_freed_place_is_taken_at_most_once() {
        loom::model(|| {
            let root = Budget::new().with_width(1).with_runs(2).lease();
            let held = admit(&[&root]).unwrap().unwrap();
            let leaver = loom::thread::spawn(move || drop(held));
            let newcomer = admit(&[&root]);
            leaver.join().unwrap();
            match newcomer {
                Ok(Some(admitted)) => {
                    assert_eq!((root.live_children(), root.runs_used()), (1, 2));
                    drop(admitted);
                }
                Ok(None) => unreachable!("a lease applies"),
                Err(refused) => {
                    assert_eq!(refused.limit, BudgetLimit::Width);
                    assert_eq!((root.live_children(), root.runs_used()), (0, 1), "the refusal took nothing");
                }
            }
            assert_eq!(root.live_children(), 0);
        });
    }
}
