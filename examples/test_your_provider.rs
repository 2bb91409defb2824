//! Test a provider of your own against the lifecycle contract: the echo
//! provider of `echo_provider.rs`, put through the conformance kit and
//! seeded faults (`subagents::testing`, feature `testing`).
//!
//! `cargo run --example test_your_provider`
//!
//! In your own crate the same calls sit in a `#[test]` (see the guide's
//! "Test your provider" chapter); this program prints the reports instead.

use std::time::Duration;

use subagents::seam::{
    text_of, Capabilities, Child, Failure, Launch, LaunchError, LocalBoxFuture, Provider, RunResult, StopReason,
};
use subagents::testing::{conformance, faults};
use subagents::CancellationToken;

/// Answers each prompt with `echo: PROMPT` after `delay`.
struct EchoProvider {
    delay: Duration,
}

impl Provider for EchoProvider {
    fn name(&self) -> &str {
        "echo"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::none()
    }

    fn launch(&self, launch: Launch) -> LocalBoxFuture<'static, Result<Box<dyn Child>, LaunchError>> {
        let delay = self.delay;
        Box::pin(async move {
            if launch.cancel.is_cancelled() {
                return Err(LaunchError::Aborted);
            }
            let prompt = text_of(&launch.request.prompt);
            let id = format!("echo-{}", launch.context.run_id());
            Ok(Box::new(EchoChild { id, prompt, delay, cancel: launch.cancel }) as Box<dyn Child>)
        })
    }
}

struct EchoChild {
    id: String,
    prompt: String,
    delay: Duration,
    cancel: CancellationToken,
}

impl Child for EchoChild {
    fn id(&self) -> String {
        self.id.clone()
    }

    fn run(&self) -> LocalBoxFuture<'static, RunResult> {
        let (prompt, delay, cancel) = (self.prompt.clone(), self.delay, self.cancel.clone());
        Box::pin(async move {
            tokio::select! {
                _ = tokio::time::sleep(delay) => RunResult::completed(format!("echo: {prompt}")),
                _ = cancel.cancelled() => RunResult::empty(StopReason::Aborted),
            }
        })
    }

    fn dispose(&self) -> LocalBoxFuture<'static, Result<(), Failure>> {
        Box::pin(async { Ok(()) })
    }
}

fn main() {
    // The factory is called once per scenario. A delay long enough to be
    // cancelled mid-way lets the kit exercise every rule.
    let report = conformance(|| EchoProvider { delay: Duration::from_millis(50) }).run_blocking();
    print!("{report}");
    report.assert_conformant();

    // Seeded faults around it: the chaos wrapper, invariants after every run.
    let faults = faults(|| EchoProvider { delay: Duration::from_millis(5) }).seeds(0..8).run_blocking();
    println!("{faults}");
    faults.assert_held();
}
