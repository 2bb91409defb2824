//! The remote wire format: versioned JSON messages, one per NATS message.
//!
//! Every message is a JSON object with `"v": 1` ([`VERSION`]) and is at most
//! [`MAX_MESSAGE_BYTES`]. Where each one travels is described in the
//! [provider docs](super#wire-format); this module only shapes and checks
//! them. [`decode`] is the one door in: it refuses an oversized message, a
//! message that is not the expected JSON, and a message of another version,
//! each with a [`WireError`] the receiver logs before dropping the message.
//! Nothing read from the wire can panic a worker or a caller.
//!
//! Fields are added within a version only when an older reader may ignore
//! them (unknown fields are ignored); anything else bumps [`VERSION`].

pub(crate) mod broker;
// Used by workers whose configuration shares a route.
#[cfg(feature = "config")]
pub(crate) mod schedule;

use std::fmt;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::seam::{AgentOptions, Branch, Budget, ContentBlock, ProgressUpdate, RunResult, ToolFilter};

/// The version every message carries in `v`.
pub(crate) const VERSION: u32 = 1;

/// How often something that lapses after `ttl` unless renewed (a lease, a
/// message's ack deadline) is renewed: every third of it, at most every
/// 50 ms (a bucket or consumer made elsewhere may say 0).
pub(crate) fn renew_every(ttl: std::time::Duration) -> std::time::Duration {
    (ttl / 3).max(std::time::Duration::from_millis(50))
}

/// The largest message either side sends or accepts: 1 MiB, the NATS
/// server's default `max_payload`.
pub(crate) const MAX_MESSAGE_BYTES: usize = 1024 * 1024;

/// The largest progress message a worker sends; a bigger update is dropped
/// (progress is best effort).
pub(crate) const MAX_PROGRESS_BYTES: usize = 16 * 1024;

/// Why a message from the wire was dropped.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum WireError {
    /// Over [`MAX_MESSAGE_BYTES`].
    TooLarge(usize),
    /// Not the JSON object expected here.
    Malformed,
    /// Another wire version.
    Version(u32),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::TooLarge(bytes) => write!(f, "{bytes} bytes, over the {MAX_MESSAGE_BYTES}-byte cap"),
            WireError::Malformed => f.write_str("not a well-formed message of this kind"),
            WireError::Version(version) => write!(f, "wire version {version}, this side speaks {VERSION}"),
        }
    }
}

/// A message that carries the wire version.
pub(crate) trait Versioned {
    fn version(&self) -> u32;
}

macro_rules! versioned {
    ($($kind:ty),*) => {$(
        impl Versioned for $kind {
            fn version(&self) -> u32 {
                self.v
            }
        }
    )*};
}

versioned!(
    RunRequest,
    Settled,
    Claim,
    Tombstone,
    CancelNotice,
    ProgressNotice,
    Lease,
    StatusReply,
    Holder,
    ApprovalAsk
);

/// Encodes `message`, refusing one over `cap` bytes (`Err` holds its size).
pub(crate) fn encode<T: Serialize>(message: &T, cap: usize) -> Result<Vec<u8>, usize> {
    let bytes = serde_json::to_vec(message).expect("wire messages serialise");
    if bytes.len() > cap {
        return Err(bytes.len());
    }
    Ok(bytes)
}

/// Decodes one message from the wire: size cap, shape, version.
pub(crate) fn decode<T: DeserializeOwned + Versioned>(bytes: &[u8]) -> Result<T, WireError> {
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(WireError::TooLarge(bytes.len()));
    }
    // A version mismatch is reported as such even when the shape changed too.
    let message = serde_json::from_slice::<T>(bytes).map_err(|_| match version_of(bytes) {
        Some(version) if version != VERSION => WireError::Version(version),
        _ => WireError::Malformed,
    })?;
    match message.version() {
        VERSION => Ok(message),
        other => Err(WireError::Version(other)),
    }
}

fn version_of(bytes: &[u8]) -> Option<u32> {
    let value: Value = serde_json::from_slice(bytes).ok()?;
    value.get("v")?.as_u64()?.try_into().ok()
}

/// Who delegates: the parent's session and depth (the worker's child gets
/// depth + 1 and this lineage in its session header).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Lineage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    pub depth: u32,
}

/// A run request, published durably on `<prefix>.run.<pool>` with the run
/// id as its JetStream message id.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct RunRequest {
    pub v: u32,
    /// The run id (a UUID): message id, KV key part, subject token.
    pub run: String,
    /// The caller whose lease keeps the run wanted.
    pub caller: String,
    pub prompt: Vec<ContentBlock>,
    pub parent: Lineage,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persona: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_filter: Option<ToolFilter>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_depth: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_options: Option<AgentOptions>,
    /// What is left of the delegation budget the run's child holds; the
    /// worker opens it when it starts the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// A detached run: how long (ms) a worker keeps it going once no
    /// caller holds it (its caller's lease, and that of whoever attached
    /// since, per [`Holder`]). Absent: stopped when its caller's lease
    /// expires. An older worker ignores it and stops the run then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detach_ttl_ms: Option<u64>,
    /// The W3C trace context of the caller's run, sent only while its
    /// spans are exported: the worker's run joins that trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    /// Its vendor state, when the trace has any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
    /// The caller answers the run's permission requests ([`ApprovalAsk`]):
    /// its run reaches an approver. Absent (and from an older caller): the
    /// worker's requests find no one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub approvals: bool,
}

/// A permission request of a run's subtree on the worker, sent as a core
/// NATS request to `<prefix>.approval.<caller>`; the reply is the
/// [`Answer`](crate::seam::Answer). Sent again with `request` absent when
/// the worker's asker stopped waiting (its timeout, its cancel): the
/// caller withdraws the question `id`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct ApprovalAsk {
    pub v: u32,
    pub run: String,
    /// The worker's id for the question, unique within the run.
    pub id: u64,
    /// The question (absent: withdrawn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<crate::seam::PermissionRequest>,
}

/// Who holds a detached run now (`detached.<run>` in the runs bucket):
/// written before its request is published, again once the broker
/// stored it, and by every caller that attaches to it since.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Holder {
    pub v: u32,
    pub run: String,
    /// The caller whose lease keeps the run wanted, and who hears its
    /// result and progress.
    pub caller: String,
    /// The request's stream sequence (0 while its publish is unacknowledged).
    pub stream_seq: u64,
}

/// The run's state key (`state.<run>` in the runs bucket): a claim while a
/// worker holds the run, then its one terminal result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub(crate) enum RunRecord {
    /// A worker took delivery `attempt` of the run.
    Claimed(Claim),
    /// The run's terminal result; written once, by compare-and-set on the
    /// claim it settles, so a fenced worker can never write one.
    Settled(Box<Settled>),
}

impl RunRecord {
    pub(crate) fn decode(bytes: &[u8]) -> Result<RunRecord, WireError> {
        if bytes.len() > MAX_MESSAGE_BYTES {
            return Err(WireError::TooLarge(bytes.len()));
        }
        let record: RunRecord = serde_json::from_slice(bytes).map_err(|_| WireError::Malformed)?;
        let version = match &record {
            RunRecord::Claimed(claim) => claim.v,
            RunRecord::Settled(settled) => settled.v,
        };
        if version != VERSION {
            return Err(WireError::Version(version));
        }
        Ok(record)
    }
}

/// A worker's claim on one delivery of a run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Claim {
    pub v: u32,
    /// JetStream's delivery count for the message this worker holds.
    pub attempt: u64,
    pub worker: String,
}

/// A run's terminal result, as stored and as announced on
/// `<prefix>.result.<caller>`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Settled {
    pub v: u32,
    pub run: String,
    /// The delivery that produced it (0: settled without any delivery, by
    /// the caller, when the broker gave up redelivering).
    pub attempt: u64,
    /// The worker that ran it, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    pub result: RunResult,
    /// The worker released its child before writing this.
    pub disposed: bool,
    /// What ran under the run on the worker (its local run and that run's
    /// tree), once released; absent from older workers and from a result
    /// the caller wrote for a lost run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runs: Option<Vec<Branch>>,
}

/// The durable cancel (`cancel.<run>` in the runs bucket): a worker that
/// picks the run up later settles it `aborted` without running it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Tombstone {
    pub v: u32,
    pub run: String,
}

/// The fast cancel, on `<prefix>.cancel.<run>` (core NATS).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CancelNotice {
    pub v: u32,
    pub run: String,
}

/// Live progress, on `<prefix>.progress.<caller>` (core NATS, best effort).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct ProgressNotice {
    pub v: u32,
    pub run: String,
    pub attempt: u64,
    pub update: ProgressUpdate,
}

/// A caller's lease (`<caller>` in the callers bucket, expiring after the
/// bucket's max age unless refreshed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Lease {
    pub v: u32,
    pub caller: String,
}

/// A worker's answer on `<prefix>.status.<pool>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StatusReply {
    /// Wire version.
    pub v: u32,
    /// The worker's id.
    pub worker: String,
    /// Its pool.
    pub pool: String,
    /// Runs it holds a child for right now.
    pub live: usize,
    /// Whether it stopped pulling (SIGTERM).
    pub draining: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seam::StopReason;

    #[test]
    fn decode_drops_oversized_malformed_and_foreign_messages() {
        let huge = vec![b' '; MAX_MESSAGE_BYTES + 1];
        assert_eq!(decode::<CancelNotice>(&huge).unwrap_err(), WireError::TooLarge(MAX_MESSAGE_BYTES + 1));
        assert_eq!(decode::<CancelNotice>(b"{\"v\":1").unwrap_err(), WireError::Malformed);
        assert_eq!(decode::<CancelNotice>(b"[1,2]").unwrap_err(), WireError::Malformed);
        assert_eq!(decode::<CancelNotice>(br#"{"v":2,"run":"r"}"#).unwrap_err(), WireError::Version(2));
        assert_eq!(decode::<CancelNotice>(br#"{"v":9,"other":true}"#).unwrap_err(), WireError::Version(9));
        let notice: CancelNotice = decode(br#"{"v":1,"run":"r","later":"ignored"}"#).unwrap();
        assert_eq!(notice.run, "r");
    }

    #[test]
    fn records_round_trip_and_a_settled_one_carries_its_attempt() {
        let settled = RunRecord::Settled(Box::new(Settled {
            v: VERSION,
            run: "r".into(),
            attempt: 2,
            worker: Some("w".into()),
            result: RunResult::empty(StopReason::Aborted),
            disposed: true,
            runs: None,
        }));
        let bytes = encode(&settled, MAX_MESSAGE_BYTES).unwrap();
        assert!(String::from_utf8_lossy(&bytes).contains(r#""state":"settled""#));
        assert_eq!(RunRecord::decode(&bytes).unwrap(), settled);
        assert_eq!(encode(&settled, 10).unwrap_err(), bytes.len());
    }
}
