//! Leak accounting: live runs, actors and child processes, readable at any
//! time through `Runtime::live()`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// A snapshot of what the runtime holds right now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Live {
    /// Runs whose actor has not stopped (including runs still starting).
    pub runs: usize,
    /// Actors alive in the runtime: the registry, providers, runs.
    pub actors: usize,
    /// Child processes not yet reaped.
    pub processes: usize,
}

impl Live {
    /// No run and no child process is alive.
    pub fn is_quiescent(&self) -> bool {
        self.runs == 0 && self.processes == 0
    }
}

#[derive(Debug, Default)]
pub(crate) struct LiveCounters {
    runs: AtomicUsize,
    actors: AtomicUsize,
    processes: AtomicUsize,
}

impl LiveCounters {
    pub(crate) fn snapshot(&self) -> Live {
        Live {
            runs: self.runs.load(Ordering::Acquire),
            actors: self.actors.load(Ordering::Acquire),
            processes: self.processes.load(Ordering::Acquire),
        }
    }
}

/// Counts one live actor (and, for run actors, one live run) until dropped.
/// Held by the actor itself, so it is released even when the actor dies.
#[derive(Debug)]
pub(crate) struct ActorLease {
    live: Arc<LiveCounters>,
    is_run: bool,
}

impl ActorLease {
    pub(crate) fn actor(live: &Arc<LiveCounters>) -> Self {
        live.actors.fetch_add(1, Ordering::AcqRel);
        ActorLease { live: live.clone(), is_run: false }
    }

    pub(crate) fn run(live: &Arc<LiveCounters>) -> Self {
        live.runs.fetch_add(1, Ordering::AcqRel);
        live.actors.fetch_add(1, Ordering::AcqRel);
        ActorLease { live: live.clone(), is_run: true }
    }
}

impl Drop for ActorLease {
    fn drop(&mut self) {
        self.live.actors.fetch_sub(1, Ordering::AcqRel);
        if self.is_run {
            self.live.runs.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Counts one live child process until dropped. Providers hold it next to
/// the process handle and drop it once the process is reaped.
#[derive(Debug)]
pub struct ProcessLease {
    live: Arc<LiveCounters>,
}

impl ProcessLease {
    pub(crate) fn new(live: Arc<LiveCounters>) -> Self {
        live.processes.fetch_add(1, Ordering::AcqRel);
        ProcessLease { live }
    }
}

impl Drop for ProcessLease {
    fn drop(&mut self) {
        self.live.processes.fetch_sub(1, Ordering::AcqRel);
    }
}
