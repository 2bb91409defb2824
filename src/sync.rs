//! The atomics and locks whose interleavings matter, swapped for loom's
//! model-checked ones under `--cfg subagents_loom` (see the loom tests in
//! `actors/entry.rs`, `actors/gate.rs` and `seam/budget.rs`; CI runs them with
//! `RUSTFLAGS="--cfg subagents_loom" cargo test --lib loom`). The cfg is
//! ours, not the customary `loom`: that one also reconfigures tokio.

#[cfg(subagents_loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
#[cfg(subagents_loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(subagents_loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(subagents_loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};
