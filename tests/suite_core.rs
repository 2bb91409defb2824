//! The core's tests: the runtime, the registry, events, runs, the schema
//! subset and the runs' spans, with no feature (`cargo test
//! --no-default-features` runs this binary alone).
//!
//! The suite is a few binaries, one per set of features its tests need
//! (`suite_core`, `suite_agent`, `suite_openai`, `suite_cli`), because each
//! binary's link costs seconds on a small machine. Each root names the one
//! helper module, `common` (which also starts the binary's watchdog), and
//! its test files as modules; a test file's own helpers sit in a folder of
//! its name (`remote/support.rs`). A new test file joins the root whose
//! features it needs, or gates its `mod` line with `#[cfg(feature = ...)]`.

mod common;

mod events;
mod layout;
mod registry;
mod runs;
mod runtime;
mod schema;
#[cfg(feature = "testing")]
mod testing;
mod tracing_spans;
