//! `[mcp_servers.NAME]`: the MCP servers children mount, and each
//! provider's `mcp_servers = ["NAME", …]` naming which.
//!
//! ```toml
//! [mcp_servers.files]
//! command = "mcp-files"
//! args = ["--root", "${HOME}/notes"]
//! env = { FILES_MODE = "read-only" }
//! inherit_env = ["FILES_*"]
//! isolate = false        # one connection shared by the provider's runs
//! timeout = "30s"        # each tools/call
//!
//! [providers.cheap]
//! kind = "spawn"
//! mcp_servers = ["files"]
//! ```
//!
//! A `spawn` or `fork` provider without `mcp_servers` gives its children
//! their parent's servers; with it (`[]` too) exactly those. An `acp`
//! provider passes its list to the agent in `session/new`, and the agent
//! starts them itself: such a server takes only `command`, `args` and
//! `env` (its variables are sent as given; nothing is inherited for it,
//! and the agent, not the runtime, bounds its calls).
//!
//! Checked when the file is read: durations have units, the name fits a
//! tool name (`mcp__NAME__TOOL`), and every name a provider lists has a
//! table. Resolved then too, but kept with the server (and so with each
//! provider mounting it) rather than failing the file: the command is a
//! file or on `PATH`, `${VAR}` is set.
//! A streamable HTTP server has a `url` and `headers` whose values may use
//! `${VAR}` (an `Authorization: Bearer ${TOKEN}`, say), and takes the
//! bounds and `isolate` as a stdio one does; an `acp` provider hands it to
//! an agent that advertises `mcpCapabilities.http` (else the provider is
//! refused when it starts).

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use indexmap::IndexMap;
use serde::Deserialize;
use toml::Spanned;

use super::bounds::quoted;
use super::values::{check_written_http, expand, find_command, http_headers, http_url};
use super::{parse_positive_duration, ConfigError, Source};

/// One `[mcp_servers.NAME]` table.
#[derive(Debug, Deserialize)]
pub(super) struct McpServerTable {
    command: Option<Spanned<String>>,
    args: Option<Vec<Spanned<String>>>,
    env: Option<IndexMap<String, Spanned<String>>>,
    inherit_env: Option<Vec<String>>,
    cwd: Option<Spanned<String>>,
    isolate: Option<bool>,
    timeout: Option<Spanned<String>>,
    initialize_timeout: Option<Spanned<String>>,
    max_result_bytes: Option<Spanned<usize>>,
    url: Option<Spanned<String>>,
    headers: Option<Spanned<IndexMap<String, Spanned<String>>>>,
}

/// A server as resolved when the file was read.
#[derive(Clone, Debug)]
#[cfg_attr(not(feature = "mcp-client"), allow(dead_code))]
pub(super) struct McpServerEntry {
    pub(super) name: String,
    /// The program; `None` for a streamable HTTP server.
    pub(super) command: Option<PathBuf>,
    /// A streamable HTTP server's URL and headers, `${VAR}`-expanded.
    pub(super) http: Option<(String, Vec<(String, String)>)>,
    pub(super) args: Vec<String>,
    pub(super) env: Vec<(String, String)>,
    pub(super) inherit_env: Vec<String>,
    pub(super) cwd: Option<PathBuf>,
    pub(super) isolate: bool,
    pub(super) timeout: Option<Duration>,
    pub(super) initialize_timeout: Option<Duration>,
    pub(super) max_result_bytes: Option<usize>,
    /// What the environment lacks for it (an unset `${VAR}`, a program not
    /// on `PATH`): a provider mounting it has this problem too.
    pub(super) problem: Option<ConfigError>,
}

/// Checks and resolves every table, each error at its place.
pub(super) fn resolve(
    source: &Source<'_>,
    tables: IndexMap<String, Spanned<McpServerTable>>,
) -> Result<Vec<McpServerEntry>, ConfigError> {
    let mut servers = Vec::with_capacity(tables.len());
    for (name, table) in tables {
        let span = table.span();
        let table = table.into_inner();
        if !crate::agent::valid_server_name(&name) {
            let message = format!(
                "MCP server name {name:?} must be letters, digits, `_` and `-` without `__` (it is part of tool names)"
            );
            return Err(source.error(Some(span), message));
        }
        match (&table.command, &table.url) {
            (Some(_), Some(url)) => {
                return Err(
                    source.error(Some(url.span()), format!("MCP server {name:?} has both a `command` and a `url`"))
                )
            }
            (None, None) => {
                return Err(source.error(Some(span), format!("MCP server {name:?} needs a `command` or a `url`")))
            }
            (Some(_), None) => {
                if let Some(headers) = &table.headers {
                    return Err(source.error(Some(headers.span()), "`headers` go with a `url`, not a `command`"));
                }
            }
            (None, Some(url)) => {
                check_http_keys(source, &name, url, &table)?;
                let headers = table.headers.as_ref().map(Spanned::get_ref);
                check_written_http(source, Some(url), headers, crate::agent::mcp_header_problem)?;
            }
        }
        // What the environment says is kept with the server, not the file.
        let (command_path, http, args, env, cwd, problem) = match environment(source, &table) {
            Ok((command, http, args, env, cwd)) => (command, http, args, env, cwd, None),
            Err(problem) => (None, None, Vec::new(), Vec::new(), None, Some(problem)),
        };
        let duration = |key: &str, value: &Option<Spanned<String>>| -> Result<Option<Duration>, ConfigError> {
            let Some(value) = value else { return Ok(None) };
            parse_positive_duration(value.get_ref())
                .map(Some)
                .map_err(|e| source.error(Some(value.span()), format!("`{key}`: {e}")))
        };
        let max_result_bytes = match &table.max_result_bytes {
            Some(bytes) if *bytes.get_ref() == 0 => {
                return Err(source.error(Some(bytes.span()), "`max_result_bytes` must be at least 1"))
            }
            bytes => bytes.as_ref().map(|bytes| *bytes.get_ref()),
        };
        servers.push(McpServerEntry {
            command: command_path,
            http,
            args,
            env,
            inherit_env: table.inherit_env.unwrap_or_default(),
            cwd,
            isolate: table.isolate.unwrap_or(false),
            timeout: duration("timeout", &table.timeout)?,
            initialize_timeout: duration("initialize_timeout", &table.initialize_timeout)?,
            max_result_bytes,
            name,
            problem,
        });
    }
    Ok(servers)
}

/// The program (or URL and headers), arguments, variables and directory a
/// server's table names, `${VAR}`-expanded and looked up.
type Environment =
    (Option<PathBuf>, Option<(String, Vec<(String, String)>)>, Vec<String>, Vec<(String, String)>, Option<PathBuf>);

fn environment(source: &Source<'_>, table: &McpServerTable) -> Result<Environment, ConfigError> {
    let command = match &table.command {
        Some(command) => {
            let text = expand(source, command.get_ref(), command.span())?;
            let path = find_command(&text).ok_or_else(|| {
                source.error(Some(command.span()), format!("command {text:?} is not a file and not on PATH"))
            })?;
            Some(path)
        }
        None => None,
    };
    let http = match &table.url {
        Some(url) => {
            let text = http_url(source, "url", url)?;
            let headers = match &table.headers {
                Some(headers) => http_headers(source, headers.get_ref(), crate::agent::mcp_header_problem)?,
                None => Vec::new(),
            };
            Some((text, headers))
        }
        None => None,
    };
    let mut args = Vec::new();
    for arg in table.args.iter().flatten() {
        args.push(expand(source, arg.get_ref(), arg.span())?);
    }
    let mut env = Vec::new();
    for (key, value) in table.env.iter().flatten() {
        env.push((key.clone(), expand(source, value.get_ref(), value.span())?));
    }
    let cwd = match &table.cwd {
        Some(cwd) => Some(PathBuf::from(expand(source, cwd.get_ref(), cwd.span())?)),
        None => None,
    };
    Ok((command, http, args, env, cwd))
}

/// A `url` table takes none of the stdio keys.
fn check_http_keys(
    source: &Source<'_>,
    name: &str,
    url: &Spanned<String>,
    table: &McpServerTable,
) -> Result<(), ConfigError> {
    let stdio_only = [
        ("args", table.args.is_some()),
        ("env", table.env.is_some()),
        ("inherit_env", table.inherit_env.is_some()),
        ("cwd", table.cwd.is_some()),
    ];
    if let Some((key, _)) = stdio_only.iter().find(|(_, set)| *set) {
        return Err(
            source.error(Some(url.span()), format!("MCP server {name:?} has a `url`: `{key}` is for a `command`"))
        );
    }
    Ok(())
}

/// The names a provider lists, each checked against the tables.
pub(super) fn check_listed(
    source: &Source<'_>,
    provider: &str,
    listed: Option<&Spanned<Vec<Spanned<String>>>>,
    servers: &[McpServerEntry],
) -> Result<Vec<String>, ConfigError> {
    let Some(listed) = listed else { return Ok(Vec::new()) };
    // Sets, not scans: a generated file may list a thousand servers in
    // each of a thousand providers.
    let defined: HashSet<&str> = servers.iter().map(|server| server.name.as_str()).collect();
    let mut seen = HashSet::new();
    let mut names = Vec::new();
    for name in listed.get_ref() {
        if !defined.contains(name.get_ref().as_str()) {
            let message = format!(
                "provider {provider:?} mounts MCP server {}, which no [mcp_servers] table defines",
                quoted(name.get_ref())
            );
            return Err(source.error(Some(name.span()), message));
        }
        if !seen.insert(name.get_ref().as_str()) {
            let message = format!("provider {provider:?} lists MCP server {:?} twice", name.get_ref());
            return Err(source.error(Some(name.span()), message));
        }
        names.push(name.get_ref().clone());
    }
    Ok(names)
}

/// An `acp` provider's servers are started (or connected to) by its
/// agent, which is sent only `command`, `args` and `env` (`url` and
/// `headers`): a setting the agent would not see is refused rather than
/// ignored.
pub(super) fn check_acp_listed(
    source: &Source<'_>,
    provider: &str,
    listed: Option<&Spanned<Vec<Spanned<String>>>>,
    servers: &[McpServerEntry],
) -> Result<(), ConfigError> {
    let by_name: HashMap<&str, &McpServerEntry> = servers.iter().map(|server| (server.name.as_str(), server)).collect();
    for name in listed.map(Spanned::get_ref).into_iter().flatten() {
        let Some(server) = by_name.get(name.get_ref().as_str()) else { continue };
        let unsent = [
            (!server.inherit_env.is_empty(), "inherit_env"),
            (server.cwd.is_some(), "cwd"),
            (server.isolate, "isolate"),
            (server.timeout.is_some(), "timeout"),
            (server.initialize_timeout.is_some(), "initialize_timeout"),
            (server.max_result_bytes.is_some(), "max_result_bytes"),
        ];
        if let Some((_, key)) = unsent.iter().find(|(set, _)| *set) {
            let message = match server.http {
                Some(_) => format!(
                    "acp provider {provider:?} passes MCP server {:?} to its agent, which connects to it with \
                     `url` and `headers` only: `{key}` would not apply",
                    server.name
                ),
                None => format!(
                    "acp provider {provider:?} passes MCP server {:?} to its agent, which starts it with \
                     `command`, `args` and `env` only: `{key}` would not apply (list the variables it needs in \
                     `env`)",
                    server.name
                ),
            };
            return Err(source.error(Some(name.span()), message));
        }
    }
    Ok(())
}
