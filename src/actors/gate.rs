//! The event gate that orders a run's events: `Start` first, even for a
//! child that settles (or reports progress) before `start` returns; events
//! that come early wait here until publication. Whether a run is observed
//! is decided once, at `Start`, so an observer sees either the whole
//! `Start … End` pair or none of it. `End` passes at most once.
//!
//! Events are handed to `emit` while the gate's lock is held, so the order
//! decided here is the order observers see.

use crate::sync::{Mutex, MutexGuard};

pub(crate) struct Gate<E> {
    state: Mutex<State<E>>,
}

enum State<E> {
    /// Before `Start`: early events wait (only when someone observes).
    Unpublished { early: Vec<E>, ended: bool },
    /// After `Start`, before `End`.
    Published { observed: bool },
    /// After `End`.
    Closed,
}

impl<E> Gate<E> {
    pub(crate) fn new() -> Self {
        Gate { state: Mutex::new(State::Unpublished { early: Vec::new(), ended: false }) }
    }

    fn lock(&self) -> MutexGuard<'_, State<E>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publication: `start` then the early events go out when `observed`.
    pub(crate) fn publish(&self, observed: bool, start: impl FnOnce() -> E, mut emit: impl FnMut(E)) {
        let mut state = self.lock();
        let State::Unpublished { early, ended } = std::mem::replace(&mut *state, State::Closed) else {
            return;
        };
        if observed {
            emit(start());
            early.into_iter().for_each(&mut emit);
        }
        if !ended {
            *state = State::Published { observed };
        }
    }

    /// A progress event: held until publication, dropped after `End`.
    pub(crate) fn progress(&self, observed_now: bool, event: impl FnOnce() -> E, emit: impl FnOnce(E)) {
        match &mut *self.lock() {
            State::Unpublished { early, .. } if observed_now => early.push(event()),
            State::Published { observed: true } => emit(event()),
            _ => {}
        }
    }

    /// `End`: held until publication if it comes first; passes once.
    pub(crate) fn end(&self, observed_now: bool, end: impl FnOnce() -> E, emit: impl FnOnce(E)) {
        let mut state = self.lock();
        match &mut *state {
            State::Unpublished { early, ended } => {
                if observed_now && !*ended {
                    early.push(end());
                }
                *ended = true;
            }
            State::Published { observed } => {
                if *observed {
                    emit(end());
                }
                *state = State::Closed;
            }
            State::Closed => {}
        }
    }
}

#[cfg(all(test, subagents_loom))]
mod loom_tests {
    use loom::sync::{Arc, Mutex};

    use super::Gate;

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Event {
        Start,
        Progress,
        End,
    }

    /// Publication, progress and the end racing: when observed, `Start`
    /// comes first, `End` exactly once and last.
    #[test]
    fn loom_start_precedes_end_and_end_passes_once() {
        loom::model(|| {
            let gate = Arc::new(Gate::new());
            let seen = Arc::new(Mutex::new(Vec::new()));
            let ender = {
                let (gate, seen) = (gate.clone(), seen.clone());
                loom::thread::spawn(move || {
                    gate.progress(true, || Event::Progress, |e| seen.lock().unwrap().push(e));
                    gate.end(true, || Event::End, |e| seen.lock().unwrap().push(e));
                })
            };
            gate.publish(true, || Event::Start, |e| seen.lock().unwrap().push(e));
            ender.join().unwrap();
            // A second end (a racing settle) never passes again.
            gate.end(true, || Event::End, |e| seen.lock().unwrap().push(e));
            let seen = seen.lock().unwrap().clone();
            assert_eq!(seen.first(), Some(&Event::Start), "{seen:?}");
            assert_eq!(seen.last(), Some(&Event::End), "{seen:?}");
            assert_eq!(seen.iter().filter(|e| **e == Event::End).count(), 1, "{seen:?}");
        });
    }
}
