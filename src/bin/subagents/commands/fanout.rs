//! `subagents fanout TASKS.jsonl`: every task line becomes a subagent run.
//!
//! The file is streamed: a reader thread parses lines a few dozen ahead
//! ([`crate::tasks`]), the batch keeps at most `--concurrency` runs in
//! flight, and each finished run leaves only its result line (written at
//! once) and its counts in the [`Tally`]. Memory follows the concurrency,
//! not the length of the file.
//!
//! With `--out` on a provider that detaches its runs (`remote`), every
//! start is named and recorded in `OUT.runs` first ([`crate::journal`]),
//! and `--resume` attaches to the runs recorded for unsettled tasks
//! instead of starting them again (`"reattached": true`), starting afresh
//! only those the provider no longer knows or stopped (`"expired_run"`).
//!
//! An interruption (Ctrl-C, or a result that could not be written) settles
//! nothing: the runs it stopped are written with `"interrupted": true`,
//! which `--resume` runs again, and the exact command that resumes the
//! batch is printed.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, IsTerminal};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{json, Value};
use subagents::seam::{BudgetLease, Detached, RunUsage};
use subagents::{Budget, CancellationToken, Parent, StartRequest, StopReason, SubagentError, Subagents};
use tokio::sync::mpsc;

use crate::args::{BudgetArgs, ConfigArgs, DurableArgs, HomeArgs, ModelArgs, RemoteArgs};
use crate::journal::{self, hash_text, Journal, Prior, Recorded};
use crate::logging;
use crate::outputs::{self, Outputs, Results};
use crate::setup::{cancel_on_ctrl_c, setup};
use crate::summary::{Settled, Tally};
use crate::tasks::{self, id_key, task_id, FirstLines, IdKey, Line, Task, TaskLines};
use crate::terminal::say;
use crate::Ended;

/// The most runs a batch keeps in flight: more than one machine serves,
/// and a bound, so that a slip of the keyboard is a usage error.
pub const MAX_CONCURRENCY: i64 = 100_000;

/// `subagents fanout`'s flags.
#[derive(clap::Args, Debug)]
pub struct FanoutArgs {
    /// JSON lines: {"prompt": "...", "id"?, "label"?, "persona"?, "output_schema"?, "max_depth"?, "budget"?, "provider"?, "timeout"?}.
    tasks: PathBuf,
    /// Most runs in flight at once, 1 to 100000 (default 4 × cores).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=MAX_CONCURRENCY))]
    concurrency: Option<u32>,
    /// Longest task line read, in bytes; a longer one is reported and skipped.
    #[arg(long, default_value_t = tasks::DEFAULT_MAX_LINE_BYTES, value_parser = clap::value_parser!(u64).range(1..))]
    max_line_bytes: u64,
    /// Write result lines here instead of stdout: appended as runs settle,
    /// made durable within a second, locked against a second batch.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Provider of the task lines that name none (default: the first the
    /// configuration's `[tool]` offers; built in: `spawn`).
    #[arg(long)]
    provider: Option<String>,
    #[command(flatten)]
    config: ConfigArgs,
    #[command(flatten)]
    model: ModelArgs,
    /// Write a Chrome trace-event JSON of every run's lifecycle here.
    #[arg(long)]
    trace: Option<PathBuf>,
    #[command(flatten)]
    home: HomeArgs,
    /// Exit 1 when any run did not complete (default: only when a task
    /// line could not be run or results could not be written).
    #[arg(long)]
    strict: bool,
    #[command(flatten)]
    remote: RemoteArgs,
    #[command(flatten)]
    budget: BudgetArgs,
    #[command(flatten)]
    durable: DurableArgs,
}

impl FanoutArgs {
    pub fn run(self) -> Result<ExitCode, String> {
        let config = self.config.load()?;
        fanout(self, &config).map(ExitCode::from)
    }
}

/// The first wait before a retry; it doubles each time, up to
/// [`MAX_RETRY_WAIT`], with jitter.
const FIRST_RETRY_WAIT: Duration = Duration::from_millis(500);
const MAX_RETRY_WAIT: Duration = Duration::from_secs(30);

/// Task lines read ahead of the runs: enough that a run never waits for
/// the file, few enough that a file of long lines costs little.
const READ_AHEAD_LINES: usize = 64;

fn fanout(args: FanoutArgs, config: &subagents::config::Config) -> Result<Ended, String> {
    outputs::refuse_shared(&args.tasks, args.out.as_deref(), args.trace.as_deref())?;
    let tasks_file = open_tasks(&args.tasks)?;
    let provider = match &args.provider {
        Some(provider) => provider.clone(),
        None => config.tool_providers().first().cloned().ok_or("the configuration defines no provider")?,
    };
    if args.durable.resume && !args.tasks.is_file() {
        return Err(format!("--resume reads the tasks twice: {} must be a regular file", args.tasks.display()));
    }
    let setup = setup(&args.model.model, args.home.given(), &provider, &args.remote, config)?;
    // Refusals from here on stop the runtime (as `setup` drops); files are
    // created last so that a refused batch truncates nothing.
    setup.check_provider(&provider)?;
    // Cancelled by Ctrl-C, or by the first result that cannot be written.
    let batch = CancellationToken::new();
    let (out, trace_path) = (args.out.as_deref(), args.trace.as_deref());
    let outputs = Outputs::open(out, trace_path, args.durable.resume, args.max_line_bytes, batch.clone())?;
    check_unchanged(&args.tasks, args.max_line_bytes, &outputs.settled, args.durable.rerun_changed)?;
    // Runs of a provider that detaches them are recorded beside `--out`
    // before they start, so that `--resume` attaches to them again.
    let detaches = setup.subagents.provider(&provider).is_some_and(|info| info.detaches);
    let (runs, recorded) = match (out, detaches && outputs.results.resumable()) {
        (Some(out), true) => {
            let runs_path = journal::runs_path(out);
            let (runs, recorded) = journal::open_runs(&runs_path, args.durable.resume, args.max_line_bytes)?;
            (Some(Mutex::new(runs)), recorded)
        }
        _ => (None, HashMap::new()),
    };
    let Outputs { results, trace: trace_file, settled } = outputs;
    // The trace is the runtime's own spans: nothing else to record.
    let trace = logging::install(logging::warnings(), trace_file);
    let results = Arc::new(results);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // clap keeps an explicit value in 1..=MAX_CONCURRENCY.
    let concurrency = args.concurrency.map_or(4 * cores, |n| n as usize);
    cancel_on_ctrl_c(&setup.runtime, batch.clone());
    let progress = progress_bar(&args.tasks);
    let _per_provider = crate::live::per_provider(&setup.subagents, &progress);
    let started = Instant::now();
    let lines = read_ahead(TaskLines::new(BufReader::new(tasks_file), args.max_line_bytes));
    let batch_run = Batch {
        subagents: setup.subagents.clone(),
        provider,
        cwd: setup.cwd.clone(),
        tasks_path: args.tasks.clone(),
        batch: batch.clone(),
        results: results.clone(),
        progress: progress.clone(),
        budget: Some(args.budget.budget()).filter(|b| !b.is_unlimited()).map(Budget::lease),
        settled,
        durable: args.durable.clone(),
        runs,
        recorded,
    };
    let tally = setup.runtime.block_on(batch_run.run_all(lines, concurrency));
    let elapsed = started.elapsed();
    progress.finish_and_clear();
    // Runs have started: a failure from here on is reported and makes the
    // batch incomplete (exit 1), never a usage error.
    // A run's stop reason is data (its result line, the summary); only
    // `--strict` makes a run that did not complete fail the batch.
    let mut all_done = tally.all_ran() && (!args.strict || tally.all_completed());
    // A result that could not be written was said when it happened; one
    // that fails only now (the last sync) is said here.
    let lost = results.finish().is_err();
    all_done &= !lost;
    tally.print(elapsed);
    let interrupted = batch.is_cancelled() && !lost;
    if interrupted {
        // What the interruption stopped, from the runs' receipts.
        let unknown = match tally.unknown_branches {
            0 => String::new(),
            n => format!(" ({n} branches of the tree could not be known)"),
        };
        say!(
            "subagents: interrupted: {} runs stopped; {} descendants stopped under them{unknown}",
            tally.interrupted(),
            tally.stopped_descendants
        );
    }
    if interrupted || lost {
        match results.resumable() {
            true => say!("subagents: to finish the batch: {}", resume_command()),
            false => say!("subagents: results went to {}: run the batch with --out FILE to resume it", "stdout"),
        }
    }
    let report = setup.runtime.shutdown();
    if !report.live_after.is_quiescent() {
        say!("subagents: runs left alive after shutdown: {:?}", report.live_after);
        all_done = false;
    }
    if let (Some(path), Some(trace)) = (&args.trace, trace) {
        // Every run's span closed with the runtime; this finishes the file.
        match trace.finish() {
            Ok(()) => say!("trace: {} (open it in Perfetto)", path.display()),
            Err(why) => {
                say!("subagents: the trace {} is incomplete: {why}", path.display());
                all_done = false;
            }
        }
    }
    Ok(Ended::new(interrupted, all_done))
}

/// The command line that resumes this batch: this one, with `--resume`.
fn resume_command() -> String {
    let mut words: Vec<String> = std::env::args_os().map(|word| shell_word(&word.to_string_lossy())).collect();
    if !words.iter().any(|word| word == "--resume") {
        words.push("--resume".to_owned());
    }
    words.join(" ")
}

/// `word` as a POSIX shell reads it back: bare when it is plain, else in
/// single quotes.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c);
    match !word.is_empty() && word.chars().all(plain) {
        true => word.to_owned(),
        false => format!("'{}'", word.replace('\'', r"'\''")),
    }
}

/// With `--resume`: every task line whose id the results file settled
/// ran the same line then, else the batch is refused (exit 2) naming the
/// first changed line, unless `rerun_changed`.
fn check_unchanged(
    tasks: &Path,
    max_line_bytes: u64,
    settled: &HashMap<IdKey, Prior>,
    rerun_changed: bool,
) -> Result<(), String> {
    if settled.is_empty() || rerun_changed {
        return Ok(());
    }
    let file = open_tasks(tasks)?;
    // The lines the batch skips as repeated ids were never run: not checked.
    let mut first_lines = FirstLines::default();
    for line in TaskLines::new(BufReader::new(file), max_line_bytes) {
        let line = line.map_err(|e| format!("cannot read {}: {e}", tasks.display()))?;
        let Line::Task { number, task, hash } = line else { continue };
        let id = task_id(&task, number, hash);
        if first_lines.claim(&task, &id, number).is_err() {
            continue;
        }
        if settled.get(&id_key(&id)).is_some_and(|prior| prior.hash != Some(hash)) {
            return Err(format!(
                "{}:{number}: task {id:?} changed since its result was written (--rerun-changed runs it again)",
                tasks.display()
            ));
        }
    }
    Ok(())
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
fn open_tasks(path: &Path) -> Result<File, String> {
    let file = File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    match file.metadata() {
        Ok(metadata) if metadata.is_dir() => Err(format!("cannot read {}: it is a directory", path.display())),
        Ok(_) => Ok(file),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// Reads `lines` on a thread of its own, at most [`READ_AHEAD_LINES`]
/// ahead: a slow pipe never stalls the runtime, and the file is never held
/// whole. The thread ends at the end of the file or when the batch stops
/// listening.
fn read_ahead(lines: TaskLines<BufReader<File>>) -> mpsc::Receiver<std::io::Result<Line>> {
    let (sender, receiver) = mpsc::channel(READ_AHEAD_LINES);
    std::thread::spawn(move || {
        for line in lines {
            if sender.blocking_send(line).is_err() {
                return;
            }
        }
    });
    receiver
}

/// A bar on a terminal, sized by the file's line count when the file can
/// be read twice; hidden otherwise (plain lines are printed instead).
fn progress_bar(tasks: &Path) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(count_lines(tasks), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len} tasks done, {per_sec} {msg}") {
        bar.set_style(style);
    }
    bar
}

/// The lines in a regular file (a pipe cannot be read twice), counted in
/// constant memory.
fn count_lines(path: &Path) -> Option<u64> {
    let mut file = File::open(path).ok().filter(|f| f.metadata().is_ok_and(|m| m.is_file()))?;
    let (mut buffer, mut lines, mut last) = (vec![0u8; 64 * 1024], 0u64, b'\n');
    loop {
        match std::io::Read::read(&mut file, &mut buffer) {
            Ok(0) => return Some(lines + u64::from(last != b'\n')),
            Ok(read) => {
                lines += buffer[..read].iter().filter(|&&b| b == b'\n').count() as u64;
                last = buffer[read - 1];
            }
            Err(_) => return None,
        }
    }
}

/// Aborts a task (a run's timer) when the run is over.
struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Batch {
    subagents: Subagents,
    provider: String,
    cwd: PathBuf,
    tasks_path: PathBuf,
    batch: CancellationToken,
    results: Arc<Results>,
    progress: ProgressBar,
    /// The batch's budget (`--budget-*`): the batch holds it, every task
    /// run is its child.
    budget: Option<BudgetLease>,
    /// What the results file settled before (`--resume`), by task id.
    settled: HashMap<IdKey, Prior>,
    durable: DurableArgs,
    /// `OUT.runs`, when the batch's provider detaches its runs: each run's
    /// id is written there before it starts.
    runs: Option<Mutex<Journal>>,
    /// What `OUT.runs` recorded before (`--resume`), by task id.
    recorded: HashMap<IdKey, Recorded>,
}

impl Batch {
    /// Runs every task `lines` yields, at most `concurrency` at once. Only
    /// the runs in flight are held; a finished run leaves its counts in the
    /// tally and nothing else.
    async fn run_all(self, mut lines: mpsc::Receiver<std::io::Result<Line>>, concurrency: usize) -> Tally {
        let mut tally = Tally::default();
        let mut in_flight = FuturesUnordered::new();
        // Explicit ids seen, with their lines: one id, one task.
        let mut first_lines = FirstLines::default();
        let mut reading = true;
        loop {
            tokio::select! {
                // Finished runs first: they make room for the next line.
                biased;
                Some(settled) = in_flight.next(), if !in_flight.is_empty() => {
                    if let Some(settled) = settled {
                        tally.add(settled);
                    }
                }
                () = self.batch.cancelled(), if reading => reading = false,
                line = lines.recv(), if reading && in_flight.len() < concurrency => match line {
                    Some(Ok(Line::Task { number, task, hash })) => {
                        let id = task_id(&task, number, hash);
                        if let Err(first) = first_lines.claim(&task, &id, number) {
                            let why = format!("its id {id:?} is line {first}'s too");
                            say!("subagents: {}:{number}: skipped: {why}", self.tasks_path.display());
                            tally.skipped += 1;
                            continue;
                        }
                        let prior = self.settled.get(&id_key(&id));
                        let done = prior.is_some_and(|p| p.hash == Some(hash) && (p.completed || !self.durable.rerun_failed));
                        if done {
                            tally.already_done += 1;
                            self.progress.inc(1);
                            continue;
                        }
                        in_flight.push(self.run_one(number, task, id, hash));
                    }
                    Some(Ok(Line::Skipped { number, why })) => {
                        say!("subagents: {}:{number}: skipped: {why}", self.tasks_path.display());
                        tally.skipped += 1;
                        self.progress.inc(1);
                    }
                    Some(Err(error)) => {
                        say!("subagents: cannot read {}: {error}", self.tasks_path.display());
                        tally.unread = true;
                        reading = false;
                    }
                    None => reading = false,
                },
                else => break,
            }
        }
        tally
    }

    /// Runs one task (again after a transient failure, up to `--retry`
    /// times) and writes its result line; `None` when the batch was
    /// cancelled before it started.
    async fn run_one(&self, line: usize, task: Box<Task>, id: String, hash: u64) -> Option<Settled> {
        let timeout = task.timeout.or(self.durable.timeout);
        let provider = task.provider.as_deref().unwrap_or(&self.provider);
        let detaching = self.runs.is_some() && self.subagents.provider(provider).is_some_and(|info| info.detaches);
        // A run an earlier batch started and did not settle: attached to
        // again, unless its provider no longer knows it or stopped it for
        // want of a caller (then it starts again, and its line says so).
        // A task settled before (run again by --rerun-failed) or whose line
        // changed since starts afresh.
        let (mut attached, mut expired) = (None, None);
        let unsettled = !self.settled.contains_key(&id_key(&id));
        let recorded = self.recorded.get(&id_key(&id)).filter(|r| detaching && unsettled && r.hash == Some(hash));
        if let Some(Recorded { run, .. }) = recorded {
            let attach = Detached::Attach(run.clone());
            let outcome = self.attempt(line, (*task).clone(), timeout, Some(attach)).await?;
            // A run the earlier batch's interruption stopped is not a result.
            let stopped = outcome.0["stop_reason"] == "aborted" && !self.batch.is_cancelled();
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
        while attempt <= self.durable.retry && transient(&last.0) && !self.batch.is_cancelled() {
            let wait = retry_wait(attempt);
            say!("subagents: line {line}: attempt {attempt} failed ({}); again in {wait:.1?}", last.1.outcome);
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = self.batch.cancelled() => break,
            }
            // A batch cancelled before the next attempt began keeps the last.
            let Some(next) = self.start_attempt(line, (&id, hash), &task, timeout, detaching).await else { break };
            (last, attempt) = (next, attempt + 1);
        }
        let (mut record, mut settled, detail) = last;
        record["id"] = json!(id);
        record["task_hash"] = json!(hash_text(hash));
        if attempt > 1 {
            record["attempts"] = json!(attempt);
        }
        if reattached && attempt == 1 {
            record["reattached"] = json!(true);
        }
        if let Some(run) = expired {
            record["expired_run"] = json!(run);
        }
        if settled.interrupted {
            record["interrupted"] = json!(true);
        }
        settled.written = self.results.write(&record);
        if self.progress.is_hidden() {
            let label = task.label.as_deref().unwrap_or("task");
            let detail = detail.map(|d| format!(": {d}")).unwrap_or_default();
            say!("line {line}: {label}: {}{detail} ({:.1} ms)", settled.outcome, settled.latency.as_secs_f64() * 1e3);
        } else {
            self.progress.inc(1);
        }
        Some(Settled { retried: attempt > 1, reattached: reattached && attempt == 1, ..settled })
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
    ) -> Option<(Value, Settled, Option<String>)> {
        if self.batch.is_cancelled() {
            return None;
        }
        let detached = match (&self.runs, detaching) {
            (Some(runs), true) => {
                let run = subagents::agent::ids::session_id();
                let entry = format!("{}\n", json!({"id": id, "run": run, "task_hash": hash_text(hash)}));
                match runs.lock().unwrap().write_line(entry.as_bytes()) {
                    Ok(()) => Some(Detached::Start(run)),
                    Err(error) => {
                        // Not recorded: run it as a plain start, stopped with this batch if it dies.
                        say!("subagents: line {line}: cannot record its run in the runs journal ({error}); a resume will start it again");
                        None
                    }
                }
            }
            _ => None,
        };
        self.attempt(line, task.clone(), timeout, detached).await
    }

    /// One run of a task: its result record (not written yet), its counts,
    /// and why it failed; `None` when the batch was cancelled first. A run
    /// past `timeout` is cancelled and its record says `"reason":
    /// "timeout"`.
    async fn attempt(
        &self,
        line: usize,
        task: Task,
        timeout: Option<Duration>,
        detached: Option<Detached>,
    ) -> Option<(Value, Settled, Option<String>)> {
        if self.batch.is_cancelled() {
            return None;
        }
        let began = Instant::now();
        let signal = self.batch.child_token();
        let timed_out = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let _timer = timeout.map(|timeout| {
            let (signal, timed_out) = (signal.clone(), timed_out.clone());
            AbortOnDrop(
                tokio::spawn(async move {
                    tokio::time::sleep(timeout).await;
                    timed_out.store(true, std::sync::atomic::Ordering::Release);
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
        // `detail` says why a run failed, in the library's fixed wording.
        let mut completed = false;
        // A run its transport could not serve (see `Category::is_unserved`).
        let mut unserved = false;
        let mut stopped = (0, 0);
        let mut tree_usage = RunUsage::default();
        let provider = task.provider.as_deref().unwrap_or(&self.provider);
        let (record, outcome, detail) = match self.subagents.start(provider, request).await {
            Ok(run) => {
                let result = run.result().await;
                let disposed = run.dispose().await;
                // What the run's tree spent, and what an interruption stopped.
                let receipt = run.receipt().await;
                tree_usage = receipt.usage_in_tree();
                if self.batch.is_cancelled() {
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
                        if let Err(error) = disposed {
                            record["dispose_error"] = json!(error.to_string());
                        }
                        if stopped.0 > 0 {
                            record["stopped_descendants"] = json!(stopped.0);
                        }
                        completed = result.stop_reason == StopReason::Completed;
                        unserved = result.diagnostic.as_ref().is_some_and(|d| d.category.is_unserved());
                        let detail = result.diagnostic.and_then(|d| d.reason);
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
                if let SubagentError::StartupFailed { diagnostic, .. } = &error {
                    record["diagnostic"] = json!(diagnostic);
                    unserved = diagnostic.category.is_unserved();
                }
                (record, format!("rejected ({})", error.code()), Some(error.to_string()))
            }
        };
        let latency = began.elapsed();
        let mut record = record;
        let mut detail = detail;
        if timed_out.load(std::sync::atomic::Ordering::Acquire) && record["stop_reason"] == "aborted" {
            record["reason"] = json!("timeout");
            detail = Some(format!("timed out after {:.1?}", timeout.unwrap_or_default()));
        }
        let (stopped_descendants, unknown_branches) = stopped;
        // Stopped by the batch, not by its own timeout: not settled.
        let interrupted =
            self.batch.is_cancelled() && !completed && !timed_out.load(std::sync::atomic::Ordering::Acquire);
        let settled = Settled {
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
        Some((record, settled, detail))
    }
}
