//! What a caller knows of its broker and its pool, and how long it waits on
//! them: the bounds behind [`RemoteConfig::broker_patience`] and
//! [`RemoteConfig::worker_patience`].
//!
//! The caller's `upkeep` feeds it: every lease write says whether the
//! broker answers, every status request whether a worker of the pool does.
//! A run that waits longer than a bound on one of them is *stalled*: it
//! fails with a [`Diagnostic`] naming what it waited for (categories
//! `broker-unreachable`, `no-worker`), and while runs wait the caller logs
//! a warning every [`SAY_EVERY`] saying what for and until when.
//!
//! Both verdicts belong to the provider, not to a run: the broker has been
//! down since the first failure, the pool silent since the first status
//! request nobody answered. So a batch waits once: the runs in flight fail
//! when the bound is reached, and every start after that fails at once
//! with the same reason ([`Health::past_bound`]) instead of waiting the
//! bound again, run after run. The verdicts are probed again all the
//! while (the lease is written every third of its TTL and at once on a
//! reconnect; the pool is asked every [`STATUS_EVERY`] while runs wait or a
//! start was refused within `worker_patience`), so a broker or a worker
//! that comes back is used by the next start.
//!
//! [`RemoteConfig::broker_patience`]: super::RemoteConfig::broker_patience
//! [`RemoteConfig::worker_patience`]: super::RemoteConfig::worker_patience

use std::time::{Duration, Instant};

use crate::seam::{Category, Diagnostic, Stage};

/// How often a caller with waiting runs says what they wait for.
pub(crate) const SAY_EVERY: Duration = Duration::from_secs(10);

/// How often a caller with unsettled runs asks its pool who is there.
pub(crate) const STATUS_EVERY: Duration = Duration::from_secs(1);

/// Consecutive failed lease writes on a connection that claims to be up
/// before the caller drops it and reconnects: a connection the broker
/// closed, or one that stopped answering, is not trusted for longer.
pub(crate) const FAILED_WRITES_BEFORE_RECONNECT: u32 = 2;

/// How long a caller waits on its broker and on its pool's workers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Patience {
    pub broker: Duration,
    pub worker: Duration,
}

/// A pool asked less often than this is no longer known to be silent: the
/// caller stopped asking (nothing waited), so the next silence is timed
/// afresh.
const ASKS_LAPSE: Duration = STATUS_EVERY.saturating_mul(3);

/// What keeps a run from settling, and for how long it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stall {
    /// The broker has failed every operation (or the connection was down).
    Broker(Duration),
    /// No worker of the pool has answered a status request.
    NoWorker(Duration),
}

/// The caller's view of its broker and pool.
#[derive(Debug)]
pub(crate) struct Health {
    /// Since when every broker operation failed, if they do now.
    broker_down_since: Option<Instant>,
    /// Since when every status request went unanswered, if they do now.
    pool_silent_since: Option<Instant>,
    /// When the pool was last asked.
    pool_asked: Option<Instant>,
    /// When a start was last refused because no worker answers: the pool
    /// is asked while that is recent, so a worker that comes is seen.
    start_refused: Option<Instant>,
    /// When the lease was last written.
    pub lease_written: Instant,
    /// Lease writes that failed in a row.
    pub failed_lease_writes: u32,
    /// When the caller last said what its runs wait for.
    pub said: Option<Instant>,
}

impl Health {
    pub(crate) fn new(now: Instant) -> Health {
        Health {
            broker_down_since: None,
            pool_silent_since: None,
            pool_asked: None,
            start_refused: None,
            lease_written: now,
            failed_lease_writes: 0,
            said: None,
        }
    }

    /// A broker operation succeeded.
    pub(crate) fn broker_answered(&mut self) {
        self.broker_down_since = None;
    }

    /// A broker operation failed, or the connection dropped.
    pub(crate) fn broker_failed(&mut self, now: Instant) {
        self.broker_down_since.get_or_insert(now);
    }

    /// A worker of the pool answered a status request.
    pub(crate) fn worker_answered(&mut self, now: Instant) {
        self.pool_silent_since = None;
        self.pool_asked = Some(now);
    }

    /// Nobody answered a status request (no responders, or none in time).
    pub(crate) fn worker_silent(&mut self, now: Instant) {
        let asking = self.pool_asked.is_some_and(|asked| now.saturating_duration_since(asked) <= ASKS_LAPSE);
        if !asking {
            self.pool_silent_since = None;
        }
        self.pool_silent_since.get_or_insert(now);
        self.pool_asked = Some(now);
    }

    /// How long the pool has been silent, if it is known to be: asked
    /// lately, and nobody answered since the silence began.
    fn pool_silent_for(&self, now: Instant) -> Option<Duration> {
        let asked = self.pool_asked?;
        let since = self.pool_silent_since?;
        (now.saturating_duration_since(asked) <= ASKS_LAPSE).then(|| now.saturating_duration_since(since))
    }

    /// What keeps a run published at `published` from settling now, if
    /// anything: the broker first (without it no worker can answer). A
    /// silent pool counts from when it fell silent, not from the publish:
    /// a run sent into a pool already silent waits only what is left.
    pub(crate) fn stall(&self, published: Instant, now: Instant) -> Option<Stall> {
        if let Some(since) = self.broker_down_since {
            return Some(Stall::Broker(now.saturating_duration_since(since.max(published))));
        }
        self.pool_silent_for(now).map(Stall::NoWorker)
    }

    /// What every run waits for now and has waited for past its bound, if
    /// anything: the one bound a start is refused by (a start that needs
    /// no worker, an attach, only by the broker's). A refusal for the pool
    /// keeps the pool asked.
    pub(crate) fn past_bound(&mut self, now: Instant, patience: Patience, needs_worker: bool) -> Option<Stall> {
        let broker = self.broker_down_for(now).map(Stall::Broker);
        let pool = || needs_worker.then(|| self.pool_silent_for(now).map(Stall::NoWorker)).flatten();
        let stall = broker.or_else(pool).filter(|stall| stall.past(patience))?;
        if let Stall::NoWorker(_) = stall {
            self.start_refused = Some(now);
        }
        Some(stall)
    }

    /// How much longer a broker operation may be waited for before the
    /// broker is past its bound.
    pub(crate) fn broker_patience_left(&self, now: Instant, patience: Patience) -> Duration {
        let down_for = self.broker_down_for(now).unwrap_or_default();
        patience.broker.saturating_sub(down_for)
    }

    /// Whether the pool should be asked who is there although no run
    /// waits: a start was refused for its silence lately.
    pub(crate) fn pool_wanted(&self, now: Instant, patience: Patience) -> bool {
        self.start_refused.is_some_and(|refused| now.saturating_duration_since(refused) < patience.worker)
    }

    /// How long the broker has been down, if it is.
    fn broker_down_for(&self, now: Instant) -> Option<Duration> {
        self.broker_down_since.map(|since| now.saturating_duration_since(since))
    }
}

impl Stall {
    /// Whether this stall has lasted past its bound.
    pub(crate) fn past(self, patience: Patience) -> bool {
        match self {
            Stall::Broker(for_) => for_ >= patience.broker,
            Stall::NoWorker(for_) => for_ >= patience.worker,
        }
    }

    /// The failure of a run given up on for this stall.
    pub(crate) fn diagnostic(self, provider: &str, pool: &str, patience: Patience) -> Diagnostic {
        match self {
            Stall::Broker(_) => Diagnostic::new(provider, Stage::SessionRun, Category::BrokerUnreachable).with_reason(
                format!("the broker could not be reached for {} s (broker_patience)", patience.broker.as_secs_f64()),
            ),
            Stall::NoWorker(_) => {
                Diagnostic::new(provider, Stage::SessionRun, Category::NoWorker).with_reason(format!(
                    "no worker of pool {pool:?} answered for {} s (worker_patience)",
                    patience.worker.as_secs_f64()
                ))
            }
        }
    }

    /// The same, for a run whose budget deadline passed during the stall.
    pub(crate) fn deadline_diagnostic(self, provider: &str, pool: &str) -> Diagnostic {
        let (category, waited) = match self {
            Stall::Broker(_) => (Category::BrokerUnreachable, "the broker to be reachable".to_owned()),
            Stall::NoWorker(_) => (Category::NoWorker, format!("a worker of pool {pool:?}")),
        };
        Diagnostic::new(provider, Stage::SessionRun, category)
            .with_reason(format!("the budget's deadline passed while the run waited for {waited}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_broker_stall_counts_from_the_later_of_the_publish_and_the_first_failure() {
        let start = Instant::now();
        let at = |secs| start + Duration::from_secs(secs);
        let mut health = Health::new(start);
        assert_eq!(health.stall(at(0), at(1)), None);
        health.broker_failed(at(110));
        health.broker_failed(at(120));
        assert_eq!(health.stall(at(100), at(130)), Some(Stall::Broker(Duration::from_secs(20))));
        let patience = Patience { broker: Duration::from_secs(20), worker: Duration::from_secs(60) };
        assert!(health.stall(at(100), at(130)).unwrap().past(patience));
        health.broker_answered();
        assert_eq!(health.stall(at(100), at(130)), None);
    }

    #[test]
    fn a_silent_pool_counts_from_its_first_unanswered_request_for_every_run() {
        let start = Instant::now();
        let at = |secs| start + Duration::from_secs(secs);
        let patience = Patience { broker: Duration::from_secs(60), worker: Duration::from_secs(10) };
        let mut health = Health::new(start);
        health.worker_answered(at(0));
        health.worker_silent(at(1));
        health.worker_silent(at(2));
        // A run published later waits only what is left of the pool's bound.
        assert_eq!(health.stall(at(2), at(2)), Some(Stall::NoWorker(Duration::from_secs(1))));
        for second in 3..=11 {
            health.worker_silent(at(second));
        }
        assert!(health.stall(at(9), at(11)).unwrap().past(patience));
        // A start now is refused at once, and the pool stays wanted.
        assert_eq!(health.past_bound(at(11), patience, true), Some(Stall::NoWorker(Duration::from_secs(10))));
        assert_eq!(health.past_bound(at(11), patience, false), None, "an attach needs no worker");
        assert!(health.pool_wanted(at(15), patience));
        // One answer ends the silence.
        health.worker_answered(at(12));
        assert_eq!(health.past_bound(at(12), patience, true), None);
        // Asking that stopped (nothing waited) leaves no verdict; the next
        // silence is timed afresh.
        health.worker_silent(at(13));
        assert_eq!(health.stall(at(13), at(30)), None);
        health.worker_silent(at(30));
        assert_eq!(health.stall(at(30), at(31)), Some(Stall::NoWorker(Duration::from_secs(1))));
    }

    #[test]
    fn a_broker_down_past_its_bound_refuses_every_start_until_it_answers() {
        let start = Instant::now();
        let at = |secs| start + Duration::from_secs(secs);
        let patience = Patience { broker: Duration::from_secs(20), worker: Duration::from_secs(60) };
        let mut health = Health::new(start);
        health.broker_failed(at(0));
        assert_eq!(health.past_bound(at(5), patience, false), None);
        assert_eq!(health.broker_patience_left(at(5), patience), Duration::from_secs(15));
        assert_eq!(health.past_bound(at(20), patience, false), Some(Stall::Broker(Duration::from_secs(20))));
        health.broker_answered();
        assert_eq!(health.past_bound(at(21), patience, true), None);
    }
}
