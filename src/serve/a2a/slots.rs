//! The server's connection slots: at most `max_connections` connections at
//! once, and a client that never finishes its requests cannot keep one that
//! does from being served.
//!
//! A connection is *answering* from the moment its request is whole (its
//! body read) until its response is sent (a stream: until it ends); the
//! rest of the time it waits on its client, for headers (bounded by the
//! header timeout) or for a body (bounded by the body timeout). When every
//! slot is taken, a new connection closes the oldest one that is not
//! answering and takes its slot; only when all are answering is the new
//! one closed. So a flood of connections that send headers and stall ends
//! up evicting itself, while a client that sends its request whole gets a
//! slot at once.
//!
//! ```text
//! max 3:  [stalled #1] [stalled #2] [answering #3]   ← #4 arrives
//!         #1 is closed; #4 takes its slot
//! ```

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

/// The open connections, oldest first.
pub(super) struct Slots {
    open: Arc<Mutex<Open>>,
    max: usize,
}

#[derive(Default)]
struct Open {
    /// By order of arrival.
    by_arrival: BTreeMap<u64, Arc<Standing>>,
    arrivals: u64,
}

/// Where one connection stands: how many of its requests are being
/// answered (HTTP/1: at most one), and whether it was closed to make room.
#[derive(Default)]
pub(super) struct Standing {
    answering: AtomicUsize,
    evicted: CancellationToken,
}

/// A connection's slot, freed when dropped (the connection ended, however).
pub(super) struct Slot {
    arrival: u64,
    standing: Arc<Standing>,
    open: Arc<Mutex<Open>>,
}

/// Marks its connection as answering a whole request while held.
pub(super) struct Answering(Arc<Standing>);

impl Slots {
    pub(super) fn new(max: usize) -> Slots {
        Slots { open: Arc::default(), max }
    }

    /// A slot for a new connection: a free one, or the oldest that is not
    /// answering, whose connection is told to close. `None` when every
    /// connection is answering.
    pub(super) fn admit(&self) -> Option<Slot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.by_arrival.len() >= self.max {
            let idle = open.by_arrival.iter().find(|(_, standing)| standing.answering.load(Ordering::Acquire) == 0);
            let (&arrival, standing) = idle?;
            standing.evicted.cancel();
            open.by_arrival.remove(&arrival);
        }
        open.arrivals += 1;
        let (arrival, standing) = (open.arrivals, Arc::new(Standing::default()));
        open.by_arrival.insert(arrival, standing.clone());
        Some(Slot { arrival, standing, open: self.open.clone() })
    }
}

impl Slot {
    /// Its standing, for the connection's requests to mark.
    pub(super) fn standing(&self) -> Arc<Standing> {
        self.standing.clone()
    }

    /// Resolves once another connection took this slot.
    pub(super) async fn evicted(&self) {
        self.standing.evicted.cancelled().await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.by_arrival.remove(&self.arrival);
    }
}

impl Answering {
    /// The connection of `standing` is answering until this is dropped.
    pub(super) fn begin(standing: Arc<Standing>) -> Answering {
        standing.answering.fetch_add(1, Ordering::AcqRel);
        Answering(standing)
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.answering.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_table_evicts_the_oldest_connection_that_is_not_answering() {
        let slots = Slots::new(3);
        let first = slots.admit().unwrap();
        let second = slots.admit().unwrap();
        let third = slots.admit().unwrap();
        let _answering = Answering::begin(first.standing());
        let fourth = slots.admit().expect("a stalled connection makes room");
        assert!(!first.standing.evicted.is_cancelled(), "an answering connection keeps its slot");
        assert!(second.standing.evicted.is_cancelled(), "the oldest waiting one is closed");
        assert!(!third.standing.evicted.is_cancelled());
        let _answering = (Answering::begin(third.standing()), Answering::begin(fourth.standing()));
        assert!(slots.admit().is_none(), "every slot is answering: the new connection is refused");
        drop(fourth);
        assert!(slots.admit().is_some(), "an ended connection frees its slot");
    }
}
