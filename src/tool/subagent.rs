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
//! was cancelled`, `subagent run failed` (with the diagnostic's safe
//! reason: `subagent run failed: the scripted model failed`), `subagent
//! run hit its token limit before finishing`, `subagent declined the
//! task`. Success is
//! `{"kind": "foreground", "run_id", "output"}`, where `run_id` holds the
//! child's id ([`Run::child_id`]: for `spawn` and `fork` the session id
//! `subagents sessions show` reads), not the runtime's numeric run id
//! ([`Run::run_id`]) the events carry. The key keeps its name because
//! models' prompts and MCP clients already read it.
//!
//! **Background**: returns `{"kind": "background", "task_id"}` at once; the
//! run gets its own cancellation, independent of the calling tool call, and
//! is collected with the task tools ([`TaskService`]).
//!
//! **Per call** ([`Delegation`]): besides the model's arguments, a caller
//! that drives the tool directly (the MCP server does) may ask for a
//! structured result (`output_schema`) or a persona, where the provider
//! advertises them ([`SubagentTool::begin`], [`ForegroundRun::finish`]).
//! A tool given a run limit ([`SubagentTool::with_run_limit`]) runs at most
//! that many of its runs at once; the others queue, cancellably.
//!
//! **Budget**: a tool configured with a [`Budget`]
//! ([`SubagentToolConfig::with_budget`]) opens it on a calling agent that
//! holds none, at its first delegation; children inherit it. A start the
//! budget refuses is a tool error the model reads: `delegation refused
//! (BUDGET_EXHAUSTED): budget exhausted: total runs 5 of 5 used; …`.
//!
//! The tool is present while its provider is registered: it follows
//! provider removal and re-registration. Several instances with distinct
//! names expose several providers to one agent (a duplicate name is
//! refused by the agent's tool set). Configuration is checked against the
//! provider when the tool is mounted: a numeric `max_depth` needs a provider
//! with `depth_limit`, a persona needs `persona`, and so on.

mod error;

use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde_json::{json, Value};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

pub use error::DelegationError;

use super::tasks::TaskService;
use crate::actors::{Run, Subagents};
use crate::agent::{Tool, ToolContext, ToolOutput, ToolSpec};
use crate::seam::{
    AgentOptions, Budget, Capability, ProgressSink, RunResult, StartError, StartRequest, StopReason, ToolFilter,
};

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
    /// A delegation budget opened on the calling agent at its first
    /// delegation when it holds none (a root agent); an agent that already
    /// holds one (a child, which inherited its root's) delegates on that.
    pub budget: Option<Budget>,
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
            budget: None,
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

    /// Sets the delegation budget a root caller opens ([`Budget`]).
    pub fn with_budget(mut self, budget: Budget) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Offers background runs or not.
    pub fn with_background(mut self, enabled: bool) -> Self {
        self.enable_run_in_background = enabled;
        self
    }
}

/// One call of the subagent tool: the model's arguments, and what a caller
/// driving the tool directly may add.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Delegation {
    /// A short description of the task, for display (the run's label).
    pub description: String,
    /// The task.
    pub prompt: String,
    /// Return a task id at once (needs background runs enabled).
    pub run_in_background: bool,
    /// A JSON Schema the child's structured result must satisfy (needs a
    /// provider with `output_schema`).
    pub output_schema: Option<Value>,
    /// The child's persona, over the tool's (needs `persona`).
    pub persona: Option<String>,
}

impl Delegation {
    /// Reads the tool's arguments (`description`, `prompt`,
    /// `run_in_background`, `output_schema`, `persona`); the caller checks
    /// them against the tool's schema first.
    pub fn from_arguments(arguments: &Value) -> Self {
        Delegation {
            description: arguments["description"].as_str().unwrap_or_default().to_owned(),
            prompt: arguments["prompt"].as_str().unwrap_or_default().to_owned(),
            run_in_background: arguments["run_in_background"] == json!(true),
            output_schema: arguments.get("output_schema").filter(|schema| !schema.is_null()).cloned(),
            persona: arguments["persona"].as_str().map(str::to_owned),
        }
    }
}

/// What a delegation produced.
#[derive(Clone, Debug, PartialEq)]
pub enum Delegated {
    /// A foreground run completed.
    Foreground {
        /// The child's id ([`Run::child_id`]), as the tool's answer names it.
        run_id: String,
        /// The child's answer.
        output: String,
        /// The captured structured value, when one was asked for.
        structured: Option<Value>,
    },
    /// A background task was started.
    Background {
        /// Collect it with `task_output`.
        task_id: String,
    },
}

impl Delegated {
    /// The tool's answer: `{"kind": "foreground", "run_id", "output"}`
    /// (with `structured` when captured) or `{"kind": "background",
    /// "task_id"}`.
    pub fn to_json(&self) -> Value {
        match self {
            Delegated::Foreground { run_id, output, structured } => {
                let mut answer = json!({"kind": "foreground", "run_id": run_id, "output": output});
                if let Some(structured) = structured {
                    answer["structured"] = structured.clone();
                }
                answer
            }
            Delegated::Background { task_id } => json!({"kind": "background", "task_id": task_id}),
        }
    }
}

/// A started delegation ([`SubagentTool::begin`]).
#[derive(Debug)]
pub enum Begun {
    /// A foreground run, started: collect it with [`ForegroundRun::finish`].
    Foreground(Box<ForegroundRun>),
    /// A background task, running on its own (its run may still be queued).
    Background {
        /// Collect it with `task_output`.
        task_id: String,
    },
}

/// A foreground run that has started and is not yet collected. Dropping
/// it disposes the run in the background, as dropping a [`Run`] does.
#[derive(Debug)]
pub struct ForegroundRun {
    run: Run,
    /// Its place under the tool's run limit, held until it is disposed.
    _slot: Option<OwnedSemaphorePermit>,
}

impl ForegroundRun {
    /// The runtime-minted number the run's events carry ([`Run::run_id`]).
    pub fn run_id(&self) -> u64 {
        self.run.run_id()
    }

    /// The child's own name ([`Run::child_id`]): its session id in process,
    /// which its own children's events name as their parent.
    pub fn child_id(&self) -> &str {
        self.run.child_id()
    }

    /// Awaits the result and disposes the run; a stop other than completed
    /// is [`DelegationError::Stopped`], with the tool error of
    /// [`stop_message`].
    pub async fn finish(self) -> Result<Delegated, DelegationError> {
        let ForegroundRun { run, _slot } = self;
        let (output, structured) = settle(&run).await?;
        Ok(Delegated::Foreground { run_id: run.child_id().to_owned(), output, structured })
    }
}

/// The model-facing subagent tool. Add it to an agent's tool set.
#[derive(Clone)]
pub struct SubagentTool {
    config: SubagentToolConfig,
    subagents: Subagents,
    tasks: Option<TaskService>,
    /// At most this many runs of this tool at once; the rest queue.
    run_limit: Option<Arc<Semaphore>>,
}

impl std::fmt::Debug for SubagentTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubagentTool")
            .field("config", &self.config)
            .field("run_limit_free", &self.run_limit.as_ref().map(|limit| limit.available_permits()))
            .finish_non_exhaustive()
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
    ) -> Result<SubagentTool, StartError> {
        let info =
            subagents.provider(&config.provider).ok_or_else(|| StartError::NoProvider(config.provider.clone()))?;
        let needs = [
            (matches!(config.max_depth, MaxDepth::Limit(_)), Capability::DepthLimit),
            (config.tool_filter.is_some(), Capability::ToolFilter),
            (config.persona.is_some(), Capability::Persona),
            (config.agent_options.is_some(), Capability::AgentOptions),
        ];
        if let Some((_, missing)) = needs.iter().find(|(needed, c)| *needed && !info.capabilities.supports(*c)) {
            return Err(StartError::unsupported(&config.provider, *missing));
        }
        if config.enable_run_in_background && tasks.is_none() {
            return Err(StartError::invalid("enable_run_in_background", "background runs need a task service"));
        }
        Ok(SubagentTool { config, subagents: subagents.clone(), tasks, run_limit: None })
    }

    /// Runs at most as many runs of this tool at once as `limit` has
    /// permits (foreground and background alike, shared with every clone);
    /// a further call queues until one ends. A queued call that is
    /// cancelled ends `subagent run was cancelled` without starting.
    pub fn with_run_limit(mut self, limit: Arc<Semaphore>) -> Self {
        self.run_limit = Some(limit);
        self
    }

    /// The name the model calls it by.
    pub fn name(&self) -> &str {
        &self.config.tool_name
    }

    /// The provider it delegates to.
    pub fn provider(&self) -> &str {
        &self.config.provider
    }

    fn request(&self, delegation: &Delegation, context: &ToolContext, signal: CancellationToken) -> StartRequest {
        if let Some(budget) = self.config.budget {
            context.agent.budget_or_open(budget);
        }
        let mut request = StartRequest::new(&delegation.prompt, context.agent.as_parent(), signal)
            .with_label(&delegation.description);
        if let MaxDepth::Limit(max) = self.config.max_depth {
            request = request.with_max_depth(max);
        }
        request.agent_options = self.config.agent_options.clone();
        request.persona = delegation.persona.clone().or_else(|| self.config.persona.clone());
        request.tool_filter = self.config.tool_filter.clone();
        request.output_schema = delegation.output_schema.clone();
        request
    }

    /// Starts a delegation: a foreground run once it has started (after
    /// its turn under the run limit), or a background task at once. The
    /// foreground run's cancellation is a child of `context.cancel`; a
    /// background run has its own, tripped by `task_kill` or the owner's
    /// shutdown. `Err` says why, as the tool error the model reads
    /// (`could not start the subagent: …`, `subagent run was cancelled`).
    pub async fn begin(&self, delegation: Delegation, context: &ToolContext) -> Result<Begun, DelegationError> {
        if self.config.enable_run_in_background && delegation.run_in_background {
            let tasks = self.tasks.as_ref().expect("mount checks background runs have a task service");
            let spawned = tasks.spawn(&context.agent, &delegation.description, |cancel| {
                let request = self.request(&delegation, context, cancel.clone());
                let (subagents, provider, limit) =
                    (self.subagents.clone(), self.config.provider.clone(), self.run_limit.clone());
                async move {
                    let collected = async {
                        let _slot = queue(limit, &cancel).await?;
                        let run = start(&subagents, &provider, request).await?;
                        let (output, structured) = settle(&run).await?;
                        // A structured answer is collected as its JSON text.
                        Ok::<_, DelegationError>(structured.map_or(output, |value| value.to_string()))
                    };
                    collected.await.map_err(|error| error.to_string())
                }
            });
            let task_id = spawned?;
            return Ok(Begun::Background { task_id });
        }
        let signal = context.cancel.child_token();
        let slot = queue(self.run_limit.clone(), &signal).await?;
        // A foreground child's activity is passed on as this call's
        // progress (its caller may show it, or pass it further up).
        let reporter = context.clone();
        let request = self
            .request(&delegation, context, signal)
            .with_progress(ProgressSink::new(move |update| reporter.progress(update.clone())));
        let run = start(&self.subagents, &self.config.provider, request).await?;
        Ok(Begun::Foreground(Box::new(ForegroundRun { run, _slot: slot })))
    }

    /// [`begin`](Self::begin), then for a foreground run
    /// [`finish`](ForegroundRun::finish): the tool's answer, or the tool
    /// error the model reads (the [`DelegationError`]'s message).
    pub async fn delegate(&self, delegation: Delegation, context: &ToolContext) -> Result<Delegated, DelegationError> {
        match self.begin(delegation, context).await? {
            Begun::Foreground(run) => run.finish().await,
            Begun::Background { task_id } => Ok(Delegated::Background { task_id }),
        }
    }

    /// The spec as a caller sees it whose children do (`true`) or do not
    /// inherit its conversation. A root caller without a conversation (the
    /// MCP client) gets the standalone wording whatever the provider.
    pub(crate) fn spec_for(&self, inherits: bool) -> ToolSpec {
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

/// The tool error for a result that did not complete: [`stop_message`],
/// and for a failure what the diagnostic says of it, safe to show a model
/// (its fixed-wording reason, else its category; never a payload):
/// `subagent run failed: the model endpoint answered 404`.
fn incomplete_message(result: &RunResult) -> String {
    let message = stop_message(result.stop_reason);
    match (&result.diagnostic, result.stop_reason) {
        (Some(diagnostic), StopReason::Error) => match &diagnostic.reason {
            Some(reason) => format!("{message}: {reason}"),
            None => format!("{message} ({})", diagnostic.category_name()),
        },
        _ => message.to_owned(),
    }
}

/// Waits for a place under `limit` (none: at once); cancelled while
/// waiting, the run never starts.
async fn queue(
    limit: Option<Arc<Semaphore>>,
    signal: &CancellationToken,
) -> Result<Option<OwnedSemaphorePermit>, DelegationError> {
    let Some(limit) = limit else { return Ok(None) };
    tokio::select! {
        biased;
        _ = signal.cancelled() => Err(DelegationError::Cancelled),
        // The semaphore is never closed; a closed one would only lift the limit.
        permit = limit.acquire_owned() => Ok(permit.ok()),
    }
}

async fn start(subagents: &Subagents, provider: &str, request: StartRequest) -> Result<Run, DelegationError> {
    subagents.start(provider, request).await.map_err(DelegationError::refused_start)
}

/// Awaits and disposes one run; `Ok((output, structured))` when it
/// completed.
async fn settle(run: &Run) -> Result<(String, Option<Value>), DelegationError> {
    let result = run.result().await;
    // Dispose on every path; dropping `run` would also dispose it.
    let disposed = run.dispose().await;
    let result = result.map_err(DelegationError::NoResult)?;
    if let Err(error) = disposed {
        tracing::warn!(run = run.child_id(), %error, "a subagent did not dispose cleanly");
    }
    match result.stop_reason {
        StopReason::Completed => Ok((result.text(), result.structured)),
        stop_reason => Err(DelegationError::Stopped { stop_reason, message: incomplete_message(&result) }),
    }
}

impl Tool for SubagentTool {
    fn spec(&self) -> ToolSpec {
        let inherits = self.subagents.provider(&self.config.provider).is_some_and(|p| p.inherits_parent_context);
        self.spec_for(inherits)
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

    /// Which registration of the provider answers: its spec and presence
    /// follow that alone.
    fn spec_state(&self) -> Option<u64> {
        Some(self.subagents.provider_key(&self.config.provider).unwrap_or(0))
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
            match self.delegate(Delegation::from_arguments(&arguments), &context).await {
                Ok(delegated) => ToolOutput::ok(delegated.to_json().to_string()),
                Err(error) => ToolOutput::error(error.to_string()),
            }
        })
    }
}
