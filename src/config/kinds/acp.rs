//! `kind = "acp"`: a child process over the Agent Client Protocol (Codex,
//! Claude Code, Gemini, OpenCode through their ACP adapters).
//!
//! ```toml
//! [providers.codex]
//! kind = "acp"
//! command = "codex-acp"
//! env = { OPENAI_API_KEY = "${OPENAI_API_KEY}" }
//! permission = "ask"
//! permission_rules = [
//!   { kind = "read", permission = "allow" },
//!   { kind = "edit", path = "/srv/repo", permission = "allow" },
//!   { title = "*rm -rf*", permission = "reject" },
//! ]
//! reuse = "pooled"
//! pool = { size = 2 }
//! ```
//!
//! `permission` is what the agent's permission requests get when no rule
//! of `permission_rules` matches (`reject` unless set); the first rule
//! that matches decides. `ask` goes to the nearest door with someone to
//! ask, for `permission_timeout` (ten minutes unless set); see
//! [`crate::seam::Rules`].
//!
//! What it advertises is learnt from the agent's `initialize` when it is
//! built, so `providers list` cannot say; `providers check` does.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;
use futures_util::FutureExt;
use serde::Deserialize;
use toml::de::DeValue;
use toml::Spanned;

use super::child_process::{self, ChildProcess};
use super::{BuildFailure, Building, Checked, Checking, Home, KindCapabilities};
use crate::config::keys::{self, fields_of, TableKeys};
use crate::config::mcp_servers::check_acp_listed;
use crate::config::permissions::{self, PermissionName};
use crate::config::values::{expand, find_command, not_a_directory};
use crate::config::{parse_duration, ConfigError};
use crate::seam::{Policy, Provider, Rules};

/// The homes this file keeps.
pub(super) static HOMES: &[&Home] = &[&HOME];

static HOME: Home = Home {
    name: "acp",
    what: "an acp provider",
    keys: || [fields_of::<Table>(), child_process::keys()].concat(),
    check,
    capabilities: CAPABILITIES,
};

#[cfg(feature = "acp")]
const CAPABILITIES: KindCapabilities = KindCapabilities::FromAgent;
#[cfg(not(feature = "acp"))]
const CAPABILITIES: KindCapabilities = KindCapabilities::NotBuilt("acp");

#[derive(Debug, Deserialize)]
#[cfg_attr(not(feature = "acp"), allow(dead_code))]
struct Table {
    command: Option<Spanned<String>>,
    args: Option<Spanned<Vec<Spanned<String>>>>,
    mcp_servers: Option<Spanned<Vec<Spanned<String>>>>,
    permission: Option<Spanned<PermissionName>>,
    /// Named here so it is a key of the kind; its entries are read from
    /// the raw table ([`permissions::rules`]), each at its own place.
    #[allow(dead_code)]
    permission_rules: Option<Spanned<toml::Value>>,
    permission_timeout: Option<Spanned<String>>,
    reuse: Option<Spanned<ReuseName>>,
    /// Read as a [`PoolTable`] once its keys are checked.
    pool: Option<Spanned<toml::Value>>,
    dispose_idle_eof_grace: Option<Spanned<String>>,
    template_dir: Option<Spanned<String>>,
    keep_run_dirs: Option<Spanned<bool>>,
    run_dir_root: Option<Spanned<String>>,
}

/// `pool = { … }` of a pooled provider (`reuse = "pooled"`).
#[derive(Debug, Default, Deserialize)]
#[serde(expecting = "a table such as { size = 2 }")]
struct PoolTable {
    size: Option<usize>,
    sessions_per_process: Option<usize>,
    max_runs_per_process: Option<usize>,
    idle_timeout: Option<String>,
    cancel_grace: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum ReuseName {
    PerRun,
    Pooled,
}

/// A pooled provider's pool, its durations read.
#[derive(Debug, Default)]
#[cfg_attr(not(feature = "acp"), allow(dead_code))]
struct Pool {
    size: Option<usize>,
    sessions_per_process: Option<usize>,
    max_runs_per_process: Option<usize>,
    idle_timeout: Option<Duration>,
    cancel_grace: Option<Duration>,
}

#[derive(Debug)]
#[cfg_attr(not(feature = "acp"), allow(dead_code))]
struct Acp {
    table: Table,
    /// `permission` and `permission_rules`, read.
    rules: Rules,
    permission_timeout: Option<Duration>,
    child: ChildProcess,
    pool: Option<Pool>,
    dispose_idle_eof_grace: Option<Duration>,
    /// Beside which relative templates are read: the file's directory.
    file_dir: Option<PathBuf>,
    /// Resolved: the program, its arguments, its run directories.
    command: Option<PathBuf>,
    args: Vec<String>,
    template_dir: Option<PathBuf>,
    run_dir_root: Option<PathBuf>,
}

fn check(checking: &Checking<'_, '_>, table: Spanned<DeValue<'_>>) -> Result<Box<dyn Checked>, ConfigError> {
    let source = checking.source;
    let child = ChildProcess::check(checking, &table)?;
    let pool_value = table.get_ref().get("pool").cloned();
    let rules_value = table.get_ref().get("permission_rules").cloned();
    let table: Table = keys::read(source, table)?;
    let permission_timeout = checking.duration("permission_timeout", &table.permission_timeout)?;
    if permission_timeout.is_some_and(|timeout| timeout.is_zero()) {
        let span = table.permission_timeout.as_ref().map(Spanned::span);
        return Err(source.error(span, "`permission_timeout` must be longer than zero"));
    }
    let otherwise = table.permission.as_ref().map_or(Policy::Reject, |name| Policy::from(*name.get_ref()));
    let rules = permissions::rules(source, rules_value, otherwise)?;
    if table.command.is_none() {
        return Err(checking.needs("acp", "a `command`"));
    }
    let dispose_idle_eof_grace = checking.duration("dispose_idle_eof_grace", &table.dispose_idle_eof_grace)?;
    let pooled = table.reuse.as_ref().is_some_and(|reuse| *reuse.get_ref() == ReuseName::Pooled);
    let pool = match (pool_value, &table.pool) {
        (Some(value), Some(spanned)) => {
            if !pooled {
                return Err(source.error(Some(spanned.span()), "`pool` applies only with reuse = \"pooled\""));
            }
            if !value.get_ref().is_table() {
                return Err(
                    source.error(Some(spanned.span()), "an acp provider's `pool` is a table, such as { size = 2 }")
                );
            }
            let pool_keys =
                TableKeys { what: "an acp `pool`", place: "an acp `pool`", keys: fields_of::<PoolTable>().to_vec() };
            keys::check(source, &value, &pool_keys, &[])?;
            Some(pool(checking, spanned.span(), keys::read(source, value)?)?)
        }
        _ if pooled => Some(Pool::default()),
        _ => None,
    };
    // `{run_dir}` is written in the file: the keys about it need it there.
    let names_run_dir = table
        .args
        .iter()
        .flat_map(|args| args.get_ref())
        .map(|arg| arg.get_ref())
        .chain(child.env_written())
        .any(|text| text.contains("{run_dir}"));
    let run_dir_keys = [
        ("template_dir", table.template_dir.as_ref().map(Spanned::span)),
        ("keep_run_dirs", table.keep_run_dirs.as_ref().map(Spanned::span)),
        ("run_dir_root", table.run_dir_root.as_ref().map(Spanned::span)),
    ];
    if let Some((key, span)) =
        run_dir_keys.into_iter().find_map(|(key, span)| Some((key, span?))).filter(|_| !names_run_dir)
    {
        let message = format!(
            "`{key}` applies to the directory `{{run_dir}}` names, and no `args` or `env` value of {:?} names it",
            checking.name
        );
        return Err(source.error(Some(span), message));
    }
    if let Some(span) = child.workspace_span().filter(|_| pooled) {
        let message =
            "workspace = \"worktree\" needs reuse = \"per-run\": a pooled agent process outlives each run's worktree";
        return Err(source.error(Some(span), message));
    }
    check_acp_listed(source, checking.name, table.mcp_servers.as_ref(), checking.mcp_servers)?;
    let file_dir = Path::new(source.name).parent().map(Path::to_path_buf);
    Ok(Box::new(Acp {
        table,
        rules,
        permission_timeout,
        child,
        pool,
        dispose_idle_eof_grace,
        file_dir,
        command: None,
        args: Vec::new(),
        template_dir: None,
        run_dir_root: None,
    }))
}

fn pool(checking: &Checking<'_, '_>, span: std::ops::Range<usize>, table: PoolTable) -> Result<Pool, ConfigError> {
    let source = checking.source;
    if [table.size, table.sessions_per_process, table.max_runs_per_process].contains(&Some(0)) {
        return Err(source.error(Some(span), "pool sizes must be at least 1"));
    }
    let duration = |key: &str, value: &Option<String>| -> Result<Option<Duration>, ConfigError> {
        let parsed = value.as_deref().map(parse_duration).transpose();
        parsed.map_err(|e| source.error(Some(span.clone()), format!("pool `{key}`: {e}")))
    };
    Ok(Pool {
        size: table.size,
        sessions_per_process: table.sessions_per_process,
        max_runs_per_process: table.max_runs_per_process,
        idle_timeout: duration("idle_timeout", &table.idle_timeout)?,
        cancel_grace: duration("cancel_grace", &table.cancel_grace)?,
    })
}

impl Checked for Acp {
    fn resolve(&mut self, checking: &Checking<'_, '_>) -> Result<(), ConfigError> {
        let source = checking.source;
        let command = self.table.command.as_ref().expect("checked");
        let text = expand(source, command.get_ref(), command.span())?;
        let found = find_command(&text).ok_or_else(|| {
            source.error(Some(command.span()), format!("command {text:?} is not a file and not on PATH"))
        })?;
        self.command = Some(found);
        self.child.resolve(checking)?;
        self.args.clear();
        for arg in self.table.args.iter().flat_map(|args| args.get_ref()) {
            self.args.push(expand(source, arg.get_ref(), arg.span())?);
        }
        // A relative template is read beside the file, as its examples ship.
        if let Some(value) = &self.table.template_dir {
            let path = PathBuf::from(expand(source, value.get_ref(), value.span())?);
            let path = match &self.file_dir {
                Some(dir) if path.is_relative() => dir.join(path),
                _ => path,
            };
            if !path.is_dir() {
                return Err(source.error(Some(value.span()), format!("template_dir {path:?} is not a directory")));
            }
            self.template_dir = Some(path);
        }
        // Made when the first agent starts: what stands in its way is named now.
        if let Some(value) = &self.table.run_dir_root {
            let root = PathBuf::from(expand(source, value.get_ref(), value.span())?);
            if let Some(problem) = not_a_directory(&root) {
                return Err(source.error(Some(value.span()), format!("`run_dir_root` {problem}")));
            }
            self.run_dir_root = Some(root);
        }
        Ok(())
    }

    fn mcp_servers(&self) -> Option<&Spanned<Vec<Spanned<String>>>> {
        self.table.mcp_servers.as_ref()
    }

    fn build<'a>(&'a self, building: Building<'a>) -> LocalBoxFuture<'a, Result<Arc<dyn Provider>, BuildFailure>> {
        self.provider(building).boxed_local()
    }
}

impl Acp {
    #[cfg(feature = "acp")]
    async fn provider(&self, building: Building<'_>) -> Result<Arc<dyn Provider>, BuildFailure> {
        use crate::providers::{AcpConfig, AcpMcpServer, AcpProvider, PoolConfig, Reuse, RunDirs};
        let command = self.command.clone().ok_or("its command was not resolved")?;
        let mut config = AcpConfig::new(building.name, command, self.args.clone());
        config.child = self.child.config();
        config.workspace = self.child.workspaces().await?;
        config.run_dirs = RunDirs {
            root: self.run_dir_root.clone(),
            template: self.template_dir.clone(),
            keep: self.table.keep_run_dirs.as_ref().is_some_and(|keep| *keep.get_ref()),
        };
        config.mcp_servers = building
            .config
            .mcp_server_entries(building.mcp_servers)
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
        config.permission = self.rules.clone();
        if let Some(timeout) = self.permission_timeout {
            config.permission_timeout = timeout;
        }
        if let Some(grace) = self.dispose_idle_eof_grace {
            config.dispose_idle_eof_grace = grace;
        }
        if let Some(settings) = &self.pool {
            let mut pool = PoolConfig::default();
            pool.size = settings.size.unwrap_or(pool.size);
            pool.sessions_per_process = settings.sessions_per_process.unwrap_or(pool.sessions_per_process);
            pool.max_runs_per_process = settings.max_runs_per_process.unwrap_or(pool.max_runs_per_process);
            pool.idle_timeout = settings.idle_timeout.unwrap_or(pool.idle_timeout);
            pool.cancel_grace = settings.cancel_grace.unwrap_or(pool.cancel_grace);
            config.reuse = Reuse::Pooled(pool);
        }
        AcpProvider::new(config).await.map(|p| Arc::new(p) as Arc<dyn Provider>).map_err(BuildFailure::from)
    }

    #[cfg(not(feature = "acp"))]
    async fn provider(&self, _: Building<'_>) -> Result<Arc<dyn Provider>, BuildFailure> {
        Err(super::FeatureOff { kind: "acp", feature: "acp" }.into())
    }
}
