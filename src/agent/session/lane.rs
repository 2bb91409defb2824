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
//! A store operation is written once, as the job it hands the lane, and
//! returned as a [`LaneCall`]: the synchronous API [`wait`](LaneCall::wait)s
//! for it, blocking its thread; the runtime's own paths `.await` it.

use std::cell::Cell;
use std::future::IntoFuture;
use std::sync::mpsc;
use std::sync::OnceLock;

use futures_util::future::BoxFuture;
use tokio::sync::oneshot;

use super::SessionError;
use crate::contain::contained_call;

type Job = Box<dyn FnOnce() + Send>;

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
            .spawn(move || {
                ON_LANE.with(|on| on.set(true));
                for job in jobs {
                    if let Err(panic) = contained_call(job) {
                        tracing::error!(%panic, "a session file operation panicked");
                    }
                }
            })
            .expect("the session lane thread starts");
        sender
    })
}

/// Queues `job` and returns at once.
pub(super) fn submit(job: impl FnOnce() + Send + 'static) {
    // The receiver lives as long as the process: sending cannot fail.
    let _ = queue().send(Box::new(job));
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
