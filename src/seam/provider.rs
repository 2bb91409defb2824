//! The provider contract: what a transport implements so the run actor can
//! drive it.
//!
//! A [`Provider`] is shared (`Send + Sync`) and lives in a provider actor. For
//! each start, the run actor calls [`Provider::launch`] on its own arbiter
//! thread; the returned [`Child`] is owned by that actor alone, so it may
//! hold `!Send` state. Every future a provider returns runs inside the run
//! actor's context and is contained: a panic becomes a settled `Error`.
//!
//! A provider author needs only this module's types (re-exported from
//! [`crate::seam`], with [`LocalBoxFuture`] for the futures a [`Child`]
//! returns).

use std::any::Any;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use futures_util::future::{BoxFuture, LocalBoxFuture};
use tokio_util::sync::CancellationToken;

use super::{
    AgentOptions, Capabilities, Category, ContentBlock, Diagnostic, Failure, RunResult, Stage, StartRequest,
    SteeringError, StopReport,
};
use super::{Approvals, BudgetLease, ProgressUpdate};
use crate::live::{LiveCounters, ProcessLease};

/// The queries a provider that wraps another answers as its inner one
/// does (what it can do, what it inherits, continuation, route defaults):
/// a wrapper changes how runs go, not what they may ask for.
macro_rules! forward_provider_queries {
    ($inner:ident) => {
        fn capabilities(&self) -> $crate::seam::Capabilities {
            self.$inner.capabilities()
        }

        fn inherits_parent_context(&self) -> bool {
            self.$inner.inherits_parent_context()
        }

        fn offers_continuation(&self) -> bool {
            self.$inner.offers_continuation()
        }

        fn route_defaults(&self) -> $crate::seam::AgentOptions {
            self.$inner.route_defaults()
        }
    };
}
pub(crate) use forward_provider_queries;

/// One transport for running children, registered under a unique name.
pub trait Provider: Send + Sync + 'static {
    /// The registry name.
    fn name(&self) -> &str;

    /// Start-time features this provider enforces.
    fn capabilities(&self) -> Capabilities;

    /// Whether a child sees the parent's completed turns. Descriptive only.
    fn inherits_parent_context(&self) -> bool {
        false
    }

    /// Whether this provider's children may hand out a continuation
    /// ([`Child::supports_continuation`]). When false (the default) the
    /// runtime keeps nothing of a start request for one.
    fn offers_continuation(&self) -> bool {
        false
    }

    /// Whether it accepts [`StartRequest::detached`]: runs named by their
    /// caller that outlive the caller for a bounded time and can be
    /// attached to again. When false (the default) such a start is
    /// rejected before launch.
    fn offers_detached(&self) -> bool {
        false
    }

    /// Whether its children run in another process (or on another host):
    /// a run's span is then a client call
    /// ([`telemetry`](crate::telemetry)). Default: in this process.
    fn runs_out_of_process(&self) -> bool {
        false
    }

    /// Route defaults the provider publishes.
    fn route_defaults(&self) -> AgentOptions {
        AgentOptions::default()
    }

    /// Create and publish one child. Until the returned future resolves the
    /// provider owns every partial resource: on error, and when
    /// `launch.cancel` trips, it must roll them back before resolving.
    fn launch(&self, launch: Launch) -> LocalBoxFuture<'static, Result<Box<dyn Child>, LaunchError>>;

    /// Called once when the provider actor stops, after its runs are gone.
    fn shutdown(&self) -> LocalBoxFuture<'static, ()> {
        Box::pin(async {})
    }
}

/// A live child, owned by its run actor. Every method returns a future that
/// does not borrow the child, so cancel and dispose never wait behind `run`.
pub trait Child: 'static {
    /// The child's own name, what callers see as `Run::child_id()` and
    /// events carry as `child_id`: the child session id for local
    /// providers, a provider-scoped lifecycle id otherwise. (The run id,
    /// `Run::run_id()`, is minted by the runtime, not here.)
    fn id(&self) -> String;

    /// The in-process agent, when the child is one.
    fn local_agent(&self) -> Option<LocalAgent> {
        None
    }

    /// Drive the child to its terminal outcome. Called once. Child-level
    /// failures are a result with `StopReason::Error`, never a panic.
    fn run(&self) -> LocalBoxFuture<'static, RunResult>;

    /// Ask the live child to stop; `run` should then resolve promptly.
    ///
    /// Called at most once, and only while `run` is still going: when the
    /// run is cancelled (the request's signal, `Run::cancel`) or disposed
    /// before it settled. The launch token has already been tripped by
    /// then, so a child that watches the token may leave this empty. Not
    /// called during `launch` (the launch watches its token and rolls back),
    /// nor after the run settled (dispose then goes straight to
    /// [`Child::dispose`]), nor when the runtime forces a run down at
    /// shutdown. If `run` does not resolve within the runtime's cancel
    /// grace the result settles `Aborted` without it.
    fn cancel(&self) {}

    /// Whether [`Child::send_message`] is supported (steering).
    fn supports_steering(&self) -> bool {
        false
    }

    /// Whether a settled child can be continued by a new run
    /// (`Run::continuation`): the provider then honours
    /// [`StartRequest::resumes`] with this child's [`Child::local_agent`].
    fn supports_continuation(&self) -> bool {
        false
    }

    /// Deliver a message to the running child.
    fn send_message(&self, message: Vec<ContentBlock>) -> LocalBoxFuture<'static, Result<(), SteeringError>> {
        let _ = message;
        Box::pin(async { Err(SteeringError::Unsupported) })
    }

    /// Release everything the child holds: close its session, reap its
    /// process. Resolves once the child is quiescent.
    fn dispose(&self) -> LocalBoxFuture<'static, Result<(), Failure>>;

    /// What releasing the child stopped beyond the runtime's sight, for
    /// the run's [`Receipt`](super::Receipt): the processes [`Child::dispose`]
    /// reaped, and the runs the child started that the runtime cannot find
    /// by session lineage (reported over a wire), or an unknown branch
    /// saying why they cannot be known. Called once, when the run actor
    /// stops (after the dispose hook, or when the run was forced down),
    /// before the child is dropped. The default reports nothing: right for
    /// a child without processes whose descendants, if any, are in-process
    /// runs the runtime tracks itself.
    fn stop_report(&self) -> StopReport {
        StopReport::new()
    }
}

/// Why a launch produced no child. The provider has rolled back already.
/// The run actor turns it into the [`StartError`](crate::StartError) `start` returns
/// (`ABORTED`, `STARTUP_FAILED`, `INVALID_REQUEST`).
///
/// ```
/// use subagents::seam::{Category, LaunchError, Stage};
///
/// assert_eq!(LaunchError::Aborted.to_string(), "the launch was aborted");
/// let failed = LaunchError::Failed { stage: Stage::Initialize, category: Category::ChildCrashed };
/// assert_eq!(failed.to_string(), "the launch failed at stage Initialize (ChildCrashed)");
/// let _: &dyn std::error::Error = &failed;
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    /// The launch token tripped.
    #[error("the launch was aborted")]
    Aborted,
    /// Creating the child failed.
    #[error("the launch failed at stage {stage:?} ({category:?})")]
    Failed {
        /// Where it failed.
        stage: Stage,
        /// What kind of failure.
        category: Category,
    },
    /// Creating the child failed, and the provider can say why: its
    /// diagnostic, with a fixed-wording reason (see [`Diagnostic`]).
    #[error("the launch failed ({0})")]
    Diagnosed(Diagnostic),
    /// A request value the provider checks itself was wrong.
    #[error("invalid request: {field}: {reason}")]
    Invalid {
        /// The offending field.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

/// Why a structured capture was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CaptureError {
    /// The run kept an earlier capture.
    #[error("a structured result was already captured")]
    AlreadyCaptured,
    /// The run has settled or is gone.
    #[error("the run is no longer running")]
    NotRunning,
}

/// What a provider gets for one launch.
pub struct Launch {
    /// The caller's request. Its `signal` is the caller's token; use
    /// `cancel` instead, which also trips on `Run::cancel()` and dispose.
    pub request: StartRequest,
    /// Trips when the start or the run is cancelled.
    pub cancel: CancellationToken,
    /// Runtime services for this run.
    pub context: ProviderContext,
}

impl fmt::Debug for Launch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Launch").field("cancelled", &self.cancel.is_cancelled()).finish_non_exhaustive()
    }
}

/// Runtime services for one run: its id, the home directory, progress
/// reporting and process accounting.
#[derive(Clone)]
pub struct ProviderContext {
    pub(crate) run: Arc<dyn RunReporter>,
    pub(crate) home: Arc<Path>,
    pub(crate) live: Arc<LiveCounters>,
    pub(crate) budget: Option<BudgetLease>,
    pub(crate) approvals: Approvals,
}

impl ProviderContext {
    /// The registry-minted run id (the same as in the run's events).
    pub fn run_id(&self) -> u64 {
        self.run.run_id()
    }

    /// The runtime's home directory.
    pub fn home_path(&self) -> &Path {
        &self.home
    }

    /// Report live progress to subscribers; it never enters the parent's
    /// conversation. Cheap when nobody listens.
    pub fn progress(&self, update: ProgressUpdate) {
        self.run.progress(update)
    }

    /// Whether a progress update would reach anyone (an event listener or
    /// subscriber, or the caller's own progress receiver) right now: a
    /// provider may skip building one that would be dropped. A listener
    /// added later hears the updates from then on.
    pub fn is_progress_observed(&self) -> bool {
        self.run.observes_progress()
    }

    /// Count a child process as live until the lease is dropped, so
    /// `Runtime::live()` reports it.
    pub fn track_process(&self) -> ProcessLease {
        ProcessLease::new(self.live.clone())
    }

    /// The delegation budget this run's child holds, when its start
    /// answered to one: an in-process child delegates through it, an
    /// out-of-process one gets its [`remaining`](BudgetLease::remaining).
    pub fn budget(&self) -> Option<&BudgetLease> {
        self.budget.as_ref()
    }

    /// The route this run's permission requests climb to the nearest
    /// approver, with the path from the root to this run (see
    /// [`Approvals`]). An in-process child passes it on to its own
    /// children; a provider asks it what its rules leave open.
    pub fn approvals(&self) -> &Approvals {
        &self.approvals
    }

    /// Hand a validated structured result to the run actor (a mailbox
    /// message). `Err` says why it was not taken: a value was captured
    /// already, or the run is no longer running. The captured value is the
    /// run's `RunResult::structured` when it completes.
    pub fn capture_structured(&self, value: serde_json::Value) -> BoxFuture<'static, Result<(), CaptureError>> {
        self.run.capture_structured(value)
    }
}

impl fmt::Debug for ProviderContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProviderContext")
            .field("run_id", &self.run.run_id())
            .field("home", &self.home)
            .finish_non_exhaustive()
    }
}

/// How a run's context reaches the runtime; implemented by the actors.
pub(crate) trait RunReporter: Send + Sync {
    fn run_id(&self) -> u64;
    fn progress(&self, update: ProgressUpdate);
    /// Whether `progress` would reach anyone; a wrapper that draws on every
    /// update (the chaos plan) keeps the default.
    fn observes_progress(&self) -> bool {
        true
    }
    fn capture_structured(&self, value: serde_json::Value) -> BoxFuture<'static, Result<(), CaptureError>>;
}

/// An in-process child agent, shared with the caller through
/// `Run::local_agent()`. Providers put their agent handle inside; callers
/// downcast to the type the provider documents.
#[derive(Clone)]
pub struct LocalAgent {
    session_id: String,
    agent: Arc<dyn Any + Send + Sync>,
}

impl LocalAgent {
    /// Wrap an agent handle whose session is `session_id`.
    pub fn new<A: Any + Send + Sync>(session_id: impl Into<String>, agent: A) -> Self {
        LocalAgent { session_id: session_id.into(), agent: Arc::new(agent) }
    }

    /// The child's session id.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// The agent handle, if it is an `A`.
    pub fn downcast<A: Any + Send + Sync>(&self) -> Option<&A> {
        self.agent.downcast_ref()
    }
}

impl fmt::Debug for LocalAgent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalAgent").field("session_id", &self.session_id).finish_non_exhaustive()
    }
}

/// What `Subagents::provider` reports about a registered provider.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProviderInfo {
    /// The registry name.
    pub name: String,
    /// Start-time features it enforces.
    pub capabilities: Capabilities,
    /// Whether children see completed parent turns.
    pub inherits_parent_context: bool,
    /// The route defaults it publishes.
    pub route_defaults: AgentOptions,
    /// Whether it accepts detached starts and attaches
    /// ([`Provider::offers_detached`]).
    pub detaches: bool,
}
