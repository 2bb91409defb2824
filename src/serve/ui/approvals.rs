//! The permission requests a batch parked in the home
//! (`<home>/approvals/pending/`, see [`crate::batch::ParkedApprover`]), as
//! the Live view lists them, and the page's way to answer one.
//!
//! A [`Waiting`] list is read from the directory every [`LOOK_EVERY`] (and
//! at once after an answer from the page) on a blocking thread, and each
//! change is pushed to the open views like the board's. It reads the same
//! files `subagents approve` does, so it shows what a batch of another
//! process parked as well as this one's.
//!
//! An answer from the page is a `POST /api/approve` whose body names the
//! request and the verdict, and goes through [`crate::batch::answer`]: the
//! same one atomic rename as `subagents approve`, so the first answer wins
//! and a later one (from the page, the command, or after the run stopped
//! waiting) is refused. The POST is guarded more than a read: the token
//! must come in a header (a cross-site form cannot set one, and no CORS
//! preflight is ever allowed), the body must be JSON, and a request a
//! browser marks as from another origin (`Origin`, `Sec-Fetch-Site`) is
//! refused.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::{watch, Notify};

use crate::batch::{answer, pending, AnswerError, Parked};
use crate::seam::Verdict;
use crate::CancellationToken;

/// How often the pending directory is looked at.
pub(super) const LOOK_EVERY: Duration = Duration::from_millis(500);
/// The most waiting requests a view is sent; the rest are counted.
const MAX_LISTED: usize = 200;

/// The requests waiting in one home, kept fresh; see the [module](self).
#[derive(Debug)]
pub(super) struct Waiting {
    home: PathBuf,
    list: watch::Sender<Arc<Value>>,
    /// Wakes the reader at once (after an answer).
    look_now: Notify,
}

impl Waiting {
    pub(super) fn new(home: PathBuf) -> Waiting {
        let (list, _) = watch::channel(Arc::new(json!({"requests": [], "more": 0})));
        Waiting { home, list, look_now: Notify::new() }
    }

    /// A receiver that wakes on every change of the list.
    pub(super) fn changes(&self) -> watch::Receiver<Arc<Value>> {
        self.list.subscribe()
    }

    /// The list now.
    pub(super) fn now(&self) -> Arc<Value> {
        self.list.borrow().clone()
    }

    /// Reads the directory until `stop`, telling the views of each change.
    pub(super) async fn keep_reading(self: Arc<Self>, stop: CancellationToken) {
        loop {
            let home = self.home.clone();
            if let Ok(list) = tokio::task::spawn_blocking(move || listed(&home)).await {
                self.list.send_if_modified(|kept| {
                    let changed = **kept != list;
                    if changed {
                        *kept = Arc::new(list);
                    }
                    changed
                });
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(LOOK_EVERY) => {}
                () = self.look_now.notified() => {}
            }
        }
    }

    /// Answers the request `id` with `verdict`, if it still waits: blocking
    /// (a rename in the home). Its JSON on success.
    pub(super) fn answer(&self, id: &str, verdict: Verdict) -> Result<Value, AnswerError> {
        let parked = answer(&self.home, id, verdict)?;
        self.look_now.notify_one();
        Ok(json!({
            "answered": parked.id,
            "verdict": verdict.to_string(),
            "asker": parked.request.asker_line(),
            "call": parked.request.call_line(),
        }))
    }
}

/// The waiting requests of `home` as the page shows them, oldest first.
fn listed(home: &Path) -> Value {
    match pending(home) {
        Ok(all) => {
            let more = all.len().saturating_sub(MAX_LISTED);
            let requests: Vec<Value> = all.iter().take(MAX_LISTED).map(request_json).collect();
            json!({"requests": requests, "more": more})
        }
        Err(error) => json!({"requests": [], "more": 0, "error": error.to_string()}),
    }
}

/// One waiting request: its texts are the child's (bounded where it was
/// parked), shown as text by the page.
fn request_json(parked: &Parked) -> Value {
    let request = &parked.request;
    let asker: Vec<Value> = request
        .asker
        .iter()
        .map(|hop| json!({"provider": hop.provider, "label": hop.label, "depth": hop.depth}))
        .collect();
    let options: Vec<Value> =
        request.options.iter().map(|option| json!({"name": option.name, "kind": option.kind})).collect();
    json!({
        "id": parked.id,
        "parked_at_ms": parked.parked_at.saturating_mul(1000),
        "asker": asker,
        "tool": request.tool,
        "kind": request.kind,
        "title": request.title,
        "input": request.input,
        "paths": request.paths.iter().take(20).collect::<Vec<_>>(),
        "options": options,
        "always_covers": request.always_covers(),
        "offers": {
            "allow": request.offers(Verdict::AllowOnce),
            "always": request.offers(Verdict::AllowAlways),
            "reject": request.offers(Verdict::Reject),
        },
    })
}

/// The verdict an answer's word names: `allow`, `always` or `reject`, as
/// `subagents approve` takes them.
pub(super) fn verdict_of(word: &str) -> Option<Verdict> {
    match word {
        "allow" => Some(Verdict::AllowOnce),
        "always" => Some(Verdict::AllowAlways),
        "reject" => Some(Verdict::Reject),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_words_are_those_of_subagents_approve() {
        assert_eq!(verdict_of("allow"), Some(Verdict::AllowOnce));
        assert_eq!(verdict_of("always"), Some(Verdict::AllowAlways));
        assert_eq!(verdict_of("reject"), Some(Verdict::Reject));
        assert_eq!(verdict_of("Allow"), None);
    }

    #[test]
    fn an_empty_or_missing_directory_lists_nothing() {
        let home = tempfile::tempdir().unwrap();
        assert_eq!(listed(home.path()), json!({"requests": [], "more": 0}));
    }
}
