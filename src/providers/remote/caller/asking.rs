//! The permission requests a caller's runs send from their workers.
//!
//! A run whose route reaches an approver says so in its request
//! (`approvals`), and is noted here ([`Caller::answer_for`]). Its worker's
//! subtree then asks on `<prefix>.approval.<caller>` (core NATS
//! request-reply): each question is read and cut
//! ([`crate::wire::approval::received`]), asked of the run's approvals
//! with the worker's path under the run's ([`Approvals::ask_from_below`]),
//! and the answer sent to the request's reply inbox. The worker withdraws
//! a question it stopped waiting on (its asker's timeout or cancel), which
//! withdraws it here. A question about a run this caller does not hold, a
//! question past [`MAX_PENDING`] waiting ones of its run, and every question of a run
//! that was cancelled or disposed ([`Caller::stop_answering`]) is answered
//! reject. A caller that is gone has no subscriber: the worker's request
//! finds no responders and rejects.

use std::collections::HashMap;

use async_nats::Subject;
use tokio_util::sync::CancellationToken;

use super::Caller;
use crate::seam::{Answer, Approvals};
use crate::wire::approval::{received, LONGEST_WAIT, MAX_PENDING};
use crate::wire::remote::ApprovalAsk;

/// The runs that ask this caller, and their questions waiting.
#[derive(Debug, Default)]
pub(super) struct Asking {
    /// Run → its approvals, and the token tripped when it stops answering.
    runs: HashMap<String, (Approvals, CancellationToken)>,
    /// (run, question id) → the question's own token.
    waiting: HashMap<(String, u64), CancellationToken>,
}

impl Caller {
    fn asking(&self) -> std::sync::MutexGuard<'_, Asking> {
        self.asking.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `run`'s permission requests are asked of `approvals` until `closed`
    /// trips or [`Caller::stop_answering`].
    pub(crate) fn answer_for(&self, run: &str, approvals: Approvals, closed: CancellationToken) {
        self.asking().runs.insert(run.to_owned(), (approvals, closed));
    }

    /// `run` answers no more: what it has waiting is rejected.
    pub(crate) fn stop_answering(&self, run: &str) {
        if let Some((_, closed)) = self.asking().runs.remove(run) {
            closed.cancel();
        }
    }

    /// One message on the approval subject: a question (answered on
    /// `reply`) or a withdrawal.
    pub(super) fn asked(self: &std::sync::Arc<Self>, ask: ApprovalAsk, reply: Option<Subject>) {
        let key = (ask.run.clone(), ask.id);
        let Some(request) = ask.request else {
            if let Some(token) = self.asking().waiting.remove(&key) {
                token.cancel();
            }
            return;
        };
        let Some(reply) = reply else { return };
        let found = {
            let mut asking = self.asking();
            match asking.runs.get(&ask.run).cloned() {
                None => Err("the caller holds no such run"),
                Some(_) if asking.waiting.keys().filter(|(run, _)| *run == ask.run).count() >= MAX_PENDING => {
                    Err("too many requests waiting at once")
                }
                Some(_) if asking.waiting.contains_key(&key) => Err("a request without a fresh id"),
                Some((approvals, closed)) => {
                    let token = closed.child_token();
                    asking.waiting.insert(key.clone(), token.clone());
                    Ok((approvals, token))
                }
            }
        };
        let caller = self.clone();
        tokio::spawn(async move {
            let answer = match found {
                Ok((approvals, token)) => {
                    let answer = approvals.ask_from_below(received(request), LONGEST_WAIT, &token).await;
                    // Withdrawn meanwhile: the worker no longer listens.
                    if caller.asking().waiting.remove(&key).is_none() {
                        return;
                    }
                    answer
                }
                Err(why) => Answer::reject(why),
            };
            let bytes = serde_json::to_vec(&answer).unwrap_or_default();
            let _ = caller.broker.client.publish(reply, bytes.into()).await;
        });
    }
}
