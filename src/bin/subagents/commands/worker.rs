//! `subagents worker --nats URL`: a full runtime that runs the `remote`
//! provider's runs for one pool (see `subagents::serve::serve_worker`).
//!
//! It prints one line on stderr when it is pulling, logs its lifecycle, and
//! exits 0 after SIGTERM, Ctrl-C or SIGHUP once drained; 2 when it cannot start
//! (bad flags, an unreachable server, an unusable home).

use std::process::ExitCode;
use std::time::Duration;

use subagents::providers::BrokerSettings;
use subagents::serve::{serve_worker, WorkerOptions, WorkerProvider};

use crate::args::{nats_url_from_env, ConfigArgs, HomeArgs, TelemetryArgs};
use crate::terminal::say;

/// `subagents worker`'s flags.
#[derive(clap::Args, Debug)]
pub struct WorkerArgs {
    /// NATS server (default `$SUBAGENTS_NATS_URL`).
    #[arg(long, value_name = "URL")]
    nats: Option<String>,
    /// The pool whose runs this worker takes.
    #[arg(long, value_name = "NAME", default_value = "default")]
    pool: String,
    /// Most runs held at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=4096))]
    concurrency: u32,
    #[command(flatten)]
    home: HomeArgs,
    /// `scripted` (no key, no network), `openai:NAME`, `openai-responses:NAME` or `anthropic:NAME`.
    // Not `ModelArgs`: the worker's model is never a configured route.
    #[arg(long, default_value = "scripted")]
    model: String,
    /// Where the runs run: with a configuration file, a provider it defines
    /// (default: the first its `[tool]` offers); without one, `spawn`
    /// (in-process children, the default) or `process` (each run in its
    /// own process).
    #[arg(long)]
    provider: Option<String>,
    #[command(flatten)]
    config: ConfigArgs,
    /// Redelivery deadline of an unacked run, in ms (used if this worker creates the pool's consumer; default 30000).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(100..))]
    ack_wait_ms: Option<u64>,
    /// Deliveries before a run settles `worker-lost` (used if this worker creates the pool's consumer; default 5).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    max_deliver: Option<u32>,
    /// Caller lease TTL in ms (used if this worker creates the callers bucket; default 30000).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(100..))]
    lease_ttl_ms: Option<u64>,
    /// How long live runs may finish after SIGTERM before they are handed back, in ms.
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    drain_grace_ms: u64,
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
}

impl WorkerArgs {
    pub fn run(self) -> Result<ExitCode, String> {
        let url = self.nats.or_else(nats_url_from_env).ok_or("worker needs --nats URL (or SUBAGENTS_NATS_URL)")?;
        let home = self.home.resolve();
        let home = std::path::absolute(&home).map_err(|e| format!("unusable home {}: {e}", home.display()))?;
        let mut broker = BrokerSettings::default();
        if let Some(ms) = self.ack_wait_ms {
            broker.ack_wait = Duration::from_millis(ms);
        }
        if let Some(max_deliver) = self.max_deliver {
            broker.max_deliver = max_deliver;
        }
        if let Some(ms) = self.lease_ttl_ms {
            broker.lease_ttl = Duration::from_millis(ms);
        }
        let mut options = WorkerOptions::new(url.clone(), home);
        options.pool = self.pool;
        options.concurrency = self.concurrency as usize;
        options.model = self.model;
        match self.config.located() {
            true => options.configured = Some(self.config.configured(self.provider.as_deref())?),
            false => {
                options.provider = match self.provider.as_deref() {
                    None | Some("spawn") => WorkerProvider::Spawn,
                    Some("process") => WorkerProvider::Process,
                    Some(other) => {
                        return Err(format!(
                            "unknown provider {other:?}: without a configuration file, spawn or process"
                        ))
                    }
                }
            }
        }
        options.broker = broker;
        options.drain_grace = Duration::from_millis(self.drain_grace_ms);
        let pool = options.pool.clone();
        let report = serve_worker(options, |worker| say!("subagents worker {worker}: ready on pool {pool} at {url}"))
            .map_err(|error| error.to_string())?;
        say!(
            "subagents worker {}: drained ({} results written, {} handed back, {} fenced out)",
            report.worker,
            report.settled,
            report.handed_back,
            report.fenced
        );
        Ok(ExitCode::SUCCESS)
    }
}
