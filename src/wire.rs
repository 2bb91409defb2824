//! The two ends of each protocol, as peers: the messages, limits and
//! names a provider (the client) and a door of [`serve`](crate::serve)
//! (the server) both speak, so neither reaches into the other.
//!
//! - [`process`]: the `serve` protocol between the `process` provider and
//!   `subagents serve`, with the child profiles both apply;
//! - [`remote`]: the messages of the `remote` provider and `subagents
//!   worker` on NATS JetStream, and the broker's layout they share;
//! - [`a2a`]: the A2A 1.0 shapes of the `a2a` provider and `subagents a2a`;
//! - [`approval`]: a permission request and its answer as both of the
//!   above carry them between a runtime below and the run above;
//! - [`limit`]: a route's limiter lent by a `process` parent to its child;
//! - [`acp`]: the stop reasons of the `acp` provider and `subagents acp`
//!   (ACP's messages are the official crate's).

#[cfg(feature = "a2a")]
pub(crate) mod a2a;
#[cfg(feature = "acp")]
pub(crate) mod acp;
#[cfg(feature = "process")]
pub(crate) mod approval;
#[cfg(feature = "process")]
pub(crate) mod limit;
#[cfg(feature = "process")]
pub(crate) mod process;
#[cfg(feature = "remote")]
pub(crate) mod remote;
