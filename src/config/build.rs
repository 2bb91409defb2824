//! From checked tables to registered providers: the one place the binary's
//! front doors turn a configuration into providers.
//!
//! Reading a file resolves everything that can fail without starting
//! anything ([`resolve`]: `${VAR}`, durations, commands, chaos rules), so
//! [`Config::register`] only builds and registers.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::bounds::quoted;
use super::schema::{FaultTable, Kind, PoolValue, ProviderTable, ReuseName, StageName, StopName};
use super::values::{expand, find_command, http_headers, http_url, not_a_directory};
use super::{parse_duration, parse_positive_duration, Config, ConfigError, ProviderEntry, Source, MAX_WRAPS_DEPTH};
use crate::actors::{Registration, Subagents};
use crate::agent::{ListDir, Model, ReadFile, Tool};
use crate::providers::{
    ChaosFault, ChaosProvider, ChaosSchedule, ChaosStage, ChildInfo, InProcessProvider, MockProvider, ToolFactory,
};
use crate::seam::{AgentOptions, Budget, Provider, StopReason};
use crate::tool::{delegating_kit, TaskService};

/// A provider's strings and durations as resolved when the file was read.
#[derive(Debug, Default)]
pub(super) struct Resolved {
    durations: HashMap<&'static str, Duration>,
    command: Option<PathBuf>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    cwd: Option<PathBuf>,
    bin: Option<PathBuf>,
    home: Option<PathBuf>,
    template_dir: Option<PathBuf>,
    run_dir_root: Option<PathBuf>,
    patches: Vec<PathBuf>,
    budget: Option<Budget>,
    nats: Option<String>,
    url: Option<String>,
    headers: Vec<(String, String)>,
    schedule: Vec<(ChaosStage, ChaosFault, f64)>,
    pool: PoolSettings,
}

/// `pool`: a remote provider's worker pool, or an acp provider's settings
/// (each read only when its kind's feature is built).
#[derive(Debug, Default)]
#[cfg_attr(not(all(feature = "acp", feature = "remote")), allow(dead_code))]
struct PoolSettings {
    name: Option<String>,
    size: Option<usize>,
    sessions_per_process: Option<usize>,
    max_runs_per_process: Option<usize>,
    idle_timeout: Option<Duration>,
    cancel_grace: Option<Duration>,
}

/// Checks and resolves what `table` names, each error at its place.
pub(super) fn resolve(source: &Source<'_>, name: &str, table: &ProviderTable) -> Result<Resolved, ConfigError> {
    let mut resolved = Resolved::default();
    let durations = [
        ("delay", &table.delay),
        ("dispose_eof_grace", &table.dispose_eof_grace),
        ("dispose_grace", &table.dispose_grace),
        ("dispose_idle_eof_grace", &table.dispose_idle_eof_grace),
        ("shutdown_timeout", &table.shutdown_timeout),
        ("connect_timeout", &table.connect_timeout),
        ("publish_timeout", &table.publish_timeout),
        ("dispose_wait", &table.dispose_wait),
        ("broker_patience", &table.broker_patience),
        ("worker_patience", &table.worker_patience),
        ("detached_ttl", &table.detached_ttl),
        ("card_timeout", &table.card_timeout),
        ("first_event_timeout", &table.first_event_timeout),
        ("idle_timeout", &table.idle_timeout),
    ];
    for (key, value) in durations {
        if let Some(value) = value {
            let duration = parse_duration(value.get_ref())
                .map_err(|e| source.error(Some(value.span()), format!("`{key}`: {e}")))?;
            resolved.durations.insert(key, duration);
        }
    }
    if let Some(budget) = &table.budget {
        let limits = budget.get_ref();
        let mut parsed = Budget {
            depth: limits.depth,
            width: limits.width,
            runs: limits.runs,
            tokens: limits.tokens,
            deadline: None,
        };
        if let Some(deadline) = &limits.deadline {
            let deadline = parse_positive_duration(deadline)
                .map_err(|e| source.error(Some(budget.span()), format!("`budget.deadline`: {e}")))?;
            parsed.deadline = Some(deadline);
        }
        let zero =
            [limits.depth.map(u64::from), limits.width.map(u64::from), limits.runs, limits.tokens].contains(&Some(0));
        if zero {
            return Err(
                source.error(Some(budget.span()), "a `budget` limit of 0 would refuse every run: give at least 1")
            );
        }
        resolved.budget = Some(parsed);
    }
    let kind = *table.kind.get_ref();
    if let Some(command) = &table.command {
        let text = expand(source, command.get_ref(), command.span())?;
        let found = find_command(&text).ok_or_else(|| {
            source.error(Some(command.span()), format!("command {text:?} is not a file and not on PATH"))
        })?;
        resolved.command = Some(found);
    } else if kind == Kind::Acp {
        return Err(
            source.error(Some(table.kind.span()), format!("provider {name:?} of kind \"acp\" needs a `command`"))
        );
    }
    if let Some(args) = &table.args {
        for arg in args.get_ref() {
            resolved.args.push(expand(source, arg.get_ref(), arg.span())?);
        }
    }
    if let Some(env) = &table.env {
        for (key, value) in env.get_ref() {
            resolved.env.push((key.clone(), expand(source, value.get_ref(), value.span())?));
        }
    }
    let path_of = |value: &toml::Spanned<String>| expand(source, value.get_ref(), value.span()).map(PathBuf::from);
    resolved.cwd = table.cwd.as_ref().map(path_of).transpose()?;
    resolved.bin = table.bin.as_ref().map(path_of).transpose()?;
    resolved.home = table.home.as_ref().map(path_of).transpose()?;
    if let Some(home) = &resolved.home {
        let span = table.home.as_ref().map(|h| h.span());
        if !home.is_absolute() {
            return Err(source.error(span, "`home` must be an absolute path"));
        }
        if let Some(problem) = not_a_directory(home) {
            return Err(source.error(span, format!("`home` {problem}")));
        }
    }
    // A relative template or patch is read beside the file, as its
    // examples ship.
    let beside_file = |path: PathBuf| match Path::new(source.name).parent() {
        Some(dir) if path.is_relative() => dir.join(path),
        _ => path,
    };
    resolved.template_dir = table.template_dir.as_ref().map(path_of).transpose()?.map(beside_file);
    resolved.run_dir_root = table.run_dir_root.as_ref().map(path_of).transpose()?;
    // Made when the first agent starts: what stands in its way is named now.
    if let (Some(root), Some(value)) = (&resolved.run_dir_root, &table.run_dir_root) {
        if let Some(problem) = not_a_directory(root) {
            return Err(source.error(Some(value.span()), format!("`run_dir_root` {problem}")));
        }
    }
    for patch in table.patches.iter().flat_map(|patches| patches.get_ref()) {
        let path = beside_file(path_of(patch)?);
        if !path.is_file() {
            return Err(source.error(Some(patch.span()), format!("patch {path:?} is not a file")));
        }
        resolved.patches.push(path);
    }
    if let (Some(template), Some(value)) = (&resolved.template_dir, &table.template_dir) {
        if !template.is_dir() {
            return Err(source.error(Some(value.span()), format!("template_dir {template:?} is not a directory")));
        }
    }
    let names_run_dir =
        resolved.args.iter().chain(resolved.env.iter().map(|(_, value)| value)).any(|text| text.contains("{run_dir}"));
    let run_dir_keys = [
        ("template_dir", table.template_dir.as_ref().map(|v| v.span())),
        ("keep_run_dirs", table.keep_run_dirs.as_ref().map(|v| v.span())),
        ("run_dir_root", table.run_dir_root.as_ref().map(|v| v.span())),
    ];
    if let Some((key, span)) =
        run_dir_keys.into_iter().find_map(|(key, span)| Some((key, span?))).filter(|_| !names_run_dir)
    {
        let message = format!(
            "`{key}` applies to the directory `{{run_dir}}` names, and no `args` or `env` value of {name:?} names it"
        );
        return Err(source.error(Some(span), message));
    }
    if let Some(nats) = &table.nats {
        resolved.nats = Some(expand(source, nats.get_ref(), nats.span())?);
    } else if kind == Kind::Remote && std::env::var("SUBAGENTS_NATS_URL").map_or(true, |url| url.is_empty()) {
        let message = format!("provider {name:?} of kind \"remote\" needs `nats` (or SUBAGENTS_NATS_URL)");
        return Err(source.error(Some(table.kind.span()), message));
    }
    if let Some(url) = &table.url {
        resolved.url = Some(http_url(source, "url", url)?);
    } else if kind == Kind::A2a {
        return Err(source.error(Some(table.kind.span()), format!("provider {name:?} of kind \"a2a\" needs a `url`")));
    }
    if let Some(headers) = &table.headers {
        // `${VAR}` keeps a token out of the file: `Authorization = "Bearer ${A2A_TOKEN}"`.
        resolved.headers = http_headers(source, headers.get_ref(), crate::agent::header_problem)?;
    }
    if let Some(pool) = &table.pool {
        let pooled = table.reuse.as_ref().is_some_and(|reuse| matches!(reuse.get_ref(), ReuseName::Pooled));
        if kind == Kind::Acp && !pooled {
            return Err(source.error(Some(pool.span()), "`pool` applies only with reuse = \"pooled\""));
        }
        resolved.pool = pool_settings(source, kind, pool)?;
    }
    if let Some(faults) = &table.faults {
        for fault in faults.get_ref() {
            resolved.schedule.push(chaos_rule(fault.get_ref()).map_err(|e| source.error(Some(fault.span()), e))?);
        }
    }
    if kind == Kind::Chaos && table.wraps.is_none() {
        return Err(source.error(Some(table.kind.span()), format!("provider {name:?} of kind \"chaos\" needs `wraps`")));
    }
    Ok(resolved)
}

fn pool_settings(
    source: &Source<'_>,
    kind: Kind,
    pool: &toml::Spanned<PoolValue>,
) -> Result<PoolSettings, ConfigError> {
    match (kind, pool.get_ref()) {
        (Kind::Remote, PoolValue::Name(name)) => {
            Ok(PoolSettings { name: Some(name.clone()), ..PoolSettings::default() })
        }
        (Kind::Acp, PoolValue::Settings(table)) => {
            let duration = |key: &str, value: &Option<String>| -> Result<Option<Duration>, ConfigError> {
                let parsed = value.as_deref().map(parse_duration).transpose();
                parsed.map_err(|e| source.error(Some(pool.span()), format!("pool `{key}`: {e}")))
            };
            if [table.size, table.sessions_per_process, table.max_runs_per_process].contains(&Some(0)) {
                return Err(source.error(Some(pool.span()), "pool sizes must be at least 1"));
            }
            Ok(PoolSettings {
                name: None,
                size: table.size,
                sessions_per_process: table.sessions_per_process,
                max_runs_per_process: table.max_runs_per_process,
                idle_timeout: duration("idle_timeout", &table.idle_timeout)?,
                cancel_grace: duration("cancel_grace", &table.cancel_grace)?,
            })
        }
        (Kind::Remote, PoolValue::Settings(_)) => {
            Err(source
                .error(Some(pool.span()), "a remote provider's `pool` is a worker pool's name, such as \"default\""))
        }
        _ => Err(source.error(Some(pool.span()), "an acp provider's `pool` is a table, such as { size = 2 }")),
    }
}

fn chaos_rule(fault: &FaultTable) -> Result<(ChaosStage, ChaosFault, f64), String> {
    let stage = match fault.stage {
        StageName::Launch => ChaosStage::Launch,
        StageName::Run => ChaosStage::Run,
        StageName::Dispose => ChaosStage::Dispose,
        StageName::Progress => ChaosStage::Progress,
    };
    let injected = match fault.fault.as_str() {
        "error" => ChaosFault::Error,
        "hang" => ChaosFault::Hang,
        "panic" => ChaosFault::Panic,
        "crash" => ChaosFault::Crash,
        "drop_progress" => ChaosFault::DropProgress,
        "duplicate_progress" => ChaosFault::DuplicateProgress,
        other => match other.strip_prefix("delay:") {
            Some(duration) => ChaosFault::Delay(parse_duration(duration).map_err(|e| e.to_string())?),
            None => {
                return Err(format!(
                    "unknown fault {other:?}: error, hang, panic, crash, drop_progress, duplicate_progress or delay:DURATION"
                ))
            }
        },
    };
    if !(0.0..=1.0).contains(&fault.probability) {
        return Err(format!("probability {} is not between 0 and 1", fault.probability));
    }
    Ok((stage, injected, fault.probability))
}

/// Every `wraps` names another provider, no chain of wrappers loops, and
/// none goes through more than [`MAX_WRAPS_DEPTH`] chaos providers (each
/// layer is a call deeper on every run's stack).
pub(super) fn check_wrappers(source: &Source<'_>, providers: &[ProviderEntry]) -> Result<(), ConfigError> {
    let by_name: HashMap<&str, &ProviderEntry> = providers.iter().map(|entry| (entry.name.as_str(), entry)).collect();
    for entry in providers {
        let Some(wraps) = &entry.table.wraps else { continue };
        let mut seen = vec![entry.name.as_str()];
        let mut next = wraps;
        loop {
            let target = next.get_ref().as_str();
            if seen.contains(&target) {
                let message = if seen.len() == 1 {
                    format!("provider {:?} wraps itself", entry.name)
                } else {
                    format!("provider {:?} wraps a chain of chaos providers that loops back to {target:?}", entry.name)
                };
                return Err(source.error(Some(wraps.span()), message));
            }
            let Some(inner) = by_name.get(target) else {
                let message =
                    format!("provider {:?} wraps {}, which no [providers] table defines", entry.name, quoted(target));
                return Err(source.error(Some(wraps.span()), message));
            };
            let Some(inner_wraps) = &inner.table.wraps else { break };
            seen.push(target);
            if seen.len() > MAX_WRAPS_DEPTH {
                let message = format!(
                    "provider {:?} wraps a chain of more than {MAX_WRAPS_DEPTH} chaos providers (through {target:?})",
                    entry.name
                );
                return Err(source.error(Some(wraps.span()), message));
            }
            next = inner_wraps;
        }
    }
    Ok(())
}

/// Where in-process providers get their models.
pub trait ModelSource {
    /// The model for `spec` (`None`: the caller's default model).
    fn model(&self, spec: Option<&str>) -> Result<Arc<dyn Model>, String>;
}

impl<F> ModelSource for F
where
    F: Fn(Option<&str>) -> Result<Arc<dyn Model>, String>,
{
    fn model(&self, spec: Option<&str>) -> Result<Arc<dyn Model>, String> {
        self(spec)
    }
}

/// What building needs from the front door.
pub struct BuildContext<'a> {
    /// The registry to register into.
    pub subagents: &'a Subagents,
    /// Background tasks of the children's subagent tools.
    pub tasks: &'a TaskService,
    /// The runtime's home (a `process` provider's children live under it
    /// unless its table names a `home`).
    pub home: &'a Path,
    /// The in-process providers' models.
    pub models: &'a dyn ModelSource,
    /// Also check what is otherwise first tried at a run: a `process`
    /// provider starts one child and runs its `initialize` handshake
    /// (`providers check`). An `acp` provider always probes its agent.
    pub probe: bool,
}

/// Why [`Config::register`] (or one outcome of [`Config::register_each`])
/// did not register a provider.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// The provider could not be built: its model, its tools, its MCP
    /// servers, its agent's probe, its broker.
    #[error("provider {name:?}: {reason}")]
    Provider {
        /// The provider of the file.
        name: String,
        /// What went wrong, in words.
        reason: String,
    },
    /// The registry refused it (a name taken, a closed runtime).
    #[error(transparent)]
    Register(#[from] crate::RegisterError),
    /// The private runtime the builds run on could not start.
    #[error("cannot start the runtime: {0}")]
    Runtime(std::io::Error),
}

/// One provider of [`Config::register_each`]: its name, and its
/// registration or why it has none.
pub type RegisterOutcome = (String, Result<Registration, BuildError>);

impl std::fmt::Debug for BuildContext<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuildContext").field("home", &self.home).finish_non_exhaustive()
    }
}

impl Config {
    /// Builds every provider and registers it, in file order (a chaos
    /// provider's inner one first). An error names the provider; what was
    /// registered before it stays registered. Needs a tokio runtime: an
    /// `acp` provider runs one `initialize` against its command to learn
    /// what the agent supports.
    pub async fn register(&self, context: &BuildContext<'_>) -> Result<Vec<Registration>, BuildError> {
        let mut built: HashMap<&str, Arc<dyn Provider>> = HashMap::new();
        let mut registrations = Vec::with_capacity(self.providers.len());
        for entry in &self.providers {
            registrations.push(self.register_one(entry, context, &mut built).await?);
        }
        Ok(registrations)
    }

    /// Builds and registers each provider (or only `name` and what it
    /// wraps) on its own: one that fails does not stop the others (a chaos
    /// provider around it fails too). Each with its outcome, in file order.
    pub async fn register_each(&self, context: &BuildContext<'_>, name: Option<&str>) -> Vec<RegisterOutcome> {
        let mut built: HashMap<&str, Arc<dyn Provider>> = HashMap::new();
        let mut outcomes = Vec::new();
        for entry in self.providers.iter().filter(|entry| name.is_none_or(|name| entry.name == name)) {
            outcomes.push((entry.name.clone(), self.register_one(entry, context, &mut built).await));
        }
        outcomes
    }

    /// [`Config::register`] from outside any async runtime: the builds run
    /// on a private current-thread one (an `acp` provider's `initialize`
    /// probe needs it), which is gone when this returns.
    pub fn register_blocking(&self, context: &BuildContext<'_>) -> Result<Vec<Registration>, BuildError> {
        on_private_runtime(self.register(context))?
    }

    /// [`Config::register_each`] from outside any async runtime (see
    /// [`Config::register_blocking`]).
    pub fn register_each_blocking(
        &self,
        context: &BuildContext<'_>,
        name: Option<&str>,
    ) -> Result<Vec<RegisterOutcome>, BuildError> {
        on_private_runtime(self.register_each(context, name))
    }

    async fn register_one<'c>(
        &'c self,
        entry: &'c ProviderEntry,
        context: &BuildContext<'_>,
        built: &mut HashMap<&'c str, Arc<dyn Provider>>,
    ) -> Result<Registration, BuildError> {
        let provider = self.build(entry, context, built).await?;
        Ok(context.subagents.register_shared(provider)?)
    }

    async fn build<'c>(
        &'c self,
        entry: &'c ProviderEntry,
        context: &BuildContext<'_>,
        built: &mut HashMap<&'c str, Arc<dyn Provider>>,
    ) -> Result<Arc<dyn Provider>, BuildError> {
        if let Some(provider) = built.get(entry.name.as_str()) {
            return Ok(provider.clone());
        }
        // A chaos provider's inner one first (a loop was refused at load).
        if let Some(wraps) = &entry.table.wraps {
            let inner = self.provider(wraps.get_ref()).expect("checked at load");
            if !built.contains_key(inner.name.as_str()) {
                let provider = Box::pin(self.build(inner, context, built)).await?;
                built.insert(inner.name.as_str(), provider);
            }
        }
        let failed = |reason: String| BuildError::Provider { name: entry.name.clone(), reason };
        let table = &entry.table;
        let resolved = &entry.resolved;
        let duration = |key: &str| resolved.durations.get(key).copied();
        let provider: Arc<dyn Provider> = match entry.kind {
            Kind::Spawn | Kind::Fork => {
                let model = context.models.model(table.model.as_ref().map(|m| m.get_ref().as_str())).map_err(failed)?;
                let name = entry.name.clone();
                let mut provider = if entry.kind == Kind::Fork {
                    InProcessProvider::fork(name, model)
                } else {
                    InProcessProvider::spawn(name, model)
                };
                provider = provider.with_tools(self.child_tools(entry, context).map_err(failed)?);
                provider = self.mount_mcp_servers(provider, entry).map_err(failed)?;
                if let Some(steps) = &table.max_steps {
                    provider = provider.with_max_steps(*steps.get_ref());
                }
                if let Some(persona) = &table.persona {
                    provider = provider.with_persona(persona.get_ref().clone());
                }
                if let Some(budget) = resolved.budget {
                    provider = provider.with_budget(budget);
                }
                if let Some(retries) = &table.structured_nudge_retries {
                    provider = provider.with_structured_nudge_retries(*retries.get_ref());
                }
                if let Some(max_tokens) = &table.max_tokens {
                    let route = AgentOptions { max_tokens: Some(*max_tokens.get_ref()), ..AgentOptions::default() };
                    provider = provider.with_route_defaults(route);
                }
                Arc::new(provider)
            }
            Kind::Mock => {
                let mut mock = MockProvider::new(entry.name.clone());
                if let Some(reply) = &table.reply {
                    mock = mock.with_reply(reply.get_ref().clone());
                }
                if table.echo_prompt.as_ref().is_some_and(|echo| *echo.get_ref()) {
                    mock = mock.with_echo_prompt();
                }
                if let Some(delay) = duration("delay") {
                    mock = mock.with_delay(delay);
                }
                if let Some(stop) = &table.stop_reason {
                    mock = mock.with_stop_reason(match stop.get_ref() {
                        StopName::Completed => StopReason::Completed,
                        StopName::Aborted => StopReason::Aborted,
                        StopName::Error => StopReason::Error,
                        StopName::MaxTokens => StopReason::MaxTokens,
                        StopName::Refusal => StopReason::Refusal,
                    });
                }
                Arc::new(mock)
            }
            Kind::Chaos => {
                let wraps = table.wraps.as_ref().expect("checked at load");
                let inner = built.get(wraps.get_ref().as_str()).cloned().expect("built just above");
                let schedule = resolved
                    .schedule
                    .iter()
                    .fold(ChaosSchedule::new(), |schedule, (stage, fault, p)| schedule.rule(*stage, *fault, *p));
                let seed = table.seed.as_ref().map_or(0, |seed| *seed.get_ref());
                Arc::new(ChaosProvider::wrap(entry.name.clone(), inner, schedule, seed))
            }
            Kind::Acp => self.acp(entry).await.map_err(failed)?,
            Kind::Process => self.process(entry, context).await.map_err(failed)?,
            Kind::Remote => self.remote(entry).map_err(failed)?,
            Kind::A2a => self.a2a(entry).map_err(failed)?,
        };
        built.insert(entry.name.as_str(), provider.clone());
        Ok(provider)
    }

    /// An in-process provider's children: the built-in tools its table
    /// lists (default both), and a subagent tool per provider `[tool]`
    /// offers, plus the task tools, while its depth cap leaves room.
    fn child_tools(&self, entry: &ProviderEntry, context: &BuildContext<'_>) -> Result<ToolFactory, String> {
        let mut builtins: Vec<Arc<dyn Tool>> = Vec::new();
        let mut delegate = true;
        match &entry.table.tools {
            None => builtins = vec![Arc::new(ReadFile), Arc::new(ListDir)],
            Some(names) => {
                delegate = false;
                for name in names.get_ref() {
                    match name.get_ref().as_str() {
                        "read_file" => builtins.push(Arc::new(ReadFile)),
                        "list_dir" => builtins.push(Arc::new(ListDir)),
                        "subagent" => delegate = true,
                        other => return Err(format!("unknown tool {other:?}: read_file, list_dir or subagent")),
                    }
                }
            }
        }
        let max_depth = entry.table.max_depth.as_ref().map_or(self.tool_max_depth, |depth| *depth.get_ref());
        let offered = if delegate { self.tool_providers.clone() } else { Vec::new() };
        let kit = delegating_kit(context.subagents, context.tasks, builtins, offered, max_depth);
        Ok(Arc::new(move |_: &ChildInfo| kit()))
    }

    /// The `[mcp_servers]` tables `entry` lists, as its children mount them.
    #[cfg(feature = "mcp")]
    pub fn mcp_server_configs(&self, entry: &ProviderEntry) -> Vec<crate::agent::McpServerConfig> {
        use crate::agent::{McpServerConfig, McpTransport};
        let listed = entry.mcp_servers.iter().filter_map(|name| self.mcp_servers.iter().find(|s| s.name == *name));
        listed
            .map(|server| {
                let transport = match (&server.command, &server.http) {
                    (_, Some((url, headers))) => McpTransport::Http { url: url.clone(), headers: headers.clone() },
                    (command, None) => McpTransport::Stdio {
                        command: command.clone().expect("a table has a command or a url"),
                        args: server.args.clone(),
                        env: server.env.clone(),
                        inherit_env: server.inherit_env.clone(),
                        cwd: server.cwd.clone(),
                    },
                };
                let mut config = McpServerConfig::over(server.name.clone(), transport);
                config.isolate = server.isolate;
                config.call_timeout = server.timeout.unwrap_or(config.call_timeout);
                config.initialize_timeout = server.initialize_timeout.unwrap_or(config.initialize_timeout);
                config.max_result_bytes = server.max_result_bytes.unwrap_or(config.max_result_bytes);
                config
            })
            .collect()
    }

    #[cfg(feature = "mcp")]
    fn mount_mcp_servers(
        &self,
        provider: InProcessProvider,
        entry: &ProviderEntry,
    ) -> Result<InProcessProvider, String> {
        // No `mcp_servers` key: the children inherit their parent's.
        if entry.table.mcp_servers.is_none() {
            return Ok(provider);
        }
        Ok(provider.with_mcp_servers(self.mcp_server_configs(entry)))
    }

    #[cfg(not(feature = "mcp"))]
    fn mount_mcp_servers(
        &self,
        provider: InProcessProvider,
        entry: &ProviderEntry,
    ) -> Result<InProcessProvider, String> {
        match entry.mcp_servers.is_empty() {
            true => Ok(provider),
            false => Err("MCP servers need the crate's \"mcp\" feature".to_owned()),
        }
    }

    #[cfg(feature = "acp")]
    async fn acp(&self, entry: &ProviderEntry) -> Result<Arc<dyn Provider>, String> {
        use super::schema::PermissionName;
        use crate::providers::{AcpConfig, AcpMcpServer, AcpProvider, Permission, PoolConfig, Reuse, RunDirs};
        let (table, resolved) = (&entry.table, &entry.resolved);
        let command = resolved.command.clone().expect("checked at load");
        let mut config = AcpConfig::new(entry.name.clone(), command, resolved.args.clone());
        config.child = child_process(entry);
        config.run_dirs = RunDirs {
            root: resolved.run_dir_root.clone(),
            template: resolved.template_dir.clone(),
            keep: table.keep_run_dirs.as_ref().is_some_and(|keep| *keep.get_ref()),
        };
        config.mcp_servers = entry
            .mcp_servers
            .iter()
            .filter_map(|name| self.mcp_servers.iter().find(|server| server.name == *name))
            .map(|server| match (&server.command, &server.http) {
                (_, Some((url, headers))) => {
                    AcpMcpServer::Http { name: server.name.clone(), url: url.clone(), headers: headers.clone() }
                }
                (command, None) => AcpMcpServer::Stdio {
                    name: server.name.clone(),
                    command: command.clone().expect("a table has a command or a url"),
                    args: server.args.clone(),
                    env: server.env.clone(),
                },
            })
            .collect();
        if let Some(permission) = &table.permission {
            config.permission = match permission.get_ref() {
                PermissionName::Allow => Permission::Allow,
                PermissionName::Reject => Permission::Reject,
            };
        }
        if let Some(grace) = resolved.durations.get("dispose_idle_eof_grace") {
            config.dispose_idle_eof_grace = *grace;
        }
        let pooled = table.reuse.as_ref().is_some_and(|reuse| matches!(reuse.get_ref(), ReuseName::Pooled));
        if pooled {
            let (settings, mut pool) = (&resolved.pool, PoolConfig::default());
            pool.size = settings.size.unwrap_or(pool.size);
            pool.sessions_per_process = settings.sessions_per_process.unwrap_or(pool.sessions_per_process);
            pool.max_runs_per_process = settings.max_runs_per_process.unwrap_or(pool.max_runs_per_process);
            pool.idle_timeout = settings.idle_timeout.unwrap_or(pool.idle_timeout);
            pool.cancel_grace = settings.cancel_grace.unwrap_or(pool.cancel_grace);
            config.reuse = Reuse::Pooled(pool);
        }
        AcpProvider::new(config).await.map(|p| Arc::new(p) as Arc<dyn Provider>).map_err(|e| e.to_string())
    }

    #[cfg(not(feature = "acp"))]
    async fn acp(&self, _: &ProviderEntry) -> Result<Arc<dyn Provider>, String> {
        Err("acp providers need the crate's \"acp\" feature".to_owned())
    }

    #[cfg(feature = "process")]
    async fn process(&self, entry: &ProviderEntry, context: &BuildContext<'_>) -> Result<Arc<dyn Provider>, String> {
        use crate::providers::{ProcessConfig, ProcessProvider};
        let (table, resolved) = (&entry.table, &entry.resolved);
        let home = resolved.home.clone().unwrap_or_else(|| context.home.join("children").join(&entry.name));
        let mut config = ProcessConfig::new(entry.name.clone(), home);
        if let Some(bin) = &resolved.bin {
            config.bin = bin.clone();
        }
        if let Some(profile) = &table.profile {
            config.profile = profile.get_ref().clone();
        }
        config.patches = resolved.patches.clone();
        config.child = child_process(entry);
        if let Some(model) = &table.model {
            // The child's route, and the endpoint's variables and key it
            // is handed (credential-shaped names are never inherited).
            let spec = crate::agent::ModelSpec::parse(model.get_ref()).map_err(|e| e.to_string())?;
            config.route_child_model(&spec);
        }
        config.route.max_tokens = table.max_tokens.as_ref().map(|max| *max.get_ref());
        if let Some(timeout) = resolved.durations.get("shutdown_timeout") {
            config.shutdown_timeout = *timeout;
        }
        // No `mcp_servers` key: each child gets its parent's.
        #[cfg(feature = "mcp")]
        if table.mcp_servers.is_some() {
            config.mcp_servers = Some(self.mcp_server_configs(entry));
        }
        #[cfg(not(feature = "mcp"))]
        if !entry.mcp_servers.is_empty() {
            return Err("MCP servers need the crate's \"mcp\" feature".to_owned());
        }
        let provider = ProcessProvider::new(config).map_err(|e| e.to_string())?;
        if context.probe {
            provider.probe().await.map_err(|e| e.to_string())?;
        }
        Ok(Arc::new(provider))
    }

    #[cfg(not(feature = "process"))]
    async fn process(&self, _: &ProviderEntry, _: &BuildContext<'_>) -> Result<Arc<dyn Provider>, String> {
        Err("process providers need the crate's \"process\" feature".to_owned())
    }

    #[cfg(feature = "remote")]
    fn remote(&self, entry: &ProviderEntry) -> Result<Arc<dyn Provider>, String> {
        use crate::providers::{RemoteConfig, RemoteProvider};
        let resolved = &entry.resolved;
        let url = match &resolved.nats {
            Some(url) => url.clone(),
            None => std::env::var("SUBAGENTS_NATS_URL").map_err(|_| "needs `nats` or SUBAGENTS_NATS_URL".to_owned())?,
        };
        let mut config = RemoteConfig::new(entry.name.clone(), url);
        if let Some(pool) = &resolved.pool.name {
            config = config.with_pool(pool.clone());
        }
        for (key, slot) in [
            ("connect_timeout", &mut config.connect_timeout),
            ("publish_timeout", &mut config.publish_timeout),
            ("dispose_wait", &mut config.dispose_wait),
            ("broker_patience", &mut config.broker_patience),
            ("worker_patience", &mut config.worker_patience),
            ("detached_ttl", &mut config.detached_ttl),
        ] {
            if let Some(value) = resolved.durations.get(key) {
                *slot = *value;
            }
        }
        RemoteProvider::connect(config).map(|p| Arc::new(p) as Arc<dyn Provider>).map_err(|e| e.to_string())
    }

    #[cfg(feature = "a2a")]
    fn a2a(&self, entry: &ProviderEntry) -> Result<Arc<dyn Provider>, String> {
        use crate::providers::{A2aConfig, A2aProvider};
        let resolved = &entry.resolved;
        let mut config = A2aConfig::new(entry.name.clone(), resolved.url.clone().expect("checked at load"));
        config.headers = resolved.headers.clone();
        config.skill = entry.table.skill.as_ref().map(|skill| skill.get_ref().clone());
        for (key, slot) in [
            ("connect_timeout", &mut config.limits.connect_timeout),
            ("card_timeout", &mut config.limits.card_timeout),
            ("first_event_timeout", &mut config.limits.first_event_timeout),
            ("idle_timeout", &mut config.limits.idle_timeout),
        ] {
            if let Some(value) = resolved.durations.get(key) {
                *slot = *value;
            }
        }
        A2aProvider::new(config).map(|p| Arc::new(p) as Arc<dyn Provider>).map_err(|e| e.to_string())
    }

    #[cfg(not(feature = "a2a"))]
    fn a2a(&self, _: &ProviderEntry) -> Result<Arc<dyn Provider>, String> {
        Err("a2a providers need the crate's \"a2a\" feature".to_owned())
    }

    #[cfg(not(feature = "remote"))]
    fn remote(&self, _: &ProviderEntry) -> Result<Arc<dyn Provider>, String> {
        Err("remote providers need the crate's \"remote\" feature".to_owned())
    }
}

/// Runs `building` to completion on a private current-thread runtime.
fn on_private_runtime<F: std::future::Future>(building: F) -> Result<F::Output, BuildError> {
    let io = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(BuildError::Runtime)?;
    Ok(io.block_on(building))
}

/// What an `acp` or `process` table says about its child: where it runs,
/// its environment, its graces (the defaults where the table is silent).
#[cfg(any(feature = "acp", feature = "process"))]
fn child_process(entry: &ProviderEntry) -> crate::providers::ChildProcessConfig {
    let (table, resolved) = (&entry.table, &entry.resolved);
    let mut child = crate::providers::ChildProcessConfig {
        cwd: resolved.cwd.clone(),
        env: resolved.env.clone(),
        inherit_env: table.inherit_env.as_ref().map(|names| names.get_ref().clone()).unwrap_or_default(),
        ..Default::default()
    };
    if let Some(grace) = resolved.durations.get("dispose_eof_grace") {
        child.dispose_eof_grace = *grace;
    }
    if let Some(grace) = resolved.durations.get("dispose_grace") {
        child.dispose_grace = *grace;
    }
    child
}
