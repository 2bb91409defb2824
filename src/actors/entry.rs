//! One registration of a provider: what the provider table, the provider's
//! actor and every run of it share, and the lease by which a run counts
//! against its provider. The lowest floor of the actor core: it names no
//! actor; a retired provider's drain is announced through a
//! [`Recipient`](actix::Recipient) of [`ProviderDrained`].

use std::sync::Arc;

use actix::{Message, Recipient};

use crate::seam::{Capability, Provider, ProviderInfo};
use crate::sync::{AtomicUsize, Ordering};

/// A retired provider's last run has ended.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct ProviderDrained(pub u64);

/// One registration of a provider, shared by the table, its actor and runs.
pub(crate) struct ProviderEntry {
    /// Unique per registration, so a re-registration under the same name is
    /// a different entry.
    pub key: u64,
    pub info: ProviderInfo,
    pub provider: Arc<dyn Provider>,
    runs: RunCount,
    /// Who hears that this retired provider's last run ended.
    drained: Recipient<ProviderDrained>,
}

impl ProviderEntry {
    pub(crate) fn new(key: u64, provider: Arc<dyn Provider>, drained: Recipient<ProviderDrained>) -> Self {
        let info = ProviderInfo {
            name: provider.name().to_owned(),
            // One table of what a start may ask: `detached` is the
            // provider's `offers_detached`, whatever `capabilities` says.
            capabilities: provider.capabilities().with(Capability::Detached, provider.offers_detached()),
            inherits_parent_context: provider.inherits_parent_context(),
            route_defaults: provider.route_defaults(),
            detaches: provider.offers_detached(),
        };
        ProviderEntry { key, info, provider, runs: RunCount::default(), drained }
    }

    pub(crate) fn name(&self) -> &str {
        &self.info.name
    }

    /// Mark retired; true when no run is live, so the actor may stop now.
    pub(crate) fn retire(&self) -> bool {
        self.runs.retire()
    }
}

/// A provider's live-run count and its retired flag in one atomic word
/// (the flag in bit 0, the count above it), so that retiring and the last
/// run ending are decided by read-modify-writes of the same word: exactly
/// one side sees the other and the drained notice is never lost. (Two
/// separate atomics, each stored then the other loaded, is the
/// store-buffering pattern: both sides can read the old value.)
#[derive(Debug)]
pub(crate) struct RunCount(AtomicUsize);

impl Default for RunCount {
    fn default() -> Self {
        RunCount(AtomicUsize::new(0))
    }
}

const RETIRED: usize = 1;
const ONE_RUN: usize = 2;

impl RunCount {
    /// One more live run.
    pub(crate) fn acquire(&self) {
        self.0.fetch_add(ONE_RUN, Ordering::AcqRel);
    }

    /// One run fewer; true when it was the last run of a retired provider.
    pub(crate) fn release(&self) -> bool {
        self.0.fetch_sub(ONE_RUN, Ordering::AcqRel) == ONE_RUN | RETIRED
    }

    /// Marks retired; true when no run was live at that moment.
    pub(crate) fn retire(&self) -> bool {
        self.0.fetch_or(RETIRED, Ordering::AcqRel) & !RETIRED == 0
    }
}

/// Counts one live run against its provider; the registry hears only when a
/// retired provider's last run ends.
pub(crate) struct ProviderRunLease {
    entry: Arc<ProviderEntry>,
}

impl ProviderRunLease {
    pub(crate) fn new(entry: Arc<ProviderEntry>) -> Self {
        entry.runs.acquire();
        ProviderRunLease { entry }
    }
}

impl Drop for ProviderRunLease {
    fn drop(&mut self) {
        if self.entry.runs.release() {
            self.entry.drained.do_send(ProviderDrained(self.entry.key));
        }
    }
}

#[cfg(all(test, not(subagents_loom)))]
mod tests {
    use super::RunCount;

    #[test]
    fn exactly_one_side_learns_that_a_retired_provider_drained() {
        // Retired while a run is live: the run's end reports the drain.
        let count = RunCount::default();
        count.acquire();
        assert!(!count.retire());
        assert!(count.release());
        // Retired with no run: retiring reports it; nothing later does.
        let count = RunCount::default();
        count.acquire();
        assert!(!count.release());
        assert!(count.retire());
    }

    #[test]
    fn racing_retire_and_last_release_never_lose_the_drain() {
        for _ in 0..2_000 {
            let count = std::sync::Arc::new(RunCount::default());
            count.acquire();
            let releaser = {
                let count = count.clone();
                std::thread::spawn(move || count.release())
            };
            let retired_idle = count.retire();
            let released_last = releaser.join().unwrap();
            assert!(retired_idle ^ released_last, "exactly one side reports: {retired_idle} {released_last}");
        }
    }
}

#[cfg(all(test, subagents_loom))]
mod loom_tests {
    use loom::sync::Arc;

    use super::RunCount;

    /// Retiring and the last run ending, in every interleaving: exactly one
    /// side reports the drain (the notice is neither lost nor doubled).
    #[test]
    fn loom_retire_and_last_release_report_the_drain_exactly_once() {
        loom::model(|| {
            let count = Arc::new(RunCount::default());
            count.acquire();
            let releaser = {
                let count = count.clone();
                loom::thread::spawn(move || count.release())
            };
            let retired_idle = count.retire();
            let released_last = releaser.join().unwrap();
            assert!(retired_idle ^ released_last, "{retired_idle} {released_last}");
        });
    }

    /// Two runs ending while the provider retires.
    #[test]
    fn loom_two_runs_and_a_retire_report_the_drain_once() {
        loom::model(|| {
            let count = Arc::new(RunCount::default());
            count.acquire();
            count.acquire();
            let ends: Vec<_> = (0..2)
                .map(|_| {
                    let count = count.clone();
                    loom::thread::spawn(move || count.release())
                })
                .collect();
            let mut reports = usize::from(count.retire());
            for end in ends {
                reports += usize::from(end.join().unwrap());
            }
            assert_eq!(reports, 1);
        });
    }
}
