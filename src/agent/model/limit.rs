//! Shared rate limits for one model route: requests and tokens per minute,
//! a cap on calls in flight, and one cool-down every caller obeys.
//!
//! A provider limits an account, not a connection: a hundred runs that
//! each retry a 429 on their own only meet the limit a hundred times. So
//! every call on a route passes one [`Limiter`] (cloned into every model
//! built for the route) at one point, just before each HTTP attempt:
//!
//! 1. [`Limiter::admit`] waits for a slot in flight (`max_concurrent`),
//!    then for its turn: requests are spaced evenly (`60 s / rpm`, no
//!    burst, so no window a provider counts in can see more than the
//!    limit), tokens are paid for ahead (an estimate of the input plus
//!    the answer's `max_tokens`; the next call waits while the route is in
//!    debt), and nobody goes while a cool-down lasts. Waiters queue in
//!    arrival order and only the head of the queue sleeps, so the end of a
//!    wait releases one caller, not a herd.
//! 2. The call's answer reports its real usage: [`Permit::settle`] charges
//!    the difference (or gives the surplus back). One call is charged at
//!    most a minute of the route's tokens, so no answer's report, however
//!    large, holds the route for longer than the window `tpm` counts in.
//! 3. A 429 or 529 that says when to come back (`retry-after`, or a
//!    provider's rate-limit reset headers, read by [`retry_delay`]) becomes
//!    [`Limiter::cool_down_until`]: every caller on the route waits until
//!    then, instead of each retrying alone.
//!
//! A cancelled wait charges nothing and holds nothing: the slot and the
//! turn are released as the future is dropped. The limiter is one per
//! route and per process; [`Limiter::share`] makes it book its starts on
//! a schedule the whole fleet shares (module `shared`: the `remote`
//! workers of a route marked `shared`); `Limiter::draw_from` makes it ask
//! another process's limiter too (module `upstream`: a `process` child
//! asks its parent's, over the process wire).
//!
//! 4. When the endpoint refuses a call as over its limit and does not say
//!    when to come back, the route's concurrency backs off (halves) and
//!    grows back by one per window of answered calls (module `gate`):
//!    [`Limiter::refused`] and [`Limiter::answered`].
//!
//! [`Limiter::stats`] is what the route has seen: requests, refusals, the
//! time waited, the concurrency it lets in now.
//!
//! ```
//! use subagents::agent::{Limiter, RouteLimits};
//! use subagents::CancellationToken;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let limits = RouteLimits { requests_per_minute: Some(600), max_concurrent: Some(4), ..RouteLimits::default() };
//! let limiter = Limiter::new(limits);
//! let permit = limiter.admit(1_200, &CancellationToken::new()).await.unwrap();
//! // … the HTTP attempt, which reported 900 tokens …
//! permit.settle(900);
//! # });
//! ```

mod gate;
mod shared;
mod upstream;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use gate::DEFAULT_CONCURRENCY_CAP;
use gate::{Gate, Slot};
use shared::Sharing;
pub use shared::{Booked, Booking, FleetConcurrency, FleetSlots, SharedSchedule, SharedStats, Unshared, SLICE_SPAN};
#[cfg(feature = "process")]
pub(crate) use upstream::Unreachable;
use upstream::Upstream;
pub(crate) use upstream::{UpstreamGrant, UpstreamLimiter};

/// The longest cool-down a response may impose: a provider's limits reset
/// within a minute, and a larger value is more likely a fault than advice.
pub const MAX_COOL_DOWN: Duration = Duration::from_secs(60);

const MINUTE: Duration = Duration::from_secs(60);

/// The longest a route is ever in token debt: the window `tpm` counts in.
/// Whatever its calls report together (a child that settles hundreds of
/// calls at once, an endpoint that inflates every answer), no call waits
/// longer than this for the route's tokens.
pub const MAX_TOKEN_DEBT: Duration = MINUTE;

/// The most tokens one model call can use: past twice the largest context
/// window a model offers (10 million tokens), a report is a fault, not a
/// bill, and reads as unknown (the call keeps its estimate charged).
pub const MAX_CREDIBLE_USAGE: u64 = 20_000_000;

/// A route's limits; `None` is unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RouteLimits {
    /// Requests a minute, spaced evenly.
    pub requests_per_minute: Option<u32>,
    /// Tokens a minute: each call is charged its estimate before it goes,
    /// then its reported usage.
    pub tokens_per_minute: Option<u64>,
    /// Calls in flight at once.
    pub max_concurrent: Option<u32>,
}

impl RouteLimits {
    /// Whether any limit is set.
    pub fn is_unlimited(&self) -> bool {
        *self == RouteLimits::default()
    }
}

/// One route's shared limiter; clones share it. Callers queue in arrival
/// order for a slot in flight, then for their turn (requests spaced evenly
/// at the rate, tokens paid ahead, cool-downs waited out); see
/// [`Limiter::admit`], [`Permit::settle`] and [`Limiter::cool_down_until`].
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

/// The same limiter (clones of one), not merely the same limits.
impl PartialEq for Limiter {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Eq for Limiter {}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter").field("limits", &self.inner.limits).finish_non_exhaustive()
    }
}

struct Inner {
    limits: RouteLimits,
    /// The slots in flight (fair: first come, first served), as many as
    /// `max_concurrent` at most, fewer while an overload says nothing.
    gate: Gate,
    /// The queue for a turn: its holder is the only caller that sleeps.
    turn: tokio::sync::Mutex<()>,
    schedule: Mutex<Schedule>,
    /// The fleet's schedule, once the route is shared ([`Limiter::share`]).
    sharing: OnceLock<Sharing>,
    /// Another process's limiter every call also passes, once given
    /// (`Limiter::draw_from`).
    upstream: OnceLock<Upstream>,
    /// Callers waiting for their turn (a shared route books a slice for them).
    waiting: AtomicU32,
    /// A shared route's callers in flight or waiting for a slot or a turn:
    /// the slots it wants of the fleet's.
    demand: AtomicU32,
    /// The route's name, when its configuration asks for the fleet's
    /// limits ([`Limiter::meant_for_a_fleet`]).
    meant_for_a_fleet: OnceLock<String>,
    /// Whether a call found it shared with no fleet and said so.
    said_unshared: std::sync::atomic::AtomicBool,
    counts: Counts,
}

/// What the route has seen, for [`Limiter::stats`].
#[derive(Default)]
struct Counts {
    requests: AtomicU64,
    refused: AtomicU64,
    unexplained: AtomicU64,
    waited_nanos: AtomicU64,
}

/// What a route has seen since it was built ([`Limiter::stats`]): a
/// snapshot, cheap to take.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RouteStats {
    /// Calls admitted (every HTTP attempt, retries too).
    pub requests: u64,
    /// Attempts the endpoint refused as over its limit (429, 529).
    pub refused: u64,
    /// Of those, the ones that did not say when to come back (each may
    /// halve the concurrency).
    pub refused_unexplained: u64,
    /// Time the calls waited on the limiter, all together.
    pub waited: Duration,
    /// Calls it lets in flight now (AIMD's effective concurrency, within
    /// this process's share of a fleet).
    pub concurrency: u32,
    /// The most it lets in flight: `max_concurrent`, or
    /// [`DEFAULT_CONCURRENCY_CAP`].
    pub concurrency_cap: u32,
    /// The fleet's side, for a shared route.
    pub shared: Option<SharedStats>,
}

/// When the route may next be used.
struct Schedule {
    /// The earliest start of the next request.
    next_request: Instant,
    /// When the tokens charged so far are paid off.
    tokens_paid: Instant,
    /// No call starts before this.
    cool_down: Option<Instant>,
}

impl Schedule {
    /// The earliest time a call may start, given `now`.
    fn ready_at(&self, limits: &RouteLimits, now: Instant) -> Instant {
        let mut ready = now;
        if limits.requests_per_minute.is_some() {
            ready = ready.max(self.next_request);
        }
        if limits.tokens_per_minute.is_some() {
            ready = ready.max(self.tokens_paid);
        }
        self.cool_down.map_or(ready, |until| ready.max(until))
    }
}

/// A call admitted by a [`Limiter`]: it holds its slot in flight until it
/// is dropped or settled.
#[must_use = "a permit holds its slot until the call's answer is read"]
pub struct Permit {
    inner: Arc<Inner>,
    charged: u64,
    waited: Duration,
    slot: Slot,
    /// The fleet's concurrency epoch when the call was admitted (0 for a
    /// route of one process): a refusal halves the fleet's ceiling only
    /// for calls admitted before the last halving.
    fleet_epoch: u64,
    /// Upstream's admission of the call, when the route draws on one.
    upstream: Option<Box<dyn UpstreamGrant>>,
    /// Counted in a shared route's demand until the call is over.
    _demand: Option<Demand>,
}

/// One caller counted in a shared route's demand, from its admission's
/// start until its permit goes (however the wait ends); each change
/// wakes the task that keeps the route's slots.
struct Demand(Arc<Inner>);

impl Demand {
    fn count(inner: &Arc<Inner>) -> Option<Demand> {
        let sharing = inner.sharing.get()?;
        inner.demand.fetch_add(1, Ordering::Relaxed);
        sharing.wake.notify_one();
        Some(Demand(inner.clone()))
    }
}

impl Drop for Demand {
    fn drop(&mut self) {
        self.0.demand.fetch_sub(1, Ordering::Relaxed);
        if let Some(sharing) = self.0.sharing.get() {
            sharing.wake.notify_one();
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.inner.gate.release(&mut self.slot);
    }
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit").field("charged", &self.charged).field("waited", &self.waited).finish()
    }
}

/// One caller counted among those waiting for a shared route's turn,
/// until dropped.
struct WaitingCount<'a>(&'a AtomicU32);

impl Drop for WaitingCount<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The wait ended because its token was cancelled; nothing was charged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the wait for the route's rate limit was cancelled")]
pub struct Cancelled;

impl Limiter {
    /// A limiter enforcing `limits` (zero limits count as unlimited).
    pub fn new(limits: RouteLimits) -> Self {
        let limits = RouteLimits {
            requests_per_minute: limits.requests_per_minute.filter(|&n| n > 0),
            tokens_per_minute: limits.tokens_per_minute.filter(|&n| n > 0),
            max_concurrent: limits.max_concurrent.filter(|&n| n > 0),
        };
        let now = Instant::now();
        Limiter {
            inner: Arc::new(Inner {
                limits,
                gate: Gate::new(limits.max_concurrent.unwrap_or(DEFAULT_CONCURRENCY_CAP)),
                turn: tokio::sync::Mutex::new(()),
                schedule: Mutex::new(Schedule { next_request: now, tokens_paid: now, cool_down: None }),
                sharing: OnceLock::new(),
                upstream: OnceLock::new(),
                waiting: AtomicU32::new(0),
                demand: AtomicU32::new(0),
                meant_for_a_fleet: OnceLock::new(),
                said_unshared: std::sync::atomic::AtomicBool::new(false),
                counts: Counts::default(),
            }),
        }
    }

    /// The limits it enforces.
    pub fn limits(&self) -> RouteLimits {
        self.inner.limits
    }

    /// Shares the route's limits with a fleet through `schedule` (see
    /// [`SharedSchedule`]); every clone of the limiter then books its
    /// starts there. `false` if it was shared already (the first stands).
    ///
    /// A schedule whose memberships expire ([`SharedSchedule::renew_every`])
    /// has its lease renewed by a task of the current tokio runtime while
    /// this process holds calls in flight or has callers waiting, so a
    /// call longer than the lease does not let the others' shares grow
    /// over the fleet's `max_concurrent`. A schedule that counts slots
    /// ([`SharedSchedule::counts_slots`]) lets no call in before that task
    /// has asked it for slots, and the task asks for more, or gives some
    /// back, as callers come and go.
    pub fn share(&self, schedule: Arc<dyn SharedSchedule>) -> bool {
        let every = schedule.renew_every();
        let counts_slots = schedule.counts_slots();
        if counts_slots {
            // Before the sharing is visible: no caller ever sees the
            // route shared with the whole ceiling its own.
            self.inner.gate.grant(Some(0));
        }
        if self.inner.sharing.set(Sharing::new(schedule)).is_err() {
            if counts_slots {
                let granted = self.inner.sharing.get().and_then(|sharing| sharing.lock().slots);
                self.inner.gate.grant(granted);
            }
            return false;
        }
        if every.is_some() || counts_slots {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let wake = self.inner.sharing.get().map(|sharing| sharing.wake.clone()).unwrap_or_default();
                runtime.spawn(keep_fleet_membership(Arc::downgrade(&self.inner), wake, every));
            } else if let Some(sharing) = self.inner.sharing.get().filter(|_| counts_slots) {
                // Nobody would ever ask for slots: its fraction instead.
                sharing.lock().slots = None;
                self.inner.gate.grant(None);
            }
        }
        true
    }

    /// The route `route` is marked `shared = true`: if its first call finds
    /// it shared with no fleet (a process that is not a `remote` worker),
    /// a warning says that its limits hold for this process alone.
    #[cfg(feature = "openai")]
    pub(crate) fn meant_for_a_fleet(&self, route: &str) {
        let _ = self.inner.meant_for_a_fleet.set(route.to_owned());
    }

    /// Makes every call also wait for `upstream`'s admission, after this
    /// limiter's own (see module `upstream`). `false` if it drew on one
    /// already (the first stands).
    #[cfg_attr(not(feature = "process"), allow(dead_code))]
    pub(crate) fn draw_from(&self, upstream: Arc<dyn UpstreamLimiter>) -> bool {
        self.inner.upstream.set(Upstream::new(upstream)).is_ok()
    }

    /// What the route has seen so far, and its concurrency now.
    pub fn stats(&self) -> RouteStats {
        let counts = &self.inner.counts;
        let (concurrency, concurrency_cap) = self.inner.gate.concurrency();
        RouteStats {
            requests: counts.requests.load(Ordering::Relaxed),
            refused: counts.refused.load(Ordering::Relaxed),
            refused_unexplained: counts.unexplained.load(Ordering::Relaxed),
            waited: Duration::from_nanos(counts.waited_nanos.load(Ordering::Relaxed)),
            concurrency,
            concurrency_cap,
            shared: self.inner.sharing.get().map(|sharing| sharing.lock().stats.clone()),
        }
    }

    /// The endpoint answered the call `permit` admitted: a window of these
    /// grows the route's concurrency by one (up to its cap).
    pub fn answered(&self, permit: &Permit) {
        self.inner.gate.answered();
        if let Some(upstream) = &permit.upstream {
            upstream.answered();
        }
        if let Some(sharing) = self.inner.sharing.get() {
            // Told to the fleet with the next booking.
            let mut state = sharing.lock();
            state.answered = state.answered.saturating_add(1);
        }
    }

    /// The endpoint refused the call `permit` admitted as over its limit
    /// (429, 529). `explained`: it said when to come back (then
    /// [`Limiter::cool_down_until`] does the rest); unexplained, the
    /// route's concurrency halves (once for all the calls admitted before).
    pub fn refused(&self, permit: &Permit, explained: bool) {
        let counts = &self.inner.counts;
        counts.refused.fetch_add(1, Ordering::Relaxed);
        if let Some(upstream) = &permit.upstream {
            upstream.refused(explained);
        }
        if !explained {
            counts.unexplained.fetch_add(1, Ordering::Relaxed);
            let in_flight = self.inner.gate.in_flight();
            if self.inner.gate.overloaded(permit.slot.epoch) {
                let (concurrency, _) = self.inner.gate.concurrency();
                tracing::debug!(concurrency, "an unexplained 429 or 529: the route's concurrency halves");
                self.back_off_the_fleet(permit.fleet_epoch, in_flight);
            }
        }
    }

    /// A shared route's process backed off: the fleet's ceiling halves too
    /// (once per fleet epoch), so the others back off with it.
    fn back_off_the_fleet(&self, epoch: u64, in_flight: u32) {
        let Some(sharing) = self.inner.sharing.get() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let members = sharing.lock().stats.members;
        let limiter = self.clone();
        runtime.spawn(async move {
            let Some(sharing) = limiter.inner.sharing.get() else { return };
            let fleet_in_flight = in_flight.saturating_mul(members.max(1));
            match sharing.schedule.back_off(epoch, fleet_in_flight).await {
                Ok(Some(concurrency)) => {
                    let mut state = sharing.lock();
                    state.fleet_concurrency(concurrency);
                    limiter.inner.gate.share_among(state.stats.members, Some(concurrency.ceiling));
                    tracing::debug!(ceiling = concurrency.ceiling, "the fleet's concurrency on the route backs off");
                }
                Ok(None) => {}
                Err(why) => tracing::debug!(reason = %why.0, "the fleet was not told of the route's overload"),
            }
        });
    }

    /// Waits until a call charged `estimated_tokens` (at most a minute of
    /// the route's tokens) may start; `Err` when `cancel` trips first (then
    /// nothing is charged or held).
    pub async fn admit(&self, estimated_tokens: u64, cancel: &CancellationToken) -> Result<Permit, Cancelled> {
        let started = Instant::now();
        let inner = &self.inner;
        let estimated_tokens = inner.chargeable(estimated_tokens);
        let demand = Demand::count(inner);
        let slot = tokio::select! {
            biased;
            () = cancel.cancelled() => return Err(Cancelled),
            slot = inner.gate.acquire() => slot,
        };
        // Held by a permit from here on, so a wait that ends (or a caller
        // that drops this future) gives the slot back through the gate,
        // which forgets it while the route lets in fewer than it holds.
        let shared = inner.sharing.get();
        let fleet_epoch = shared.map_or(0, |sharing| sharing.lock().epoch);
        let mut permit = Permit {
            inner: inner.clone(),
            charged: estimated_tokens,
            waited: Duration::ZERO,
            slot,
            fleet_epoch,
            upstream: None,
            _demand: demand,
        };
        if shared.is_none() {
            inner.warn_if_meant_for_a_fleet();
        }
        let paced = inner.limits.requests_per_minute.is_some() || inner.limits.tokens_per_minute.is_some();
        let waited = if let Some(sharing) = shared {
            self.take_shared_start(sharing, estimated_tokens, cancel).await
        } else if paced || self.cooling(Instant::now()) {
            self.take_turn(estimated_tokens, 1, cancel).await
        } else {
            Ok(())
        };
        if waited.is_err() {
            return Err(Cancelled);
        }
        if let Some(upstream) = inner.upstream.get() {
            permit.upstream = tokio::select! {
                biased;
                () = cancel.cancelled() => return Err(Cancelled),
                grant = upstream.admit(estimated_tokens) => grant,
            };
        }
        permit.waited = started.elapsed();
        inner.counts.requests.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(permit.waited.as_nanos()).unwrap_or(u64::MAX);
        inner.counts.waited_nanos.fetch_add(nanos, Ordering::Relaxed);
        Ok(permit)
    }

    /// Waits for this process's turn on its own schedule (the fleet's
    /// `1 / members` of the limits when `members` > 1), then books it.
    async fn take_turn(
        &self,
        estimated_tokens: u64,
        members: u32,
        cancel: &CancellationToken,
    ) -> Result<(), Cancelled> {
        let inner = &self.inner;
        let _turn = tokio::select! {
            biased;
            () = cancel.cancelled() => return Err(Cancelled),
            turn = inner.turn.lock() => turn,
        };
        let mut slept_until = None;
        loop {
            // Read again after every sleep: a cool-down may have begun.
            let now = Instant::now();
            let ready = inner.lock().ready_at(&inner.limits, now);
            if ready <= now {
                break;
            }
            slept_until = Some(ready);
            tokio::select! {
                biased;
                () = cancel.cancelled() => return Err(Cancelled),
                () = tokio::time::sleep_until(ready) => {}
            }
        }
        self.charge_start(estimated_tokens, slept_until, members);
        Ok(())
    }

    /// A shared route's turn: the next start this process booked on the
    /// fleet's schedule (booking a slice when it has none), or its own
    /// fraction of the limits while the schedule is out of reach.
    async fn take_shared_start(
        &self,
        sharing: &Sharing,
        estimated_tokens: u64,
        cancel: &CancellationToken,
    ) -> Result<(), Cancelled> {
        let inner = &self.inner;
        let limits = inner.limits;
        let spacing = limits.requests_per_minute.map_or(Duration::ZERO, |rpm| MINUTE / rpm);
        // Counted while it waits for its turn, however the wait ends (a
        // caller may drop this future).
        inner.waiting.fetch_add(1, Ordering::Relaxed);
        let counted = WaitingCount(&inner.waiting);
        let turn = tokio::select! {
            biased;
            () = cancel.cancelled() => None,
            turn = inner.turn.lock() => Some(turn),
        };
        drop(counted);
        let Some(_turn) = turn else { return Err(Cancelled) };
        loop {
            let now = Instant::now();
            let (next, may_ask, members) = {
                let mut state = sharing.lock();
                (state.next_start(now, spacing), state.may_ask(now), state.stats.members)
            };
            let Some(at) = next else {
                if !may_ask {
                    drop(_turn);
                    return self.take_turn(estimated_tokens, members, cancel).await;
                }
                let waiting = inner.waiting.load(Ordering::Relaxed) + 1;
                let starts = shared::SharingState::starts_for(waiting, spacing);
                tokio::select! {
                    biased;
                    () = cancel.cancelled() => return Err(Cancelled),
                    () = self.book_on_the_fleet(sharing, starts, spacing) => {}
                }
                continue;
            };
            let ready = inner.lock().cool_down.map_or(at, |until| at.max(until));
            if ready <= now {
                sharing.lock().take_start();
                break;
            }
            tokio::select! {
                biased;
                () = cancel.cancelled() => return Err(Cancelled),
                () = tokio::time::sleep_until(ready) => {}
            }
        }
        if let Some(tpm) = limits.tokens_per_minute {
            sharing.lock().token_time_micros += micros(time_for(estimated_tokens, tpm));
        }
        Ok(())
    }

    /// Books `starts` (0: none) on the fleet's schedule, with the slots
    /// this process holds and wants, and takes the answer. One booking at a
    /// time: an answer taken after a later booking's would grant slots the
    /// schedule no longer counts. A booking dropped before its answer keeps
    /// its token debt and answered calls for the next.
    async fn book_on_the_fleet(&self, sharing: &Sharing, starts: u32, spacing: Duration) {
        let inner = &self.inner;
        let _one = sharing.booking.lock().await;
        let (allowed, cap) = inner.gate.concurrency();
        let wanted = inner.demand.load(Ordering::Relaxed).min(cap);
        let in_flight = inner.gate.in_flight();
        let booking = {
            let mut state = sharing.lock();
            // Slots beyond its callers are given up here before the booking
            // says so: the schedule never counts fewer than it may use.
            if let Some(kept) = state.give_up_beyond(wanted.max(in_flight)) {
                inner.gate.grant(Some(kept));
            }
            state.booking(starts, spacing, cap, in_flight, wanted, allowed)
        };
        let mut unanswered = Unanswered { sharing, booking: Some(booking) };
        let booked = sharing.schedule.book(booking).await;
        unanswered.booking = None;
        let mut state = sharing.lock();
        match booked {
            Ok(booked) => state.booked(&booking, booked),
            Err(why) => state.unshared(&booking, why),
        }
        inner.gate.share_among(state.stats.members, state.stats.fleet_concurrency);
        inner.gate.grant(state.slots);
    }

    /// No call on the route starts before `until` (a later cool-down
    /// already set stands); a shared route tells its fleet.
    pub fn cool_down_until(&self, until: Instant) {
        let extends = {
            let mut schedule = self.inner.lock();
            let extends =
                until > Instant::now() && schedule.cool_down.is_none_or(|current| until > current + COOL_DOWN_NEWS);
            schedule.cool_down = Some(schedule.cool_down.map_or(until, |current| current.max(until)));
            extends
        };
        // Others hear of a cool-down only when it is news: a child (or a
        // server) saying the same pause again and again costs nothing.
        if !extends {
            return;
        }
        if let Some(upstream) = self.inner.upstream.get() {
            upstream.limiter.cool_down(until.saturating_duration_since(Instant::now()));
        }
        let Some(sharing) = self.inner.sharing.get() else { return };
        sharing.lock().drop_starts_before(until);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let wall = SystemTime::now() + until.saturating_duration_since(Instant::now());
        let limiter = self.clone();
        runtime.spawn(async move {
            let Some(sharing) = limiter.inner.sharing.get() else { return };
            if let Err(why) = sharing.schedule.cool_down(wall).await {
                tracing::debug!(reason = %why.0, "the fleet was not told of the route's cool-down");
            }
        });
    }

    /// The end of the cool-down in force, if one is.
    pub fn cooling_until(&self) -> Option<Instant> {
        self.inner.lock().cool_down.filter(|&until| until > Instant::now())
    }

    fn cooling(&self, now: Instant) -> bool {
        self.inner.lock().cool_down.is_some_and(|until| until > now)
    }

    /// Books a start: the next request's slot and the tokens, at
    /// `1 / members` of the limits. A caller that slept for its turn is
    /// booked at the time it was due, so late wake-ups (up to one
    /// request's spacing) do not add up to a slower rate; one that did not
    /// wait is booked now, so idle time buys no burst.
    fn charge_start(&self, tokens: u64, due: Option<Instant>, members: u32) {
        let limits = self.inner.limits;
        let now = Instant::now();
        let spacing = limits.requests_per_minute.map_or(Duration::ZERO, |rpm| MINUTE / rpm) * members;
        let start = due.map_or(now, |due| due.max(now.checked_sub(spacing).unwrap_or(now)));
        let mut schedule = self.inner.lock();
        if limits.requests_per_minute.is_some() {
            schedule.next_request = schedule.next_request.max(start) + spacing;
        }
        if let Some(tpm) = limits.tokens_per_minute {
            schedule.tokens_paid = schedule.tokens_paid.max(start) + time_for(tokens, tpm) * members;
        }
    }
}

/// How much later a cool-down must end than the one in force to be told
/// upstream and to the fleet.
const COOL_DOWN_NEWS: Duration = Duration::from_millis(100);

/// A booking dropped before its answer: its token debt and answered calls
/// go back for the next.
struct Unanswered<'a> {
    sharing: &'a Sharing,
    booking: Option<Booking>,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        let Some(booking) = self.booking.take() else { return };
        let mut state = self.sharing.lock();
        state.token_time_micros += booking.token_time_micros;
        state.answered = state.answered.saturating_add(booking.answered);
    }
}

/// Keeps this member in its fleet: books no starts whenever
/// `SharingState::errand` says one is due (slots to ask for or give back,
/// a lease to renew while callers are in flight or waiting and nothing
/// else booked), waking when callers come or go; ends with the limiter.
async fn keep_fleet_membership(
    inner: std::sync::Weak<Inner>,
    wake: Arc<tokio::sync::Notify>,
    renew_every: Option<Duration>,
) {
    loop {
        let wait = {
            let Some(inner) = inner.upgrade() else { return };
            let limiter = Limiter { inner };
            let inner = &limiter.inner;
            let Some(sharing) = inner.sharing.get() else { return };
            let demand = inner.demand.load(Ordering::Relaxed);
            let (in_flight, cap) = (inner.gate.in_flight(), inner.gate.concurrency().1);
            let errand = sharing.lock().errand(Instant::now(), demand, in_flight, cap, renew_every);
            match errand {
                Ok(()) => {
                    let spacing = inner.limits.requests_per_minute.map_or(Duration::ZERO, |rpm| MINUTE / rpm);
                    limiter.book_on_the_fleet(sharing, 0, spacing).await;
                    continue;
                }
                Err(wait) => wait,
            }
        };
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// A duration in whole microseconds, as the shared schedule counts.
fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Schedule> {
        self.schedule.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Warns, once, that a route marked `shared = true` is called where no
    /// fleet shares it.
    fn warn_if_meant_for_a_fleet(&self) {
        let Some(route) = self.meant_for_a_fleet.get() else { return };
        if self.said_unshared.swap(true, Ordering::Relaxed) {
            return;
        }
        tracing::warn!(
            route = %route,
            "route {route:?} is marked `shared = true`, but only a `subagents worker` shares a route's limits \
             (through its broker): here its rpm, tpm and max_concurrent hold for this process alone"
        );
    }

    /// What one call may be charged: at most a minute of the route's
    /// tokens. An estimate or a reported usage may say anything (a fault,
    /// a hostile endpoint: 10^18 tokens would be millennia of debt), and
    /// one call must not hold the route for longer than the window its
    /// limit is counted in.
    fn chargeable(&self, tokens: u64) -> u64 {
        self.limits.tokens_per_minute.map_or(tokens, |tpm| tokens.min(tpm))
    }
}

/// The time `tokens` take at `tpm` tokens a minute.
fn time_for(tokens: u64, tpm: u64) -> Duration {
    let nanos = u128::from(tokens) * MINUTE.as_nanos() / u128::from(tpm);
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

impl Permit {
    /// How long the call waited for its slot, its turn and any cool-down.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// The tokens it was charged before it went.
    pub fn charged(&self) -> u64 {
        self.charged
    }

    /// Charges the tokens the call really used instead of its estimate
    /// (0 for an attempt the endpoint refused; at most a minute of the
    /// route's tokens, whatever the answer reported), and frees its slot.
    /// A permit dropped without settling keeps its estimate charged, and so
    /// does a report past [`MAX_CREDIBLE_USAGE`] (no model's context holds
    /// that many: the count is unknown, not a bill). However many calls
    /// settle, the route is never more than [`MAX_TOKEN_DEBT`] in debt.
    pub fn settle(mut self, used_tokens: u64) {
        if let Some(upstream) = self.upstream.take() {
            upstream.settle(used_tokens);
        }
        let Some(tpm) = self.inner.limits.tokens_per_minute else { return };
        if used_tokens > MAX_CREDIBLE_USAGE {
            tracing::debug!(
                used_tokens,
                charged = self.charged,
                "a usage past any model's context: the estimate stands"
            );
            return;
        }
        let used_tokens = self.inner.chargeable(used_tokens);
        if let Some(sharing) = self.inner.sharing.get() {
            // Paid into the fleet's debt with the next booking (the
            // schedule holds the debt to MAX_TOKEN_DEBT).
            let difference = micros(time_for(used_tokens, tpm)) - micros(time_for(self.charged, tpm));
            sharing.lock().token_time_micros += difference;
            return;
        }
        let mut schedule = self.inner.lock();
        if used_tokens >= self.charged {
            // A debt already longer (a fleet's fraction in fallback) stands.
            let most = schedule.tokens_paid.max(Instant::now() + MAX_TOKEN_DEBT);
            schedule.tokens_paid = (schedule.tokens_paid + time_for(used_tokens - self.charged, tpm)).min(most);
        } else {
            let surplus = time_for(self.charged - used_tokens, tpm);
            // Never into the past: a credit would be a burst.
            let floor = Instant::now();
            schedule.tokens_paid = schedule.tokens_paid.checked_sub(surplus).map_or(floor, |t| t.max(floor));
        }
    }
}

/// When an endpoint that refused a call (429, 529) says to come back, from
/// its headers: `retry-after-ms`, `retry-after` (seconds, or an HTTP date),
/// else the latest of the reset headers, OpenAI's
/// `x-ratelimit-reset-requests`/`-tokens` (`1s`, `6m0s`, `20ms`) and
/// Anthropic's `anthropic-ratelimit-*-reset` (RFC 3339 times). Capped at
/// [`MAX_COOL_DOWN`]; `None` when no header says.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use subagents::agent::retry_delay;
///
/// let headers = |name: &str| (name == "x-ratelimit-reset-requests").then(|| "1m2.5s".to_owned());
/// assert_eq!(retry_delay(headers, SystemTime::now()), Some(Duration::from_secs(60)));
/// let headers = |name: &str| (name == "retry-after").then(|| "2".to_owned());
/// assert_eq!(retry_delay(headers, SystemTime::now()), Some(Duration::from_secs(2)));
/// ```
pub fn retry_delay(header: impl Fn(&str) -> Option<String>, now: SystemTime) -> Option<Duration> {
    let explicit = header("retry-after-ms")
        .and_then(|ms| ms.trim().parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
        .map(|ms| Duration::from_secs_f64(ms.min(1e9) / 1e3))
        .or_else(|| header("retry-after").and_then(|value| retry_after(value.trim(), now)));
    let delay = explicit.or_else(|| {
        let relative = ["x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"]
            .into_iter()
            .filter_map(|name| header(name).and_then(|value| go_duration(value.trim())));
        let absolute = [
            "anthropic-ratelimit-requests-reset",
            "anthropic-ratelimit-tokens-reset",
            "anthropic-ratelimit-input-tokens-reset",
            "anthropic-ratelimit-output-tokens-reset",
        ]
        .into_iter()
        .filter_map(|name| header(name).and_then(|value| rfc3339(value.trim())))
        .map(|at| at.duration_since(now).unwrap_or(Duration::ZERO));
        relative.chain(absolute).max()
    })?;
    Some(delay.min(MAX_COOL_DOWN))
}

/// `retry-after`: whole (or fractional) seconds, or an HTTP date.
fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    if let Ok(seconds) = value.parse::<f64>() {
        return (seconds.is_finite() && seconds >= 0.0).then(|| Duration::from_secs_f64(seconds.min(1e9)));
    }
    Some(http_date(value)?.duration_since(now).unwrap_or(Duration::ZERO))
}

/// `1h2m3.5s`, `6m0s`, `20ms`, `1.5s`: a sum of numbers with units.
fn go_duration(text: &str) -> Option<Duration> {
    let mut rest = text;
    let mut total = 0f64;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let split = rest.find(|c: char| !c.is_ascii_digit() && c != '.')?;
        let number: f64 = rest[..split].parse().ok()?;
        rest = &rest[split..];
        let unit_end = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        total += number * scale;
        rest = &rest[unit_end..];
    }
    (total.is_finite() && total >= 0.0).then(|| Duration::from_secs_f64(total.min(1e9)))
}

/// `Sun, 06 Nov 1994 08:49:37 GMT` (the one form HTTP senders must use).
fn http_date(text: &str) -> Option<SystemTime> {
    let mut parts = text.split_ascii_whitespace();
    let _weekday = parts.next()?;
    let day: u32 = parts.next()?.parse().ok()?;
    let month = month_number(parts.next()?)?;
    let year: i64 = parts.next()?.parse().ok()?;
    let (hour, minute, second) = clock(parts.next()?)?;
    if parts.next()? != "GMT" || parts.next().is_some() {
        return None;
    }
    instant(year, month, day, hour, minute, second, 0.0)
}

/// `2024-05-01T12:00:30Z`, `2024-05-01T12:00:30.5+02:00`.
fn rfc3339(text: &str) -> Option<SystemTime> {
    let (date, time) = text.split_once(['T', 't', ' '])?;
    let mut date_parts = date.splitn(3, '-');
    let year: i64 = date_parts.next()?.parse().ok()?;
    let month: u32 = date_parts.next()?.parse().ok()?;
    let day: u32 = date_parts.next()?.parse().ok()?;
    let (clock_text, offset_seconds) = if let Some(clock_text) = time.strip_suffix(['Z', 'z']) {
        (clock_text, 0i64)
    } else {
        let at = time.rfind(['+', '-'])?;
        let (clock_text, offset) = time.split_at(at);
        let sign = if offset.starts_with('-') { -1 } else { 1 };
        let (hours, minutes) = offset[1..].split_once(':')?;
        (clock_text, sign * (hours.parse::<i64>().ok()? * 3600 + minutes.parse::<i64>().ok()? * 60))
    };
    let (whole, fraction) = clock_text.split_once('.').unwrap_or((clock_text, "0"));
    let (hour, minute, second) = clock(whole)?;
    let fraction: f64 = format!("0.{fraction}").parse().ok()?;
    let at = instant(year, month, day, hour, minute, second, fraction)?;
    let offset = Duration::from_secs(offset_seconds.unsigned_abs());
    if offset_seconds >= 0 {
        at.checked_sub(offset)
    } else {
        at.checked_add(offset)
    }
}

fn clock(text: &str) -> Option<(u32, u32, u32)> {
    let mut parts = text.splitn(3, ':');
    let hour = parts.next()?.parse().ok().filter(|&h| h < 24)?;
    let minute = parts.next()?.parse().ok().filter(|&m| m < 60)?;
    let second = parts.next()?.parse().ok().filter(|&s| s <= 60)?;
    Some((hour, minute, second))
}

fn month_number(name: &str) -> Option<u32> {
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    MONTHS.iter().position(|m| *m == name).map(|i| i as u32 + 1)
}

/// A UTC calendar time as a [`SystemTime`] (days from the civil date, as
/// in Howard Hinnant's algorithm).
fn instant(year: i64, month: u32, day: u32, hour: u32, minute: u32, second: u32, fraction: f64) -> Option<SystemTime> {
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let (y, m) = if month <= 2 { (year - 1, i64::from(month) + 9) } else { (year, i64::from(month) - 3) };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let day_of_year = (153 * m + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    let seconds = days * 86_400 + i64::from(hour) * 3600 + i64::from(minute) * 60 + i64::from(second);
    let seconds = u64::try_from(seconds).ok()?;
    UNIX_EPOCH.checked_add(Duration::from_secs(seconds) + Duration::from_secs_f64(fraction.clamp(0.0, 0.999_999_999)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn dates_of_both_forms_are_read_in_utc() {
        assert_eq!(http_date("Sun, 06 Nov 1994 08:49:37 GMT"), Some(at(784_111_777)));
        assert_eq!(rfc3339("1994-11-06T08:49:37Z"), Some(at(784_111_777)));
        assert_eq!(rfc3339("1994-11-06T10:49:37+02:00"), Some(at(784_111_777)));
        assert_eq!(rfc3339("2000-02-29T00:00:00.5Z"), Some(at(951_782_400) + Duration::from_millis(500)));
        assert_eq!(http_date("yesterday"), None);
        assert_eq!(rfc3339("1994-13-06T08:49:37Z"), None);
    }

    #[test]
    fn reset_headers_give_the_latest_reset_and_retry_after_wins() {
        let now = at(1_000);
        let headers = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| (*v).to_owned())
        };
        let openai = headers(&[("x-ratelimit-reset-requests", "120ms"), ("x-ratelimit-reset-tokens", "1.5s")]);
        assert_eq!(retry_delay(openai, now), Some(Duration::from_millis(1500)));
        let anthropic = headers(&[("anthropic-ratelimit-requests-reset", "1970-01-01T00:16:43Z")]);
        assert_eq!(retry_delay(anthropic, now), Some(Duration::from_secs(3)));
        let both = headers(&[("retry-after", "1"), ("x-ratelimit-reset-tokens", "30s")]);
        assert_eq!(retry_delay(both, now), Some(Duration::from_secs(1)));
        let date = headers(&[("retry-after", "Thu, 01 Jan 1970 00:16:50 GMT")]);
        assert_eq!(retry_delay(date, now), Some(Duration::from_secs(10)));
        let past = headers(&[("retry-after", "Thu, 01 Jan 1970 00:00:01 GMT")]);
        assert_eq!(retry_delay(past, now), Some(Duration::ZERO));
        let huge = headers(&[("retry-after", "86400")]);
        assert_eq!(retry_delay(huge, now), Some(MAX_COOL_DOWN));
        let nothing = headers(&[("retry-after", "soon")]);
        assert_eq!(retry_delay(nothing, now), None);
        assert_eq!(retry_delay(headers(&[("retry-after", "-1")]), now), None);
        assert_eq!(retry_delay(headers(&[]), now), None);
        // Milliseconds before seconds; fractions of either.
        let both = headers(&[("retry-after", "2"), ("retry-after-ms", "250")]);
        assert_eq!(retry_delay(both, now), Some(Duration::from_millis(250)));
        assert_eq!(retry_delay(headers(&[("retry-after", "0.5")]), now), Some(Duration::from_millis(500)));
        assert_eq!(go_duration("6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(go_duration("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(go_duration("5 seconds"), None);
    }

    fn limiter(rpm: Option<u32>, tpm: Option<u64>, max_concurrent: Option<u32>) -> Limiter {
        Limiter::new(RouteLimits { requests_per_minute: rpm, tokens_per_minute: tpm, max_concurrent })
    }

    #[tokio::test(start_paused = true)]
    async fn requests_are_spaced_evenly_at_the_rate() {
        let limiter = limiter(Some(600), None, None); // one per 100 ms
        let cancel = CancellationToken::new();
        let start = Instant::now();
        let mut starts = Vec::new();
        for _ in 0..5 {
            let permit = limiter.admit(0, &cancel).await.unwrap();
            starts.push(start.elapsed());
            drop(permit);
        }
        let expected: Vec<Duration> = (0..5).map(|n| Duration::from_millis(100 * n)).collect();
        assert_eq!(starts, expected);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cool_down_holds_every_caller_and_they_resume_one_by_one() {
        let limiter = limiter(Some(6_000), None, None); // one per 10 ms
        let cancel = CancellationToken::new();
        let start = Instant::now();
        limiter.cool_down_until(start + Duration::from_secs(2));
        // An earlier cool-down does not shorten the one in force.
        limiter.cool_down_until(start + Duration::from_secs(1));
        let callers: Vec<_> = (0..3)
            .map(|_| {
                let (limiter, cancel) = (limiter.clone(), cancel.clone());
                tokio::spawn(async move {
                    let permit = limiter.admit(0, &cancel).await.unwrap();
                    (start.elapsed(), permit.waited())
                })
            })
            .collect();
        let mut resumed = Vec::new();
        for caller in callers {
            resumed.push(caller.await.unwrap());
        }
        resumed.sort();
        let times: Vec<Duration> = resumed.iter().map(|(at, _)| *at).collect();
        assert_eq!(times, [Duration::from_millis(2_000), Duration::from_millis(2_010), Duration::from_millis(2_020)]);
        assert!(resumed.iter().all(|(at, waited)| waited == at), "each reports its wait: {resumed:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_cool_down_set_while_a_caller_waits_its_turn_holds_it_too() {
        let limiter = limiter(Some(60), None, None); // one per second
        let cancel = CancellationToken::new();
        let start = Instant::now();
        drop(limiter.admit(0, &cancel).await.unwrap());
        let waiting = {
            let (limiter, cancel) = (limiter.clone(), cancel.clone());
            tokio::spawn(async move { limiter.admit(0, &cancel).await.map(|_| start.elapsed()) })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        limiter.cool_down_until(start + Duration::from_secs(3));
        assert_eq!(waiting.await.unwrap(), Ok(Duration::from_secs(3)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cool_down_holds_an_unlimited_route_too() {
        let limiter = limiter(None, None, None);
        let start = Instant::now();
        limiter.cool_down_until(start + Duration::from_millis(700));
        let permit = limiter.admit(10, &CancellationToken::new()).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_millis(700));
        assert_eq!(permit.waited(), Duration::from_millis(700));
        assert_eq!(limiter.cooling_until(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn tokens_are_charged_ahead_and_reconciled_from_the_usage() {
        let limiter = limiter(None, Some(60_000), None); // 1,000 tokens a second
        let cancel = CancellationToken::new();
        let start = Instant::now();
        // Charged 5,000 ahead, used 1,000: the next call waits 1 s, not 5.
        limiter.admit(5_000, &cancel).await.unwrap().settle(1_000);
        let permit = limiter.admit(2_000, &cancel).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        // Used more than estimated: the extra is charged too.
        permit.settle(3_000);
        drop(limiter.admit(0, &cancel).await.unwrap());
        assert_eq!(start.elapsed(), Duration::from_secs(4));
        // A permit dropped unsettled keeps its estimate.
        drop(limiter.admit(500, &cancel).await.unwrap());
        drop(limiter.admit(0, &cancel).await.unwrap());
        assert_eq!(start.elapsed(), Duration::from_millis(4_500));
    }

    #[tokio::test(start_paused = true)]
    async fn a_surplus_is_no_credit_for_a_burst() {
        let limiter = limiter(None, Some(60_000), None);
        let cancel = CancellationToken::new();
        let permit = limiter.admit(1_000, &cancel).await.unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        permit.settle(0);
        let start = Instant::now();
        limiter.admit(3_000, &cancel).await.unwrap().settle(3_000);
        drop(limiter.admit(0, &cancel).await.unwrap());
        assert_eq!(start.elapsed(), Duration::from_secs(3), "the idle time and the refund bought no burst");
    }

    #[tokio::test(start_paused = true)]
    async fn one_call_charges_at_most_a_minute_of_the_route_s_tokens_whatever_it_reports() {
        let limiter = limiter(None, Some(60_000), None); // 1,000 tokens a second
        let cancel = CancellationToken::new();
        let start = Instant::now();
        // An answer that reports the most a model could use: a minute of
        // debt, not hours.
        limiter.admit(1_000, &cancel).await.unwrap().settle(MAX_CREDIBLE_USAGE);
        drop(limiter.admit(0, &cancel).await.unwrap());
        assert_eq!(start.elapsed(), MINUTE);
        // So does an estimate past the route's minute (which a report past
        // any model's context leaves charged).
        let start = Instant::now();
        let permit = limiter.admit(u64::MAX, &cancel).await.unwrap();
        assert_eq!(permit.charged(), 60_000);
        permit.settle(u64::MAX);
        drop(limiter.admit(0, &cancel).await.unwrap());
        assert_eq!(start.elapsed(), MINUTE);
    }

    #[tokio::test(start_paused = true)]
    async fn no_more_than_max_concurrent_calls_are_in_flight() {
        let limiter = limiter(None, None, Some(2));
        let cancel = CancellationToken::new();
        let first = limiter.admit(0, &cancel).await.unwrap();
        let second = limiter.admit(0, &cancel).await.unwrap();
        let third = {
            let (limiter, cancel) = (limiter.clone(), cancel.clone());
            tokio::spawn(async move { limiter.admit(0, &cancel).await.map(|p| p.waited()) })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!third.is_finished(), "a third call waits for a slot");
        first.settle(0);
        assert_eq!(third.await.unwrap(), Ok(Duration::from_secs(1)));
        drop(second);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_cancelled_charges_nothing_and_frees_its_place() {
        let limiter = limiter(Some(60), Some(60_000), Some(1));
        let cancel = CancellationToken::new();
        let start = Instant::now();
        let held = limiter.admit(1_000, &cancel).await.unwrap();
        // One waits for the slot, one for its turn; both are cancelled.
        let waiter = CancellationToken::new();
        let for_slot = {
            let (limiter, waiter) = (limiter.clone(), waiter.clone());
            tokio::spawn(async move { limiter.admit(50_000, &waiter).await.map(drop) })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        waiter.cancel();
        assert_eq!(for_slot.await.unwrap(), Err(Cancelled));
        held.settle(1_000);
        // The slot is free and the cancelled call charged no tokens: the
        // next call waits only for the request spacing (1 s).
        let turn_cancel = CancellationToken::new();
        let for_turn = {
            let (limiter, turn_cancel) = (limiter.clone(), turn_cancel.clone());
            tokio::spawn(async move { limiter.admit(50_000, &turn_cancel).await.map(drop) })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        turn_cancel.cancel();
        assert_eq!(for_turn.await.unwrap(), Err(Cancelled));
        drop(limiter.admit(0, &cancel).await.unwrap());
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_count_past_any_model_s_context_reads_as_unknown_and_keeps_the_estimate() {
        let limiter = limiter(None, Some(60_000), None); // 1,000 tokens a second
        let cancel = CancellationToken::new();
        let start = Instant::now();
        // An answer that reports 10^18 prompt tokens: no bill, the estimate stands.
        limiter.admit(2_000, &cancel).await.unwrap().settle(1_000_000_000_000_000_000);
        drop(limiter.admit(0, &cancel).await.unwrap());
        assert_eq!(start.elapsed(), Duration::from_secs(2), "the call kept its estimate of 2,000 tokens");
        // A count a model could have used is charged as ever.
        limiter.admit(1_000, &cancel).await.unwrap().settle(3_000);
        drop(limiter.admit(0, &cancel).await.unwrap());
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn many_calls_settled_with_huge_counts_hold_the_route_a_minute_at_most() {
        let limiter = limiter(None, Some(60_000), None);
        let cancel = CancellationToken::new();
        // 256 calls admitted at once (each charged nothing ahead), each
        // settled with a count a model could have used, a minute's worth.
        let mut permits = Vec::new();
        for _ in 0..256 {
            permits.push(limiter.admit(0, &cancel).await.unwrap());
        }
        for permit in permits {
            permit.settle(MAX_CREDIBLE_USAGE);
        }
        let start = Instant::now();
        drop(limiter.admit(0, &cancel).await.unwrap());
        assert_eq!(start.elapsed(), MAX_TOKEN_DEBT, "the route was in debt a minute, not 256");
    }
}
