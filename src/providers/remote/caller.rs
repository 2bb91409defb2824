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
//!   and every run at once after a reconnect.
//!
//! A result settles a slot once: later ones for the same run are ignored.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::jetstream::message::PublishMessage;
use futures_util::StreamExt;
use tokio::sync::{mpsc, watch, Notify};
use tokio_util::sync::CancellationToken;

use super::broker::{cancel_key, state_key, Broker, OPERATION_TIMEOUT};
use super::wire::{
    self, CancelNotice, Lease, ProgressNotice, RunRecord, Settled, Tombstone, MAX_MESSAGE_BYTES, VERSION,
};
use crate::seam::{Category, Diagnostic, ProgressUpdate, RunResult, Stage};

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
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    /// Wakes `upkeep` to refresh the lease and sweep every run now (after
    /// a reconnect).
    reconnected: Notify,
    /// How often unsettled runs are looked up in the runs bucket.
    sweep_interval: Duration,
    pub stop: CancellationToken,
}

impl Caller {
    pub(crate) fn new(broker: Broker, id: String, pool: String, provider: String, sweep_interval: Duration) -> Self {
        Caller {
            broker,
            id,
            pool,
            provider,
            slots: Mutex::default(),
            reconnected: Notify::new(),
            sweep_interval,
            stop: CancellationToken::new(),
        }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for `run`, made before its request is published so that no
    /// result can arrive unheard.
    pub(crate) fn register(&self, run: &str) -> (Arc<Slot>, SlotReceivers) {
        let (settled, settled_rx) = watch::channel(None);
        let (progress, progress_rx) = mpsc::channel(PROGRESS_BUFFER);
        let first_sweep = (Instant::now() + self.sweep_interval, self.sweep_interval);
        let slot =
            Arc::new(Slot { settled, progress, stream_seq: AtomicU64::new(0), next_sweep: Mutex::new(first_sweep) });
        self.slots().insert(run.to_owned(), slot.clone());
        (slot, SlotReceivers { settled: settled_rx, progress: progress_rx })
    }

    pub(crate) fn forget(&self, run: &str) {
        self.slots().remove(run);
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

    /// Publishes a run request durably, retrying within `within` (the run
    /// id is the message id, so a retry is deduplicated); `Ok` is the
    /// stream sequence once JetStream has stored it.
    pub(crate) async fn publish(&self, run: &str, request: Vec<u8>, within: Duration) -> Result<u64, String> {
        let subject = self.broker.names.run_subject(&self.pool);
        let deadline = Instant::now() + within;
        let mut last_error = String::from("no attempt");
        while Instant::now() < deadline {
            let publish = PublishMessage::build().payload(request.clone().into()).message_id(run);
            let attempt = async {
                let ack =
                    self.broker.jetstream.send_publish(subject.clone(), publish).await.map_err(|e| e.to_string())?;
                ack.await.map_err(|e| e.to_string())
            };
            match tokio::time::timeout(OPERATION_TIMEOUT, attempt).await {
                Ok(Ok(ack)) => {
                    if let Some(slot) = self.slots().get(run) {
                        slot.stream_seq.store(ack.sequence, Ordering::Release);
                    }
                    return Ok(ack.sequence);
                }
                Ok(Err(error)) => last_error = error,
                Err(_) => last_error = "timed out".to_owned(),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(last_error)
    }

    /// The durable cancel (tombstone) and the fast one (core notice). The
    /// tombstone write is tried up to `attempts` times: it is what keeps a
    /// queued run from ever running.
    pub(crate) async fn cancel(&self, run: &str, attempts: u32) -> bool {
        let notice = wire::encode(&CancelNotice { v: VERSION, run: run.to_owned() }, MAX_MESSAGE_BYTES);
        if let Ok(notice) = notice {
            let _ = self.broker.client.publish(self.broker.names.cancel_subject(run), notice.into()).await;
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
        self.put_lease().await?;
        let caller = self.clone();
        tokio::spawn(async move {
            while let Some(message) = caller.until_stopped(results.next()).await.flatten() {
                match wire::decode::<Settled>(&message.payload) {
                    Ok(settled) => caller.deliver(settled),
                    Err(error) => tracing::warn!(%error, "dropped a malformed remote result"),
                }
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
        tokio::spawn(async move { caller.upkeep().await });
        Ok(())
    }

    async fn until_stopped<T>(&self, future: impl std::future::Future<Output = T>) -> Option<T> {
        tokio::select! {
            _ = self.stop.cancelled() => None,
            value = future => Some(value),
        }
    }

    async fn put_lease(&self) -> Result<(), String> {
        let lease = wire::encode(&Lease { v: VERSION, caller: self.id.clone() }, MAX_MESSAGE_BYTES).expect("small");
        match tokio::time::timeout(OPERATION_TIMEOUT, self.broker.callers.put(&self.id, lease.into())).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(format!("cannot write the caller's lease: {error}")),
            Err(_) => Err("cannot write the caller's lease: timed out".to_owned()),
        }
    }

    /// Wakes the lease refresh and a full sweep (after a reconnect).
    pub(crate) fn reconnected(&self) {
        self.reconnected.notify_one();
    }

    async fn upkeep(self: Arc<Self>) {
        let lease_every = (self.broker.lease_ttl / 3).max(Duration::from_millis(50));
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
                }
                lease_at = Instant::now() + lease_every;
            }
            self.sweep().await;
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

/// The stream sequence a max-deliveries advisory names.
fn advisory_stream_seq(payload: &[u8]) -> Option<u64> {
    if payload.len() > MAX_MESSAGE_BYTES {
        return None;
    }
    let value: serde_json::Value = serde_json::from_slice(payload).ok()?;
    value.get("stream_seq")?.as_u64()
}
