//! What the runtime, a caller and a child hold of a live run: its
//! cancellation token, its shared state, and its actor's mailbox behind the
//! [`Mailbox`] trait (never the actor's concrete type, so nothing here sits
//! above the run actor).
//!
//! One allocation per run serves the run table, the caller's `Run` and
//! `Steering`, and the child's [`ProviderContext`](crate::seam::ProviderContext):
//! a `RunControl` made with the actor's address is used as
//! `Arc<RunControl>` (the address type erased in place, no boxed
//! recipient per message type).

use std::future::Future;
use std::sync::Arc;

use actix::Message;
use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use super::run_shared::RunShared;
use crate::events::ProgressUpdate;
use crate::seam::{CaptureError, ContentBlock, RunReporter, SteeringError};

/// Control messages: `do_send`, so they never wait for mailbox room.
#[derive(Message, Clone, Copy, Debug, PartialEq, Eq)]
#[rtype(result = "()")]
pub(crate) enum Control {
    /// Cancel remaining work and release the child; the actor stops when done.
    Dispose,
    /// Escalation at shutdown: stop without waiting for the child.
    ForceStop,
}

/// Steer the running child (a data message: sent with `send`, so the
/// mailbox stays bounded).
#[derive(Message)]
#[rtype(result = "Result<(), SteeringError>")]
pub(crate) struct SendMessage(pub Vec<ContentBlock>);

/// A child hands its validated structured result to its run (docs/contract.md §8). The
/// first capture of a running child is kept; anything else is refused.
#[derive(Message)]
#[rtype(result = "Result<(), CaptureError>")]
pub(crate) struct CaptureStructured(pub serde_json::Value);

/// The run actor's mailbox, for the three messages it answers. A closed
/// mailbox drops a control message and fails the others.
pub(crate) trait Mailbox: Send + Sync + 'static {
    fn control(&self, control: Control);
    fn steer(&self, message: SendMessage) -> BoxFuture<'static, Result<(), SteeringError>>;
    fn capture(&self, value: CaptureStructured) -> BoxFuture<'static, Result<(), CaptureError>>;
}

/// Enough of a live run to dispose it, force it down, steer it and await
/// its quiescence. Made sized (`M` the actor's address), used erased.
pub(crate) struct RunControl<M: ?Sized + Mailbox = dyn Mailbox> {
    pub token: CancellationToken,
    /// The child's delegation depth: shutdown disposes deepest first.
    pub depth: u32,
    pub shared: Arc<RunShared>,
    pub mailbox: M,
}

impl<M: ?Sized + Mailbox> RunControl<M> {
    /// Cancel remaining work and ask the actor to release the child.
    pub(crate) fn dispose(&self) {
        self.token.cancel();
        self.mailbox.control(Control::Dispose);
    }

    /// Escalation: stop the actor without waiting for its child.
    pub(crate) fn force_stop(&self) {
        self.mailbox.control(Control::ForceStop);
    }

    /// Resolves once the run is quiescent.
    pub(crate) fn quiescence(&self) -> impl Future<Output = ()> + 'static {
        let shared = self.shared.clone();
        async move {
            let _ = shared.quiescent().await;
        }
    }
}

/// What the child's provider context reports to: progress through the
/// shared state, the capture through the mailbox.
impl<M: ?Sized + Mailbox> RunReporter for RunControl<M> {
    fn run_id(&self) -> u64 {
        self.shared.run_id
    }

    fn progress(&self, update: ProgressUpdate) {
        self.shared.progress(update);
    }

    fn observes_progress(&self) -> bool {
        self.shared.observes_progress()
    }

    fn capture_structured(&self, value: serde_json::Value) -> BoxFuture<'static, Result<(), CaptureError>> {
        self.mailbox.capture(CaptureStructured(value))
    }
}
