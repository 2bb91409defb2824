//! `kind = "spawn"` and `kind = "fork"`: in-process children on a model
//! the caller hands over (a route of the file, a command-line form, or the
//! caller's default).
//!
//! ```toml
//! [providers.cheap]
//! kind = "spawn"
//! model = "fast"                  # a [models] route, "scripted", "openai:NAME", …
//! tools = ["read_file", "subagent"]
//! max_depth = 2
//! budget = { runs = 50, deadline = "10m" }
//! approve = ["subagent", "mcp__git__*"]   # these ask the nearest approver first
//! permission_timeout = "5m"               # no answer by then is a reject (default 10 min)
//! ```

use std::sync::Arc;

use futures_util::future::LocalBoxFuture;
use futures_util::FutureExt;
use serde::Deserialize;
use toml::de::DeValue;
use toml::Spanned;

use super::{BuildFailure, Building, Checked, Checking, Home, KindCapabilities};
use crate::agent::{ListDir, ReadFile, Tool};
use crate::config::keys::{self, fields_of};
use crate::config::{parse_positive_duration, ConfigError};
use crate::providers::{ChildInfo, InProcessProvider, ToolFactory};
use crate::seam::{AgentOptions, Budget, Provider};
use crate::tool::delegating_kit;

/// The homes this file keeps.
pub(super) static HOMES: &[&Home] = &[&SPAWN, &FORK];

/// `kind = "spawn"`: a fresh child.
static SPAWN: Home = Home {
    name: "spawn",
    what: "a spawn provider",
    keys: || fields_of::<Table>().to_vec(),
    check: |checking, table| check(checking, table, false),
    capabilities: KindCapabilities::Fixed(InProcessProvider::CAPABILITIES),
};

/// `kind = "fork"`: a child seeded with its parent's completed turns.
static FORK: Home = Home {
    name: "fork",
    what: "a fork provider",
    keys: || fields_of::<Table>().to_vec(),
    check: |checking, table| check(checking, table, true),
    capabilities: KindCapabilities::Fixed(InProcessProvider::CAPABILITIES),
};

#[derive(Debug, Deserialize)]
struct Table {
    model: Option<Spanned<String>>,
    tools: Option<Spanned<Vec<Spanned<String>>>>,
    max_depth: Option<Spanned<u32>>,
    max_steps: Option<Spanned<u32>>,
    structured_nudge_retries: Option<Spanned<u32>>,
    max_tokens: Option<Spanned<u32>>,
    persona: Option<Spanned<String>>,
    /// Read as [`BudgetTable`] once its keys are checked.
    budget: Option<Spanned<toml::Value>>,
    mcp_servers: Option<Spanned<Vec<Spanned<String>>>>,
    approve: Option<Spanned<Vec<Spanned<String>>>>,
    permission_timeout: Option<Spanned<String>>,
}

/// The tools `approve` may name besides MCP tools (`mcp__SERVER__TOOL`).
const APPROVABLE: [&str; 6] = ["read_file", "list_dir", "subagent", "task_output", "task_list", "task_kill"];

/// `budget = { … }`: what each run may spend.
#[derive(Debug, Deserialize)]
#[serde(expecting = "a table such as { runs = 50, deadline = \"10m\" }")]
struct BudgetTable {
    depth: Option<u32>,
    width: Option<u32>,
    runs: Option<u64>,
    tokens: Option<u64>,
    deadline: Option<String>,
}

#[derive(Debug)]
struct InProcess {
    fork: bool,
    table: Table,
    budget: Option<Budget>,
    permission_timeout: Option<std::time::Duration>,
}

fn check(
    checking: &Checking<'_, '_>,
    table: Spanned<DeValue<'_>>,
    fork: bool,
) -> Result<Box<dyn Checked>, ConfigError> {
    let source = checking.source;
    let budget_value = table.get_ref().get("budget").cloned();
    let table: Table = keys::read(source, table)?;
    let mut budget = None;
    if let (Some(value), Some(spanned)) = (budget_value, &table.budget) {
        let budget_keys =
            keys::TableKeys { what: "`budget`", place: "`budget`", keys: fields_of::<BudgetTable>().to_vec() };
        keys::check(source, &value, &budget_keys, &[])?;
        let limits: BudgetTable = keys::read(source, value)?;
        let span = spanned.span();
        let mut parsed = Budget {
            depth: limits.depth,
            width: limits.width,
            runs: limits.runs,
            tokens: limits.tokens,
            deadline: None,
        };
        if let Some(deadline) = &limits.deadline {
            let deadline = parse_positive_duration(deadline)
                .map_err(|e| source.error(Some(span.clone()), format!("`budget.deadline`: {e}")))?;
            parsed.deadline = Some(deadline);
        }
        let zero =
            [limits.depth.map(u64::from), limits.width.map(u64::from), limits.runs, limits.tokens].contains(&Some(0));
        if zero {
            return Err(source.error(Some(span), "a `budget` limit of 0 would refuse every run: give at least 1"));
        }
        budget = Some(parsed);
    }
    if let Some(tools) = &table.tools {
        for name in tools.get_ref() {
            if !["read_file", "list_dir", "subagent"].contains(&name.get_ref().as_str()) {
                let message = format!(
                    "unknown tool {}: read_file, list_dir or subagent",
                    crate::config::bounds::quoted(name.get_ref())
                );
                return Err(source.error(Some(name.span()), message));
            }
        }
    }
    for name in table.approve.iter().flat_map(|names| names.get_ref()) {
        let known = APPROVABLE.contains(&name.get_ref().as_str())
            || name.get_ref().starts_with("mcp__")
            || name.get_ref().contains(['*', '?']);
        if !known {
            let message = format!(
                "`approve`: unknown tool {}: {}, an MCP tool (mcp__SERVER__TOOL) or a glob",
                crate::config::bounds::quoted(name.get_ref()),
                APPROVABLE.join(", ")
            );
            return Err(source.error(Some(name.span()), message));
        }
    }
    let permission_timeout = checking.duration("permission_timeout", &table.permission_timeout)?;
    if permission_timeout.is_some_and(|timeout| timeout.is_zero()) {
        let span = table.permission_timeout.as_ref().map(Spanned::span);
        return Err(source.error(span, "`permission_timeout` must be longer than zero"));
    }
    Ok(Box::new(InProcess { fork, table, budget, permission_timeout }))
}

impl Checked for InProcess {
    fn in_process_model(&self) -> Option<&Spanned<String>> {
        self.table.model.as_ref()
    }

    fn in_process(&self) -> bool {
        true
    }

    fn mcp_servers(&self) -> Option<&Spanned<Vec<Spanned<String>>>> {
        self.table.mcp_servers.as_ref()
    }

    fn build<'a>(&'a self, building: Building<'a>) -> LocalBoxFuture<'a, Result<Arc<dyn Provider>, BuildFailure>> {
        async move { self.provider(&building).map(|provider| Arc::new(provider) as Arc<dyn Provider>) }.boxed_local()
    }
}

impl InProcess {
    fn provider(&self, building: &Building<'_>) -> Result<InProcessProvider, BuildFailure> {
        let table = &self.table;
        let model = building.context.models.model(table.model.as_ref().map(|m| m.get_ref().as_str()))?;
        let name = building.name.to_owned();
        let mut provider =
            if self.fork { InProcessProvider::fork(name, model) } else { InProcessProvider::spawn(name, model) };
        provider = provider.with_tools(self.child_tools(building));
        // No `mcp_servers` key: the children inherit their parent's.
        if table.mcp_servers.is_some() {
            provider = building.config.mount_mcp_servers(provider, building.mcp_servers)?;
        }
        if let Some(steps) = &table.max_steps {
            provider = provider.with_max_steps(*steps.get_ref());
        }
        if let Some(persona) = &table.persona {
            provider = provider.with_persona(persona.get_ref().clone());
        }
        if let Some(budget) = self.budget {
            provider = provider.with_budget(budget);
        }
        if let Some(approve) = &table.approve {
            let tools = approve.get_ref().iter().map(|name| name.get_ref().clone()).collect();
            let timeout = self.permission_timeout.unwrap_or(crate::seam::DEFAULT_APPROVAL_TIMEOUT);
            provider = provider.with_approve(tools, timeout);
        }
        if let Some(retries) = &table.structured_nudge_retries {
            provider = provider.with_structured_nudge_retries(*retries.get_ref());
        }
        if let Some(max_tokens) = &table.max_tokens {
            let route = AgentOptions { max_tokens: Some(*max_tokens.get_ref()), ..AgentOptions::default() };
            provider = provider.with_route_defaults(route);
        }
        Ok(provider)
    }

    /// Its children's tools: the built-in tools its table lists (default
    /// both), and a subagent tool per provider `[tool]` offers, plus the
    /// task tools, while its depth cap leaves room.
    fn child_tools(&self, building: &Building<'_>) -> ToolFactory {
        let mut builtins: Vec<Arc<dyn Tool>> = Vec::new();
        let mut delegate = true;
        match &self.table.tools {
            None => builtins = vec![Arc::new(ReadFile), Arc::new(ListDir)],
            Some(names) => {
                delegate = false;
                for name in names.get_ref() {
                    match name.get_ref().as_str() {
                        "read_file" => builtins.push(Arc::new(ReadFile)),
                        "list_dir" => builtins.push(Arc::new(ListDir)),
                        _ => delegate = true,
                    }
                }
            }
        }
        let config = building.config;
        let max_depth = self.table.max_depth.as_ref().map_or(config.tool_max_depth(), |depth| *depth.get_ref());
        let offered = if delegate { config.tool_providers().to_vec() } else { Vec::new() };
        let context = building.context;
        let kit = delegating_kit(context.subagents, context.tasks, builtins, offered, max_depth);
        Arc::new(move |_: &ChildInfo| kit())
    }
}
