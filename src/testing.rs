//! A conformance and fault kit for providers of your own (feature
//! `testing`): does your provider keep the lifecycle contract that the
//! runtime and every caller rely on?
//!
//! A provider (see [`seam`](crate::seam)) can compile, answer prompts and
//! still break the rules a caller depends on: settle twice, ignore cancel,
//! leave a task running after dispose, accept a capability and ignore it.
//! The runtime contains most of that (it stops a wedged child after its
//! grace, drops what arrives after a run settled), so the bug shows in
//! production as slow cancels and slow leaks. This kit finds it in
//! `cargo test`:
//!
//! - [`conformance`] drives your provider through the contract's scenarios
//!   and returns a [`Report`] naming each broken rule with the scenario,
//!   the evidence and the clause of the contract (`docs/contract.md` in the
//!   repository);
//!
//! ```
//! use std::time::Duration;
//! use subagents::providers::MockProvider;
//!
//! // The factory is called once per scenario; a delay lets the kit cancel
//! // and dispose runs mid-way.
//! let report = subagents::testing::conformance(|| MockProvider::new("mock").with_delay(Duration::from_millis(50)))
//!     .run_blocking();
//! report.assert_conformant(); // panics with the whole report when a rule broke
//! assert!(report.findings.len() > 10);
//! ```
//!
//! # The scenarios
//!
//! Each runs in a runtime of its own with a fresh provider from your
//! factory, wrapped in a probe that sees every call across the seam (so
//! the report can say what the provider did, not only what the caller
//! saw). Run them with [`Conformance::run`] (async) or
//! [`Conformance::run_blocking`].
//!
//! | scenario | what it does | broken when |
//! |---|---|---|
//! | `settle-once` | start, read the result twice, dispose | the reads differ, `run` is called twice |
//! | `result-after-dispose` | start, dispose, then read | no result, or reads differ |
//! | `cancel-before-launch` | the caller's signal trips before `start` | the provider is launched at all |
//! | `cancel-during-launch` | the signal trips as `launch` begins | `launch` returns a child anyway, or ignores the token until the grace |
//! | `cancel-mid-run` | cancel while the child works (needs [`Conformance::long_prompt`]) | it settles other than `aborted`/`completed`, or only the runtime's cancel grace stopped it |
//! | `cancel-after-settle` | cancel a settled run | its outcome changes |
//! | `dispose-racing-result` | dispose while the result is awaited | dispose fails, or the grace was needed |
//! | `capabilities` | ask for each capability | an unadvertised one reaches `launch`; an advertised `output_schema` completes without a structured value |
//! | `many-at-once` | [`Conformance::concurrent_runs`] runs together | a run fails, or two share a child id |
//! | `shutdown-with-runs-live` | shut the runtime down under two live runs | a run is forced down, `Provider::shutdown` is not called once |
//! | `every-run` | over all runs above | progress or a structured capture after a run settled; events out of order |
//!
//! After each dispose the kit checks that nothing is left: no run or
//! process counted by [`Runtime::live`](crate::Runtime::live), the run's
//! [`ProviderContext`](crate::seam::ProviderContext) let go, no progress
//! after dispose, and no tokio task the provider spawned still alive (the
//! kit counts tasks on the run's worker) — each within
//! [`Conformance::leak_wait`].
//!
//! A finding is [`Verdict::Kept`], [`Verdict::Broken`] or
//! [`Verdict::NotExercised`] (the scenario could not reach the rule: a run
//! that finishes before it can be cancelled, say; the evidence says what
//! would). What the kit cannot see from outside — whether a persona or a
//! tool filter really shaped the child — it does not claim: it checks only
//! that such a request is accepted or refused loudly.

mod conformance;
mod faults;
mod probe;
mod report;
mod scenario;
mod scenarios;

pub use conformance::{conformance, Conformance};
pub use faults::{default_schedule, faults, FaultReport, Faults, SeedFailure};
pub use report::{Finding, Report, Verdict};
