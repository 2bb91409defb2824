//! The `subagents` command line.
//!
//! - `subagents run "PROMPT"`: a parent agent whose subagent tool is bound to
//!   `--provider` (default `spawn`); prints the answer and the tree of runs
//!   it delegated.
//! - `subagents fanout TASKS.jsonl`: every task line becomes a subagent run,
//!   with bounded concurrency, a progress bar on a terminal, JSON result
//!   lines, a summary, and optionally a Chrome trace of every run.
//! - `subagents worker --nats URL`: runs the `remote` provider's runs for a
//!   pool, pulled from a NATS JetStream broker ([`worker`]); `run` and
//!   `fanout` reach such workers with `--provider remote --nats URL`.
//! - `subagents mcp`: the runtime's delegation as MCP tools on stdio, for
//!   an MCP client (see `subagents::serve::serve_mcp`).
//! - `subagents a2a --listen ADDR`: the runtime as an Agent2Agent server
//!   (see `subagents::serve::serve_a2a`); the `a2a` provider is its client.
//! - `subagents ui`: a web view of a home's runs (and `fanout --ui`).
//! - `subagents providers list`: the providers a configuration defines.
//!
//! `run` and `fanout` take their providers from a configuration file
//! (`--config`, `$SUBAGENTS_CONFIG`, `./subagents.toml`; see
//! `subagents::config`); without one they have `spawn`, `fork` and `mock`.
//!
//! `--model scripted` (the default) needs no key and no network;
//! `--model openai:NAME` talks to an OpenAI-compatible endpoint configured by
//! `SUBAGENTS_BASE_URL` and `SUBAGENTS_API_KEY`, `--model
//! openai-responses:NAME` to OpenAI's Responses API on the same variables,
//! `--model anthropic:NAME` to Anthropic's Messages API (`ANTHROPIC_BASE_URL`,
//! `ANTHROPIC_API_KEY`); each is held to the bounds and rate limits the
//! `SUBAGENTS_MODEL_*` variables set (see `OpenAiConfig`). `run`, `fanout`
//! and `mcp` also take the name of a configured model route
//! (`[models.NAME]`).
//!
//! # Exit codes
//!
//! `run` and `fanout` answer the same question, "was the work carried
//! out?", the same way ([`Ended`]). For `run` the work is its one task, so
//! a parent that did not complete is exit 1. For `fanout` the work is the
//! batch: every task line run and its result line written; each run's
//! stop reason is data (its result line, the summary), and `--strict` makes
//! a run that did not complete fail the batch too.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | the work was carried out: `run`'s parent completed; every `fanout` task ran and its result was written (with `--strict`: and completed) |
//! | 1 | some work was not carried out: `run`'s parent stopped otherwise (error, refusal, max-tokens); a `fanout` task line was skipped or the tasks file could not be read to its end, or results, the trace or shutdown failed after runs began (with `--strict`: or a run did not complete) |
//! | 2 | usage or bad input found before any run started: a flag out of range, a missing tasks file, an unknown provider or model, an unreachable endpoint or NATS server, a home that is not a writable directory, `--out`/`--trace` naming one file or the tasks file or not creatable; one line on stderr |
//! | 130 | interrupted: the first Ctrl-C cancels every run, waits for quiescence, keeps what finished (result lines, sessions) and exits 130; a second Ctrl-C exits 130 at once |
//!
//! # Output
//!
//! JSON result lines go to stdout (or `--out`) as written. Everything meant
//! for a person goes through [`terminal`], which strips escape sequences,
//! control and bidi characters, and the library's warnings are logged to
//! stderr ([`logging`], `RUST_LOG`).
//!
//! # Layout
//!
//! Each subcommand is a `clap::Args` struct in its own file under
//! [`commands`] that owns its `run`; the flags several commands share are
//! declared once in [`args`]; [`setup`] builds the runtime the working
//! commands share and shuts it down once. This file only dispatches.

#![forbid(unsafe_code)]

mod args;
mod asking;
mod coalesced;
mod commands;
mod live;
mod logging;
mod outputs;
mod setup;
mod tasks_file;
mod terminal;
mod timeline;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::commands::{a2a, acp, approve, fanout, mcp, merge, providers, run, serve, sessions, ui, worker};

#[derive(Parser)]
#[command(name = "subagents", version, about = "Delegate work to supervised child agents")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run every task line of a JSONL file as a subagent, in parallel.
    #[command(
        after_help = "Example (the scripted demo model: no key, no network):\n  subagents fanout examples/tasks.jsonl --out results.jsonl\n  subagents fanout examples/tasks.jsonl --out results.jsonl --resume   # after a Ctrl-C"
    )]
    Fanout(fanout::FanoutArgs),
    /// Merge the branches a batch's runs worked on back, with a conflict report.
    #[command(
        after_help = "Example (a batch run with workspace = \"worktree\"):\n  subagents merge results.jsonl --into main"
    )]
    Merge(merge::MergeArgs),
    /// Run one prompt on a parent agent that can delegate to subagents.
    #[command(after_help = "Example:\n  subagents run \"review src/ and delegate one subagent per module\"")]
    Run(run::RunArgs),
    /// Read stored sessions: list them, show one, or the delegation tree under one.
    #[command(after_help = "Example:\n  subagents sessions list --home .subagents")]
    Sessions(sessions::SessionsArgs),
    /// A web view of the runs: a batch live, delegation trees, transcripts.
    #[command(after_help = "Example:\n  subagents ui --home .subagents --out results.jsonl")]
    Ui(ui::UiArgs),
    /// Answer a child's permission request a `fanout` parked, or list those that wait.
    #[command(
        after_help = "Example:\n  subagents approve --home .subagents            # what waits\n  subagents approve 4121-1 allow --home .subagents"
    )]
    Approve(approve::ApproveArgs),
    /// The providers the configuration defines.
    Providers(providers::ProvidersArgs),
    /// Serve this runtime's delegation as MCP tools on stdio (for an MCP client).
    Mcp(mcp::McpArgs),
    /// Serve this crate's agent over the Agent Client Protocol on stdio.
    Acp(acp::AcpArgs),
    /// Serve this runtime as an Agent2Agent (A2A 1.0) server over HTTP.
    A2a(a2a::A2aArgs),
    /// Run the `remote` provider's runs for a pool, pulled from NATS JetStream.
    Worker(worker::WorkerArgs),
    /// Serve one session of a full runtime over stdio (the `process`
    /// provider's child; not for a person).
    #[command(hide = true)]
    Serve(serve::ServeArgs),
}

impl Command {
    /// `--otlp` of the commands that run agents.
    fn otlp(&self) -> Option<&str> {
        let telemetry = match self {
            Command::Run(args) => &args.telemetry,
            Command::Fanout(args) => &args.telemetry,
            Command::Mcp(args) => &args.telemetry,
            Command::Acp(args) => &args.telemetry,
            Command::A2a(args) => &args.telemetry,
            Command::Worker(args) => &args.telemetry,
            Command::Sessions(_)
            | Command::Providers(_)
            | Command::Serve(_)
            | Command::Ui(_)
            | Command::Approve(_)
            | Command::Merge(_) => return None,
        };
        telemetry.otlp.as_deref()
    }

    /// What the command logs to stderr; `fanout` installs its log itself,
    /// once its trace file is open.
    fn install_log(&self) {
        match self {
            Command::Worker(_) | Command::A2a(_) => drop(logging::install(logging::our_lifecycle(), None)),
            Command::Fanout(_) => {}
            _ => drop(logging::install(logging::warnings(), None)),
        }
    }

    fn run(self) -> Result<ExitCode, String> {
        match self {
            Command::Run(args) => args.run(),
            Command::Acp(args) => args.run(),
            Command::Mcp(args) => args.run(),
            Command::Serve(args) => args.run(),
            Command::Sessions(args) => args.run(),
            Command::Fanout(args) => args.run(),
            Command::Worker(args) => args.run(),
            Command::Providers(args) => args.run(),
            Command::Ui(args) => args.run(),
            Command::Merge(args) => args.run(),
            Command::A2a(args) => args.run(),
            Command::Approve(args) => args.run(),
        }
    }
}

/// How a command that started work ended. A refusal before any work is an
/// `Err(message)` instead: exit 2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Every run completed.
    Completed,
    /// Some work did not complete.
    Incomplete,
    /// Ctrl-C cancelled the work.
    Interrupted,
}

impl Ended {
    /// Interrupted wins; else whether all the work was carried out.
    pub fn new(interrupted: bool, all_done: bool) -> Ended {
        match (interrupted, all_done) {
            (true, _) => Ended::Interrupted,
            (false, true) => Ended::Completed,
            (false, false) => Ended::Incomplete,
        }
    }
}

impl From<Ended> for ExitCode {
    fn from(ended: Ended) -> ExitCode {
        match ended {
            Ended::Completed => ExitCode::SUCCESS,
            Ended::Incomplete => ExitCode::from(1),
            Ended::Interrupted => ExitCode::from(130),
        }
    }
}

/// A refusal before any work: one line on stderr, exit 2.
fn refused(message: &str) -> ExitCode {
    terminal::say!("subagents: {message}");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let Cli { command } = Cli::parse();
    if let Err(message) = logging::export(command.otlp()) {
        return refused(&message);
    }
    command.install_log();
    // Every child of this program comes from its runtime, so whatever a
    // child leaves behind is the runtime's to collect and, at the end, to
    // stop (a dispose leaves nothing, not even a double fork's orphan).
    let _orphans = subagents::providers::adopt_orphans()
        .inspect_err(|error| tracing::warn!(%error, "cannot adopt the orphans of child processes"))
        .ok();
    let outcome = command.run();
    // Every command's runtime is down by now; what is left is the export.
    logging::finish_export();
    outcome.unwrap_or_else(|message| refused(&message))
}
