//! The server side of this crate's protocols: what the `subagents` binary
//! runs when another process drives it. You need none of it to embed the
//! runtime; it is public so the binary (and a program that wants to serve
//! the same way) can call it.
//!
//! - [`acp`]: `subagents acp`, this crate's agent over the Agent Client
//!   Protocol on stdio (the counterpart of the `acp` provider).
//! - [`stdio`]: `subagents serve`, one session of a full runtime over
//!   stdio JSON-RPC (the child of the `process` provider).
//! - [`worker`]: `subagents worker`, a runtime that runs the `remote`
//!   provider's runs pulled from a NATS JetStream broker.

pub mod acp;
pub mod stdio;
pub mod worker;
