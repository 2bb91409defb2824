//! The supervision tree: runtime, registry, provider and run actors.
//!
//! ```text
//! Runtime (control thread + one worker arbiter per core + an events thread)
//! ├── RegistryActor               supervises provider actors; drives shutdown
//! │   ├── ProviderActor "spawn"   hosts one Provider until it is retired and drained
//! │   └── ProviderActor "mock"
//! └── RunActor <run id>           on a worker, in the run table; owns one child and a
//!                                 lease on its provider's run count; mailbox: Control
//!                                 (Dispose, ForceStop), SendMessage, CaptureStructured;
//!                                 cancel is a token it watches, not a message
//! ```
//!
//! Where this departs from a textbook actor registry, and why:
//!
//! - **`start` does not hop through the registry actor.** The provider table
//!   is a shared, read-mostly table the registry writes and `start` reads,
//!   so a start costs no thread crossing: the run actor is created on the
//!   caller's own arbiter when the caller lives in the runtime, and on one
//!   worker (round robin) otherwise. Measured on 2-core machines, one
//!   cross-thread hop costs 45–75 µs, a hundred times a whole local start.
//! - **Provider actors learn of runs by counter, not by message.** A run
//!   holds a lease on its provider's live-run count; only when a retired
//!   provider's count reaches zero does the registry hear about it. The
//!   provider actor therefore never wakes for ordinary runs.
//! - **A run actor is temporary**: never restarted (a child may have side
//!   effects). Everything it must report — its result, its quiescence, the
//!   live counters — is released from its `Drop`, so even a panicking
//!   handler cannot leave a caller hanging.
//!
//! The files read top-down, and none imports one above it:
//!
//! ```text
//! runtime.rs        Runtime: threads, the registry's address, phased shutdown
//! subagents.rs      Subagents: register, start, observe
//! continuation.rs   Continuation (and Run::continuation): resume a session
//! start.rs          the start path: checks in contract order, publication
//! run.rs            RunActor: owns one child; its lifecycle is one enum whose phases own their data
//! slot.rs           Slot: a provider future the run actor can drop on the spot
//! run_handle.rs     Run, Steering: the caller's handles
//! registry.rs       RegistryActor, Registration: supervises provider actors
//! core.rs           Core: config, workers, bus, counters, provider, run and family tables
//! lineage.rs        a quiescent run's receipt, with its family's branches
//! control.rs        RunControl: a run held by token, state and its actor's Mailbox
//! provider.rs       ProviderActor: hosts one provider until retired and drained
//! run_shared.rs     RunShared, Family: result, quiescence, events through the gate, the runs under its session
//! gate.rs           Gate: Start before End, End once (loom-checked)
//! entry.rs          ProviderEntry, the run lease, RunCount (one atomic word)
//! ```
//!
//! The actors name no agent type: `Run::agent()`, the typed view of
//! [`Run::local_agent`], is written in the tool layer, which stands on both.
//!
//! A lower file reaches a higher one only through a trait object: a run's
//! mailbox (`control::Mailbox`, for its control messages, steering and the
//! structured capture; one `RunControl` allocation per run carries it), a
//! retired provider's drain (an [`actix::Recipient`] of `ProviderDrained`).

mod continuation;
mod control;
mod core;
mod entry;
mod gate;
mod lineage;
mod provider;
mod registry;
mod run;
mod run_handle;
mod run_shared;
mod runtime;
mod slot;
mod start;
mod subagents;

#[cfg(feature = "agent")]
pub(crate) use self::core::Core;

/// Spawns background work beside the caller: on the caller's worker, as a
/// task of its runtime (so runs it starts are created in place), when the
/// caller is a runtime task; else on the caller's tokio runtime.
#[cfg(feature = "agent")]
pub(crate) fn spawn_beside<F>(future: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    match Core::current_task_runtime() {
        Some(runtime) => {
            actix::spawn(self::core::in_runtime(runtime, future));
        }
        None => {
            tokio::spawn(future);
        }
    }
}
pub use continuation::Continuation;
pub use registry::{Registration, ScopedRegistration};
pub use run_handle::{Run, Steering};
pub use runtime::{PhaseReport, Runtime, RuntimeBuilder, RuntimeTask, ShutdownReport};
#[cfg(feature = "config")]
pub(crate) use subagents::nearest;
#[cfg(feature = "process")]
pub(crate) use subagents::LineageScope;
pub use subagents::Subagents;
