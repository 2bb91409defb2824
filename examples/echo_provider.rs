//! A provider of your own: children that answer every prompt with itself
//! after a delay, registered beside the built-in ones and run like them.
//!
//! `cargo run --example echo_provider`
//!
//! A provider is two traits from `subagents::seam`: [`Provider`] makes a
//! child for each start, [`Child`] runs it, stops it and releases it. Every
//! future either returns is `'static`: it must not borrow `self`, so copy
//! out what it needs before `Box::pin(async move { … })` (a `&self`
//! lifetime on the future, which the compiler may suggest, cannot match the
//! trait). The futures run on the run's own actor thread, so they need not
//! be `Send`.

use std::time::Duration;

use subagents::seam::{
    text_of, Capabilities, Child, Failure, Launch, LaunchError, LocalBoxFuture, Provider, RunResult, StopReason,
};
use subagents::{CancellationToken, Parent, Runtime, StartRequest};

/// Answers each prompt with `echo: PROMPT` after `delay`.
pub(crate) struct EchoProvider {
    pub(crate) name: String,
    pub(crate) delay: Duration,
}

impl Provider for EchoProvider {
    fn name(&self) -> &str {
        &self.name
    }

    /// It honours no persona, schema, tool filter or depth limit: the
    /// runtime refuses a request that asks for one before `launch`.
    fn capabilities(&self) -> Capabilities {
        Capabilities::none()
    }

    fn launch(&self, launch: Launch) -> LocalBoxFuture<'static, Result<Box<dyn Child>, LaunchError>> {
        let delay = self.delay; // copied out: the future may not borrow `self`
        Box::pin(async move {
            if launch.cancel.is_cancelled() {
                return Err(LaunchError::Aborted); // nothing to roll back yet
            }
            let child = EchoChild {
                id: format!("echo-{}", launch.context.run_id()),
                prompt: text_of(&launch.request.prompt),
                delay,
                cancel: launch.cancel,
            };
            Ok(Box::new(child) as Box<dyn Child>)
        })
    }
}

/// One live echo. `cancel` trips when the run is cancelled or disposed
/// early, so `run` watches it instead of implementing `Child::cancel`.
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

    /// Nothing to release: no session, no process.
    fn dispose(&self) -> LocalBoxFuture<'static, Result<(), Failure>> {
        Box::pin(async { Ok(()) })
    }
}

fn main() {
    let runtime = Runtime::builder().build().expect("runtime");
    let subagents = runtime.subagents();
    let echo = EchoProvider { name: "echo".into(), delay: Duration::from_millis(20) };
    subagents.register_provider(echo).expect("a unique name").keep();

    runtime.block_on(async move {
        let request = StartRequest::new("hello", Parent::root("/tmp"), CancellationToken::new());
        let run = subagents.start("echo", request).await.expect("started");
        let result = run.result().await.expect("settled");
        run.dispose().await.expect("disposed"); // the caller owns the run: always dispose
        assert_eq!(result.text(), "echo: hello");
        println!("{} answered {:?}", run.child_id(), result.text());

        // Cancelled while it waits: the run settles `aborted`.
        let request = StartRequest::new("never mind", Parent::root("/tmp"), CancellationToken::new());
        let run = subagents.start("echo", request).await.expect("started");
        run.cancel();
        let result = run.result().await.expect("settled");
        run.dispose().await.expect("disposed");
        assert_eq!(result.stop_reason, StopReason::Aborted);
        println!("{} stopped: {:?}", run.child_id(), result.stop_reason);

        // A request for something it does not advertise is refused at start.
        let request = StartRequest::new("hi", Parent::root("/tmp"), CancellationToken::new()).with_persona("a pirate");
        let refused = subagents.start("echo", request).await.expect_err("persona is not advertised");
        println!("refused: {refused}");
    });
    let report = runtime.shutdown_blocking();
    assert!(report.live_after.is_quiescent(), "nothing left running");
}
