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
//! A look costs what it shows, not what waits: a directory unchanged since
//! the last look is not listed again; otherwise its entries are stat'ed
//! and, oldest first (by the time their file was written), looked at for
//! their batch's lock: a request whose batch is gone (it no longer holds
//! the file's lock) is neither shown nor counted. The [`MAX_LISTED`] oldest
//! waiting ones are read, each at most [`MAX_PARKED_BYTES`] (a file read
//! before is read again only when its time or size changed; one that is
//! not a request is left out); the waiting ones past them are counted as
//! `more`, not read. The shown ones are checked for their lock at every
//! look. Every text a
//! view is sent is cut at [`MAX_SHOWN_TEXT`].
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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};
use tokio::sync::{watch, Notify};

use crate::batch::parked::{open_if_waited, pending_dir, read_parked, MAX_PARKED_BYTES};
use crate::batch::{answer, AnswerError, Parked};
use crate::seam::Verdict;
use crate::CancellationToken;

/// How often the pending directory is looked at.
pub(super) const LOOK_EVERY: Duration = Duration::from_millis(500);
/// The most waiting requests a view is sent; the rest are counted.
const MAX_LISTED: usize = 200;
/// The longest text of a request a view is sent (a title, an input, a path).
const MAX_SHOWN_TEXT: usize = crate::seam::MAX_SHOWN_INPUT;
/// A directory changed this recently is listed again even when its time
/// looks the same (a file system's clock may be coarse).
const SETTLED_AFTER: Duration = Duration::from_secs(2);

/// The requests waiting in one home, kept fresh; see the [module](self).
#[derive(Debug)]
pub(super) struct Waiting {
    home: PathBuf,
    list: watch::Sender<Arc<Value>>,
    /// Wakes the reader at once (after an answer).
    look_now: Notify,
    /// What the last look saw, so the next reads only what changed.
    seen: Mutex<Seen>,
}

/// The directory's time at the last look, and the requests shown then by
/// file name, each with its file's time and size.
#[derive(Debug, Default)]
struct Seen {
    directory: Option<SystemTime>,
    shown: HashMap<std::ffi::OsString, (SystemTime, u64, Option<Value>)>,
}

impl Waiting {
    pub(super) fn new(home: PathBuf) -> Waiting {
        let (list, _) = watch::channel(Arc::new(json!({"requests": [], "more": 0})));
        Waiting { home, list, look_now: Notify::new(), seen: Mutex::default() }
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
            let waiting = self.clone();
            if let Ok(Some(list)) = tokio::task::spawn_blocking(move || waiting.look()).await {
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

    /// The list as the directory holds it now, or `None` when the directory
    /// has not changed since the last look. Blocking.
    fn look(&self) -> Option<Value> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        listed(&self.home, &mut seen)
    }

    /// Answers the request `id` with `verdict`, if it still waits: blocking
    /// (a rename in the home). Its JSON on success.
    pub(super) fn answer(&self, id: &str, verdict: Verdict) -> Result<Value, AnswerError> {
        let parked = answer(&self.home, id, verdict)?;
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).directory = None;
        self.look_now.notify_one();
        Ok(json!({
            "answered": parked.id,
            "verdict": verdict.to_string(),
            "asker": parked.request.asker_line(),
            "call": parked.request.call_line(),
        }))
    }
}

/// The waiting requests of `home` as the page shows them, oldest first,
/// reading only what changed since `seen`; `None` when the directory did
/// not change.
fn listed(home: &Path, seen: &mut Seen) -> Option<Value> {
    let dir = pending_dir(home);
    let directory = match std::fs::metadata(&dir) {
        Ok(metadata) => metadata.modified().ok(),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            seen.shown.clear();
            seen.directory = None;
            return Some(json!({"requests": [], "more": 0}));
        }
        Err(error) => {
            return Some(json!({"requests": [], "more": 0, "error": format!("cannot read {}: {error}", dir.display())}))
        }
    };
    let settled = directory.is_some_and(|time| time.elapsed().is_ok_and(|age| age >= SETTLED_AFTER));
    // A batch killed while it waits leaves its file but not its lock: a
    // request no one waits on any more is never shown, so the listed ones
    // are looked at again even when the directory is unchanged.
    let shown_still_waited = || {
        seen.shown
            .iter()
            .filter(|(_, (_, _, request))| request.is_some())
            .all(|(name, _)| open_if_waited(&dir.join(name)).is_some())
    };
    if settled && directory == seen.directory && shown_still_waited() {
        return None;
    }
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(error) => {
            return Some(json!({"requests": [], "more": 0, "error": format!("cannot read {}: {error}", dir.display())}))
        }
    };
    // Only the entries' times and sizes: no file is opened here.
    let mut files: Vec<(SystemTime, std::ffi::OsString, u64)> = entries
        .flatten()
        .filter(|entry| entry.file_name().to_str().is_some_and(|name| name.ends_with(".json")))
        .filter_map(|entry| {
            let metadata = entry.metadata().ok()?;
            let fits = metadata.is_file() && metadata.len() <= MAX_PARKED_BYTES;
            fits.then(|| (metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH), entry.file_name(), metadata.len()))
        })
        .collect();
    // Oldest first; a request whose batch is gone (its lock not held) is
    // neither listed nor counted, and past the list a waiting one is only
    // counted (its lock looked at, the file not read).
    files.sort_unstable();
    let mut shown = HashMap::with_capacity(files.len().min(MAX_LISTED));
    let mut requests: Vec<(u64, String, Value)> = Vec::with_capacity(files.len().min(MAX_LISTED));
    let mut more = 0usize;
    for (modified, name, len) in files {
        // Opened once: its lock looked at, then read from when not kept.
        let Some(file) = open_if_waited(&dir.join(&name)) else { continue };
        if requests.len() >= MAX_LISTED {
            more += 1;
            continue;
        }
        let kept = seen.shown.remove(&name).filter(|(time, size, _)| *time == modified && *size == len);
        let request = match kept {
            Some((_, _, request)) => request,
            None => read_parked(&file).map(|parked| request_json(&parked)),
        };
        if let Some(request) = &request {
            let parked_at = request["parked_at_ms"].as_u64().unwrap_or_default();
            requests.push((parked_at, request["id"].as_str().unwrap_or_default().to_owned(), request.clone()));
        }
        shown.insert(name, (modified, len, request));
    }
    seen.shown = shown;
    seen.directory = if settled { directory } else { None };
    requests.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    let requests: Vec<Value> = requests.into_iter().map(|(_, _, request)| request).collect();
    Some(json!({"requests": requests, "more": more}))
}

/// One waiting request: its texts are the child's (bounded where it was
/// parked), shown as text by the page.
fn request_json(parked: &Parked) -> Value {
    let request = &parked.request;
    let asker: Vec<Value> = request
        .asker
        .iter()
        .map(|hop| json!({"provider": cut(&hop.provider), "label": hop.label.as_deref().map(cut), "depth": hop.depth}))
        .collect();
    let options: Vec<Value> =
        request.options.iter().take(16).map(|option| json!({"name": cut(&option.name), "kind": option.kind})).collect();
    json!({
        "id": parked.id,
        "parked_at_ms": parked.parked_at.saturating_mul(1000),
        "asker": asker,
        "tool": request.tool.as_deref().map(cut),
        "kind": request.kind.as_deref().map(cut),
        "title": request.title.as_deref().map(cut),
        "input": request.input.as_deref().map(cut),
        "paths": request.paths.iter().take(20).map(|path| cut(path)).collect::<Vec<_>>(),
        "options": options,
        "always_covers": request.always_covers(),
        "offers": {
            "allow": request.offers(Verdict::AllowOnce),
            "always": request.offers(Verdict::AllowAlways),
            "reject": request.offers(Verdict::Reject),
        },
    })
}

/// `text`, at most [`MAX_SHOWN_TEXT`] bytes of it (cut at a character).
fn cut(text: &str) -> String {
    if text.len() <= MAX_SHOWN_TEXT {
        return text.to_owned();
    }
    let mut end = MAX_SHOWN_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
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
        assert_eq!(listed(home.path(), &mut Seen::default()), Some(json!({"requests": [], "more": 0})));
    }
}
