//! Test a provider of your own against the lifecycle contract: the echo
//! provider of `echo_provider.rs`, put through the conformance kit and
//! seeded faults (`subagents::testing`, feature `testing`).
//!
//! `cargo run --example test_your_provider`
//!
//! In your own crate the same calls sit in a `#[test]` (see the guide's
//! "Test your provider" chapter); this program prints the reports instead.

use std::time::Duration;

use subagents::testing::{conformance, faults};

// The provider under test: the one of `echo_provider.rs`, as it is.
#[path = "echo_provider.rs"]
#[allow(dead_code, reason = "its own `main` is not this program's")]
mod echo_provider;
use echo_provider::EchoProvider;

fn main() {
    // The factory is called once per scenario. A delay long enough to be
    // cancelled mid-way lets the kit exercise every rule.
    let report =
        conformance(|| EchoProvider { name: "echo".to_owned(), delay: Duration::from_millis(50) }).run_blocking();
    print!("{report}");
    report.assert_conformant();

    // Seeded faults around it: the chaos wrapper, invariants after every run.
    let faults =
        faults(|| EchoProvider { name: "echo".to_owned(), delay: Duration::from_millis(5) }).seeds(0..8).run_blocking();
    println!("{faults}");
    faults.assert_held();
}
