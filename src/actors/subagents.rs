//! `Subagents`: the handle callers use to register providers, start runs
//! and observe events.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use actix::Addr;

use super::core::Core;
use super::registry::{self, Registration, RegistryActor};
use super::run_handle::Run;
use crate::events::{EventStream, ListenerHandle, ListenerOutcome, SubagentEvent};
use crate::live::Live;
use crate::seam::{Provider, ProviderInfo, RegisterError, RunResult, StartError, StartRequest, SubagentError};

/// A `Clone + Send + Sync` handle on a runtime's registry, usable from any
/// thread or async runtime.
///
/// ```
/// use futures_util::StreamExt;
/// use subagents::providers::MockProvider;
/// use subagents::{CancellationToken, Parent, Runtime, StartRequest};
///
/// let runtime = Runtime::builder().build().unwrap();
/// let subagents = runtime.subagents();
/// subagents.register_provider(MockProvider::new("mock").with_echo_prompt()).unwrap().keep();
/// assert_eq!(subagents.provider_names(), ["mock"]);
///
/// let answers = runtime.block_on(async move {
///     // Ten requests, at most three children at once, each disposed.
///     let requests = (0..10).map(|n| StartRequest::new(format!("task {n}"), Parent::root("/tmp"), CancellationToken::new()));
///     subagents.fan_out("mock", requests, 3).map(|(_, result)| result.unwrap().text()).collect::<Vec<_>>().await
/// });
/// assert_eq!(answers.len(), 10);
/// runtime.shutdown_blocking();
/// ```
#[derive(Clone)]
pub struct Subagents {
    core: Arc<Core>,
    registry: Addr<RegistryActor>,
}

impl Subagents {
    pub(crate) fn new(core: Arc<Core>, registry: Addr<RegistryActor>) -> Self {
        Subagents { core, registry }
    }

    /// Register a provider under its name. A duplicate name fails with
    /// `DUPLICATE_PROVIDER` and leaves the first registration untouched.
    pub fn register_provider(&self, provider: impl Provider) -> Result<Registration, RegisterError> {
        self.register_shared(Arc::new(provider))
    }

    /// Register a provider the caller also keeps a handle on.
    pub fn register_shared(&self, provider: Arc<dyn Provider>) -> Result<Registration, RegisterError> {
        registry::register(&self.core, &self.registry, provider)
    }

    /// Installs the approver that permission requests climb to when their
    /// run's parent brings no route of its own (a door does this: a
    /// terminal, a policy; see [`Approvals`](crate::seam::Approvals)).
    /// Runs started from now on use it; a run already started keeps the
    /// route it was started with.
    pub fn set_approver(&self, approver: Arc<dyn crate::seam::Approver>) {
        self.core.set_approvals(crate::seam::Approvals::new(approver));
    }

    /// What a registered provider advertises.
    pub fn provider(&self, name: &str) -> Option<ProviderInfo> {
        self.core.provider(name).map(|entry| entry.info.clone())
    }

    /// Whether a provider of this name is registered right now.
    pub fn has_provider(&self, name: &str) -> bool {
        self.core.provider(name).is_some()
    }

    /// Which registration answers to `name` (a number never given to
    /// another), if any.
    #[cfg(feature = "agent")]
    pub(crate) fn provider_key(&self, name: &str) -> Option<u64> {
        self.core.provider_key(name)
    }

    /// Registered provider names, in insertion order.
    pub fn provider_names(&self) -> Vec<String> {
        self.core.provider_names()
    }

    /// The registered provider whose name is nearest `name`, for a "did
    /// you mean" after a slip of the keyboard: at most a third of its
    /// letters apart (two at most), the first of the nearest.
    pub fn nearest_provider(&self, name: &str) -> Option<String> {
        let names = self.core.provider_names();
        nearest(name, names.iter().map(String::as_str)).map(str::to_owned)
    }

    /// Tracks the runs started under `session`, a session that is not a
    /// run of this runtime (the served session of `subagents serve`), for
    /// its receipt. Stops tracking when dropped.
    #[cfg(feature = "process")]
    pub(crate) fn lineage_scope(&self, session: &str) -> LineageScope {
        LineageScope::open(self.core.clone(), session)
    }

    /// How many worker threads host runs.
    #[cfg(feature = "batch")]
    pub(crate) fn worker_count(&self) -> usize {
        self.core.worker_count()
    }

    /// Runs `future` on worker `n` (modulo their number) from wherever the
    /// caller is; `None` when the runtime stopped before it finished.
    /// Dropping the returned future does not stop `future`: make it
    /// abortable when it must end with its caller.
    #[cfg(feature = "batch")]
    pub(crate) async fn on_worker<F>(&self, n: usize, future: F) -> Option<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let (reply, outcome) = tokio::sync::oneshot::channel();
        let spawned = self.core.spawn_on(n, future, move |output| {
            let _ = reply.send(output);
        });
        if !spawned {
            return None;
        }
        outcome.await.ok()
    }

    /// Start a child on provider `name`.
    ///
    /// Checks, in order, before any child exists: the provider is registered
    /// (`NO_PROVIDER`); every requested start-time capability is advertised
    /// (`UNSUPPORTED_CAPABILITY`, first unmet in the order output_schema,
    /// depth_limit, tool_filter, persona, agent_options); request values are
    /// sane (`INVALID_REQUEST`); the output schema is inside the subset
    /// (`UNSUPPORTED_SCHEMA`); the signal is not cancelled (`ABORTED`); the
    /// delegation budgets of the parent and the request have room
    /// (`BUDGET_EXHAUSTED`, see [`Budget`](crate::Budget)). Then it waits
    /// until the provider has published a real child, emits `Start`, and
    /// hands the caller the [`Run`].
    pub fn start<'a>(
        &'a self,
        name: &'a str,
        request: StartRequest,
    ) -> impl Future<Output = Result<Run, StartError>> + Send + 'a {
        // The request is boxed before the future exists: a fan-out holds
        // thousands of these futures, and each would carry the request.
        let mut request = Box::new(request);
        // The run's span is created on the runtime's thread, not in the
        // caller's span: it names the caller's as its parent explicitly.
        if request.trace_parent.is_none() {
            request.trace_parent = crate::telemetry::current_trace();
        }
        async move { super::start::start(&self.core, name, request).await }
    }

    /// Every event from now on.
    pub fn subscribe(&self) -> EventStream {
        self.core.bus().subscribe()
    }

    /// Starts a run on `name`, waits for its result and disposes it, on
    /// every path: a refused start, a failed run, or this future dropped
    /// half-way (the [`Run`] disposes itself when dropped). The run's
    /// result; a dispose that fails after it is logged (`tracing`), since
    /// the result is what the caller came for and the runtime contains
    /// what the dispose left.
    pub async fn run_to_end(&self, name: &str, request: StartRequest) -> Result<RunResult, SubagentError> {
        let run = self.start(name, request).await?;
        let result = run.result().await;
        if let Err(error) = run.dispose().await {
            tracing::warn!(provider = name, run = run.run_id(), %error, "a run's dispose failed after its result");
        }
        result
    }

    /// Runs every request on `name` to its end ([`run_to_end`](Self::run_to_end)),
    /// at most `concurrency` at once: the next starts when one ends, so a
    /// thousand requests never ask the provider for more than `concurrency`
    /// children (a [`Budget`](crate::Budget)'s width refuses instead of
    /// waiting). Each result with the index of its request, as they end.
    pub fn fan_out<'a, I>(
        &'a self,
        name: &'a str,
        requests: I,
        concurrency: usize,
    ) -> impl futures_util::Stream<Item = (usize, Result<RunResult, SubagentError>)> + Send + 'a
    where
        I: IntoIterator<Item = StartRequest>,
        I::IntoIter: Send + 'a,
    {
        use futures_util::StreamExt;
        futures_util::stream::iter(requests.into_iter().enumerate())
            .map(move |(index, request)| async move { (index, self.run_to_end(name, request).await) })
            .buffer_unordered(concurrency.max(1))
    }

    /// Call `listener` for every event, on the runtime's events thread, until
    /// the handle is dropped. A panic or an `Err` is logged and contained.
    /// Events arrive in order and in batches: a listener hears of an event
    /// at most about a millisecond after it happened, which keeps a busy
    /// runtime from waking the events thread once per event.
    pub fn add_listener<F, R>(&self, listener: F) -> ListenerHandle
    where
        F: Fn(&SubagentEvent) -> R + Send + 'static,
        R: ListenerOutcome,
    {
        self.core.bus().add_listener(self.core.events_thread(), listener)
    }

    /// Live runs, actors and child processes right now.
    pub fn live(&self) -> Live {
        self.core.live().snapshot()
    }
}

impl fmt::Debug for Subagents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subagents").field("providers", &self.provider_names()).finish()
    }
}

#[cfg(feature = "process")]
pub(crate) use scope::LineageScope;

#[cfg(feature = "process")]
mod scope {
    use std::sync::Arc;

    use super::super::core::Core;
    use super::super::lineage;
    use super::super::run_shared::Family;
    use crate::seam::Branch;

    /// The runs started under a session that is not itself a run: a family of
    /// its own, closed on drop.
    pub(crate) struct LineageScope {
        core: Arc<Core>,
        family: Arc<Family>,
    }

    impl LineageScope {
        pub(crate) fn open(core: Arc<Core>, session: &str) -> LineageScope {
            let family = core.open_family(session);
            LineageScope { core, family }
        }

        /// The branches of every run started under the session so far, each
        /// once it is quiescent.
        pub(crate) async fn branches(&self) -> Vec<Branch> {
            lineage::branches(&self.family, lineage::deadline()).await
        }
    }

    impl Drop for LineageScope {
        fn drop(&mut self) {
            self.core.close_family(&self.family);
        }
    }
}

/// The candidate nearest `name` by edit distance (insertions, deletions,
/// substitutions of characters), when it is close enough to be a slip:
/// at most a third of `name`'s length (rounded up) and at most two. Long names are not
/// compared (a slip is short): the work stays small on hostile input.
pub(crate) fn nearest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    const LONGEST: usize = 64;
    let name: Vec<char> = name.chars().take(LONGEST + 1).collect();
    if name.len() > LONGEST {
        return None;
    }
    let bound = name.len().div_ceil(3).clamp(1, 2);
    candidates
        .into_iter()
        .filter(|candidate| candidate.chars().count() <= LONGEST)
        .map(|candidate| (edit_distance(&name, candidate), candidate))
        .filter(|(distance, _)| *distance <= bound)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, candidate)| candidate)
}

/// Levenshtein's distance, one row at a time.
fn edit_distance(from: &[char], to: &str) -> usize {
    let to: Vec<char> = to.chars().collect();
    let mut row: Vec<usize> = (0..=to.len()).collect();
    for (i, a) in from.iter().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, b) in to.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1).min(row[j] + 1).min(diagonal + usize::from(a != b));
            diagonal = above;
        }
    }
    row[to.len()]
}

#[cfg(test)]
mod tests {
    use super::nearest;

    #[test]
    fn a_slip_finds_its_name_and_a_stranger_finds_none() {
        let names = ["codex", "claude", "spawn", "mock"];
        assert_eq!(nearest("codx", names), Some("codex"));
        assert_eq!(nearest("spwan", names), Some("spawn"));
        assert_eq!(nearest("claud", names), Some("claude"));
        assert_eq!(nearest("gemini", names), None);
        assert_eq!(nearest("m", names), None);
        assert_eq!(nearest(&"x".repeat(10_000), names), None);
    }
}
