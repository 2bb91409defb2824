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
//!   an MCP client (see `subagents::serve::mcp`).
//! - `subagents a2a --listen ADDR`: the runtime as an Agent2Agent server
//!   (see `subagents::serve::a2a`); the `a2a` provider is its client.
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
//! for a person goes through [`terminal`], which strips control characters,
//! and the library's warnings are logged to stderr ([`logging`], `RUST_LOG`).

mod a2a;
mod fanout;
mod journal;
mod logging;
mod outputs;
mod providers;
mod run;
mod sessions;
mod setup;
mod summary;
mod tasks;
mod terminal;
mod timeline;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "subagents", version, about = "Delegate work to supervised child agents")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Export the runs' spans (OpenTelemetry GenAI conventions) to this
    /// OTLP/HTTP collector, e.g. `http://127.0.0.1:4318` (default: the
    /// OTEL_EXPORTER_OTLP_ENDPOINT variable, else no export).
    #[arg(long, global = true, value_name = "URL")]
    otlp: Option<String>,
}

#[derive(Subcommand)]
enum Command {
    /// Run one prompt on a parent agent that can delegate to subagents.
    Run {
        /// The task.
        prompt: String,
        /// The one provider the parent's subagent tool delegates to
        /// (default: what the configuration's `[tool]` offers; built in: `spawn`).
        #[arg(long)]
        provider: Option<String>,
        #[command(flatten)]
        config: setup::ConfigArgs,
        /// `scripted` (no key, no network), `openai:NAME`, `openai-responses:NAME`, `anthropic:NAME`,
        /// or a route the configuration defines (`[models.NAME]`).
        #[arg(long, default_value = "scripted")]
        model: String,
        /// Where sessions are kept (default `$SUBAGENTS_HOME`, else `.subagents`).
        #[arg(long)]
        home: Option<PathBuf>,
        #[command(flatten)]
        remote: setup::RemoteArgs,
    },
    /// Serve this crate's agent over the Agent Client Protocol on stdio.
    Acp {
        /// Where sessions are kept.
        #[arg(long, default_value = ".subagents")]
        home: PathBuf,
        /// `scripted` (no key, no network), `openai:NAME`, `openai-responses:NAME` or `anthropic:NAME`.
        #[arg(long, default_value = "scripted")]
        model: String,
        /// A tool that asks the client for permission before each call (repeatable).
        #[arg(long)]
        approve: Vec<String>,
        /// The one provider the sessions' subagent tool offers: with a
        /// configuration file, one it defines (default: what its `[tool]`
        /// offers); without one, spawn.
        #[arg(long)]
        provider: Option<String>,
        #[command(flatten)]
        config: setup::ConfigArgs,
    },
    /// Serve this runtime's delegation as MCP tools on stdio (for an MCP client).
    Mcp {
        /// Provider the client's calls start children on: with a configuration
        /// file, one it defines (default: the first its `[tool]` offers);
        /// without one, spawn (default), fork or process.
        #[arg(long)]
        provider: Option<String>,
        #[command(flatten)]
        config: setup::ConfigArgs,
        /// The children's model: `scripted` (no key, no network), `openai:NAME`, `openai-responses:NAME`,
        /// `anthropic:NAME`, or a route the configuration defines (`[models.NAME]`).
        #[arg(long, default_value = "scripted")]
        model: String,
        /// Where sessions are kept (default `$SUBAGENTS_HOME`, else `.subagents`).
        #[arg(long)]
        home: Option<PathBuf>,
        /// How deep children may delegate (spawn and fork; default 3).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(subagents::MAX_DEPTH_CAP)))]
        max_depth: Option<u32>,
        /// Most runs of the client's calls at once, 1 to 100000 (default 4 × cores); the rest queue.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=fanout::MAX_CONCURRENCY))]
        concurrency: Option<u32>,
        /// Most unfinished background tasks per session, 1 to 100000 (default 1000); past it a start is a tool error.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        max_background_tasks: Option<u32>,
    },
    /// Serve one session of a full runtime over stdio (the `process` provider's child).
    Serve {
        /// The child's home directory.
        #[arg(long)]
        home: PathBuf,
    },
    /// Read stored sessions: list them, show one, or the delegation tree under one.
    Sessions {
        #[command(subcommand)]
        query: SessionsQuery,
        /// Where sessions are kept (default `$SUBAGENTS_HOME`, else `.subagents`).
        #[arg(long, global = true)]
        home: Option<PathBuf>,
        /// Print one JSON document instead of text.
        #[arg(long, global = true)]
        json: bool,
        /// Longest session line read, in bytes (default 256 MiB); a file with a
        /// longer one is reported unreadable.
        #[arg(long, global = true, value_parser = clap::value_parser!(u64).range(1..))]
        max_line_bytes: Option<u64>,
    },
    /// Run every task line of a JSONL file as a subagent, in parallel.
    Fanout {
        /// JSON lines: {"prompt": "...", "id"?, "label"?, "persona"?, "output_schema"?, "max_depth"?, "budget"?, "provider"?, "timeout"?}.
        tasks: PathBuf,
        /// Most runs in flight at once, 1 to 100000 (default 4 × cores).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=fanout::MAX_CONCURRENCY))]
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
        config: setup::ConfigArgs,
        /// `scripted` (no key, no network), `openai:NAME`, `openai-responses:NAME`, `anthropic:NAME`,
        /// or a route the configuration defines (`[models.NAME]`).
        #[arg(long, default_value = "scripted")]
        model: String,
        /// Write a Chrome trace-event JSON of every run's lifecycle here.
        #[arg(long)]
        trace: Option<PathBuf>,
        /// Where sessions are kept (default `$SUBAGENTS_HOME`, else `.subagents`).
        #[arg(long)]
        home: Option<PathBuf>,
        /// Exit 1 when any run did not complete (default: only when a task
        /// line could not be run or results could not be written).
        #[arg(long)]
        strict: bool,
        #[command(flatten)]
        remote: setup::RemoteArgs,
        #[command(flatten)]
        budget: fanout::BudgetArgs,
        #[command(flatten)]
        durable: fanout::DurableArgs,
    },
    /// Run the `remote` provider's runs for a pool, pulled from NATS JetStream.
    Worker(worker::WorkerArgs),
    /// The providers the configuration defines.
    Providers(providers::ProvidersArgs),
    /// Serve this runtime as an Agent2Agent (A2A 1.0) server over HTTP.
    A2a(a2a::A2aArgs),
}

#[derive(Subcommand)]
enum SessionsQuery {
    /// Every session: id, parent, depth, created, last stop reason, size.
    List,
    /// One session's transcript.
    Show {
        /// The session id.
        id: String,
    },
    /// The delegation tree under a session.
    Tree {
        /// The session id.
        id: String,
    },
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

    fn exit_code(self) -> ExitCode {
        match self {
            Ended::Completed => ExitCode::SUCCESS,
            Ended::Incomplete => ExitCode::from(1),
            Ended::Interrupted => ExitCode::from(130),
        }
    }
}

/// `subagents mcp`'s flags.
struct McpArgs {
    provider: Option<String>,
    config: setup::ConfigArgs,
    model: String,
    home: Option<PathBuf>,
    max_depth: Option<u32>,
    concurrency: Option<u32>,
    max_background_tasks: Option<u32>,
}

/// `subagents mcp`: exit 0 at the client's EOF (or a stop signal); a
/// refusal before serving is exit 2.
fn mcp(args: McpArgs) -> Result<ExitCode, String> {
    use subagents::config::Config;
    use subagents::serve::mcp::{serve_mcp, McpServeOptions};
    let McpArgs { provider, config, model, home, max_depth, concurrency, max_background_tasks } = args;
    let (concurrency, max_background_tasks) =
        (concurrency.map(|n| n as usize), max_background_tasks.map(|n| n as usize));
    let mut options =
        McpServeOptions { model, home, max_depth, concurrency, max_background_tasks, ..Default::default() };
    // With a file its providers serve; without one, the built-in choice.
    match Config::locate(config.config.as_deref()) {
        Some(_) => {
            let configured = subagents::config::Configured::new(config.load()?, provider.as_deref())?;
            options.configured = Some(configured);
        }
        None => {
            let provider = provider.as_deref().unwrap_or("spawn");
            options.provider = provider.parse().map_err(|e: subagents::serve::ServeError| e.to_string())?;
        }
    }
    serve_mcp(options).map(|()| ExitCode::SUCCESS).map_err(|e| e.to_string())
}

/// `subagents acp`: with a configuration file (`--config` or
/// `$SUBAGENTS_CONFIG`) its providers serve the sessions' subagent tools;
/// without one, a `spawn` provider.
fn acp(
    home: PathBuf,
    model: String,
    approve: Vec<String>,
    provider: Option<String>,
    config: setup::ConfigArgs,
) -> Result<ExitCode, String> {
    use subagents::config::{Config, Configured};
    use subagents::serve::acp::{serve_acp, AcpServeOptions};
    let mut options = AcpServeOptions { home, model, approve, ..Default::default() };
    // Never `./subagents.toml`: an ACP agent runs in its client's
    // directory, whose file may well define this very agent (each probe
    // would start another).
    let named =
        config.config.is_some() || std::env::var_os(subagents::config::CONFIG_ENV).is_some_and(|p| !p.is_empty());
    match named.then(|| Config::locate(config.config.as_deref())).flatten() {
        Some(_) => options.configured = Some(Configured::new(config.load()?, provider.as_deref())?),
        None if provider.as_deref().is_none_or(|name| name == "spawn") => {}
        None => return Err("--provider names a provider of a configuration file; without one, acp offers spawn".into()),
    }
    serve_acp(options).map(|()| ExitCode::SUCCESS).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = cli.command;
    if let Err(message) = logging::export(cli.otlp.as_deref()) {
        terminal::say!("subagents: {message}");
        return ExitCode::from(2);
    }
    // `fanout` installs its log itself, once its trace file is open.
    match command {
        Command::Acp { .. } | Command::Mcp { .. } => drop(logging::install(logging::our_warnings(), None)),
        Command::Worker(_) | Command::A2a(_) => drop(logging::install(logging::our_lifecycle(), None)),
        Command::Fanout { .. } => {}
        _ => drop(logging::install(logging::warnings(), None)),
    }
    let outcome = match command {
        Command::Run { prompt, provider, config, model, home, remote } => config.load().and_then(|config| {
            run::run(run::RunArgs { prompt, provider, config, model, home, remote }).map(Ended::exit_code)
        }),
        Command::Acp { home, model, approve, provider, config } => acp(home, model, approve, provider, config),
        Command::Mcp { provider, config, model, home, max_depth, concurrency, max_background_tasks } => {
            mcp(McpArgs { provider, config, model, home, max_depth, concurrency, max_background_tasks })
        }
        Command::Serve { home } => {
            let options = subagents::serve::stdio::ServeOptions { home };
            subagents::serve::stdio::serve_stdio(options).map(|()| ExitCode::SUCCESS).map_err(|e| e.to_string())
        }
        Command::Sessions { query, home, json, max_line_bytes } => {
            let query = match query {
                SessionsQuery::List => sessions::Query::List,
                SessionsQuery::Show { id } => sessions::Query::Show(id),
                SessionsQuery::Tree { id } => sessions::Query::Tree(id),
            };
            let max_line_bytes = max_line_bytes.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
            sessions::sessions(sessions::SessionsArgs { query, home, json, max_line_bytes }).map(Ended::exit_code)
        }
        Command::Fanout {
            tasks,
            concurrency,
            max_line_bytes,
            out,
            provider,
            config,
            model,
            trace,
            home,
            strict,
            remote,
            budget,
            durable,
        } => config.load().and_then(|config| {
            let args = fanout::FanoutArgs {
                tasks,
                concurrency,
                max_line_bytes,
                out,
                provider,
                config,
                model,
                trace,
                home,
                strict,
                remote,
                budget,
                durable,
            };
            fanout::fanout(args).map(Ended::exit_code)
        }),
        Command::Worker(args) => worker::worker(args),
        Command::Providers(args) => providers::providers(args),
        Command::A2a(args) => a2a::a2a(args),
    };
    logging::finish_export();
    outcome.unwrap_or_else(|message| {
        terminal::say!("subagents: {message}");
        ExitCode::from(2)
    })
}
