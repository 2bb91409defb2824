//! What both sides of the remote provider share on the broker: names,
//! settings, the connection, and the stream, consumer and buckets.
//!
//! Layout for a prefix `p` (default `subagents`) and a pool `q`:
//!
//! | thing | name | kind |
//! |---|---|---|
//! | run requests | stream `p-runs`, subjects `p.run.*`, one subject `p.run.q` per pool | work queue, file storage, duplicate window |
//! | a pool's workers | durable pull consumer `p-pool-q` filtered on `p.run.q` | explicit ack, ack wait, `max_deliver` |
//! | run state, tombstones, holders | KV bucket `p-runs`: `state.<run>`, `cancel.<run>`, `detached.<run>` | file storage, history 1, max age = retention |
//! | caller leases | KV bucket `p-callers`: `<caller>` | file storage, max age = lease TTL |
//! | shared routes' schedules | KV bucket `p-limits`: `route.<name>` (see `schedule`) | file storage, history 1, max age 10 min |
//! | fast paths (core NATS) | `p.cancel.<run>`, `p.result.<caller>`, `p.progress.<caller>`, `p.status.q` | best effort |
//! | permission requests (core NATS request-reply) | `p.approval.<caller>` | answered by the caller, or no responders |
//!
//! Whoever comes first creates each piece with its [`BrokerSettings`];
//! whoever comes later binds to what exists and adopts its settings (a
//! worker reads the consumer's ack wait to pace its in-progress acks, a
//! caller reads the callers bucket's max age to pace its lease). So the
//! settings of a deployment are those of its first worker; change them by
//! deleting the stream, consumer or bucket.

use std::time::Duration;

use async_nats::jetstream::{self, consumer, kv, stream};

use super::MAX_MESSAGE_BYTES;

/// Broker-side settings: used when this side creates the stream, a pool's
/// consumer or a bucket; adopted from the broker when they already exist.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerSettings {
    /// Prefix of every subject, stream and bucket name (default
    /// `subagents`): letters, digits, `_` and `-`.
    pub prefix: String,
    /// How long a worker may hold a run without acking before the broker
    /// redelivers it (default 30 s). Workers send in-progress acks three
    /// times per ack wait while a run is live, so only a dead or frozen
    /// worker loses its runs.
    pub ack_wait: Duration,
    /// Deliveries of one run before the broker gives up and the run settles
    /// `Error` with category `worker-lost` (default 5).
    pub max_deliver: u32,
    /// How long a caller's lease lives unless refreshed (default 30 s); a
    /// caller refreshes it three times per TTL, and workers cancel the runs
    /// of a caller whose lease expired.
    pub lease_ttl: Duration,
    /// How long run state (claims, results, tombstones) is kept (default
    /// 24 h): a caller must collect a result within it.
    pub retention: Duration,
    /// The window in which a re-published run id is dropped as a duplicate
    /// (default 2 min).
    pub duplicate_window: Duration,
    /// Copies of the stream, consumers and buckets in a clustered broker
    /// (default 1; 3 survives the loss of a broker node).
    pub replicas: usize,
}

impl Default for BrokerSettings {
    fn default() -> Self {
        BrokerSettings {
            prefix: "subagents".to_owned(),
            ack_wait: Duration::from_secs(30),
            max_deliver: 5,
            lease_ttl: Duration::from_secs(30),
            retention: Duration::from_secs(24 * 3600),
            duplicate_window: Duration::from_secs(120),
            replicas: 1,
        }
    }
}

/// A pool or prefix name: it becomes a subject token and part of stream,
/// consumer and bucket names, so only `[A-Za-z0-9_-]`, 1 to 64 bytes.
pub(crate) fn check_name(what: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(format!("{what} {name:?} must be 1 to 64 letters, digits, '_' or '-'"))
    }
}

/// Every name derived from the prefix.
#[derive(Clone, Debug)]
pub(crate) struct Names {
    prefix: String,
}

impl Names {
    pub(crate) fn new(prefix: &str) -> Names {
        Names { prefix: prefix.to_owned() }
    }

    pub(crate) fn stream(&self) -> String {
        format!("{}-runs", self.prefix)
    }

    pub(crate) fn run_subject(&self, pool: &str) -> String {
        format!("{}.run.{pool}", self.prefix)
    }

    pub(crate) fn consumer(&self, pool: &str) -> String {
        format!("{}-pool-{pool}", self.prefix)
    }

    pub(crate) fn runs_bucket(&self) -> String {
        format!("{}-runs", self.prefix)
    }

    pub(crate) fn callers_bucket(&self) -> String {
        format!("{}-callers", self.prefix)
    }

    /// Shared routes' schedules (`route.<name>`).
    #[cfg(feature = "config")]
    pub(crate) fn limits_bucket(&self) -> String {
        format!("{}-limits", self.prefix)
    }

    pub(crate) fn cancel_subject(&self, run: &str) -> String {
        format!("{}.cancel.{run}", self.prefix)
    }

    pub(crate) fn cancel_subjects(&self) -> String {
        format!("{}.cancel.*", self.prefix)
    }

    pub(crate) fn result_subject(&self, caller: &str) -> String {
        format!("{}.result.{caller}", self.prefix)
    }

    pub(crate) fn progress_subject(&self, caller: &str) -> String {
        format!("{}.progress.{caller}", self.prefix)
    }

    /// Where a caller's runs ask it for permission (core NATS requests).
    pub(crate) fn approval_subject(&self, caller: &str) -> String {
        format!("{}.approval.{caller}", self.prefix)
    }

    pub(crate) fn status_subject(&self, pool: &str) -> String {
        format!("{}.status.{pool}", self.prefix)
    }

    /// JetStream's advisory when a run of `pool` ran out of deliveries.
    pub(crate) fn max_deliveries_advisory(&self, pool: &str) -> String {
        format!("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{}.{}", self.stream(), self.consumer(pool))
    }
}

/// The run's state key in the runs bucket.
pub(crate) fn state_key(run: &str) -> String {
    format!("state.{run}")
}

/// A detached run's holder key in the runs bucket.
pub(crate) fn detached_key(run: &str) -> String {
    format!("detached.{run}")
}

/// The run's tombstone key in the runs bucket.
pub(crate) fn cancel_key(run: &str) -> String {
    format!("cancel.{run}")
}

/// A connection with the stream and both buckets bound.
#[derive(Clone, Debug)]
pub(crate) struct Broker {
    pub client: async_nats::Client,
    pub jetstream: jetstream::Context,
    pub stream: stream::Stream,
    pub runs: kv::Store,
    pub callers: kv::Store,
    pub names: Names,
    /// The callers bucket's max age: the lease TTL in force.
    pub lease_ttl: Duration,
}

/// How long one broker operation (a publish ack, a KV read) may take.
pub(crate) const OPERATION_TIMEOUT: Duration = Duration::from_secs(5);

/// Connects, then creates or binds the stream and both buckets. Bounded by
/// `connect_timeout` overall; `events` hears of disconnects and reconnects.
pub(crate) async fn connect(
    url: &str,
    name: &str,
    settings: &BrokerSettings,
    connect_timeout: Duration,
    events: impl Fn(async_nats::Event) + Send + Sync + 'static,
) -> Result<Broker, String> {
    check_name("prefix", &settings.prefix)?;
    let events = std::sync::Arc::new(events);
    let options = async_nats::ConnectOptions::new()
        .name(name)
        .connection_timeout(connect_timeout)
        // A connection that stopped answering is given up after two unanswered
        // pings: 20-30 s, not the client's default of minutes.
        .ping_interval(Duration::from_secs(10))
        // Reconnect quickly after a broker restart, however many attempts.
        .reconnect_delay_callback(|attempts| Duration::from_millis(100 * attempts.min(10) as u64))
        .event_callback(move |event| {
            let events = events.clone();
            async move { events(event) }
        });
    let setup = async {
        let client = options.connect(url).await.map_err(|e| format!("cannot reach the NATS server at {url}: {e}"))?;
        let jetstream = jetstream::ContextBuilder::new().timeout(OPERATION_TIMEOUT).build(client.clone());
        let names = Names::new(&settings.prefix);
        let stream = ensure_stream(&jetstream, &names, settings).await?;
        let runs = ensure_bucket(&jetstream, &names.runs_bucket(), settings.retention, settings.replicas).await?;
        let callers = ensure_bucket(&jetstream, &names.callers_bucket(), settings.lease_ttl, settings.replicas).await?;
        let lease_ttl = callers.status().await.map(|s| s.max_age()).unwrap_or(settings.lease_ttl);
        Ok(Broker { client, jetstream, stream, runs, callers, names, lease_ttl })
    };
    match tokio::time::timeout(connect_timeout + OPERATION_TIMEOUT, setup).await {
        Ok(outcome) => outcome,
        Err(_) => Err(format!("the NATS server at {url} did not answer in time (is JetStream enabled? -js)")),
    }
}

async fn ensure_stream(
    jetstream: &jetstream::Context,
    names: &Names,
    settings: &BrokerSettings,
) -> Result<stream::Stream, String> {
    let config = stream::Config {
        name: names.stream(),
        subjects: vec![format!("{}.run.*", settings.prefix)],
        retention: stream::RetentionPolicy::WorkQueue,
        storage: stream::StorageType::File,
        duplicate_window: settings.duplicate_window,
        max_message_size: MAX_MESSAGE_BYTES as i32,
        num_replicas: settings.replicas.max(1),
        ..Default::default()
    };
    jetstream
        .get_or_create_stream(config)
        .await
        .map_err(|e| format!("cannot create or bind the stream {}: {e} (is JetStream enabled? -js)", names.stream()))
}

async fn ensure_bucket(
    jetstream: &jetstream::Context,
    bucket: &str,
    max_age: Duration,
    replicas: usize,
) -> Result<kv::Store, String> {
    if let Ok(store) = jetstream.get_key_value(bucket).await {
        return Ok(store);
    }
    let config = kv::Config {
        bucket: bucket.to_owned(),
        history: 1,
        max_age,
        max_value_size: MAX_MESSAGE_BYTES as i32,
        storage: stream::StorageType::File,
        num_replicas: replicas.max(1),
        ..Default::default()
    };
    match jetstream.create_key_value(config).await {
        Ok(store) => Ok(store),
        // Another party created it at the same moment: bind to theirs.
        Err(error) => jetstream
            .get_key_value(bucket)
            .await
            .map_err(|_| format!("cannot create or bind the KV bucket {bucket}: {error}")),
    }
}

/// The pool's durable pull consumer, created with `settings` if missing.
pub(crate) async fn ensure_consumer(
    broker: &Broker,
    pool: &str,
    settings: &BrokerSettings,
) -> Result<consumer::Consumer<consumer::pull::Config>, String> {
    check_name("pool", pool)?;
    let name = broker.names.consumer(pool);
    let config = consumer::pull::Config {
        durable_name: Some(name.clone()),
        filter_subject: broker.names.run_subject(pool),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: settings.ack_wait,
        max_deliver: i64::from(settings.max_deliver.max(1)),
        // Workers bound their own concurrency; the broker need not.
        max_ack_pending: -1,
        num_replicas: settings.replicas.max(1),
        ..Default::default()
    };
    broker
        .stream
        .get_or_create_consumer(&name, config)
        .await
        .map_err(|e| format!("cannot create or bind the consumer {name}: {e}"))
}
