//! The MCP servers a `process` child mounts (feature `mcp`): chosen as an
//! in-process child's are — the provider's list when it scopes them, else
//! the parent agent's servers, narrowed by the request's `mcp_servers` —
//! and sent in `initialize`, so the child runtime starts its own copies
//! (one per child, closed when it exits). The parent resolves a stdio
//! server's `inherit_env` against its own environment and sends what it
//! finds as `env` (the child's environment was scrubbed, so it could not).

use std::time::Duration;

use crate::agent::{Agent, McpServerConfig, McpTransport};
use crate::child_process::inherited;
use crate::seam::{LaunchError, StartRequest};
use crate::wire::process::WireMcpServer;

/// What one child mounts, on the wire.
pub(super) fn for_child(
    scoped: Option<&[McpServerConfig]>,
    request: &StartRequest,
) -> Result<Vec<WireMcpServer>, LaunchError> {
    let servers: Vec<McpServerConfig> = match scoped {
        Some(scoped) => scoped.to_vec(),
        None => {
            let parent = request.parent.agent.as_ref().and_then(|agent| agent.downcast::<Agent>());
            let servers = parent.map(|agent| agent.toolset().mcp_servers()).unwrap_or_default();
            servers.iter().map(|server| server.config().clone()).collect()
        }
    };
    let servers = match &request.mcp_servers {
        None => servers,
        Some(names) => {
            crate::providers::check_mcp_names(names, servers.iter().map(|server| server.name.as_str()))?;
            servers.into_iter().filter(|server| names.contains(&server.name)).collect()
        }
    };
    Ok(servers.iter().map(to_wire).collect())
}

fn to_wire(config: &McpServerConfig) -> WireMcpServer {
    let mut wire = WireMcpServer {
        name: config.name.clone(),
        command: None,
        args: Vec::new(),
        env: Vec::new(),
        cwd: None,
        url: None,
        headers: Vec::new(),
        initialize_timeout_ms: millis(config.initialize_timeout),
        call_timeout_ms: millis(config.call_timeout),
        max_result_bytes: config.max_result_bytes,
    };
    match &config.transport {
        McpTransport::Stdio { command, args, env, inherit_env, cwd } => {
            // The allowlist reaches the child anyway; the listed names only from here.
            let listed = std::env::vars().filter(|(name, _)| !inherited(name, &[]) && inherited(name, inherit_env));
            wire.env = listed.chain(env.iter().cloned()).collect();
            (wire.command, wire.args, wire.cwd) = (Some(command.clone()), args.clone(), cwd.clone());
        }
        McpTransport::Http { url, headers } => (wire.url, wire.headers) = (Some(url.clone()), headers.clone()),
    }
    wire
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
