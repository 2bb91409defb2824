//! A route's limits held by another process: the limiter of a `process`
//! child draws on its parent's limiter for the route, over the wire the
//! child already has, so every child of one parent together stays under
//! the route's `rpm`, `tpm` and `max_concurrent`, and a 429 one child meets
//! cools the route for its parent and every sibling.
//!
//! [`Limiter::draw_from`](super::Limiter::draw_from) gives a limiter an
//! [`UpstreamLimiter`]. Each admission then passes the process's own
//! limits first (the child's own copy of the route, if it has limits),
//! then asks upstream, and holds both until the call is over; the
//! [`UpstreamGrant`] it is given reports what the limiter hears of the call
//! (answered, refused, settled) and gives the admission back when dropped.
//! A cool-down the process sets is sent upstream as well.
//!
//! **Upstream gone.** When upstream cannot admit (its wire closed, it
//! refused the ask), the call goes on its own process's limits alone: the
//! limiter says so once in a warning and keeps to its own copy from then
//! on while upstream is gone (a parent that dies leaves its child no one to
//! ask, never a call waiting forever).

use std::time::Duration;

use futures_util::future::BoxFuture;

/// Where a route's calls are admitted besides this process: a process
/// child's parent (`crate::serve::stdio`'s side of the process wire).
pub(crate) trait UpstreamLimiter: Send + Sync + std::fmt::Debug + 'static {
    /// Waits until upstream admits a call charged `estimated_tokens`;
    /// dropping the future withdraws the wait (it holds nothing then).
    fn admit(&self, estimated_tokens: u64) -> BoxFuture<'static, Result<Box<dyn UpstreamGrant>, Unreachable>>;

    /// No call on the route starts upstream for `duration` (an endpoint
    /// said when to come back).
    fn cool_down(&self, duration: Duration);
}

/// A call upstream admitted, until settled or dropped (dropped unsettled:
/// it keeps its estimate charged, as a [`Permit`](super::Permit) does).
pub(crate) trait UpstreamGrant: Send + Sync + std::fmt::Debug {
    /// The endpoint answered the call.
    fn answered(&self);

    /// The endpoint refused the call as over its limit; `explained`: it
    /// said when to come back.
    fn refused(&self, explained: bool);

    /// The call used `used_tokens`.
    fn settle(self: Box<Self>, used_tokens: u64);
}

/// Upstream cannot admit a call: why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the route's limiter upstream cannot be asked: {0}")]
#[cfg_attr(not(feature = "process"), allow(dead_code))]
pub(crate) struct Unreachable(pub String);

/// A limiter's upstream, and whether it was found unreachable.
pub(super) struct Upstream {
    pub(super) limiter: std::sync::Arc<dyn UpstreamLimiter>,
    /// Said once: why upstream was out of reach.
    pub(super) warned: std::sync::Once,
}

impl Upstream {
    pub(super) fn new(limiter: std::sync::Arc<dyn UpstreamLimiter>) -> Upstream {
        Upstream { limiter, warned: std::sync::Once::new() }
    }

    /// Upstream's admission of a call, or `None` (said once) when it
    /// cannot admit: the call goes on its own process's limits.
    pub(super) async fn admit(&self, estimated_tokens: u64) -> Option<Box<dyn UpstreamGrant>> {
        match self.limiter.admit(estimated_tokens).await {
            Ok(grant) => Some(grant),
            Err(why) => {
                self.warned.call_once(|| {
                    tracing::warn!(
                        reason = %why.0,
                        "the route's limiter upstream cannot be asked: this process keeps to its own limits for it"
                    );
                });
                None
            }
        }
    }
}
