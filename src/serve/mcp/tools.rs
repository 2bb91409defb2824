//! The four tools an MCP client sees, and the check of a call's arguments
//! before anything runs.
//!
//! `subagent` is the model-facing tool's spec in the standalone wording (a
//! client's children never see its conversation), plus `output_schema`
//! and `persona` when the provider advertises them, and a sentence on this
//! server's limits. `task_output`, `task_list` and `task_kill` are the task
//! tools' own specs. Every input schema is an object-rooted JSON Schema.
//!
//! **Annotations** tell a client which calls it may run side by side
//! (clients such as Claude Code run calls one after another unless a tool
//! says `readOnlyHint`):
//!
//! | tool | readOnly | destructive | idempotent | openWorld |
//! |---|---|---|---|---|
//! | `subagent` | while the children's tools all only read (today's kit does) | — | no | with an HTTP model (`openai:`, `openai-responses:`, `anthropic:`) |
//! | `task_output`, `task_list` | yes | — | — | no |
//! | `task_kill` | no | yes | yes | no |
//!
//! A call names a tool and brings arguments; before it runs:
//! - an unknown tool is `-32602`, `data: {"tool", "available"}`;
//! - arguments that break the tool's schema are `-32602`,
//!   `data: {"violations": [...]}`, each violation path-qualified
//!   (`$.prompt: "prompt" is a required property`);
//! - an `output_schema` outside the structured-output subset
//!   ([`check_subset`]) is `-32602` with its violations under
//!   `$.output_schema`.

use std::sync::Arc;

use rmcp::model::{JsonObject, Tool as McpTool, ToolAnnotations};
use rmcp::ErrorData;
use serde_json::{json, Value};

use crate::agent::Tool;
use crate::schema::{check_subset, CompiledSchema};
use crate::seam::{Capability, ProviderInfo};
use crate::tool::{MaxDepth, SubagentTool};

/// What a checked call runs.
#[derive(Clone)]
pub(super) enum Target {
    /// The subagent tool (driven through [`SubagentTool::begin`]).
    Subagent,
    /// One of the task tools, called as a model would.
    Task(Arc<dyn Tool>),
}

struct Entry {
    tool: McpTool,
    schema: CompiledSchema,
    target: Target,
}

/// This server's tools.
pub(super) struct Catalog {
    entries: Vec<Entry>,
}

/// A tool that cannot be offered to MCP clients: a bug in the tool's own
/// spec, reported when the server starts rather than to a client.
#[derive(Debug, thiserror::Error)]
pub(super) enum CatalogError {
    /// Its parameters are not a JSON Schema.
    #[error("tool {tool:?}: {reason}")]
    Schema { tool: String, reason: String },
    /// Its parameters are a schema, but not an object.
    #[error("tool {0:?}: its parameters are not a JSON object")]
    NotAnObject(String),
}

/// The limits the `subagent` tool's description states.
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    /// Runs of the client's calls at once.
    pub(super) concurrency: usize,
    /// How deep the children may delegate.
    pub(super) max_depth: MaxDepth,
    /// Unfinished background tasks the session may hold.
    pub(super) background: usize,
    /// The children's tools all only read: a `subagent` call changes nothing.
    pub(super) children_read_only: bool,
    /// The children's model is reached over the network.
    pub(super) open_world: bool,
}

impl Catalog {
    /// The catalog for `subagent` on `provider` and the task tools.
    pub(super) fn new(
        subagent: &SubagentTool,
        provider: &ProviderInfo,
        task_tools: [Arc<dyn Tool>; 3],
        limits: Limits,
    ) -> Result<Self, CatalogError> {
        let mut entries = vec![subagent_entry(subagent, provider, limits)?];
        for tool in task_tools {
            let spec = tool.spec();
            let annotations = task_annotations(&spec.name);
            entries.push(entry(spec.name, spec.description, spec.parameters, Target::Task(tool), annotations)?);
        }
        Ok(Catalog { entries })
    }

    /// Every tool, as `tools/list` answers.
    pub(super) fn tools(&self) -> Vec<McpTool> {
        self.entries.iter().map(|entry| entry.tool.clone()).collect()
    }

    /// The tool named `name`.
    pub(super) fn get(&self, name: &str) -> Option<&McpTool> {
        self.entries.iter().find(|entry| entry.tool.name == name).map(|entry| &entry.tool)
    }

    /// What a call of `name` with `arguments` runs, or the JSON-RPC error
    /// that refuses it (see the module docs).
    pub(super) fn check(&self, name: &str, arguments: &Value) -> Result<Target, ErrorData> {
        let Some(entry) = self.entries.iter().find(|entry| entry.tool.name == name) else {
            let available: Vec<&str> = self.entries.iter().map(|entry| &*entry.tool.name).collect();
            let data = json!({"tool": name, "available": available});
            return Err(ErrorData::invalid_params(format!("unknown tool {name:?}"), Some(data)));
        };
        let mut violations = entry.schema.violations(arguments);
        if let (Target::Subagent, Some(schema)) = (&entry.target, arguments.get("output_schema")) {
            if let Err(outside) = check_subset(schema) {
                let under =
                    |violation: String| format!("$.output_schema{}", violation.strip_prefix('$').unwrap_or(&violation));
                violations.extend(outside.into_iter().map(under));
            }
        }
        if !violations.is_empty() {
            let data = json!({"violations": violations});
            return Err(ErrorData::invalid_params(format!("invalid arguments for {name:?}"), Some(data)));
        }
        Ok(entry.target.clone())
    }
}

fn subagent_entry(subagent: &SubagentTool, provider: &ProviderInfo, limits: Limits) -> Result<Entry, CatalogError> {
    let spec = subagent.spec_for(false);
    let mut parameters = spec.parameters;
    let supports = |capability| provider.capabilities.supports(capability);
    if supports(Capability::OutputSchema) {
        parameters["properties"]["output_schema"] = json!({
            "type": "object",
            "description": "A JSON Schema (object-rooted: type, properties, required, additionalProperties, \
                            items, enum, const, oneOf) the answer must satisfy; it comes back as structuredContent"
        });
    }
    if supports(Capability::Persona) {
        parameters["properties"]["persona"] = json!({
            "type": "string",
            "description": "Who the subagent is and how it works, replacing its default persona"
        });
    }
    let depth = match limits.max_depth {
        MaxDepth::Limit(depth) => format!("children delegate at most {depth} levels deep"),
        MaxDepth::ProviderManaged => "each child process caps its own delegation depth".to_owned(),
    };
    let description = format!(
        "{} It runs under this server's supervision: at most {} runs at once (further calls queue), {depth}. \
         With run_in_background it returns a task id at once (at most {} unfinished at once); collect it with \
         task_output.",
        spec.description, limits.concurrency, limits.background
    );
    let annotations =
        ToolAnnotations::new().read_only(limits.children_read_only).idempotent(false).open_world(limits.open_world);
    entry(spec.name, description, parameters, Target::Subagent, annotations)
}

/// A task tool's hints: reading a task or the list changes nothing;
/// `task_kill` stops the client's work (killing twice is killing once).
fn task_annotations(name: &str) -> ToolAnnotations {
    let hints = ToolAnnotations::new().open_world(false);
    match name {
        "task_kill" => hints.read_only(false).destructive(true).idempotent(true),
        _ => hints.read_only(true),
    }
}

fn entry(
    name: String,
    description: String,
    parameters: Value,
    target: Target,
    annotations: ToolAnnotations,
) -> Result<Entry, CatalogError> {
    let schema = match CompiledSchema::compile(&parameters) {
        Ok(schema) => schema,
        Err(error) => return Err(CatalogError::Schema { tool: name, reason: error.to_string() }),
    };
    let Value::Object(parameters) = parameters else {
        return Err(CatalogError::NotAnObject(name));
    };
    let parameters: JsonObject = parameters;
    let tool = McpTool::new(name, description, Arc::new(parameters)).with_annotations(annotations);
    Ok(Entry { tool, schema, target })
}
