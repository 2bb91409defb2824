//! `subagents a2a --listen ADDR`: this runtime as an Agent2Agent server
//! (see `subagents::serve::serve_a2a`).
//!
//! It prints one line on stderr once it listens (`listening on ADDR`),
//! exits 0 after SIGINT, SIGTERM or SIGHUP once its streams are answered,
//! and 2 with one line when it cannot start: a non-loopback address
//! without a token, an unset token variable, an unusable configuration.

use std::net::SocketAddr;
use std::process::ExitCode;

use subagents::serve::{serve_a2a, A2aServeOptions};

use crate::args::{Sources, TelemetryArgs};
use crate::terminal::say;

/// `subagents a2a`'s flags.
#[derive(clap::Args, Debug)]
pub struct A2aArgs {
    /// Where to listen, e.g. `127.0.0.1:8080` (port 0 picks a free one).
    #[arg(long, value_name = "ADDR")]
    listen: SocketAddr,
    /// The environment variable that holds the bearer token every request
    /// must carry (required unless ADDR is a loopback address).
    #[arg(long, value_name = "NAME")]
    token_env: Option<String>,
    /// The one provider the card offers as a skill: with a configuration
    /// file, one it defines (default: what its `[tool]` offers); without
    /// one, spawn.
    #[arg(long)]
    provider: Option<String>,
    /// The URL the card gives for the JSON-RPC interface (default `http://ADDR/`).
    #[arg(long, value_name = "URL")]
    public_url: Option<String>,
    /// Put children's permission requests to clients even without a token.
    /// Without --token-env no client is authenticated and any local process
    /// could answer them, so by default such a door offers no approvals:
    /// the providers' policies decide (`ask` is a reject).
    #[arg(long)]
    approvals_without_auth: bool,
    /// Most tasks kept in memory, 1 to 1000000.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_tasks: u32,
    /// How long an ended task stays readable, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..))]
    task_ttl_secs: u64,
    /// Most MiB of messages and artifacts the kept tasks hold together
    /// (the oldest ended tasks leave first to make room).
    #[arg(long, value_name = "MIB", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    max_task_mib: u32,
    /// Most connections served at once; when all are taken, a new one
    /// closes the oldest that has not sent a whole request.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    max_connections: u32,
    /// How long a client may take to send a request's body, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    body_timeout_secs: u64,
    #[command(flatten)]
    sources: Sources,
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
}

impl A2aArgs {
    /// Exit 0 once a stop signal's streams are answered; a refusal before
    /// serving is exit 2.
    pub fn run(self) -> Result<ExitCode, String> {
        let mut options = A2aServeOptions::new(self.listen);
        if let Some(name) = &self.token_env {
            let token = std::env::var(name).ok().filter(|token| !token.trim().is_empty());
            options.token = Some(token.ok_or_else(|| format!("--token-env names {name}, which is not set"))?);
        }
        match self.sources.config.located() {
            true => options.configured = Some(self.sources.config.configured(self.provider.as_deref())?),
            false if self.provider.as_deref().is_none_or(|name| name == "spawn") => {}
            false => {
                return Err("--provider names a provider of a configuration file; without one, a2a offers spawn".into())
            }
        }
        options.model = self.sources.model.model;
        options.home = Some(self.sources.home.resolve());
        options.public_url = self.public_url;
        options.approvals_without_auth = self.approvals_without_auth;
        options.max_tasks = self.max_tasks as usize;
        options.task_ttl = std::time::Duration::from_secs(self.task_ttl_secs);
        options.max_task_bytes = (self.max_task_mib as usize) << 20;
        options.max_connections = self.max_connections as usize;
        options.body_timeout = std::time::Duration::from_secs(self.body_timeout_secs);
        serve_a2a(options, |bound| say!("subagents a2a: listening on {bound}"))
            .map(|()| ExitCode::SUCCESS)
            .map_err(|e| e.to_string())
    }
}
