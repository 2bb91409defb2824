//! A route's limits shared beyond its process: the fleet's one schedule of
//! request starts, its token debt and its cool-down, kept where every
//! process of the fleet reads it ([`SharedSchedule`]: the broker of the
//! `remote` workers; see `subagents::wire`'s broker layout).
//!
//! The schedule is a distributed GCRA: one record holds the fleet's next
//! free start. A process books a *slice* of starts at once (as many as its
//! callers are waiting for, at most [`SLICE_SPAN`] of the route's rate) by
//! advancing that record by compare-and-set, then hands the starts to its
//! callers one by one, each at its time; so every request of the fleet is
//! spaced `60 s / rpm` from the one before, whichever process sends it.
//! Tokens are charged locally and paid into the record with the next
//! booking (a slice late at most). A start missed by more than a few
//! spacings is dropped, never sent late in a burst: a process that dies
//! holding starts loses only their time, and the fleet's capacity comes
//! back as it passes.
//!
//! `max_concurrent` (and the fleet's concurrency under it) is shared by
//! slots when the schedule counts them ([`SharedSchedule::counts_slots`]):
//! each booking tells the schedule how many calls this process may have in
//! flight until the answer comes and how many it wants, and the answer
//! grants it slots only while the fleet's holdings stay within the ceiling.
//! The process starts with none, so the limit holds from the fleet's first
//! request, however many processes start at once. A process short of
//! slots asks again [`RETRY_SLOTS_AFTER`] later (and, while the fleet
//! wants more than the ceiling, every [`CONTENDED_ASK_EVERY`], so a member
//! holding more than its fair share hears so); one holding more than it
//! needs gives the surplus back [`RELEASE_AFTER`] after its last booking.
//! A schedule that counts no slots shares `max_concurrent` by fraction:
//! each of the fleet's live members (as the schedule last counted them)
//! lets in `1 / members` of it. When the schedule cannot be reached the
//! process falls back to its own fraction of every limit
//! (`limit / members`, last known), says so once in a warning and in
//! [`SharedStats::fallback`], and asks again a second later.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use futures_util::future::BoxFuture;
use tokio::time::Instant;

/// The most of the route's rate one booking takes (at least one start):
/// small, so a process that stops calling strands little of the fleet's
/// capacity.
pub const SLICE_SPAN: Duration = Duration::from_millis(50);

/// The most starts one booking takes.
const MAX_SLICE: u32 = 20;

/// How long a process in fallback waits before asking the schedule again.
const RETRY_SHARED_AFTER: Duration = Duration::from_secs(1);

/// How long a process granted fewer slots than its fair share waits before
/// it asks again.
pub(super) const RETRY_SLOTS_AFTER: Duration = Duration::from_millis(50);

/// How often a process asks for its slots while the fleet wants more than
/// its ceiling: each answer moves it toward its fair share.
pub(super) const CONTENDED_ASK_EVERY: Duration = Duration::from_millis(250);

/// How long after its last booking a process gives back the slots it
/// holds beyond its calls (a short lull keeps them).
pub(super) const RELEASE_AFTER: Duration = Duration::from_millis(100);

/// Where a shared route keeps its fleet-wide schedule. Implemented on the
/// broker of the `remote` workers; a test or an embedder may bring its own.
pub trait SharedSchedule: Send + Sync + std::fmt::Debug + 'static {
    /// Books `booking.requests` starts `booking.spacing` apart, the first
    /// no earlier than the fleet's next free start, its token debt and its
    /// cool-down; pays `booking.token_time` into the debt.
    fn book(&self, booking: Booking) -> BoxFuture<'_, Result<Booked, Unshared>>;

    /// Every process of the fleet starts nothing on the route before `until`.
    fn cool_down(&self, until: SystemTime) -> BoxFuture<'_, Result<(), Unshared>>;

    /// How often a member that holds calls in flight (or has callers
    /// waiting) renews its membership while it books nothing: a fraction
    /// of the time a membership lasts without renewal. `None` (the
    /// default): memberships do not expire. A renewal is a booking of no
    /// starts.
    fn renew_every(&self) -> Option<Duration> {
        None
    }

    /// A call admitted while the fleet's concurrency was at `epoch` met an
    /// overload the endpoint did not explain, with about `in_flight` calls
    /// of the fleet in flight: the fleet's ceiling halves (to half of
    /// `in_flight` if that is lower), once per epoch. What it is now;
    /// `None` (the default) when the schedule keeps no fleet concurrency
    /// (then each process backs off alone).
    fn back_off(&self, epoch: u64, in_flight: u32) -> BoxFuture<'_, Result<Option<FleetConcurrency>, Unshared>> {
        let _ = (epoch, in_flight);
        Box::pin(async { Ok(None) })
    }

    /// Whether each booking's answer grants this process its slots of the
    /// fleet's concurrency ([`Booked::slots`]); then it lets no call in
    /// before its first booking. `false` (the default): each process lets
    /// in `1 / members` of it.
    fn counts_slots(&self) -> bool {
        false
    }
}

/// A process's slots of the fleet's concurrency, as a booking granted them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FleetSlots {
    /// The calls it may have in flight now.
    pub granted: u32,
    /// Its fair share of what it wanted: fewer granted means others hold
    /// more than theirs, and will give it back.
    pub share: u32,
    /// The fleet's members want more than its ceiling together.
    pub contended: bool,
}

/// The fleet's concurrency on a route (AIMD across the fleet): its members
/// share it by the slots the schedule grants them, or by `ceiling / members`
/// where it counts none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FleetConcurrency {
    /// Calls the fleet lets in flight now: `max_concurrent` at most, halved
    /// by an unexplained overload, one more per `ceiling` answered calls.
    pub ceiling: u32,
    /// Bumped by each decrease, so the refusals of calls admitted before
    /// one do not halve it again.
    pub epoch: u64,
}

/// What one booking asks of the fleet's schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Booking {
    /// Starts wanted.
    pub requests: u32,
    /// Their spacing (`60 s / rpm`; zero without `rpm`).
    pub spacing: Duration,
    /// Token debt to add, as time at the route's `tpm` (negative: a refund
    /// of an estimate that was more than the answer used).
    pub token_time_micros: i64,
    /// Calls answered since the last booking (each `ceiling` of them
    /// across the fleet raise its concurrency by one).
    pub answered: u32,
    /// The most the fleet lets in flight (`max_concurrent`, or the default
    /// cap).
    pub cap: u32,
    /// The most calls this process may have in flight until it hears the
    /// answer (its slots granted before, or its calls in flight if more).
    pub holding: u32,
    /// Its calls in flight and waiting for a slot.
    pub wanted: u32,
}

/// What a booking got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Booked {
    /// The first start (the others follow at the spacing).
    pub first: SystemTime,
    /// The processes sharing the route now (at least 1).
    pub members: u32,
    /// The fleet's concurrency, if the schedule keeps one.
    pub concurrency: Option<FleetConcurrency>,
    /// This process's slots of it, if the schedule counts them.
    pub slots: Option<FleetSlots>,
}

/// The fleet's schedule could not be reached; the reason.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the route's shared schedule is out of reach: {0}")]
pub struct Unshared(pub String);

/// What a shared route saw of its fleet ([`RouteStats::shared`](super::RouteStats::shared)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SharedStats {
    /// Processes sharing the route, last counted.
    pub members: u32,
    /// Bookings made on the fleet's schedule.
    pub bookings: u64,
    /// Bookings of no starts: leases renewed (calls in flight, none
    /// starting), slots asked for or given back.
    pub renewals: u64,
    /// The fleet's concurrency ceiling, last seen (this process lets in
    /// the slots of it the schedule granted, or `ceiling / members`).
    pub fleet_concurrency: Option<u32>,
    /// Why the process runs on its own fraction now, if it does.
    pub fallback: Option<String>,
    /// Times it fell back.
    pub fallbacks: u64,
}

/// A process's side of a shared route.
pub(super) struct Sharing {
    pub(super) schedule: std::sync::Arc<dyn SharedSchedule>,
    pub(super) state: std::sync::Mutex<SharingState>,
    /// Held through each booking and the taking of its answer: an answer
    /// taken after a later booking's would grant slots the schedule no
    /// longer counts.
    pub(super) booking: tokio::sync::Mutex<()>,
    /// Wakes the task that keeps the process's lease and slots (callers
    /// came or went).
    pub(super) wake: std::sync::Arc<tokio::sync::Notify>,
}

pub(super) struct SharingState {
    /// Starts booked and not yet handed out, earliest first.
    granted: VecDeque<Instant>,
    /// Token time charged since the last booking.
    pub(super) token_time_micros: i64,
    pub(super) stats: SharedStats,
    /// In fallback: when to ask the schedule again.
    retry_at: Option<Instant>,
    /// The last booking or renewal the schedule took.
    last_booked: Option<Instant>,
    /// Calls answered since the last booking.
    pub(super) answered: u32,
    /// The fleet concurrency's epoch, last seen.
    pub(super) epoch: u64,
    /// The schedule grants slots ([`SharedSchedule::counts_slots`]).
    counts_slots: bool,
    /// The slots the last answer granted (`None`: the schedule counts none,
    /// or is out of reach and the process keeps to its fraction).
    pub(super) slots: Option<u32>,
    /// The slots the schedule counts this process as holding.
    recorded: u32,
    /// The slots the last booking wanted.
    asked: u32,
    /// The last answer granted fewer slots than its fair share.
    short: bool,
    /// The last answer said the fleet wants more than its ceiling.
    contended: bool,
}

/// How long the keeping task sleeps with nothing due and no lease to renew.
const IDLE_CHECK: Duration = Duration::from_secs(1);

impl Sharing {
    pub(super) fn new(schedule: std::sync::Arc<dyn SharedSchedule>) -> Sharing {
        let stats = SharedStats { members: 1, ..SharedStats::default() };
        let counts_slots = schedule.counts_slots();
        Sharing {
            schedule,
            booking: tokio::sync::Mutex::new(()),
            wake: std::sync::Arc::default(),
            state: std::sync::Mutex::new(SharingState {
                granted: VecDeque::new(),
                token_time_micros: 0,
                stats,
                retry_at: None,
                last_booked: None,
                answered: 0,
                epoch: 0,
                counts_slots,
                // None until the first answer grants some.
                slots: counts_slots.then_some(0),
                recorded: 0,
                asked: 0,
                short: false,
                contended: false,
            }),
        }
    }

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, SharingState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl SharingState {
    /// The next booked start still worth using (missed ones dropped).
    pub(super) fn next_start(&mut self, now: Instant, spacing: Duration) -> Option<Instant> {
        let stale = (spacing * 4).max(Duration::from_millis(20));
        while let Some(&at) = self.granted.front() {
            if at + stale >= now {
                return Some(at);
            }
            self.granted.pop_front();
        }
        None
    }

    /// Hands out the start `next_start` gave.
    pub(super) fn take_start(&mut self) {
        self.granted.pop_front();
    }

    /// Drops every start booked before `until` (a cool-down began).
    pub(super) fn drop_starts_before(&mut self, until: Instant) {
        self.granted.retain(|&at| at >= until);
    }

    /// Whether the schedule should be asked now (not in fallback, or the
    /// fallback's wait is over).
    pub(super) fn may_ask(&self, now: Instant) -> bool {
        self.retry_at.is_none_or(|at| now >= at)
    }

    /// The starts to book for `waiting` callers: a slice.
    pub(super) fn starts_for(waiting: u32, spacing: Duration) -> u32 {
        let slice = if spacing.is_zero() {
            MAX_SLICE
        } else {
            u32::try_from(SLICE_SPAN.as_nanos() / spacing.as_nanos()).unwrap_or(MAX_SLICE).clamp(1, MAX_SLICE)
        };
        waiting.clamp(1, slice)
    }

    /// A booking of `requests` starts (0: none), paying the token debt and
    /// telling the answered calls; `in_flight` calls in flight, `wanted`
    /// slots wanted, and `allowed` the calls the gate lets in now.
    pub(super) fn booking(
        &mut self,
        requests: u32,
        spacing: Duration,
        cap: u32,
        in_flight: u32,
        wanted: u32,
        allowed: u32,
    ) -> Booking {
        Booking {
            requests,
            spacing,
            token_time_micros: std::mem::take(&mut self.token_time_micros),
            answered: std::mem::take(&mut self.answered),
            cap,
            // Until the answer is taken the gate may fill what it lets in.
            holding: self.slots.unwrap_or(allowed).max(in_flight),
            wanted,
        }
    }

    /// Before a booking: slots granted beyond `keep` are given up here
    /// first (the booking then says so), so the process never has more in
    /// flight than the schedule counts. The slots it keeps, if it counts.
    pub(super) fn give_up_beyond(&mut self, keep: u32) -> Option<u32> {
        let granted = self.slots?;
        if keep < granted {
            self.slots = Some(keep);
        }
        self.slots
    }

    /// Whether a booking of no starts is due now, with `demand` callers in
    /// flight or waiting (`in_flight` of them holding a slot) on a route of
    /// concurrency `cap`: `Err` with how long until one may be, unless
    /// callers come or go meanwhile. Due: slots wanted beyond those granted
    /// (at once when the callers grew, again after [`RETRY_SLOTS_AFTER`]
    /// while the last answer was short of its fair share, else with the
    /// fleet's contention),
    /// slots held beyond the calls (after [`RELEASE_AFTER`]), a fleet that
    /// wants more than its ceiling (every [`CONTENDED_ASK_EVERY`]), and the
    /// lease of a member with callers (every `renew_every`).
    pub(super) fn errand(
        &self,
        now: Instant,
        demand: u32,
        in_flight: u32,
        cap: u32,
        renew_every: Option<Duration>,
    ) -> Result<(), Duration> {
        if let Some(at) = self.retry_at.filter(|&at| at > now) {
            return Err(at - now);
        }
        let since = self.last_booked.map_or(Duration::MAX, |at| now.saturating_duration_since(at));
        let after = |wait: Duration| if since >= wait { Ok(()) } else { Err(wait - since) };
        if self.counts_slots {
            let wanted = demand.min(cap);
            match self.slots {
                // The first booking, or the first back from a fallback.
                None if wanted > 0 => return Ok(()),
                Some(granted) if wanted > granted && (self.short || wanted > self.asked) => {
                    return after(if self.short { RETRY_SLOTS_AFTER } else { Duration::ZERO })
                }
                _ => {}
            }
            if self.recorded > wanted.max(in_flight) {
                return after(RELEASE_AFTER);
            }
            if self.contended && wanted > 0 {
                return after(CONTENDED_ASK_EVERY);
            }
        }
        match renew_every {
            Some(every) if demand > 0 => after(every),
            Some(every) => Err(every),
            None => Err(IDLE_CHECK),
        }
    }

    /// Takes the fleet's concurrency a booking or a back-off gave.
    pub(super) fn fleet_concurrency(&mut self, concurrency: FleetConcurrency) {
        self.epoch = self.epoch.max(concurrency.epoch);
        self.stats.fleet_concurrency = Some(concurrency.ceiling);
    }

    /// Takes what a booking got.
    pub(super) fn booked(&mut self, booking: &Booking, booked: Booked) {
        let now = Instant::now();
        let wall = SystemTime::now();
        let first = now + booked.first.duration_since(wall).unwrap_or(Duration::ZERO);
        self.granted.extend((0..booking.requests).map(|n| first + booking.spacing * n));
        self.stats.members = booked.members.max(1);
        if let Some(concurrency) = booked.concurrency {
            self.fleet_concurrency(concurrency);
        }
        if let Some(slots) = booked.slots.filter(|_| self.counts_slots) {
            self.slots = Some(slots.granted);
            self.recorded = booking.holding.max(slots.granted);
            self.asked = booking.wanted;
            self.short = slots.granted < slots.share;
            self.contended = slots.contended;
        }
        self.last_booked = Some(now);
        if booking.requests > 0 {
            self.stats.bookings += 1;
        } else {
            self.stats.renewals += 1;
        }
        if let Some(reason) = self.stats.fallback.take() {
            tracing::warn!(%reason, "the route's shared schedule is back: the fleet's limits hold again");
        }
        self.retry_at = None;
    }

    /// The schedule failed: the booking's token debt is kept for the next,
    /// and the process runs on its own fraction until it asks again.
    pub(super) fn unshared(&mut self, booking: &Booking, why: Unshared) {
        self.token_time_micros += booking.token_time_micros;
        self.answered = self.answered.saturating_add(booking.answered);
        self.retry_at = Some(Instant::now() + RETRY_SHARED_AFTER);
        // Its fraction of the fleet's concurrency until the schedule is back.
        self.slots = None;
        if self.stats.fallback.is_none() {
            tracing::warn!(
                reason = %why.0,
                members = self.stats.members,
                "the route's shared schedule is out of reach: this process keeps to its own fraction of the limits"
            );
            self.stats.fallbacks += 1;
            self.stats.fallback = Some(why.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    use tokio_util::sync::CancellationToken;

    use super::super::{Limiter, RouteLimits};
    use super::*;

    /// A fleet's schedule in memory, on tokio's (paused) clock.
    #[derive(Debug, Default)]
    struct InMemory {
        next: Mutex<Option<Instant>>,
        members: u32,
        down: AtomicBool,
        /// How often a member renews (`None`: memberships never expire).
        renew: Option<Duration>,
        /// Bookings of no starts: renewals.
        renewals: std::sync::atomic::AtomicU32,
        /// The fleet's concurrency, when it keeps one; and the epochs each
        /// back-off was asked for.
        fleet: Mutex<Option<FleetConcurrency>>,
        back_offs: Mutex<Vec<u64>>,
    }

    impl SharedSchedule for InMemory {
        fn book(&self, booking: Booking) -> BoxFuture<'_, Result<Booked, Unshared>> {
            Box::pin(async move {
                if self.down.load(Ordering::SeqCst) {
                    return Err(Unshared("the broker is down".to_owned()));
                }
                if booking.requests == 0 {
                    self.renewals.fetch_add(1, Ordering::SeqCst);
                }
                let now = Instant::now();
                let mut next = self.next.lock().unwrap();
                let first = next.map_or(now, |next| next.max(now));
                *next = Some(first + booking.spacing * booking.requests);
                let first = SystemTime::now() + (first - now);
                Ok(Booked { first, members: self.members, concurrency: *self.fleet.lock().unwrap(), slots: None })
            })
        }

        fn back_off(&self, epoch: u64, _in_flight: u32) -> BoxFuture<'_, Result<Option<FleetConcurrency>, Unshared>> {
            Box::pin(async move {
                self.back_offs.lock().unwrap().push(epoch);
                let mut fleet = self.fleet.lock().unwrap();
                if let Some(fleet) = fleet.as_mut().filter(|fleet| fleet.epoch == epoch) {
                    *fleet = FleetConcurrency { ceiling: (fleet.ceiling / 2).max(1), epoch: epoch + 1 };
                }
                Ok(*fleet)
            })
        }

        fn cool_down(&self, _until: SystemTime) -> BoxFuture<'_, Result<(), Unshared>> {
            Box::pin(async { Ok(()) })
        }

        fn renew_every(&self) -> Option<Duration> {
            self.renew
        }
    }

    fn shared_limiter(schedule: &Arc<InMemory>) -> Limiter {
        let limiter = Limiter::new(RouteLimits { requests_per_minute: Some(600), ..RouteLimits::default() });
        assert!(limiter.share(schedule.clone()));
        limiter
    }

    #[tokio::test(start_paused = true)]
    async fn two_processes_on_one_schedule_start_one_spacing_apart_between_them() {
        let schedule = Arc::new(InMemory { members: 2, ..InMemory::default() });
        let (first, second) = (shared_limiter(&schedule), shared_limiter(&schedule));
        let start = Instant::now();
        let starts: Arc<Mutex<Vec<Duration>>> = Arc::default();
        let mut callers = Vec::new();
        for limiter in [first.clone(), second.clone()] {
            for _ in 0..5 {
                let (limiter, starts) = (limiter.clone(), starts.clone());
                callers.push(tokio::spawn(async move {
                    let permit = limiter.admit(0, &CancellationToken::new()).await.unwrap();
                    starts.lock().unwrap().push(start.elapsed());
                    drop(permit);
                }));
            }
        }
        for caller in callers {
            caller.await.unwrap();
        }
        let mut starts = starts.lock().unwrap().clone();
        starts.sort();
        let gaps: Vec<Duration> = starts.windows(2).map(|pair| pair[1] - pair[0]).collect();
        assert!(gaps.iter().all(|gap| *gap >= Duration::from_millis(99)), "{starts:?}");
        assert!(starts[9] < Duration::from_millis(1_000), "ten starts at the fleet's rate: {starts:?}");
        let stats = first.stats().shared.unwrap();
        assert_eq!((stats.members, stats.fallback), (2, None));
        assert!(stats.bookings >= 1);
        assert_eq!(first.stats().requests + second.stats().requests, 10);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_of_a_call_admitted_before_the_fleet_backed_off_does_not_halve_it_again() {
        let fleet = Some(FleetConcurrency { ceiling: 20, epoch: 0 });
        let schedule = Arc::new(InMemory { members: 2, fleet: Mutex::new(fleet), ..InMemory::default() });
        let limits = RouteLimits { max_concurrent: Some(20), ..RouteLimits::default() };
        let (first, second) = (Limiter::new(limits), Limiter::new(limits));
        assert!(first.share(schedule.clone()) && second.share(schedule.clone()));
        let cancel = CancellationToken::new();
        // One call on each member, both admitted at the fleet's epoch 0.
        let (one, other) = (first.admit(0, &cancel).await.unwrap(), second.admit(0, &cancel).await.unwrap());
        first.refused(&one, false);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(*schedule.fleet.lock().unwrap(), Some(FleetConcurrency { ceiling: 10, epoch: 1 }));
        // The second member learns the new epoch with its next booking...
        drop(second.admit(0, &cancel).await.unwrap());
        // ...and its call admitted before the halving is refused after it.
        second.refused(&other, false);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            *schedule.back_offs.lock().unwrap(),
            [0, 0],
            "each refusal names the epoch its call was admitted at"
        );
        assert_eq!(*schedule.fleet.lock().unwrap(), Some(FleetConcurrency { ceiling: 10, epoch: 1 }), "halved once");
    }

    #[tokio::test(start_paused = true)]
    async fn without_its_schedule_a_process_keeps_to_its_fraction_and_says_so() {
        let schedule = Arc::new(InMemory { members: 4, ..InMemory::default() });
        let limiter = shared_limiter(&schedule);
        let cancel = CancellationToken::new();
        drop(limiter.admit(0, &cancel).await.unwrap());
        schedule.down.store(true, Ordering::SeqCst);
        let start = Instant::now();
        for _ in 0..3 {
            drop(limiter.admit(0, &cancel).await.unwrap());
        }
        // A quarter of 600 a minute: 400 ms apart.
        assert!(start.elapsed() >= Duration::from_millis(800), "{:?}", start.elapsed());
        let stats = limiter.stats().shared.unwrap();
        assert_eq!(stats.members, 4, "the last count stands");
        assert_eq!(stats.fallbacks, 1);
        assert!(stats.fallback.unwrap().contains("broker is down"));
        // Back: the next booking clears the fallback.
        schedule.down.store(false, Ordering::SeqCst);
        tokio::time::sleep(RETRY_SHARED_AFTER).await;
        drop(limiter.admit(0, &cancel).await.unwrap());
        assert_eq!(limiter.stats().shared.unwrap().fallback, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_member_holding_a_call_longer_than_its_lease_renews_it_and_an_idle_one_does_not() {
        let schedule = Arc::new(InMemory { members: 2, renew: Some(Duration::from_secs(1)), ..InMemory::default() });
        let limiter = shared_limiter(&schedule);
        let cancel = CancellationToken::new();
        let held = limiter.admit(0, &cancel).await.unwrap();
        // A call of ten seconds, ten times the renewal period: renewed all along.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let renewed = schedule.renewals.load(Ordering::SeqCst);
        assert!((8..=11).contains(&renewed), "{renewed} renewals in ten seconds of a call in flight");
        assert_eq!(limiter.stats().shared.unwrap().renewals, u64::from(renewed));
        // Idle: the lease is left to expire.
        drop(held);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let settled = schedule.renewals.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(schedule.renewals.load(Ordering::SeqCst), settled, "no renewal without calls in flight");
        // A member that books renews with its bookings, not besides them.
        let bookings = limiter.stats().shared.unwrap().bookings;
        for _ in 0..30 {
            drop(limiter.admit(0, &cancel).await.unwrap());
        }
        assert!(limiter.stats().shared.unwrap().bookings > bookings);
        assert!(schedule.renewals.load(Ordering::SeqCst) <= settled + 1, "renewals while booking every 100 ms");
    }
}
