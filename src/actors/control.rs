//! A run actor's messages, and the [`Mailbox`] trait through which the
//! runtime, a caller and a child reach it: the run's shared state
//! (`run_shared.rs`) holds its actor's address as a `Mailbox`, never the
//! actor's concrete type, so nothing below the run actor names it.

use actix::Message;
use futures_util::future::BoxFuture;

use crate::seam::{CaptureError, ContentBlock, SteeringError};

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
