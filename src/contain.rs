//! Panic containment: the one place where a panic in code the runtime does
//! not own (a provider's futures, an event listener, a child's cancel hook)
//! is caught and turned into a message, so it settles a run `Error` or is
//! logged instead of silently killing an actor (actix does not restart an
//! actor whose handler panicked). Used by runs, provider actors and the
//! event bus.

use std::panic::{catch_unwind, AssertUnwindSafe};

use futures_util::future::LocalBoxFuture;
use futures_util::FutureExt;

/// Runs `make` and the future it returns, turning a panic in either into
/// `Err(message)`.
pub(crate) fn contained<T: 'static>(
    make: impl FnOnce() -> LocalBoxFuture<'static, T>,
) -> LocalBoxFuture<'static, Result<T, String>> {
    match catch_unwind(AssertUnwindSafe(make)) {
        Ok(future) => Box::pin(
            AssertUnwindSafe(future)
                .catch_unwind()
                .map(|outcome| outcome.map_err(|panic| panic_message(&*panic).to_owned())),
        ),
        Err(panic) => {
            let message = panic_message(&*panic).to_owned();
            Box::pin(async move { Err(message) })
        }
    }
}

/// Runs `call`, turning a panic into `Err(message)`.
pub(crate) fn contained_call<T>(call: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(call)).map_err(|panic| panic_message(&*panic).to_owned())
}

/// The text of a panic payload, when it is a string.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("non-string panic payload")
}
