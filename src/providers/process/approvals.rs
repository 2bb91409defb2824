//! A process child's permission requests, answered by the run's approvals.
//!
//! A run whose route reaches an approver tells its child so in
//! `initialize`; the child's runtime then sends each request of its own
//! runs (an `acp` grandchild's `ask`) up as `permission`. Here each is
//! read and cut ([`crate::wire::approval::received`]), asked of the run's
//! [`Approvals`] with the child's path put under this run's
//! ([`Approvals::ask_from_below`]), and its answer sent back to exactly
//! that request id. The child waits with its own timeout and withdraws the
//! question when it stops waiting (`permission_withdrawn`), which
//! withdraws it here; [`MAX_PENDING`] requests wait at once, one more is
//! rejected. When the run is cancelled or disposed (`closed` trips) every
//! pending request is answered reject, and so is any that comes later.

use std::collections::HashMap;

use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::seam::{Answer, Approvals, PermissionRequest};
use crate::wire::approval::{received, LONGEST_WAIT, MAX_PENDING};
use crate::wire::process::{ChildAsk, Replier};

/// Answers the child's requests until its connection's reader ends.
pub(super) async fn answer_child(
    mut asks: mpsc::UnboundedReceiver<ChildAsk>,
    approvals: Approvals,
    replier: Replier,
    closed: CancellationToken,
) {
    // Each waiting request's own token, by the id the child gave it.
    let mut waiting: HashMap<String, CancellationToken> = HashMap::new();
    let mut answering = FuturesUnordered::new();
    let mut reading = true;
    while reading || !answering.is_empty() {
        tokio::select! {
            ask = asks.recv(), if reading => match ask {
                Some(ChildAsk::Ask { id, params }) => {
                    // An id too large to keep is answered with none.
                    let id = if fit_id(&id) { id } else { serde_json::Value::Null };
                    let key = id.to_string();
                    let request = serde_json::from_value::<PermissionRequest>(params["request"].clone());
                    let refused = match request {
                        _ if !fit_id(&id) || waiting.contains_key(&key) => Some("a request without a fresh id"),
                        _ if waiting.len() >= MAX_PENDING => Some("too many requests waiting at once"),
                        Err(_) => Some("a request that could not be read"),
                        Ok(_) => None,
                    };
                    match (refused, request) {
                        (None, Ok(request)) => {
                            // The child's runtime counts depth from its own
                            // session: on from this run's, here.
                            let mut request = received(request);
                            let base = approvals.path().last().map_or(0, |hop| hop.depth);
                            request.asker.iter_mut().for_each(|hop| hop.depth = hop.depth.saturating_add(base));
                            let token = closed.child_token();
                            waiting.insert(key, token.clone());
                            let approvals = approvals.clone();
                            answering.push(async move {
                                let answer = approvals.ask_from_below(request, LONGEST_WAIT, &token).await;
                                (id, answer)
                            });
                        }
                        (refused, _) => reply(&replier, &id, &Answer::reject(refused.unwrap_or_default())),
                    }
                }
                Some(ChildAsk::Withdrawn { id }) => {
                    if let Some(token) = waiting.remove(&id.to_string()) {
                        token.cancel();
                    }
                }
                // The reader ended: what waits is rejected, to no one.
                None => {
                    reading = false;
                    closed.cancel();
                }
            },
            Some((id, answer)) = answering.next(), if !answering.is_empty() => {
                // A withdrawn request is not answered: the child gave up on it.
                if waiting.remove(&id.to_string()).is_some() {
                    reply(&replier, &id, &answer);
                }
            }
        }
    }
}

fn reply(replier: &Replier, id: &Value, answer: &Answer) {
    replier.reply(id, serde_json::to_value(answer).unwrap_or_default());
}

/// Whether `id` is one a request may carry: a number, or a string of at
/// most 64 bytes (the child's own are `approval-N`). Anything else is
/// neither kept nor echoed back.
fn fit_id(id: &serde_json::Value) -> bool {
    match id {
        serde_json::Value::Number(_) => true,
        serde_json::Value::String(id) => id.len() <= 64,
        _ => false,
    }
}
