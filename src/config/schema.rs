//! The file's shape, as serde reads it, each value with its place in the
//! file (a [`Spanned`]): a table per model route, `[tool]`, the MCP
//! servers. Each `[providers.NAME]` table is read by its kind's home
//! ([`super::kinds`]); every table's keys are checked before it is read
//! ([`super::keys`]), so no parser's list of keys reaches a message.

use indexmap::IndexMap;
use serde::Deserialize;
use toml::de::DeTable;
use toml::Spanned;

use super::keys::{self, fields_of, TableKeys};
use super::kinds::Kind;
use super::{ConfigError, Source};

/// The whole file.
#[derive(Debug, Default, Deserialize)]
pub(super) struct FileTable {
    /// Each read by its kind (see [`super::kinds`]); here for its name only.
    #[allow(dead_code)]
    #[serde(default)]
    pub(super) providers: Option<toml::Value>,
    #[serde(default)]
    pub(super) models: IndexMap<String, Spanned<RouteTable>>,
    pub(super) tool: Option<ToolTable>,
    /// Read by [`super::permissions::approvals`]; here for its name only.
    #[allow(dead_code)]
    #[serde(default)]
    pub(super) approvals: Option<toml::Value>,
    #[serde(default)]
    pub(super) mcp_servers: IndexMap<String, Spanned<super::mcp_servers::McpServerTable>>,
}

/// `[models.NAME]`: a model route.
#[derive(Debug, Deserialize)]
pub(super) struct RouteTable {
    pub(super) api: Spanned<ApiName>,
    pub(super) base_url: Option<Spanned<String>>,
    pub(super) api_key_env: Option<Spanned<String>>,
    pub(super) model: Spanned<String>,
    pub(super) max_tokens: Option<Spanned<u32>>,
    pub(super) timeout: Option<Spanned<String>>,
    pub(super) retries: Option<Spanned<u32>>,
    pub(super) rpm: Option<Spanned<u32>>,
    pub(super) tpm: Option<Spanned<u64>>,
    pub(super) max_concurrent: Option<Spanned<u32>>,
    pub(super) shared: Option<Spanned<bool>>,
}

/// A route's `api`.
#[derive(Clone, Copy, Debug, Deserialize)]
pub(super) enum ApiName {
    #[serde(rename = "openai-chat")]
    OpenAiChat,
    #[serde(rename = "openai-responses")]
    OpenAiResponses,
    #[serde(rename = "anthropic")]
    Anthropic,
}

/// `[tool]`: what the model-facing subagent tool offers.
#[derive(Debug, Deserialize)]
pub(super) struct ToolTable {
    pub(super) providers: Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) max_depth: Option<Spanned<u32>>,
}

/// Every table a file may hold, with its keys: a key in the wrong one is
/// named with where it belongs.
pub(super) struct Tables {
    root: TableKeys,
    route: TableKeys,
    tool: TableKeys,
    approvals: TableKeys,
    mcp_server: TableKeys,
    kinds: Vec<TableKeys>,
}

impl Tables {
    pub(super) fn new() -> Tables {
        Tables {
            root: TableKeys { what: "the top level", place: "the top level", keys: fields_of::<FileTable>().to_vec() },
            route: TableKeys {
                what: "a model route",
                place: "[models.NAME]",
                keys: fields_of::<RouteTable>().to_vec(),
            },
            tool: TableKeys { what: "[tool]", place: "[tool]", keys: fields_of::<ToolTable>().to_vec() },
            approvals: TableKeys {
                what: "[approvals]",
                place: "[approvals]",
                keys: fields_of::<super::permissions::ApprovalsTable>().to_vec(),
            },
            mcp_server: TableKeys {
                what: "an MCP server",
                place: "[mcp_servers.NAME]",
                keys: fields_of::<super::mcp_servers::McpServerTable>().to_vec(),
            },
            kinds: Kind::all().map(Kind::table_keys).collect(),
        }
    }

    /// Every table but a provider of `kind`.
    pub(super) fn besides(&self, kind: Kind) -> Vec<TableKeys> {
        let kinds = self.kinds.iter().filter(|table| table.what != kind.home().what);
        kinds.chain([&self.route, &self.tool, &self.approvals, &self.mcp_server]).cloned().collect()
    }

    /// The keys of the file's top level, of each route, of `[tool]` and
    /// of each MCP server (a provider's are its kind's to check).
    pub(super) fn check(&self, source: &Source<'_>, root: &DeTable<'_>) -> Result<(), ConfigError> {
        let all = |this: &TableKeys| -> Vec<TableKeys> {
            [&self.root, &self.route, &self.tool, &self.approvals, &self.mcp_server]
                .into_iter()
                .chain(&self.kinds)
                .filter(|table| table.place != this.place)
                .cloned()
                .collect()
        };
        keys::check_table(source, root, &self.root, &all(&self.root))?;
        let section = |name: &str| root.get(name).and_then(|value| value.get_ref().as_table());
        for (name, this) in [("models", &self.route), ("mcp_servers", &self.mcp_server)] {
            for (_, table) in section(name).into_iter().flat_map(|tables| tables.iter()) {
                keys::check(source, table, this, &all(this))?;
            }
        }
        if let Some(tool) = root.get("tool") {
            keys::check(source, tool, &self.tool, &all(&self.tool))?;
        }
        if let Some(approvals) = root.get("approvals") {
            keys::check(source, approvals, &self.approvals, &all(&self.approvals))?;
        }
        Ok(())
    }
}
