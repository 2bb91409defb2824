//! What every command that runs work shares: the runtime, the model, the
//! providers, and the one way the runtime is shut down.
//!
//! [`setup`] builds the runtime first and hands it back inside a
//! [`CommandRuntime`], which shuts it down when dropped: a command that
//! refuses its work after the runtime exists (an unknown provider, a file
//! it cannot create) returns its error with `?` and the runtime still stops
//! once, with nothing left running. A command that wants the shutdown's
//! report (to say which runs outlived it) calls [`CommandRuntime::shutdown`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use subagents::agent::{ListDir, Model, ReadFile, Tool, Toolset};
use subagents::config::{BuildContext, Config};
use subagents::serve::{check_home, reachable_model};
use subagents::tool::{delegating_kit, TaskService};
use subagents::{Runtime, ShutdownReport, Subagents};

use crate::args::RemoteArgs;
use crate::terminal::say;

/// A command's runtime, shut down exactly once: by [`CommandRuntime::shutdown`],
/// else when dropped (every early return after the runtime exists).
pub struct CommandRuntime(Option<Runtime>);

impl CommandRuntime {
    /// Stops every run and waits for quiescence; the report says what
    /// outlived the shutdown.
    pub fn shutdown(mut self) -> ShutdownReport {
        self.0.take().expect("shut down once").shutdown_blocking()
    }
}

impl std::ops::Deref for CommandRuntime {
    type Target = Runtime;

    fn deref(&self) -> &Runtime {
        self.0.as_ref().expect("not yet shut down")
    }
}

impl Drop for CommandRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_blocking();
        }
    }
}

/// A command's runtime with its providers registered.
pub struct Setup {
    pub runtime: CommandRuntime,
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
    let spec = config.model_spec(spec).map_err(|e| e.to_string())?;
    runtime.block_on(async move { reachable_model(&spec).await }).map_err(|e| e.to_string())
}

/// The `remote` provider of `--nats`/`--pool`, when `provider` is `remote`
/// and the configuration defines no provider of that name: the flags'
/// values as a `[providers.remote]` table, checked, resolved and built by
/// the remote kind exactly as a file's would be.
fn remote(provider: &str, args: &RemoteArgs, config: &Config) -> Result<Option<Config>, String> {
    if provider != "remote" || config.provider("remote").is_some() {
        return Ok(None);
    }
    let url = args.url().ok_or("--provider remote needs --nats URL (or SUBAGENTS_NATS_URL)")?;
    // A JSON string is a TOML basic string: quotes, backslashes and
    // control characters escaped.
    let quoted = |text: &str| serde_json::Value::from(text).to_string();
    let millis = |duration: Duration| format!("\"{}ms\"", duration.as_millis());
    let table = format!(
        "[providers.remote]\nkind = \"remote\"\nnats = {}\npool = {}\nbroker_patience = {}\nworker_patience = {}\n\
         detached_ttl = {}\n",
        quoted(&url),
        quoted(&args.pool),
        millis(args.broker_patience),
        millis(args.worker_patience),
        millis(args.detached_ttl),
    );
    let flags = Config::parse(&table, "--nats and --pool").map_err(|e| e.to_string())?;
    flags.check_used(&["remote"]).map_err(|e| e.to_string())?;
    Ok(Some(flags))
}

/// The runtime (home: `home`), the default model, and the providers of
/// `config` registered (what `provider` uses must build; another that
/// cannot is left out, said on stderr), plus the flag-built `remote` one
/// when `provider` asks for it.
pub fn setup(
    model_spec: &str,
    home: PathBuf,
    provider: &str,
    remote_args: &RemoteArgs,
    config: &Config,
) -> Result<Setup, String> {
    // What the command uses must be there before anything starts; the
    // file's other providers are built if they can be.
    let used: Vec<&str> = match provider {
        "" => config.tool_providers().iter().map(String::as_str).collect(),
        provider => vec![provider],
    };
    config.check_used(&used).map_err(|e| e.to_string())?;
    let remote = remote(provider, remote_args, config)?;
    let cwd = std::env::current_dir().map_err(|e| format!("no working directory: {e}"))?;
    let builder = Runtime::builder().cancel_grace(Duration::from_millis(500)).home(home);
    let runtime = CommandRuntime(Some(builder.build().map_err(|e| format!("cannot start the runtime: {e}"))?));
    let home = runtime.home();
    let subagents = runtime.subagents();
    let tasks = TaskService::new();
    let models = Models::new(model_spec, config, &runtime)?;
    // Every run writes its session under the home: one that cannot take it
    // would otherwise fail each run on its own, late, as a bare
    // `STARTUP_FAILED`.
    check_home(&home).map_err(|e| e.to_string())?;
    let source = |spec: Option<&str>| models.get(spec);
    let context = BuildContext { subagents: &subagents, tasks: &tasks, home: &home, models: &source, probe: false };
    for (_, outcome) in config.register_used_blocking(&context, &used).map_err(|e| e.to_string())? {
        match outcome {
            Ok(registration) => registration.keep(),
            Err(error) => say!("subagents: left out, as this command does not use it: {error}"),
        }
    }
    if let Some(remote) = remote {
        for (_, outcome) in remote.register_used_blocking(&context, &["remote"]).map_err(|e| e.to_string())? {
            outcome.map_err(|e| e.to_string())?.keep();
        }
    }
    Ok(Setup { runtime, subagents, model: models.default, tasks, cwd, home })
}

/// The default model (`--model`) and every other model the configuration's
/// in-process providers name, each built and probed once: every provider
/// naming one model shares it, and so its limiter (a route's limiter is
/// shared however often it is built). The default must work; another that
/// cannot be built or reached fails only the providers naming it (each is
/// then left out, or refused when the command uses it).
pub struct Models {
    pub default: Arc<dyn Model>,
    named: HashMap<Option<String>, Result<Arc<dyn Model>, String>>,
}

impl Models {
    pub fn new(default: &str, config: &Config, runtime: &Runtime) -> Result<Models, String> {
        let default_model = model(default, config, runtime)?;
        let mut named = HashMap::new();
        for spec in config.models() {
            let built = match &spec {
                Some(spec) if spec != default => model(spec, config, runtime),
                _ => Ok(default_model.clone()),
            };
            named.insert(spec, built);
        }
        Ok(Models { default: default_model, named })
    }

    /// The model a provider naming `spec` gets (`None`: the default), or
    /// why it could not be built.
    pub fn get(&self, spec: Option<&str>) -> Result<Arc<dyn Model>, String> {
        self.named.get(&spec.map(str::to_owned)).cloned().unwrap_or_else(|| Ok(self.default.clone()))
    }
}

impl Setup {
    /// `Err` naming the registered providers when `provider` is not one.
    pub fn check_provider(&self, provider: &str) -> Result<(), String> {
        if self.subagents.has_provider(provider) {
            return Ok(());
        }
        let hint = self
            .subagents
            .nearest_provider(provider)
            .map(|near| format!("did you mean {near:?}? "))
            .unwrap_or_default();
        Err(format!("unknown provider {provider:?} ({hint}available: {})", self.subagents.provider_names().join(", ")))
    }
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

/// What is on the terminal while work runs, for a line said above it.
pub enum Shown {
    /// `fanout`'s progress bar (hidden off a terminal: the line goes to
    /// stderr as it is).
    Bar(indicatif::ProgressBar),
    /// `run`'s live tree.
    Live(crate::live::Live),
}

/// Trips `token` on the first Ctrl-C; a second one exits 130 at once. The
/// watch is a task on the runtime. What it says goes above what is
/// `shown`, so the bar's or the tree's own lines stay where they can be
/// cleared.
///
/// The handler is registered before this returns, so a Ctrl-C that lands
/// while the work is being set up cancels it rather than killing the
/// process mid-write.
pub fn cancel_on_ctrl_c(runtime: &Runtime, token: subagents::CancellationToken, shown: Shown) {
    let (registered, ready) = std::sync::mpsc::sync_channel(1);
    drop(runtime.spawn(async move {
        let interrupts = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt());
        let _ = registered.send(interrupts.is_ok());
        let Ok(mut interrupts) = interrupts else { return };
        if interrupts.recv().await.is_none() {
            return;
        }
        let said = "subagents: interrupted: cancelling every run (Ctrl-C again to quit at once)";
        match shown {
            Shown::Bar(bar) if !bar.is_hidden() => bar.println(said),
            Shown::Live(live) => live.above(said),
            _ => eprintln!("\n{said}"),
        }
        token.cancel();
        if interrupts.recv().await.is_some() {
            crate::coalesced::flush_all();
            std::process::exit(130);
        }
    }));
    if !ready.recv().unwrap_or(false) {
        say!("subagents: cannot watch for Ctrl-C; an interrupt ends the process at once");
    }
}
