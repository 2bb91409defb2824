//! Panic containment: the one place where a panic in code the runtime does
//! not own (a provider's futures, an event listener, a child's cancel hook)
//! is caught and turned into a [`Panicked`], so it settles a run `Error` or
//! is logged instead of silently killing an actor (actix does not restart
//! an actor whose handler panicked). Used by runs, provider actors and the
//! event bus.

use std::panic::{catch_unwind, AssertUnwindSafe};

use futures_util::future::{CatchUnwind, Either, LocalBoxFuture, Map, Ready};
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
/// of its own (the provider's future is boxed already), and `Unpin`, so a
/// run can poll it once in place before deciding to keep it.
pub(crate) type Contained<T> = Either<
    Map<CatchUnwind<AssertUnwindSafe<LocalBoxFuture<'static, T>>>, fn(std::thread::Result<T>) -> Result<T, Panicked>>,
    Ready<Result<T, Panicked>>,
>;

/// Runs `make` and the future it returns, turning a panic in either into
/// `Err(Panicked)`.
pub(crate) fn contained<T: 'static>(make: impl FnOnce() -> LocalBoxFuture<'static, T>) -> Contained<T> {
    match catch_unwind(AssertUnwindSafe(make)) {
        Ok(future) => {
            let caught: fn(std::thread::Result<T>) -> Result<T, Panicked> =
                |outcome| outcome.map_err(|panic| Panicked::of(&*panic));
            Either::Left(AssertUnwindSafe(future).catch_unwind().map(caught))
        }
        Err(panic) => Either::Right(futures_util::future::ready(Err(Panicked::of(&*panic)))),
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
