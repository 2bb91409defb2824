//! [`Slot`]: where a run actor keeps a provider future it must be able to
//! drop on the spot.
//!
//! actix drops a spawned future only after the actor itself
//! (`ctx.cancel_future` and `ctx.stop()` merely mark it), and a run must not
//! announce quiescence while a child's future, and what it holds, still
//! exists. So the actor spawns a [`Held`] that polls the future out of a
//! slot the actor owns, and clears the slot when the future must go.
//!
//! A future is polled once in place first: one that is done at once (a
//! mock's launch, most dispose hooks) needs neither the slot's allocation
//! nor a spawned future.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use futures_util::future::LocalBoxFuture;
use futures_util::FutureExt;
use tracing::Span;

use super::core::poll_in_runtime;

/// The actor's side: one provider future at a time (the shared cell is
/// made by the first future that has to wait).
pub(crate) struct Slot<T>(Option<Rc<RefCell<Option<LocalBoxFuture<'static, T>>>>>);

impl<T> Slot<T> {
    pub(crate) fn empty() -> Self {
        Slot(None)
    }

    /// Poll `future` once, as [`Held`] would: `Ok` with its output when it
    /// is done at once; else it goes in the slot and the returned future
    /// polls it from there.
    /// Only a future that waits is boxed.
    pub(crate) fn hold<F>(&mut self, runtime: u64, span: &Span, mut future: F) -> Result<T, Held<T>>
    where
        F: Future<Output = T> + Unpin + 'static,
    {
        let done = {
            let _entered = span.enter();
            poll_in_runtime(runtime, || (&mut future).now_or_never())
        };
        if let Some(output) = done {
            return Ok(output);
        }
        let slot = self.0.get_or_insert_with(|| Rc::new(RefCell::new(None)));
        *slot.borrow_mut() = Some(Box::pin(future));
        Err(Held { slot: slot.clone(), runtime, span: span.clone() })
    }

    /// Drop the held future now.
    pub(crate) fn clear(&self) {
        if let Some(slot) = &self.0 {
            let taken = slot.borrow_mut().take();
            drop(taken);
        }
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
