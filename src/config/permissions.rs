//! Permission rules, as a provider (`permission`, `permission_rules`)
//! and `[approvals]` write them:
//!
//! ```toml
//! [providers.codex]
//! kind = "acp"
//! command = "codex-acp"
//! permission = "ask"
//! permission_rules = [
//!   { kind = "read", permission = "allow" },
//!   { title = "*rm -rf*", permission = "reject" },
//! ]
//!
//! [approvals]
//! permission = "ask"
//! rules = [{ kind = "edit", path = "/srv/repo", permission = "allow" }]
//! ```
//!
//! A rule names at least one of `kind` (one of ACP's kinds of call),
//! `tool` and `title` (globs: `*`, `?`) and `path` (absolute), and says
//! `allow`, `reject` or `ask`; see [`crate::seam::Rules`].

use std::path::PathBuf;

use serde::Deserialize;
use toml::de::DeValue;
use toml::Spanned;

use super::keys::{self, fields_of, TableKeys};
use super::values::expand;
use super::{ConfigError, Source};
use crate::seam::{Policy, Rule, Rules};

#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum PermissionName {
    Allow,
    Reject,
    Ask,
}

impl From<PermissionName> for Policy {
    fn from(name: PermissionName) -> Policy {
        match name {
            PermissionName::Allow => Policy::Allow,
            PermissionName::Reject => Policy::Reject,
            PermissionName::Ask => Policy::Ask,
        }
    }
}

/// One entry of `permission_rules`.
#[derive(Debug, Deserialize)]
#[serde(expecting = "a table such as { kind = \"read\", permission = \"allow\" }")]
struct RuleTable {
    kind: Option<String>,
    tool: Option<String>,
    title: Option<String>,
    path: Option<String>,
    permission: PermissionName,
}

/// The kinds of call ACP names: a rule's `kind` is one of them.
const CALL_KINDS: [&str; 10] =
    ["read", "edit", "delete", "move", "search", "execute", "think", "fetch", "switch_mode", "other"];

/// `permission_rules = [ … ]` (or `[approvals] rules`): each a table naming some of `kind`, `tool`,
/// `title` and an absolute `path`, and its `permission`.
pub(super) fn rules(
    source: &Source<'_>,
    value: Option<Spanned<DeValue<'_>>>,
    otherwise: Policy,
) -> Result<Rules, ConfigError> {
    let mut rules = Rules::new(otherwise);
    let Some(value) = value else { return Ok(rules) };
    let span = value.span();
    let Some(entries) = value.get_ref().as_array() else {
        return Err(source.error(
            Some(span),
            "the rules are a list of tables, such as [{ kind = \"read\", permission = \"allow\" }]",
        ));
    };
    let rule_keys = TableKeys {
        what: "a permission rule",
        place: "a `permission_rules` entry",
        keys: fields_of::<RuleTable>().to_vec(),
    };
    for entry in entries {
        let at = entry.span();
        if !entry.get_ref().is_table() {
            return Err(source.error(
                Some(at),
                "each permission rule is a table, such as { kind = \"read\", permission = \"allow\" }",
            ));
        }
        keys::check(source, entry, &rule_keys, &[])?;
        let read: RuleTable = keys::read(source, entry.clone())?;
        let mut rule = Rule::new(read.permission.into());
        if read.kind.is_none() && read.tool.is_none() && read.title.is_none() && read.path.is_none() {
            return Err(source.error(
                Some(at),
                "a permission rule names at least one of `kind`, `tool`, `title` and `path` (for every request, set `permission`)",
            ));
        }
        if let Some(kind) = read.kind {
            if !CALL_KINDS.contains(&kind.as_str()) {
                let message = format!("a rule's `kind` is one of {}, not {kind:?}", CALL_KINDS.join(", "));
                return Err(source.error(Some(at), message));
            }
            rule = rule.kind(kind);
        }
        if let Some(tool) = read.tool {
            rule = rule.tool(tool);
        }
        if let Some(title) = read.title {
            rule = rule.title(title);
        }
        if let Some(path) = read.path {
            let path = PathBuf::from(expand(source, &path, at.clone())?);
            if !path.is_absolute() {
                return Err(source.error(Some(at), format!("a rule's `path` is absolute, not {path:?}")));
            }
            rule = rule.path(path);
        }
        rules = rules.with(rule);
    }
    Ok(rules)
}

/// `[approvals]`: what a door with a policy (`fanout`) answers a child's
/// permission request that climbed to it; `ask` parks it.
#[derive(Debug, Deserialize)]
pub(super) struct ApprovalsTable {
    permission: Option<PermissionName>,
    /// Read by [`rules`], each entry at its own place.
    #[allow(dead_code)]
    rules: Option<toml::Value>,
}

/// `[approvals]`, read: its rules and default (`ask` unless set).
pub(super) fn approvals(source: &Source<'_>, table: Spanned<DeValue<'_>>) -> Result<Rules, ConfigError> {
    let span = table.span();
    if !table.get_ref().is_table() {
        return Err(source.error(Some(span), "`approvals` is a table: [approvals]"));
    }
    let raw_rules = table.get_ref().get("rules").cloned();
    let read: ApprovalsTable = keys::read(source, table)?;
    rules(source, raw_rules, read.permission.map_or(Policy::Ask, Policy::from))
}
