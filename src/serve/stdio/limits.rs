//! The served session's model calls, admitted by its parent's limiters
//! too.
//!
//! When the parent lends routes in `initialize` (`limits: [names]`), each
//! limiter of the child for a route of a lent name (its session's model
//! when `model_route` names one; a route of its own `--config`) draws on a
//! [`ParentRoute`]: after its own limits, each call asks the parent
//! (`limit/admit`, id `limit-N`) and waits for its answer, then tells the
//! parent what became of it (see [`crate::wire::limit`]). The child keeps
//! at most [`MAX_OUTSTANDING`] asks open at once; more wait here first.
//!
//! **A parent that dies is not waited for.** At the end of input (the
//! parent closed the pipe, or was killed), at `shutdown` and at a stop
//! signal, [`ParentLimits::close`] fails every pending ask and every later
//! one: the call goes on the child's own limits (its limiter says so once),
//! and the session's turn is then cancelled as it always is. A parent that
//! lives but never answers holds the call until its own cancel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use crate::agent::{Unreachable, UpstreamGrant, UpstreamLimiter};
use crate::wire::limit::{ADMIT, ANSWERED, COOL_DOWN, MAX_OUTSTANDING, REFUSED, RELEASE, SETTLE};

/// The asks waiting on the parent, by id; `gone` once it can answer no
/// more (why).
#[derive(Default)]
struct Book {
    next: u64,
    pending: HashMap<String, oneshot::Sender<Result<(), String>>>,
    gone: Option<String>,
}

fn lock(book: &Mutex<Book>) -> MutexGuard<'_, Book> {
    book.lock().unwrap_or_else(|e| e.into_inner())
}

/// The parent at the other end of the session's stdio, as the lender of
/// route limiters.
pub(super) struct ParentLimits {
    out: mpsc::UnboundedSender<Value>,
    book: Mutex<Book>,
    /// Asks open at once (waiting or admitted).
    open: Arc<Semaphore>,
}

impl std::fmt::Debug for ParentLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParentLimits").field("pending", &lock(&self.book).pending.len()).finish_non_exhaustive()
    }
}

impl ParentLimits {
    pub(super) fn new(out: mpsc::UnboundedSender<Value>) -> Arc<Self> {
        Arc::new(ParentLimits { out, book: Mutex::default(), open: Arc::new(Semaphore::new(MAX_OUTSTANDING)) })
    }

    /// The limiter of the parent's route `route`.
    pub(super) fn route(self: &Arc<Self>, route: &str) -> Arc<ParentRoute> {
        Arc::new(ParentRoute { route: route.to_owned(), parent: self.clone() })
    }

    /// The parent's response to ask `id`: admitted, or refused. `false`
    /// when no ask of ours has that id (a stale answer is ignored).
    pub(super) fn answered(&self, id: &Value, message: &Value) -> bool {
        let Some(id) = id.as_str() else { return false };
        let Some(waiting) = lock(&self.book).pending.remove(id) else {
            return id.starts_with("limit-");
        };
        let outcome = match (message.get("result"), message.get("error")) {
            (Some(_), None) => Ok(()),
            _ => {
                let said = message["error"]["message"].as_str().unwrap_or_default();
                Err(format!("the parent refused the ask: {}", crate::seam::safe_line(crate::seam::cut(said, 200))))
            }
        };
        let _ = waiting.send(outcome);
        true
    }

    /// The parent can answer no more: every pending ask, and every later
    /// one, fails saying `why`.
    pub(super) fn close(&self, why: &str) {
        let pending: Vec<_> = {
            let mut book = lock(&self.book);
            book.gone.get_or_insert_with(|| why.to_owned());
            book.pending.drain().map(|(_, waiting)| waiting).collect()
        };
        for waiting in pending {
            let _ = waiting.send(Err(why.to_owned()));
        }
    }

    fn notify(&self, method: &str, params: Value) {
        let _ = self.out.send(json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }
}

/// One of the parent's routes, as a limiter of the child draws on it.
#[derive(Debug)]
pub(super) struct ParentRoute {
    route: String,
    parent: Arc<ParentLimits>,
}

impl UpstreamLimiter for ParentRoute {
    fn admit(&self, estimated_tokens: u64) -> BoxFuture<'static, Result<Box<dyn UpstreamGrant>, Unreachable>> {
        let (parent, route) = (self.parent.clone(), self.route.clone());
        Box::pin(async move {
            let open = parent.open.clone().acquire_owned().await.expect("the asks' bound never closes");
            let (answer, answered) = oneshot::channel();
            let id = {
                let mut book = lock(&parent.book);
                if let Some(why) = &book.gone {
                    return Err(Unreachable(why.clone()));
                }
                book.next += 1;
                let id = format!("limit-{}", book.next);
                book.pending.insert(id.clone(), answer);
                id
            };
            let params = json!({"route": route, "estimated_tokens": estimated_tokens});
            let _ = parent.out.send(json!({"jsonrpc": "2.0", "id": id, "method": ADMIT, "params": params}));
            // Dropped with the future before the answer: the wait is released.
            let mut grant = Grant { id, parent: parent.clone(), _open: open, over: false };
            let refused = match answered.await {
                Ok(Ok(())) => return Ok(Box::new(grant) as Box<dyn UpstreamGrant>),
                Ok(Err(why)) => why,
                Err(_) => "the parent is gone".to_owned(),
            };
            // Refused or unanswered: the parent holds nothing for it.
            grant.over = true;
            Err(Unreachable(refused))
        })
    }

    fn cool_down(&self, duration: Duration) {
        let millis = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        self.parent.notify(COOL_DOWN, json!({"route": self.route, "millis": millis}));
    }
}

/// An ask of the parent: waiting, then admitted; released when dropped
/// before it is over.
#[derive(Debug)]
struct Grant {
    id: String,
    parent: Arc<ParentLimits>,
    /// Its place among the asks open at once.
    _open: OwnedSemaphorePermit,
    /// Settled, or refused by the parent: nothing to release.
    over: bool,
}

impl UpstreamGrant for Grant {
    fn answered(&self) {
        self.parent.notify(ANSWERED, json!({"id": self.id}));
    }

    fn refused(&self, explained: bool) {
        self.parent.notify(REFUSED, json!({"id": self.id, "explained": explained}));
    }

    fn settle(mut self: Box<Self>, used_tokens: u64) {
        self.over = true;
        self.parent.notify(SETTLE, json!({"id": self.id, "used_tokens": used_tokens}));
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        if self.over {
            return;
        }
        // A wait withdrawn (the call cancelled) or a call over without a
        // usage: the parent gives back what it holds for it.
        lock(&self.parent.book).pending.remove(&self.id);
        self.parent.notify(RELEASE, json!({"id": self.id}));
    }
}
