//! Panic containment: the one place where a panic in code the runtime does
//! not own (a provider's futures, an event listener, a child's cancel hook)
//! is caught and turned into a [`Panicked`], so it settles a run `Error` or
//! is logged instead of silently killing an actor (actix does not restart
//! an actor whose handler panicked). Used by runs, provider actors and the
//! event bus.
//!
//! A contained panic is reported where it belongs — the run's result (its
//! message as the diagnostic's detail) and an error in the log — so the
//! default panic hook's text on stderr would only say it twice, with a
//! backtrace when one is captured. [`quiet_contained_panics`] (called when
//! a runtime is built) chains a hook that is silent for a panic raised
//! inside containment unless `RUST_BACKTRACE` is set; every other panic
//! goes to the hook that was there before.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Once;
use std::task::{Context, Poll};

use futures_util::future::CatchUnwind;
use futures_util::FutureExt;

/// A caught panic; it displays as the panic's message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub(crate) struct Panicked {
    message: String,
}

impl Panicked {
    fn of(payload: &(dyn std::any::Any + Send)) -> Self {
        Panicked { message: panic_message(payload).to_owned() }
    }
}

/// A provider future whose panic becomes `Err(Panicked)`: no allocation
/// of its own (the provider's future is boxed already), `Unpin`, so a run
/// can poll it once in place before deciding to keep it, and a few words
/// long whatever `T` is (a run's result is hundreds of bytes, and the run
/// actor moves this future as it decides where it lives).
pub(crate) struct Contained<F>(Result<CatchUnwind<AssertUnwindSafe<Inside<F>>>, Option<Panicked>>);

impl<F: std::future::Future + Unpin> std::future::Future for Contained<F> {
    type Output = Result<F::Output, Panicked>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().0 {
            Ok(future) => Pin::new(future).poll(cx).map(|outcome| outcome.map_err(|panic| Panicked::of(&*panic))),
            Err(panicked) => Poll::Ready(Err(panicked.take().expect("a contained future is polled after it is done"))),
        }
    }
}

/// Runs `make` and the future it returns, turning a panic in either into
/// `Err(Panicked)`.
pub(crate) fn contained<F: std::future::Future + Unpin>(make: impl FnOnce() -> F) -> Contained<F> {
    match catch_unwind(AssertUnwindSafe(|| inside(make))) {
        Ok(future) => Contained(Ok(AssertUnwindSafe(Inside(future)).catch_unwind())),
        Err(panic) => Contained(Err(Some(Panicked::of(&*panic)))),
    }
}

/// Runs `call`, turning a panic into `Err(Panicked)`.
pub(crate) fn contained_call<T>(call: impl FnOnce() -> T) -> Result<T, Panicked> {
    catch_unwind(AssertUnwindSafe(|| inside(call))).map_err(|panic| Panicked::of(&*panic))
}

thread_local! {
    /// How deep this thread is inside contained code now.
    static CONTAINING: Cell<u32> = const { Cell::new(0) };
}

/// Runs `call` marked as inside containment (the mark is taken off as a
/// panic unwinds through, after the hook has seen it).
fn inside<T>(call: impl FnOnce() -> T) -> T {
    struct Mark;
    impl Drop for Mark {
        fn drop(&mut self) {
            CONTAINING.with(|depth| depth.set(depth.get().saturating_sub(1)));
        }
    }
    CONTAINING.with(|depth| depth.set(depth.get() + 1));
    let _mark = Mark;
    call()
}

/// A future each of whose polls is [`inside`] containment.
pub(crate) struct Inside<F>(F);

impl<F: std::future::Future + Unpin> std::future::Future for Inside<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        inside(|| Pin::new(&mut self.0).poll(cx))
    }
}

/// Chains, once per process, a panic hook that is silent for a panic
/// raised inside containment unless `RUST_BACKTRACE` is set (its message
/// and place go to the log at debug; the runtime reports it as the run's
/// failure); any other panic goes to the hook that was there before.
pub(crate) fn quiet_contained_panics() {
    static CHAINED: Once = Once::new();
    CHAINED.call_once(|| {
        let before = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let contained = CONTAINING.with(Cell::get) > 0;
            if contained && std::env::var_os("RUST_BACKTRACE").is_none_or(|value| value == "0") {
                let message = panic_message(info.payload());
                tracing::debug!(location = ?info.location(), message, "a panic was contained");
                return;
            }
            before(info);
        }));
    });
}

/// The text of a panic payload, when it is a string.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-string panic payload")
}
