//! Batches: a file of task lines, each run as a subagent, results out as
//! they settle, resumable from the file they were written to.
//!
//! This is the engine behind `subagents fanout`, for any program that
//! embeds the runtime. A [`Batch`] names the runtime, the provider and how
//! to run (concurrency, retries, timeouts, a budget, a durable results
//! file); [`Batch::open`] checks the provider and the tasks file and opens
//! what the batch writes before any run starts, and [`Opened::run`] carries
//! it out ([`Summary::all_ran`] is false after an interruption):
//!
//! ```no_run
//! # async fn demo(subagents: &subagents::Subagents) -> Result<(), subagents::batch::BatchError> {
//! use subagents::batch::{Batch, Quiet};
//! use subagents::CancellationToken;
//!
//! let opened = Batch::new(subagents, "spawn")
//!     .concurrency(8)
//!     .out("results.jsonl") // durable: a crash loses only the runs in flight
//!     .resume(true) // run only what results.jsonl has not settled
//!     .open("tasks.jsonl", CancellationToken::new())?;
//! let summary = opened.run(Quiet).await;
//! assert!(summary.all_ran() && summary.lost().is_none());
//! # Ok(()) }
//! ```
//!
//! # Task lines
//!
//! One JSON object per line ([`Task`]): `{"prompt": "...", "id"?, "label"?,
//! "persona"?, "output_schema"?, "max_depth"?, "budget"?, "provider"?,
//! "timeout"?}`, and for a pipeline step `"after"?, "for_each"?,
//! "max_items"?, "key"?, "on_failure"?` (see [`pipeline`]). The file is streamed, a few dozen lines ahead of the runs,
//! each line at most `max_line_bytes` long; a malformed line is skipped
//! with its reason ([`Report::skipped`]), never fatal. Memory follows the
//! concurrency, not the length of the file: a settled run leaves only its
//! result line (written at once) and its counts in the [`Summary`].
//!
//! # Ids and results
//!
//! Every result line carries its task's `"id"`: the line's own `id`, else
//! `L<line>-<hash>` ([`task_id`]), and `task_hash`, the hash of the line it
//! ran. With [`Batch::out`] the results file is a journal: appended one
//! whole line at a time, made durable within a second, locked against a
//! second batch; [`Batch::resume`] reads it first and runs only the tasks it
//! has not settled (a changed line is refused unless
//! [`Resume::rerun_changed`]). A result that cannot be written stops the
//! batch at once ([`Summary::lost`]): no new run starts, and the file holds
//! only whole lines. An interruption (the batch's token) settles nothing:
//! the runs it stopped are written `"interrupted": true` and run again by a
//! resume.
//!
//! # Detached runs
//!
//! On a provider that detaches its runs (`remote`), with a results file,
//! each run is named and recorded in `OUT.runs` ([`runs_path`]) before it
//! starts, and a resume attaches to the runs recorded for unsettled tasks
//! instead of starting them again (`"reattached": true`), starting afresh
//! only those the provider no longer knows or stopped (`"expired_run"`).

mod journal;
pub(crate) mod parked;
pub mod pipeline;
mod results;
mod run;
mod summary;
mod tasks;
mod template;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::{Budget, CancellationToken, Subagents};

pub use journal::{open_stream, resume_line_bound, runs_path};
pub use parked::{answer, approvals_dir, digest_of, pending, AnswerError, OnParked, Parked, ParkedApprover};
pub use pipeline::PipelineError;
pub use results::refuse_shared;
pub use run::{Opened, Settled};
pub use summary::Summary;
pub use tasks::{content_hash, read_line, task_id, Line, OnFailure, RawLine, Task, TaskLines, DEFAULT_MAX_LINE_BYTES};
pub use template::{MAX_INSERTED_BYTES, MAX_PROMPT_BYTES, MAX_RENDER_STEPS};

/// The most runs a batch keeps in flight.
pub const MAX_CONCURRENCY: usize = 100_000;

/// A batch of task lines to run on one runtime; see the [module](self).
pub struct Batch {
    subagents: Subagents,
    provider: String,
    cwd: PathBuf,
    concurrency: usize,
    max_line_bytes: u64,
    retry: u32,
    timeout: Option<Duration>,
    budget: Budget,
    out: Option<PathBuf>,
    resume: Option<Resume>,
    results: Option<(String, Box<dyn std::io::Write + Send>)>,
}

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("provider", &self.provider)
            .field("cwd", &self.cwd)
            .field("concurrency", &self.concurrency)
            .field("max_line_bytes", &self.max_line_bytes)
            .field("retry", &self.retry)
            .field("timeout", &self.timeout)
            .field("budget", &self.budget)
            .field("out", &self.out)
            .field("resume", &self.resume)
            .field("results_to_writer", &self.results.is_some())
            .finish_non_exhaustive()
    }
}

/// How a resumed batch treats the tasks its results file settled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resume {
    /// Run again the settled tasks that did not complete.
    pub rerun_failed: bool,
    /// Run a task whose line changed since its result was written (else
    /// the batch is refused, naming the line).
    pub rerun_changed: bool,
}

impl Batch {
    /// A batch of runs on `subagents`, on `provider` for the task lines
    /// that name none, as many at once as four per core.
    pub fn new(subagents: &Subagents, provider: impl Into<String>) -> Batch {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Batch {
            subagents: subagents.clone(),
            provider: provider.into(),
            cwd: std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
            concurrency: 4 * cores,
            max_line_bytes: DEFAULT_MAX_LINE_BYTES,
            retry: 0,
            timeout: None,
            budget: Budget::default(),
            out: None,
            resume: None,
            results: None,
        }
    }

    /// Most runs in flight at once (1 to [`MAX_CONCURRENCY`]).
    pub fn concurrency(mut self, runs: usize) -> Batch {
        self.concurrency = runs.clamp(1, MAX_CONCURRENCY);
        self
    }

    /// The working directory the runs are started in (default: the
    /// process's).
    pub fn cwd(mut self, cwd: impl Into<PathBuf>) -> Batch {
        self.cwd = cwd.into();
        self
    }

    /// The longest task line read (default [`DEFAULT_MAX_LINE_BYTES`]); a
    /// longer one is skipped with its reason.
    pub fn max_line_bytes(mut self, bytes: u64) -> Batch {
        self.max_line_bytes = bytes.max(1);
        self
    }

    /// Runs a task that ended in a transient error (a model's 408, 425, 429
    /// or 5xx, an unreachable or broken endpoint, a crashed child, a lost
    /// transport or worker) again, up to `times` more times with backoff.
    pub fn retry(mut self, times: u32) -> Batch {
        self.retry = times;
        self
    }

    /// Stops a run that takes longer (stop reason `aborted`, its line's
    /// `"reason": "timeout"`); a task line's own `timeout` wins.
    pub fn timeout(mut self, timeout: Duration) -> Batch {
        self.timeout = Some(timeout);
        self
    }

    /// One delegation budget for the whole batch: every task run is its
    /// child (width: task runs at once; depth: levels below the batch).
    pub fn budget(mut self, budget: Budget) -> Batch {
        self.budget = budget;
        self
    }

    /// Writes the results to `path` as a journal (see the [module](self));
    /// a device or pipe is written as a stream and cannot be resumed.
    pub fn out(mut self, path: impl Into<PathBuf>) -> Batch {
        self.out = Some(path.into());
        self
    }

    /// Reads the results file first and runs only what it has not settled
    /// (`true`: as [`Resume::default`]); needs [`Batch::out`].
    pub fn resume(self, resume: bool) -> Batch {
        self.resume_with(resume.then(Resume::default))
    }

    /// [`Batch::resume`] with its choices.
    pub fn resume_with(mut self, resume: Option<Resume>) -> Batch {
        self.resume = resume;
        self
    }

    /// Where result lines go without [`Batch::out`] (a program's stdout,
    /// say), and its name for errors; by default they go only to the
    /// [`Report`]. Each line is handed over whole in one `write_all` as its
    /// run settles, and the writer is flushed once, at the end: a writer
    /// that gathers lines writes them when it chooses, and an error it
    /// answers (to a line, or to the flush) stops the batch.
    pub fn results_to(mut self, name: impl Into<String>, writer: impl std::io::Write + Send + 'static) -> Batch {
        self.results = Some((name.into(), Box::new(writer)));
        self
    }

    /// Checks that the runtime has the batch's provider and every provider
    /// a line names, checks the tasks file and opens what the batch writes,
    /// before any run: a refusal here has started nothing and truncated
    /// nothing.
    /// `cancel` interrupts the batch (see the [module](self)).
    pub fn open(self, tasks: impl AsRef<Path>, cancel: CancellationToken) -> Result<Opened, BatchError> {
        run::open(self, tasks.as_ref(), cancel)
    }
}

/// What a batch tells its caller while it runs; every method has a default
/// that does nothing ([`Quiet`]). Called from the runtime's tasks: keep
/// each call short.
pub trait Report: Send + Sync {
    /// A run settled: its result line (`written` says whether it reached
    /// the results).
    fn settled(&self, settled: &Settled<'_>) {
        let _ = settled;
    }

    /// A task line that does not run, and why (line numbers count from 1).
    fn skipped(&self, line: usize, why: &str) {
        let _ = (line, why);
    }

    /// A task an earlier batch settled, not run again.
    fn done_before(&self) {}

    /// A pipeline's `for_each` line became `runs` runs (each settles on
    /// its own; none when its list was empty), where a flat line is one.
    fn expanded(&self, line: usize, runs: usize) {
        let _ = (line, runs);
    }

    /// The tasks file failed before its end: no more lines are run.
    fn tasks_unreadable(&self, error: &std::io::Error) {
        let _ = error;
    }

    /// A run ended in a transient failure and runs again after `wait`.
    fn retrying(&self, line: usize, attempt: u32, outcome: &str, wait: Duration) {
        let _ = (line, attempt, outcome, wait);
    }

    /// Results can no longer be written (said once): the batch stops.
    fn results_lost(&self, why: &str) {
        let _ = why;
    }
}

/// A report passed on to the one it points at: `&R` for a report that
/// outlives the batch's future, `Arc<R>` for one read again after the
/// batch (a batch's runs report from every worker's thread).
macro_rules! passes_on {
    ($($pointer:ty),*) => {$(
        impl<R: Report + ?Sized> Report for $pointer {
            fn settled(&self, settled: &Settled<'_>) {
                (**self).settled(settled);
            }

            fn skipped(&self, line: usize, why: &str) {
                (**self).skipped(line, why);
            }

            fn done_before(&self) {
                (**self).done_before();
            }

            fn expanded(&self, line: usize, runs: usize) {
                (**self).expanded(line, runs);
            }

            fn tasks_unreadable(&self, error: &std::io::Error) {
                (**self).tasks_unreadable(error);
            }

            fn retrying(&self, line: usize, attempt: u32, outcome: &str, wait: Duration) {
                (**self).retrying(line, attempt, outcome, wait);
            }

            fn results_lost(&self, why: &str) {
                (**self).results_lost(why);
            }
        }
    )*};
}

passes_on!(&R, std::sync::Arc<R>);

/// A [`Report`] that says nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct Quiet;

impl Report for Quiet {}

/// Why a batch was refused before any run started.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// A file the batch reads or writes could not be used.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done (`open`, `read`, `lock`, `truncate`).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// A file that must be a regular file is not.
    #[error("{}: {why}", path.display())]
    NotAFile {
        /// The file.
        path: PathBuf,
        /// Why a regular file is needed.
        why: &'static str,
    },
    /// A FIFO named for the results that no one opened to read.
    #[error("{} is a FIFO and no one reads it (waited {waited:?}): its results would be lost; start its reader first, or name a file", path.display())]
    NoReader {
        /// The FIFO.
        path: PathBuf,
        /// How long a reader was waited for.
        waited: std::time::Duration,
    },
    /// Another batch holds the results file.
    #[error("{} is being written by another batch", .0.display())]
    Locked(PathBuf),
    /// Two roles lead to one file.
    #[error("{first} and {second} are the same file ({}); name different files", path.display())]
    SameFile {
        /// The first role (`the tasks file`, `--out`, `--trace`).
        first: &'static str,
        /// The second role.
        second: &'static str,
        /// The second's path.
        path: PathBuf,
    },
    /// A settled task's line changed since its result was written.
    #[error("{}:{line}: task {id:?} changed since its result was written (--rerun-changed runs it again)", path.display())]
    Changed {
        /// The tasks file.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
        /// The task's id.
        id: String,
    },
    /// A task line names a provider the runtime does not have.
    #[error("{}:{line}: unknown provider {name:?} ({}available: {})", path.display(), suggestion.as_ref().map(|near| format!("did you mean {near:?}? ")).unwrap_or_default(), available.join(", "))]
    UnknownProvider {
        /// The tasks file.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
        /// The name it gave.
        name: String,
        /// The registered name nearest it, if one is near.
        suggestion: Option<String>,
        /// The registered names.
        available: Vec<String>,
    },
    /// The batch's own provider ([`Batch::new`]), which runs every task
    /// line that names none, is not one the runtime has.
    #[error("unknown provider {name:?} for the batch ({}available: {})", suggestion.as_ref().map(|near| format!("did you mean {near:?}? ")).unwrap_or_default(), available.join(", "))]
    UnknownBatchProvider {
        /// The name it gave.
        name: String,
        /// The registered name nearest it, if one is near.
        suggestion: Option<String>,
        /// The registered names.
        available: Vec<String>,
    },
    /// A pipeline's graph or templates cannot run as written.
    #[error("{}: {error}", path.display())]
    Pipeline {
        /// The tasks file.
        path: PathBuf,
        /// What is wrong, with its lines.
        #[source]
        error: PipelineError,
    },
    /// [`Batch::resume`] without [`Batch::out`].
    #[error("a resumed batch needs its results file")]
    ResumeWithoutOut,
}
