//! `Subagents`: the handle callers use to register providers, start runs
//! and observe events.

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use actix::Actor;
use tokio::sync::oneshot;

use super::provider::ProviderEntry;
use super::registry::{self, Registration};
use super::run::{RunActor, RunControl, RunSpawn};
use super::run_handle::Run;
use super::run_shared::RunShared;
use super::Core;
use crate::events::{EventStream, ListenerHandle, ListenerOutcome, RunInfo, SubagentEvent};
use crate::live::Live;
use crate::seam::{Launch, Provider, ProviderContext, ProviderInfo, StartRequest, SubagentError, MAX_DEPTH_CAP};

/// A `Clone + Send + Sync` handle on a runtime's registry, usable from any
/// thread or async runtime.
#[derive(Clone)]
pub struct Subagents {
    pub(crate) core: Arc<Core>,
}

impl Subagents {
    /// Register a provider under its name. A duplicate name fails with
    /// `DUPLICATE_PROVIDER` and leaves the first registration untouched.
    pub fn register_provider(&self, provider: impl Provider) -> Result<Registration, SubagentError> {
        self.register_shared(Arc::new(provider))
    }

    /// Register a provider the caller also keeps a handle on.
    pub fn register_shared(&self, provider: Arc<dyn Provider>) -> Result<Registration, SubagentError> {
        registry::register(&self.core, provider)
    }

    /// What a registered provider advertises.
    pub fn get_provider(&self, name: &str) -> Option<ProviderInfo> {
        self.entry(name).map(|entry| entry.info.clone())
    }

    /// Whether a provider of this name is registered right now.
    pub fn has_provider(&self, name: &str) -> bool {
        self.entry(name).is_some()
    }

    /// Registered provider names, in insertion order.
    pub fn list(&self) -> Vec<String> {
        let table = self.core.providers.read().unwrap_or_else(|e| e.into_inner());
        table.iter().map(|entry| entry.name().to_owned()).collect()
    }

    /// Start a child on provider `name`.
    ///
    /// Checks, in order, before any child exists: the provider is registered
    /// (`NO_PROVIDER`); every requested start-time capability is advertised
    /// (`UNSUPPORTED_CAPABILITY`, first unmet in the order output_schema,
    /// depth_limit, tool_filter, persona, agent_options); request values are
    /// sane (`INVALID_REQUEST`); the output schema is inside the subset
    /// (`UNSUPPORTED_SCHEMA`); the signal is not cancelled (`ABORTED`). Then
    /// it waits until the provider has published a real child, emits
    /// `Start`, and hands the caller the [`Run`].
    pub async fn start(&self, name: &str, request: StartRequest) -> Result<Run, SubagentError> {
        let entry = self.admit(name, &request)?;
        let core = self.core.clone();
        self.core.on_runtime(launch(core, entry, request)).await?
    }

    /// Every event from now on.
    pub fn subscribe(&self) -> EventStream {
        self.core.bus.subscribe()
    }

    /// Call `listener` for every event, on the runtime's events thread, until
    /// the handle is dropped. A panic or an `Err` is logged and contained.
    pub fn add_listener<F, R>(&self, listener: F) -> ListenerHandle
    where
        F: Fn(&SubagentEvent) -> R + Send + 'static,
        R: ListenerOutcome,
    {
        self.core.bus.add_listener(&self.core.events_thread, listener)
    }

    /// Live runs, actors and child processes right now.
    pub fn live(&self) -> Live {
        self.core.live.snapshot()
    }

    fn entry(&self, name: &str) -> Option<Arc<ProviderEntry>> {
        let table = self.core.providers.read().unwrap_or_else(|e| e.into_inner());
        table.iter().find(|entry| entry.name() == name).cloned()
    }

    /// The synchronous checks, in contract order.
    fn admit(&self, name: &str, request: &StartRequest) -> Result<Arc<ProviderEntry>, SubagentError> {
        if !self.core.is_accepting() {
            return Err(SubagentError::RuntimeStopped);
        }
        let entry = self.entry(name).ok_or_else(|| SubagentError::NoProvider(name.to_owned()))?;
        let capabilities = entry.info.capabilities;
        if let Some(missing) = request.requested_capabilities().find(|c| !capabilities.supports(*c)) {
            return Err(SubagentError::unsupported(name, missing));
        }
        check_values(request)?;
        if let Some(schema) = &request.output_schema {
            crate::schema::check_subset(schema)
                .map_err(|violations| SubagentError::UnsupportedSchema { violations })?;
        }
        if request.signal.is_cancelled() {
            return Err(SubagentError::Aborted { provider: name.to_owned() });
        }
        Ok(entry)
    }
}

fn check_values(request: &StartRequest) -> Result<(), SubagentError> {
    if request.prompt.is_empty() || request.prompt.iter().all(|b| b.as_text().is_some_and(|t| t.trim().is_empty())) {
        return Err(SubagentError::invalid("prompt", "must contain at least one non-empty block"));
    }
    if let Some(max_depth) = request.max_depth {
        if max_depth > MAX_DEPTH_CAP {
            return Err(SubagentError::invalid(
                "max_depth",
                format!("{max_depth} is above the largest representable cap {MAX_DEPTH_CAP}"),
            ));
        }
        let child_depth = request.child_depth();
        if child_depth > max_depth {
            return Err(SubagentError::invalid(
                "max_depth",
                format!("the child would have depth {child_depth}, deeper than max_depth {max_depth}"),
            ));
        }
    }
    if let Some(filter) = &request.tool_filter {
        if filter.allow.is_none() && filter.deny.is_none() {
            return Err(SubagentError::invalid("tool_filter", "needs an allow or a deny list"));
        }
        let names = filter.allow.iter().chain(filter.deny.iter()).flatten();
        if names.into_iter().any(|n| n.trim().is_empty()) {
            return Err(SubagentError::invalid("tool_filter", "tool names must not be empty"));
        }
    }
    if request.persona.as_deref().is_some_and(|p| p.trim().is_empty()) {
        return Err(SubagentError::invalid("persona", "must not be empty"));
    }
    if request.agent_options.as_ref().is_some_and(|o| o.max_tokens == Some(0)) {
        return Err(SubagentError::invalid("agent_options.max_tokens", "must be positive"));
    }
    Ok(())
}

/// Runs on a worker: create the run actor there, wait for publication, emit
/// `Start`, hand back the `Run`.
async fn launch(core: Arc<Core>, entry: Arc<ProviderEntry>, request: StartRequest) -> Result<Run, SubagentError> {
    let token = request.signal.child_token();
    let depth = request.child_depth();
    let label = request.label.clone();
    let shared =
        Arc::new(RunShared::new(core.mint_run_id(), entry, request.parent.session_id.clone(), core.bus.clone()));
    let (publish, published) = oneshot::channel();
    let context = ProviderContext { run: shared.clone(), home: core.home.clone(), live: core.live.clone() };
    let actor = RunActor::new(RunSpawn {
        core: core.clone(),
        shared: shared.clone(),
        launch: Launch { request, cancel: token.clone(), context },
        publish,
    });
    let control = RunControl { addr: actor.start(), token, depth, shared: shared.clone() };
    core.runs.insert(shared.run_id, control.clone());
    let published = published.await.unwrap_or(Err(SubagentError::RuntimeStopped))?;
    shared.publish(|| RunInfo {
        run_id: shared.run_id,
        id: published.id.clone(),
        provider: shared.provider().to_owned(),
        parent_session: shared.parent_session.clone(),
        local: published.local_agent.is_some(),
        label,
    });
    Ok(Run {
        id: published.id,
        control,
        local_agent: published.local_agent,
        steering: published.steering,
        continuation: published.continuation.then_some(core),
        disposed: AtomicBool::new(false),
    })
}

impl fmt::Debug for Subagents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subagents").field("providers", &self.list()).finish()
    }
}
