//! The echo provider of the guide, with one flaw at a time: the providers
//! the conformance kit must catch.

use std::time::Duration;

use subagents::seam::{
    text_of, Capabilities, Capability, Child, Failure, Launch, LaunchError, LocalBoxFuture, ProgressUpdate, Provider,
    ProviderContext, RunResult, StopReason,
};
use subagents::CancellationToken;

/// What is wrong with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flaw {
    /// Nothing: the guide's echo provider.
    None,
    /// Settles, then answers again (a progress chunk and a structured
    /// capture after its run resolved).
    SettlesTwice,
    /// Leaves a task running after dispose, holding the run's context.
    LeaksTask,
    /// Advertises `output_schema` and ignores it.
    IgnoresCapability,
    /// Never stops when told to.
    IgnoresCancel,
}

/// Answers `echo: PROMPT` after `delay`, with its flaw.
pub struct Echo {
    pub delay: Duration,
    pub flaw: Flaw,
}

impl Echo {
    pub fn new(flaw: Flaw) -> Self {
        Echo { delay: Duration::from_millis(50), flaw }
    }
}

impl Provider for Echo {
    fn name(&self) -> &str {
        "echo"
    }

    fn capabilities(&self) -> Capabilities {
        match self.flaw {
            Flaw::IgnoresCapability => Capabilities::none().with(Capability::OutputSchema, true),
            _ => Capabilities::none(),
        }
    }

    fn launch(&self, launch: Launch) -> LocalBoxFuture<'static, Result<Box<dyn Child>, LaunchError>> {
        let (delay, flaw) = (self.delay, self.flaw);
        Box::pin(async move {
            if launch.cancel.is_cancelled() {
                return Err(LaunchError::Aborted);
            }
            let child = EchoChild {
                id: format!("echo-{}", launch.context.run_id()),
                prompt: text_of(&launch.request.prompt),
                delay,
                flaw,
                cancel: launch.cancel,
                context: launch.context,
            };
            Ok(Box::new(child) as Box<dyn Child>)
        })
    }
}

struct EchoChild {
    id: String,
    prompt: String,
    delay: Duration,
    flaw: Flaw,
    cancel: CancellationToken,
    context: ProviderContext,
}

impl Child for EchoChild {
    fn id(&self) -> String {
        self.id.clone()
    }

    fn run(&self) -> LocalBoxFuture<'static, RunResult> {
        let (prompt, delay, flaw) = (self.prompt.clone(), self.delay, self.flaw);
        let (cancel, context) = (self.cancel.clone(), self.context.clone());
        if flaw == Flaw::LeaksTask {
            // A reporter that nobody stops: it outlives the run.
            let context = context.clone();
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    context.progress(ProgressUpdate::MessageChunk { text: "still here".into() });
                }
            });
        }
        Box::pin(async move {
            if flaw == Flaw::IgnoresCancel {
                tokio::time::sleep(Duration::from_secs(3600)).await;
            }
            let answer = tokio::select! {
                _ = tokio::time::sleep(delay) => RunResult::completed(format!("echo: {prompt}")),
                _ = cancel.cancelled() => RunResult::empty(StopReason::Aborted),
            };
            if flaw == Flaw::SettlesTwice {
                // A second answer, delivered once the first has settled.
                tokio::task::spawn_local(async move {
                    tokio::task::yield_now().await;
                    context.progress(ProgressUpdate::MessageChunk { text: "second answer".into() });
                    let _ = context.capture_structured(serde_json::json!({"answer": "second"})).await;
                });
            }
            answer
        })
    }

    fn dispose(&self) -> LocalBoxFuture<'static, Result<(), Failure>> {
        Box::pin(async { Ok(()) })
    }
}
