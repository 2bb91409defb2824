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
    /// When a worker of the pool last answered.
    worker_seen: Option<Instant>,
    /// When the lease was last written.
    pub lease_written: Instant,
    /// Lease writes that failed in a row.
    pub failed_lease_writes: u32,
    /// When the caller last said what its runs wait for.
    pub said: Option<Instant>,
}

impl Health {
    pub(crate) fn new(now: Instant) -> Health {
        Health { broker_down_since: None, worker_seen: None, lease_written: now, failed_lease_writes: 0, said: None }
    }

    /// A broker operation succeeded.
    pub(crate) fn broker_answered(&mut self) {
        self.broker_down_since = None;
    }

    /// A broker operation failed, or the connection dropped.
    pub(crate) fn broker_failed(&mut self, now: Instant) {
        self.broker_down_since.get_or_insert(now);
    }

    /// A worker of the pool answered.
    pub(crate) fn worker_answered(&mut self, now: Instant) {
        self.worker_seen = Some(now);
    }

    /// What keeps a run published at `published` from settling now, if
    /// anything: the broker first (without it no worker can answer).
    pub(crate) fn stall(&self, published: Instant, now: Instant) -> Option<Stall> {
        if let Some(since) = self.broker_down_since {
            return Some(Stall::Broker(now.saturating_duration_since(since.max(published))));
        }
        let since = self.worker_seen.map_or(published, |seen| seen.max(published));
        let silent = now.saturating_duration_since(since);
        // The pool is asked every STATUS_EVERY: a longer silence means
        // nobody answered the last requests.
        (silent > 3 * STATUS_EVERY).then_some(Stall::NoWorker(silent))
    }

    /// How long the broker has been down, if it is.
    pub(crate) fn broker_down_for(&self, now: Instant) -> Option<Duration> {
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
    fn a_stall_counts_from_the_later_of_the_publish_and_the_last_sign_of_life() {
        let start = Instant::now();
        let at = |secs| start + Duration::from_secs(secs);
        let mut health = Health::new(start);
        health.worker_answered(at(0));
        assert_eq!(health.stall(at(0), at(1)), None);
        // A run published long after the last answer waits from its publish.
        assert_eq!(health.stall(at(100), at(130)), Some(Stall::NoWorker(Duration::from_secs(30))));
        health.broker_failed(at(110));
        health.broker_failed(at(120));
        assert_eq!(health.stall(at(100), at(130)), Some(Stall::Broker(Duration::from_secs(20))));
        let patience = Patience { broker: Duration::from_secs(20), worker: Duration::from_secs(60) };
        assert!(health.stall(at(100), at(130)).unwrap().past(patience));
        health.broker_answered();
        assert!(!health.stall(at(100), at(130)).unwrap().past(patience));
    }
}
