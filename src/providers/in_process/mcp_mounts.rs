//! The MCP servers an in-process provider's children mount (feature
//! `mcp`): a shared server is one connection for all the provider's runs,
//! started by the first run and closed at the provider's shutdown; a
//! per-run server (`isolate`) is started for its run in the child's
//! working directory and closed at the run's dispose.
//!
//! A server that cannot start does not fail the run: the child starts
//! without its tools (a warning says which server and why, and so does a
//! call of one of them), or with the tools it listed last when it ran
//! before (a call starts it again), so one broken server never takes
//! every delegation down with it; a launch never waits out a dying
//! server's backoff.
//!
//! Which servers a child mounts: its provider's when the provider scopes
//! them, else its parent agent's (the same connections; an `isolate` one
//! started afresh for the child), narrowed by the request's
//! `mcp_servers`. Only the provider's own shared servers are the
//! provider's to close; inherited ones belong to whoever mounted them.
//!
//! This file is the provider's one seam to MCP: built without the
//! client (feature `mcp-client`), the same names mount nothing and refuse
//! a request that names a server.

#[cfg(not(feature = "mcp-client"))]
pub(super) use self::off::*;
#[cfg(feature = "mcp-client")]
pub(super) use self::on::*;

#[cfg(feature = "mcp-client")]
mod on {
    use std::path::Path;
    use std::sync::Arc;

    use tokio_util::sync::CancellationToken;

    pub(crate) use crate::agent::MCP_TOOL_PREFIX;
    use crate::agent::{Agent, McpServer, McpServerConfig, Toolset};
    use crate::live::LiveCounters;
    use crate::seam::{LaunchError, StartRequest};

    /// What a provider's children mount.
    #[derive(Debug, Default)]
    pub(crate) struct McpMounts {
        shared: Vec<McpServer>,
        per_run: Vec<McpServerConfig>,
    }

    impl McpMounts {
        pub(crate) fn new(servers: Vec<McpServerConfig>) -> Self {
            let (per_run, shared): (Vec<_>, Vec<_>) = servers.into_iter().partition(|server| server.isolate);
            McpMounts { shared: shared.into_iter().map(McpServer::new).collect(), per_run }
        }

        /// What one child mounts: the provider's servers (`scoped`), else its
        /// parent agent's, narrowed by the request's `mcp_servers`.
        pub(crate) fn for_child(
            scoped: Option<&Arc<McpMounts>>,
            request: &StartRequest,
        ) -> Result<Arc<Self>, LaunchError> {
            let mounts = match scoped {
                Some(mounts) => mounts.clone(),
                None => {
                    let parent = request.parent.agent.as_ref().and_then(|agent| agent.downcast::<Agent>());
                    let servers = parent.map(|agent| agent.toolset().mcp_servers()).unwrap_or_default();
                    Arc::new(McpMounts::inherited(servers))
                }
            };
            match &request.mcp_servers {
                Some(names) => Ok(Arc::new(mounts.select(names)?)),
                None => Ok(mounts),
            }
        }

        /// The parent's servers, for a child of a provider that scopes none:
        /// a shared one is the same connection, an `isolate` one a fresh
        /// server for the child's run.
        fn inherited(servers: Vec<McpServer>) -> Self {
            let (per_run, shared): (Vec<_>, Vec<_>) = servers.into_iter().partition(|server| server.config().isolate);
            McpMounts { shared, per_run: per_run.iter().map(|server| server.config().clone()).collect() }
        }

        /// The servers' names, in mount order.
        pub(crate) fn names(&self) -> Vec<String> {
            let shared = self.shared.iter().map(|server| &server.config().name);
            shared.chain(self.per_run.iter().map(|config| &config.name)).cloned().collect()
        }

        /// Only the servers `names` lists; a name not among them is refused.
        fn select(&self, names: &[String]) -> Result<McpMounts, LaunchError> {
            let available = self.names();
            crate::providers::check_mcp_names(names, available.iter().map(String::as_str))?;
            let listed = |name: &String| names.contains(name);
            Ok(McpMounts {
                shared: self.shared.iter().filter(|server| listed(&server.config().name)).cloned().collect(),
                per_run: self.per_run.iter().filter(|config| listed(&config.name)).cloned().collect(),
            })
        }

        /// Every server, shared ones as they stand, per-run ones not started.
        pub(crate) fn servers(&self) -> Vec<McpServer> {
            let per_run = self.per_run.iter().cloned().map(McpServer::new);
            self.shared.iter().cloned().chain(per_run).collect()
        }

        /// Adds each server's tools to `toolset`, starting what is not yet
        /// running (its process counted in `live`, the runtime's); the per-run
        /// servers it started, which the run owns.
        pub(crate) async fn mount(
            &self,
            toolset: &mut Toolset,
            cwd: &Path,
            live: &Arc<LiveCounters>,
            cancel: &CancellationToken,
        ) -> Result<RunMounts, LaunchError> {
            if self.shared.is_empty() && self.per_run.is_empty() {
                return Ok(RunMounts::default());
            }
            let owned: Vec<McpServer> =
                self.per_run.iter().map(|config| McpServer::in_dir(config.clone(), Some(cwd.to_path_buf()))).collect();
            for server in self.shared.iter().chain(&owned) {
                server.count_in(live);
                let tools = tokio::select! {
                    tools = server.tools_for_run() => tools,
                    () = cancel.cancelled() => {
                        close_all(&owned).await;
                        return Err(LaunchError::Aborted);
                    }
                };
                toolset.mount_mcp(server, tools);
            }
            Ok(RunMounts(owned))
        }

        /// Closes the shared servers (the provider stops).
        pub(crate) async fn shutdown(&self) {
            close_all(&self.shared).await;
        }
    }

    /// The per-run servers one run started, which it closes at its dispose.
    #[derive(Clone, Debug, Default)]
    pub(crate) struct RunMounts(Vec<McpServer>);

    impl RunMounts {
        pub(crate) async fn close(&self) {
            close_all(&self.0).await;
        }
    }

    /// Closes `servers` together, each reaped with its process group.
    async fn close_all(servers: &[McpServer]) {
        futures_util::future::join_all(servers.iter().map(McpServer::shutdown)).await;
    }
}

#[cfg(not(feature = "mcp-client"))]
mod off {
    use std::path::Path;
    use std::sync::Arc;

    use tokio_util::sync::CancellationToken;

    use crate::agent::Toolset;
    use crate::live::LiveCounters;
    use crate::seam::{LaunchError, StartRequest};

    /// No MCP tool is mounted without the client; the tool filter's check
    /// needs the prefix all the same.
    pub(crate) const MCP_TOOL_PREFIX: &str = "mcp__";

    /// Nothing to mount.
    #[derive(Debug, Default)]
    pub(crate) struct McpMounts;

    impl McpMounts {
        /// Refuses a request that names a server: there are none.
        pub(crate) fn for_child(_: Option<&Arc<McpMounts>>, request: &StartRequest) -> Result<Arc<Self>, LaunchError> {
            match request.mcp_servers.iter().flatten().next() {
                Some(name) => Err(LaunchError::Invalid {
                    field: "mcp_servers",
                    reason: format!(
                        "the child has no MCP server named {name:?} (MCP needs the crate's \"mcp-client\" feature)"
                    ),
                }),
                None => Ok(Arc::new(McpMounts)),
            }
        }

        pub(crate) fn names(&self) -> Vec<String> {
            Vec::new()
        }

        pub(crate) async fn mount(
            &self,
            _: &mut Toolset,
            _: &Path,
            _: &Arc<LiveCounters>,
            _: &CancellationToken,
        ) -> Result<RunMounts, LaunchError> {
            Ok(RunMounts)
        }

        pub(crate) async fn shutdown(&self) {}
    }

    /// No server to close.
    #[derive(Clone, Debug, Default)]
    pub(crate) struct RunMounts;

    impl RunMounts {
        pub(crate) async fn close(&self) {}
    }
}
