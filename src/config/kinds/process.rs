//! `kind = "process"`: a fresh `subagents serve` runtime per run, in its
//! own process.
//!
//! ```toml
//! [providers.isolated]
//! kind = "process"
//! model = "openai:gpt-4o-mini"    # the child's model, or a [models] route of this file
//! profile = "default"
//! patches = ["patches/readonly.json"]
//! shutdown_timeout = "5s"
//! config = "child.toml"           # the child delegates to this file's providers
//! ```
//!
//! Every `[models.NAME]` route of the file lends its limiter to the
//! children: a child's model calls on a route of the same name (its
//! session's, when `model` names the route; a route of its own `config`)
//! wait on it too.

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
use crate::config::keys::{self, fields_of};
use crate::config::values::{expand, not_a_directory};
use crate::config::ConfigError;
use crate::seam::Provider;

/// The homes this file keeps.
pub(super) static HOMES: &[&Home] = &[&HOME];

static HOME: Home = Home {
    name: "process",
    what: "a process provider",
    keys: || [fields_of::<Table>(), child_process::keys()].concat(),
    check,
    capabilities: CAPABILITIES,
};

#[cfg(feature = "process")]
const CAPABILITIES: KindCapabilities = KindCapabilities::Fixed(crate::providers::ProcessProvider::CAPABILITIES);
#[cfg(not(feature = "process"))]
const CAPABILITIES: KindCapabilities = KindCapabilities::NotBuilt("process");

#[derive(Debug, Deserialize)]
#[cfg_attr(not(feature = "process"), allow(dead_code))]
struct Table {
    bin: Option<Spanned<String>>,
    profile: Option<Spanned<String>>,
    patches: Option<Spanned<Vec<Spanned<String>>>>,
    home: Option<Spanned<String>>,
    model: Option<Spanned<String>>,
    max_tokens: Option<Spanned<u32>>,
    shutdown_timeout: Option<Spanned<String>>,
    mcp_servers: Option<Spanned<Vec<Spanned<String>>>>,
    config: Option<Spanned<String>>,
}

#[derive(Debug)]
#[cfg_attr(not(feature = "process"), allow(dead_code))]
struct Process {
    table: Table,
    child: ChildProcess,
    shutdown_timeout: Option<Duration>,
    /// Beside which relative patches are read: the file's directory.
    file_dir: Option<PathBuf>,
    /// Resolved.
    bin: Option<PathBuf>,
    home: Option<PathBuf>,
    patches: Vec<PathBuf>,
    /// The child's configuration file, resolved.
    config: Option<PathBuf>,
}

fn check(checking: &Checking<'_, '_>, table: Spanned<DeValue<'_>>) -> Result<Box<dyn Checked>, ConfigError> {
    let child = ChildProcess::check(checking, &table)?;
    let table: Table = keys::read(checking.source, table)?;
    let shutdown_timeout = checking.duration("shutdown_timeout", &table.shutdown_timeout)?;
    let file_dir = Path::new(checking.source.name).parent().map(Path::to_path_buf);
    Ok(Box::new(Process { table, child, shutdown_timeout, file_dir, bin: None, home: None, patches: Vec::new(), config: None }))
}

impl Checked for Process {
    fn resolve(&mut self, checking: &Checking<'_, '_>) -> Result<(), ConfigError> {
        let source = checking.source;
        self.child.resolve(checking)?;
        let path_of = |value: &Spanned<String>| expand(source, value.get_ref(), value.span()).map(PathBuf::from);
        self.bin = self.table.bin.as_ref().map(path_of).transpose()?;
        if let Some(value) = &self.table.home {
            let home = path_of(value)?;
            if !home.is_absolute() {
                return Err(source.error(Some(value.span()), "`home` must be an absolute path"));
            }
            if let Some(problem) = not_a_directory(&home) {
                return Err(source.error(Some(value.span()), format!("`home` {problem}")));
            }
            self.home = Some(home);
        }
        // Read beside this file when relative, as a patch is; the child
        // checks it when it starts.
        self.config = None;
        if let Some(value) = &self.table.config {
            let path = match (path_of(value)?, &self.file_dir) {
                (path, Some(dir)) if path.is_relative() => dir.join(path),
                (path, _) => path,
            };
            if !path.is_file() {
                return Err(source.error(Some(value.span()), format!("config {path:?} is not a file")));
            }
            self.config = Some(std::path::absolute(&path).unwrap_or(path));
        }
        self.patches.clear();
        for patch in self.table.patches.iter().flat_map(|patches| patches.get_ref()) {
            // A relative patch is read beside the file, as its examples ship.
            let path = match (path_of(patch)?, &self.file_dir) {
                (path, Some(dir)) if path.is_relative() => dir.join(path),
                (path, _) => path,
            };
            if !path.is_file() {
                return Err(source.error(Some(patch.span()), format!("patch {path:?} is not a file")));
            }
            self.patches.push(path);
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

impl Process {
    #[cfg(feature = "process")]
    async fn provider(&self, building: Building<'_>) -> Result<Arc<dyn Provider>, BuildFailure> {
        use crate::providers::{ProcessConfig, ProcessProvider};
        let table = &self.table;
        let home = self.home.clone().unwrap_or_else(|| building.context.home.join("children").join(building.name));
        let mut config = ProcessConfig::new(building.name, home);
        if let Some(bin) = &self.bin {
            config.bin = bin.clone();
        }
        if let Some(profile) = &table.profile {
            config.profile = profile.get_ref().clone();
        }
        config.patches = self.patches.clone();
        config.config = self.config.clone();
        config.child = self.child.config();
        config.workspace = self.child.workspaces().await?;
        // Every route's limiter, for the children's calls on routes of
        // those names (the configured ones first to have their names).
        for route in building.config.routes() {
            config.lend_route(route);
        }
        if let Some(model) = &table.model {
            // The child's route, and the endpoint's variables and key it
            // is handed (credential-shaped names are never inherited).
            let spec = building.config.model_spec(model.get_ref())?;
            config.route_child_model(&spec);
        }
        config.route.max_tokens = table.max_tokens.as_ref().map(|max| *max.get_ref());
        if let Some(timeout) = self.shutdown_timeout {
            config.shutdown_timeout = timeout;
        }
        // No `mcp_servers` key: each child gets its parent's.
        #[cfg(feature = "mcp-client")]
        if table.mcp_servers.is_some() {
            config.mcp_servers = Some(building.config.mcp_server_configs_named(building.mcp_servers));
        }
        #[cfg(not(feature = "mcp-client"))]
        if !building.mcp_servers.is_empty() {
            return Err(super::FeatureOff { kind: "MCP servers of process", feature: "mcp-client" }.into());
        }
        let provider = ProcessProvider::new(config)?;
        if building.context.probe {
            provider.probe().await?;
        }
        Ok(Arc::new(provider))
    }

    #[cfg(not(feature = "process"))]
    async fn provider(&self, _: Building<'_>) -> Result<Arc<dyn Provider>, BuildFailure> {
        Err(super::FeatureOff { kind: "process", feature: "process" }.into())
    }
}
