//! What every command shares: the runtime, the model, the providers.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use subagents::agent::{ListDir, Model, ModelSpec, ReadFile, Toolset};
use subagents::providers::{ChildInfo, InProcessProvider, MockProvider, RemoteConfig, RemoteProvider};
use subagents::serve::preflight;
use subagents::tool::{delegating_tools, shared_delegating_toolset, TaskService};
use subagents::{Runtime, Subagents};

use crate::terminal::say;

/// The delegation depth children may reach.
pub const MAX_DEPTH: u32 = 3;

pub struct Setup {
    pub runtime: Runtime,
    pub subagents: Subagents,
    pub model: Arc<dyn Model>,
    pub tasks: TaskService,
    pub cwd: PathBuf,
    pub home: PathBuf,
}

/// `scripted` (the embedded default) or `openai:NAME`; an OpenAI endpoint
/// is probed on the runtime, so a batch fails before any run when it
/// cannot be reached at all.
fn model(spec: &str, runtime: &Runtime) -> Result<Arc<dyn Model>, String> {
    let spec = ModelSpec::parse(spec).map_err(|e| e.to_string())?;
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
}

impl RemoteArgs {
    /// The NATS URL: `--nats`, else `$SUBAGENTS_NATS_URL`.
    pub fn url(&self) -> Option<String> {
        self.nats.clone().or_else(|| std::env::var("SUBAGENTS_NATS_URL").ok().filter(|url| !url.is_empty()))
    }
}

/// The `remote` provider, connected, when `provider` is `remote`: before
/// the runtime exists, so an unreachable server is a usage error (exit 2)
/// with nothing to stop.
fn remote(provider: &str, args: &RemoteArgs) -> Result<Option<RemoteProvider>, String> {
    if provider != "remote" {
        return Ok(None);
    }
    let url = args.url().ok_or("--provider remote needs --nats URL (or SUBAGENTS_NATS_URL)")?;
    let config = RemoteConfig::new("remote", url).with_pool(args.pool.clone());
    RemoteProvider::connect(config).map(Some).map_err(|e| e.to_string())
}

pub fn setup(
    model_spec: &str,
    home: Option<PathBuf>,
    provider: &str,
    remote_args: &RemoteArgs,
) -> Result<Setup, String> {
    let remote = remote(provider, remote_args)?;
    let cwd = std::env::current_dir().map_err(|e| format!("no working directory: {e}"))?;
    // Default: `$SUBAGENTS_HOME`, else `.subagents` in the working directory.
    let mut builder = Runtime::builder().cancel_grace(Duration::from_millis(500));
    if let Some(home) = home {
        builder = builder.home(home);
    }
    let runtime = builder.build().map_err(|e| format!("cannot start the runtime: {e}"))?;
    let home = runtime.home();
    let checked = model(model_spec, &runtime).and_then(|model| check_home(&home).map(|()| model));
    let model = match checked {
        Ok(model) => model,
        Err(error) => {
            runtime.shutdown_blocking();
            return Err(error);
        }
    };
    let subagents = runtime.subagents();
    let tasks = TaskService::new();
    let tools = child_tools(&subagents, &tasks);
    let register = |provider| subagents.register_provider(provider).map(|r| r.keep()).map_err(|e| e.to_string());
    register(InProcessProvider::spawn("spawn", model.clone()).with_tools(tools.clone()))?;
    register(InProcessProvider::fork("fork", model.clone()).with_tools(tools))?;
    let mock =
        MockProvider::new("mock").with_reply("handled: ").with_echo_prompt().with_delay(Duration::from_millis(20));
    subagents.register_provider(mock).map_err(|e| e.to_string())?.keep();
    if let Some(remote) = remote {
        subagents.register_provider(remote).map_err(|e| e.to_string())?.keep();
    }
    Ok(Setup { runtime, subagents, model, tasks, cwd, home })
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

/// Children get the built-in tools, a subagent tool on `spawn` (so they
/// can delegate further, to depth 3; not offered at the cap) and the task
/// tools: the same kit as `subagents acp` and `serve` children.
fn child_tools(subagents: &Subagents, tasks: &TaskService) -> subagents::providers::ToolFactory {
    let kit = shared_delegating_toolset(subagents, tasks, "spawn", MAX_DEPTH);
    Arc::new(move |_: &ChildInfo| kit())
}

/// Built-in tools, a subagent tool bound to `provider`, the task tools.
pub fn toolset(subagents: &Subagents, tasks: &TaskService, provider: &str) -> Toolset {
    let mut tools = Toolset::new();
    match delegating_tools(subagents, tasks, provider, MAX_DEPTH) {
        Ok(kit) => kit.into_iter().for_each(|tool| tools.add_shared(tool).expect("fresh tool set")),
        Err(error) => {
            say!("subagents: no subagent tool: {error}");
            tools.add(ReadFile).expect("fresh tool set");
            tools.add(ListDir).expect("fresh tool set");
        }
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
