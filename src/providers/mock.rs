//! `mock`: a scripted provider for tests, demos, and for users testing their
//! own run lifecycles through the real runtime path.
//!
//! **Choose it** to exercise everything around a child without a model:
//! the registry checks, cancellation, dispose, events, shutdown.
//!
//! **Advertises** every start-time capability unless configured otherwise
//! ([`MockProvider::with_capabilities`]); `local_agent()` is `None`; run ids
//! are `mock:<name>:<n>`; steering is supported (messages are recorded and
//! can wake a run that waits for one).
//!
//! **Replies** with its configured text (`done` unless told otherwise) and
//! stop reason after an optional delay; one that echoes answers with the
//! prompt, after the configured text if there is one; when the request carries an output schema the structured value is
//! the configured one, else `{"reply": <text>}`.
//!
//! **Fails on purpose** through its fault script: at a [`FaultStage`]
//! (before publication, after publication, mid-run, on dispose) inject a
//! [`Fault`] (error, hang, delay, panic, crash), for every run or for the
//! runs a predicate picks. A hang ignores cancellation, as a wedged child
//! would; a delay honours it.
//!
//! ```
//! use std::time::Duration;
//! use subagents::providers::{Fault, FaultStage, MockProvider};
//! use subagents::{CancellationToken, Parent, Runtime, StartRequest, StopReason};
//!
//! let runtime = Runtime::builder().workers(1).build().unwrap();
//! let subagents = runtime.subagents();
//! let flaky = MockProvider::new("flaky")
//!     .with_reply("partial work")
//!     .with_delay(Duration::from_millis(2))
//!     .with_fault_for(FaultStage::MidRun, Fault::Crash, |n| n % 2 == 0);
//! subagents.register_provider(flaky).unwrap().keep();
//! let reasons = runtime.block_on(async move {
//!     let mut reasons = Vec::new();
//!     for _ in 0..2 {
//!         let request = StartRequest::new("work", Parent::root("/tmp"), CancellationToken::new());
//!         let run = subagents.start("flaky", request).await.unwrap();
//!         reasons.push(run.result().await.unwrap().stop_reason);
//!         run.dispose().await.unwrap();
//!     }
//!     reasons
//! });
//! assert_eq!(reasons, vec![StopReason::Completed, StopReason::Error]);
//! runtime.shutdown_blocking();
//! ```

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::future::LocalBoxFuture;
use serde_json::{json, Value};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::seam::ProgressUpdate;
use crate::seam::{
    Capabilities, Category, Child, ContentBlock, Diagnostic, Failure, Launch, LaunchError, Provider, ProviderContext,
    RunResult, Stage, SteeringError, StopReason,
};

/// Where in a run's life a fault strikes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultStage {
    /// While the child is being created: `start` rejects (after rollback).
    BeforePublication,
    /// As soon as the published child begins its work.
    AfterPublication,
    /// Halfway through the child's work, after partial output.
    MidRun,
    /// While the child is being disposed.
    OnDispose,
}

/// What happens at a fault stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The child reports a failure.
    Error,
    /// The child stops responding, ignoring cancellation.
    Hang,
    /// The child is slow by this much (cancellation still works).
    Delay(Duration),
    /// Provider code panics.
    Panic,
    /// The child dies abruptly.
    Crash,
}

/// Something the mock saw, recorded when [`MockProvider::with_recording`]
/// is on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MockEvent {
    /// A child was created (before publication).
    Created(String),
    /// A child's partial creation was rolled back.
    RolledBack(String),
    /// A child received its prompt.
    Prompted(String, String),
    /// A child received a steering message.
    Steered(String, String),
    /// A child was asked to cancel.
    Cancelled(String),
    /// A child's run finished with this reason.
    Finished(String, StopReason),
    /// A child was disposed.
    Disposed(String),
}

type RunPredicate = Arc<dyn Fn(u64) -> bool + Send + Sync>;

#[derive(Clone)]
struct FaultRule {
    stage: FaultStage,
    fault: Fault,
    applies: Option<RunPredicate>,
}

/// The scripted provider. Cheap to clone: clones share counters and the
/// recording, so keep one to inspect what the registered one did.
#[derive(Clone)]
pub struct MockProvider {
    name: Arc<str>,
    capabilities: Capabilities,
    inherits_parent_context: bool,
    reply: Arc<str>,
    /// Whether `reply` was given (`with_reply`) rather than the default `done`:
    /// only a given reply goes before an echoed prompt.
    reply_given: bool,
    stop_reason: StopReason,
    structured: Option<Value>,
    delay: Duration,
    wait_for_message: bool,
    echo_prompt: bool,
    faults: Arc<[FaultRule]>,
    shared: Arc<MockShared>,
}

impl std::fmt::Debug for MockProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockProvider").field("name", &self.name).field("reply", &self.reply).finish_non_exhaustive()
    }
}

#[derive(Default)]
struct MockShared {
    launched: AtomicU64,
    live_children: AtomicUsize,
    recording: Option<Mutex<Vec<MockEvent>>>,
}

impl MockProvider {
    /// What a mock advertises until [`MockProvider::with_capabilities`] says otherwise.
    pub const DEFAULT_CAPABILITIES: Capabilities = Capabilities::all();

    /// A mock named `name` that completes at once with the reply `done`.
    pub fn new(name: impl Into<String>) -> Self {
        MockProvider {
            name: Arc::from(name.into()),
            capabilities: MockProvider::DEFAULT_CAPABILITIES,
            inherits_parent_context: false,
            reply: Arc::from("done"),
            reply_given: false,
            stop_reason: StopReason::Completed,
            structured: None,
            delay: Duration::ZERO,
            wait_for_message: false,
            echo_prompt: false,
            faults: Arc::from(Vec::new()),
            shared: Arc::new(MockShared::default()),
        }
    }

    /// Advertise exactly these start-time capabilities.
    pub fn with_capabilities(mut self, capabilities: Capabilities) -> Self {
        self.capabilities = capabilities;
        self
    }

    /// Claim that children see the parent's completed turns.
    pub fn with_inherits_parent_context(mut self, inherits: bool) -> Self {
        self.inherits_parent_context = inherits;
        self
    }

    /// The reply text.
    pub fn with_reply(mut self, reply: impl Into<String>) -> Self {
        self.reply = Arc::from(reply.into());
        self.reply_given = true;
        self
    }

    /// The stop reason of a run that is not faulted or cancelled.
    pub fn with_stop_reason(mut self, stop_reason: StopReason) -> Self {
        self.stop_reason = stop_reason;
        self
    }

    /// The structured value for requests with an output schema.
    pub fn with_structured(mut self, value: Value) -> Self {
        self.structured = Some(value);
        self
    }

    /// How long each run works before replying.
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// Each run answers with its prompt, after the reply text when one was
    /// given with [`MockProvider::with_reply`] (`"seen: "` answers `"seen: alpha"`;
    /// with none it answers `"alpha"`).
    pub fn with_echo_prompt(mut self) -> Self {
        self.echo_prompt = true;
        self
    }

    /// Each run waits for a steering message and replies with its text.
    pub fn with_wait_for_message(mut self) -> Self {
        self.wait_for_message = true;
        self
    }

    /// Inject `fault` at `stage` in every run.
    pub fn with_fault(self, stage: FaultStage, fault: Fault) -> Self {
        self.push_fault(FaultRule { stage, fault, applies: None })
    }

    /// Inject `fault` at `stage` in the runs `applies` picks (by launch
    /// number, starting at 1).
    pub fn with_fault_for(
        self,
        stage: FaultStage,
        fault: Fault,
        applies: impl Fn(u64) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.push_fault(FaultRule { stage, fault, applies: Some(Arc::new(applies)) })
    }

    /// Record every [`MockEvent`] (off by default to keep big fan-outs lean).
    pub fn with_recording(mut self) -> Self {
        let shared = Arc::get_mut(&mut self.shared).expect("configure the mock before cloning it");
        shared.recording = Some(Mutex::new(Vec::new()));
        self
    }

    fn push_fault(mut self, rule: FaultRule) -> Self {
        let mut rules = self.faults.to_vec();
        rules.push(rule);
        self.faults = Arc::from(rules);
        self
    }

    /// How many launches began.
    pub fn launched(&self) -> u64 {
        self.shared.launched.load(Ordering::Acquire)
    }

    /// Children created and not yet rolled back or released.
    pub fn live_children(&self) -> usize {
        self.shared.live_children.load(Ordering::Acquire)
    }

    /// What was recorded so far (empty unless recording is on).
    pub fn recorded(&self) -> Vec<MockEvent> {
        self.shared.recording.as_ref().map(|r| r.lock().unwrap_or_else(|e| e.into_inner()).clone()).unwrap_or_default()
    }

    fn fault_at(&self, stage: FaultStage, run: u64) -> Option<Fault> {
        self.faults
            .iter()
            .find(|r| r.stage == stage && r.applies.as_ref().is_none_or(|applies| applies(run)))
            .map(|r| r.fault)
    }
}

impl MockShared {
    fn record(&self, event: impl FnOnce() -> MockEvent) {
        if let Some(recording) = &self.recording {
            recording.lock().unwrap_or_else(|e| e.into_inner()).push(event());
        }
    }
}

impl Provider for MockProvider {
    fn name(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    fn inherits_parent_context(&self) -> bool {
        self.inherits_parent_context
    }

    fn launch(&self, launch: Launch) -> LocalBoxFuture<'static, Result<Box<dyn Child>, LaunchError>> {
        let number = self.shared.launched.fetch_add(1, Ordering::AcqRel) + 1;
        // Written out only when asked for (`Child::id`) or recorded.
        let id = move |mock: &MockProvider| child_id(&mock.name, number);
        let fault = self.fault_at(FaultStage::BeforePublication, number);
        let mock = self.clone();
        // What the child needs of its request is taken now, so the future
        // holds a few words, not the whole request.
        let Launch { request, cancel, context } = launch;
        let echoed = mock.echo_prompt.then(|| crate::seam::text_of(&request.prompt));
        let recorded = mock.shared.recording.is_some().then(|| crate::seam::text_of(&request.prompt));
        let wants_structured = request.output_schema.is_some();
        drop(request);
        Box::pin(async move {
            // Released by drop: on rollback, on a panic, or when an abandoned
            // launch is dropped, as well as when the child goes.
            let resource = ChildResource::new(&mock.shared);
            mock.shared.record(|| MockEvent::Created(id(&mock)));
            let rollback = |error: LaunchError| {
                mock.shared.record(|| MockEvent::RolledBack(id(&mock)));
                Err(error)
            };
            let failed = |category| LaunchError::Failed { stage: Stage::Initialize, category };
            match fault {
                Some(Fault::Error) => return rollback(failed(Category::ChildError)),
                Some(Fault::Crash) => return rollback(failed(Category::ChildCrashed)),
                Some(Fault::Panic) => panic!("mock fault: panic before publication"),
                Some(Fault::Hang) => std::future::pending::<()>().await,
                // A cancelled delay falls through to the rollback below.
                Some(Fault::Delay(delay)) => _ = sleep_unless_cancelled(delay, &cancel).await,
                None => {}
            }
            if cancel.is_cancelled() {
                return rollback(LaunchError::Aborted);
            }
            let reply = match echoed {
                Some(prompt) if mock.reply_given => Arc::from(format!("{}{prompt}", mock.reply)),
                Some(prompt) => Arc::from(prompt),
                None => mock.reply.clone(),
            };
            if let Some(prompt) = recorded {
                mock.shared.record(|| MockEvent::Prompted(id(&mock), prompt));
            }
            let structured =
                wants_structured.then(|| mock.structured.clone().unwrap_or_else(|| json!({ "reply": &*reply })));
            let child = MockChild(Rc::new(ChildState {
                number,
                mock,
                cancel,
                context,
                structured,
                reply,
                inbox: RefCell::new(VecDeque::new()),
                arrived: Notify::new(),
                _resource: resource,
            }));
            Ok(Box::new(child) as Box<dyn Child>)
        })
    }
}

/// A dispose with nothing to do and nothing to record.
struct NothingToRelease;

impl Future for NothingToRelease {
    type Output = Result<(), Failure>;

    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Ready(Ok(()))
    }
}

/// Sleep for `delay`; false when cancelled first.
async fn sleep_unless_cancelled(delay: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(delay) => true,
        _ = cancel.cancelled() => false,
    }
}

/// A child's id: `mock:<name>:<launch number>`.
fn child_id(name: &str, number: u64) -> String {
    use std::fmt::Write;
    // Sized up front: `format!` would guess short and grow once.
    let mut id = String::with_capacity("mock::".len() + name.len() + 20);
    let _ = write!(id, "mock:{name}:{number}");
    id
}

struct ChildState {
    number: u64,
    mock: MockProvider,
    cancel: CancellationToken,
    context: ProviderContext,
    structured: Option<Value>,
    reply: Arc<str>,
    inbox: RefCell<VecDeque<String>>,
    arrived: Notify,
    _resource: ChildResource,
}

/// One created child in the mock's `live_children` count, until dropped.
struct ChildResource(Arc<MockShared>);

impl ChildResource {
    fn new(shared: &Arc<MockShared>) -> Self {
        shared.live_children.fetch_add(1, Ordering::AcqRel);
        ChildResource(shared.clone())
    }
}

impl Drop for ChildResource {
    fn drop(&mut self) {
        self.0.live_children.fetch_sub(1, Ordering::AcqRel);
    }
}

struct MockChild(Rc<ChildState>);

impl ChildState {
    fn id(&self) -> String {
        child_id(&self.mock.name, self.number)
    }

    fn result(&self, text: &str, stop_reason: StopReason) -> RunResult {
        let output = if text.is_empty() { Vec::new() } else { vec![ContentBlock::text(text)] };
        let structured = (stop_reason == StopReason::Completed).then(|| self.structured.clone()).flatten();
        RunResult { output, structured, ..RunResult::empty(stop_reason) }
    }

    fn failure(&self, partial: &str, category: Category) -> RunResult {
        RunResult {
            diagnostic: Some(Diagnostic::new(&self.mock.name, Stage::SessionRun, category)),
            ..self.result(partial, StopReason::Error)
        }
    }

    /// Apply a run-time fault; `Some` is the run's final result.
    async fn strike(&self, stage: FaultStage, partial: &str) -> Option<RunResult> {
        match self.mock.fault_at(stage, self.number)? {
            Fault::Error => Some(self.failure(partial, Category::ChildError)),
            Fault::Crash => Some(self.failure(partial, Category::ChildCrashed)),
            Fault::Panic => panic!("mock fault: panic during the run"),
            Fault::Hang => std::future::pending().await,
            Fault::Delay(delay) => {
                (!sleep_unless_cancelled(delay, &self.cancel).await).then(|| self.result(partial, StopReason::Aborted))
            }
        }
    }

    async fn work(&self) -> RunResult {
        if let Some(result) = self.strike(FaultStage::AfterPublication, "").await {
            return result;
        }
        let reply = if self.mock.wait_for_message {
            match self.next_message().await {
                Some(message) => Arc::from(message),
                None => return self.result("", StopReason::Aborted),
            }
        } else {
            self.reply.clone()
        };
        let half = reply.len() / 2;
        let half = (0..=half).rev().find(|i| reply.is_char_boundary(*i)).unwrap_or(0);
        let partial = &reply[..half];
        if !self.mock.delay.is_zero() && !sleep_unless_cancelled(self.mock.delay / 2, &self.cancel).await {
            return self.result("", StopReason::Aborted);
        }
        if !partial.is_empty() && self.context.is_progress_observed() {
            self.context.progress(ProgressUpdate::MessageChunk { text: partial.to_owned() });
        }
        if let Some(result) = self.strike(FaultStage::MidRun, partial).await {
            return result;
        }
        if !self.mock.delay.is_zero() && !sleep_unless_cancelled(self.mock.delay / 2, &self.cancel).await {
            return self.result(partial, StopReason::Aborted);
        }
        self.result(&reply, self.mock.stop_reason)
    }

    async fn next_message(&self) -> Option<String> {
        loop {
            let arrived = self.arrived.notified();
            if let Some(message) = self.inbox.borrow_mut().pop_front() {
                return Some(message);
            }
            tokio::select! {
                _ = arrived => {}
                _ = self.cancel.cancelled() => return None,
            }
        }
    }
}

impl Child for MockChild {
    fn id(&self) -> String {
        self.0.id()
    }

    fn run(&self) -> LocalBoxFuture<'static, RunResult> {
        let state = self.0.clone();
        Box::pin(async move {
            let result = state.work().await;
            state.mock.shared.record(|| MockEvent::Finished(state.id(), result.stop_reason));
            result
        })
    }

    fn cancel(&self) {
        self.0.mock.shared.record(|| MockEvent::Cancelled(self.0.id()));
    }

    fn supports_steering(&self) -> bool {
        true
    }

    fn send_message(&self, message: Vec<ContentBlock>) -> LocalBoxFuture<'static, Result<(), SteeringError>> {
        let state = self.0.clone();
        Box::pin(async move {
            let text = crate::seam::text_of(&message);
            state.mock.shared.record(|| MockEvent::Steered(state.id(), text.clone()));
            state.inbox.borrow_mut().push_back(text);
            state.arrived.notify_one();
            Ok(())
        })
    }

    fn dispose(&self) -> LocalBoxFuture<'static, Result<(), Failure>> {
        let fault = self.0.mock.fault_at(FaultStage::OnDispose, self.0.number);
        if fault.is_none() && self.0.mock.shared.recording.is_none() {
            // Zero-sized: boxing it allocates nothing.
            return Box::pin(NothingToRelease);
        }
        let state = self.0.clone();
        Box::pin(async move {
            state.mock.shared.record(|| MockEvent::Disposed(state.id()));
            match fault {
                None => Ok(()),
                Some(Fault::Error) => Err(Failure::new(Stage::Dispose, Category::ChildError)),
                Some(Fault::Crash) => Err(Failure::new(Stage::Dispose, Category::ChildCrashed)),
                Some(Fault::Panic) => panic!("mock fault: panic on dispose"),
                Some(Fault::Hang) => std::future::pending().await,
                Some(Fault::Delay(delay)) => {
                    tokio::time::sleep(delay).await;
                    Ok(())
                }
            }
        })
    }
}
