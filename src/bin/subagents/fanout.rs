//! `subagents fanout TASKS.jsonl`: every task line becomes a subagent run.

use std::collections::BTreeMap;
use std::io::{BufReader, IsTerminal, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use subagents::{CancellationToken, Parent, StartRequest, Subagents};
use tokio::sync::Semaphore;

use crate::setup::{cancel_on_ctrl_c, setup};
use crate::tasks::{Line, Task, TaskLines};
use crate::terminal::{self, say};
use crate::timeline::{write_trace, Timeline};

/// The most runs a batch keeps in flight: far above what one machine
/// serves, far below what the semaphore and the tables sized by it bear.
pub const MAX_CONCURRENCY: i64 = 100_000;

pub struct FanoutArgs {
    pub tasks: PathBuf,
    pub concurrency: Option<u32>,
    pub max_line_bytes: u64,
    pub out: Option<PathBuf>,
    pub provider: String,
    pub model: String,
    pub trace: Option<PathBuf>,
    pub home: Option<PathBuf>,
}

/// How a batch ended.
pub enum Ended {
    Finished,
    Interrupted,
}

/// Every task of the file; a line that cannot be one is reported and skipped.
fn read_tasks(path: &PathBuf, max_line_bytes: u64) -> Result<Vec<(usize, Task)>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let mut tasks = Vec::new();
    for line in TaskLines::new(BufReader::new(file), max_line_bytes) {
        match line.map_err(|e| format!("cannot read {}: {e}", path.display()))? {
            Line::Task { number, task } => tasks.push((number, task)),
            Line::Skipped { number, why } => say!("subagents: {}:{number}: skipped: {why}", path.display()),
        }
    }
    Ok(tasks)
}

/// What the batch reports per run.
struct Settled {
    latency: Duration,
    reason: String,
}

/// Results go out as they settle, so an interrupted batch still leaves a
/// valid file of what finished.
type Sink = Arc<Mutex<Box<dyn Write + Send>>>;

pub fn fanout(args: FanoutArgs) -> Result<Ended, String> {
    let tasks = read_tasks(&args.tasks, args.max_line_bytes)?;
    let mut sink: Box<dyn Write + Send> = match &args.out {
        Some(path) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?,
        )),
        None => Box::new(std::io::stdout()),
    };
    let setup = setup(&args.model, args.home)?;
    if !setup.subagents.has_provider(&args.provider) {
        let available = setup.subagents.list().join(", ");
        setup.runtime.shutdown_blocking();
        return Err(format!("unknown provider {:?} (available: {available})", args.provider));
    }
    let _ = sink.flush();
    let sink: Sink = Arc::new(Mutex::new(sink));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // clap keeps an explicit value in 1..=MAX_CONCURRENCY.
    let concurrency = args.concurrency.map_or(4 * cores, |n| n as usize);
    let batch = CancellationToken::new();
    cancel_on_ctrl_c(batch.clone());
    let progress = progress_bar(tasks.len());
    // Events are built only when someone listens: record them for a trace.
    let timeline = args.trace.is_some().then(|| Timeline::record(&setup.subagents));
    let started = Instant::now();
    let batch_run = Batch {
        subagents: setup.subagents.clone(),
        provider: args.provider.clone(),
        cwd: setup.cwd.clone(),
        batch: batch.clone(),
        sink: sink.clone(),
        progress: progress.clone(),
    };
    let settled = setup.runtime.block_on(batch_run.run_all(tasks, concurrency));
    let elapsed = started.elapsed();
    progress.finish_and_clear();
    sink.lock().unwrap().flush().map_err(|e| format!("cannot write results: {e}"))?;
    summary(&settled, elapsed);
    if let (Some(path), Some(timeline)) = (&args.trace, timeline) {
        let end = timeline.elapsed();
        let spans = timeline.finish();
        write_trace(&spans, end, path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        say!("trace: {} ({} runs; open it in Perfetto)", path.display(), spans.len());
    }
    let report = setup.runtime.shutdown_blocking();
    if !report.live_after.is_quiescent() {
        return Err(format!("runs left alive after shutdown: {:?}", report.live_after));
    }
    Ok(if batch.is_cancelled() { Ended::Interrupted } else { Ended::Finished })
}

fn progress_bar(total: usize) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(total as u64), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{bar:40} {pos}/{len} runs settled, {per_sec} {msg}") {
        bar.set_style(style);
    }
    bar
}

struct Batch {
    subagents: Subagents,
    provider: String,
    cwd: PathBuf,
    batch: CancellationToken,
    sink: Sink,
    progress: ProgressBar,
}

impl Batch {
    async fn run_all(self, tasks: Vec<(usize, Task)>, concurrency: usize) -> Vec<Settled> {
        let this = Arc::new(self);
        let permits = Arc::new(Semaphore::new(concurrency));
        let mut handles = Vec::with_capacity(tasks.len());
        for (line, task) in tasks {
            let permit = tokio::select! {
                permit = permits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
                _ = this.batch.cancelled() => break,
            };
            let this = this.clone();
            handles.push(actix::spawn(async move {
                let _permit = permit;
                this.run_one(line, task).await
            }));
        }
        let mut settled = Vec::with_capacity(handles.len());
        for handle in handles {
            if let Ok(Some(one)) = handle.await {
                settled.push(one);
            }
        }
        settled
    }

    async fn run_one(&self, line: usize, task: Task) -> Option<Settled> {
        if self.batch.is_cancelled() {
            return None;
        }
        let began = Instant::now();
        let mut request = StartRequest::new(task.prompt, Parent::root(&self.cwd), self.batch.child_token());
        request.label = task.label.clone();
        request.persona = task.persona;
        request.output_schema = task.output_schema;
        request.max_depth = task.max_depth;
        let (record, reason) = match self.subagents.start(&self.provider, request).await {
            Ok(run) => {
                let result = run.result().await;
                let disposed = run.dispose().await;
                let latency_ms = began.elapsed().as_secs_f64() * 1e3;
                match result {
                    Ok(result) => {
                        let mut record = json!({
                            "line": line, "label": task.label, "run": run.id(), "stop_reason": result.stop_reason,
                            "output": result.text(), "latency_ms": latency_ms,
                        });
                        if let Some(structured) = &result.structured {
                            record["structured"] = structured.clone();
                        }
                        if let Some(diagnostic) = &result.diagnostic {
                            record["diagnostic"] = json!(diagnostic);
                        }
                        if let Err(error) = disposed {
                            record["dispose_error"] = json!(error.to_string());
                        }
                        (record, result.stop_reason.to_string())
                    }
                    Err(error) => {
                        (json!({"line": line, "label": task.label, "error": error.to_string()}), "error".into())
                    }
                }
            }
            Err(error) => (
                json!({"line": line, "label": task.label, "error": error.to_string(), "code": error.code()}),
                format!("rejected ({})", error.code()),
            ),
        };
        let latency = began.elapsed();
        {
            let mut sink = self.sink.lock().unwrap();
            let _ = writeln!(sink, "{record}");
            let _ = sink.flush();
        }
        if self.progress.is_hidden() {
            let label = task.label.as_deref().unwrap_or("task");
            say!("line {line}: {label}: {reason} ({:.1} ms)", latency.as_secs_f64() * 1e3);
        } else {
            self.progress.inc(1);
        }
        Some(Settled { latency, reason })
    }
}

fn summary(settled: &[Settled], elapsed: Duration) {
    let mut latencies: Vec<Duration> = settled.iter().map(|s| s.latency).collect();
    latencies.sort_unstable();
    let percentile = |p: f64| -> Duration {
        if latencies.is_empty() {
            return Duration::ZERO;
        }
        latencies[((latencies.len() - 1) as f64 * p).round() as usize]
    };
    let mut per_reason = BTreeMap::<&str, usize>::new();
    for one in settled {
        *per_reason.entry(one.reason.as_str()).or_default() += 1;
    }
    let rate = settled.len() as f64 / elapsed.as_secs_f64().max(1e-9);
    let mut out = std::io::stderr();
    let _ = writeln!(out, "\n{} runs in {:.2?} ({rate:.0} runs/s)", settled.len(), elapsed);
    let _ = writeln!(out, "  {:<24} {:>6}", "stop reason", "runs");
    for (reason, count) in &per_reason {
        let _ = writeln!(out, "  {:<24} {count:>6}", terminal::line(reason));
    }
    let _ = writeln!(out, "  latency p50 {:.1?}, p99 {:.1?}", percentile(0.5), percentile(0.99));
}
