//! The event bus: one bounded broadcast channel, streams and contained
//! callback listeners.

use std::fmt;

use actix::ArbiterHandle;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use super::SubagentEvent;
use crate::contain::contained_call;

#[derive(Clone, Debug)]
pub(crate) struct EventBus {
    sender: broadcast::Sender<SubagentEvent>,
}

impl EventBus {
    pub(crate) fn new(capacity: usize) -> Self {
        let (sender, _) = broadcast::channel(capacity.max(1));
        EventBus { sender }
    }

    /// Whether anyone listens; lets emitters skip building events.
    pub(crate) fn is_observed(&self) -> bool {
        self.sender.receiver_count() > 0
    }

    pub(crate) fn emit(&self, event: SubagentEvent) {
        // No receiver is not an error: events are observe-only.
        let _ = self.sender.send(event);
    }

    pub(crate) fn subscribe(&self) -> EventStream {
        EventStream { receiver: self.sender.subscribe(), parent: None }
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
                match event {
                    Ok(event) => call_contained(id, &listener, &event),
                    Err(EventRecvError::Lagged(missed)) => {
                        tracing::warn!(listener = id, missed, "slow event listener skipped events")
                    }
                    Err(EventRecvError::Closed) => break,
                }
            }
        });
        ListenerHandle { stop }
    }
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
    /// The outcome as a `Result` with a printable error.
    fn into_result(self) -> Result<(), String>;
}

impl ListenerOutcome for () {
    fn into_result(self) -> Result<(), String> {
        Ok(())
    }
}

impl<E: fmt::Display> ListenerOutcome for Result<(), E> {
    fn into_result(self) -> Result<(), String> {
        self.map_err(|e| e.to_string())
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
#[derive(Debug)]
pub struct EventStream {
    receiver: broadcast::Receiver<SubagentEvent>,
    parent: Option<String>,
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
        loop {
            let event = self.receiver.recv().await.map_err(|e| match e {
                broadcast::error::RecvError::Lagged(n) => EventRecvError::Lagged(n),
                broadcast::error::RecvError::Closed => EventRecvError::Closed,
            })?;
            if self.passes(&event) {
                return Ok(event);
            }
        }
    }

    /// The next event already queued, without waiting.
    pub fn try_recv(&mut self) -> Option<Result<SubagentEvent, EventRecvError>> {
        loop {
            let event = match self.receiver.try_recv() {
                Ok(event) => event,
                Err(broadcast::error::TryRecvError::Empty) => return None,
                Err(broadcast::error::TryRecvError::Lagged(n)) => return Some(Err(EventRecvError::Lagged(n))),
                Err(broadcast::error::TryRecvError::Closed) => return Some(Err(EventRecvError::Closed)),
            };
            if self.passes(&event) {
                return Some(Ok(event));
            }
        }
    }

    fn passes(&self, event: &SubagentEvent) -> bool {
        match &self.parent {
            Some(parent) if event.is_run_event() => event.parent_session() == Some(parent.as_str()),
            _ => true,
        }
    }
}
