//! The start path, in contract order (docs/contract.md §3): the synchronous checks
//! (the delegation budget last, because it reserves), then the run actor
//! on a worker (in place when the caller is one), publication, `Start`,
//! and the caller's [`Run`].
//! `Subagents::start` and a continuation both come through here.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::control::RunControl;
use super::core::Core;
use super::entry::ProviderEntry;
use super::run::{Launched, RunActor, RunSpawn};
use super::run_handle::Run;
use super::run_shared::RunShared;
use crate::events::RunInfo;
use crate::seam::{Admission, BudgetLease, Parent, StartError, StartRequest, MAX_DEPTH_CAP};

/// Checks `request` against provider `name`, then starts it on a worker.
pub(crate) async fn start(core: &Arc<Core>, name: &str, request: Box<StartRequest>) -> Result<Run, StartError> {
    let entry = admit(core, name, &request)?;
    let budget = admit_budget(&request)?;
    if core.in_task() {
        // On a worker already: the actor is made right here, and what the
        // start then holds is small (the request went to the provider).
        return launched(make(core.clone(), entry, request, budget)).await;
    }
    // Boxed, because until the worker takes it the future holds the
    // request, and a start's future is held by callers (a fan-out holds
    // thousands).
    let made = {
        let core = core.clone();
        async move { launched(make(core, entry, request, budget)).await }
    };
    core.on_runtime(Box::pin(made)).await?
}

/// The last check, because it reserves: the child's place in the budgets
/// its start answers to (the parent's lease and the request's), and the
/// lease the child will hold. A start refused later gives its run back.
fn admit_budget(request: &StartRequest) -> Result<Option<(Admission, BudgetLease)>, StartError> {
    let admitted = match (request.parent.budget.as_ref(), request.budget.as_ref()) {
        (None, None) => return Ok(None),
        (Some(one), None) | (None, Some(one)) => crate::seam::budget_admit(&[one]),
        (Some(parent), Some(own)) => crate::seam::budget_admit(&[parent, own]),
    };
    admitted.map_err(StartError::BudgetExhausted)
}

/// The synchronous checks, in contract order.
fn admit(core: &Core, name: &str, request: &StartRequest) -> Result<Arc<ProviderEntry>, StartError> {
    if !core.is_accepting() {
        return Err(StartError::RuntimeStopped);
    }
    let entry = core.provider(name).ok_or_else(|| StartError::NoProvider(name.to_owned()))?;
    let capabilities = entry.info.capabilities;
    if let Some(missing) = request.requested_capabilities().find(|c| !capabilities.supports(*c)) {
        return Err(StartError::unsupported(name, missing));
    }
    check_values(request)?;
    if let Some(schema) = &request.output_schema {
        crate::schema::check_subset(schema).map_err(|violations| StartError::UnsupportedSchema { violations })?;
    }
    if request.signal.is_cancelled() {
        return Err(StartError::Aborted { provider: name.to_owned() });
    }
    Ok(entry)
}

fn check_values(request: &StartRequest) -> Result<(), StartError> {
    if request.prompt.is_empty() || request.prompt.iter().all(|b| b.as_text().is_some_and(|t| t.trim().is_empty())) {
        return Err(StartError::invalid("prompt", "must contain at least one non-empty block"));
    }
    if let Some(max_depth) = request.max_depth {
        if max_depth > MAX_DEPTH_CAP {
            return Err(StartError::invalid(
                "max_depth",
                format!("{max_depth} is above the largest representable cap {MAX_DEPTH_CAP}"),
            ));
        }
        let child_depth = request.child_depth();
        if child_depth > max_depth {
            return Err(StartError::invalid(
                "max_depth",
                format!("the child would have depth {child_depth}, deeper than max_depth {max_depth}"),
            ));
        }
    }
    if let Some(filter) = &request.tool_filter {
        if filter.allow.is_none() && filter.deny.is_none() {
            return Err(StartError::invalid("tool_filter", "needs an allow or a deny list"));
        }
        let names = filter.allow.iter().chain(filter.deny.iter()).flatten();
        if names.into_iter().any(|n| n.trim().is_empty()) {
            return Err(StartError::invalid("tool_filter", "tool names must not be empty"));
        }
    }
    if request.persona.as_deref().is_some_and(|p| p.trim().is_empty()) {
        return Err(StartError::invalid("persona", "must not be empty"));
    }
    if request.agent_options.as_ref().is_some_and(|o| o.max_tokens == Some(0)) {
        return Err(StartError::invalid("agent_options.max_tokens", "must be positive"));
    }
    Ok(())
}

/// A run actor just made, and what its publication needs.
struct Made {
    core: Arc<Core>,
    shared: Arc<RunShared>,
    control: Arc<RunControl>,
    launched: Launched,
    label: Option<String>,
    /// What a continuation needs, when the provider may offer one.
    continuation: Option<Box<(Arc<Core>, Parent)>>,
}

/// On a worker: make the run actor there, which hands the provider its
/// launch at once.
fn make(
    core: Arc<Core>,
    entry: Arc<ProviderEntry>,
    request: Box<StartRequest>,
    budget: Option<(Admission, BudgetLease)>,
) -> Made {
    let token = request.signal.child_token();
    let depth = request.child_depth();
    let label = request.label.clone();
    // Kept for a continuation, which starts from the same parent; only a
    // provider that may offer one pays for the copy.
    let continuation = entry.provider.offers_continuation().then(|| Box::new((core.clone(), request.parent.clone())));
    let parent_session = request.parent.session_id.clone();
    let progress = request.progress.clone();
    let shared = Arc::new(RunShared::new(core.mint_run_id(), entry, parent_session, core.bus().clone(), progress));
    let (admission, budget) = budget.unzip();
    let (control, launched) = RunActor::spawn(RunSpawn {
        core: core.clone(),
        shared: shared.clone(),
        request,
        token,
        depth,
        budget,
        admission: admission.map(Box::new),
    });
    Made { core, shared, control, launched, label, continuation }
}

/// Wait for publication unless it happened at once, emit `Start`, hand
/// back the `Run`.
async fn launched(made: Made) -> Result<Run, StartError> {
    let Made { core, shared, control, launched, label, continuation } = made;
    let published = match launched {
        Launched::Now(published) => published,
        // Outside tokio's cooperative budget: a caller that starts thousands
        // of runs in one task (a `join_all` fan-out) spends its budget on the
        // first 128, after which every other publication would answer
        // "pending, poll me again" — each start was polled hundreds of times
        // at N = 100,000.
        Launched::Later(answer) => {
            tokio::task::unconstrained(answer).await.unwrap_or(Err(StartError::RuntimeStopped))?
        }
    };
    if let Some(parent_session) = &shared.parent_session {
        core.adopt(parent_session, &shared);
    }
    shared.publish(|| RunInfo {
        run_id: shared.run_id,
        child_id: shared.child_id().to_owned(),
        provider: shared.provider().to_owned(),
        parent_session: shared.parent_session.clone(),
        local: published.local_agent.is_some(),
        label,
    });
    Ok(Run {
        control,
        local_agent: published.local_agent,
        steering: published.steering,
        continuation: continuation.filter(|_| published.continuation),
        disposed: AtomicBool::new(false),
    })
}
