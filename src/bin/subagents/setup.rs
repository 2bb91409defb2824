//! What every command shares: the runtime, the model, the providers.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use std::collections::HashMap;

use subagents::agent::{ListDir, Model, ReadFile, Tool, Toolset};
use subagents::config::{BuildContext, Config};
use subagents::providers::{RemoteConfig, RemoteProvider};
use subagents::serve::preflight;
use subagents::tool::{delegating_kit, TaskService};
use subagents::{Runtime, Subagents};

use crate::terminal::say;

pub struct Setup {
    pub runtime: Runtime,
    pub subagents: Subagents,
    pub model: Arc<dyn Model>,
    pub tasks: TaskService,
    pub cwd: PathBuf,
    pub home: PathBuf,
}

/// A route of the configuration, `scripted` (the embedded default) or an
/// HTTP model (`openai:NAME`, `openai-responses:NAME`, `anthropic:NAME`);
/// an HTTP model's endpoint is probed on the runtime, so a batch fails
/// before any run when it cannot be reached at all.
fn model(spec: &str, config: &Config, runtime: &Runtime) -> Result<Arc<dyn Model>, String> {
    let spec = config.model_spec(spec)?;
    runtime.block_on(async move { preflight::reachable_model(&spec).await }).map_err(|e| e.to_string())
}

/// `--nats` and `--pool` of `run` and `fanout`: where `--provider remote`
/// sends its runs.
#[derive(clap::Args, Clone, Debug, Default)]
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

impl RemoteArgs {
    /// The NATS URL: `--nats`, else `$SUBAGENTS_NATS_URL`.
    pub fn url(&self) -> Option<String> {
        self.nats.clone().or_else(|| std::env::var("SUBAGENTS_NATS_URL").ok().filter(|url| !url.is_empty()))
    }
}

/// The `remote` provider from `--nats`/`--pool`, connected, when `provider`
/// is `remote` and the configuration defines no provider of that name:
/// before the runtime exists, so an unreachable server is a usage error
/// (exit 2) with nothing to stop.
fn remote(provider: &str, args: &RemoteArgs, config: &Config) -> Result<Option<RemoteProvider>, String> {
    if provider != "remote" || config.provider("remote").is_some() {
        return Ok(None);
    }
    let url = args.url().ok_or("--provider remote needs --nats URL (or SUBAGENTS_NATS_URL)")?;
    let mut config = RemoteConfig::new("remote", url).with_pool(args.pool.clone());
    config.broker_patience = args.broker_patience;
    config.worker_patience = args.worker_patience;
    config.detached_ttl = args.detached_ttl;
    RemoteProvider::connect(config).map(Some).map_err(|e| e.to_string())
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
}

pub fn setup(
    model_spec: &str,
    home: Option<PathBuf>,
    provider: &str,
    remote_args: &RemoteArgs,
    config: &Config,
) -> Result<Setup, String> {
    let remote = remote(provider, remote_args, config)?;
    let cwd = std::env::current_dir().map_err(|e| format!("no working directory: {e}"))?;
    // Default: `$SUBAGENTS_HOME`, else `.subagents` in the working directory.
    let mut builder = Runtime::builder().cancel_grace(Duration::from_millis(500));
    if let Some(home) = home {
        builder = builder.home(home);
    }
    let runtime = builder.build().map_err(|e| format!("cannot start the runtime: {e}"))?;
    let home = runtime.home();
    let subagents = runtime.subagents();
    let tasks = TaskService::new();
    let registered = models(model_spec, config, &runtime).and_then(|(model, models)| {
        check_home(&home)?;
        let source = |spec: Option<&str>| -> Result<Arc<dyn Model>, String> {
            Ok(models.get(&spec.map(str::to_owned)).cloned().unwrap_or_else(|| model.clone()))
        };
        let context = BuildContext { subagents: &subagents, tasks: &tasks, home: &home, models: &source, probe: false };
        // An acp provider probes its agent once (`initialize`) as it is built.
        let io = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the runtime: {e}"))?;
        io.block_on(config.register(&context))?.into_iter().for_each(|registration| registration.keep());
        if let Some(remote) = remote {
            subagents.register_provider(remote).map_err(|e| e.to_string())?.keep();
        }
        Ok(model)
    });
    match registered {
        Ok(model) => Ok(Setup { runtime, subagents, model, tasks, cwd, home }),
        Err(error) => {
            runtime.shutdown_blocking();
            Err(error)
        }
    }
}

/// The default model (`--model`) and every other model the configuration's
/// in-process providers name, each built and probed once: every provider
/// naming one model shares it, and so its limiter (a route's limiter is
/// shared however often it is built).
#[allow(clippy::type_complexity)]
pub fn models(
    default: &str,
    config: &Config,
    runtime: &Runtime,
) -> Result<(Arc<dyn Model>, HashMap<Option<String>, Arc<dyn Model>>), String> {
    let default_model = model(default, config, runtime)?;
    let mut models = HashMap::new();
    for spec in config.models() {
        let built = match &spec {
            Some(named) if named != default => model(named, config, runtime)?,
            _ => default_model.clone(),
        };
        models.insert(spec, built);
    }
    Ok((default_model, models))
}

impl Setup {
    /// `Err` naming the registered providers when `provider` is not one.
    pub fn check_provider(&self, provider: &str) -> Result<(), String> {
        if self.subagents.has_provider(provider) {
            return Ok(());
        }
        Err(format!("unknown provider {provider:?} (available: {})", self.subagents.list().join(", ")))
    }
}

/// Every run writes its session under the home: one that cannot take it
/// would otherwise fail each run on its own, late, as a bare
/// `STARTUP_FAILED`.
fn check_home(home: &Path) -> Result<(), String> {
    preflight::check_home(home).map_err(|e| e.to_string())
}

/// The parent's kit: built-in tools, a subagent tool per provider in
/// `offered` (the first named `subagent`), the task tools.
pub fn toolset(subagents: &Subagents, tasks: &TaskService, offered: &[String], max_depth: u32) -> Toolset {
    let builtins: Vec<Arc<dyn Tool>> = vec![Arc::new(ReadFile), Arc::new(ListDir)];
    let tools = delegating_kit(subagents, tasks, builtins, offered.to_vec(), max_depth)();
    if !tools.names().contains(&"subagent") {
        say!("subagents: no subagent tool: none of {offered:?} could be mounted");
    }
    tools
}

/// Trips `token` on the first Ctrl-C; a second one exits 130 at once. The
/// watch is a task on the runtime.
///
/// The handler is registered before this returns, so a Ctrl-C that lands
/// while the work is being set up cancels it rather than killing the
/// process mid-write.
pub fn cancel_on_ctrl_c(runtime: &Runtime, token: subagents::CancellationToken) {
    let (registered, ready) = std::sync::mpsc::sync_channel(1);
    drop(runtime.spawn(async move {
        let interrupts = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt());
        let _ = registered.send(interrupts.is_ok());
        let Ok(mut interrupts) = interrupts else { return };
        if interrupts.recv().await.is_none() {
            return;
        }
        eprintln!("\nsubagents: interrupted: cancelling every run (Ctrl-C again to quit at once)");
        token.cancel();
        if interrupts.recv().await.is_some() {
            std::process::exit(130);
        }
    }));
    if !ready.recv().unwrap_or(false) {
        say!("subagents: cannot watch for Ctrl-C; an interrupt ends the process at once");
    }
}
