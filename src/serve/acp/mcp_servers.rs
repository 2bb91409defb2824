//! The MCP servers an ACP client hands a session in `session/new`
//! (`mcpServers`): stdio servers started in the session's cwd (with the
//! child environment's scrub, plus the variables the client sent) and
//! streamable HTTP servers (advertised as `mcpCapabilities.http`). Their
//! tools join the session's as `mcp__NAME__TOOL`, so its subagents inherit
//! them like any parent agent's; they start together when the session is
//! created (at most 32), and one that does not start within its 10 s is
//! left out (logged) while the session goes on. They are closed, their processes
//! reaped, when the agent exits. SSE servers are refused, and so is
//! every server in a build without the `mcp` feature.

use std::path::Path;
use std::sync::Arc;

use agent_client_protocol::v1::schema::McpServer as AcpMcpServer;

use crate::agent::Tool;

/// The most servers one session starts.
#[cfg(feature = "mcp-client")]
const MAX_SERVERS: usize = 32;

/// The servers of one session, started (each that could be), and their
/// tools; a list that cannot be honoured is refused before any starts.
#[cfg(feature = "mcp-client")]
pub(super) async fn mount(
    servers: &[AcpMcpServer],
    cwd: &Path,
) -> Result<(Vec<crate::agent::McpServer>, Vec<Arc<dyn Tool>>), String> {
    use crate::agent::{McpServerConfig, McpTransport};

    if servers.len() > MAX_SERVERS {
        return Err(format!("{} MCP servers for one session; at most {MAX_SERVERS}", servers.len()));
    }
    let mut configs: Vec<McpServerConfig> = Vec::with_capacity(servers.len());
    for server in servers {
        let (name, transport) = match server {
            AcpMcpServer::Stdio(stdio) => {
                let env = stdio.env.iter().map(|var| (var.name.clone(), var.value.clone())).collect();
                let transport = McpTransport::Stdio {
                    command: stdio.command.clone(),
                    args: stdio.args.clone(),
                    env,
                    inherit_env: Vec::new(),
                    cwd: None,
                };
                (&stdio.name, transport)
            }
            AcpMcpServer::Http(http) => {
                let headers = http.headers.iter().map(|header| (header.name.clone(), header.value.clone())).collect();
                (&http.name, McpTransport::Http { url: http.url.clone(), headers })
            }
            AcpMcpServer::Sse(sse) => {
                return Err(format!(
                    "MCP server {:?} uses SSE, which this agent does not speak (streamable HTTP or stdio)",
                    sse.name
                ))
            }
            _ => return Err("an MCP server of a transport this agent does not speak".to_owned()),
        };
        if !crate::agent::valid_server_name(name) {
            return Err(format!(
                "MCP server name {name:?} must be letters, digits, `_` and `-` without `__` (it is part of tool names)"
            ));
        }
        if configs.iter().any(|config| config.name == *name) {
            return Err(format!("MCP server {name:?} is listed twice"));
        }
        configs.push(McpServerConfig::over(name.clone(), transport));
    }
    Ok(crate::agent::start_mcp_servers(configs, cwd).await)
}

/// A build without the MCP client refuses what it could not honour.
#[cfg(not(feature = "mcp-client"))]
pub(super) async fn mount(servers: &[AcpMcpServer], _cwd: &Path) -> Result<(Vec<()>, Vec<Arc<dyn Tool>>), String> {
    match servers.is_empty() {
        true => Ok((Vec::new(), Vec::new())),
        false => Err("this agent was built without MCP servers (the crate's \"mcp-client\" feature)".to_owned()),
    }
}
