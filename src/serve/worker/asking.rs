//! A held run's permission requests, asked of its caller through the broker.
//!
//! A run whose caller said it answers (`approvals` in its request) is
//! started with a route to a [`CallerApprover`]: a request of any run of
//! its subtree here (an `acp` child with `permission = "ask"`) is sent as
//! a core NATS request ([`ApprovalAsk`]) to `<prefix>.approval.<caller>`,
//! and the reply is its answer. The asker's own timeout and cancel still
//! hold ([`crate::seam::Approvals::ask`]); when it stops waiting the
//! question is withdrawn (the same message without its request). A caller
//! that is gone has no subscriber: the request finds no responders and is
//! a reject at once; a broker that says nothing leaves the asker to its
//! timeout, a reject too. Question ids start at a random point per
//! delivery, so a redelivered run's questions are fresh to its caller.

use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::seam::{Answer, Approver, PermissionRequest};
use crate::wire::approval::answer_received;
use crate::wire::remote::{self as wire, ApprovalAsk, MAX_MESSAGE_BYTES, VERSION};

/// Asks one run's caller.
#[derive(Debug)]
pub(super) struct CallerApprover {
    client: async_nats::Client,
    subject: String,
    run: String,
    asked: AtomicU64,
}

impl CallerApprover {
    pub(super) fn new(client: async_nats::Client, subject: String, run: String) -> Self {
        CallerApprover { client, subject, run, asked: AtomicU64::new(first_id()) }
    }
}

/// Where a run's question ids start here: a random high part, so a run
/// redelivered to another worker (or this one, restarted) never reuses an
/// id its caller still holds from the last delivery, which would be
/// refused as not fresh.
fn first_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let random = std::collections::hash_map::RandomState::new().build_hasher().finish();
    random & 0x7fff_ffff_0000_0000
}

/// Withdraws a question whose asker stopped waiting before the answer.
struct Withdraw {
    client: async_nats::Client,
    subject: String,
    ask: Option<ApprovalAsk>,
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        let Some(ask) = self.ask.take() else { return };
        let (Ok(handle), Ok(bytes)) = (tokio::runtime::Handle::try_current(), wire::encode(&ask, MAX_MESSAGE_BYTES))
        else {
            return;
        };
        let (client, subject) = (self.client.clone(), self.subject.clone());
        handle.spawn(async move {
            let _ = client.publish(subject, bytes.into()).await;
        });
    }
}

impl Approver for CallerApprover {
    fn ask(&self, request: PermissionRequest, _cancel: CancellationToken) -> BoxFuture<'static, Answer> {
        let id = self.asked.fetch_add(1, Ordering::Relaxed) + 1;
        let ask = ApprovalAsk { v: VERSION, run: self.run.clone(), id, request: Some(request) };
        let (client, subject) = (self.client.clone(), self.subject.clone());
        let withdrawn = ApprovalAsk { request: None, ..ask.clone() };
        Box::pin(async move {
            let Ok(bytes) = wire::encode(&ask, MAX_MESSAGE_BYTES) else {
                return Answer::reject("a request too large for the broker");
            };
            let mut withdraw = Withdraw { client: client.clone(), subject: subject.clone(), ask: Some(withdrawn) };
            // No timeout of its own: the asker's bounds the wait.
            let sent = async_nats::Request::new().payload(bytes.into()).timeout(None);
            let replied = client.send_request(subject, sent).await;
            withdraw.ask = None;
            match replied {
                Ok(reply) if reply.payload.len() <= MAX_MESSAGE_BYTES => {
                    let answer = serde_json::from_slice::<serde_json::Value>(&reply.payload).ok();
                    answer_received(answer.as_ref(), None)
                }
                Ok(_) => Answer::reject("an answer from the caller too large to read"),
                Err(error) if error.kind() == async_nats::RequestErrorKind::NoResponders => {
                    Answer::reject("the caller is gone (no one answers on the broker)")
                }
                Err(_) => Answer::reject("the caller could not be asked through the broker"),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn two_deliveries_of_a_run_start_their_question_ids_apart() {
        let starts: std::collections::HashSet<u64> = (0..16).map(|_| super::first_id()).collect();
        assert!(starts.len() > 1, "ids start at random points: {starts:?}");
        assert!(starts.iter().all(|start| start.checked_add(u32::MAX.into()).is_some()), "with room to count");
    }
}
