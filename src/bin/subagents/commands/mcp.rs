//! `subagents mcp`: the runtime's delegation as MCP tools on stdio, for an
//! MCP client (see `subagents::serve::serve_mcp`).

use std::process::ExitCode;

use subagents::serve::ServeError;
use subagents::serve::{serve_mcp, McpServeOptions};

use crate::args::{Sources, TelemetryArgs};
use crate::commands::fanout::MAX_CONCURRENCY;

/// `subagents mcp`'s flags.
#[derive(clap::Args, Debug)]
#[command(mut_arg("model", |model| model.help(CHILDREN_MODEL)))]
pub struct McpArgs {
    /// Provider the client's calls start children on: with a configuration
    /// file, one it defines (default: the first its `[tool]` offers);
    /// without one, spawn (default), fork or process.
    #[arg(long)]
    provider: Option<String>,
    /// How deep children may delegate (spawn and fork; default 3).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(subagents::seam::MAX_DEPTH_CAP)))]
    max_depth: Option<u32>,
    /// Most runs of the client's calls at once, 1 to 100000 (default 4 × cores); the rest queue.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=MAX_CONCURRENCY))]
    concurrency: Option<u32>,
    /// Most unfinished background tasks per session, 1 to 100000 (default 1000); past it a start is a tool error.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    max_background_tasks: Option<u32>,
    #[command(flatten)]
    sources: Sources,
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
}

/// `--model` said of the children a client's calls start.
const CHILDREN_MODEL: &str = "The children's model: `scripted` (no key, no network), `openai:NAME`, \
`openai-responses:NAME`, `anthropic:NAME`, or a route the configuration defines (`[models.NAME]`)";

impl McpArgs {
    /// Exit 0 at the client's EOF (or a stop signal); a refusal before
    /// serving is exit 2.
    pub fn run(self) -> Result<ExitCode, String> {
        let McpArgs {
            provider,
            sources: Sources { config, model, home },
            max_depth,
            concurrency,
            max_background_tasks,
            ..
        } = self;
        let mut options = McpServeOptions {
            model: model.model,
            home: Some(home.resolve()),
            max_depth,
            concurrency: concurrency.map(|n| n as usize),
            max_background_tasks: max_background_tasks.map(|n| n as usize),
            ..Default::default()
        };
        // With a file its providers serve; without one, the built-in choice.
        match config.located() {
            true => options.configured = Some(config.configured(provider.as_deref())?),
            false => {
                let provider = provider.as_deref().unwrap_or("spawn");
                options.provider = provider.parse().map_err(|e: ServeError| e.to_string())?;
            }
        }
        serve_mcp(options).map(|()| ExitCode::SUCCESS).map_err(|e| e.to_string())
    }
}
