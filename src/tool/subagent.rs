//! `SubagentTool`: lets a model delegate a task to one provider.
//!
//! The model sees `description` (3–5 words, for display), `prompt`, and —
//! when background runs are enabled — `run_in_background`. The `prompt`
//! wording follows the provider: a child that inherits the conversation is
//! told to state only what is new; a fresh child needs a complete,
//! standalone prompt.
//!
//! **Foreground**: starts the run with the calling agent as parent, bridges
//! the calling tool's cancellation to it, awaits the result and disposes the
//! run on every path. A non-completed stop is a tool error: `subagent run
//! was cancelled`, `subagent run failed`, `subagent run hit its token limit
//! before finishing`, `subagent declined the task`. Success is
//! `{"kind": "foreground", "run_id", "output"}`.
//!
//! **Background**: returns `{"kind": "background", "task_id"}` at once; the
//! run gets its own cancellation, independent of the calling tool call, and
//! is collected with the task tools ([`TaskService`]).
//!
//! The tool is present while its provider is registered: it follows
//! provider removal and re-registration. Several instances with distinct
//! names expose several providers to one agent (a duplicate name is
//! refused by the agent's tool set). Configuration is checked against the
//! provider when the tool is mounted: a numeric `max_depth` needs a provider
//! with `depth_limit`, a persona needs `persona`, and so on.

use futures_util::future::BoxFuture;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::tasks::TaskService;
use crate::actors::Subagents;
use crate::agent::{Tool, ToolContext, ToolOutput, ToolSpec};
use crate::seam::{AgentOptions, Capability, ProgressSink, StartRequest, StopReason, SubagentError, ToolFilter};

/// The delegation depth cap the tool sends with each start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaxDepth {
    /// Children may be at most this deep (0 forbids delegation).
    Limit(u32),
    /// Send no cap: the (out-of-process) child owns its budget.
    ProviderManaged,
}

/// How a [`SubagentTool`] is bound and what it asks for.
#[derive(Clone, Debug)]
pub struct SubagentToolConfig {
    /// The provider it delegates to.
    pub provider: String,
    /// The name the model calls it by (default `subagent`).
    pub tool_name: String,
    /// Default `Limit(3)`.
    pub max_depth: MaxDepth,
    /// Route overrides for every child.
    pub agent_options: Option<AgentOptions>,
    /// Persona for every child.
    pub persona: Option<String>,
    /// Tool filter for every child.
    pub tool_filter: Option<ToolFilter>,
    /// Offer `run_in_background` (default true; needs a [`TaskService`]).
    pub enable_run_in_background: bool,
}

impl SubagentToolConfig {
    /// Defaults for `provider`.
    pub fn new(provider: impl Into<String>) -> Self {
        SubagentToolConfig {
            provider: provider.into(),
            tool_name: "subagent".to_owned(),
            max_depth: MaxDepth::Limit(3),
            agent_options: None,
            persona: None,
            tool_filter: None,
            enable_run_in_background: true,
        }
    }

    /// Sets the tool name.
    pub fn with_tool_name(mut self, name: impl Into<String>) -> Self {
        self.tool_name = name.into();
        self
    }

    /// Sets the depth cap.
    pub fn with_max_depth(mut self, max_depth: MaxDepth) -> Self {
        self.max_depth = max_depth;
        self
    }

    /// Sets route overrides.
    pub fn with_agent_options(mut self, options: AgentOptions) -> Self {
        self.agent_options = Some(options);
        self
    }

    /// Sets the children's persona.
    pub fn with_persona(mut self, persona: impl Into<String>) -> Self {
        self.persona = Some(persona.into());
        self
    }

    /// Sets the children's tool filter.
    pub fn with_tool_filter(mut self, filter: ToolFilter) -> Self {
        self.tool_filter = Some(filter);
        self
    }

    /// Offers background runs or not.
    pub fn with_background(mut self, enabled: bool) -> Self {
        self.enable_run_in_background = enabled;
        self
    }
}

/// The model-facing subagent tool. Add it to an agent's tool set.
#[derive(Clone)]
pub struct SubagentTool {
    config: SubagentToolConfig,
    subagents: Subagents,
    tasks: Option<TaskService>,
}

impl std::fmt::Debug for SubagentTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubagentTool").field("config", &self.config).finish_non_exhaustive()
    }
}

impl SubagentTool {
    /// Binds the tool to its provider. Fails when the provider is not
    /// registered or lacks a capability the configuration needs, or when
    /// background runs are enabled without a task service.
    pub fn mount(
        subagents: &Subagents,
        config: SubagentToolConfig,
        tasks: Option<TaskService>,
    ) -> Result<SubagentTool, SubagentError> {
        let info = subagents
            .get_provider(&config.provider)
            .ok_or_else(|| SubagentError::NoProvider(config.provider.clone()))?;
        let needs = [
            (matches!(config.max_depth, MaxDepth::Limit(_)), Capability::DepthLimit),
            (config.tool_filter.is_some(), Capability::ToolFilter),
            (config.persona.is_some(), Capability::Persona),
            (config.agent_options.is_some(), Capability::AgentOptions),
        ];
        if let Some((_, missing)) = needs.iter().find(|(needed, c)| *needed && !info.capabilities.supports(*c)) {
            return Err(SubagentError::UnsupportedCapability {
                provider: config.provider.clone(),
                capability: missing.name(),
            });
        }
        if config.enable_run_in_background && tasks.is_none() {
            return Err(SubagentError::InvalidRequest {
                field: "enable_run_in_background",
                reason: "background runs need a task service".to_owned(),
            });
        }
        Ok(SubagentTool { config, subagents: subagents.clone(), tasks })
    }

    /// The name the model calls it by.
    pub fn name(&self) -> &str {
        &self.config.tool_name
    }

    fn request(&self, prompt: &str, label: &str, context: &ToolContext, signal: CancellationToken) -> StartRequest {
        let mut request = StartRequest::new(prompt, context.agent.as_parent(), signal).with_label(label);
        if let MaxDepth::Limit(max) = self.config.max_depth {
            request = request.with_max_depth(max);
        }
        request.agent_options = self.config.agent_options.clone();
        request.persona = self.config.persona.clone();
        request.tool_filter = self.config.tool_filter.clone();
        request
    }
}

/// The tool error for a run that did not complete.
pub fn stop_message(stop_reason: StopReason) -> &'static str {
    match stop_reason {
        StopReason::Aborted => "subagent run was cancelled",
        StopReason::MaxTokens => "subagent run hit its token limit before finishing",
        StopReason::Refusal => "subagent declined the task",
        _ => "subagent run failed",
    }
}

/// Starts, awaits and disposes one run; `Ok((run id, output))` when it
/// completed.
async fn collect(subagents: &Subagents, provider: &str, request: StartRequest) -> Result<(String, String), String> {
    let run = subagents.start(provider, request).await.map_err(|e| format!("could not start the subagent: {e}"))?;
    let result = run.result().await;
    // Dispose on every path; dropping `run` would also dispose it.
    let disposed = run.dispose().await;
    let result = result.map_err(|e| format!("subagent run failed: {e}"))?;
    if let Err(error) = disposed {
        tracing::warn!(run = run.child_id(), %error, "a subagent did not dispose cleanly");
    }
    match result.stop_reason {
        StopReason::Completed => Ok((run.child_id().to_owned(), result.text())),
        other => Err(stop_message(other).to_owned()),
    }
}

impl Tool for SubagentTool {
    fn spec(&self) -> ToolSpec {
        let inherits = self.subagents.get_provider(&self.config.provider).is_some_and(|p| p.inherits_parent_context);
        let prompt = if inherits {
            "The task. The subagent inherits this conversation; state only what is new."
        } else {
            "The task: a complete, standalone prompt. The subagent sees nothing of this conversation."
        };
        let mut properties = json!({
            "description": {"type": "string", "description": "A short (3-5 word) description of the task, for display"},
            "prompt": {"type": "string", "description": prompt},
        });
        if self.config.enable_run_in_background {
            properties["run_in_background"] = json!({
                "type": "boolean",
                "description": "Return a task id at once and collect the output later with task_output"
            });
        }
        let description = if inherits {
            format!(
                "Delegates a task to a subagent that continues this conversation (provider {:?}).",
                self.config.provider
            )
        } else {
            format!("Delegates a task to a fresh subagent (provider {:?}).", self.config.provider)
        };
        ToolSpec {
            name: self.config.tool_name.clone(),
            description,
            parameters: json!({
                "type": "object",
                "properties": properties,
                "required": ["description", "prompt"],
                "additionalProperties": false
            }),
        }
    }

    fn concurrent(&self) -> bool {
        true
    }

    fn dynamic(&self) -> bool {
        true
    }

    fn available(&self) -> bool {
        self.subagents.has_provider(&self.config.provider)
    }

    fn offered_at_depth(&self, depth: u32) -> bool {
        // A child would have depth + 1; at the cap there is no room for one.
        match self.config.max_depth {
            MaxDepth::Limit(max) => depth < max,
            MaxDepth::ProviderManaged => true,
        }
    }

    fn call(&self, arguments: Value, context: ToolContext) -> BoxFuture<'_, ToolOutput> {
        Box::pin(async move {
            let prompt = arguments["prompt"].as_str().unwrap_or_default();
            let label = arguments["description"].as_str().unwrap_or_default();
            let background = self.config.enable_run_in_background && arguments["run_in_background"] == json!(true);
            if background {
                let tasks = self.tasks.as_ref().expect("mount checks background runs have a task service");
                // The run's token is the task's: independent of this tool
                // call, tripped by task_kill or the owner's shutdown.
                let task_id = tasks.spawn(&context.agent, label, |cancel| {
                    let request = self.request(prompt, label, &context, cancel);
                    let (subagents, provider) = (self.subagents.clone(), self.config.provider.clone());
                    async move { collect(&subagents, &provider, request).await.map(|(_, output)| output) }
                });
                return ToolOutput::ok(json!({"kind": "background", "task_id": task_id}).to_string());
            }
            // The run's token is a child of the tool call's: cancelling the
            // call cancels the run.
            // A foreground child's activity is passed on as this call's
            // progress (its caller may show it, or pass it further up).
            let reporter = context.clone();
            let request = self
                .request(prompt, label, &context, context.cancel.child_token())
                .with_progress(ProgressSink::new(move |update| reporter.progress(update.clone())));
            match collect(&self.subagents, &self.config.provider, request).await {
                Ok((run_id, output)) => {
                    ToolOutput::ok(json!({"kind": "foreground", "run_id": run_id, "output": output}).to_string())
                }
                Err(message) => ToolOutput::error(message),
            }
        })
    }
}
