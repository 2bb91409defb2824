//! The flag groups more than one command takes, each declared once and
//! flattened (`#[command(flatten)]`) into the commands that take it, so a
//! flag means one thing, with one default, wherever it appears.
//!
//! - [`HomeArgs`]: `--home`, where sessions are kept.
//! - [`ConfigArgs`]: `--config`, where the providers come from.
//! - [`ModelArgs`]: `--model`, the default model or a configured route.
//! - [`RemoteArgs`]: `--nats`, `--pool` and the patience of the `remote`
//!   provider that `run` and `fanout` build from flags.
//! - [`BudgetArgs`] and [`DurableArgs`]: what bounds a `fanout` batch and
//!   what makes a long one survive its crash.

use std::path::PathBuf;
use std::time::Duration;

use subagents::config::{Config, Configured};
use subagents::Budget;

/// The variable `--home` falls back to.
const HOME_ENV: &str = "SUBAGENTS_HOME";

/// `--home DIR`: where sessions are kept.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct HomeArgs {
    /// Where sessions are kept (default `$SUBAGENTS_HOME`, else `.subagents`).
    #[arg(long, global = true)]
    home: Option<PathBuf>,
}

impl HomeArgs {
    /// `--home`, else `$SUBAGENTS_HOME`, else `.subagents`: the binary
    /// always tells the runtime its home (a runtime told none keeps a
    /// private temporary one).
    pub fn resolve(&self) -> PathBuf {
        self.home
            .clone()
            .or_else(|| std::env::var_os(HOME_ENV).map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(".subagents"))
    }
}

/// `--config FILE`: where the providers come from.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ConfigArgs {
    /// The configuration file (default `$SUBAGENTS_CONFIG`, else
    /// `./subagents.toml` when present, else the built-in providers).
    #[arg(long, value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,
}

impl ConfigArgs {
    /// The configuration, read and checked before anything starts.
    pub fn load(&self) -> Result<Config, String> {
        Config::load(self.config.as_deref()).map_err(|e| e.to_string())
    }

    /// The file's providers for a served door: `provider` alone when
    /// given (the file must define it), else what `[tool]` offers.
    pub fn configured(&self, provider: Option<&str>) -> Result<Configured, String> {
        Configured::new(self.load()?, provider).map_err(|e| e.to_string())
    }

    /// Whether a file is in reach (`--config`, `$SUBAGENTS_CONFIG` or
    /// `./subagents.toml`): the served doors use the built-in providers
    /// without one.
    pub fn located(&self) -> bool {
        Config::locate(self.config.as_deref()).is_some()
    }

    /// Whether a file was named (`--config` or `$SUBAGENTS_CONFIG`), never
    /// only found in the working directory.
    pub fn named(&self) -> bool {
        self.config.is_some() || std::env::var_os(subagents::config::CONFIG_ENV).is_some_and(|path| !path.is_empty())
    }
}

/// `--config`, `--model` and `--home`: where the providers, the model and
/// the sessions of a command that runs agents come from.
#[derive(clap::Args, Clone, Debug)]
#[command(next_help_heading = "Providers, model and home")]
pub struct Sources {
    #[command(flatten)]
    pub config: ConfigArgs,
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub home: HomeArgs,
}

/// `--otlp URL` of the commands that run agents.
#[derive(clap::Args, Clone, Debug, Default)]
#[command(next_help_heading = "Telemetry")]
pub struct TelemetryArgs {
    /// Export the runs' spans (OpenTelemetry GenAI conventions) to this
    /// OTLP/HTTP collector, e.g. `http://127.0.0.1:4318` (default: the
    /// OTEL_EXPORTER_OTLP_ENDPOINT variable, else no export).
    #[arg(long, value_name = "URL")]
    pub otlp: Option<String>,
}

/// `--model SPEC` of the commands whose configuration may name routes.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// `scripted` (no key, no network), `openai:NAME`, `openai-responses:NAME`, `anthropic:NAME`,
    /// or a route the configuration defines (`[models.NAME]`).
    #[arg(long, default_value = "scripted")]
    pub model: String,
}

/// `--nats` and `--pool` of `run` and `fanout`: where `--provider remote`
/// sends its runs.
#[derive(clap::Args, Clone, Debug, Default)]
#[command(next_help_heading = "The remote provider (--provider remote)")]
pub struct RemoteArgs {
    /// NATS server of the `remote` provider (default `$SUBAGENTS_NATS_URL`).
    #[arg(long, value_name = "URL")]
    pub nats: Option<String>,
    /// Worker pool of the `remote` provider.
    #[arg(long, value_name = "NAME", default_value = "default")]
    pub pool: String,
    /// How long `remote` runs wait on a broker that answers nothing before
    /// they fail (`broker-unreachable`): `30s`, `2m`.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = subagents::config::parse_positive_duration)]
    pub broker_patience: Duration,
    /// How long `remote` runs wait while no worker of the pool answers
    /// before they fail (`no-worker`).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = subagents::config::parse_positive_duration)]
    pub worker_patience: Duration,
    /// How long a killed `fanout --out` batch's remote runs are kept going
    /// for a `--resume` to attach to them again (then they are stopped).
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = subagents::config::parse_positive_duration)]
    pub detached_ttl: Duration,
}

/// `$SUBAGENTS_NATS_URL`, when set and not empty.
pub fn nats_url_from_env() -> Option<String> {
    std::env::var("SUBAGENTS_NATS_URL").ok().filter(|url| !url.is_empty())
}

impl RemoteArgs {
    /// The NATS URL: `--nats`, else `$SUBAGENTS_NATS_URL`.
    pub fn url(&self) -> Option<String> {
        self.nats.clone().or_else(nats_url_from_env)
    }
}

/// `--budget-*`: one delegation budget for the whole batch. Every task run
/// is a child of the batch (width: task runs at once; depth: levels below
/// the batch), and the runs, tokens and time of every task's tree count
/// together. A task line's own `budget` binds its tree as well.
#[derive(Clone, Debug, Default, clap::Args)]
#[command(next_help_heading = "The batch's budget")]
pub struct BudgetArgs {
    /// Levels of delegation below the batch (1: the task runs only).
    #[arg(long, value_name = "LEVELS", value_parser = clap::value_parser!(u32).range(1..))]
    pub budget_depth: Option<u32>,
    /// Task runs at once, and children at once of any one agent in the batch;
    /// past it a start is refused (BUDGET_EXHAUSTED), not queued.
    #[arg(long, value_name = "RUNS", value_parser = clap::value_parser!(u32).range(1..))]
    pub budget_width: Option<u32>,
    /// Runs in the whole batch, task runs and their descendants.
    #[arg(long, value_name = "RUNS", value_parser = clap::value_parser!(u64).range(1..))]
    pub budget_runs: Option<u64>,
    /// Model tokens in the whole batch: input, output and cache tokens as
    /// the models report them (the figures of each line's `usage`).
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u64).range(1..))]
    pub budget_tokens: Option<u64>,
    /// Wall-clock time for the whole batch: `500ms`, `1.5s`, `10m` or `1h`.
    #[arg(long, value_name = "DURATION", value_parser = subagents::config::parse_positive_duration)]
    pub budget_deadline: Option<Duration>,
}

impl BudgetArgs {
    /// The batch's budget (unlimited when no flag is given).
    pub fn budget(&self) -> Budget {
        Budget {
            depth: self.budget_depth,
            width: self.budget_width,
            runs: self.budget_runs,
            tokens: self.budget_tokens,
            deadline: self.budget_deadline,
        }
    }
}

/// What makes a long batch survive its crash and its runs' transient
/// failures (see [`crate::journal`]).
#[derive(Clone, Debug, Default, clap::Args)]
#[command(next_help_heading = "Long batches: resume, retry, timeout")]
pub struct DurableArgs {
    /// With --out: skip the tasks the file already settled and run the rest
    /// (a task whose line changed since is refused, exit 2); a remote run
    /// still on the broker is attached to again, not started again.
    #[arg(long, requires = "out")]
    pub resume: bool,
    /// With --resume: run the settled tasks that did not complete again.
    #[arg(long, requires = "resume")]
    pub rerun_failed: bool,
    /// With --resume: run a task whose line changed since its result.
    #[arg(long, requires = "resume")]
    pub rerun_changed: bool,
    /// Run a task that ended in a transient error (a model's 429 or 5xx, a
    /// timeout, a lost transport or worker) again, up to N more times.
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
    pub retry: u32,
    /// Stop a run that takes longer (stop reason `aborted`, reason
    /// `timeout`): `30s`, `10m`; a task line's `"timeout"` wins.
    #[arg(long, value_name = "DURATION", value_parser = subagents::config::parse_positive_duration)]
    pub timeout: Option<Duration>,
}
