//! The `subagents` command line.
//!
//! `subagents fanout TASKS.jsonl` turns every task line into a subagent run
//! with bounded concurrency, writes one JSON result line per task, and ends
//! with a summary. Today the runs go to the scripted `mock` provider (no key,
//! no network); the model-backed providers arrive with the agent core.

use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use serde::Deserialize;
use serde_json::json;
use subagents::providers::MockProvider;
use subagents::{CancellationToken, Parent, Runtime, StartRequest, StopReason, Subagents};
use tokio::sync::Semaphore;

#[derive(Parser)]
#[command(name = "subagents", version, about = "Delegate work to supervised child agents")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run every task line of a JSONL file as a subagent, in parallel.
    Fanout {
        /// JSON lines: {"prompt": "...", "label": "..."}.
        tasks: PathBuf,
        /// Most runs in flight at once (default 4 × cores).
        #[arg(long)]
        concurrency: Option<usize>,
        /// Write result lines here instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Provider to run the tasks on.
        #[arg(long, default_value = "mock")]
        provider: String,
    },
}

#[derive(Deserialize)]
struct Task {
    prompt: String,
    #[serde(default)]
    label: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Fanout { tasks, concurrency, out, provider } => match fanout(tasks, concurrency, out, &provider) {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => {
                eprintln!("subagents: {message}");
                ExitCode::from(2)
            }
        },
    }
}

fn fanout(tasks: PathBuf, concurrency: Option<usize>, out: Option<PathBuf>, provider: &str) -> Result<(), String> {
    let file = std::fs::File::open(&tasks).map_err(|e| format!("cannot open {}: {e}", tasks.display()))?;
    let mut parsed = Vec::new();
    for (index, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| format!("cannot read {}: {e}", tasks.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str::<Task>(&line) {
            Ok(task) => parsed.push((index + 1, task)),
            Err(error) => eprintln!("subagents: {}:{}: skipped: {error}", tasks.display(), index + 1),
        }
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let concurrency = concurrency.unwrap_or(4 * cores).max(1);
    let cwd = std::env::current_dir().map_err(|e| format!("no working directory: {e}"))?;
    let runtime = Runtime::builder().build().map_err(|e| format!("cannot start the runtime: {e}"))?;
    let subagents = runtime.subagents();
    let mock =
        MockProvider::new("mock").with_reply("handled: ").with_echo_prompt().with_delay(Duration::from_millis(20));
    subagents.register_provider(mock).map_err(|e| e.to_string())?.keep();
    if subagents.get_provider(provider).is_none() {
        runtime.shutdown_blocking();
        return Err(format!("unknown provider {provider:?} (available: {})", subagents.list().join(", ")));
    }
    let mut sink: Box<dyn Write + Send> = match &out {
        Some(path) => {
            Box::new(std::fs::File::create(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?)
        }
        None => Box::new(std::io::stdout()),
    };
    let total = parsed.len();
    let provider = provider.to_owned();
    let started = Instant::now();
    let lines = runtime.block_on(run_all(subagents, provider, parsed, concurrency, cwd));
    let elapsed = started.elapsed();
    let mut latencies = Vec::with_capacity(lines.len());
    let mut per_reason = std::collections::BTreeMap::<String, usize>::new();
    for (line, latency, reason) in &lines {
        writeln!(sink, "{line}").map_err(|e| format!("cannot write results: {e}"))?;
        latencies.push(*latency);
        *per_reason.entry(reason.clone()).or_default() += 1;
    }
    sink.flush().map_err(|e| format!("cannot write results: {e}"))?;
    latencies.sort_unstable();
    let percentile = |p: f64| -> Duration {
        if latencies.is_empty() {
            return Duration::ZERO;
        }
        latencies[((latencies.len() - 1) as f64 * p).round() as usize]
    };
    let mut summary = std::io::stderr();
    let _ = writeln!(summary, "{total} tasks in {:.2?} ({:.0} runs/s)", elapsed, total as f64 / elapsed.as_secs_f64());
    for (reason, count) in &per_reason {
        let _ = writeln!(summary, "  {reason:<12} {count}");
    }
    let _ = writeln!(summary, "  latency p50 {:.2?}  p99 {:.2?}", percentile(0.5), percentile(0.99));
    let report = runtime.shutdown_blocking();
    if !report.live_after.is_quiescent() {
        return Err(format!("runs left alive after shutdown: {:?}", report.live_after));
    }
    Ok(())
}

async fn run_all(
    subagents: Subagents,
    provider: String,
    tasks: Vec<(usize, Task)>,
    concurrency: usize,
    cwd: PathBuf,
) -> Vec<(String, Duration, String)> {
    let permits = Arc::new(Semaphore::new(concurrency));
    let progress = std::io::stderr().is_terminal();
    let total = tasks.len();
    let mut handles = Vec::with_capacity(total);
    for (line, task) in tasks {
        let permit = permits.clone().acquire_owned().await.expect("the semaphore is never closed");
        let subagents = subagents.clone();
        let provider = provider.clone();
        let parent = Parent::root(cwd.clone());
        handles.push(actix::spawn(async move {
            let _permit = permit;
            let began = Instant::now();
            let mut request = StartRequest::new(task.prompt, parent, CancellationToken::new());
            request.label = task.label.clone();
            let outcome = match subagents.start(&provider, request).await {
                Ok(run) => {
                    let result = run.result().await;
                    let disposed = run.dispose().await;
                    match (result, disposed) {
                        (Ok(result), Ok(())) => Ok((run.id().to_owned(), result)),
                        (Err(error), _) | (_, Err(error)) => Err(error),
                    }
                }
                Err(error) => Err(error),
            };
            let latency = began.elapsed();
            let (line_json, reason) = match outcome {
                Ok((id, result)) => (
                    json!({"line": line, "label": task.label, "run": id, "stop_reason": result.stop_reason,
                           "output": result.text(), "latency_ms": latency.as_secs_f64() * 1e3}),
                    result.stop_reason.to_string(),
                ),
                Err(error) => (
                    json!({"line": line, "label": task.label, "error": error.to_string(), "code": error.code()}),
                    StopReason::Error.to_string(),
                ),
            };
            (line_json.to_string(), latency, reason)
        }));
    }
    let mut lines = Vec::with_capacity(total);
    for (done, handle) in handles.into_iter().enumerate() {
        if let Ok(line) = handle.await {
            lines.push(line);
        }
        if progress {
            eprint!("\r{}/{} runs settled", done + 1, total);
        }
    }
    if progress {
        eprintln!();
    }
    lines
}
