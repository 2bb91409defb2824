//! Parked permission requests: the door of a batch, where nobody sits at
//! the keyboard.
//!
//! A [`ParkedApprover`] answers what a policy decides (`[approvals]`, see
//! [`crate::seam::Rules`]: `allow` and `reject` at once) and parks what
//! it leaves to `ask`: the request is written to
//! `<home>/approvals/pending/<ID>.json` and waits there until somebody
//! answers it from another terminal or process ([`answer`], which
//! `subagents approve ID allow|always|reject` calls), or until the child's
//! run stops waiting (its provider's `permission_timeout`, a cancel, the
//! batch's end): the request is then removed and is a reject.
//!
//! **One answer, and only while it waits.** The answer is one atomic
//! rename, `pending/<ID>.json` → `answered/<ID>.<verdict>.json`, and
//! giving up is one atomic removal of the same file: whichever comes
//! first wins, so an answer to a request that no longer waits (answered,
//! expired, its run ended) is refused ([`AnswerError::NotPending`]) and a
//! request is never answered twice. [`pending`] lists what waits.
//!
//! **An answer binds to exactly its request.** An id is 128 random bits,
//! never made again by any process, and the file carries the request's
//! content digest (SHA-256 of its JSON): the batch takes an answer only
//! from a file of its id whose request has its digest, and any other is a
//! reject. The batch holds a lock on its request's file for as long as it
//! waits (the system drops it when the process ends, however it ends), so
//! an answer for a batch that is gone — killed while its request was
//! parked — is refused ([`AnswerError::Gone`]) and its request is taken
//! away, never left for anything later to take.
//!
//! ```no_run
//! # fn demo(subagents: &subagents::Subagents, home: &std::path::Path) -> Result<(), subagents::batch::AnswerError> {
//! use std::sync::Arc;
//!
//! use subagents::batch::{answer, pending, ParkedApprover};
//! use subagents::seam::{Policy, Rule, Rules, Verdict};
//!
//! // The batch's side: reads are allowed, the rest waits for a person.
//! let rules = Rules::new(Policy::Ask).with(Rule::new(Policy::Allow).kind("read"));
//! subagents.set_approver(Arc::new(ParkedApprover::new(rules, home)));
//!
//! // Another process, on the same home.
//! for parked in pending(home)? {
//!     answer(home, &parked.id, Verdict::AllowOnce)?;
//! }
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::seam::{Answer, Approver, PermissionRequest, Policy, Rules, Verdict};

/// How often the answers given in a home are looked for (one look for
/// every request a [`ParkedApprover`] parked there).
const POLL_EVERY: Duration = Duration::from_millis(100);
/// The largest parked request file read back (a request's texts and
/// paths are bounded well below it).
pub(crate) const MAX_PARKED_BYTES: u64 = 1024 * 1024;
/// Who answered, as the child's transcript records it.
const BY_APPROVE: &str = "subagents approve";

/// A request waiting in `<home>/approvals/pending/`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Parked {
    /// Its id, for [`answer`]: letters, digits and `-`.
    pub id: String,
    /// What was asked.
    pub request: PermissionRequest,
    /// When it was parked, in seconds since the Unix epoch.
    pub parked_at: u64,
    /// The request's content digest ([`digest_of`]): an answer is taken
    /// only by the request that has it.
    pub digest: String,
}

/// A request's content digest: SHA-256 of its JSON, in hex.
pub fn digest_of(request: &PermissionRequest) -> String {
    use sha2::Digest;
    let json = serde_json::to_vec(request).unwrap_or_default();
    sha2::Sha256::digest(&json).iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Why [`answer`] or [`pending`] did not do what was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AnswerError {
    /// The id cannot be one this module made.
    #[error("{0:?} is not a request id (letters, digits and `-`, as `subagents approve --list` shows them)")]
    NotAnId(String),
    /// Nothing waits under this id: it was answered, it expired, or its
    /// run ended.
    #[error(
        "no request {0:?} is waiting for an answer: it was answered, it expired, or its run ended (`subagents approve --list` lists those that wait)"
    )]
    NotPending(String),
    /// The batch that parked the request is gone (its process ended
    /// without taking the request back): no one would take the answer.
    #[error(
        "request {0:?} was parked by a batch that is gone (its process ended without taking it back): the answer was not given"
    )]
    Gone(String),
    /// The approvals directory could not be read or written.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// The system's reason.
        source: io::Error,
    },
}

/// Where a home keeps its parked requests.
pub fn approvals_dir(home: &Path) -> PathBuf {
    home.join("approvals")
}

pub(crate) fn pending_dir(home: &Path) -> PathBuf {
    approvals_dir(home).join("pending")
}

fn answered_dir(home: &Path) -> PathBuf {
    approvals_dir(home).join("answered")
}

fn verdict_name(verdict: Verdict) -> &'static str {
    match verdict {
        Verdict::AllowOnce => "allow_once",
        Verdict::AllowAlways => "allow_always",
        Verdict::Reject => "reject",
    }
}

const VERDICTS: [Verdict; 3] = [Verdict::AllowOnce, Verdict::AllowAlways, Verdict::Reject];

fn is_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// The requests waiting in `home`, oldest first. A file that is not a
/// parked request (too large, not one, its digest not its request's) is
/// passed over; one whose batch is gone is taken away.
pub fn pending(home: &Path) -> Result<Vec<Parked>, AnswerError> {
    let dir = pending_dir(home);
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(AnswerError::Io { what: "cannot read", path: dir, source }),
    };
    let mut parked = Vec::new();
    for entry in entries.flatten() {
        let Some(id) = entry.file_name().to_str().and_then(|name| name.strip_suffix(".json")).map(str::to_owned) else {
            continue;
        };
        let path = entry.path();
        let Ok(file) = File::open(&path) else { continue };
        let Some(read) = read_parked(&file).filter(|read| read.id == id) else { continue };
        match waited_on(&file) {
            Ok(true) => parked.push(read),
            // Its batch is gone: nobody would take an answer.
            Ok(false) => drop(std::fs::remove_file(&path)),
            Err(_) => {}
        }
    }
    parked.sort_by(|a, b| (a.parked_at, &a.id).cmp(&(b.parked_at, &b.id)));
    Ok(parked)
}

/// The parked request file at `path`, open, while the batch that parked
/// it still waits on it ([`waited_on`]); `None` when no one does (its
/// batch is gone) or it cannot be opened. Read it with [`read_parked`].
#[allow(dead_code)] // The web view's, which builds only beside a door (`serve`).
pub(crate) fn open_if_waited(path: &Path) -> Option<File> {
    let file = File::open(path).ok()?;
    waited_on(&file).ok()?.then_some(file)
}

/// The parked request `file` holds, when it is one: a well-formed id and
/// the digest of its own request.
pub(crate) fn read_parked(file: &File) -> Option<Parked> {
    let mut text = Vec::new();
    file.take(MAX_PARKED_BYTES).read_to_end(&mut text).ok()?;
    let parked: Parked = serde_json::from_slice(&text).ok()?;
    (is_id(&parked.id) && digest_of(&parked.request) == parked.digest).then_some(parked)
}

/// Whether the batch that parked the request open as `file` still waits
/// on it: it holds the file's lock for as long as it does.
fn waited_on(file: &File) -> io::Result<bool> {
    match file.try_lock_shared() {
        Ok(()) => {
            file.unlock()?;
            Ok(false)
        }
        Err(TryLockError::WouldBlock) => Ok(true),
        Err(TryLockError::Error(error)) => Err(error),
    }
}

/// Answers the request parked under `id` in `home` with `verdict`, if it
/// still waits and its batch is still there; returns what it asked.
pub fn answer(home: &Path, id: &str, verdict: Verdict) -> Result<Parked, AnswerError> {
    if !is_id(id) {
        return Err(AnswerError::NotAnId(id.to_owned()));
    }
    let from = pending_dir(home).join(format!("{id}.json"));
    let to = answered_dir(home).join(format!("{id}.{}.json", verdict_name(verdict)));
    let not_pending = || AnswerError::NotPending(id.to_owned());
    let io_error = |what, path: &Path, source| AnswerError::Io { what, path: path.to_owned(), source };
    let file = match File::open(&from) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Err(not_pending()),
        Err(source) => return Err(io_error("cannot read", &from, source)),
    };
    // Read first, to say what was answered; the rename decides.
    let parked = read_parked(&file).filter(|parked| parked.id == id).ok_or_else(not_pending)?;
    if !waited_on(&file).map_err(|source| io_error("cannot lock", &from, source))? {
        let _ = std::fs::remove_file(&from);
        return Err(AnswerError::Gone(id.to_owned()));
    }
    match std::fs::rename(&from, &to) {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Err(not_pending()),
        Err(source) => return Err(io_error("cannot answer", &from, source)),
    }
    // The batch may have ended between the look and the rename: an answer
    // it did not take is taken back, never left for later.
    if !waited_on(&file).map_err(|source| io_error("cannot lock", &to, source))? {
        match std::fs::remove_file(&to) {
            Ok(()) => return Err(AnswerError::Gone(id.to_owned())),
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(io_error("cannot take back", &to, source)),
        }
    }
    Ok(parked)
}

/// What a batch's door tells a person about a request it parked.
pub type OnParked = Arc<dyn Fn(&Parked) + Send + Sync>;

/// A policy, and a queue in `home` for what it leaves to `ask`: each
/// parked request a file until [`answer`] takes it or the asker stops
/// waiting.
pub struct ParkedApprover {
    rules: Rules,
    home: PathBuf,
    on_parked: Option<OnParked>,
    watch: Arc<AnswerWatch>,
}

impl fmt::Debug for ParkedApprover {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ParkedApprover").field("rules", &self.rules).field("home", &self.home).finish_non_exhaustive()
    }
}

impl ParkedApprover {
    /// Answers by `rules`, parking what they leave to `ask` in `home`.
    pub fn new(rules: Rules, home: impl Into<PathBuf>) -> Self {
        let home = home.into();
        let watch = AnswerWatch::new(answered_dir(&home));
        ParkedApprover { rules, home, on_parked: None, watch }
    }

    /// Calls `on_parked` for each request as it is parked (to say where
    /// it waits and how to answer it).
    pub fn on_parked(mut self, on_parked: OnParked) -> Self {
        self.on_parked = Some(on_parked);
        self
    }
}

impl Approver for ParkedApprover {
    fn ask(&self, request: PermissionRequest, cancel: CancellationToken) -> BoxFuture<'static, Answer> {
        match self.rules.decide(&request) {
            Policy::Allow => {
                return Box::pin(async { Answer::new(Verdict::AllowOnce, "the approvals policy (allow)") })
            }
            Policy::Reject => return Box::pin(async { Answer::reject("the approvals policy (reject)") }),
            Policy::Ask => {}
        }
        let id = match crate::mix::kernel_random_hex() {
            Ok(id) => id,
            Err(error) => {
                tracing::warn!(%error, "no random id for a permission request: it is not parked");
                return Box::pin(async { Answer::reject("it could not be parked (no random id)") });
            }
        };
        let parked_at = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs());
        let digest = digest_of(&request);
        let parked = Parked { id, request, parked_at, digest };
        let (home, on_parked, watch) = (self.home.clone(), self.on_parked.clone(), self.watch.clone());
        // Its own task: when the asker stops waiting the future is dropped,
        // and this still takes the request back (`cancel` trips then).
        let waiting = tokio::spawn(wait_parked(home, parked, on_parked, watch, cancel));
        Box::pin(async move { waiting.await.unwrap_or_else(|_| Answer::reject("the parked request's task failed")) })
    }
}

/// Writes `parked` to `pending/<ID>.json`, locked before anyone can see
/// it; the open file holds the lock for as long as it is kept.
fn park(home: &Path, parked: &Parked) -> io::Result<File> {
    let pending = pending_dir(home);
    std::fs::create_dir_all(&pending)?;
    std::fs::create_dir_all(answered_dir(home))?;
    let temporary = pending.join(format!(".{}.tmp", parked.id));
    let file = OpenOptions::new().write(true).create_new(true).open(&temporary)?;
    file.lock()?;
    (&file).write_all(&serde_json::to_vec(parked).map_err(io::Error::other)?)?;
    std::fs::rename(&temporary, pending.join(format!("{}.json", parked.id)))?;
    Ok(file)
}

/// What [`take_answer`] found for a request.
enum Taken {
    /// An answer given for it.
    Verdict(Verdict),
    /// A file under its id that is not about it (another request's
    /// content): removed, and a reject.
    NotForThis,
}

/// The answer given to `parked`, removed once read; only a file of its id
/// and its digest, whose request is its own, is its answer.
fn take_answer(home: &Path, parked: &Parked) -> Option<Taken> {
    for verdict in VERDICTS {
        let path = answered_dir(home).join(format!("{}.{}.json", parked.id, verdict_name(verdict)));
        let Ok(file) = File::open(&path) else { continue };
        let given = read_parked(&file);
        if std::fs::remove_file(&path).is_err() {
            continue;
        }
        let for_this = given.is_some_and(|given| given.id == parked.id && given.digest == parked.digest);
        return Some(if for_this { Taken::Verdict(verdict) } else { Taken::NotForThis });
    }
    None
}

/// [`take_answer`] off the async threads.
async fn take_answer_blocking(home: &Path, parked: &Parked) -> Option<Taken> {
    let (home, parked) = (home.to_owned(), parked.clone());
    tokio::task::spawn_blocking(move || take_answer(&home, &parked)).await.ok().flatten()
}

/// Parks `parked`, then waits for its answer or for `cancel`.
async fn wait_parked(
    home: PathBuf,
    parked: Parked,
    on_parked: Option<OnParked>,
    watch: Arc<AnswerWatch>,
    cancel: CancellationToken,
) -> Answer {
    let parking = (home.clone(), parked.clone());
    let locked = match tokio::task::spawn_blocking(move || park(&parking.0, &parking.1)).await {
        Ok(Ok(locked)) => locked,
        Ok(Err(error)) => {
            tracing::warn!(%error, dir = %pending_dir(&home).display(), "a permission request could not be parked");
            return Answer::reject("it could not be parked");
        }
        Err(_) => return Answer::reject("it could not be parked"),
    };
    if let Some(on_parked) = &on_parked {
        on_parked(&parked);
    }
    // Woken by the one watch of the home when an answer names this id.
    let watched = watch.register(&parked.id);
    let taken = loop {
        tokio::select! {
            _ = cancel.cancelled() => break None,
            () = watched.answered.notified() => {
                if let Some(taken) = take_answer_blocking(&home, &parked).await {
                    break Some(taken);
                }
            }
        }
    };
    drop(watched);
    let answer = match taken {
        Some(Taken::Verdict(verdict)) => Answer::new(verdict, format!("{BY_APPROVE} ({})", parked.id)),
        Some(Taken::NotForThis) => Answer::reject("an answer under its id that was not for this request"),
        None => {
            // The asker stopped waiting: take the request back, unless an
            // answer won the race (then it is taken, and the asker ignores it).
            let file = pending_dir(&home).join(format!("{}.json", parked.id));
            if let Err(error) = tokio::fs::remove_file(&file).await {
                if error.kind() == io::ErrorKind::NotFound {
                    let _ = take_answer_blocking(&home, &parked).await;
                }
            }
            Answer::reject("withdrawn: its run no longer waits")
        }
    };
    // Held until here: while it is, an answer can be given.
    drop(locked);
    answer
}

/// One look at a home's answered directory every [`POLL_EVERY`] for all
/// the requests one approver parked there, waking only those answered: a
/// thousand waiting requests cost one directory listing a tick, not three
/// thousand file operations. Its task runs while any request waits.
struct AnswerWatch {
    answered: PathBuf,
    watched: Mutex<Watched>,
}

#[derive(Default)]
struct Watched {
    /// Each waiting request's wake-up, by id.
    waiting: HashMap<String, Arc<Notify>>,
    /// The running task's number, if one runs.
    task: Option<u64>,
    tasks_started: u64,
}

/// A request's place in the [`AnswerWatch`]; dropping it leaves.
struct WatchedRequest {
    watch: Arc<AnswerWatch>,
    id: String,
    answered: Arc<Notify>,
}

impl Drop for WatchedRequest {
    fn drop(&mut self) {
        self.watch.lock().waiting.remove(&self.id);
    }
}

impl AnswerWatch {
    fn new(answered: PathBuf) -> Arc<AnswerWatch> {
        Arc::new(AnswerWatch { answered, watched: Mutex::default() })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Watched> {
        self.watched.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Watches for an answer to `id`, starting the task if none runs (on
    /// the caller's runtime).
    fn register(self: &Arc<Self>, id: &str) -> WatchedRequest {
        let answered = Arc::new(Notify::new());
        let mut watched = self.lock();
        watched.waiting.insert(id.to_owned(), answered.clone());
        if watched.task.is_none() {
            watched.tasks_started += 1;
            let number = watched.tasks_started;
            watched.task = Some(number);
            tokio::spawn(self.clone().look_while_waited_for(number));
        }
        WatchedRequest { watch: self.clone(), id: id.to_owned(), answered }
    }

    /// Task `number`: every [`POLL_EVERY`], one listing of the answered
    /// directory, waking each waiting request it names; ends when none waits.
    async fn look_while_waited_for(self: Arc<Self>, number: u64) {
        /// Marks the task gone however it ends (its runtime may stop it).
        struct Ended(Arc<AnswerWatch>, u64);
        impl Drop for Ended {
            fn drop(&mut self) {
                let mut watched = self.0.lock();
                if watched.task == Some(self.1) {
                    watched.task = None;
                }
            }
        }
        let _ended = Ended(self.clone(), number);
        // Ends under the same lock that saw nobody waiting, so a request
        // registered after that starts a task of its own.
        let nobody_waits = |watched: &mut Watched| {
            let empty = watched.waiting.is_empty();
            if empty && watched.task == Some(number) {
                watched.task = None;
            }
            empty
        };
        loop {
            tokio::time::sleep(POLL_EVERY).await;
            if nobody_waits(&mut self.lock()) {
                return;
            }
            let dir = self.answered.clone();
            let names = tokio::task::spawn_blocking(move || answered_ids(&dir)).await.unwrap_or_default();
            let mut watched = self.lock();
            if nobody_waits(&mut watched) {
                return;
            }
            for id in names {
                if let Some(answered) = watched.waiting.get(&id) {
                    answered.notify_one();
                }
            }
        }
    }
}

/// The ids the answers in `answered` are for (`<ID>.<verdict>.json`).
fn answered_ids(answered: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(answered) else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let id = VERDICTS.iter().find_map(|v| name.strip_suffix(&format!(".{}.json", verdict_name(*v))))?;
            Some(id.to_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_letters_digits_and_dashes_and_nothing_that_leaves_the_directory() {
        assert!(is_id("4121-7"));
        assert!(is_id(&crate::mix::kernel_random_hex().unwrap()));
        assert_ne!(crate::mix::kernel_random_hex().unwrap(), crate::mix::kernel_random_hex().unwrap());
        for bad in ["", "../x", "a/b", "a.b", &"x".repeat(65)] {
            assert!(!is_id(bad), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn a_parked_request_is_answered_once_and_a_later_answer_is_refused() {
        let home = tempfile::tempdir().unwrap();
        let approver = ParkedApprover::new(Rules::new(Policy::Ask), home.path());
        let asked = approver.ask(PermissionRequest::new(Vec::new()).with_title("edit"), CancellationToken::new());
        let waiting = tokio::spawn(asked);
        let parked = loop {
            if let Some(parked) = pending(home.path()).unwrap().pop() {
                break parked;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(parked.request.title.as_deref(), Some("edit"));
        answer(home.path(), &parked.id, Verdict::AllowOnce).unwrap();
        let again = answer(home.path(), &parked.id, Verdict::Reject);
        assert!(matches!(again, Err(AnswerError::NotPending(_))), "{again:?}");
        let answered = waiting.await.unwrap();
        assert_eq!(answered.verdict, Verdict::AllowOnce);
        assert!(pending(home.path()).unwrap().is_empty());
    }

    /// Parks `title` in a runtime of its own that is then dropped without
    /// taking the request back, as a killed batch leaves it; its id.
    fn parked_by_a_batch_that_dies(home: &Path, title: &str) -> String {
        let (home, title) = (home.to_owned(), title.to_owned());
        std::thread::spawn(move || park_then_die(&home, &title)).join().unwrap()
    }

    fn park_then_die(home: &Path, title: &str) -> String {
        let batch = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let id = batch.block_on(async {
            let approver = ParkedApprover::new(Rules::new(Policy::Ask), home);
            tokio::spawn(approver.ask(PermissionRequest::new(Vec::new()).with_title(title), CancellationToken::new()));
            loop {
                if let Some(parked) = pending(home).unwrap().pop() {
                    break parked.id;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        drop(batch);
        id
    }

    #[tokio::test]
    async fn an_answer_for_a_batch_that_is_gone_is_refused_and_never_allows_a_later_request() {
        let home = tempfile::tempdir().unwrap();
        let id = parked_by_a_batch_that_dies(home.path(), "cargo test");
        let late = answer(home.path(), &id, Verdict::AllowOnce);
        assert!(matches!(late, Err(AnswerError::Gone(_))), "{late:?}");
        assert!(pending(home.path()).unwrap().is_empty(), "what a gone batch left is not listed");
        // A new batch of the same process (so of the same pid): its request
        // waits for an answer of its own.
        let approver = ParkedApprover::new(Rules::new(Policy::Ask), home.path());
        let cancel = CancellationToken::new();
        let mut asked = tokio::spawn(
            approver.ask(PermissionRequest::new(Vec::new()).with_title("rm -rf important/"), cancel.clone()),
        );
        let unanswered = tokio::time::timeout(Duration::from_millis(600), &mut asked).await;
        assert!(unanswered.is_err(), "nobody answered it: {unanswered:?}");
        let waiting = pending(home.path()).unwrap();
        assert_eq!(waiting.len(), 1);
        assert_ne!(waiting[0].id, id, "an id is never given twice");
        cancel.cancel();
        assert_eq!(asked.await.unwrap().verdict, Verdict::Reject);
    }

    #[tokio::test]
    async fn an_answer_is_taken_only_for_the_request_it_was_given_for() {
        let home = tempfile::tempdir().unwrap();
        let approver = ParkedApprover::new(Rules::new(Policy::Ask), home.path());
        let cancel = CancellationToken::new();
        let mut asked =
            tokio::spawn(approver.ask(PermissionRequest::new(Vec::new()).with_title("rm -rf /"), cancel.clone()));
        let parked = loop {
            if let Some(parked) = pending(home.path()).unwrap().pop() {
                break parked;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        // An answer file under its id that carries another request.
        let mut other = parked.clone();
        other.request = PermissionRequest::new(Vec::new()).with_title("cargo test");
        let forged = answered_dir(home.path()).join(format!("{}.allow_once.json", parked.id));
        std::fs::write(&forged, serde_json::to_vec(&other).unwrap()).unwrap();
        std::fs::remove_file(pending_dir(home.path()).join(format!("{}.json", parked.id))).unwrap();
        let answered = tokio::time::timeout(Duration::from_secs(5), &mut asked).await.unwrap().unwrap();
        assert_eq!(answered.verdict, Verdict::Reject, "{answered:?}");
        cancel.cancel();
    }

    #[tokio::test]
    async fn a_withdrawn_request_leaves_nothing_waiting_and_cannot_be_answered() {
        let home = tempfile::tempdir().unwrap();
        let approver = ParkedApprover::new(Rules::new(Policy::Ask), home.path());
        let cancel = CancellationToken::new();
        let waiting = tokio::spawn(approver.ask(PermissionRequest::new(Vec::new()), cancel.clone()));
        let parked = loop {
            if let Some(parked) = pending(home.path()).unwrap().pop() {
                break parked;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        cancel.cancel();
        assert_eq!(waiting.await.unwrap().verdict, Verdict::Reject);
        assert!(pending(home.path()).unwrap().is_empty());
        let late = answer(home.path(), &parked.id, Verdict::AllowOnce);
        assert!(matches!(late, Err(AnswerError::NotPending(_))), "{late:?}");
    }
}
