//! Panic containment: the one place where a panic in code the runtime does
//! not own (a provider's futures, an event listener, a child's cancel hook)
//! is caught and turned into a [`Panicked`], so it settles a run `Error` or
//! is logged instead of silently killing an actor (actix does not restart
//! an actor whose handler panicked). Used by runs, provider actors and the
//! event bus.

use std::panic::{catch_unwind, AssertUnwindSafe};

use futures_util::future::LocalBoxFuture;
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

/// Runs `make` and the future it returns, turning a panic in either into
/// `Err(Panicked)`.
pub(crate) fn contained<T: 'static>(
    make: impl FnOnce() -> LocalBoxFuture<'static, T>,
) -> LocalBoxFuture<'static, Result<T, Panicked>> {
    match catch_unwind(AssertUnwindSafe(make)) {
        Ok(future) => Box::pin(
            AssertUnwindSafe(future).catch_unwind().map(|outcome| outcome.map_err(|panic| Panicked::of(&*panic))),
        ),
        Err(panic) => {
            let panicked = Panicked::of(&*panic);
            Box::pin(async move { Err(panicked) })
        }
    }
}

/// Runs `call`, turning a panic into `Err(Panicked)`.
pub(crate) fn contained_call<T>(call: impl FnOnce() -> T) -> Result<T, Panicked> {
    catch_unwind(AssertUnwindSafe(call)).map_err(|panic| Panicked::of(&*panic))
}

/// The text of a panic payload, when it is a string.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-string panic payload")
}
