//! A start's writes to the broker (a detached run's holder, the request),
//! each retried within one deadline, the start's `publish_timeout`, and
//! given up at once when the broker is past its bound: the one place a
//! start's broker waits are bounded. A start refused before it sends
//! anything ([`Caller::refusal`]) is refused here too, with the same reason.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use async_nats::jetstream::message::PublishMessage;

use super::Caller;
use crate::seam::{Category, Diagnostic, Stage};
use crate::wire::remote::broker::{detached_key, OPERATION_TIMEOUT};
use crate::wire::remote::{self as wire, Holder, MAX_MESSAGE_BYTES, VERSION};

/// The pause between two tries of a start's broker write.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// When a start's broker writes must be done by, and the bound that set it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Deadline {
    at: Instant,
    within: Duration,
}

impl Deadline {
    /// `within` from now (a start's `publish_timeout`).
    pub(crate) fn after(within: Duration) -> Deadline {
        Deadline { at: Instant::now() + within, within }
    }

    /// The same, but at least `least` from now.
    pub(crate) fn at_least(self, least: Duration) -> Deadline {
        Deadline { at: self.at.max(Instant::now() + least), ..self }
    }
}

/// What one try of a broker write came to.
enum Tried<T> {
    Done(T),
    /// Failed; another try may do.
    Failed(String),
    /// Refused for good: the start fails with this.
    Refused(Diagnostic),
}

impl Caller {
    /// A start refused at once, with the reason every run waiting now
    /// fails for: the broker past `broker_patience`, or (a start that
    /// `needs_worker`) the pool silent past `worker_patience`.
    pub(crate) fn refusal(&self, needs_worker: bool) -> Result<(), Diagnostic> {
        let stall = self.health().past_bound(Instant::now(), self.patience, needs_worker);
        match stall {
            None => Ok(()),
            Some(stall) => Err(Diagnostic {
                stage: Stage::Initialize,
                ..stall.diagnostic(&self.provider, &self.pool, self.patience)
            }),
        }
    }

    /// Tries a start's broker write until it is done, `deadline` passes,
    /// or the broker is past `broker_patience` (then it fails at once with
    /// that bound's reason, like every start while it lasts). Each try is
    /// bounded by [`OPERATION_TIMEOUT`] and by the broker's patience left.
    async fn keep_trying<T, F, Fut>(&self, what: &str, deadline: Deadline, mut attempt: F) -> Result<T, Diagnostic>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Tried<T>>,
    {
        let mut failure = "no answer".to_owned();
        loop {
            self.refusal(false)?;
            let now = Instant::now();
            if now >= deadline.at {
                break;
            }
            let patience_left = self.health().broker_patience_left(now, self.patience);
            let bound = OPERATION_TIMEOUT.min(deadline.at - now).min(patience_left);
            match tokio::time::timeout(bound, attempt()).await {
                Ok(Tried::Done(value)) => {
                    self.health().broker_answered();
                    return Ok(value);
                }
                Ok(Tried::Refused(diagnostic)) => return Err(diagnostic),
                Ok(Tried::Failed(error)) => failure = error,
                Err(_) => failure = "timed out".to_owned(),
            }
            tracing::debug!(provider = %self.provider, what, %failure, "a remote start's broker write failed; retrying");
            self.health().broker_failed(Instant::now());
            tokio::time::sleep(RETRY_PAUSE.min(deadline.at.saturating_duration_since(Instant::now()))).await;
        }
        Err(Diagnostic::new(&self.provider, Stage::Initialize, Category::BrokerUnreachable).with_reason(format!(
            "the broker did not store {what} within {} s (publish_timeout): {failure}",
            deadline.within.as_secs_f64()
        )))
    }

    /// Writes this caller as the holder of detached run `run`, whose
    /// request is at `stream_seq` (0: not acknowledged yet), by `deadline`.
    pub(crate) async fn put_holder(&self, run: &str, stream_seq: u64, deadline: Deadline) -> Result<(), Diagnostic> {
        let holder = Holder { v: VERSION, run: run.to_owned(), caller: self.id.clone(), stream_seq };
        let bytes = wire::encode(&holder, MAX_MESSAGE_BYTES).expect("a holder is small");
        self.keep_trying("the detached run's holder", deadline, || {
            let put = self.broker.runs.put(detached_key(run), bytes.clone().into());
            async move {
                match put.await {
                    Ok(_) => Tried::Done(()),
                    Err(error) => Tried::Failed(error.to_string()),
                }
            }
        })
        .await
    }

    /// Publishes a run request durably, retrying until `deadline` (the run
    /// id is the message id, so a retry is deduplicated); `Ok` is the
    /// stream sequence once JetStream has stored it, `Err` the start's
    /// failure. A broker down past `broker_patience` fails it at once, a
    /// full store without retries. A lease that may have lapsed (this side
    /// was cut off) is written first, so that no worker takes a run sent
    /// after a partition for one of a dead caller.
    pub(crate) async fn publish(&self, run: &str, request: Vec<u8>, deadline: Deadline) -> Result<u64, Diagnostic> {
        let subject = self.broker.names.run_subject(&self.pool);
        let sequence = self
            .keep_trying("the run", deadline, || {
                let publish = PublishMessage::build().payload(request.clone().into()).message_id(run);
                let subject = subject.clone();
                async move {
                    if self.health().lease_written.elapsed() >= self.broker.lease_ttl / 2 {
                        let _ = self.put_lease().await;
                    }
                    let sent = self.broker.jetstream.send_publish(subject, publish).await;
                    match sent.map_err(|e| e.to_string()) {
                        Ok(ack) => match ack.await.map_err(|e| e.to_string()) {
                            Ok(ack) => Tried::Done(ack.sequence),
                            Err(error) => self.publish_failed(error),
                        },
                        Err(error) => self.publish_failed(error),
                    }
                }
            })
            .await?;
        if let Some(slot) = self.slots().get(run) {
            slot.stream_seq.store(sequence, Ordering::Release);
        }
        Ok(sequence)
    }

    /// A publish the broker refused: for good when its store is full.
    fn publish_failed<T>(&self, error: String) -> Tried<T> {
        if !store_is_full(&error) {
            return Tried::Failed(error);
        }
        tracing::warn!(provider = %self.provider, %error, "the broker refused to store a remote run");
        Tried::Refused(
            Diagnostic::new(&self.provider, Stage::Initialize, Category::BrokerUnreachable)
                .with_reason("the broker refused to store the run: its store is full"),
        )
    }
}

/// Whether a publish error is JetStream refusing to store more (its store
/// or the stream's limits are full): retrying will not help.
fn store_is_full(error: &str) -> bool {
    let error = error.to_ascii_lowercase();
    ["insufficient resources", "maximum bytes", "maximum messages", "storage"].iter().any(|mark| error.contains(mark))
}
