//! The route's calls in flight, and how many it lets in: `max_concurrent`
//! (or [`DEFAULT_CONCURRENCY_CAP`]) at most, fewer while the endpoint is
//! overloaded and says nothing more (AIMD, as TCP's congestion window).
//!
//! - A 429 or 529 without advice (no `retry-after`, no reset header)
//!   halves the calls in flight (or the effective concurrency, if lower),
//!   floor 1: the calls admitted before
//!   that decrease met the same overload, so their refusals do not halve
//!   it again (an epoch per decrease fences them).
//! - Each window of successes (as many answered calls as the effective
//!   concurrency) adds one, up to the cap.
//!
//! A shared route lets in its share of the fleet's ceiling on top: the
//! slots the fleet's schedule granted this process (none before its first
//! answer), or `1 / members` of the ceiling where the schedule counts no
//! slots or is out of reach.
//!
//! The slots are a fair semaphore holding `total` permits; lowering the
//! effective concurrency forgets permits as calls give them back, raising
//! it adds them, so a waiter never sees more than the effective count
//! admitted, nor waits while one is free.

use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The concurrency a route without `max_concurrent` starts at and may
/// grow back to after an overload made it back off: high enough that a
/// batch of a thousand concurrent runs is never held by it.
pub const DEFAULT_CONCURRENCY_CAP: u32 = 4096;

pub(super) struct Gate {
    semaphore: Arc<Semaphore>,
    state: Mutex<GateState>,
}

struct GateState {
    /// The most it may let in: `max_concurrent`, or the default cap.
    cap: u32,
    /// What it lets in now.
    effective: u32,
    /// Permits in existence (held or free): above `effective` until the
    /// surplus comes back and is forgotten.
    total: u32,
    /// Answered calls since the last increase or decrease.
    successes: u32,
    /// Bumped by each decrease.
    epoch: u64,
    /// The share of the cap this process may use (1 unless shared by a
    /// fleet, then `1 / members`), applied on top of `effective`.
    members: u32,
    /// The fleet's concurrency, if it keeps one: the share is of it
    /// rather than of the cap.
    fleet_ceiling: Option<u32>,
    /// The slots of the fleet's ceiling its schedule granted this process,
    /// when it counts them: the share, instead of `1 / members`.
    fleet_slots: Option<u32>,
}

impl GateState {
    /// What it lets in now, given its share of the fleet.
    fn allowed(&self) -> u32 {
        let ceiling = self.fleet_ceiling.map_or(self.cap, |ceiling| ceiling.min(self.cap));
        let share = match self.fleet_slots {
            // Possibly none: the fleet's other members hold the ceiling.
            Some(granted) => granted.min(ceiling),
            None => (ceiling / self.members.max(1)).max(1),
        };
        self.effective.min(share)
    }
}

/// A held slot: the epoch it was admitted in.
pub(super) struct Slot {
    permit: Option<OwnedSemaphorePermit>,
    pub(super) epoch: u64,
}

impl Gate {
    pub(super) fn new(cap: u32) -> Gate {
        let cap = cap.max(1);
        Gate {
            semaphore: Arc::new(Semaphore::new(cap as usize)),
            state: Mutex::new(GateState {
                cap,
                effective: cap,
                total: cap,
                successes: 0,
                epoch: 0,
                members: 1,
                fleet_ceiling: None,
                fleet_slots: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a slot (first come, first served).
    pub(super) async fn acquire(&self) -> Slot {
        let permit = self.semaphore.clone().acquire_owned().await.expect("the limiter never closes its slots");
        Slot { permit: Some(permit), epoch: self.lock().epoch }
    }

    /// Forgets the free permits beyond what the route lets in (held ones
    /// are forgotten as they come back).
    fn shrink(&self, state: &mut GateState) {
        let allowed = state.allowed();
        if state.total > allowed {
            let forgotten = self.semaphore.forget_permits((state.total - allowed) as usize);
            state.total -= forgotten as u32;
        }
    }

    /// Gives a slot back: forgotten while there are more permits than the
    /// route lets in.
    pub(super) fn release(&self, slot: &mut Slot) {
        let Some(permit) = slot.permit.take() else { return };
        let mut state = self.lock();
        if state.total > state.allowed() {
            permit.forget();
            state.total -= 1;
        }
    }

    /// A call was answered: one more window of these raises the route's
    /// concurrency by one.
    pub(super) fn answered(&self) {
        let mut state = self.lock();
        state.successes = state.successes.saturating_add(1);
        if state.successes >= state.effective && state.effective < state.cap {
            state.effective += 1;
            state.successes = 0;
            self.grow(&mut state);
        }
    }

    /// A call admitted in `epoch` met an overload the endpoint did not
    /// explain: the route's concurrency halves, once per epoch. Whether it
    /// decreased.
    pub(super) fn overloaded(&self, epoch: u64) -> bool {
        let mut state = self.lock();
        if epoch != state.epoch {
            return false;
        }
        // Halve what was in flight when the endpoint gave way, not a cap it
        // never came near (a route without `max_concurrent` starts at the
        // default cap, far above what most batches hold in flight).
        let in_flight = state.total.saturating_sub(self.semaphore.available_permits() as u32);
        state.effective = (state.effective.min(in_flight) / 2).max(1);
        state.successes = 0;
        state.epoch += 1;
        self.shrink(&mut state);
        true
    }

    /// The fleet's live members and its concurrency ceiling, if it keeps
    /// one: this process lets in `1 / members` of the ceiling (or the cap).
    pub(super) fn share_among(&self, members: u32, fleet_ceiling: Option<u32>) {
        let mut state = self.lock();
        state.members = members.max(1);
        if fleet_ceiling.is_some() {
            state.fleet_ceiling = fleet_ceiling;
        }
        self.shrink(&mut state);
        self.grow(&mut state);
    }

    /// The slots of the fleet's ceiling granted to this process (`None`:
    /// its share is `1 / members`).
    pub(super) fn grant(&self, slots: Option<u32>) {
        let mut state = self.lock();
        state.fleet_slots = slots;
        self.shrink(&mut state);
        self.grow(&mut state);
    }

    /// Adds the permits the route now lets in beyond those in existence
    /// (surplus ones are forgotten as they come back).
    fn grow(&self, state: &mut GateState) {
        let allowed = state.allowed();
        if state.total < allowed {
            self.semaphore.add_permits((allowed - state.total) as usize);
            state.total = allowed;
        }
    }

    /// Slots held now.
    pub(super) fn in_flight(&self) -> u32 {
        let state = self.lock();
        state.total.saturating_sub(self.semaphore.available_permits() as u32)
    }

    /// The concurrency let in now, and its cap.
    pub(super) fn concurrency(&self) -> (u32, u32) {
        let state = self.lock();
        (state.allowed(), state.cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unexplained_overload_halves_the_concurrency_once_and_successes_grow_it_back_by_one_a_window() {
        let gate = Gate::new(8);
        let mut held = Vec::new();
        for _ in 0..8 {
            held.push(gate.acquire().await);
        }
        // All eight met the overload: the first refusal halves, the others
        // were admitted before it and change nothing.
        assert!(gate.overloaded(held[0].epoch));
        assert!(!gate.overloaded(held[1].epoch));
        assert_eq!(gate.concurrency(), (4, 8));
        for slot in &mut held {
            gate.release(slot);
        }
        let mut again: Vec<Slot> = Vec::new();
        for _ in 0..4 {
            again.push(gate.acquire().await);
        }
        assert!(gate.semaphore.clone().try_acquire_owned().is_err(), "no fifth slot while four are let in");
        // A refusal of a call admitted after the decrease halves again.
        assert!(gate.overloaded(again[0].epoch));
        assert_eq!(gate.concurrency(), (2, 8));
        for slot in &mut again {
            gate.release(slot);
        }
        assert_eq!(gate.semaphore.available_permits(), 2);
        // Two answered calls are a window of two: three; then three more: four.
        for _ in 0..2 {
            gate.answered();
        }
        assert_eq!(gate.concurrency(), (3, 8));
        assert_eq!(gate.semaphore.available_permits(), 3);
        for _ in 0..3 {
            gate.answered();
        }
        assert_eq!(gate.concurrency(), (4, 8));
        // Never below one, never above the cap.
        for _ in 0..10 {
            let epoch = gate.lock().epoch;
            gate.overloaded(epoch);
        }
        assert_eq!(gate.concurrency(), (1, 8));
        for _ in 0..1_000 {
            gate.answered();
        }
        assert_eq!(gate.concurrency(), (8, 8));
        assert_eq!(gate.semaphore.available_permits(), 8);
    }

    #[tokio::test]
    async fn a_fleet_of_four_lets_each_member_a_quarter_of_the_cap_and_more_when_one_leaves() {
        let gate = Gate::new(50);
        gate.share_among(4, None);
        assert_eq!(gate.concurrency(), (12, 50));
        assert_eq!(gate.semaphore.available_permits(), 12);
        gate.share_among(3, None);
        assert_eq!(gate.concurrency(), (16, 50));
        assert_eq!(gate.semaphore.available_permits(), 16);
        // The fleet backed off to 24: a third of that.
        gate.share_among(3, Some(24));
        assert_eq!(gate.concurrency(), (8, 50));
        assert_eq!(gate.semaphore.available_permits(), 8);
    }

    #[tokio::test]
    async fn a_member_granted_slots_lets_in_those_only_and_none_before_its_first_grant() {
        let gate = Gate::new(10);
        gate.grant(Some(0));
        assert_eq!(gate.concurrency(), (0, 10));
        assert!(gate.semaphore.clone().try_acquire_owned().is_err(), "no slot before a grant");
        gate.grant(Some(3));
        let mut held: Vec<Slot> = Vec::new();
        for _ in 0..3 {
            held.push(gate.acquire().await);
        }
        assert!(gate.semaphore.clone().try_acquire_owned().is_err(), "three granted, three held");
        // Fewer granted while three are held: they are forgotten as they come back.
        gate.grant(Some(1));
        for slot in &mut held {
            gate.release(slot);
        }
        assert_eq!(gate.semaphore.available_permits(), 1);
        // Out of the schedule's reach: the fraction again.
        gate.share_among(2, None);
        gate.grant(None);
        assert_eq!(gate.concurrency(), (5, 10));
    }
}
