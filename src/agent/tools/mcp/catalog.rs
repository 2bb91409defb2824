//! What a server's listing gives a model — each tool as
//! `mcp__SERVER__TOOL`, with its description cut at [`MAX_DESCRIPTION`]
//! bytes and its input schema if at most [`MAX_SCHEMA`] bytes of JSON —
//! and what it does not, with why: a tool left out is warned, and a call
//! of a tool that is not there is told why ([`Catalog::why_missing`])
//! rather than only that there is no such tool.

use rmcp::model::Tool as RemoteTool;
use serde_json::Value;

use super::listing::{json_len, Listing};
use super::MCP_TOOL_PREFIX;
use crate::agent::ToolSpec;

/// The longest tool name a model API takes.
const MAX_NAME: usize = 64;

/// The longest description passed on.
const MAX_DESCRIPTION: usize = 4096;

/// The largest input schema (as JSON) mounted: the model is sent every
/// schema at every request.
const MAX_SCHEMA: usize = 64 * 1024;

/// One server's last listing as a model is shown it.
#[derive(Default)]
pub(super) struct Catalog {
    pub(super) tools: Vec<Listed>,
    /// Tools listed but not mounted, with why.
    left_out: Vec<LeftOut>,
    /// Why the listing stopped before the server's last page.
    cut: Option<String>,
}

/// One listed tool, read once per `tools/list` (its spec is asked for at
/// every model request).
pub(super) struct Listed {
    /// The server's name for it.
    pub(super) remote: String,
    pub(super) spec: ToolSpec,
    pub(super) read_only: bool,
}

/// A listed tool a model cannot be given.
struct LeftOut {
    /// The server's name for it.
    remote: String,
    why: String,
}

impl Catalog {
    /// `listing`, the tools of the server named `server`; what it leaves
    /// out is warned.
    pub(super) fn of(server: &str, listing: Listing) -> Catalog {
        if let Some(cut) = &listing.cut {
            tracing::warn!(%server, "an MCP server's tool list was cut: {cut}");
        }
        let mut catalog =
            Catalog { tools: Vec::with_capacity(listing.tools.len()), cut: listing.cut, ..Catalog::default() };
        for remote in &listing.tools {
            match spec_of(server, remote) {
                Ok(spec) => {
                    let read_only = remote.annotations.as_ref().and_then(|a| a.read_only_hint).unwrap_or(false);
                    catalog.tools.push(Listed { remote: remote.name.to_string(), spec, read_only });
                }
                Err(why) => {
                    tracing::warn!(%server, tool = ?remote.name, "an MCP tool is left out: {why}");
                    catalog.left_out.push(LeftOut { remote: remote.name.to_string(), why });
                }
            }
        }
        catalog
    }

    /// The tool the server calls `remote`, if mounted.
    pub(super) fn find(&self, remote: &str) -> Option<&Listed> {
        self.tools.iter().find(|tool| tool.remote == remote)
    }

    /// Why the server named `server` has no tool `remote` to call.
    pub(super) fn why_missing(&self, server: &str, remote: &str) -> String {
        if let Some(left_out) = self.left_out.iter().find(|tool| tool.remote == remote) {
            return format!("the MCP server {server:?} lists {remote:?}, but it was left out: {}", left_out.why);
        }
        match &self.cut {
            Some(cut) => {
                format!("the MCP server {server:?} does not list {remote:?} in what was kept of its tools: {cut}")
            }
            None => format!("the MCP server {server:?} does not list {remote:?}"),
        }
    }
}

/// The tool as a model is shown it, or why it cannot be shown.
fn spec_of(server: &str, remote: &RemoteTool) -> Result<ToolSpec, String> {
    let name = format!("{MCP_TOOL_PREFIX}{server}__{}", remote.name);
    if name.len() > MAX_NAME || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        return Err(format!("{name:?} is not a tool name a model takes ({MAX_NAME} letters, digits, `_` or `-`)"));
    }
    let schema = json_len(&remote.input_schema);
    if schema > MAX_SCHEMA {
        return Err(format!("its input schema is {schema} bytes of JSON, over the {MAX_SCHEMA} a tool may have"));
    }
    let parameters = Value::Object((*remote.input_schema).clone());
    let mut description = remote
        .description
        .as_deref()
        .map_or_else(|| format!("Tool {:?} of the MCP server {server:?}.", remote.name), str::to_owned);
    description.truncate(crate::seam::cut(&description, MAX_DESCRIPTION).len());
    Ok(ToolSpec { name, description, parameters })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_listed_tool_that_a_model_cannot_take_is_left_out_with_why_and_a_long_description_is_cut() {
        let object = |value: Value| match value {
            Value::Object(object) => Arc::new(object),
            _ => unreachable!(),
        };
        let schema = object(serde_json::json!({"type": "object"}));
        let huge = object(serde_json::json!({"type": "object", "description": "x".repeat(MAX_SCHEMA)}));
        let tools = vec![
            RemoteTool::new("ok", "é".repeat(MAX_DESCRIPTION), schema.clone()),
            RemoteTool::new("has.dot", "", schema.clone()),
            RemoteTool::new("n".repeat(60), "", schema),
            RemoteTool::new("huge", "", huge),
        ];
        let catalog = Catalog::of("s", Listing { tools, cut: None });
        let names: Vec<&str> = catalog.tools.iter().map(|tool| tool.spec.name.as_str()).collect();
        assert_eq!(names, ["mcp__s__ok"]);
        assert!(catalog.tools[0].spec.description.len() <= MAX_DESCRIPTION);
        let why = catalog.why_missing("s", "huge");
        assert!(
            why.starts_with("the MCP server \"s\" lists \"huge\", but it was left out: its input schema is"),
            "{why}"
        );
        assert!(catalog.why_missing("s", "has.dot").contains("is not a tool name a model takes"));
        assert_eq!(catalog.why_missing("s", "other"), "the MCP server \"s\" does not list \"other\"");
    }

    #[test]
    fn a_tool_missing_from_a_cut_listing_is_told_of_the_cut() {
        let listing = Listing { tools: Vec::new(), cut: Some("its tools/list goes on past 64 pages".to_owned()) };
        let why = Catalog::of("s", listing).why_missing("s", "late");
        assert_eq!(
            why,
            "the MCP server \"s\" does not list \"late\" in what was kept of its tools: its tools/list goes on past 64 pages"
        );
    }
}
