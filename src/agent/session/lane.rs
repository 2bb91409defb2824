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

use std::cell::Cell;
use std::sync::mpsc;
use std::sync::OnceLock;

use tokio::sync::oneshot;

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
