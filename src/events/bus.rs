//! The event bus: one bounded broadcast channel, streams and contained
//! callback listeners.
//!
//! A subscriber's [`EventStream`] is `tokio-stream`'s `BroadcastStream`
//! with the per-parent filter on top; a listener is a task on the events
//! thread that reads one such stream.

use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{ready, Context, Poll};

use actix::ArbiterHandle;
use futures_util::{FutureExt, Stream, StreamExt};
use tokio::sync::broadcast;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_stream::wrappers::BroadcastStream;
use tokio_util::sync::CancellationToken;

use super::SubagentEvent;
use crate::contain::contained_call;

/// The bus; every run holds a clone, so a clone is one reference count.
#[derive(Clone, Debug)]
pub(crate) struct EventBus(Arc<Bus>);

#[derive(Debug)]
struct Bus {
    sender: broadcast::Sender<SubagentEvent>,
    keeper: Arc<Keeper>,
}

/// A receiver of the bus that reads only once the last subscriber is gone,
/// so that no event is dropped by the last subscriber to read it: each
/// stays in its slot until a later send takes the slot and drops it there.
/// An event's blocks are made on the thread that emits it; dropped on a
/// listener's thread, every free contended for the emitting thread's
/// allocator arena (a mock run's lifecycle took half again as long with
/// one listener), while a send drops on an emitting thread, most often the
/// one that made them. The price: while anyone subscribes, the bus holds
/// as many events as its capacity, as it would for a subscriber that lags
/// that far; when the last one goes, the keeper reads them all, dropping
/// them.
#[derive(Debug)]
struct Keeper {
    receiver: Mutex<broadcast::Receiver<SubagentEvent>>,
    subscribers: AtomicUsize,
}

impl Keeper {
    /// Drops every event the keeper holds.
    fn release(&self) {
        let mut receiver = self.receiver.lock().unwrap_or_else(PoisonError::into_inner);
        // A lagged read goes on from the oldest event still held.
        while let Ok(_) | Err(broadcast::error::TryRecvError::Lagged(_)) = receiver.try_recv() {}
    }
}

/// One subscriber of the bus, counted for its keeper.
#[derive(Debug)]
struct Subscription(Arc<Keeper>);

impl Drop for Subscription {
    fn drop(&mut self) {
        if self.0.subscribers.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.release();
        }
    }
}

impl EventBus {
    pub(crate) fn new(capacity: usize) -> Self {
        let (sender, receiver) = broadcast::channel(capacity.max(1));
        let keeper = Keeper { receiver: Mutex::new(receiver), subscribers: AtomicUsize::new(0) };
        EventBus(Arc::new(Bus { sender, keeper: Arc::new(keeper) }))
    }

    /// Whether anyone listens (the keeper does not count); lets emitters
    /// skip building events.
    pub(crate) fn is_observed(&self) -> bool {
        self.0.sender.receiver_count() > 1
    }

    pub(crate) fn emit(&self, event: SubagentEvent) {
        // No receiver is not an error: events are observe-only.
        let _ = self.0.sender.send(event);
    }

    pub(crate) fn subscribe(&self) -> EventStream {
        self.0.keeper.subscribers.fetch_add(1, Ordering::AcqRel);
        let subscription = Subscription(self.0.keeper.clone());
        EventStream {
            events: BroadcastStream::new(self.0.sender.subscribe()),
            parent: None,
            _subscription: subscription,
        }
    }

    /// Run `listener` for every event on the events thread until the handle
    /// is dropped.
    pub(crate) fn add_listener<F, R>(&self, thread: &ArbiterHandle, listener: F) -> ListenerHandle
    where
        F: Fn(&SubagentEvent) -> R + Send + 'static,
        R: ListenerOutcome,
    {
        let stop = CancellationToken::new();
        let mut stream = self.subscribe();
        let stopped = stop.clone();
        let id = next_listener_id();
        thread.spawn(async move {
            loop {
                let event = tokio::select! {
                    biased;
                    _ = stopped.cancelled() => break,
                    event = stream.recv() => event,
                };
                if !deliver(id, &listener, event) {
                    break;
                }
                // Whatever else is queued, then a short pause: on a busy
                // runtime, events gather while the listener rests and the
                // emitters wake this thread once per pause, not once per
                // event (a cross-thread wake costs more than a lifecycle).
                while let Some(event) = stream.try_recv() {
                    if !deliver(id, &listener, event) {
                        return;
                    }
                }
                tokio::select! {
                    biased;
                    _ = stopped.cancelled() => break,
                    _ = tokio::time::sleep(LISTENER_PAUSE) => {}
                }
            }
        });
        ListenerHandle { stop }
    }
}

/// How long a listener rests after a wake before it reads on: the longest
/// a listener hears of an event late, and the shortest time between two
/// wakes of the events thread by emitters. Far below the time the default
/// capacity of 4,096 events takes to fill.
const LISTENER_PAUSE: std::time::Duration = std::time::Duration::from_millis(1);

/// Hands `event` to the listener; false once the stream is closed.
fn deliver<F, R>(id: u64, listener: &F, event: Result<SubagentEvent, EventRecvError>) -> bool
where
    F: Fn(&SubagentEvent) -> R,
    R: ListenerOutcome,
{
    match event {
        Ok(event) => call_contained(id, listener, &event),
        Err(EventRecvError::Lagged(missed)) => {
            tracing::warn!(listener = id, missed, "slow event listener skipped events")
        }
        Err(EventRecvError::Closed) => return false,
    }
    true
}

fn next_listener_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

fn call_contained<F, R>(id: u64, listener: &F, event: &SubagentEvent)
where
    F: Fn(&SubagentEvent) -> R,
    R: ListenerOutcome,
{
    match contained_call(|| listener(event).into_result()) {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::error!(listener = id, %error, "event listener failed"),
        Err(panic) => tracing::error!(listener = id, %panic, "event listener panicked"),
    }
}

/// What a listener may return: nothing, or a `Result` whose error is logged.
pub trait ListenerOutcome {
    /// The outcome as a `Result` whose error is logged.
    fn into_result(self) -> Result<(), ListenerError>;
}

impl ListenerOutcome for () {
    fn into_result(self) -> Result<(), ListenerError> {
        Ok(())
    }
}

impl<E: fmt::Display> ListenerOutcome for Result<(), E> {
    fn into_result(self) -> Result<(), ListenerError> {
        self.map_err(|error| ListenerError::new(error))
    }
}

/// A listener's error, as the runtime logs it: what its own error displayed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ListenerError {
    message: String,
}

impl ListenerError {
    /// The error `error` displays as.
    pub fn new(error: impl fmt::Display) -> Self {
        ListenerError { message: error.to_string() }
    }
}

/// Keeps a callback listener registered; dropping it removes the listener.
#[derive(Debug)]
#[must_use = "dropping the handle removes the listener"]
pub struct ListenerHandle {
    stop: CancellationToken,
}

impl ListenerHandle {
    /// Keep the listener for the runtime's whole life.
    pub fn keep(self) {
        std::mem::forget(self)
    }
}

impl Drop for ListenerHandle {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Why [`EventStream::recv`] returned no event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EventRecvError {
    /// The stream fell behind; this many events were dropped for it.
    #[error("the event stream lagged and missed {0} events")]
    Lagged(u64),
    /// The runtime is gone.
    #[error("the event stream is closed")]
    Closed,
}

/// A subscription to every event, optionally narrowed to one parent's runs.
///
/// It is a [`Stream`] of `Result<SubagentEvent, EventRecvError>`: a
/// subscriber that fell behind gets one `Err(Lagged(missed))` item and reads
/// on from the oldest event still held; the stream ends when the runtime is
/// gone. [`recv`](Self::recv) and [`try_recv`](Self::try_recv) read the same
/// stream and report the end as `Err(Closed)`.
///
/// ```
/// use futures_util::StreamExt;
/// use subagents::providers::MockProvider;
/// use subagents::{Runtime, SubagentEvent};
///
/// let runtime = Runtime::builder().workers(1).build().unwrap();
/// let subagents = runtime.subagents();
/// let mut events = subagents.subscribe();
/// subagents.register_provider(MockProvider::new("mock")).unwrap().keep();
/// let first = runtime.block_on(async move { events.next().await });
/// assert!(matches!(first, Some(Ok(SubagentEvent::ProviderAdded { name })) if name == "mock"));
/// runtime.shutdown_blocking();
/// ```
#[derive(Debug)]
pub struct EventStream {
    events: BroadcastStream<SubagentEvent>,
    parent: Option<String>,
    _subscription: Subscription,
}

impl EventStream {
    /// Only run events whose delegating parent is `session_id`; provider
    /// events still pass.
    pub fn for_parent(mut self, session_id: impl Into<String>) -> Self {
        self.parent = Some(session_id.into());
        self
    }

    /// The next event that passes the filter.
    pub async fn recv(&mut self) -> Result<SubagentEvent, EventRecvError> {
        self.next().await.unwrap_or(Err(EventRecvError::Closed))
    }

    /// The next event already queued, without waiting.
    pub fn try_recv(&mut self) -> Option<Result<SubagentEvent, EventRecvError>> {
        // One poll that cannot wait, outside tokio's cooperative budget
        // (which would otherwise turn a queued event into "pending" after
        // a burst): pending means nothing is queued.
        match tokio::task::unconstrained(self.next()).now_or_never()? {
            Some(event) => Some(event),
            None => Some(Err(EventRecvError::Closed)),
        }
    }

    fn passes(&self, event: &SubagentEvent) -> bool {
        match &self.parent {
            Some(parent) if event.is_run_event() => event.parent_session() == Some(parent.as_str()),
            _ => true,
        }
    }
}

impl Stream for EventStream {
    type Item = Result<SubagentEvent, EventRecvError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            let event = match ready!(self.events.poll_next_unpin(cx)) {
                Some(Ok(event)) => event,
                Some(Err(BroadcastStreamRecvError::Lagged(missed))) => {
                    return Poll::Ready(Some(Err(EventRecvError::Lagged(missed))))
                }
                None => return Poll::Ready(None),
            };
            if self.passes(&event) {
                return Poll::Ready(Some(Ok(event)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Weak;

    use super::*;
    use crate::events::RunInfo;

    fn start(run_id: u64) -> (SubagentEvent, Weak<RunInfo>) {
        let info = Arc::new(RunInfo {
            run_id,
            child_id: format!("child-{run_id}"),
            provider: "mock".into(),
            parent_session: None,
            local: false,
            label: None,
        });
        let weak = Arc::downgrade(&info);
        (SubagentEvent::Start(info), weak)
    }

    #[test]
    fn the_keeper_is_no_subscriber() {
        let bus = EventBus::new(4);
        assert!(!bus.is_observed());
        let stream = bus.subscribe();
        assert!(bus.is_observed());
        drop(stream);
        assert!(!bus.is_observed());
    }

    #[test]
    fn a_heard_event_is_held_no_longer_than_the_capacity_of_sends() {
        let bus = EventBus::new(2);
        let mut stream = bus.subscribe();
        let (first, held) = start(1);
        bus.emit(first);
        assert!(matches!(stream.try_recv(), Some(Ok(SubagentEvent::Start(info))) if info.run_id == 1));
        // Heard and dropped by the subscriber, still in its slot.
        assert!(held.upgrade().is_some());
        for run_id in 2..=3 {
            bus.emit(start(run_id).0);
        }
        assert!(held.upgrade().is_none(), "a later send took the slot and dropped the event");
    }

    #[test]
    fn the_last_subscriber_gone_no_event_is_held() {
        let bus = EventBus::new(8);
        let (listening, other) = (bus.subscribe(), bus.subscribe());
        let weak: Vec<_> = (1..=3)
            .map(|run_id| {
                let (event, weak) = start(run_id);
                bus.emit(event);
                weak
            })
            .collect();
        drop(listening);
        assert!(weak.iter().all(|w| w.upgrade().is_some()), "one subscriber is left to read them");
        drop(other);
        assert!(weak.iter().all(|w| w.upgrade().is_none()), "nothing holds an event nobody can read");
    }
}
