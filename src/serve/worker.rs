//! `subagents worker`: the server side of the [`remote`] provider.
//!
//! A worker is a full runtime of its own (home, model, a local `spawn`
//! provider, or `process` to isolate each run in its own process) that
//! pulls run requests for its pool from the broker and runs each as a local
//! child. All workers of a pool share one durable pull consumer, so the
//! broker spreads runs over them and hands a dead worker's runs to the
//! others.
//!
//! For each delivery it: claims the run (`state.<run>`, with the delivery
//! attempt); skips it if it is settled already (acks it) or if a newer
//! delivery claimed it (leaves it); settles it `aborted` without running
//! it if a tombstone is there or no caller wants it (its caller's lease
//! expired; for a detached run, neither its caller nor the one that holds
//! it now has a lease, and has not for its detach TTL); else starts
//! the child (module `held`). While the child runs it sends in-progress acks
//! three times per ack wait, forwards progress, and checks that its claim
//! still stands, that no tombstone appeared and that a caller still wants
//! it (progress goes to whoever holds a detached run now). When
//! the child ends it disposes it, writes the result by compare-and-set on
//! its claim, announces it to the caller, and only then acks.
//!
//! Pulling is bounded by `--concurrency`: the worker asks the broker for
//! exactly as many runs as it has free slots, so it never holds a run it
//! has not started (whose ack wait would run out unattended).
//!
//! SIGTERM, SIGINT (Ctrl-C) or SIGHUP drains: the worker stops pulling and hands back any
//! run delivered after that (a nak: redelivered at once); live runs get
//! `drain_grace` to finish, then their children are cancelled and their
//! runs handed back the same way, within 5 s more; runs still held then
//! (the broker is gone) are left to be redelivered after their ack wait,
//! and the last flush waits at most 2 s. Then it exits 0.
//!
//! A run that fails while the home cannot be written has the worker probe
//! it (writing real bytes) and pause: it takes no runs, answers no status
//! request while it holds none, and probes again every 2 s. When the disk
//! or quota is full (`ENOSPC`, `EDQUOT`) the run is handed back to the
//! pool rather than failed (a nak, redelivered after 2 s: past this
//! worker's own open pull, so to a worker with room); any other cause
//! fails it with the OS's reason.
//!
//! A run whose caller answers permission requests is started with a route
//! to that caller (module `asking`): its subtree's requests travel through
//! the broker and the caller's answer comes back.
//!
//! A worker holds no state of its own beyond its home's sessions: kill it
//! and its runs go to another worker after the ack wait.
//!
//! A route of its configuration marked `shared = true` books its starts on
//! the broker (the `p-limits` bucket), so every worker on the route keeps
//! to its `rpm`, `tpm` and `max_concurrent` together (see
//! [`Limiter::share`](crate::agent::Limiter::share)).
//!
//! [`remote`]: crate::providers::remote

mod asking;
mod held;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::signals::StopSignals;
use super::ServeError;
use crate::agent::{ids, ModelSpec};
use crate::events::SubagentEvent;
use crate::tool::{register_delegating_spawn, TaskService};
use crate::wire::remote::broker::{self, Broker, BrokerSettings};
use crate::wire::remote::{self as wire, CancelNotice, ProgressNotice, StatusReply, MAX_PROGRESS_BYTES, VERSION};
use crate::{Runtime, Subagents};

/// How long one pull waits for runs before asking again.
const PULL_EXPIRY: Duration = Duration::from_secs(1);

/// Callers whose lease verdicts are cached before old ones are dropped.
const MAX_CACHED_LEASES: usize = 1024;

/// How long runs being handed back (after the drain grace) may take
/// before the worker leaves them to redelivery and exits.
const HAND_BACK_BOUND: Duration = Duration::from_secs(5);

/// How long a run handed back by a worker that cannot write its home waits
/// before it is delivered again: past this worker's open pull (at most
/// [`PULL_EXPIRY`]), so it goes to a worker with room, not straight back
/// here to be handed back again until its deliveries run out.
const PAUSED_REDELIVERY: Duration = PULL_EXPIRY.saturating_mul(2);

/// How often a worker that cannot write its home probes it again.
const HOME_PROBE_EVERY: Duration = Duration::from_secs(2);

/// How long the drain's last flush to the broker may take.
const FINAL_FLUSH_BOUND: Duration = Duration::from_secs(2);

/// Progress messages forwarded per run per second, at most.
const PROGRESS_PER_SECOND: u32 = 20;

/// Which local provider runs a worker's children.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerProvider {
    /// In-process children (`spawn`): cheap; every capability enforced.
    Spawn,
    /// Each run in its own `subagents serve` process: isolated; only
    /// `agent_options` enforced.
    Process,
}

/// What `subagents worker` is told.
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// The NATS server.
    pub nats_url: String,
    /// The pool whose runs this worker takes (default `default`).
    pub pool: String,
    /// Most runs held at once.
    pub concurrency: usize,
    /// The worker's home (sessions; `process` children's homes under it).
    pub home: PathBuf,
    /// `scripted`, `openai:NAME`, `openai-responses:NAME` or `anthropic:NAME`.
    pub model: String,
    /// The local provider.
    pub provider: WorkerProvider,
    /// Broker settings, used if this worker creates the stream, the
    /// pool's consumer or a bucket.
    pub broker: BrokerSettings,
    /// How long live runs may finish after SIGTERM before they are handed
    /// back (default 30 s).
    pub drain_grace: Duration,
    /// Bound on connecting to the broker (default 5 s).
    pub connect_timeout: Duration,
    /// Providers from a configuration file: every one registered, the
    /// runs on the first it offers (`provider` is then not used).
    #[cfg(feature = "config")]
    pub configured: Option<crate::config::Configured>,
}

impl WorkerOptions {
    /// Defaults for a worker of pool `default` on `nats_url`, at `home`.
    pub fn new(nats_url: impl Into<String>, home: impl Into<PathBuf>) -> Self {
        WorkerOptions {
            nats_url: nats_url.into(),
            pool: "default".to_owned(),
            concurrency: 16,
            home: home.into(),
            model: "scripted".to_owned(),
            provider: WorkerProvider::Spawn,
            broker: BrokerSettings::default(),
            drain_grace: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            #[cfg(feature = "config")]
            configured: None,
        }
    }
}

/// What a worker did before it exited.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkerReport {
    /// Its id (in claims, results and status replies).
    pub worker: String,
    /// Results it wrote.
    pub settled: u64,
    /// Runs it handed back: when draining, or when its disk was full.
    pub handed_back: u64,
    /// Runs it lost to a newer delivery (it was frozen or cut off).
    pub fenced: u64,
}

/// Runs a worker until SIGTERM, SIGINT or SIGHUP, then drains. `ready` is called
/// with the worker's id once it is pulling.
pub fn serve_worker(options: WorkerOptions, ready: impl FnOnce(&str)) -> Result<WorkerReport, ServeError> {
    broker::check_name("pool", &options.pool).map_err(ServeError::Options)?;
    let model = ModelSpec::parse(&options.model).and_then(|spec| spec.build())?;
    super::preflight::check_home(&options.home)?;
    let runtime = Runtime::builder()
        .home(&options.home)
        .cancel_grace(Duration::from_millis(500))
        .build()
        .map_err(ServeError::Runtime)?;
    let subagents = runtime.subagents();
    let provider = match register_provider(&subagents, &options, model) {
        Ok(provider) => provider,
        Err(error) => {
            runtime.shutdown_blocking();
            return Err(error);
        }
    };
    let io = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(ServeError::Runtime)?;
    let outcome = io.block_on(work(subagents, options, provider, ready));
    runtime.shutdown_blocking();
    outcome.map_err(ServeError::Broker)
}

fn register_provider(
    subagents: &Subagents,
    options: &WorkerOptions,
    model: Arc<dyn crate::agent::Model>,
) -> Result<Arc<str>, ServeError> {
    #[cfg(feature = "config")]
    if let Some(configured) = &options.configured {
        configured
            .register_blocking(subagents, &TaskService::new(), &options.home, model)
            .map_err(|e| ServeError::Options(e.to_string()))?;
        return Ok(configured.provider().into());
    }
    let registered = match options.provider {
        WorkerProvider::Spawn => {
            // Children can delegate further, in this worker, like the CLI's.
            register_delegating_spawn(subagents, &TaskService::new(), model).map(|()| "spawn")
        }
        WorkerProvider::Process => {
            let spec = ModelSpec::parse(&options.model)?;
            let provider = super::stdio::door_process_provider("process", options.home.join("children"), &spec)
                .map_err(|e| ServeError::Options(e.to_string()))?;
            subagents.register_provider(provider).map(|registration| {
                registration.keep();
                "process"
            })
        }
    };
    Ok(registered?.into())
}

/// Books the starts of every route marked `shared` on the broker's
/// schedule, with this worker as a member of its fleet.
#[cfg(feature = "config")]
async fn share_routes(broker: &Broker, config: &crate::config::Config, worker: &str) -> Result<(), String> {
    for route in config.routes().filter(|route| route.shared) {
        let schedule = crate::wire::remote::schedule::BrokerSchedule::bind(broker, &route.name, worker).await?;
        route.limiter().share(Arc::new(schedule));
        tracing::debug!(worker = %worker, route = %route.name, "the route's limits are shared through the broker");
    }
    Ok(())
}

/// What every held run of this worker shares.
pub(crate) struct Shared {
    broker: Broker,
    worker: String,
    pool: String,
    subagents: Subagents,
    provider: Arc<str>,
    cwd: PathBuf,
    /// A third of the consumer's ack wait: the in-progress ack and check pace.
    tick: Duration,
    /// Runs held now: run id → remote cancel.
    live: Mutex<HashMap<String, CancellationToken>>,
    /// Registry run id → where its progress goes.
    routes: Mutex<HashMap<u64, Route>>,
    /// Caller → when its lease was last found standing.
    leases: Mutex<HashMap<String, Instant>>,
    /// Since when the broker connection has been up, if it is (written by
    /// the connection's event callback).
    connected_since: Arc<Mutex<Option<Instant>>>,
    /// The worker's home, probed when a run fails.
    home: PathBuf,
    /// Why the worker stopped taking runs, while its home cannot be written.
    paused: Mutex<Option<String>>,
    /// Tripped by SIGTERM: stop pulling.
    drain: CancellationToken,
    /// Tripped when the drain grace ran out: hand back live runs.
    hand_back: CancellationToken,
    report: Mutex<WorkerReport>,
}

/// Why a worker cannot write its home (found by a probe after a failed run
/// or a child whose session could not be released).
pub(crate) struct Unwritable {
    /// The OS's reason.
    cause: String,
    /// The disk or the quota is full: the run goes back to the pool, for a
    /// worker with room, rather than failing for this worker's disk.
    full: bool,
}

/// [`check_home`](super::preflight::check_home) off the worker's only
/// thread: it writes a file, which on a busy disk takes milliseconds.
async fn probe_home(home: &std::path::Path) -> Result<(), super::ServeError> {
    let home = home.to_owned();
    match tokio::task::spawn_blocking(move || super::preflight::check_home(&home)).await {
        Ok(checked) => checked,
        // The probe panicked: no verdict on the home.
        Err(_) => Ok(()),
    }
}

struct Route {
    run: String,
    caller: String,
    attempt: u64,
    window: (Instant, u32),
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn live_count(&self) -> usize {
        lock(&self.live).len()
    }

    fn count(&self, what: impl FnOnce(&mut WorkerReport)) {
        what(&mut lock(&self.report));
    }

    /// Probes the home after a failed run (or a child whose session could
    /// not be released): a home that cannot be written fails every run at
    /// once, so the worker stops taking runs (its pool's other workers take
    /// them) until a probe succeeds again. `Some` says why, with the OS's
    /// reason.
    async fn home_unwritable(&self) -> Option<Unwritable> {
        let error = probe_home(&self.home).await.err()?;
        let full = super::preflight::out_of_space(&error);
        let super::ServeError::Home { source, .. } = error else { return None };
        let cause = source.to_string();
        let mut paused = lock(&self.paused);
        if paused.is_none() {
            tracing::error!(worker = %self.worker, %cause, home = %self.home.display(), "the worker cannot write its home: it stops taking runs until it can");
            *paused = Some(cause.clone());
        }
        Some(Unwritable { cause, full })
    }

    fn paused(&self) -> bool {
        lock(&self.paused).is_some()
    }

    /// Whether `caller`'s lease stands. An unanswered lookup, or a
    /// connection up for less than a lease TTL (the caller may not have
    /// had the chance to refresh), counts as alive. Only a live verdict is
    /// kept (for a tick): a caller back from a partition writes its lease
    /// again, and its next run must find it, not an old "dead".
    async fn caller_alive(&self, caller: &str) -> bool {
        let ttl = self.broker.lease_ttl;
        let settled_in = lock(&self.connected_since).is_some_and(|since| since.elapsed() >= ttl);
        if !settled_in {
            return true;
        }
        if let Some(checked) = lock(&self.leases).get(caller) {
            if checked.elapsed() < self.tick {
                return true;
            }
        }
        let looked = tokio::time::timeout(broker::OPERATION_TIMEOUT, self.broker.callers.get(caller)).await;
        let alive = !matches!(looked, Ok(Ok(None)));
        let mut leases = lock(&self.leases);
        if !alive {
            leases.remove(caller);
            return false;
        }
        if leases.len() >= MAX_CACHED_LEASES {
            // Callers come and go over a worker's life: keep only recent ones.
            leases.retain(|_, checked| checked.elapsed() < ttl);
        }
        leases.insert(caller.to_owned(), Instant::now());
        true
    }
}

async fn work(
    subagents: Subagents,
    options: WorkerOptions,
    provider: Arc<str>,
    ready: impl FnOnce(&str),
) -> Result<WorkerReport, String> {
    let worker = ids::worker_id();
    let connected_since: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let on_event = {
        let connected_since = connected_since.clone();
        move |event: async_nats::Event| match event {
            async_nats::Event::Connected => *lock(&connected_since) = Some(Instant::now()),
            async_nats::Event::Disconnected => *lock(&connected_since) = None,
            _ => {}
        }
    };
    let broker =
        broker::connect(&options.nats_url, &worker, &options.broker, options.connect_timeout, on_event).await?;
    lock(&connected_since).get_or_insert_with(Instant::now);
    #[cfg(feature = "config")]
    if let Some(configured) = &options.configured {
        share_routes(&broker, &configured.config, &worker).await?;
    }
    let consumer = broker::ensure_consumer(&broker, &options.pool, &options.broker).await?;
    let ack_wait = consumer.cached_info().config.ack_wait;
    let cwd = std::env::current_dir().map_err(|e| format!("no working directory: {e}"))?;
    let shared = Arc::new(Shared {
        tick: crate::wire::remote::renew_every(ack_wait),
        broker,
        worker: worker.clone(),
        pool: options.pool.clone(),
        subagents,
        provider,
        cwd,
        live: Mutex::default(),
        routes: Mutex::default(),
        leases: Mutex::default(),
        connected_since,
        home: options.home.clone(),
        paused: Mutex::new(None),
        drain: CancellationToken::new(),
        hand_back: CancellationToken::new(),
        report: Mutex::new(WorkerReport { worker: worker.clone(), ..WorkerReport::default() }),
    });
    listen(&shared).await?;
    watch_signals(shared.drain.clone());
    ready(&worker);
    tracing::debug!(worker = %worker, pool = %options.pool, "worker ready");
    let semaphore = Arc::new(Semaphore::new(options.concurrency.max(1)));
    let mut held = JoinSet::new();
    while !shared.drain.is_cancelled() {
        while held.try_join_next().is_some() {}
        if shared.paused() {
            tokio::select! {
                _ = shared.drain.cancelled() => break,
                _ = tokio::time::sleep(HOME_PROBE_EVERY) => {}
            }
            if probe_home(&shared.home).await.is_ok() {
                *lock(&shared.paused) = None;
                tracing::warn!(worker = %worker, "the worker's home can be written again: taking runs");
            }
            continue;
        }
        let first = tokio::select! {
            biased;
            _ = shared.drain.cancelled() => break,
            permit = semaphore.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
        };
        let wanted = (1 + semaphore.available_permits()).min(256);
        let pull = consumer.batch().max_messages(wanted).expires(PULL_EXPIRY).messages();
        let pulled = tokio::select! {
            biased;
            _ = shared.drain.cancelled() => break,
            pulled = tokio::time::timeout(broker::OPERATION_TIMEOUT, pull) => pulled,
        };
        let mut batch = match pulled.map_err(|_| "timed out".to_owned()).and_then(|p| p.map_err(|e| e.to_string())) {
            Ok(batch) => batch,
            Err(error) => {
                tracing::debug!(%error, "pull failed; retrying");
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            }
        };
        let mut first = Some(first);
        // A pull the broker never answers (it is gone) must not hold a drain.
        while let Some(message) = tokio::select! {
            biased;
            _ = shared.drain.cancelled() => None,
            message = batch.next() => message,
        } {
            // A broken pull (the connection dropped) ends this batch.
            let Ok(message) = message else { break };
            if shared.drain.is_cancelled() {
                // Delivered after SIGTERM: straight back to the pool.
                let _ = message.ack_with(async_nats::jetstream::AckKind::Nak(None)).await;
                continue;
            }
            if shared.paused() {
                // Delivered to a worker that cannot write its home: back to the pool.
                let _ = message.ack_with(async_nats::jetstream::AckKind::Nak(Some(PAUSED_REDELIVERY))).await;
                continue;
            }
            match first.take().or_else(|| semaphore.clone().try_acquire_owned().ok()) {
                Some(permit) => {
                    held.spawn(held::hold(shared.clone(), message, permit));
                }
                None => {
                    let _ = message.ack_with(async_nats::jetstream::AckKind::Nak(None)).await;
                }
            }
        }
    }
    tracing::info!(worker = %worker, live = shared.live_count(), "worker draining");
    let grace = tokio::time::sleep(options.drain_grace);
    tokio::pin!(grace);
    // Handing back needs the broker (a dispose, a result, a nak): without
    // it the runs are left to be redelivered after their ack wait.
    let hand_back_ends = tokio::time::sleep(Duration::MAX / 4);
    tokio::pin!(hand_back_ends);
    let mut abandoned = false;
    loop {
        tokio::select! {
            joined = held.join_next() => if joined.is_none() { break },
            _ = &mut grace, if !shared.hand_back.is_cancelled() => {
                shared.hand_back.cancel();
                hand_back_ends.as_mut().reset(tokio::time::Instant::now() + HAND_BACK_BOUND);
            }
            _ = &mut hand_back_ends, if !abandoned => {
                tracing::warn!(worker = %worker, left = held.len(), "runs not handed back in time (is the broker reachable?); left to be redelivered after their ack wait");
                held.abort_all();
                abandoned = true;
            }
        }
    }
    if tokio::time::timeout(FINAL_FLUSH_BOUND, shared.broker.client.flush()).await.is_err() {
        tracing::warn!(worker = %worker, "the broker took no final flush; exiting without it");
    }
    let report = lock(&shared.report).clone();
    tracing::info!(worker = %worker, ?report, "worker drained");
    Ok(report)
}

fn watch_signals(drain: CancellationToken) {
    let mut signals = StopSignals::register();
    tokio::spawn(async move {
        let signal = signals.recv().await;
        tracing::info!(signal, "stopped by a signal: draining");
        drain.cancel();
    });
}

/// Cancel notices, status requests and progress forwarding.
async fn listen(shared: &Arc<Shared>) -> Result<(), String> {
    let client = &shared.broker.client;
    let names = &shared.broker.names;
    let subscribe = |subject: String| async move {
        client.subscribe(subject.clone()).await.map_err(|e| format!("cannot subscribe to {subject}: {e}"))
    };
    let mut cancels = subscribe(names.cancel_subjects()).await?;
    let mut status = subscribe(names.status_subject(&shared.pool)).await?;
    let listening = shared.clone();
    tokio::spawn(async move {
        while let Some(message) = cancels.next().await {
            match wire::decode::<CancelNotice>(&message.payload) {
                Ok(notice) => {
                    if let Some(cancel) = lock(&listening.live).get(&notice.run) {
                        cancel.cancel();
                    }
                }
                Err(error) => tracing::warn!(%error, "dropped a malformed cancel notice"),
            }
        }
    });
    let answering = shared.clone();
    tokio::spawn(async move {
        while let Some(message) = status.next().await {
            let Some(reply) = message.reply else { continue };
            // Paused with nothing held, it is no worker for the pool: its
            // callers' runs wait for another, or fail `no-worker` in time.
            if answering.paused() && answering.live_count() == 0 {
                continue;
            }
            let status = StatusReply {
                v: VERSION,
                worker: answering.worker.clone(),
                pool: answering.pool.clone(),
                live: answering.live_count(),
                draining: answering.drain.is_cancelled(),
            };
            if let Ok(bytes) = wire::encode(&status, wire::MAX_MESSAGE_BYTES) {
                let _ = answering.broker.client.publish(reply, bytes.into()).await;
            }
        }
    });
    let mut events = shared.subagents.subscribe();
    let forwarding = shared.clone();
    tokio::spawn(async move {
        loop {
            let progress = match events.recv().await {
                Ok(SubagentEvent::Progress(progress)) => progress,
                Ok(_) | Err(crate::events::EventRecvError::Lagged(_)) => continue,
                Err(crate::events::EventRecvError::Closed) => return,
            };
            let notice = {
                let mut routes = lock(&forwarding.routes);
                let Some(route) = routes.get_mut(&progress.run_id) else { continue };
                // A fixed window per second bounds each run's progress rate.
                if route.window.0.elapsed() >= Duration::from_secs(1) {
                    route.window = (Instant::now(), 0);
                }
                route.window.1 += 1;
                if route.window.1 > PROGRESS_PER_SECOND {
                    continue;
                }
                let notice = ProgressNotice {
                    v: VERSION,
                    run: route.run.clone(),
                    attempt: route.attempt,
                    update: progress.update.clone(),
                };
                (route.caller.clone(), wire::encode(&notice, MAX_PROGRESS_BYTES))
            };
            if let (caller, Ok(bytes)) = notice {
                let subject = forwarding.broker.names.progress_subject(&caller);
                let _ = forwarding.broker.client.publish(subject, bytes.into()).await;
            }
        }
    });
    Ok(())
}
