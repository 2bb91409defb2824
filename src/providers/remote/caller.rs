//! The caller's side of the broker: one per [`RemoteProvider`](super::RemoteProvider).
//!
//! It owns the caller's lease, a slot per run it published (where the
//! run's terminal result and progress land), and four background tasks on
//! the provider's own I/O runtime:
//! - `results`: terminal results announced on `<prefix>.result.<caller>`;
//! - `progress`: progress on `<prefix>.progress.<caller>`, into each run's
//!   bounded channel (dropped when full: progress is best effort);
//! - `advisories`: JetStream's max-deliveries advisory for the pool, which
//!   settles the run it names `Error` (`worker-lost`);
//! - `upkeep`: refreshes the lease three times per TTL (and at once after a
//!   reconnect), and sweeps the runs bucket for results of runs still
//!   unsettled, so a result announced while this side was disconnected is
//!   still collected. Each run is looked up after one sweep interval, then
//!   at doubling intervals up to [`MAX_SWEEP_INTERVAL`] (the announcement
//!   is the normal path; the sweep only catches what a disconnect lost),
//!   and every run at once after a reconnect. While runs are unsettled it
//!   also asks the pool who is there, and fails the runs that waited past
//!   a bound on the broker or on a worker (module [`health`](super::health)).
//!   A connection that claims to be up while lease writes keep failing is
//!   dropped and made again, so a connection the broker closed unnoticed
//!   cannot hold results back.
//!
//! A result settles a slot once: later ones for the same run are ignored.
//! A start's own writes, and the refusal of starts past a bound, are in
//! [`start`].

mod asking;
mod start;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tokio::sync::{mpsc, watch, Notify};
use tokio_util::sync::CancellationToken;

use super::health::{Health, Patience, Stall, FAILED_WRITES_BEFORE_RECONNECT, SAY_EVERY, STATUS_EVERY};
use crate::seam::{Category, Diagnostic, ProgressUpdate, RunResult, Stage};
use crate::wire::remote::broker::{cancel_key, detached_key, state_key, Broker, OPERATION_TIMEOUT};
use crate::wire::remote::{
    self as wire, ApprovalAsk, CancelNotice, Holder, Lease, ProgressNotice, RunRecord, Settled, Tombstone,
    MAX_MESSAGE_BYTES, VERSION,
};

pub(crate) use self::start::Deadline;

/// Progress updates buffered per run before new ones are dropped.
const PROGRESS_BUFFER: usize = 64;

/// The longest a run waits between two lookups by the sweep, so a thousand
/// long runs cost the broker a few dozen reads a second, not a thousand.
const MAX_SWEEP_INTERVAL: Duration = Duration::from_secs(30);

/// Where one run's outcome lands.
#[derive(Debug)]
pub(crate) struct Slot {
    settled: watch::Sender<Option<Arc<Settled>>>,
    progress: mpsc::Sender<ProgressUpdate>,
    /// The request's stream sequence (0 until the broker acknowledged it).
    stream_seq: AtomicU64,
    /// When the sweep looks this run up next, and the interval after that.
    next_sweep: Mutex<(Instant, Duration)>,
    /// When the run was registered (just before its publish).
    published: Instant,
}

/// What a run's child holds of its slot.
#[derive(Debug)]
pub(crate) struct SlotReceivers {
    pub settled: watch::Receiver<Option<Arc<Settled>>>,
    pub progress: mpsc::Receiver<ProgressUpdate>,
}

#[derive(Debug)]
pub(crate) struct Caller {
    pub broker: Broker,
    pub id: String,
    pub pool: String,
    pub provider: String,
    /// The broker's URL, for what the caller says while it waits.
    url: String,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    health: Mutex<Health>,
    patience: Patience,
    /// Wakes `upkeep` to refresh the lease and sweep every run now (after
    /// a reconnect).
    reconnected: Notify,
    /// How often unsettled runs are looked up in the runs bucket.
    sweep_interval: Duration,
    pub stop: CancellationToken,
    /// The runs that answer their workers' permission requests.
    asking: Mutex<asking::Asking>,
}

impl Caller {
    pub(crate) fn new(
        broker: Broker,
        id: String,
        pool: String,
        (provider, url): (String, String),
        sweep_interval: Duration,
        patience: Patience,
    ) -> Self {
        Caller {
            broker,
            id,
            pool,
            provider,
            url,
            slots: Mutex::default(),
            health: Mutex::new(Health::new(Instant::now())),
            patience,
            reconnected: Notify::new(),
            sweep_interval,
            stop: CancellationToken::new(),
            asking: Mutex::default(),
        }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The connection dropped (from its event callback).
    pub(crate) fn disconnected(&self) {
        self.health().broker_failed(Instant::now());
    }

    /// What keeps `run` from settling now, if anything.
    pub(crate) fn stall_of(&self, run: &str) -> Option<Stall> {
        let published = self.slots().get(run).map(|slot| slot.published)?;
        self.health().stall(published, Instant::now())
    }

    /// A slot for `run`, made before its request is published so that no
    /// result can arrive unheard.
    pub(crate) fn register(&self, run: &str) -> (Arc<Slot>, SlotReceivers) {
        let (settled, settled_rx) = watch::channel(None);
        let (progress, progress_rx) = mpsc::channel(PROGRESS_BUFFER);
        let first_sweep = (Instant::now() + self.sweep_interval, self.sweep_interval);
        let slot = Arc::new(Slot {
            settled,
            progress,
            stream_seq: AtomicU64::new(0),
            next_sweep: Mutex::new(first_sweep),
            published: Instant::now(),
        });
        self.slots().insert(run.to_owned(), slot.clone());
        (slot, SlotReceivers { settled: settled_rx, progress: progress_rx })
    }

    /// Notes where an attached run's request sits in the stream (for the
    /// max-deliveries advisory and for removing it).
    pub(crate) fn note_stream_seq(&self, run: &str, seq: u64) {
        if let Some(slot) = self.slots().get(run) {
            slot.stream_seq.store(seq, Ordering::Release);
        }
    }

    /// A detached run's holder record; `Err` when the broker could not be asked.
    pub(crate) async fn holder(&self, run: &str) -> Result<Option<Holder>, ()> {
        let entry = tokio::time::timeout(OPERATION_TIMEOUT, self.broker.runs.entry(detached_key(run))).await;
        match entry {
            Ok(Ok(Some(entry))) if entry.operation == async_nats::jetstream::kv::Operation::Put => {
                Ok(wire::decode::<Holder>(&entry.value).ok())
            }
            Ok(Ok(_)) => Ok(None),
            _ => Err(()),
        }
    }

    pub(crate) fn forget(&self, run: &str) {
        self.slots().remove(run);
    }

    /// Forgets `run` if `slot` is still its slot (a later attach to the
    /// same run may have registered its own meanwhile).
    pub(crate) fn forget_slot(&self, run: &str, slot: &Arc<Slot>) {
        let mut slots = self.slots();
        if slots.get(run).is_some_and(|current| Arc::ptr_eq(current, slot)) {
            slots.remove(run);
        }
    }

    /// Settles `settled.run`'s slot unless it settled already.
    pub(crate) fn deliver(&self, settled: Settled) {
        let Some(slot) = self.slots().get(&settled.run).cloned() else { return };
        let settled = Arc::new(settled);
        slot.settled.send_if_modified(|current| match current {
            Some(_) => false,
            None => {
                *current = Some(settled);
                true
            }
        });
    }

    /// The durable cancel (tombstone) and the fast one (core notice). The
    /// tombstone write is tried up to `attempts` times: it is what keeps a
    /// queued run from ever running.
    pub(crate) async fn cancel(&self, run: &str, attempts: u32) -> bool {
        let notice = wire::encode(&CancelNotice { v: VERSION, run: run.to_owned() }, MAX_MESSAGE_BYTES);
        if let Ok(notice) = notice {
            // Bounded: a client cut off from its broker queues a publish
            // only while its outgoing buffer has room, then waits.
            let subject = self.broker.names.cancel_subject(run);
            let _ = tokio::time::timeout(OPERATION_TIMEOUT, self.broker.client.publish(subject, notice.into())).await;
        }
        let tombstone = wire::encode(&Tombstone { v: VERSION, run: run.to_owned() }, MAX_MESSAGE_BYTES)
            .expect("a tombstone is small");
        for _ in 0..attempts.max(1) {
            let put = self.broker.runs.put(cancel_key(run), tombstone.clone().into());
            if let Ok(Ok(_)) = tokio::time::timeout(OPERATION_TIMEOUT, put).await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        tracing::warn!(run, "could not record a remote run's cancel on the broker");
        false
    }

    /// The run's state record; `Err` when the broker could not be asked.
    pub(crate) async fn state(&self, run: &str) -> Result<Option<RunRecord>, ()> {
        let entry = tokio::time::timeout(OPERATION_TIMEOUT, self.broker.runs.entry(state_key(run))).await;
        match entry {
            Ok(Ok(Some(entry))) if entry.operation == async_nats::jetstream::kv::Operation::Put => {
                Ok(RunRecord::decode(&entry.value).ok())
            }
            Ok(Ok(_)) => Ok(None),
            _ => Err(()),
        }
    }

    /// Removes a request that no worker will run (cancelled or given up on)
    /// from the stream; best effort, it is inert either way.
    pub(crate) async fn delete_request(&self, run: &str) {
        let seq = self.slots().get(run).map_or(0, |slot| slot.stream_seq.load(Ordering::Acquire));
        if seq > 0 {
            let _ = tokio::time::timeout(OPERATION_TIMEOUT, self.broker.stream.delete_message(seq)).await;
        }
    }

    /// Settles a run the broker gave up redelivering: `Error` with category
    /// `worker-lost`, written by compare-and-set so a worker that wakes up
    /// later is fenced out; a result that got there first wins instead.
    async fn settle_lost(&self, run: &str) {
        let key = state_key(run);
        for _ in 0..5 {
            let Ok(Ok(entry)) = tokio::time::timeout(OPERATION_TIMEOUT, self.broker.runs.entry(key.clone())).await
            else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            if let Some(Ok(RunRecord::Settled(settled))) = entry.as_ref().map(|e| RunRecord::decode(&e.value)) {
                return self.deliver(*settled);
            }
            let diagnostic = Diagnostic::new(&self.provider, Stage::SessionRun, Category::WorkerLost)
                .with_reason("every worker that took the run was lost before it finished");
            let settled = Settled {
                v: VERSION,
                run: run.to_owned(),
                attempt: 0,
                worker: None,
                result: RunResult::failed(diagnostic),
                disposed: true,
                runs: None,
            };
            let bytes = wire::encode(&RunRecord::Settled(Box::new(settled.clone())), MAX_MESSAGE_BYTES).expect("small");
            let written = match &entry {
                Some(entry) => self.broker.runs.update(&key, bytes.into(), entry.revision).await.is_ok(),
                None => self.broker.runs.create(&key, bytes.into()).await.is_ok(),
            };
            if written {
                self.delete_request(run).await;
                return self.deliver(settled);
            }
        }
    }

    /// Starts the background tasks on the current (I/O) runtime.
    pub(crate) async fn start_tasks(self: &Arc<Self>) -> Result<(), String> {
        let client = &self.broker.client;
        let subscribe = |subject: String| async move {
            client.subscribe(subject.clone()).await.map_err(|e| format!("cannot subscribe to {subject}: {e}"))
        };
        let mut results = subscribe(self.broker.names.result_subject(&self.id)).await?;
        let mut progress = subscribe(self.broker.names.progress_subject(&self.id)).await?;
        let mut advisories = subscribe(self.broker.names.max_deliveries_advisory(&self.pool)).await?;
        let mut approvals = subscribe(self.broker.names.approval_subject(&self.id)).await?;
        self.put_lease().await?;
        let caller = self.clone();
        tokio::spawn(async move {
            loop {
                while let Some(message) = caller.until_stopped(results.next()).await.flatten() {
                    match wire::decode::<Settled>(&message.payload) {
                        Ok(settled) => caller.deliver(settled),
                        Err(error) => tracing::warn!(%error, "dropped a malformed remote result"),
                    }
                }
                // The subscription ended without a stop: listen again (the
                // sweep collects what was announced in between).
                loop {
                    if caller.stop.is_cancelled() {
                        return;
                    }
                    let subject = caller.broker.names.result_subject(&caller.id);
                    match caller.broker.client.subscribe(subject).await {
                        Ok(again) => break results = again,
                        Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
                    }
                }
                caller.sweep_all_now();
            }
        });
        let caller = self.clone();
        tokio::spawn(async move {
            while let Some(message) = caller.until_stopped(progress.next()).await.flatten() {
                match wire::decode::<ProgressNotice>(&message.payload) {
                    Ok(notice) => {
                        let slot = caller.slots().get(&notice.run).cloned();
                        if let Some(slot) = slot {
                            let _ = slot.progress.try_send(notice.update);
                        }
                    }
                    Err(error) => tracing::warn!(%error, "dropped a malformed remote progress message"),
                }
            }
        });
        let caller = self.clone();
        tokio::spawn(async move {
            while let Some(message) = caller.until_stopped(advisories.next()).await.flatten() {
                let Some(seq) = advisory_stream_seq(&message.payload) else {
                    tracing::warn!("dropped a malformed max-deliveries advisory");
                    continue;
                };
                let run = caller
                    .slots()
                    .iter()
                    .find_map(|(run, slot)| (slot.stream_seq.load(Ordering::Acquire) == seq).then(|| run.clone()));
                if let Some(run) = run {
                    let caller = caller.clone();
                    tokio::spawn(async move { caller.settle_lost(&run).await });
                }
            }
        });
        let caller = self.clone();
        tokio::spawn(async move {
            while let Some(message) = caller.until_stopped(approvals.next()).await.flatten() {
                match wire::decode::<ApprovalAsk>(&message.payload) {
                    Ok(ask) => caller.asked(ask, message.reply),
                    Err(error) => tracing::warn!(%error, "dropped a malformed remote permission request"),
                }
            }
        });
        let caller = self.clone();
        tokio::spawn(async move { caller.upkeep().await });
        let caller = self.clone();
        tokio::spawn(async move { caller.watch_health().await });
        Ok(())
    }

    async fn until_stopped<T>(&self, future: impl std::future::Future<Output = T>) -> Option<T> {
        tokio::select! {
            _ = self.stop.cancelled() => None,
            value = future => Some(value),
        }
    }

    /// Writes the lease, and notes what that says of the broker.
    async fn put_lease(&self) -> Result<(), String> {
        let lease = wire::encode(&Lease { v: VERSION, caller: self.id.clone() }, MAX_MESSAGE_BYTES).expect("small");
        let written =
            match tokio::time::timeout(OPERATION_TIMEOUT, self.broker.callers.put(&self.id, lease.into())).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(error)) => Err(format!("cannot write the caller's lease: {error}")),
                Err(_) => Err("cannot write the caller's lease: timed out".to_owned()),
            };
        let mut health = self.health();
        match &written {
            Ok(()) => {
                health.lease_written = Instant::now();
                health.failed_lease_writes = 0;
                health.broker_answered();
            }
            Err(_) => {
                health.failed_lease_writes += 1;
                health.broker_failed(Instant::now());
            }
        }
        written
    }

    /// Wakes the lease refresh and a full sweep (after a reconnect).
    pub(crate) fn reconnected(&self) {
        self.reconnected.notify_one();
    }

    async fn upkeep(self: Arc<Self>) {
        let lease_every = crate::wire::remote::renew_every(self.broker.lease_ttl);
        let mut lease_at = Instant::now() + lease_every;
        loop {
            let wake = tokio::time::sleep(self.sweep_interval.min(lease_every));
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = self.reconnected.notified() => {
                    lease_at = Instant::now();
                    self.sweep_all_now();
                }
                _ = wake => {}
            }
            if Instant::now() >= lease_at {
                if let Err(error) = self.put_lease().await {
                    tracing::warn!(%error, "remote caller lease not refreshed");
                    self.reconnect_if_stuck();
                }
                lease_at = Instant::now() + lease_every;
            }
            // Lookups on a connection that is down only time out; the
            // reconnect sweeps everything anyway.
            if self.broker.client.connection_state() == async_nats::connection::State::Connected {
                self.sweep().await;
            }
        }
    }

    /// Watches what the unsettled runs wait for, apart from `upkeep`, whose
    /// broker operations may each take their whole timeout: asks the pool
    /// who is there, says what runs wait for, fails the runs stalled past
    /// a bound.
    async fn watch_health(self: Arc<Self>) {
        let mut status_at = Instant::now();
        loop {
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = tokio::time::sleep(STATUS_EVERY / 4) => {}
            }
            let connected = self.broker.client.connection_state() == async_nats::connection::State::Connected;
            let wanted = || self.waiting().next().is_some() || self.health().pool_wanted(Instant::now(), self.patience);
            if connected && Instant::now() >= status_at && wanted() {
                self.ask_pool().await;
                status_at = Instant::now() + STATUS_EVERY;
            }
            self.give_up_stalled();
            self.say_what_runs_wait_for();
        }
    }

    /// A connection that says it is up while lease writes keep failing
    /// (the broker closed it unnoticed, or it stopped answering): drop it
    /// and connect again, so the subscriptions and the sweep work again.
    fn reconnect_if_stuck(&self) {
        let stuck = {
            let mut health = self.health();
            let stuck = health.failed_lease_writes >= FAILED_WRITES_BEFORE_RECONNECT;
            if stuck {
                health.failed_lease_writes = 0;
            }
            stuck
        };
        if stuck && self.broker.client.connection_state() == async_nats::connection::State::Connected {
            tracing::warn!(provider = %self.provider, "the broker connection stopped answering; reconnecting");
            let client = self.broker.client.clone();
            tokio::spawn(async move {
                let _ = tokio::time::timeout(OPERATION_TIMEOUT, client.force_reconnect()).await;
            });
        }
    }

    /// Every published run still unsettled, with when it was published.
    fn waiting(&self) -> std::vec::IntoIter<(String, Instant)> {
        let slots = self.slots();
        let waiting: Vec<(String, Instant)> = slots
            .iter()
            .filter(|(_, slot)| slot.stream_seq.load(Ordering::Acquire) > 0 && slot.settled.borrow().is_none())
            .map(|(run, slot)| (run.clone(), slot.published))
            .collect();
        waiting.into_iter()
    }

    /// Whether `worker` answers the pool's status request within
    /// [`STATUS_EVERY`]: alive, however slow its runs are.
    pub(crate) async fn worker_answers(&self, worker: &str) -> bool {
        let client = &self.broker.client;
        let inbox = client.new_inbox();
        let Ok(mut replies) = client.subscribe(inbox.clone()).await else { return false };
        let subject = self.broker.names.status_subject(&self.pool);
        if client.publish_with_reply(subject, inbox, "{}".into()).await.is_err() {
            return false;
        }
        let heard = async {
            while let Some(reply) = replies.next().await {
                let status: Option<wire::StatusReply> = serde_json::from_slice(&reply.payload).ok();
                if status.is_some_and(|status| status.worker == worker) {
                    return true;
                }
            }
            false
        };
        tokio::time::timeout(STATUS_EVERY, heard).await.unwrap_or(false)
    }

    /// Asks the pool's workers who is there; any answer is a worker seen,
    /// none (no responders, or none in time) a silence.
    async fn ask_pool(&self) {
        use async_nats::RequestErrorKind;
        let subject = self.broker.names.status_subject(&self.pool);
        let asked = tokio::time::timeout(STATUS_EVERY, self.broker.client.request(subject, "{}".into())).await;
        let (mut health, now) = (self.health(), Instant::now());
        match asked {
            Ok(Ok(_)) => {
                health.broker_answered();
                health.worker_answered(now);
            }
            Ok(Err(error)) if error.kind() == RequestErrorKind::NoResponders => {
                health.broker_answered();
                health.worker_silent(now);
            }
            Ok(Err(error)) if error.kind() == RequestErrorKind::TimedOut => health.worker_silent(now),
            Err(_) => health.worker_silent(now),
            Ok(Err(_)) => {}
        }
    }

    /// Fails every run that waited past a bound on the broker or on a
    /// worker, and tombstones it (once the broker takes the write) so that
    /// no worker runs it later.
    fn give_up_stalled(self: &Arc<Self>) {
        let now = Instant::now();
        let waiting: Vec<(String, Instant)> = self.waiting().collect();
        let stalled: Vec<(String, Stall)> = {
            let health = self.health();
            waiting
                .into_iter()
                .filter_map(|(run, published)| health.stall(published, now).map(|stall| (run, stall)))
                .filter(|(_, stall)| stall.past(self.patience))
                .collect()
        };
        for (run, stall) in stalled {
            let diagnostic = stall.diagnostic(&self.provider, &self.pool, self.patience);
            tracing::warn!(provider = %self.provider, %run, reason = diagnostic.reason.as_deref().unwrap_or_default(), "gave up on a remote run");
            self.settle_here(&run, RunResult::failed(diagnostic));
            let caller = self.clone();
            tokio::spawn(async move {
                if caller.cancel(&run, 10).await {
                    caller.delete_request(&run).await;
                }
            });
        }
    }

    /// Settles `run` on this side: no worker result will be taken for it.
    pub(crate) fn settle_here(&self, run: &str, result: RunResult) {
        let settled =
            Settled { v: VERSION, run: run.to_owned(), attempt: 0, worker: None, result, disposed: true, runs: None };
        self.deliver(settled);
    }

    /// Every [`SAY_EVERY`], while runs wait on the broker or for a worker,
    /// a warning saying what they wait for and when they fail.
    fn say_what_runs_wait_for(&self) {
        let now = Instant::now();
        let waiting: Vec<(String, Instant)> = self.waiting().collect();
        let mut health = self.health();
        if health.said.is_some_and(|said| now.duration_since(said) < SAY_EVERY) {
            return;
        }
        let (mut broker, mut worker) = ((0, Duration::ZERO), (0, Duration::ZERO));
        for (_, published) in waiting {
            match health.stall(published, now) {
                Some(Stall::Broker(for_)) => broker = (broker.0 + 1, broker.1.max(for_)),
                Some(Stall::NoWorker(for_)) => worker = (worker.0 + 1, worker.1.max(for_)),
                None => {}
            }
        }
        let url = without_credentials(&self.url);
        let patience = self.patience;
        // Said once a wait is long enough to notice, and well before it ends.
        let noticed = |bound: Duration| (SAY_EVERY / 2).min(bound / 2);
        if broker.0 > 0 && broker.1 >= noticed(patience.broker) {
            tracing::warn!(
                "remote provider {:?}: the broker at {url} has not answered for {} s; {} runs wait for it and fail at {} s (broker_patience)",
                self.provider, broker.1.as_secs(), broker.0, patience.broker.as_secs_f64()
            );
            health.said = Some(now);
        } else if worker.0 > 0 && worker.1 >= noticed(patience.worker) {
            tracing::warn!(
                "remote provider {:?}: no worker of pool {:?} has answered for {} s; {} runs wait for one and fail at {} s (worker_patience)",
                self.provider, self.pool, worker.1.as_secs(), worker.0, patience.worker.as_secs_f64()
            );
            health.said = Some(now);
        }
    }

    fn sweep_all_now(&self) {
        for slot in self.slots().values() {
            *slot.next_sweep.lock().unwrap_or_else(|e| e.into_inner()) = (Instant::now(), self.sweep_interval);
        }
    }

    /// Looks up every unsettled run that is due, a few at a time, and
    /// doubles each one's interval.
    async fn sweep(&self) {
        let now = Instant::now();
        let due: Vec<String> = self
            .slots()
            .iter()
            .filter(|(_, slot)| {
                let mut next = slot.next_sweep.lock().unwrap_or_else(|e| e.into_inner());
                let due = slot.settled.borrow().is_none() && next.0 <= now;
                if due {
                    *next = (now + next.1, (next.1 * 2).min(MAX_SWEEP_INTERVAL));
                }
                due
            })
            .map(|(run, _)| run.clone())
            .collect();
        let lookups = futures_util::stream::iter(due).map(|run| async move { (self.state(&run).await, run) });
        let mut lookups = lookups.buffer_unordered(16);
        while let Some((state, _run)) = lookups.next().await {
            if let Ok(Some(RunRecord::Settled(settled))) = state {
                self.deliver(*settled);
            }
        }
    }

    /// Deletes the lease so workers stop this caller's runs at once. Bounded
    /// tightly: at shutdown an unreachable broker must not hold the runtime
    /// (the lease then simply expires).
    pub(crate) async fn release_lease(&self) {
        let _ = tokio::time::timeout(Duration::from_secs(1), self.broker.callers.delete(&self.id)).await;
    }
}

/// `url` without the user and password it may carry.
fn without_credentials(url: &str) -> &str {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => &url[at + 1..],
        (None, Some(at)) => &url[at + 1..],
        _ => url,
    }
}

/// The stream sequence a max-deliveries advisory names.
fn advisory_stream_seq(payload: &[u8]) -> Option<u64> {
    if payload.len() > MAX_MESSAGE_BYTES {
        return None;
    }
    let value: serde_json::Value = serde_json::from_slice(payload).ok()?;
    value.get("stream_seq")?.as_u64()
}
