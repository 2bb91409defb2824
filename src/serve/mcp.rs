//! `subagents mcp`: this runtime's delegation, served as Model Context
//! Protocol tools on stdio, so that any MCP client (an editor, a coding
//! agent, a desktop assistant) can hand work to supervised children.
//!
//! The client is the root parent. Its calls start children on one
//! provider (`spawn`, the default; `fork`; or `process`, each child a
//! `subagents serve` process), on the scripted demo model unless
//! `--model` names an HTTP model (`openai:NAME`, `openai-responses:NAME`,
//! `anthropic:NAME`); every child runs under this runtime's supervision
//! tree with its limits, and in-process children get the same kit as the
//! CLI's (files, `subagent`, the task tools) so they delegate further, to
//! the depth cap. Children see only the prompt they are given, never the
//! client's conversation.
//!
//! - **Before serving**, the home must take sessions and an HTTP model's
//!   endpoint must accept a connection (the checks of `run` and `fanout`:
//!   [`preflight`]); else [`serve_mcp`] returns the error
//!   at once (`subagents mcp` exits 2) rather than every call failing late.
//! - `initialize` advertises tools (protocol versions up to 2025-11-25,
//!   each with the handshake; the SDK negotiates). A second one is refused
//!   (`-32600`, `data.reason` "already initialized").
//! - `tools/list`: `subagent` (`description`, `prompt`,
//!   `run_in_background`, and where the provider supports them
//!   `output_schema` and `persona`), `task_output`, `task_list`,
//!   `task_kill`: the model-facing tools' semantics and wording (docs/contract.md §9),
//!   driven with a root agent that stands for this client session
//!   (`mcp/tools.rs` has the schemas and the argument checks).
//! - `tools/call` `subagent` answers `{"kind": "foreground", "run_id",
//!   "output"}` as text, and for a structured run (`output_schema`) also
//!   `structuredContent`, the captured value (in the text as
//!   `structured`); its `_meta` names the run too (`kind`, `run_id`), for
//!   a client that shows the model only `structuredContent`; with
//!   `run_in_background` it answers `{"kind":
//!   "background", "task_id"}` at once, unless the session already holds
//!   `--max-background-tasks` unfinished tasks (default 1,000): then a tool
//!   error saying so. A run that does not complete is a
//!   tool error (`isError`) with the tool's wording (`subagent run was
//!   cancelled`, `subagent run failed`, …), as are the task tools' own
//!   errors (`no task "task-9" for this session`: another session's tasks
//!   do not exist here). An unknown tool or arguments that break its schema
//!   are `-32602` listing the violations.
//! - **Progress**: a foreground call with a `progressToken` gets
//!   `notifications/progress` whose messages are its run's text, tool
//!   calls and nested children (`mcp/progress.rs`), at most one every 200 ms
//!   (the last at once: the bound never delays the answer), none once the
//!   call is cancelled.
//! - **Fan-out**: calls run concurrently, their runs at most
//!   `--concurrency` at once (the default four per core); the others queue
//!   (a queued call is told so through its progress) and reading goes on.
//! - **Permission requests** of the calls' descendants (an ACP child with
//!   `permission = "ask"`, an in-process tool marked `approve`) are asked
//!   of the client with `elicitation/create` when it declared the
//!   capability, else decided by the configuration's `[approvals]` rules,
//!   else rejected (`mcp/approvals.rs`).
//! - **Cancellation**: `notifications/cancelled` for a call cancels its run
//!   and the run's subtree; the run is disposed and its place freed, and,
//!   as MCP asks, no answer is sent (the SDK's client resolves the call as
//!   cancelled itself).
//!
//! **Input** is capped at 8 MiB a line; an over-long line, invalid UTF-8
//! or invalid JSON costs one `-32700` reply with id `null`, and the server
//! keeps serving (the table of every error we answer ourselves is in
//! `mcp/framing.rs`). A request id reused while it is in flight is refused
//! (`-32600`, naming the id). **EOF** on stdin — or SIGINT, SIGTERM or
//! SIGHUP, or stdout gone — cancels every call and every run (a call cut
//! off answers `subagent run was cancelled`), waits up to 30 s until every
//! request has had its one answer written (past the bound what is left is
//! dropped, and a warning names it), cancels and awaits the background
//! tasks, shuts the runtime down (no child process survives) and exits 0.
//!
//! Built on the official Rust SDK (`rmcp`), server side only.
//!
//! ```no_run
//! use subagents::serve::{serve_mcp, McpChildProvider, McpServeOptions};
//!
//! // What `subagents mcp --provider fork --concurrency 2` runs.
//! let options = McpServeOptions { provider: McpChildProvider::Fork, concurrency: Some(2), ..McpServeOptions::default() };
//! serve_mcp(options).expect("served until EOF");
//! ```

mod approvals;
mod framing;
mod progress;
mod tools;

use std::borrow::Cow;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, InitializeResult,
    ListToolsResult, MetaObject, PaginatedRequestParams, ProtocolVersion, ServerCapabilities, ServerConfig,
    Tool as McpTool,
};
use rmcp::service::{RequestContext, RoleServer, ServerInitializeError};
use rmcp::{ErrorData, ServerHandler, ServiceExt};
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use self::approvals::ElicitingApprover;
use self::progress::Progress;
use self::tools::{Catalog, Limits, Target};
use super::{preflight, ServeError};
use crate::agent::{Agent, ListDir, Model, ModelSpec, ReadFile, ScriptedModel, Tool, ToolContext, ToolOutput, Toolset};
use crate::providers::{ChildInfo, InProcessProvider};
use crate::seam::{Approvals, Rules, TraceContext};
use crate::telemetry;
use crate::tool::{
    shared_delegating_toolset, Begun, Delegated, Delegation, MaxDepth, SubagentTool, SubagentToolConfig, TaskService,
};
use crate::{Runtime, Subagents};

// How deep in-process children may delegate unless `--max-depth` says.
use crate::tool::DEFAULT_MAX_DEPTH;

/// The newest protocol version served: the last with the `initialize`
/// handshake.
const NEWEST_PROTOCOL: ProtocolVersion = ProtocolVersion::V_2025_11_25;

/// Every protocol version served, up to [`NEWEST_PROTOCOL`].
fn supported_versions() -> &'static [ProtocolVersion] {
    ProtocolVersion::known_up_to(&NEWEST_PROTOCOL)
}

/// What the server tells a client about itself at `initialize`.
const INSTRUCTIONS: &str = "Delegate work to supervised subagents. `subagent` runs a task on a fresh child that \
    sees only the prompt you give it (never this conversation), so write a complete, standalone prompt. Independent \
    tasks may be called at once; they run in parallel up to this server's limit. With run_in_background, collect the \
    result later with task_output; task_list and task_kill manage those tasks.";

/// The provider a client's calls start children on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ChildProvider {
    /// A fresh in-process child per call.
    #[default]
    Spawn,
    /// An in-process child that would inherit its parent's conversation
    /// (the client's has none here; its own children inherit theirs).
    Fork,
    /// A `subagents serve` process per call, with its own runtime.
    Process,
}

impl ChildProvider {
    /// The provider's registry name.
    pub fn name(self) -> &'static str {
        match self {
            ChildProvider::Spawn => "spawn",
            ChildProvider::Fork => "fork",
            ChildProvider::Process => "process",
        }
    }
}

impl FromStr for ChildProvider {
    type Err = ServeError;

    fn from_str(name: &str) -> Result<Self, ServeError> {
        match name {
            "spawn" => Ok(ChildProvider::Spawn),
            "fork" => Ok(ChildProvider::Fork),
            "process" => Ok(ChildProvider::Process),
            other => Err(ServeError::Options(format!("unknown provider {other:?}: spawn, fork or process"))),
        }
    }
}

/// How `subagents mcp` serves.
#[derive(Clone, Debug)]
pub struct McpServeOptions {
    /// Where the children run.
    pub provider: ChildProvider,
    /// `scripted`, `openai:NAME`, `openai-responses:NAME` or `anthropic:NAME`: the children's model.
    pub model: String,
    /// Where sessions are kept (default: `$SUBAGENTS_HOME`, else
    /// `.subagents`).
    pub home: Option<PathBuf>,
    /// How deep in-process children may delegate (default
    /// [`DEFAULT_MAX_DEPTH`]); a `process` child caps its own, so this is
    /// refused with it.
    pub max_depth: Option<u32>,
    /// How many runs of the client's calls at once (default four per core).
    pub concurrency: Option<usize>,
    /// How many unfinished background tasks one session may hold (the
    /// client's, and each child's); default
    /// [`DEFAULT_MAX_LIVE_TASKS`](crate::tool::DEFAULT_MAX_LIVE_TASKS).
    pub max_background_tasks: Option<usize>,
    /// Children on a provider of a configuration file instead of
    /// `provider` (feature `config`): every provider of the file is
    /// registered, the calls start children on the one named.
    #[cfg(feature = "config")]
    pub configured: Option<Configured>,
}

#[cfg(feature = "config")]
use crate::config::Configured;

impl Default for McpServeOptions {
    fn default() -> Self {
        McpServeOptions {
            provider: ChildProvider::Spawn,
            model: "scripted".to_owned(),
            home: None,
            max_depth: None,
            concurrency: None,
            max_background_tasks: None,
            #[cfg(feature = "config")]
            configured: None,
        }
    }
}

/// Serves MCP on this process's stdin and stdout until EOF.
pub fn serve_mcp(options: McpServeOptions) -> Result<(), ServeError> {
    let cwd = std::env::current_dir().map_err(|e| ServeError::Options(format!("no working directory: {e}")))?;
    let mut builder = Runtime::builder();
    if let Some(home) = &options.home {
        builder = builder.home(home);
    }
    let runtime = builder.build().map_err(ServeError::Runtime)?;
    // As `run` and `fanout` do: a home or a model that cannot work is
    // refused before serving, not by every call, late.
    let checked = model_spec(&options).and_then(|spec| {
        preflight::check_home(&runtime.home())?;
        let probed = spec.clone();
        let model = runtime.block_on(async move { preflight::reachable_model(&probed).await })?;
        Ok((spec, model))
    });
    let session = match checked.and_then(|(spec, model)| Session::build(&runtime, &options, &cwd, &spec, model)) {
        Ok(session) => Arc::new(session),
        Err(error) => {
            runtime.shutdown_blocking();
            return Err(error);
        }
    };
    let served = runtime.block_on(serve(session.clone()));
    // The client's background tasks end with its session.
    let root = session.root.clone();
    runtime.block_on(async move {
        if let Err(error) = root.shutdown().await {
            tracing::warn!(%error, "the client's session did not close cleanly");
        }
    });
    runtime.shutdown_blocking();
    served
}

/// One client session: the root agent that stands for the client, its
/// tools, and the token EOF trips.
struct Session {
    subagents: Subagents,
    root: Agent,
    subagent: SubagentTool,
    catalog: Catalog,
    /// The run limit `subagent` queues under.
    slots: Arc<Semaphore>,
    concurrency: usize,
    /// Cancelled at stdin EOF: every call and its runs end.
    closing: CancellationToken,
    /// Where the children's permission requests are asked (the client,
    /// known from its first call).
    approver: Arc<ElicitingApprover>,
}

impl Session {
    /// The session for `options`, its children on `model` (`spec` names it
    /// to a `process` child, which builds its own).
    fn build(
        runtime: &Runtime,
        options: &McpServeOptions,
        cwd: &Path,
        spec: &ModelSpec,
        model: Arc<dyn Model>,
    ) -> Result<Session, ServeError> {
        let subagents = runtime.subagents();
        let tasks = options.max_background_tasks.map_or_else(TaskService::new, TaskService::with_max_live);
        #[cfg(feature = "config")]
        if let Some(configured) = &options.configured {
            return Session::configured(runtime, options, configured, cwd, spec, model, tasks);
        }
        let name = options.provider.name();
        let (max_depth, kit) = match options.provider {
            ChildProvider::Process => {
                if options.max_depth.is_some() {
                    let reason = "a process child caps its own delegation depth: --max-depth is for spawn and fork";
                    return Err(ServeError::Options(reason.to_owned()));
                }
                let provider = super::stdio::door_process_provider(name, runtime.home(), spec)
                    .map_err(|e| ServeError::Options(e.to_string()))?;
                subagents.register_provider(provider)?.keep();
                (MaxDepth::ProviderManaged, process_child_kit(&tasks))
            }
            in_process => {
                let depth = options.max_depth.unwrap_or(DEFAULT_MAX_DEPTH);
                // Children get the same kit as the CLI's: they delegate
                // further, on this provider, to the depth cap.
                let kit = Arc::new(shared_delegating_toolset(&subagents, &tasks, name, depth));
                let provider = match in_process {
                    ChildProvider::Fork => InProcessProvider::fork(name, model),
                    _ => InProcessProvider::spawn(name, model),
                };
                let tools = kit.clone();
                subagents.register_provider(provider.with_tools(Arc::new(move |_: &ChildInfo| tools())))?.keep();
                (MaxDepth::Limit(depth), kit())
            }
        };
        let read_only = children_read_only(&kit, "subagent");
        let serving = Serving { name, max_depth, children_read_only: read_only, policy: None };
        Session::serving(subagents, tasks, options, serving, cwd, spec, &runtime.home())
    }

    /// The session on a configured provider: every provider of the file
    /// registered, the calls on `configured.provider`. A provider that
    /// enforces no depth cap manages its own; the children's tools are not
    /// inspected, so the calls are not hinted read-only.
    #[cfg(feature = "config")]
    fn configured(
        runtime: &Runtime,
        options: &McpServeOptions,
        configured: &Configured,
        cwd: &Path,
        spec: &ModelSpec,
        model: Arc<dyn Model>,
        tasks: TaskService,
    ) -> Result<Session, ServeError> {
        if options.max_depth.is_some() {
            let reason = "a configured provider sets its depth in the file ([tool] max_depth): --max-depth is refused";
            return Err(ServeError::Options(reason.to_owned()));
        }
        let subagents = runtime.subagents();
        configured
            .register_blocking(&subagents, &tasks, &runtime.home(), model)
            .map_err(|e| ServeError::Options(e.to_string()))?;
        let name = configured.provider();
        let info = subagents.provider(name).ok_or_else(|| ServeError::Options(format!("no provider {name:?}")))?;
        let max_depth = match info.capabilities.depth_limit {
            true => MaxDepth::Limit(configured.config.tool_max_depth()),
            false => MaxDepth::ProviderManaged,
        };
        let policy = configured.config.approvals().cloned();
        let serving = Serving { name, max_depth, children_read_only: false, policy };
        Session::serving(subagents, tasks, options, serving, cwd, spec, &runtime.home())
    }

    /// The session once its provider is registered: the `subagent` tool on
    /// `name`, the catalog, the root.
    fn serving(
        subagents: Subagents,
        tasks: TaskService,
        options: &McpServeOptions,
        serving: Serving<'_>,
        cwd: &Path,
        spec: &ModelSpec,
        home: &Path,
    ) -> Result<Session, ServeError> {
        let Serving { name, max_depth, children_read_only, policy } = serving;
        let concurrency = options.concurrency.unwrap_or_else(default_concurrency).max(1);
        let slots = Arc::new(Semaphore::new(concurrency));
        let config = SubagentToolConfig::new(name).with_max_depth(max_depth);
        let subagent = SubagentTool::mount(&subagents, config, Some(tasks.clone()))?.with_run_limit(slots.clone());
        let info = subagents.provider(name).ok_or_else(|| ServeError::Options(format!("no provider {name:?}")))?;
        let limits = Limits {
            concurrency,
            max_depth,
            background: tasks.max_live(),
            children_read_only,
            open_world: !matches!(spec, ModelSpec::Scripted),
        };
        let catalog =
            Catalog::new(&subagent, &info, tasks.tools(), limits).map_err(|e| ServeError::Options(e.to_string()))?;
        // The root never prompts a model: it is the client's identity (its
        // session owns the background tasks) and the children's parent. Its
        // session is in the home, so `sessions tree` of it shows every run
        // the client started (a process child's included).
        // What its descendants ask climbs to the client.
        let approver = Arc::new(ElicitingApprover::new(policy));
        let root = Agent::builder(ScriptedModel::new())
            .approvals(Approvals::new(approver.clone()))
            .store(crate::agent::SessionStore::new(home))
            .cwd(cwd)
            .build()
            .map_err(|e| ServeError::Options(e.to_string()))?;
        let closing = CancellationToken::new();
        Ok(Session { subagents, root, subagent, catalog, slots, concurrency, closing, approver })
    }

    /// The context the client's call `call_id` runs with, as the root.
    fn tool_context(&self, call_id: String, cancel: CancellationToken) -> ToolContext {
        ToolContext {
            agent: self.root.clone(),
            session_id: self.root.id().into(),
            cwd: self.root.cwd().into(),
            call_id,
            cancel,
        }
    }

    /// Runs `subagent`; progress goes to the call's token when it has one.
    async fn delegate(
        &self,
        arguments: &Value,
        context: &ToolContext,
        request: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        let delegation = Delegation::from_arguments(arguments);
        let label = delegation.description.clone();
        let mut progress = match request.meta.get_progress_token() {
            Some(token) if !delegation.run_in_background => {
                Some(Progress::new(token, request.peer.clone(), self.subagents.subscribe(), request.ct.clone()))
            }
            _ => None,
        };
        if let Some(progress) = &mut progress {
            if self.slots.available_permits() == 0 {
                progress
                    .say(format!("[{label}] queued until a run slot frees up (at most {} at once)", self.concurrency))
                    .await;
            }
        }
        let outcome = match self.subagent.begin(delegation, context).await {
            Err(message) => Err(message),
            Ok(Begun::Background { task_id }) => Ok(Delegated::Background { task_id }),
            Ok(Begun::Foreground(run)) => {
                let following = progress.map(|progress| progress.follow(&run, &label));
                let outcome = run.finish().await;
                if let Some(following) = following {
                    following.finish().await;
                }
                outcome
            }
        };
        match outcome {
            Ok(delegated) => {
                let answer = delegated.to_json();
                let mut result = CallToolResult::success(vec![ContentBlock::text(answer.to_string())]);
                // A client that hands the model only `structuredContent` (it
                // must match the caller's schema, so it carries nothing else)
                // still finds which run answered, and how.
                let meta = ["kind", "run_id", "task_id"]
                    .into_iter()
                    .filter_map(|key| Some((key.to_owned(), answer.get(key)?.clone())))
                    .collect();
                result.meta = Some(MetaObject(meta));
                if let Delegated::Foreground { structured: Some(value), .. } = delegated {
                    result.structured_content = Some(value);
                }
                result
            }
            Err(error) => CallToolResult::error(vec![ContentBlock::text(error.to_string())]),
        }
    }
}

/// What a session serves: the provider its calls start children on, and
/// what is said of them.
struct Serving<'a> {
    name: &'a str,
    max_depth: MaxDepth,
    children_read_only: bool,
    /// The configuration's `[approvals]`, for a client that cannot be asked.
    policy: Option<Rules>,
}

/// Whether a `subagent` call leaves everything as it found it: every tool
/// of the children's kit only reads ([`Tool::read_only`]), but their own
/// `subagent` (named `delegating`), whose children get this same kit, so
/// that the whole tree only reads. Today's kit: `read_file`, `list_dir`,
/// the task tools (which touch only the child's own tasks) and `subagent`:
/// read-only. A tool that writes, added to the kit, turns this off.
fn children_read_only(kit: &Toolset, delegating: &str) -> bool {
    kit.names().into_iter().all(|name| name == delegating || kit.read_only(name))
}

/// What a `process` child's tools are, as far as [`children_read_only`]
/// asks: `subagents serve`'s default profile takes the same kit as an
/// in-process child (the file tools, `subagent`, the task tools).
fn process_child_kit(tasks: &TaskService) -> Toolset {
    let mut kit = Toolset::new();
    let file_tools: [Arc<dyn Tool>; 2] = [Arc::new(ReadFile), Arc::new(ListDir)];
    for tool in file_tools.into_iter().chain(tasks.tools()) {
        kit.add_shared(tool).expect("the kit's names are distinct");
    }
    kit
}

fn default_concurrency() -> usize {
    4 * std::thread::available_parallelism().map_or(1, usize::from)
}

/// `--model`: a route of the configuration when one is given and names
/// it, else `scripted` or `openai:NAME`.
fn model_spec(options: &McpServeOptions) -> Result<ModelSpec, ServeError> {
    #[cfg(feature = "config")]
    if let Some(route) = options.configured.as_ref().and_then(|c| c.config.route(&options.model)) {
        return Ok(ModelSpec::Route(route.clone()));
    }
    Ok(ModelSpec::parse(&options.model)?)
}

/// Serves until the client is gone.
async fn serve(session: Arc<Session>) -> Result<(), ServeError> {
    let (transport, input) = framing::stdio(session.closing.clone(), supported_versions());
    let input = tokio::spawn(input);
    let served = match Server(session.clone()).serve(transport).await {
        Ok(running) => running.waiting().await.map(drop).map_err(|e| ServeError::Connection(e.to_string())),
        // Stdin ended before any initialize: nothing was asked.
        Err(ServerInitializeError::ConnectionClosed(_)) => Ok(()),
        Err(error) => Err(ServeError::Connection(error.to_string())),
    };
    session.closing.cancel();
    input.abort();
    served
}

/// The SDK's handler: the session's tools.
#[derive(Clone)]
struct Server(Arc<Session>);

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_protocol_version(NEWEST_PROTOCOL)
            .with_server_info(Implementation::new("subagents", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(supported_versions())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.0.catalog.tools()))
    }

    fn get_tool(&self, name: &str) -> Option<McpTool> {
        self.0.catalog.get(name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let session = &self.0;
        session.approver.attach(&context.peer);
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let target = session.catalog.check(&request.name, &arguments)?;
        let cancel = session.closing.child_token();
        let tool_context = session.tool_context(context.id.to_string(), cancel.clone());
        // The caller's trace, when its `_meta` carries one: the runs this
        // call starts join it.
        let trace = TraceContext::from_meta(&context.meta);
        let span = telemetry::served_tool(&request.name, trace.as_ref());
        let result = cancelled_by(&context.ct, &cancel, async {
            match target {
                Target::Subagent => session.delegate(&arguments, &tool_context, &context).await,
                Target::Task(tool) => tool_result(tool.call(arguments.clone(), tool_context.clone()).await),
            }
        })
        .instrument(span)
        .await;
        Ok(result.into())
    }
}

/// Runs `work` to its end, cancelling `cancel` when the client cancels the
/// call (`call`): the work then ends as cancelled, its run disposed.
async fn cancelled_by<T>(call: &CancellationToken, cancel: &CancellationToken, work: impl Future<Output = T>) -> T {
    tokio::pin!(work);
    tokio::select! {
        done = &mut work => return done,
        _ = call.cancelled() => cancel.cancel(),
    }
    work.await
}

fn tool_result(output: ToolOutput) -> CallToolResult {
    let content = vec![ContentBlock::text(output.content)];
    if output.is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::FnTool;

    fn tool(name: &str) -> Arc<dyn Tool> {
        let parameters = serde_json::json!({"type": "object"});
        Arc::new(FnTool::new(name, "a tool", parameters, |_| ToolOutput::ok("done")))
    }

    #[test]
    fn subagent_reads_only_while_every_other_tool_of_the_childrens_kit_does() {
        let mut kit = process_child_kit(&TaskService::new());
        kit.add_shared(tool("subagent")).unwrap();
        assert!(children_read_only(&kit, "subagent"), "{:?}", kit.names());
        kit.add_shared(tool("write_file")).unwrap();
        assert!(!children_read_only(&kit, "subagent"), "a tool that does not say it only reads");
    }
}
