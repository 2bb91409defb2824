//! `subagents fanout TASKS.jsonl`: every task line becomes a subagent run.
//!
//! The batch itself is the library's [`subagents::batch`]: task lines
//! streamed, at most `--concurrency` runs in flight, each result line
//! written as it settles, a durable `--out` journal that `--resume` reads
//! back, retries, timeouts and the summary. This command is its flags and
//! its terminal: a progress bar (or a plain line per run off a terminal),
//! the summary on stderr, `--trace`, Ctrl-C, and the exit code.
//!
//! An interruption (Ctrl-C, or a result that could not be written) settles
//! nothing: the runs it stopped are written with `"interrupted": true`,
//! which `--resume` runs again, and the exact command that resumes the
//! batch is printed.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use subagents::batch::{self, Batch, Report, Resume, Settled};
use subagents::serve::Both;
use subagents::CancellationToken;

use crate::args::{BudgetArgs, DurableArgs, RemoteArgs, Sources, TelemetryArgs};
use crate::coalesced::{self, Coalesced};
use crate::logging;
use crate::outputs;
use crate::setup::{cancel_on_ctrl_c, setup, Shown};
use crate::tasks_file::count_lines;
use crate::terminal::{self, say};
use crate::Ended;

/// The most runs a batch keeps in flight: more than one machine serves,
/// and a bound, so that a slip of the keyboard is a usage error.
pub const MAX_CONCURRENCY: i64 = batch::MAX_CONCURRENCY as i64;

/// `subagents fanout`'s flags.
#[derive(clap::Args, Debug)]
pub struct FanoutArgs {
    /// JSON lines: {"prompt": "...", "id"?, "label"?, "persona"?, "output_schema"?, "max_depth"?, "budget"?, "provider"?, "timeout"?}; `-` reads them from stdin.
    tasks: PathBuf,
    /// Most runs in flight at once, 1 to 100000 (default 4 × cores).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=MAX_CONCURRENCY))]
    concurrency: Option<u32>,
    /// Longest task line read, in bytes; a longer one is reported and skipped.
    #[arg(long, default_value_t = batch::DEFAULT_MAX_LINE_BYTES, value_parser = clap::value_parser!(u64).range(1..))]
    max_line_bytes: u64,
    /// Write result lines here instead of stdout: appended as runs settle,
    /// made durable within a second, locked against a second batch.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Provider of the task lines that name none (default: the first the
    /// configuration's `[tool]` offers; built in: `spawn`).
    #[arg(long)]
    provider: Option<String>,
    /// Write a Chrome trace-event JSON of every run's lifecycle here.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Exit 1 when any run did not complete (default: only when a task
    /// line could not be run or results could not be written).
    #[arg(long)]
    strict: bool,
    /// Serve a web view of the batch on loopback while it runs (its
    /// address, with its token, is printed on stderr).
    #[arg(long)]
    ui: bool,
    /// Answer the children's permission requests by this file's
    /// [approvals] (default: the configuration's); what it leaves to ask
    /// waits for `subagents approve`.
    #[arg(long, value_name = "FILE")]
    approvals: Option<PathBuf>,
    #[command(flatten)]
    sources: Sources,
    #[command(flatten)]
    remote: RemoteArgs,
    #[command(flatten)]
    budget: BudgetArgs,
    #[command(flatten)]
    durable: DurableArgs,
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
}

impl FanoutArgs {
    pub fn run(self) -> Result<ExitCode, String> {
        let config = self.sources.config.load()?;
        fanout(self, &config).map(ExitCode::from)
    }
}

fn fanout(mut args: FanoutArgs, config: &subagents::config::Config) -> Result<Ended, String> {
    if args.tasks == Path::new("-") {
        args.tasks = PathBuf::from("/dev/stdin");
    }
    let mut named = vec![("the tasks file", args.tasks.as_path())];
    named.extend(args.out.as_deref().map(|out| ("--out", out)));
    named.extend(args.trace.as_deref().map(|trace| ("--trace", trace)));
    batch::refuse_shared(&named).map_err(|e| e.to_string())?;
    let provider = match &args.provider {
        Some(provider) => provider.clone(),
        None => config.tool_providers().first().cloned().ok_or("the configuration defines no provider")?,
    };
    let setup = setup(&args.sources.model.model, args.sources.home.resolve(), &provider, &args.remote, config)?;
    // Refusals from here on stop the runtime (as `setup` drops); files are
    // created last so that a refused batch truncates nothing.
    setup.check_provider(&provider)?;
    let approvals = match &args.approvals {
        Some(file) => {
            let read = subagents::config::Config::read(file).map_err(|e| e.to_string())?;
            let rules = read.approvals().cloned();
            Some(rules.ok_or_else(|| format!("{} has no [approvals] table", file.display()))?)
        }
        None => config.approvals().cloned(),
    };
    // Cancelled by Ctrl-C, or by the first result that cannot be written.
    let cancel = CancellationToken::new();
    let durable = &args.durable;
    let mut batch = Batch::new(&setup.subagents, provider)
        .cwd(&setup.cwd)
        .max_line_bytes(args.max_line_bytes)
        .retry(durable.retry)
        .budget(args.budget.budget())
        .resume_with(
            durable
                .resume
                .then_some(Resume { rerun_failed: durable.rerun_failed, rerun_changed: durable.rerun_changed }),
        );
    // clap keeps an explicit value in 1..=MAX_CONCURRENCY.
    if let Some(concurrency) = args.concurrency {
        batch = batch.concurrency(concurrency as usize);
    }
    if let Some(timeout) = durable.timeout {
        batch = batch.timeout(timeout);
    }
    let progress = progress_bar(&args.tasks);
    if let Some(rules) = approvals {
        let (bar, home) = (progress.clone(), setup.home.clone());
        let said = move |parked: &batch::Parked| {
            let line = format!(
                "waiting for approval: {} asks to run: {} — answer: subagents approve {} allow|always|reject --home {} (always would cover {})",
                parked.request.asker_line(),
                parked.request.call_line(),
                parked.id,
                home.display(),
                parked.request.always_covers()
            );
            bar.suspend(|| terminal::say!("{line}"));
        };
        let approver = batch::ParkedApprover::new(rules, &setup.home).on_parked(std::sync::Arc::new(said));
        setup.subagents.set_approver(std::sync::Arc::new(approver));
    }
    batch = match &args.out {
        Some(out) => batch.out(out),
        None => batch.results_to("stdout", above_the_bar(progress.clone())),
    };
    let opened = batch.open(&args.tasks, cancel.clone()).map_err(|e| e.to_string())?;
    let trace_file =
        args.trace.as_deref().map(|trace| outputs::create_trace(trace, args.out.as_deref())).transpose()?;
    // The trace is the runtime's own spans: nothing else to record.
    let trace = logging::install(logging::warnings(), trace_file);
    cancel_on_ctrl_c(&setup.runtime, cancel.clone(), Shown::Bar(progress.clone()));
    flush_on_sigterm(&setup.runtime);
    let quiet = (!progress.is_hidden()).then(terminal::QuietControlKeys::hold);
    let per_provider = crate::live::per_provider(&setup.subagents, &progress);
    let plain = progress.is_hidden().then(Coalesced::stderr);
    let terminal =
        Terminal { progress: progress.clone(), plain, tasks: args.tasks.clone(), failed: AtomicUsize::new(0) };
    let ui = args.ui.then(|| crate::commands::ui::serve_batch(&setup.home, config.routes().cloned())).transpose()?;
    let summary = match &ui {
        Some((board, _server)) => {
            board.expect(count_lines(&args.tasks).unwrap_or(0));
            board.steps(&args.tasks);
            let _events = board.watch(&setup.subagents);
            let summary = setup.runtime.block_on(opened.run(Both(terminal, board.clone())));
            board.finish();
            summary
        }
        None => setup.runtime.block_on(opened.run(terminal)),
    };
    let summary = summary.with_routes(config.routes().map(|route| (route.name.clone(), route.limiter().stats())));
    drop(ui);
    drop(per_provider);
    progress.finish_and_clear();
    drop(quiet);
    // Runs have started: a failure from here on is reported and makes the
    // batch incomplete (exit 1), never a usage error.
    // A run's stop reason is data (its result line, the summary); only
    // `--strict` makes a run that did not complete fail the batch.
    let lost = summary.lost().is_some();
    let mut all_done = summary.all_ran() && (!args.strict || summary.all_completed()) && !lost;
    let _ = summary.write_to(&mut std::io::stderr().lock());
    if summary.was_interrupted() {
        // What the interruption stopped, from the runs' receipts.
        let unknown = match summary.unknown_branches() {
            0 => String::new(),
            n => format!(" ({n} branches of the tree could not be known)"),
        };
        say!(
            "subagents: interrupted: {} runs stopped; {} descendants stopped under them{unknown}",
            summary.interrupted_runs(),
            summary.stopped_descendants()
        );
    }
    if summary.was_interrupted() || lost {
        match summary.resumable() {
            true => say!("subagents: to finish the batch: {}", resume_command()),
            false => {
                let went = args.out.as_deref().map_or("stdout".into(), |out| out.display().to_string());
                say!("subagents: results went to {went}, which cannot be read back: run the batch with --out FILE to resume it");
            }
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
    Ok(Ended::new(summary.was_interrupted(), all_done))
}

/// The batch as a person at a terminal sees it: the bar moves and each
/// failure is named above it as it happens, or a plain line per run when
/// stderr is not a terminal; what goes wrong is said.
struct Terminal {
    progress: ProgressBar,
    /// Off a terminal, the plain lines, written together (dropped, and so
    /// written out, with the batch's run: before the summary).
    plain: Option<Coalesced>,
    tasks: PathBuf,
    failed: AtomicUsize,
}

impl Terminal {
    /// A line for a person: above the bar while it is drawn.
    fn say(&self, line: String) {
        match &self.plain {
            Some(plain) => _ = plain.line(&terminal::line(&line)),
            None => self.progress.println(terminal::line(&line)),
        }
    }
}

impl Report for Terminal {
    fn settled(&self, settled: &Settled<'_>) {
        let line = || {
            let label = settled.label.unwrap_or("task");
            let detail = settled.detail.map(|d| format!(": {d}")).unwrap_or_default();
            let took = terminal::human(settled.latency);
            format!("line {}: {label}: {}{detail} ({took})", settled.line, settled.outcome)
        };
        if self.plain.is_some() {
            self.say(line());
            return;
        }
        // Behind a progress bar only a failure has a line of its own.
        if settled.outcome != "completed" && settled.outcome != "interrupted" {
            let failures = self.failed.fetch_add(1, Ordering::Relaxed) + 1;
            self.progress.set_prefix(format!(" · {failures} failed"));
            self.say(line());
        }
        self.progress.inc(1);
    }

    fn skipped(&self, line: usize, why: &str) {
        self.say(format!("subagents: {}:{line}: skipped: {why}", self.tasks.display()));
        self.progress.inc(1);
    }

    fn done_before(&self) {
        self.progress.inc(1);
    }

    fn expanded(&self, _line: usize, runs: usize) {
        // The bar counted the line as one run.
        match runs {
            0 => self.progress.dec_length(1),
            runs => self.progress.inc_length(runs as u64 - 1),
        }
    }

    fn tasks_unreadable(&self, error: &std::io::Error) {
        self.say(format!("subagents: cannot read {}: {error}", self.tasks.display()));
    }

    fn retrying(&self, line: usize, attempt: u32, outcome: &str, wait: Duration) {
        let wait = terminal::human(wait);
        self.say(format!("subagents: line {line}: attempt {attempt} failed ({outcome}); again in {wait}"));
    }

    fn results_lost(&self, why: &str) {
        self.say(format!("subagents: results lost: {why}. No new run starts and the runs in flight are stopped."));
    }
}

/// Stdout for result lines, gathered for a moment and written together
/// (see [`coalesced`]), each time with the bar lifted, so a line never
/// interleaves with the bar on a terminal nor leaves a stale bar in the
/// scrollback.
fn above_the_bar(bar: ProgressBar) -> Coalesced {
    Coalesced::new(move |bytes| {
        use std::io::Write;
        match bar.is_hidden() {
            true => std::io::stdout().lock().write_all(bytes),
            false => bar.suspend(|| std::io::stdout().lock().write_all(bytes)),
        }
    })
}

/// SIGTERM ends the process at once as it always did (exit 143, as a
/// shell reports a death by SIGTERM), once the result and progress lines
/// gathered for writing are written.
fn flush_on_sigterm(runtime: &subagents::Runtime) {
    use tokio::signal::unix::{signal, SignalKind};
    drop(runtime.spawn(async {
        let Ok(mut terminations) = signal(SignalKind::terminate()) else { return };
        if terminations.recv().await.is_some() {
            coalesced::flush_all();
            std::process::exit(143);
        }
    }));
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

/// A bar on a terminal, sized by the file's line count when the file can
/// be read twice; hidden otherwise (plain lines are printed instead).
fn progress_bar(tasks: &Path) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(count_lines(tasks), ProgressDrawTarget::stderr());
    let template = "{bar:40} {pos}/{len} tasks done{prefix} · {rate} · {elapsed} elapsed · ETA {eta}{msg}";
    if let Ok(style) = ProgressStyle::with_template(template) {
        let rate = |state: &indicatif::ProgressState, out: &mut dyn std::fmt::Write| {
            let _ = write!(out, "{:.1}/s", state.per_sec());
        };
        bar.set_style(style.with_key("rate", rate));
    }
    bar
}
