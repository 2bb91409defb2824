//! The batch's run loop: task lines in, at most `concurrency` runs in
//! flight, each run's result line written as it settles.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use serde_json::{json, Value};
use tokio::sync::mpsc;

mod steps;

use super::journal::{self, hash_text, Journal, Prior, Recorded};
use super::pipeline::Pipeline;
use super::results::{self, Results};
use super::summary::{Finished, Summary};
use super::tasks::{id_key, task_id, FirstLines, IdKey, Line, Task, TaskLines};
use super::{Batch, BatchError, Report, Resume};
use crate::seam::{BatchTask, BudgetLease, Detached, RunUsage};
use crate::{Budget, CancellationToken, Parent, StartError, StartRequest, StopReason, Subagents};

/// The first wait before a retry; it doubles each time, up to
/// [`MAX_RETRY_WAIT`], with jitter.
const FIRST_RETRY_WAIT: Duration = Duration::from_millis(500);
const MAX_RETRY_WAIT: Duration = Duration::from_secs(30);

/// Task lines read ahead of the runs: enough that a run never waits for
/// the file, few enough that a file of long lines costs little.
const READ_AHEAD_LINES: usize = 64;

/// Task lines sent to the runs at once (see [`ReadAhead`]).
const READ_AHEAD_CHUNK: usize = 16;

/// One settled run, as a [`Report`] sees it.
#[derive(Debug)]
#[non_exhaustive]
pub struct Settled<'a> {
    /// The task's line, from 1.
    pub line: usize,
    /// The task's label.
    pub label: Option<&'a str>,
    /// Its stop reason, `error`, `rejected (CODE)` or `interrupted`.
    pub outcome: &'a str,
    /// Why it failed, in the library's fixed wording.
    pub detail: Option<&'a str>,
    /// From its start to its result, across attempts.
    pub latency: Duration,
    /// Its result line.
    pub record: &'a Value,
    /// Whether the result line was written.
    pub written: bool,
}

/// A batch whose files are open and whose tasks file was checked: ready
/// to [`run`](Opened::run).
pub struct Opened {
    batch: Engine,
    work: Work,
    concurrency: usize,
    results: Arc<Results>,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("provider", &self.batch.provider)
            .field("tasks", &self.batch.tasks_path)
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

/// What an opened batch runs.
enum Work {
    /// A flat file: its lines as they are read.
    Lines(ReadAhead),
    /// A pipeline, checked whole, with the result lines a resume reuses.
    Pipeline(Box<Pipeline>, HashMap<String, Value>),
}

/// [`Batch::open`].
pub(super) fn open(batch: Batch, tasks: &Path, cancel: CancellationToken) -> Result<Opened, BatchError> {
    let Batch { subagents, provider, cwd, concurrency, max_line_bytes, retry, timeout, budget, out, resume, results } =
        batch;
    if resume.is_some() && out.is_none() {
        return Err(BatchError::ResumeWithoutOut);
    }
    // Every line that names no provider runs on this one: without it each
    // would be a `NO_PROVIDER` result line.
    if !subagents.has_provider(&provider) {
        return Err(BatchError::UnknownBatchProvider {
            suggestion: subagents.nearest_provider(&provider),
            available: subagents.provider_names(),
            name: provider,
        });
    }
    let mut named = vec![("the tasks file", tasks)];
    named.extend(out.as_deref().map(|out| ("--out", out)));
    results::refuse_shared(&named)?;
    let tasks_file = open_tasks(tasks)?;
    if resume.is_some() && !tasks.is_file() {
        let why = "a resumed batch reads its tasks twice: it must be a regular file";
        return Err(BatchError::NotAFile { path: tasks.to_owned(), why });
    }
    let resuming = resume.is_some();
    let resume = resume.unwrap_or_default();
    // A fresh batch truncates its results file: its lines are checked first.
    let mut pipeline = None;
    if !resuming && check_lines(tasks, max_line_bytes, &subagents, &HashMap::new(), false)? {
        pipeline = Some(read_pipeline(tasks, max_line_bytes)?);
    }
    let (results, settled) = Results::open(out.as_deref(), resuming, max_line_bytes, results, cancel.clone())?;
    if resuming && check_lines(tasks, max_line_bytes, &subagents, &settled, resume.rerun_changed)? {
        pipeline = Some(read_pipeline(tasks, max_line_bytes)?);
    }
    // A resumed pipeline's steps read the results they reuse.
    let prior = match (&pipeline, &out) {
        (Some(pipeline), Some(out)) if resuming => {
            journal::read_records(out, max_line_bytes, |id| pipeline.is_read_by_others(id))?
        }
        _ => HashMap::new(),
    };
    // Runs of a provider that detaches them are recorded beside the
    // results before they start, so that a resume attaches to them again.
    let detaches = subagents.provider(&provider).is_some_and(|info| info.detaches);
    let (runs, recorded) = match (&out, detaches && results.resumable()) {
        (Some(out), true) => {
            let (runs, recorded) = journal::open_runs(&journal::runs_path(out), resuming, max_line_bytes)?;
            (Some(Mutex::new(runs)), recorded)
        }
        _ => (None, HashMap::new()),
    };
    let results = Arc::new(results);
    let name = batch_name(out.as_deref());
    let batch = Engine {
        name,
        resuming,
        subagents,
        provider,
        cwd,
        tasks_path: tasks.to_owned(),
        cancel,
        results: results.clone(),
        budget: Some(budget).filter(|b| !b.is_unlimited()).map(Budget::lease),
        settled,
        resume,
        retry,
        timeout,
        runs,
        recorded,
    };
    let work = match pipeline {
        Some(pipeline) => Work::Pipeline(Box::new(pipeline), prior),
        None => Work::Lines(read_ahead(TaskLines::new(BufReader::new(tasks_file), max_line_bytes))),
    };
    Ok(Opened { batch, work, concurrency, results })
}

impl Opened {
    /// Whether the batch's results can be resumed (a results file that is
    /// a regular file).
    pub fn resumable(&self) -> bool {
        self.results.resumable()
    }

    /// Runs every task, at most `concurrency` at once, telling `report` as
    /// they settle; the summary when the last has settled (or the batch
    /// was interrupted, or results could not be written).
    pub async fn run(self, report: impl Report + 'static) -> Summary {
        let report: Arc<dyn Report> = Arc::new(report);
        let Opened { batch, work, concurrency, results } = self;
        let batch = Arc::new(batch);
        let started = Instant::now();
        let mut summary = match work {
            Work::Lines(lines) => batch.clone().run_all(lines, concurrency, report.clone()).await,
            Work::Pipeline(pipeline, prior) => batch.run_pipeline(*pipeline, prior, concurrency, &*report).await,
        };
        let report = &*report;
        // A result that could not be written was said when it happened; one
        // that fails only now (the last sync) is said here.
        let lost = results.finish(report).err().map(str::to_owned);
        summary.close(started.elapsed(), batch.cancel.is_cancelled(), lost, results.resumable());
        summary
    }
}

/// The batch's name, which its runs' branches carry
/// (`subagents/<name>/<task id>`): its results file's name without the
/// extension, so a resume finds the same branches; without one, `batch-`
/// and the time it started.
fn batch_name(out: Option<&Path>) -> String {
    let stem = out.and_then(Path::file_stem).map(|stem| stem.to_string_lossy().into_owned());
    stem.filter(|stem| !stem.is_empty()).unwrap_or_else(|| {
        let seconds = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        format!("batch-{seconds}")
    })
}

/// Reads a regular tasks file once before any run: every provider a line
/// names is registered (else the batch is refused naming the line and the
/// nearest name), and with a resume every task line whose id the results
/// file settled ran the same line then (else refused naming the first
/// changed line, unless `rerun_changed`). A pipe cannot be read twice: its
/// lines are checked as they run. Answers whether a line is a pipeline
/// step (then the file is read again, whole, by [`read_pipeline`]).
fn check_lines(
    tasks: &Path,
    max_line_bytes: u64,
    subagents: &Subagents,
    settled: &HashMap<IdKey, Prior>,
    rerun_changed: bool,
) -> Result<bool, BatchError> {
    if !tasks.is_file() {
        return Ok(false);
    }
    let mut steps = false;
    let file = open_tasks(tasks)?;
    // The lines the batch skips as repeated ids were never run: not checked.
    let mut first_lines = FirstLines::default();
    for line in TaskLines::new(BufReader::new(file), max_line_bytes) {
        let line = line.map_err(|source| BatchError::Io { action: "read", path: tasks.to_owned(), source })?;
        let Line::Task { number, task, hash } = line else { continue };
        steps |= task.is_step();
        if let Some(name) = task.provider.as_deref().filter(|name| !subagents.has_provider(name)) {
            return Err(BatchError::UnknownProvider {
                path: tasks.to_owned(),
                line: number,
                name: name.to_owned(),
                suggestion: subagents.nearest_provider(name),
                available: subagents.provider_names(),
            });
        }
        let id = task_id(&task, number, hash);
        if first_lines.claim(&task, &id, number).is_err() || rerun_changed {
            continue;
        }
        if settled.get(&id_key(&id)).is_some_and(|prior| prior.hash != Some(hash)) {
            return Err(BatchError::Changed { path: tasks.to_owned(), line: number, id });
        }
    }
    Ok(steps)
}

/// The tasks file read whole and checked as a pipeline.
fn read_pipeline(tasks: &Path, max_line_bytes: u64) -> Result<Pipeline, BatchError> {
    let file = open_tasks(tasks)?;
    let lines = TaskLines::new(BufReader::new(file), max_line_bytes)
        .collect::<std::io::Result<Vec<Line>>>()
        .map_err(|source| BatchError::Io { action: "read", path: tasks.to_owned(), source })?;
    Pipeline::check(lines).map_err(|error| BatchError::Pipeline { path: tasks.to_owned(), error })
}

/// Whether a failed run's record names a transient cause: a model endpoint
/// that answered 408, 425, 429 or 5xx, could not be reached, broke off or
/// timed out (the adapters' fixed wording), or a child, transport or
/// worker lost on the way.
fn transient(record: &Value) -> bool {
    let failed = record["stop_reason"] == "error" || record.get("error").is_some();
    let diagnostic = &record["diagnostic"];
    let reason = diagnostic["reason"].as_str().unwrap_or_default();
    let cause = match diagnostic["category"].as_str() {
        Some("child-crashed" | "timed-out" | "worker-lost" | "lease-expired" | "broker-unreachable" | "no-worker") => {
            true
        }
        Some("model") => match reason.strip_prefix("the model endpoint answered ") {
            Some(status) => status.parse::<u16>().is_ok_and(|s| matches!(s, 408 | 425 | 429 | 500..=599)),
            None => ["could not be reached", "broke off", "timed out"].iter().any(|cause| reason.contains(cause)),
        },
        _ => false,
    };
    failed && cause
}

/// The wait before retry `attempt` (1 for the first): doubling from
/// [`FIRST_RETRY_WAIT`], capped, between half and all of it.
fn retry_wait(attempt: u32) -> Duration {
    let full = FIRST_RETRY_WAIT.saturating_mul(1 << attempt.saturating_sub(1).min(16)).min(MAX_RETRY_WAIT);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    full / 2 + full.mul_f64(f64::from(nanos % 1000) / 2000.0)
}

/// The tasks file, open for reading; a directory is refused here rather
/// than at its first read, after runs began.
fn open_tasks(path: &Path) -> Result<File, BatchError> {
    let io = |action, source| BatchError::Io { action, path: path.to_owned(), source };
    let file = File::open(path).map_err(|e| io("open", e))?;
    match file.metadata() {
        Ok(metadata) if metadata.is_dir() => {
            Err(BatchError::NotAFile { path: path.to_owned(), why: "it is a directory" })
        }
        Ok(_) => Ok(file),
        Err(e) => Err(io("read", e)),
    }
}

/// Reads `lines` on a thread of its own, at most [`READ_AHEAD_LINES`]
/// ahead: a slow pipe never stalls the runtime, and the file is never held
/// whole. The thread ends at the end of the file or when the batch stops
/// listening.
fn read_ahead(mut lines: TaskLines<BufReader<File>>) -> ReadAhead {
    let (sender, receiver) = mpsc::channel(READ_AHEAD_LINES / READ_AHEAD_CHUNK);
    std::thread::spawn(move || {
        let mut chunk = Vec::with_capacity(READ_AHEAD_CHUNK);
        loop {
            let line = lines.next();
            let ended = line.is_none();
            chunk.extend(line);
            // Sent whole, or at once when the next line would wait for a
            // read (a pipe's line is never held back for the next one).
            if ended || chunk.len() == READ_AHEAD_CHUNK || !lines.has_buffered() {
                let full = std::mem::replace(&mut chunk, Vec::with_capacity(READ_AHEAD_CHUNK));
                // Sending fails only when the batch stopped listening.
                let listened = full.is_empty() || sender.blocking_send(full).is_ok();
                if ended || !listened {
                    return;
                }
            }
        }
    });
    ReadAhead { chunks: receiver, ready: std::collections::VecDeque::new() }
}

/// Task lines read ahead on a thread of their own, taken in chunks: the
/// reader and the runs wake each other once a chunk, not once a line.
struct ReadAhead {
    chunks: mpsc::Receiver<Vec<std::io::Result<Line>>>,
    ready: std::collections::VecDeque<std::io::Result<Line>>,
}

impl ReadAhead {
    /// The next line, `None` at the end. Cancel-safe: a chunk is taken
    /// whole, after the only await.
    async fn recv(&mut self) -> Option<std::io::Result<Line>> {
        if let Some(line) = self.ready.pop_front() {
            return Some(line);
        }
        self.ready.extend(self.chunks.recv().await?);
        self.ready.pop_front()
    }
}

/// Aborts a task when dropped: a run's timer when the run is over, a
/// batch's shard when the batch's future is dropped.
enum AbortOnDrop {
    Timer(tokio::task::AbortHandle),
    Shard(futures_util::future::AbortHandle),
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        match self {
            AbortOnDrop::Timer(timer) => timer.abort(),
            AbortOnDrop::Shard(shard) => shard.abort(),
        }
    }
}

/// What the shards of a flat batch share (see [`Engine::run_all`]).
struct Feed {
    /// The lines, and the explicit ids they named with their lines (one
    /// id, one task): taken and claimed under one lock.
    lines: tokio::sync::Mutex<(ReadAhead, FirstLines)>,
    summary: Mutex<Summary>,
}

/// A line as a shard takes it from the [`Feed`].
enum Taken {
    /// A task, under its id; `claim` is `Err(first)` when line `first`
    /// named the id before.
    Task { number: usize, task: Box<Task>, hash: u64, id: String, claim: Result<(), usize> },
    /// A pipeline step, which a flat batch does not run.
    Step(usize),
    /// A line that is not a task, and why.
    Skipped(usize, String),
    /// The file could not be read on.
    Unreadable(std::io::Error),
}

impl Feed {
    /// The next line, `None` at the end. A task claims its id here, while
    /// the lines are held, so the shards claim in the file's order and an
    /// id's first line is the one that runs. Cancel-safe: nothing awaits
    /// after the line is taken.
    async fn take(&self) -> Option<Taken> {
        let (lines, first_lines) = &mut *self.lines.lock().await;
        Some(match lines.recv().await? {
            Ok(Line::Task { number, task, .. }) if task.is_step() => Taken::Step(number),
            Ok(Line::Task { number, task, hash }) => {
                let id = task_id(&task, number, hash);
                let claim = first_lines.claim(&task, &id, number);
                Taken::Task { number, task, hash, id, claim }
            }
            Ok(Line::Skipped { number, why }) => Taken::Skipped(number, why),
            Err(error) => Taken::Unreadable(error),
        })
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One attempt's result record (not written yet), its counts, and why it
/// failed.
type Attempt = (Value, Finished, Option<String>);

pub(super) struct Engine {
    /// The batch's name, in its runs' branches (see [`batch_name`]).
    name: String,
    /// The batch resumes an earlier one's results.
    resuming: bool,
    subagents: Subagents,
    provider: String,
    cwd: PathBuf,
    tasks_path: PathBuf,
    pub(super) cancel: CancellationToken,
    pub(super) results: Arc<Results>,
    /// The batch's budget: the batch holds it, every task run is its child.
    budget: Option<BudgetLease>,
    /// What the results file settled before (a resume), by task id.
    pub(super) settled: HashMap<IdKey, Prior>,
    pub(super) resume: Resume,
    retry: u32,
    timeout: Option<Duration>,
    /// `OUT.runs`, when the batch's provider detaches its runs: each run's
    /// id is written there before it starts.
    runs: Option<Mutex<Journal>>,
    /// What `OUT.runs` recorded before (a resume), by task id.
    recorded: HashMap<IdKey, Recorded>,
}

impl Engine {
    /// Runs every task `lines` yields, at most `concurrency` at once. Only
    /// the runs in flight are held; a finished run leaves its counts in the
    /// summary and nothing else.
    ///
    /// The runs are split over the runtime's workers: each worker runs a
    /// shard of the loop, taking the next line whenever it has room for a
    /// run, so every core works and each run (its actor, its session, its
    /// model call on that worker's own connection) stays on one thread.
    async fn run_all(self: Arc<Self>, lines: ReadAhead, concurrency: usize, report: Arc<dyn Report>) -> Summary {
        let feed = Arc::new(Feed {
            lines: tokio::sync::Mutex::new((lines, FirstLines::default())),
            summary: Mutex::new(Summary::default()),
        });
        let shards = self.subagents.worker_count().clamp(1, concurrency.max(1));
        if shards == 1 {
            self.run_shard(&feed, concurrency, &*report).await;
        } else {
            // Dropping the batch's future stops every shard with it.
            let (handles, shards): (Vec<_>, Vec<_>) = (0..shards)
                .map(|n| {
                    let room = concurrency / shards + usize::from(n < concurrency % shards);
                    let (engine, feed, report) = (self.clone(), feed.clone(), report.clone());
                    let (abortable, handle) = futures_util::future::abortable(async move {
                        engine.run_shard(&feed, room, &*report).await;
                    });
                    (AbortOnDrop::Shard(handle), self.subagents.on_worker(n, abortable))
                })
                .unzip();
            futures_util::future::join_all(shards).await;
            drop(handles);
        }
        let summary = std::mem::take(&mut *lock(&feed.summary));
        summary
    }

    /// One worker's share of [`Engine::run_all`]: lines taken from `feed`
    /// while fewer than `room` of its runs are in flight.
    async fn run_shard(&self, feed: &Feed, room: usize, report: &dyn Report) {
        let mut in_flight = FuturesUnordered::new();
        let mut reading = true;
        loop {
            tokio::select! {
                // Finished runs first: they make room for the next line.
                biased;
                Some(finished) = in_flight.next(), if !in_flight.is_empty() => {
                    match finished {
                        Some((finished, _)) => lock(&feed.summary).add(finished),
                        None => lock(&feed.summary).unstarted += 1,
                    }
                }
                () = self.cancel.cancelled(), if reading => {
                    // Lines may be left in the file: they were not run.
                    lock(&feed.summary).stopped_reading = true;
                    reading = false;
                }
                taken = feed.take(), if reading && in_flight.len() < room => match taken {
                    Some(Taken::Step(number)) => {
                        report.skipped(number, "after and for_each need a tasks file that is a regular file: a pipeline is checked whole before it runs");
                        lock(&feed.summary).skipped += 1;
                    }
                    Some(Taken::Task { number, task, hash, id, claim }) => {
                        if let Err(first) = claim {
                            report.skipped(number, &format!("its id {id:?} is line {first}'s too"));
                            lock(&feed.summary).skipped += 1;
                            continue;
                        }
                        let prior = self.settled.get(&id_key(&id));
                        let done = prior.is_some_and(|p| p.hash == Some(hash) && (p.completed || !self.resume.rerun_failed));
                        if done {
                            lock(&feed.summary).already_done += 1;
                            report.done_before();
                            continue;
                        }
                        in_flight.push(self.run_one(number, task, id, hash, None, Vec::new(), report));
                    }
                    Some(Taken::Skipped(number, why)) => {
                        report.skipped(number, &why);
                        lock(&feed.summary).skipped += 1;
                    }
                    Some(Taken::Unreadable(error)) => {
                        report.tasks_unreadable(&error);
                        lock(&feed.summary).unread = true;
                        reading = false;
                    }
                    None => reading = false,
                },
                else => break,
            }
        }
    }

    /// Runs one task (again after a transient failure, up to `retry`
    /// times) and writes its result line (with a pipeline step's
    /// `inputs_hash` and `extra` fields); `None` when the batch was
    /// cancelled before it started.
    #[expect(clippy::too_many_arguments, reason = "one task's run: what it is, where it is from, who hears of it")]
    pub(super) async fn run_one(
        &self,
        line: usize,
        task: Box<Task>,
        id: String,
        hash: u64,
        inputs: Option<u64>,
        extra: Vec<(&'static str, Value)>,
        report: &dyn Report,
    ) -> Option<(Finished, Value)> {
        let timeout = task.timeout.or(self.timeout);
        let provider = task.provider.as_deref().unwrap_or(&self.provider);
        let detaching = self.runs.is_some() && self.subagents.provider(provider).is_some_and(|info| info.detaches);
        // A run an earlier batch started and did not settle: attached to
        // again, unless its provider no longer knows it or stopped it (then
        // it starts again, and its line says so). A task settled before
        // (run again by rerun_failed) or whose line changed since starts
        // afresh.
        let (mut attached, mut expired) = (None, None);
        let unsettled = !self.settled.contains_key(&id_key(&id));
        let recorded = self.recorded.get(&id_key(&id)).filter(|r| detaching && unsettled && r.hash == Some(hash));
        if let Some(Recorded { run, .. }) = recorded {
            let attach = Detached::Attach(run.clone());
            let outcome = self.attempt((line, &id), (*task).clone(), timeout, Some(attach)).await?;
            // A run the earlier batch's interruption stopped is not a result.
            let stopped = outcome.0["stop_reason"] == "aborted" && !self.cancel.is_cancelled();
            match outcome.0["diagnostic"]["category"].as_str() {
                Some("run-unknown" | "lease-expired") => expired = Some(run.clone()),
                _ if stopped => expired = Some(run.clone()),
                _ => attached = Some(outcome),
            }
        }
        let reattached = attached.is_some();
        let mut last = match attached {
            Some(outcome) => outcome,
            None => self.start_attempt(line, (&id, hash), &task, timeout, detaching).await?,
        };
        let mut attempt = 1;
        while attempt <= self.retry && transient(&last.0) && !self.cancel.is_cancelled() {
            let wait = retry_wait(attempt);
            report.retrying(line, attempt, &last.1.outcome, wait);
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.cancel.cancelled() => break,
            }
            // A batch cancelled before the next attempt began keeps the last.
            let Some(next) = self.start_attempt(line, (&id, hash), &task, timeout, detaching).await else { break };
            (last, attempt) = (next, attempt + 1);
        }
        let (mut record, mut finished, detail) = last;
        record["id"] = json!(id);
        record["task_hash"] = json!(hash_text(hash));
        if let Some(inputs) = inputs {
            record["inputs_hash"] = json!(hash_text(inputs));
        }
        for (key, value) in extra {
            record[key] = value;
        }
        if attempt > 1 {
            record["attempts"] = json!(attempt);
        }
        if reattached && attempt == 1 {
            record["reattached"] = json!(true);
        }
        if let Some(run) = expired {
            record["expired_run"] = json!(run);
        }
        if finished.interrupted {
            record["interrupted"] = json!(true);
        }
        finished.written = self.results.write(&record, report);
        let settled = Settled {
            line,
            label: task.label.as_deref(),
            outcome: &finished.outcome,
            detail: detail.as_deref(),
            latency: finished.latency,
            record: &record,
            written: finished.written,
        };
        report.settled(&settled);
        Some((Finished { retried: attempt > 1, reattached: reattached && attempt == 1, ..finished }, record))
    }

    /// A fresh run of a task; with `detaching`, under a new run id written
    /// to `OUT.runs` first (a batch killed after that finds it there).
    async fn start_attempt(
        &self,
        line: usize,
        (id, hash): (&str, u64),
        task: &Task,
        timeout: Option<Duration>,
        detaching: bool,
    ) -> Option<Attempt> {
        if self.cancel.is_cancelled() {
            return None;
        }
        let detached = match (&self.runs, detaching) {
            (Some(runs), true) => {
                let run = crate::agent::ids::session_id();
                let entry = format!("{}\n", json!({"id": id, "run": run, "task_hash": hash_text(hash)}));
                match runs.lock().unwrap_or_else(std::sync::PoisonError::into_inner).write_line(entry.as_bytes()) {
                    Ok(()) => Some(Detached::Start(run)),
                    Err(error) => {
                        // Not recorded: run it as a plain start, stopped with this batch if it dies.
                        tracing::warn!(line, %error, "cannot record a run in the runs journal; a resume will start it again");
                        None
                    }
                }
            }
            _ => None,
        };
        self.attempt((line, id), task.clone(), timeout, detached).await
    }

    /// One run of a task; `None` when the batch was cancelled first. A run
    /// past `timeout` is cancelled and its record says `"reason":
    /// "timeout"`.
    async fn attempt(
        &self,
        (line, id): (usize, &str),
        task: Task,
        timeout: Option<Duration>,
        detached: Option<Detached>,
    ) -> Option<Attempt> {
        if self.cancel.is_cancelled() {
            return None;
        }
        let began = Instant::now();
        let signal = self.cancel.child_token();
        let timed_out = Arc::new(AtomicBool::new(false));
        let _timer = timeout.map(|timeout| {
            let (signal, timed_out) = (signal.clone(), timed_out.clone());
            AbortOnDrop::Timer(
                tokio::spawn(async move {
                    tokio::time::sleep(timeout).await;
                    timed_out.store(true, Ordering::Release);
                    signal.cancel();
                })
                .abort_handle(),
            )
        });
        let parent = match &self.budget {
            Some(lease) => Parent::root(&self.cwd).with_budget_lease(lease.clone()),
            None => Parent::root(&self.cwd),
        };
        let mut request = StartRequest::new(task.prompt, parent, signal);
        if let Some(budget) = task.budget {
            request = request.with_budget(budget);
        }
        request.label = task.label.clone();
        request.persona = task.persona;
        request.output_schema = task.output_schema;
        request.max_depth = task.max_depth;
        request.detached = detached;
        request.task = Some(BatchTask { batch: self.name.clone(), id: id.to_owned(), resumed: self.resuming });
        // `detail` says why a run failed, in the library's fixed wording.
        let mut completed = false;
        // A run its transport could not serve (see `Category::is_unserved`).
        let mut unserved = false;
        let mut stopped = (0, 0);
        let mut tree_usage = RunUsage::default();
        let provider = task.provider.as_deref().unwrap_or(&self.provider);
        let (mut record, outcome, mut detail) = match self.subagents.start(provider, request).await {
            Ok(run) => {
                let result = run.result().await;
                let disposed = run.dispose().await;
                // What the run's tree spent, and what an interruption stopped.
                let receipt = run.receipt().await;
                tree_usage = receipt.usage_in_tree();
                if self.cancel.is_cancelled() {
                    stopped = (receipt.stopped_descendants(), receipt.unknown_branches().len());
                }
                let latency_ms = began.elapsed().as_secs_f64() * 1e3;
                match result {
                    Ok(result) => {
                        let mut record = json!({
                            "line": line, "label": task.label, "run_id": run.run_id(), "child_id": run.child_id(), "stop_reason": result.stop_reason,
                            "output": result.text(), "latency_ms": latency_ms,
                            "usage": result.usage, "tree_usage": tree_usage,
                        });
                        if let Some(structured) = &result.structured {
                            record["structured"] = structured.clone();
                        }
                        if let Some(diagnostic) = &result.diagnostic {
                            record["diagnostic"] = json!(diagnostic);
                        }
                        if let Some(session) = &result.child_session {
                            record["child_session"] = json!(session);
                        }
                        if let Some(workspace) = &result.workspace {
                            record["workspace"] = json!(workspace);
                        }
                        if result.tool_calls_failed > 0 {
                            record["tool_calls_failed"] = json!(result.tool_calls_failed);
                        }
                        if let Err(error) = disposed {
                            record["dispose_error"] = json!(error.to_string());
                        }
                        if stopped.0 > 0 {
                            record["stopped_descendants"] = json!(stopped.0);
                        }
                        completed = result.stop_reason == StopReason::Completed;
                        unserved = result.diagnostic.as_ref().is_some_and(|d| d.category.is_unserved());
                        let detail = result.diagnostic.map(|d| match d.explanation() {
                            Some(explanation) => format!("{}: {explanation}", d.category_name()),
                            None => d.category_name(),
                        });
                        (record, result.stop_reason.to_string(), detail)
                    }
                    Err(error) => {
                        let record = json!({"line": line, "label": task.label, "error": error.to_string()});
                        (record, "error".to_owned(), Some(error.to_string()))
                    }
                }
            }
            Err(error) => {
                let mut record =
                    json!({"line": line, "label": task.label, "error": error.to_string(), "code": error.code()});
                if let StartError::StartupFailed { diagnostic, .. } = &error {
                    record["diagnostic"] = json!(diagnostic);
                    unserved = diagnostic.category.is_unserved();
                }
                // A line naming no provider of the runtime (read from a pipe,
                // so not checked before the batch) never ran.
                unserved |= matches!(error, StartError::NoProvider(_));
                (record, format!("rejected ({})", error.code()), Some(error.to_string()))
            }
        };
        // So a reader of the file alone (`subagents ui --out`) can count by provider.
        record["provider"] = json!(provider);
        let latency = began.elapsed();
        let timed_out = timed_out.load(Ordering::Acquire);
        if timed_out && record["stop_reason"] == "aborted" {
            record["reason"] = json!("timeout");
            detail = Some(format!("timed out after {:.1?}", timeout.unwrap_or_default()));
        }
        let (stopped_descendants, unknown_branches) = stopped;
        // Stopped by the batch, not by its own timeout: not settled.
        let interrupted = self.cancel.is_cancelled() && !completed && !timed_out;
        let finished = Finished {
            latency,
            completed,
            unserved,
            outcome: if interrupted { "interrupted".to_owned() } else { outcome },
            interrupted,
            written: false,
            stopped_descendants,
            unknown_branches,
            usage: tree_usage,
            retried: false,
            reattached: false,
        };
        Some((record, finished, detail))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task_number(line: Option<std::io::Result<Line>>) -> usize {
        match line {
            Some(Ok(Line::Task { number, .. })) => number,
            _ => panic!("not a task line"),
        }
    }

    #[test]
    fn a_line_read_from_a_pipe_reaches_the_runs_before_the_next_is_written() {
        let (reader, mut writer) = std::io::pipe().unwrap();
        let file = File::from(std::os::fd::OwnedFd::from(reader));
        let mut lines = read_ahead(TaskLines::new(BufReader::new(file), 1 << 20));
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let wait = Duration::from_secs(10);
        std::io::Write::write_all(&mut writer, b"{\"prompt\":\"one\"}\n").unwrap();
        // The writer stays open: a chunk waiting to fill would never come.
        let first = runtime.block_on(async { tokio::time::timeout(wait, lines.recv()).await });
        let first = first.expect("the first line is not held back");
        assert_eq!(task_number(first), 1);
        std::io::Write::write_all(&mut writer, b"{\"prompt\":\"two\"}\n{\"prompt\":\"three\"}\n").unwrap();
        drop(writer);
        let rest = runtime.block_on(async {
            let mut numbers = Vec::new();
            while let Some(line) = tokio::time::timeout(wait, lines.recv()).await.unwrap() {
                numbers.push(task_number(Some(line)));
            }
            numbers
        });
        assert_eq!(rest, [2, 3]);
    }

    #[test]
    fn lines_of_a_file_come_in_order_across_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tasks.jsonl");
        let text: String = (0..1_000).map(|n| format!("{{\"prompt\":\"task {n}\"}}\n")).collect();
        std::fs::write(&path, text).unwrap();
        let mut lines = read_ahead(TaskLines::new(BufReader::new(File::open(&path).unwrap()), 1 << 20));
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let numbers = runtime.block_on(async {
            let mut numbers = Vec::new();
            while let Some(line) = lines.recv().await {
                numbers.push(task_number(Some(line)));
            }
            numbers
        });
        assert_eq!(numbers, (1..=1_000).collect::<Vec<_>>());
    }
}
