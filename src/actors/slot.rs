//! [`Slot`]: where a run actor keeps a provider future it must be able to
//! drop on the spot.
//!
//! actix drops a spawned future only after the actor itself
//! (`ctx.cancel_future` and `ctx.stop()` merely mark it), and a run must not
//! announce quiescence while a child's future, and what it holds, still
//! exists. So the actor spawns a [`Held`] that polls the future out of a
//! slot the actor owns, and clears the slot when the future must go.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use futures_util::future::LocalBoxFuture;
use tracing::Span;

use super::core::poll_in_runtime;

/// The actor's side: one provider future at a time.
pub(crate) struct Slot<T>(Rc<RefCell<Option<LocalBoxFuture<'static, T>>>>);

impl<T> Slot<T> {
    pub(crate) fn empty() -> Self {
        Slot(Rc::new(RefCell::new(None)))
    }

    /// Put `future` in the slot; the returned future polls it from there,
    /// inside the run's span.
    pub(crate) fn hold(&self, runtime: u64, span: &Span, future: LocalBoxFuture<'static, T>) -> Held<T> {
        *self.0.borrow_mut() = Some(future);
        Held { slot: self.0.clone(), runtime, span: span.clone() }
    }

    /// Drop the held future now.
    pub(crate) fn clear(&self) {
        let taken = self.0.borrow_mut().take();
        drop(taken);
    }
}

/// Resolves with the held future's output, or `None` once it was cleared.
/// A child's futures are polled as tasks of the runtime `runtime` (a child
/// that delegates starts its runs in place) and inside the run's `span`, so
/// whatever the provider logs (a model call, a tool call, a bad protocol
/// line) says which run it belongs to.
pub(crate) struct Held<T> {
    slot: Rc<RefCell<Option<LocalBoxFuture<'static, T>>>>,
    runtime: u64,
    span: Span,
}

impl<T> Future for Held<T> {
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let _entered = self.span.enter();
        let mut slot = self.slot.borrow_mut();
        let Some(future) = slot.as_mut() else {
            return Poll::Ready(None);
        };
        let outcome = std::task::ready!(poll_in_runtime(self.runtime, || future.as_mut().poll(cx)));
        *slot = None;
        Poll::Ready(Some(outcome))
    }
}
