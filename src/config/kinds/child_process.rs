//! The keys every kind that starts a child process shares (`acp`,
//! `process`): where the child runs, its environment, its dispose graces,
//! and a git worktree per run (`workspace = "worktree"`, see
//! [`crate::workspace`]).
//!
//! ```toml
//! env = { OPENAI_API_KEY = "${OPENAI_API_KEY}" }
//! inherit_env = ["LANG"]
//! cwd = "/srv/work"
//! dispose_eof_grace = "2s"
//! dispose_grace = "5s"
//! ```
//!
//! ```toml
//! workspace = "worktree"
//! repo = "/srv/work"                      # default: `cwd`, else the working directory
//! base = "main"                           # default: HEAD when the provider is built
//! branch = "subagents/{batch}/{task}"
//! worktree_root = "/var/tmp/worktrees"    # default: under the temporary directory
//! keep_worktrees = false
//! ```

use std::path::PathBuf;
use std::time::Duration;

use indexmap::IndexMap;
use serde::Deserialize;
use toml::de::DeValue;
use toml::Spanned;

use super::Checking;
use crate::config::keys::{self, fields_of};
use crate::config::values::expand;
use crate::config::ConfigError;

/// The shared keys, read from the kind's own table.
#[derive(Debug, Deserialize)]
#[cfg_attr(not(any(feature = "acp", feature = "process")), allow(dead_code))]
pub(super) struct Table {
    env: Option<Spanned<IndexMap<String, Spanned<String>>>>,
    inherit_env: Option<Spanned<Vec<String>>>,
    cwd: Option<Spanned<String>>,
    dispose_eof_grace: Option<Spanned<String>>,
    dispose_grace: Option<Spanned<String>>,
    workspace: Option<Spanned<WorkspaceKind>>,
    repo: Option<Spanned<String>>,
    base: Option<Spanned<String>>,
    branch: Option<Spanned<String>>,
    worktree_root: Option<Spanned<String>>,
    keep_worktrees: Option<Spanned<bool>>,
}

/// What `workspace` may say.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum WorkspaceKind {
    /// A git worktree and branch per run.
    Worktree,
}

/// The shared keys' names.
pub(super) fn keys() -> &'static [&'static str] {
    fields_of::<Table>()
}

/// The shared keys as checked and, once resolved, expanded.
#[derive(Debug)]
#[cfg_attr(not(any(feature = "acp", feature = "process")), allow(dead_code))]
pub(super) struct ChildProcess {
    table: Table,
    eof_grace: Option<Duration>,
    grace: Option<Duration>,
    /// `env`, `${VAR}`-expanded.
    pub(super) env: Vec<(String, String)>,
    cwd: Option<PathBuf>,
    /// The worktree settings, expanded (`workspace = "worktree"`).
    workspace: Option<crate::workspace::WorkspaceConfig>,
}

impl ChildProcess {
    /// Reads the shared keys of `table`.
    pub(super) fn check(
        checking: &Checking<'_, '_>,
        table: &Spanned<DeValue<'_>>,
    ) -> Result<ChildProcess, ConfigError> {
        let table: Table = keys::read(checking.source, table.clone())?;
        let eof_grace = checking.duration("dispose_eof_grace", &table.dispose_eof_grace)?;
        let grace = checking.duration("dispose_grace", &table.dispose_grace)?;
        let workspace_keys = [
            ("repo", table.repo.as_ref().map(Spanned::span)),
            ("base", table.base.as_ref().map(Spanned::span)),
            ("branch", table.branch.as_ref().map(Spanned::span)),
            ("worktree_root", table.worktree_root.as_ref().map(Spanned::span)),
            ("keep_worktrees", table.keep_worktrees.as_ref().map(Spanned::span)),
        ];
        let found = workspace_keys.into_iter().find_map(|(key, span)| Some((key, span?)));
        if let Some((key, span)) = found.filter(|_| table.workspace.is_none()) {
            let message =
                format!("`{key}` applies to a worktree per run: add workspace = \"worktree\" to {:?}", checking.name);
            return Err(checking.source.error(Some(span), message));
        }
        if let Some(branch) = &table.branch {
            if !branch.get_ref().contains("{task}") {
                let message = "`branch` must name `{task}`: every run needs a branch of its own";
                return Err(checking.source.error(Some(branch.span()), message));
            }
        }
        Ok(ChildProcess { table, eof_grace, grace, env: Vec::new(), cwd: None, workspace: None })
    }

    /// Whether the table asks for a worktree per run; its span.
    pub(super) fn workspace_span(&self) -> Option<std::ops::Range<usize>> {
        self.table.workspace.as_ref().map(Spanned::span)
    }

    /// `env`'s values as the file wrote them.
    pub(super) fn env_written(&self) -> impl Iterator<Item = &String> {
        self.table.env.iter().flat_map(|env| env.get_ref().values()).map(Spanned::get_ref)
    }

    /// Expands `env` and `cwd`.
    pub(super) fn resolve(&mut self, checking: &Checking<'_, '_>) -> Result<(), ConfigError> {
        let source = checking.source;
        self.env.clear();
        for (key, value) in self.table.env.iter().flat_map(|env| env.get_ref()) {
            self.env.push((key.clone(), expand(source, value.get_ref(), value.span())?));
        }
        self.cwd = match &self.table.cwd {
            Some(cwd) => Some(PathBuf::from(expand(source, cwd.get_ref(), cwd.span())?)),
            None => None,
        };
        self.workspace = None;
        if self.table.workspace.is_some() {
            let path_of = |value: &Spanned<String>| expand(source, value.get_ref(), value.span()).map(PathBuf::from);
            let repo = match (&self.table.repo, &self.cwd) {
                (Some(repo), _) => path_of(repo)?,
                (None, Some(cwd)) => cwd.clone(),
                (None, None) => std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
            };
            let mut workspace = crate::workspace::WorkspaceConfig::new(repo);
            if let Some(base) = &self.table.base {
                workspace.base = Some(expand(source, base.get_ref(), base.span())?);
            }
            if let Some(branch) = &self.table.branch {
                workspace.branch = branch.get_ref().clone();
            }
            workspace.root = self.table.worktree_root.as_ref().map(path_of).transpose()?;
            workspace.keep = self.table.keep_worktrees.as_ref().is_some_and(|keep| *keep.get_ref());
            self.workspace = Some(workspace);
        }
        Ok(())
    }

    /// The worktree per run the table asks for, its repository and base
    /// resolved now (git is asked once, when the provider is built).
    #[cfg(any(feature = "acp", feature = "process"))]
    pub(super) async fn workspaces(&self) -> Result<Option<std::sync::Arc<crate::workspace::Workspaces>>, String> {
        match &self.workspace {
            None => Ok(None),
            Some(config) => {
                crate::workspace::Workspaces::open(config.clone()).await.map(Some).map_err(|e| e.to_string())
            }
        }
    }

    /// What the table says about its child (the defaults where it is silent).
    #[cfg(any(feature = "acp", feature = "process"))]
    pub(super) fn config(&self) -> crate::providers::ChildProcessConfig {
        let mut child = crate::providers::ChildProcessConfig {
            cwd: self.cwd.clone(),
            env: self.env.clone(),
            inherit_env: self.table.inherit_env.as_ref().map(|names| names.get_ref().clone()).unwrap_or_default(),
            ..Default::default()
        };
        if let Some(grace) = self.eof_grace {
            child.dispose_eof_grace = grace;
        }
        if let Some(grace) = self.grace {
            child.dispose_grace = grace;
        }
        child
    }
}
