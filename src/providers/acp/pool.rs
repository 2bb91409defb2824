//! The warm pool behind `reuse: pooled`: initialized ACP agent processes
//! kept ready, each run getting a fresh `session/new` on one of them.
//!
//! **Checkout** takes a healthy process with a free session slot (at most
//! [`PoolConfig::sessions_per_process`] live sessions each, default 1), or
//! starts one when none is free; a process found dead on the way is retired.
//! **Give back** (a run's dispose) returns the process when its session
//! ended cleanly; a process whose prompt did not answer within
//! [`PoolConfig::cancel_grace`] after `session/cancel`, that crashed, broke
//! the protocol, or served [`PoolConfig::max_runs_per_process`] runs is
//! retired: the dispose ladder, never a kill of a healthy peer's session.
//! **Warm**: once the first run has started (its runtime's process counters
//! are then known), the pool keeps [`PoolConfig::size`] idle processes
//! ready, refilling in the background after a checkout or a retirement.
//! **Reap**: idle processes beyond `size` are retired after
//! [`PoolConfig::idle_timeout`], and dead idle ones at once (then refilled).
//! **Drain** (the provider's shutdown hook, at provider removal and at
//! runtime shutdown): refuse further checkouts and climb the dispose ladder
//! on every process, concurrently.
//!
//! ```
//! use std::time::Duration;
//! use subagents::providers::{AcpConfig, PoolConfig, Reuse};
//!
//! let mut config = AcpConfig::new("agent", "subagents", vec!["acp".into()]);
//! config.reuse = Reuse::Pooled(PoolConfig { size: 4, idle_timeout: Duration::from_secs(30), ..PoolConfig::default() });
//! ```

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::dispose::Graces;
use super::process::{AgentProcess, Fault};
use super::AcpConfig;
use crate::live::{LiveCounters, ProcessLease};
use crate::seam::{Category, ProviderContext};

/// How a pooled `acp` provider keeps its processes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    /// Idle, initialized processes kept ready (2). Refilled in the background
    /// once the first run has started.
    pub size: usize,
    /// Live sessions one process serves at a time (1). One is the safest: a
    /// process then runs one task at a time, and a misbehaving one costs one
    /// run. More trades that isolation for fewer processes.
    pub sessions_per_process: usize,
    /// Runs one process serves before it is retired and replaced (100), so
    /// an agent that keeps every session in memory cannot grow without
    /// bound.
    pub max_runs_per_process: usize,
    /// How long an idle process beyond `size` is kept (60 s).
    pub idle_timeout: Duration,
    /// How long a dispose waits for a cancelled prompt's answer before it
    /// retires the process instead of returning it (2 s).
    pub cancel_grace: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            size: 2,
            sessions_per_process: 1,
            max_runs_per_process: 100,
            idle_timeout: Duration::from_secs(60),
            cancel_grace: Duration::from_secs(2),
        }
    }
}

/// One pooled process and its bookkeeping.
struct Slot {
    process: Arc<AgentProcess>,
    sessions: usize,
    runs: usize,
    idle_since: Option<Instant>,
}

#[derive(Default)]
struct State {
    slots: Vec<Slot>,
    /// Processes being started for the warm reserve.
    warming: usize,
    closed: bool,
    /// The runtime's counters and the cwd to start warm processes in,
    /// known from the first checkout.
    warm_with: Option<(Arc<LiveCounters>, PathBuf)>,
    reaper: bool,
}

/// The pool. Shared by the provider and the runs it hands processes to.
pub(super) struct Pool {
    acp: AcpConfig,
    config: PoolConfig,
    state: Mutex<State>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("Pool")
            .field("config", &self.config)
            .field("processes", &state.slots.len())
            .field("closed", &state.closed)
            .finish()
    }
}

impl Pool {
    pub(super) fn new(acp: AcpConfig, config: PoolConfig) -> Arc<Pool> {
        Arc::new(Pool { acp, config, state: Mutex::default() })
    }

    /// How long a dispose waits for a cancelled prompt's answer.
    pub(super) fn cancel_grace(&self) -> Duration {
        self.config.cancel_grace
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A process with a free session slot, started if none is free.
    /// `Err(None)` when `cancel` tripped.
    pub(super) async fn checkout(
        self: &Arc<Self>,
        cwd: &Path,
        cancel: &CancellationToken,
        context: &ProviderContext,
    ) -> Result<Arc<AgentProcess>, Option<Fault>> {
        let first = {
            let mut state = self.lock();
            if state.warm_with.is_none() {
                state.warm_with = Some((context.live.clone(), cwd.to_owned()));
            }
            !std::mem::replace(&mut state.reaper, true)
        };
        if first {
            tokio::spawn(reap(Arc::downgrade(self)));
        }
        let (taken, dead) = self.take_free();
        for process in dead {
            self.retire(process);
        }
        if let Some(process) = taken {
            self.refill();
            return Ok(process);
        }
        if self.lock().closed {
            return Err(Some(Fault::from(Category::StartupFailed)));
        }
        let process = Arc::new(AgentProcess::start(&self.acp, cwd, context.track_process(), cancel).await?);
        let admitted = {
            let mut state = self.lock();
            if !state.closed {
                state.slots.push(Slot { process: process.clone(), sessions: 1, runs: 1, idle_since: None });
            }
            !state.closed
        };
        if !admitted {
            process.kill().await;
            return Err(Some(Fault::from(Category::StartupFailed)));
        }
        self.refill();
        Ok(process)
    }

    /// Takes a session slot on a healthy process; removes the dead ones it
    /// meets (returned for retirement).
    fn take_free(&self) -> (Option<Arc<AgentProcess>>, Vec<Arc<AgentProcess>>) {
        let mut state = self.lock();
        if state.closed {
            return (None, Vec::new());
        }
        let mut dead = Vec::new();
        let mut taken = None;
        let mut index = 0;
        while index < state.slots.len() {
            let slot = &mut state.slots[index];
            if !slot.process.healthy() {
                if slot.sessions == 0 {
                    dead.push(state.slots.remove(index).process);
                    continue;
                }
            } else if taken.is_none()
                && slot.sessions < self.config.sessions_per_process.max(1)
                && slot.runs < self.config.max_runs_per_process.max(1)
            {
                slot.sessions += 1;
                slot.runs += 1;
                slot.idle_since = None;
                taken = Some(slot.process.clone());
            }
            index += 1;
        }
        (taken, dead)
    }

    /// A run is done with `process`: `sound` when its session ended
    /// cleanly. Returns it to the pool, or retires it.
    pub(super) async fn give_back(self: &Arc<Self>, process: Arc<AgentProcess>, sound: bool) {
        let retired = {
            let mut state = self.lock();
            let closed = state.closed;
            match state.slots.iter().position(|slot| Arc::ptr_eq(&slot.process, &process)) {
                None => true, // drained meanwhile
                Some(index) => {
                    let slot = &mut state.slots[index];
                    slot.sessions = slot.sessions.saturating_sub(1);
                    let worn = slot.runs >= self.config.max_runs_per_process.max(1);
                    let unwanted = !sound || closed || worn || !process.healthy();
                    if slot.sessions == 0 {
                        slot.idle_since = Some(Instant::now());
                    }
                    // Idle ones beyond `size` stay for `idle_timeout`: the
                    // reaper's job.
                    if unwanted && slot.sessions == 0 {
                        state.slots.remove(index);
                        true
                    } else {
                        false
                    }
                }
            }
        };
        if retired {
            self.dispose(process).await;
            self.refill();
        }
    }

    /// Retire `process` on a task of its own (the ladder may take its
    /// graces).
    fn retire(self: &Arc<Self>, process: Arc<AgentProcess>) {
        let pool = self.clone();
        tokio::spawn(async move { pool.dispose(process).await });
    }

    async fn dispose(&self, process: Arc<AgentProcess>) {
        if let Err(failure) = process.dispose(Graces::of(&self.acp)).await {
            tracing::error!(provider = %self.acp.name, pid = process.pid, ?failure, "a pooled ACP process survived its dispose ladder");
        }
    }

    /// Starts processes in the background until `size` are idle or warming.
    fn refill(self: &Arc<Self>) {
        let mut state = self.lock();
        let Some((live, cwd)) = state.warm_with.clone() else { return };
        if state.closed {
            return;
        }
        let idle = state.slots.iter().filter(|slot| slot.sessions == 0).count();
        let wanted = self.config.size.saturating_sub(idle + state.warming);
        state.warming += wanted;
        drop(state);
        for _ in 0..wanted {
            let (pool, live, cwd) = (self.clone(), live.clone(), cwd.clone());
            tokio::spawn(async move {
                let started =
                    AgentProcess::start(&pool.acp, &cwd, ProcessLease::new(live), &CancellationToken::new()).await;
                let unwanted = {
                    let mut state = pool.lock();
                    state.warming -= 1;
                    match started {
                        Ok(process) if !state.closed => {
                            let process = Arc::new(process);
                            let slot = Slot { process, sessions: 0, runs: 0, idle_since: Some(Instant::now()) };
                            state.slots.push(slot);
                            None
                        }
                        Ok(process) => Some(process),
                        Err(fault) => {
                            let category = fault.map(|fault| fault.category);
                            tracing::warn!(provider = %pool.acp.name, ?category, "could not warm an ACP process");
                            None
                        }
                    }
                };
                if let Some(process) = unwanted {
                    process.kill().await;
                }
            });
        }
    }

    /// Idle processes past `idle_timeout` beyond `size`, and dead idle ones.
    fn reapable(&self) -> Vec<Arc<AgentProcess>> {
        let mut state = self.lock();
        let now = Instant::now();
        let mut reaped = Vec::new();
        let mut idle = state.slots.iter().filter(|slot| slot.sessions == 0).count();
        // Oldest idle first.
        state.slots.sort_by_key(|slot| slot.idle_since.map_or(now, |since| since));
        let mut index = 0;
        while index < state.slots.len() {
            let slot = &state.slots[index];
            let dead = slot.sessions == 0 && !slot.process.healthy();
            let expired = slot.idle_since.is_some_and(|since| now.duration_since(since) >= self.config.idle_timeout);
            if dead || (expired && idle > self.config.size) {
                reaped.push(state.slots.remove(index).process);
                idle -= 1;
            } else {
                index += 1;
            }
        }
        reaped
    }

    /// Refuses further checkouts and disposes every process; waits for the
    /// warm starts in flight.
    pub(super) async fn drain(&self) {
        let processes: Vec<_> = {
            let mut state = self.lock();
            state.closed = true;
            state.slots.drain(..).map(|slot| slot.process).collect()
        };
        futures_util::future::join_all(processes.into_iter().map(|process| self.dispose(process))).await;
        while self.lock().warming > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// The reaper: every half `idle_timeout` (within 10 ms – 5 s), retire what
/// [`Pool::reapable`] finds and refill. Ends with the pool.
async fn reap(pool: Weak<Pool>) {
    let period = pool.upgrade().map_or(Duration::ZERO, |pool| {
        (pool.config.idle_timeout / 2).clamp(Duration::from_millis(10), Duration::from_secs(5))
    });
    loop {
        tokio::time::sleep(period).await;
        let Some(pool) = pool.upgrade() else { return };
        if pool.lock().closed {
            return;
        }
        let reaped = pool.reapable();
        if !reaped.is_empty() {
            for process in reaped {
                pool.retire(process);
            }
            pool.refill();
        }
    }
}
