//! The caller's handle on one run.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::control::{RunControl, SendMessage};
use super::core::Core;
use super::lineage;
use crate::seam::{ContentBlock, DisposeError, LocalAgent, Parent, Receipt, RunResult, SteeringError, SubagentError};

/// A published run, owned by the caller, who must [`dispose`](Run::dispose)
/// it on every path. Dropping an undisposed `Run` disposes it in the
/// background (without waiting), so nothing leaks.
///
/// A run has two names, and they answer different questions:
/// - [`Run::run_id`], a number the runtime mints, unique within it: the
///   run's `Start`, `Progress` and `End` events carry it, so it ties what
///   an observer sees to this handle;
/// - [`Run::child_id`], the child's own name, minted by its provider: the
///   session id of an in-process child (its file under
///   `<home>/sessions/`, what a continuation resumes), a provider-scoped
///   id otherwise (`mock:<name>:<n>`, `acp:<name>:<session>`, …). Events
///   carry it too, once the child exists.
pub struct Run {
    pub(crate) control: Arc<RunControl>,
    pub(crate) local_agent: Option<LocalAgent>,
    /// Whether the child takes send-message (through the run's mailbox).
    pub(crate) steering: bool,
    /// Set when the child can be continued: the runtime and the parent it
    /// was started from (boxed: a `Run` is moved through every layer of the
    /// start path, and most runs cannot be continued).
    pub(crate) continuation: Option<Box<(Arc<Core>, Parent)>>,
    pub(crate) disposed: AtomicBool,
}

impl Run {
    /// The child's own name (see [`Run`]): its session id for in-process
    /// providers, a provider-scoped id otherwise.
    pub fn child_id(&self) -> &str {
        self.control.shared.child_id()
    }

    /// The runtime-minted number this run's events carry (see [`Run`]).
    pub fn run_id(&self) -> u64 {
        self.control.shared.run_id
    }

    /// The provider that runs the child.
    pub fn provider(&self) -> &str {
        self.control.shared.provider()
    }

    /// The in-process child agent, when the provider exposes one
    /// (type-erased: a provider of your own may expose any handle). With
    /// the `agent` feature, `Run::agent()` downcasts it to the crate's own
    /// agent; that method is defined beside the tool layer, so the actors
    /// name no agent type.
    pub fn local_agent(&self) -> Option<&LocalAgent> {
        self.local_agent.as_ref()
    }

    /// The terminal outcome. Awaitable by many, any number of times. A
    /// child-level failure is `Ok` with `StopReason::Error`; `Err` means an
    /// infrastructure fault (the runtime stopped under the run).
    pub async fn result(&self) -> Result<RunResult, SubagentError> {
        self.control.shared.result().await
    }

    /// Cancel the child; the result settles `Aborted` unless it already
    /// completed. Returns at once.
    pub fn cancel(&self) {
        // The run actor watches this token, so tripping it is the message.
        self.control.token.cancel();
    }

    /// Whether cancellation was requested (by `cancel()` or the request's
    /// signal).
    pub fn is_cancelled(&self) -> bool {
        self.control.token.is_cancelled()
    }

    /// Cancel remaining work and release the child; returns once it is
    /// quiescent (actor stopped, tasks ended, session flushed, process
    /// reaped). Idempotent and safe to call concurrently: every call returns
    /// after quiescence. `Err(DISPOSE_FAILED)` says the child had to be
    /// forced down (its dispose hook failed, panicked or timed out).
    pub async fn dispose(&self) -> Result<(), DisposeError> {
        self.request_dispose();
        self.control.shared.quiescent().await
    }

    /// Cancel the run, wait until it is quiescent, dispose it, and say
    /// what was stopped: the run's [`Receipt`], with every run started
    /// under it (in-process descendants found through session lineage,
    /// the runs a `process` child or a `remote` worker reported over its
    /// wire), each with its final stop reason, the processes reaped, and
    /// an unknown branch wherever the tree cannot be known (an ACP agent's
    /// own runs, a child that died before it reported, a lost worker).
    ///
    /// `dispose()` keeps its signature; this is the dispose that reports.
    /// Like `dispose()` it is idempotent and returns after quiescence;
    /// `Err(DISPOSE_FAILED)` says the run had to be forced down (its
    /// receipt is still available from [`Run::receipt`]).
    ///
    /// ```
    /// use subagents::providers::MockProvider;
    /// use subagents::{CancellationToken, Parent, Runtime, StartRequest, StopReason};
    ///
    /// let runtime = Runtime::builder().workers(1).build().unwrap();
    /// let subagents = runtime.subagents();
    /// subagents.register_provider(MockProvider::new("mock").with_delay(std::time::Duration::from_secs(600))).unwrap().keep();
    /// let receipt = runtime.block_on(async move {
    ///     let request = StartRequest::new("wait for ever", Parent::root("/tmp"), CancellationToken::new());
    ///     let run = subagents.start("mock", request).await.unwrap();
    ///     run.cancel_and_wait().await.unwrap()
    /// });
    /// assert_eq!(receipt.stop_reason, StopReason::Aborted);
    /// assert_eq!(receipt.provider, "mock");
    /// assert!(receipt.children.is_empty() && receipt.is_complete());
    /// assert!(runtime.shutdown_blocking().live_after.is_quiescent());
    /// ```
    pub async fn cancel_and_wait(&self) -> Result<Receipt, DisposeError> {
        self.cancel();
        let disposed = self.dispose().await;
        let receipt = self.receipt().await;
        disposed.map(|()| receipt)
    }

    /// The run's [`Receipt`] (see [`Run::cancel_and_wait`]), once it is
    /// quiescent: waits for quiescence without cancelling or disposing, so
    /// call it after `dispose()` (or when the run is being disposed).
    /// Descendants that are not quiescent within 30 s of the run are
    /// listed as unknown branches.
    pub async fn receipt(&self) -> Receipt {
        let shared = &self.control.shared;
        let _ = shared.quiescent().await;
        lineage::receipt_of(shared, lineage::deadline()).await
    }

    /// Send-message, when the child supports it.
    pub fn steering(&self) -> Option<Steering> {
        self.steering.then(|| Steering { control: self.control.clone() })
    }

    /// Send the dispose request once, whoever asks first.
    fn request_dispose(&self) {
        if !self.disposed.swap(true, Ordering::AcqRel) {
            self.control.dispose();
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        self.request_dispose();
    }
}

impl fmt::Debug for Run {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Run")
            .field("child_id", &self.child_id())
            .field("run_id", &self.run_id())
            .field("provider", &self.provider())
            .finish_non_exhaustive()
    }
}

/// Steers a running child: each message reaches it as a mailbox message.
#[derive(Clone)]
pub struct Steering {
    control: Arc<RunControl>,
}

impl Steering {
    /// Deliver a text message to the running child.
    pub async fn send(&self, text: impl Into<String>) -> Result<(), SteeringError> {
        self.send_blocks(vec![ContentBlock::text(text)]).await
    }

    /// Deliver content blocks to the running child. Waits for mailbox room
    /// rather than growing the mailbox without bound.
    pub async fn send_blocks(&self, message: Vec<ContentBlock>) -> Result<(), SteeringError> {
        self.control.mailbox.steer(SendMessage(message)).await
    }
}

impl fmt::Debug for Steering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Steering").finish_non_exhaustive()
    }
}
