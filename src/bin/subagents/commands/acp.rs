//! `subagents acp`: this crate's agent over the Agent Client Protocol on
//! stdio (see `subagents::serve::serve_acp`).

use std::process::ExitCode;

use subagents::serve::{serve_acp, AcpServeOptions, DEFAULT_MAX_SESSIONS};

use crate::args::{ConfigArgs, HomeArgs, TelemetryArgs};

/// `subagents acp`'s flags.
#[derive(clap::Args, Debug)]
pub struct AcpArgs {
    #[command(flatten)]
    home: HomeArgs,
    /// `scripted` (no key, no network), `openai:NAME`, `openai-responses:NAME` or `anthropic:NAME`.
    // Not `ModelArgs`: the sessions' model is never a configured route.
    #[arg(long, default_value = "scripted")]
    model: String,
    /// A tool that asks the client for permission before each call (repeatable).
    #[arg(long)]
    approve: Vec<String>,
    /// The most sessions held at once: past it a new session takes the
    /// place of the least recently used one that runs no turn.
    #[arg(long, value_name = "SESSIONS", default_value_t = DEFAULT_MAX_SESSIONS as u32, value_parser = clap::value_parser!(u32).range(1..))]
    max_sessions: u32,
    /// The one provider the sessions' subagent tool offers: with a
    /// configuration file, one it defines (default: what its `[tool]`
    /// offers); without one, spawn.
    #[arg(long)]
    provider: Option<String>,
    #[command(flatten)]
    config: ConfigArgs,
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
}

impl AcpArgs {
    /// With a configuration file (`--config` or `$SUBAGENTS_CONFIG`) its
    /// providers serve the sessions' subagent tools; without one, a `spawn`
    /// provider. Exit 0 at the client's EOF (or a stop signal).
    pub fn run(self) -> Result<ExitCode, String> {
        let AcpArgs { home, model, approve, max_sessions, provider, config, .. } = self;
        let mut options = AcpServeOptions {
            home: home.resolve(),
            model,
            approve,
            max_sessions: max_sessions as usize,
            ..Default::default()
        };
        // Never `./subagents.toml`: an ACP agent runs in its client's
        // directory, whose file may well define this very agent (each probe
        // would start another).
        match config.named() && config.located() {
            true => options.configured = Some(config.configured(provider.as_deref())?),
            false if provider.as_deref().is_none_or(|name| name == "spawn") => {}
            false => {
                return Err("--provider names a provider of a configuration file; without one, acp offers spawn".into())
            }
        }
        serve_acp(options).map(|()| ExitCode::SUCCESS).map_err(|e| e.to_string())
    }
}
