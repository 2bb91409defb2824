//! What the runtime and a caller hold of a live run: its cancellation token,
//! its shared state, and a [`Recipient`] for the control messages its actor
//! answers (never the actor's concrete type, so nothing here sits above the
//! run actor).

use std::future::Future;
use std::sync::Arc;

use actix::{Message, Recipient};
use tokio_util::sync::CancellationToken;

use super::run_shared::RunShared;
use crate::seam::{ContentBlock, SubagentError};

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
#[rtype(result = "Result<(), SubagentError>")]
pub(crate) struct SendMessage(pub Vec<ContentBlock>);

/// Enough of a live run to dispose it, force it down, and await its
/// quiescence. The runtime's run table holds one; so does the caller's `Run`.
#[derive(Clone)]
pub(crate) struct RunControl {
    pub control: Recipient<Control>,
    pub token: CancellationToken,
    /// The child's delegation depth: shutdown disposes deepest first.
    pub depth: u32,
    pub shared: Arc<RunShared>,
}

impl RunControl {
    /// Cancel remaining work and ask the actor to release the child.
    pub(crate) fn dispose(&self) {
        self.token.cancel();
        self.control.do_send(Control::Dispose);
    }

    /// Escalation: stop the actor without waiting for its child.
    pub(crate) fn force_stop(&self) {
        self.control.do_send(Control::ForceStop);
    }

    /// Resolves once the run is quiescent.
    pub(crate) fn quiescence(&self) -> impl Future<Output = ()> + 'static {
        let shared = self.shared.clone();
        async move {
            let _ = shared.quiescent().await;
        }
    }
}
