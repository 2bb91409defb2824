//! The file's shape, as serde reads it, each value with its place in the
//! file (a [`Spanned`]): a table per model route, `[tool]`, the MCP
//! servers. Each `[providers.NAME]` table is read by its kind's home
//! ([`super::kinds`]); every table's keys are checked before it is read
//! ([`super::keys`]), so no parser's list of keys reaches a message.

use indexmap::IndexMap;
use serde::Deserialize;
use toml::Spanned;

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
