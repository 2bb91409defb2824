//! The keys every kind that starts a child process shares (`acp`,
//! `process`): where the child runs, its environment, its dispose graces.
//!
//! ```toml
//! env = { OPENAI_API_KEY = "${OPENAI_API_KEY}" }
//! inherit_env = ["LANG"]
//! cwd = "/srv/work"
//! dispose_eof_grace = "2s"
//! dispose_grace = "5s"
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
        Ok(ChildProcess { table, eof_grace, grace, env: Vec::new(), cwd: None })
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
        Ok(())
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
