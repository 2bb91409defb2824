//! The session lane: one thread that does every session file operation of
//! this process, in the order the operations were asked for.
//!
//! Creating a file costs tens to hundreds of microseconds on a real disk,
//! and any `write` or `close` can stall behind the file system. Done on an
//! actor thread, that time is taken from every other run on the same
//! worker. So session files are touched only here: a run hands the lane a
//! job and goes on — an append without waiting, a creation, read or close
//! by awaiting the job's answer — and its worker thread never blocks.
//!
//! One thread and one queue give the ordering the session contract rests
//! on: the jobs for one file run in the order they were submitted, so a
//! file is always a prefix of what was appended, and a read sees every
//! append submitted before it. A job that panics is contained and logged;
//! the lane goes on with the next one.
//!
//! Appends are written together and wake no one: an append adds its lines
//! to its file's pending buffer and marks the file pending. The lane
//! writes every pending file before it runs any other job (so a read or a
//! close sees every append submitted before it), and while appends keep
//! coming it looks again every [`TICK`] on its own; only an append that
//! finds the lane asleep with nothing to look at wakes it. A fan-out of a
//! thousand runs whose sessions share a segment so costs one `write` per
//! wake or tick rather than per event, and no wake-up per event: each run
//! wakes the lane once, with the close it awaits. A crash still tears at
//! most the last line of a file: what reaches it is whole lines, in order.
//! What waits in a buffer is what was appended since the lane last
//! looked; every line of it is held in memory by its session anyway.
//!
//! A store operation is written once, as the job it hands the lane, and
//! returned as a [`LaneCall`]: the synchronous API [`wait`](LaneCall::wait)s
//! for it, blocking its thread; the runtime's own paths `.await` it.

use std::cell::Cell;
use std::fs::File;
use std::future::IntoFuture;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::oneshot;

use super::SessionError;
use crate::contain::contained_call;

/// What the lane is asked to do. Every job runs once every file pending
/// when it was received was written.
enum Job {
    /// Only look at the pending files: sent by an append that found the
    /// lane asleep with nothing to look at.
    Look,
    /// Anything else.
    Run(Box<dyn FnOnce() + Send>),
}

/// How often a lane with appends coming in looks at its pending files
/// without being woken: the most an appended line waits for its `write`
/// when no other job comes.
const TICK: Duration = Duration::from_millis(2);

/// The lane is running jobs or writing; it looks at the pending files
/// before it sleeps.
const BUSY: u8 = 0;
/// Asleep for at most a [`TICK`]: it looks at the pending files on waking.
const TICKING: u8 = 1;
/// Asleep until a job comes: an append must wake it.
const IDLE: u8 = 2;

/// What the lane is doing, for an append to know whether to wake it.
static STATE: AtomicU8 = AtomicU8::new(BUSY);

/// The files with lines pending, each once (its `queued` flag says so).
static PENDING: Mutex<Vec<AppendTarget>> = Mutex::new(Vec::new());

fn pending_files() -> std::sync::MutexGuard<'static, Vec<AppendTarget>> {
    PENDING.lock().unwrap_or_else(|e| e.into_inner())
}

/// A file appends go to: the lines waiting for the lane, the first write
/// that failed (appends do not wait, so the failure is reported later, by
/// whoever checks), and how far the lane has written.
#[derive(Clone, Debug)]
pub(super) struct AppendTarget(Arc<Target>);

#[derive(Debug)]
struct Target {
    file: File,
    failed: OnceLock<(io::ErrorKind, String)>,
    pending: Mutex<Pending>,
    /// Bytes of appended lines that reached the file.
    written: AtomicU64,
}

/// The largest emptied buffer kept for the next lines of a file.
const SPARE_BYTES: usize = 1 << 20;

/// Lines appended and not yet taken by the lane.
#[derive(Debug, Default)]
struct Pending {
    lines: Vec<u8>,
    /// The buffer the lane wrote last, emptied, for the next lines: a burst
    /// appends into room already there instead of growing a buffer anew.
    spare: Vec<u8>,
    /// Bytes ever appended.
    appended: u64,
    /// Whether the file is in the lane's pending list.
    queued: bool,
}

impl AppendTarget {
    pub(super) fn new(file: File) -> Self {
        AppendTarget(Arc::new(Target {
            file,
            failed: OnceLock::new(),
            pending: Mutex::default(),
            written: AtomicU64::new(0),
        }))
    }

    /// The first write that failed, if any.
    pub(super) fn failed(&self) -> Option<&(io::ErrorKind, String)> {
        self.0.failed.get()
    }

    /// Bytes of appended lines that reached the file.
    pub(super) fn written(&self) -> u64 {
        self.0.written.load(Ordering::Acquire)
    }

    /// Whether every line appended up to `end` (what [`append`] answered)
    /// reached the file.
    pub(super) fn reached(&self, end: u64) -> bool {
        self.written() >= end
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.0.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// On the lane: writes what is pending in one `write`; a failure is
    /// kept, and nothing more is written to the file after it (a line
    /// after a torn one would not be the last).
    fn flush(&self) {
        let mut lines = {
            let mut pending = self.pending();
            pending.queued = false;
            let spare = std::mem::take(&mut pending.spare);
            std::mem::replace(&mut pending.lines, spare)
        };
        if !lines.is_empty() && self.failed().is_none() {
            match (&self.0.file).write_all(&lines) {
                Ok(()) => _ = self.0.written.fetch_add(lines.len() as u64, Ordering::Release),
                Err(error) => _ = self.0.failed.set((error.kind(), error.to_string())),
            }
        }
        if lines.capacity() <= SPARE_BYTES {
            lines.clear();
            let mut pending = self.pending();
            if pending.spare.capacity() < lines.capacity() {
                pending.spare = lines;
            }
        }
    }
}

/// On the lane: writes every pending file; whether there was one.
fn flush_pending() -> bool {
    let files = std::mem::take(&mut *pending_files());
    for file in &files {
        file.flush();
    }
    !files.is_empty()
}

/// The lane thread: runs each job in the order it was queued, every
/// pending file written before it; writes pending files every [`TICK`]
/// while appends come in.
fn drain(jobs: mpsc::Receiver<Job>) {
    ON_LANE.with(|on| on.set(true));
    // Whether appends came in since the lane last slept: then it sleeps
    // for a tick, and the appends that come meanwhile need not wake it.
    let mut appending = false;
    loop {
        appending |= flush_pending();
        let job = match jobs.try_recv() {
            Ok(job) => job,
            Err(mpsc::TryRecvError::Disconnected) => return,
            Err(mpsc::TryRecvError::Empty) if appending => {
                appending = false;
                STATE.store(TICKING, Ordering::SeqCst);
                let job = jobs.recv_timeout(TICK);
                STATE.store(BUSY, Ordering::SeqCst);
                match job {
                    Ok(job) => job,
                    Err(mpsc::RecvTimeoutError::Timeout) => continue,
                    Err(mpsc::RecvTimeoutError::Disconnected) => return,
                }
            }
            Err(mpsc::TryRecvError::Empty) => {
                // Said before looking at the pending files: an append that
                // marked one after this look finds the lane idle and wakes it.
                STATE.store(IDLE, Ordering::SeqCst);
                if !pending_files().is_empty() {
                    STATE.store(BUSY, Ordering::SeqCst);
                    continue;
                }
                let job = jobs.recv();
                STATE.store(BUSY, Ordering::SeqCst);
                match job {
                    Ok(job) => job,
                    Err(mpsc::RecvError) => return,
                }
            }
        };
        appending |= flush_pending();
        if let Job::Run(run) = job {
            if let Err(panic) = contained_call(run) {
                tracing::error!(%panic, "a session file operation panicked");
            }
        }
    }
}

thread_local! {
    /// Set on the lane's own thread, where a blocking call runs inline.
    static ON_LANE: Cell<bool> = const { Cell::new(false) };
}

fn queue() -> &'static mpsc::Sender<Job> {
    static QUEUE: OnceLock<mpsc::Sender<Job>> = OnceLock::new();
    QUEUE.get_or_init(|| {
        let (sender, jobs) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("subagents-sessions".into())
            .spawn(move || drain(jobs))
            .expect("the session lane thread starts");
        sender
    })
}

/// Queues `job` and returns at once.
pub(super) fn submit(job: impl FnOnce() + Send + 'static) {
    // The receiver lives as long as the process: sending cannot fail.
    let _ = queue().send(Job::Run(Box::new(job)));
}

/// Queues whole `lines` for `target` and returns at once, with how many
/// bytes were appended to it so far (for [`AppendTarget::reached`]); they
/// reach the file before any job submitted after them runs, and within a
/// [`TICK`] or so when none is. Lines appended while the file is pending
/// join its buffer: a burst of appends to a file costs one `write`, and
/// wakes the lane only when it sleeps with nothing to look at.
pub(super) fn append(target: &AppendTarget, lines: Vec<u8>) -> u64 {
    let mut pending = target.pending();
    pending.appended += lines.len() as u64;
    if pending.lines.is_empty() && pending.lines.capacity() < lines.len() {
        pending.lines = lines;
    } else {
        pending.lines.extend_from_slice(&lines);
    }
    let end = pending.appended;
    let newly = !std::mem::replace(&mut pending.queued, true);
    drop(pending);
    if newly {
        pending_files().push(target.clone());
        // After the mark (the lane says it is idle before it looks at the
        // marks): one of the two sees the other. Only one append wakes it.
        if STATE.compare_exchange(IDLE, BUSY, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            let _ = queue().send(Job::Look);
        }
    }
    end
}

/// Runs `job` on the lane; its answer, or `None` if it panicked. When the
/// caller stopped waiting, `undo` gets the answer on the lane (a file
/// created for a start that was abandoned is removed again).
pub(super) async fn call<T: Send + 'static>(
    job: impl FnOnce() -> T + Send + 'static,
    undo: impl FnOnce(T) + Send + 'static,
) -> Option<T> {
    let (reply, answer) = oneshot::channel();
    submit(move || {
        if let Err(unwanted) = reply.send(job()) {
            undo(unwanted);
        }
    });
    answer.await.ok()
}

/// Runs `job` on the lane and blocks the calling thread for its answer
/// (`None` if it panicked): the synchronous API, for callers outside a
/// runtime. On the lane itself it runs inline.
pub(super) fn call_blocking<T: Send + 'static>(job: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    if ON_LANE.with(Cell::get) {
        return Some(job());
    }
    let (reply, answer) = mpsc::sync_channel(1);
    submit(move || {
        let _ = reply.send(job());
    });
    answer.recv().ok()
}

/// What a session job answers.
type Answer<T> = Result<T, SessionError>;

/// One session operation for the lane, not yet handed to it: [`wait`]
/// blocks the calling thread for its answer, `.await` does not. Either
/// way it is queued behind every job submitted before it. A lane that does
/// not answer (the job panicked) is an I/O error for the session.
///
/// [`wait`]: LaneCall::wait
#[must_use = "a lane call does nothing until it is waited for or awaited"]
pub(crate) struct LaneCall<T> {
    /// The session it is about, for the error when the lane fails.
    id: String,
    state: State<T>,
}

enum State<T> {
    /// Answered without the lane (a bad id, an in-memory store).
    Ready(Answer<T>),
    Queued {
        job: Box<dyn FnOnce() -> Answer<T> + Send>,
        /// Takes an answer no one waited for any more.
        undo: Box<dyn FnOnce(T) + Send>,
    },
}

impl<T: Send + 'static> LaneCall<T> {
    /// `job` for session `id`, to run on the lane.
    pub(super) fn new(id: &str, job: impl FnOnce() -> Answer<T> + Send + 'static) -> Self {
        LaneCall { id: id.to_owned(), state: State::Queued { job: Box::new(job), undo: Box::new(drop) } }
    }

    /// An answer known without the lane.
    pub(super) fn ready(id: &str, answer: Answer<T>) -> Self {
        LaneCall { id: id.to_owned(), state: State::Ready(answer) }
    }

    /// Hands a successful answer whose caller stopped awaiting it to
    /// `undo`, on the lane (a file created for an abandoned start is
    /// removed again).
    pub(super) fn undo_if_abandoned(mut self, undo: impl FnOnce(T) + Send + 'static) -> Self {
        if let State::Queued { undo: slot, .. } = &mut self.state {
            *slot = Box::new(undo);
        }
        self
    }

    /// Blocks the calling thread until the lane answered: the synchronous
    /// API, for callers outside a runtime.
    pub(crate) fn wait(self) -> Answer<T> {
        match self.state {
            State::Ready(answer) => answer,
            State::Queued { job, .. } => call_blocking(job).unwrap_or_else(|| Err(SessionError::lane_failed(&self.id))),
        }
    }
}

impl<T: Send + 'static> IntoFuture for LaneCall<T> {
    type Output = Answer<T>;
    type IntoFuture = BoxFuture<'static, Answer<T>>;

    fn into_future(self) -> Self::IntoFuture {
        let LaneCall { id, state } = self;
        Box::pin(async move {
            match state {
                State::Ready(answer) => answer,
                State::Queued { job, undo } => {
                    let undo = move |answer: Answer<T>| {
                        if let Ok(value) = answer {
                            undo(value);
                        }
                    };
                    call(job, undo).await.unwrap_or_else(|| Err(SessionError::lane_failed(&id)))
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn jobs_run_in_submission_order_and_a_call_sees_every_earlier_job() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        for n in 0..1_000 {
            let seen = seen.clone();
            submit(move || seen.lock().unwrap().push(n));
        }
        let seen_now = seen.clone();
        let count = call_blocking(move || seen_now.lock().unwrap().len()).unwrap();
        assert_eq!(count, 1_000);
        assert!(seen.lock().unwrap().windows(2).all(|pair| pair[0] < pair[1]));
    }

    #[test]
    fn appends_queued_together_reach_their_files_whole_and_in_order_before_a_later_job() {
        let dir = tempfile::tempdir().unwrap();
        let open = |name: &str| AppendTarget::new(File::create(dir.path().join(name)).unwrap());
        let (first, second) = (open("first"), open("second"));
        // Held behind a slow job, the appends are queued together.
        submit(|| std::thread::sleep(std::time::Duration::from_millis(20)));
        for n in 0..100 {
            append(&first, format!("{n}\n").into_bytes());
            append(&second, format!("{}\n", 1_000 + n).into_bytes());
        }
        let path = dir.path().to_path_buf();
        let read = call_blocking(move || {
            (
                std::fs::read_to_string(path.join("first")).unwrap(),
                std::fs::read_to_string(path.join("second")).unwrap(),
            )
        });
        let (first_text, second_text) = read.unwrap();
        assert_eq!(first_text, (0..100).map(|n| format!("{n}\n")).collect::<String>());
        assert_eq!(second_text, (1_000..1_100).map(|n| format!("{n}\n")).collect::<String>());
        assert!(first.failed().is_none() && second.failed().is_none());
        assert!(first.reached(first_text.len() as u64) && second.reached(second_text.len() as u64));
    }

    #[test]
    fn appends_with_no_job_after_them_still_reach_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = AppendTarget::new(File::create(dir.path().join("alone")).unwrap());
        let reached = |end| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !target.reached(end) {
                assert!(std::time::Instant::now() < deadline, "an append waited for a job that never came");
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        };
        // Whether the lane sleeps, ticks or works, each burst gets written.
        for burst in 0..50 {
            let mut end = 0;
            for n in 0..=burst % 3 {
                end = append(&target, format!("{burst}.{n}\n").into_bytes());
            }
            reached(end);
            if burst % 10 == 9 {
                std::thread::sleep(TICK * 3);
            }
        }
        let expected: String =
            (0..50).flat_map(|burst| (0..=burst % 3).map(move |n| format!("{burst}.{n}\n"))).collect();
        assert_eq!(std::fs::read_to_string(dir.path().join("alone")).unwrap(), expected);
    }

    #[test]
    fn a_panicking_job_is_contained_and_the_lane_goes_on() {
        assert_eq!(call_blocking(|| -> u32 { panic!("boom") }), None);
        assert_eq!(call_blocking(|| 7), Some(7));
    }

    #[test]
    fn an_abandoned_call_hands_its_answer_to_undo() {
        let undone = Arc::new(Mutex::new(None));
        let seen = undone.clone();
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        // Polled once, then dropped while the job is still queued behind a slow one.
        submit(|| std::thread::sleep(std::time::Duration::from_millis(50)));
        runtime.block_on(async {
            let call = call(|| 5, move |value| *seen.lock().unwrap() = Some(value));
            tokio::pin!(call);
            assert!(futures_util::poll!(call.as_mut()).is_pending());
        });
        call_blocking(|| ()).unwrap();
        assert_eq!(*undone.lock().unwrap(), Some(5));
    }
}
