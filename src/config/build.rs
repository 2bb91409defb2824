//! From checked tables to registered providers: the one place the binary's
//! front doors turn a configuration into providers.
//!
//! Reading a file checks and resolves everything that can fail without
//! starting anything (each kind's home does, in [`super::kinds`]), so
//! [`Config::register`] only dispatches to each kind's build and
//! registers. A provider the environment cannot serve (its
//! [`ProviderEntry::problem`]) fails only when it is built.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::bounds::quoted;
use super::{Config, ConfigError, ProviderEntry, Source, MAX_WRAPS_DEPTH};
use crate::actors::{Registration, Subagents};
use crate::agent::Model;
use crate::providers::InProcessProvider;
use crate::seam::Provider;
use crate::tool::TaskService;

/// Every `wraps` names another provider, no chain of wrappers loops, and
/// none goes through more than [`MAX_WRAPS_DEPTH`] chaos providers (each
/// layer is a call deeper on every run's stack).
pub(super) fn check_wrappers(source: &Source<'_>, providers: &[ProviderEntry]) -> Result<(), ConfigError> {
    let by_name: HashMap<&str, &ProviderEntry> = providers.iter().map(|entry| (entry.name.as_str(), entry)).collect();
    for entry in providers {
        let Some(wraps) = entry.checked.wraps() else { continue };
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
            let Some(inner_wraps) = inner.checked.wraps() else { break };
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

/// What building one provider may use.
pub(super) struct Building<'a> {
    /// The provider's name.
    pub(super) name: &'a str,
    /// The whole configuration: `[tool]`, `[mcp_servers]`.
    pub(super) config: &'a Config,
    pub(super) context: &'a BuildContext<'a>,
    /// The `[mcp_servers]` names its children mount.
    pub(super) mcp_servers: &'a [String],
    /// The provider it wraps, built.
    pub(super) wrapped: Option<Arc<dyn Provider>>,
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
    #[error("provider {name:?}: {source}")]
    Provider {
        /// The provider of the file.
        name: String,
        /// What went wrong: the provider's own error (or the problem its
        /// table has in this environment).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
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

    /// Builds and registers what a command uses: `used` and what they wrap
    /// must build (the first that does not is the error); every other
    /// provider is built when it can be, and one that cannot (an unset
    /// `${VAR}`, a program not on `PATH`, a failed probe) is left out with
    /// its reason in the outcomes rather than failing the command. Each
    /// with its outcome, in file order.
    pub async fn register_used(
        &self,
        context: &BuildContext<'_>,
        used: &[&str],
    ) -> Result<Vec<RegisterOutcome>, BuildError> {
        let reach = self.reach(used);
        let mut built: HashMap<&str, Arc<dyn Provider>> = HashMap::new();
        let mut outcomes = Vec::with_capacity(self.providers.len());
        for entry in &self.providers {
            let outcome = self.register_one(entry, context, &mut built).await;
            if reach.contains(&entry.name.as_str()) {
                outcomes.push((entry.name.clone(), Ok(outcome?)));
            } else {
                outcomes.push((entry.name.clone(), outcome));
            }
        }
        Ok(outcomes)
    }

    /// [`Config::register_used`] from outside any async runtime (see
    /// [`Config::register_blocking`]).
    pub fn register_used_blocking(
        &self,
        context: &BuildContext<'_>,
        used: &[&str],
    ) -> Result<Vec<RegisterOutcome>, BuildError> {
        on_private_runtime(self.register_used(context, used))?
    }

    /// The first problem of a provider `used` names or wraps
    /// ([`ProviderEntry::problem`]): what a command checks before it
    /// starts anything. A name the file does not define is not checked.
    pub fn check_used(&self, used: &[&str]) -> Result<(), ConfigError> {
        let reach = self.reach(used);
        let broken = self.providers.iter().filter(|entry| reach.contains(&entry.name.as_str()));
        broken.filter_map(|entry| entry.problem.clone()).map(Err).next().unwrap_or(Ok(()))
    }

    /// `used` and every provider they wrap, through chains of wrappers.
    fn reach<'a>(&'a self, used: &[&'a str]) -> Vec<&'a str> {
        let mut reach: Vec<&str> = Vec::new();
        let mut next: Vec<&str> = used.to_vec();
        while let Some(name) = next.pop() {
            if reach.contains(&name) {
                continue;
            }
            reach.push(name);
            if let Some(wraps) = self.provider(name).and_then(|entry| entry.checked.wraps()) {
                next.push(wraps.get_ref());
            }
        }
        reach
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
        let mut wrapped = None;
        if let Some(wraps) = entry.checked.wraps() {
            let inner = self.provider(wraps.get_ref()).expect("checked at load");
            let provider = Box::pin(self.build(inner, context, built)).await?;
            built.insert(inner.name.as_str(), provider.clone());
            wrapped = Some(provider);
        }
        let failed = |source| BuildError::Provider { name: entry.name.clone(), source };
        if let Some(problem) = &entry.problem {
            return Err(failed(problem.clone().into()));
        }
        let building = Building { name: &entry.name, config: self, context, mcp_servers: &entry.mcp_servers, wrapped };
        let provider = entry.checked.build(building).await.map_err(failed)?;
        built.insert(entry.name.as_str(), provider.clone());
        Ok(provider)
    }

    /// The `[mcp_servers]` tables `entry` lists, as its children mount them.
    #[cfg(feature = "mcp-client")]
    pub fn mcp_server_configs(&self, entry: &ProviderEntry) -> Vec<crate::agent::McpServerConfig> {
        self.mcp_server_configs_named(&entry.mcp_servers)
    }

    /// The `[mcp_servers]` tables `names` names, in that order.
    #[cfg_attr(not(any(feature = "mcp-client", feature = "acp")), allow(dead_code))]
    pub(super) fn mcp_server_entries<'a>(
        &'a self,
        names: &'a [String],
    ) -> impl Iterator<Item = &'a super::mcp_servers::McpServerEntry> + 'a {
        names.iter().filter_map(|name| self.mcp_servers.iter().find(|server| server.name == *name))
    }

    /// The `[mcp_servers]` tables `names` names, as children mount them.
    #[cfg(feature = "mcp-client")]
    pub(super) fn mcp_server_configs_named(&self, names: &[String]) -> Vec<crate::agent::McpServerConfig> {
        use crate::agent::{McpServerConfig, McpTransport};
        self.mcp_server_entries(names)
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

    /// `provider` with the servers `names` names mounted in its children.
    #[cfg(feature = "mcp-client")]
    pub(super) fn mount_mcp_servers(
        &self,
        provider: InProcessProvider,
        names: &[String],
    ) -> Result<InProcessProvider, String> {
        Ok(provider.with_mcp_servers(self.mcp_server_configs_named(names)))
    }

    #[cfg(not(feature = "mcp-client"))]
    pub(super) fn mount_mcp_servers(
        &self,
        provider: InProcessProvider,
        names: &[String],
    ) -> Result<InProcessProvider, String> {
        match names.is_empty() {
            true => Ok(provider),
            false => Err("MCP servers need the crate's \"mcp-client\" feature".to_owned()),
        }
    }
}

/// Runs `building` to completion on a private current-thread runtime.
fn on_private_runtime<F: std::future::Future>(building: F) -> Result<F::Output, BuildError> {
    let io = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(BuildError::Runtime)?;
    Ok(io.block_on(building))
}
