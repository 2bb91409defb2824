//! The MCP servers an ACP child is given: [`AcpConfig::mcp_servers`]
//! travel in `session/new`'s `mcpServers`, and the agent connects to them
//! itself.
//!
//! **The agent spawns them, not the runtime.** A stdio server is started
//! by the ACP agent, with whatever environment the agent gives it: the
//! runtime's child-environment scrub (the allowlist and `inherit_env`)
//! covers the agent, not what the agent starts. So a server's variables
//! are passed explicitly, as its `env` list, and nothing is inherited on
//! its behalf; its bounds (timeouts, result size) are the agent's to keep.
//!
//! **Transports**: every agent takes stdio servers; an HTTP server is
//! passed only to an agent whose `initialize` answer advertises
//! `agentCapabilities.mcpCapabilities.http` — [`AcpProvider::new`] refuses
//! the configuration otherwise, before any run.
//!
//! **Per run**: a start request's `mcp_servers` picks a subset of the
//! provider's servers by name; a name the provider does not list is
//! refused before anything is spawned.
//!
//! ```
//! use subagents::providers::{AcpConfig, AcpMcpServer};
//!
//! let mut config = AcpConfig::new("agent", "/usr/bin/agent", Vec::new());
//! let files = AcpMcpServer::stdio("files", "/usr/bin/mcp-files", vec!["/srv".to_owned()]);
//! config.mcp_servers.push(files.with_env("FILES_MODE", "read-only"));
//! assert_eq!(config.mcp_servers[0].name(), "files");
//! ```
//!
//! [`AcpConfig::mcp_servers`]: super::AcpConfig::mcp_servers
//! [`AcpProvider::new`]: super::AcpProvider::new

use std::path::PathBuf;

use agent_client_protocol::v1::schema::{EnvVariable, HttpHeader, McpServer, McpServerHttp, McpServerStdio};

use crate::seam::{LaunchError, StartRequest};

/// One MCP server an ACP agent connects to for its sessions.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcpMcpServer {
    /// A program the agent starts and speaks to over its stdio.
    Stdio {
        /// Its name, as the agent shows its tools.
        name: String,
        /// The program (an absolute path: the agent resolves nothing).
        command: PathBuf,
        /// Its arguments.
        args: Vec<String>,
        /// Every variable it is given, explicitly.
        env: Vec<(String, String)>,
    },
    /// A streamable HTTP server (only for an agent advertising `mcpCapabilities.http`).
    Http {
        /// Its name, as the agent shows its tools.
        name: String,
        /// Its URL.
        url: String,
        /// Headers the agent sends with each request.
        headers: Vec<(String, String)>,
    },
}

impl AcpMcpServer {
    /// A stdio server: `command args…`, no variables.
    pub fn stdio(name: impl Into<String>, command: impl Into<PathBuf>, args: Vec<String>) -> Self {
        AcpMcpServer::Stdio { name: name.into(), command: command.into(), args, env: Vec::new() }
    }

    /// A streamable HTTP server at `url`, no headers.
    pub fn http(name: impl Into<String>, url: impl Into<String>) -> Self {
        AcpMcpServer::Http { name: name.into(), url: url.into(), headers: Vec::new() }
    }

    /// This stdio server with `key=value` in its environment (an HTTP
    /// server is returned as it is).
    pub fn with_env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        if let AcpMcpServer::Stdio { env, .. } = &mut self {
            env.push((key.into(), value.into()));
        }
        self
    }

    /// This HTTP server with `name: value` among its headers (a stdio
    /// server is returned as it is).
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        if let AcpMcpServer::Http { headers, .. } = &mut self {
            headers.push((name.into(), value.into()));
        }
        self
    }

    /// Its name.
    pub fn name(&self) -> &str {
        match self {
            AcpMcpServer::Stdio { name, .. } | AcpMcpServer::Http { name, .. } => name,
        }
    }

    /// The protocol's shape of it, for `session/new`.
    fn to_protocol(&self) -> McpServer {
        match self {
            AcpMcpServer::Stdio { name, command, args, env } => {
                let env = env.iter().map(|(key, value)| EnvVariable::new(key, value)).collect();
                McpServer::Stdio(McpServerStdio::new(name, command).args(args.clone()).env(env))
            }
            AcpMcpServer::Http { name, url, headers } => {
                let headers = headers.iter().map(|(key, value)| HttpHeader::new(key, value)).collect();
                McpServer::Http(McpServerHttp::new(name, url).headers(headers))
            }
        }
    }
}

/// The first server `agent_takes_http` rules out, for the probe to refuse.
pub(super) fn refused_by_agent(servers: &[AcpMcpServer], agent_takes_http: bool) -> Option<&AcpMcpServer> {
    servers.iter().find(|server| matches!(server, AcpMcpServer::Http { .. }) && !agent_takes_http)
}

/// The servers one run's `session/new` carries: all of `servers`, or the
/// subset the request names (a name not among them is the error).
pub(super) fn for_run(servers: &[AcpMcpServer], request: &StartRequest) -> Result<Vec<McpServer>, LaunchError> {
    let Some(names) = &request.mcp_servers else {
        return Ok(servers.iter().map(AcpMcpServer::to_protocol).collect());
    };
    crate::providers::check_mcp_names(names, servers.iter().map(AcpMcpServer::name))?;
    let named = names.iter().filter_map(|name| servers.iter().find(|server| server.name() == name));
    Ok(named.map(AcpMcpServer::to_protocol).collect())
}
