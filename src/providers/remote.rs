//! `remote`: runs execute on `subagents worker` processes, on this machine
//! or others, through a NATS JetStream broker.
//!
//! **Choose it** to fan a batch out over more machines than one, or to
//! keep runs alive across the loss of a machine: a run exists durably on
//! the broker before `start` returns, and a worker that dies or freezes
//! loses nothing (its runs go to another worker).
//!
//! **Advertises** what the workers' provider enforces, as configured in
//! [`RemoteConfig::capabilities`] (default: every start-time capability
//! but `mcp_servers`, which the wire does not carry — a worker's children
//! mount its own providers' servers — which is what a `spawn` worker enforces; a `--provider process` worker
//! enforces only `agent_options`). The request carries the prompt, route
//! (`agent_options`), persona, tool filter, output schema, `max_depth`,
//! the parent's session and depth (the worker's child gets depth + 1 and
//! that lineage in its session header), the label, and what is left of the
//! run's delegation budget (the worker opens it for the run's subtree; its
//! deadline counts from when a worker starts the run). A capability the
//! config does not advertise is rejected at `start`; one the worker's
//! provider turns out not to enforce settles the run `Error` (stage
//! `initialize`, the worker's refusal as the reason), never silently.
//! The worker's child session id comes back as
//! [`RunResult::child_session`](crate::RunResult::child_session).
//! The child's working directory is the worker's (a caller's path means
//! nothing on another host).
//!
//! # How a run travels
//!
//! ```text
//! caller                         broker (JetStream)                        worker
//! start ── publish, msg id = run ─▶ stream p-runs, subject p.run.<pool> ── pull ──▶ claim state.<run>
//!   ◀── stored (PubAck): start returns                                       run the child locally
//!                                                  ◀── in-progress acks, progress on p.progress.<caller>
//!   ◀── p.result.<caller> ◀── state.<run> = settled (compare-and-set on the claim) ◀── child disposed
//!                                                  ◀── ack (the request leaves the work queue)
//! ```
//!
//! See [`BrokerSettings`] for every name on the broker.
//!
//! **Approvals**: a run whose route reaches an approver says so in its
//! request; its worker's subtree then asks this caller for permission by
//! core NATS request-reply on `<prefix>.approval.<caller>`, and the run's
//! approvals answer with the worker's path under the run's (module
//! `caller/asking.rs`). A caller that is gone is a reject on the worker at
//! once; a silent broker leaves the asker to its own timeout.
//!
//! # Guarantees and how they are kept
//!
//! - **Durable before `start` returns**: `start` waits for JetStream's
//!   acknowledgement; the run id is the message id, so a retried publish is
//!   deduplicated. No acknowledgement within `publish_timeout`:
//!   `STARTUP_FAILED`, after a tombstone makes sure a request stored
//!   without its ack never runs.
//! - **Exactly one result per run**: a worker claims the run's state key
//!   with the delivery attempt JetStream gave it, and writes the result by
//!   compare-and-set on its own claim. A worker frozen past the ack wait
//!   finds its claim superseded by the redelivery: its late result cannot
//!   be written (it is *fenced*), and it cancels its child. The caller
//!   settles on the first result it sees; there is only one to see.
//! - **Killed workers**: no in-progress ack, so after the ack wait the run
//!   is redelivered to another worker. After `max_deliver` deliveries the
//!   broker gives up (it notices when a worker of the pool next asks for
//!   work); the caller hears JetStream's advisory and settles the run
//!   `Error` with category `worker-lost` (written the same compare-and-set
//!   way, so a worker that wakes later is still fenced), and removes the
//!   request.
//! - **Cancel**: a tombstone (`cancel.<run>`, durable) plus a core-NATS
//!   notice to the worker. A run cancelled before pickup never runs: the
//!   worker that picks it up claims it, sees the tombstone and settles it
//!   `aborted`. Mid-run the worker cancels its child and reports it
//!   aborted. `dispose` waits for the worker's result, which it writes
//!   only after its child is disposed: `dispose_wait` at a time, and on
//!   while the worker holding the run answers the pool's status request
//!   (a slow worker is not a lost one; at most a minute, and the runtime's
//!   dispose timeout bounds the hook too); a run never claimed disposes at
//!   once; a claimed run whose worker vanished is reported after
//!   `dispose_wait` and one unanswered status request (1 s)
//!   (`DISPOSE_FAILED`, category `worker-lost`), not waited on.
//! - **Dead callers**: the caller refreshes its lease (a key with a TTL)
//!   three times per TTL; a worker cancels runs whose caller's lease
//!   expired, judged only after it has itself been connected for a whole
//!   TTL, so a broker outage does not look like a dead caller.
//! - **Bounded waits**: runs waiting on a broker that answers nothing for
//!   [`RemoteConfig::broker_patience`] fail `broker-unreachable`, runs of a
//!   pool where no worker answers status requests for
//!   [`RemoteConfig::worker_patience`] fail `no-worker` (each tombstoned so
//!   no worker runs it later); a warning says what they wait for meanwhile.
//!   The bounds are the batch's, not each run's: the pool's silence counts
//!   from its first unanswered status request, and once a bound is reached
//!   every start fails at once with the same reason, before anything is
//!   sent, until the broker or a worker answers again (module `health`).
//!   A budget deadline is enforced here as well as on the worker. A run a
//!   worker stopped because this caller's lease expired says so
//!   (`lease-expired`); a lease that may have lapsed is written again
//!   before the next publish, and workers keep only live lease verdicts.
//! - **Detached runs outlive their caller, for a bound**: a start with
//!   [`StartRequest::detached`](crate::StartRequest::detached) names its
//!   run ([`Detached::Start`](crate::seam::Detached::Start)); the caller writes
//!   the run's holder (`detached.<run>`, itself) before the request, and
//!   the request's stream sequence into it once stored. A worker keeps such
//!   a run going while its caller's lease stands, or that of the caller
//!   that holds it now, and for [`RemoteConfig::detached_ttl`] with
//!   neither; then it stops it `lease-expired`. Its result is stored like
//!   any other (kept for `retention`) and announced to its caller and its
//!   holder. [`Detached::Attach`](crate::seam::Detached::Attach) from any caller
//!   finds it: a stored result settles the new run at once; a run claimed
//!   or queued gets this caller as its holder (its result and progress come
//!   here from then on, and the sweep finds a result announced before);
//!   a run without a holder is `RunUnknown`, and so is one whose publish
//!   was never acknowledged (it is tombstoned first, so it never runs).
//! - **Broker restarts**: stream, consumer and buckets are file-backed;
//!   both sides reconnect, retry their writes, and the caller sweeps the
//!   runs bucket for results announced while it was away.
//!
//! # Where this departs from the architecture sketch, and why
//!
//! - Results are announced on core NATS and, as a fallback, looked up in
//!   the runs bucket by a backing-off sweep, rather than watched: a KV
//!   watch is an ephemeral ordered consumer, lost with a broker restart
//!   and rebuilt only after missed heartbeats, while a lookup just works
//!   once the broker is back.
//! - Dispose needs no request/reply: the worker writes a run's result only
//!   after it released the child, so the stored result is the receipt,
//!   durable and readable by a caller that reconnected. It carries the
//!   worker's local run and that run's tree (`runs`), which the run's
//!   cancellation receipt lists under it; a result without it (an older
//!   worker, or the caller's own `worker-lost` result) leaves that branch
//!   unknown.
//! - Fencing is a compare-and-set on the worker's own claim, not a
//!   comparison of attempts at the caller: a fenced result is never
//!   written, so no caller can see it, not even after a restart.
//!
//! # Wire format
//!
//! Versioned JSON (`"v": 1`), at most 1 MiB per message; a malformed,
//! oversized or foreign-version message is dropped with a warning, on
//! either side, and never crashes anything.
//!
//! | where | message |
//! |---|---|
//! | stream, `p.run.<pool>` | `{v, run, caller, prompt: [content blocks], parent: {session?, depth}, label?, persona?, tool_filter?, output_schema?, max_depth?, agent_options?, budget?, detach_ttl_ms?}` |
//! | KV `state.<run>` | `{state: "claimed", v, attempt, worker}` or `{state: "settled", v, run, attempt, worker?, result: RunResult, disposed, runs?: [Branch]}` |
//! | KV `cancel.<run>` | `{v, run}` |
//! | KV `detached.<run>` | `{v, run, caller, stream_seq}` (a detached run's holder; `stream_seq` 0 until stored) |
//! | KV `<caller>` in `p-callers` | `{v, caller}` (its age is the lease) |
//! | `p.cancel.<run>` | `{v, run}` |
//! | `p.result.<caller>` | the settled record, as stored |
//! | `p.progress.<caller>` | `{v, run, attempt, update: {type: message_chunk \| tool_call \| plan, …}}`, each at most 16 KiB |
//! | `p.status.<pool>` (request) | reply `{v, worker, pool, live, draining}` from every worker |
//!
//! # Limits
//!
//! - Progress is best effort (core NATS): lost while disconnected, and
//!   dropped when a run's buffer is full.
//! - Steering and continuation are not offered across the wire.
//! - A detached run's orphan clock is the worker's own: a redelivery
//!   starts it again, so a run without a caller may live up to
//!   `max_deliver` times `detached_ttl`. A worker older than detached runs
//!   ignores `detach_ttl_ms` and stops the run with its caller's lease.
//!   Never reuse a run id: within the duplicate window a second start
//!   under it is dropped as a duplicate, and after it the stored state of
//!   the first would answer for the second.
//! - An attach made while a worker claims a run whose publish was never
//!   acknowledged tombstones it; if the claim won by a hair, the run may
//!   have begun before the worker sees the tombstone and stops it.
//! - A max-deliveries advisory missed while the caller was disconnected
//!   leaves that run unsettled until the caller's own deadline (the request
//!   stays in the stream, inert).
//! - Settings are the broker's: the first party to create the stream, a
//!   consumer or a bucket sets them (see [`BrokerSettings`]).
//!
//! # More than one host
//!
//! Nothing here assumes one machine: point every worker and caller at the
//! same NATS URL (a cluster's, with [`BrokerSettings::replicas`] raised so
//! the stream, consumers and buckets survive the loss of a node). Lease
//! TTLs and ack waits are measured by the broker, not by the hosts' clocks.
//! Give each class of worker (model, provider, hardware) its own pool. A
//! worker's home and working directory are its own; results carry its
//! session id, not its files. Anyone who can publish on `p.run.*` can run
//! work on your workers and anyone who can read `p.result.*` sees results:
//! off a trusted loopback, give the broker accounts and TLS (a `tls://`
//! URL, credentials in it) and let only callers and workers in.
//!
//! ```no_run
//! use subagents::providers::{RemoteConfig, RemoteProvider};
//! use subagents::{CancellationToken, Parent, Runtime, StartRequest};
//!
//! // `nats-server -js` runs, and `subagents worker --nats nats://127.0.0.1:4222` too.
//! let provider = RemoteProvider::connect(RemoteConfig::new("remote", "nats://127.0.0.1:4222")).unwrap();
//! let runtime = Runtime::builder().build().unwrap();
//! let subagents = runtime.subagents();
//! subagents.register_provider(provider).unwrap().keep();
//! let text = runtime.block_on(async move {
//!     let request = StartRequest::new("summarise the log", Parent::root("/tmp"), CancellationToken::new());
//!     let run = subagents.start("remote", request).await.unwrap();
//!     let result = run.result().await.unwrap();
//!     run.dispose().await.unwrap();
//!     result.text()
//! });
//! runtime.shutdown_blocking();
//! ```

pub(crate) mod caller;
mod child;
mod health;

use std::fmt;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use futures_util::future::LocalBoxFuture;

use self::caller::Caller;
use self::child::Timing;
use self::health::Patience;
use crate::agent::ids;
use crate::seam::{Capabilities, Child, Launch, LaunchError, Provider};
use crate::wire::remote::broker;
pub use crate::wire::remote::broker::BrokerSettings;

/// Configuration of a [`RemoteProvider`].
#[derive(Clone, Debug)]
pub struct RemoteConfig {
    /// Registry name (default `remote`).
    pub name: String,
    /// The NATS server, e.g. `nats://127.0.0.1:4222`.
    pub url: String,
    /// The pool of workers that runs this provider's runs (default `default`).
    pub pool: String,
    /// What the pool's workers enforce (default: everything, as a `spawn`
    /// worker does).
    pub capabilities: Capabilities,
    /// Broker layout and timing (used if this side creates them).
    pub broker: BrokerSettings,
    /// Bound on connecting and binding the broker at [`RemoteProvider::connect`] (5 s).
    pub connect_timeout: Duration,
    /// How long `start` keeps trying to get a run stored (10 s).
    pub publish_timeout: Duration,
    /// How long `dispose` waits for a live run's worker to report its
    /// child disposed before it asks whether that worker still answers (5 s;
    /// keep it under the runtime's dispose timeout). While it answers, the
    /// dispose waits on (up to a minute); a silent one is reported lost.
    pub dispose_wait: Duration,
    /// How often unsettled runs are looked up on the broker, in case their
    /// result was announced while this side was away (1 s).
    pub result_sweep: Duration,
    /// How long runs wait on a broker that answers nothing (the
    /// connection is down, or every write fails) before they fail `Error`
    /// with category `broker-unreachable` (60 s). Starts fail at once
    /// while it has been down that long; every write of a start gives up
    /// when it is reached.
    pub broker_patience: Duration,
    /// How long runs wait while no worker of the pool answers before they
    /// fail `Error` with category `no-worker` (60 s), counted from when the
    /// pool fell silent, whenever each run was sent; starts fail at once
    /// while it has been silent that long. Runs queued behind busy workers
    /// do not count: a busy worker still answers.
    pub worker_patience: Duration,
    /// How long a detached run ([`StartRequest::detached`]) is kept going
    /// once no caller holds it (its caller's lease expired and no caller
    /// attached since), before its worker stops it as `lease-expired`
    /// (10 min). Its result is kept for `broker.retention` either way.
    ///
    /// [`StartRequest::detached`]: crate::StartRequest::detached
    pub detached_ttl: Duration,
}

impl RemoteConfig {
    /// Defaults for provider `name` on the broker at `url`.
    pub fn new(name: impl Into<String>, url: impl Into<String>) -> Self {
        RemoteConfig {
            name: name.into(),
            url: url.into(),
            pool: "default".to_owned(),
            capabilities: RemoteProvider::DEFAULT_CAPABILITIES,
            broker: BrokerSettings::default(),
            connect_timeout: Duration::from_secs(5),
            publish_timeout: Duration::from_secs(10),
            dispose_wait: Duration::from_secs(5),
            result_sweep: Duration::from_secs(1),
            broker_patience: Duration::from_secs(60),
            worker_patience: Duration::from_secs(60),
            detached_ttl: Duration::from_secs(600),
        }
    }

    /// The same, for another pool.
    pub fn with_pool(mut self, pool: impl Into<String>) -> Self {
        self.pool = pool.into();
        self
    }
}

/// Why a [`RemoteProvider`] could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// The pool's name cannot name the broker's subjects and streams.
    #[error("remote provider: pool {0:?} must be 1 to 64 letters, digits, '_' or '-'")]
    PoolName(String),
    /// Its I/O thread could not start.
    #[error("remote provider: cannot start its I/O thread: {0}")]
    Io(#[source] std::io::Error),
    /// Its I/O thread stopped before setup ended.
    #[error("remote provider: its I/O thread stopped during setup")]
    Stopped,
    /// The broker could not be reached, or its stream, consumers or
    /// buckets could not be created or bound: the broker's words.
    #[error("remote provider: {0}")]
    Broker(String),
}

/// The `remote` provider: the caller's side of distributed fan-out.
///
/// It owns a small I/O runtime (one thread) for its broker connection and
/// background tasks, so nothing of NATS runs on the actor threads.
pub struct RemoteProvider {
    config: RemoteConfig,
    caller: Arc<Caller>,
    io: IoRuntime,
}

impl RemoteProvider {
    /// What a remote provider advertises unless its config says otherwise:
    /// everything a worker's spawn child enforces, but `mcp_servers` (the
    /// wire carries no server names: a worker mounts its own).
    pub const DEFAULT_CAPABILITIES: Capabilities = Capabilities { mcp_servers: false, ..Capabilities::all() };

    /// Connects to the broker, creates or binds the stream, the pool's
    /// consumer settings and the buckets, takes a lease and starts
    /// listening. Blocks the calling thread up to `connect_timeout` (call it
    /// before entering async code, or from `spawn_blocking`).
    pub fn connect(config: RemoteConfig) -> Result<RemoteProvider, RemoteError> {
        broker::check_name("pool", &config.pool).map_err(|_| RemoteError::PoolName(config.pool.clone()))?;
        let io = IoRuntime::new().map_err(RemoteError::Io)?;
        let caller_id = ids::caller_id();
        // The connection's event callback exists before the caller does.
        let caller_cell: Arc<OnceLock<Weak<Caller>>> = Arc::default();
        let (sender, received) = std::sync::mpsc::channel();
        let setup = {
            let (config, caller_cell, caller_id) = (config.clone(), caller_cell.clone(), caller_id.clone());
            async move {
                let on_event = move |event: async_nats::Event| {
                    let Some(caller) = caller_cell.get().and_then(Weak::upgrade) else { return };
                    match event {
                        async_nats::Event::Connected => caller.reconnected(),
                        async_nats::Event::Disconnected => caller.disconnected(),
                        _ => {}
                    }
                };
                let broker =
                    broker::connect(&config.url, &caller_id, &config.broker, config.connect_timeout, on_event).await?;
                let patience = Patience { broker: config.broker_patience, worker: config.worker_patience };
                let caller = Arc::new(Caller::new(
                    broker,
                    caller_id,
                    config.pool.clone(),
                    (config.name.clone(), config.url.clone()),
                    config.result_sweep,
                    patience,
                ));
                caller.start_tasks().await?;
                Ok::<_, String>(caller)
            }
        };
        io.handle().spawn(async move {
            let _ = sender.send(setup.await);
        });
        let caller = received.recv().map_err(|_| RemoteError::Stopped)?.map_err(RemoteError::Broker)?;
        let _ = caller_cell.set(Arc::downgrade(&caller));
        Ok(RemoteProvider { config, caller, io })
    }

    /// This caller's id: its lease key, and the token of its result and
    /// progress subjects.
    pub fn caller_id(&self) -> &str {
        &self.caller.id
    }

    /// The lease TTL in force (the callers bucket's max age).
    pub fn lease_ttl(&self) -> Duration {
        self.caller.broker.lease_ttl
    }
}

impl fmt::Debug for RemoteProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteProvider")
            .field("name", &self.config.name)
            .field("url", &self.config.url)
            .field("pool", &self.config.pool)
            .field("caller", &self.caller.id)
            .finish_non_exhaustive()
    }
}

impl Provider for RemoteProvider {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn runs_out_of_process(&self) -> bool {
        true
    }

    fn offers_detached(&self) -> bool {
        true
    }

    fn capabilities(&self) -> Capabilities {
        self.config.capabilities
    }

    fn launch(&self, launch: Launch) -> LocalBoxFuture<'static, Result<Box<dyn Child>, LaunchError>> {
        let timing = Timing {
            publish_timeout: self.config.publish_timeout,
            dispose_wait: self.config.dispose_wait,
            detached_ttl: self.config.detached_ttl,
        };
        Box::pin(child::launch(self.caller.clone(), self.io.handle(), timing, launch))
    }

    /// Stops listening and deletes the lease (every run was disposed by
    /// now, so there is nothing left for workers to keep).
    fn shutdown(&self) -> LocalBoxFuture<'static, ()> {
        let caller = self.caller.clone();
        let done = self.io.handle().spawn(async move {
            caller.stop.cancel();
            caller.release_lease().await;
        });
        Box::pin(async move {
            let _ = done.await;
        })
    }
}

impl Drop for RemoteProvider {
    fn drop(&mut self) {
        self.caller.stop.cancel();
    }
}

/// The provider's own tokio runtime: one thread for the NATS connection
/// and background tasks. Shut down in the background when dropped, so a
/// drop inside async code never blocks or panics.
struct IoRuntime(Option<tokio::runtime::Runtime>);

impl IoRuntime {
    fn new() -> std::io::Result<IoRuntime> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("subagents-remote")
            .enable_all()
            .build()?;
        Ok(IoRuntime(Some(runtime)))
    }

    fn handle(&self) -> tokio::runtime::Handle {
        self.0.as_ref().expect("present until dropped").handle().clone()
    }
}

impl Drop for IoRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}
