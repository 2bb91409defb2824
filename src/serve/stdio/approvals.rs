//! The served session's requests for permission, asked of its parent.
//!
//! When the parent's `initialize` says it answers (`approvals: true`), the
//! runtime's approver is a [`ParentApprover`]: a request of any run below
//! the session (an `acp` grandchild's `ask`, however deep) goes up the
//! wire as `permission` with an id of its own, and the parent's response
//! to that id is its answer. The asker's own timeout and cancel still
//! hold ([`crate::seam::Approvals::ask`]): when it stops waiting, the
//! question is withdrawn (`permission_withdrawn`) and a later answer to it
//! is ignored.
//!
//! **A parent that dies answers reject.** At the end of input (the parent
//! closed the pipe, or was killed), at `shutdown` and at a stop signal,
//! [`ParentApprover::close`] answers every pending request reject at once,
//! and every later one, before the session's turn is cancelled, so no
//! grandchild is left waiting on a parent that is gone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::seam::{Answer, Approver, PermissionRequest};
use crate::wire::approval::answer_received;
use crate::wire::process::{PERMISSION, PERMISSION_WITHDRAWN};

/// The requests waiting on the parent, by id; `gone` once it can answer
/// no more (why).
#[derive(Default)]
struct Book {
    next: u64,
    pending: HashMap<String, oneshot::Sender<Answer>>,
    gone: Option<String>,
}

/// Asks the parent at the other end of the session's stdio.
pub(super) struct ParentApprover {
    out: mpsc::UnboundedSender<Value>,
    book: Arc<Mutex<Book>>,
    /// How many asks are still running (answered or not).
    live: Arc<watch::Sender<usize>>,
}

impl std::fmt::Debug for ParentApprover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParentApprover").field("live", &*self.live.borrow()).finish_non_exhaustive()
    }
}

fn lock(book: &Mutex<Book>) -> MutexGuard<'_, Book> {
    book.lock().unwrap_or_else(|e| e.into_inner())
}

impl ParentApprover {
    pub(super) fn new(out: mpsc::UnboundedSender<Value>) -> Self {
        ParentApprover { out, book: Arc::default(), live: Arc::new(watch::Sender::new(0)) }
    }

    /// The parent's response to request `id`: its answer, if the request
    /// still waits (a stale or unknown id is ignored). `false` when no
    /// request of ours has that id.
    pub(super) fn answered(&self, id: &Value, message: &Value) -> bool {
        let Some(id) = id.as_str() else { return false };
        let Some(waiting) = lock(&self.book).pending.remove(id) else {
            tracing::debug!(id, "an answer to a request that no longer waits is ignored");
            return id.starts_with("approval-");
        };
        let _ = waiting.send(answer_received(message.get("result"), message.get("error")));
        true
    }

    /// The parent can answer no more: every pending request, and every
    /// later one, is a reject saying `why`; returns once the pending asks
    /// have taken their answers, within `bound`.
    pub(super) async fn close(&self, why: &str, bound: Duration) {
        let pending: Vec<_> = {
            let mut book = lock(&self.book);
            book.gone.get_or_insert_with(|| why.to_owned());
            book.pending.drain().map(|(_, waiting)| waiting).collect()
        };
        for waiting in pending {
            let _ = waiting.send(Answer::reject(why));
        }
        let mut live = self.live.subscribe();
        let _ = tokio::time::timeout(bound, live.wait_for(|live| *live == 0)).await;
    }
}

/// Takes a request off the book and tells the parent when its asker stops
/// waiting before the answer came; counts the ask as done either way.
struct Waiting {
    id: String,
    out: mpsc::UnboundedSender<Value>,
    book: Arc<Mutex<Book>>,
    live: Arc<watch::Sender<usize>>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if lock(&self.book).pending.remove(&self.id).is_some() {
            let withdrawn = json!({"jsonrpc": "2.0", "method": PERMISSION_WITHDRAWN, "params": {"id": self.id}});
            let _ = self.out.send(withdrawn);
        }
        self.live.send_modify(|live| *live -= 1);
    }
}

impl Approver for ParentApprover {
    fn ask(&self, request: PermissionRequest, _cancel: CancellationToken) -> BoxFuture<'static, Answer> {
        let (answer, answered) = oneshot::channel();
        let id = {
            let mut book = lock(&self.book);
            if let Some(why) = &book.gone {
                let why = why.clone();
                return Box::pin(async move { Answer::reject(why) });
            }
            book.next += 1;
            let id = format!("approval-{}", book.next);
            book.pending.insert(id.clone(), answer);
            id
        };
        self.live.send_modify(|live| *live += 1);
        let asked = json!({"jsonrpc": "2.0", "id": id, "method": PERMISSION, "params": {"request": request}});
        let _ = self.out.send(asked);
        // Dropped with the future: a question withdrawn (the asker's
        // cancel or timeout) is taken back from the parent.
        let waiting = Waiting { id, out: self.out.clone(), book: self.book.clone(), live: self.live.clone() };
        Box::pin(async move {
            let _waiting = waiting;
            answered.await.unwrap_or_else(|_| Answer::reject("the parent is gone"))
        })
    }
}
