//! The provider actor: hosts one registered provider for as long as it is
//! registered or still has live runs, then runs its shutdown hook.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

use super::registry::{ProviderDrained, RegistryActor};
use crate::live::{ActorLease, LiveCounters};
use crate::seam::{Provider, ProviderInfo};

/// One registration of a provider, shared by the table, its actor and runs.
pub(crate) struct ProviderEntry {
    /// Unique per registration, so a re-registration under the same name is
    /// a different entry.
    pub key: u64,
    pub info: ProviderInfo,
    pub provider: Arc<dyn Provider>,
    live_runs: AtomicUsize,
    retired: AtomicBool,
}

impl ProviderEntry {
    pub(crate) fn new(key: u64, provider: Arc<dyn Provider>) -> Self {
        let info = ProviderInfo {
            name: provider.name().to_owned(),
            capabilities: provider.capabilities(),
            inherits_parent_context: provider.inherits_parent_context(),
            route_defaults: provider.route_defaults(),
        };
        ProviderEntry { key, info, provider, live_runs: AtomicUsize::new(0), retired: AtomicBool::new(false) }
    }

    pub(crate) fn name(&self) -> &str {
        &self.info.name
    }

    /// Mark retired; true when no run is live, so the actor may stop now.
    pub(crate) fn retire(&self) -> bool {
        self.retired.store(true, Ordering::Release);
        self.live_runs.load(Ordering::Acquire) == 0
    }
}

/// Counts one live run against its provider; the registry hears only when a
/// retired provider's last run ends.
pub(crate) struct ProviderRunLease {
    entry: Arc<ProviderEntry>,
    registry: Addr<RegistryActor>,
}

impl ProviderRunLease {
    pub(crate) fn new(entry: Arc<ProviderEntry>, registry: Addr<RegistryActor>) -> Self {
        entry.live_runs.fetch_add(1, Ordering::AcqRel);
        ProviderRunLease { entry, registry }
    }
}

impl Drop for ProviderRunLease {
    fn drop(&mut self) {
        let last = self.entry.live_runs.fetch_sub(1, Ordering::AcqRel) == 1;
        if last && self.entry.retired.load(Ordering::Acquire) {
            self.registry.do_send(ProviderDrained(self.entry.key));
        }
    }
}

pub(crate) struct ProviderActor {
    entry: Arc<ProviderEntry>,
    _lease: ActorLease,
}

impl ProviderActor {
    pub(crate) fn new(entry: Arc<ProviderEntry>, live: &Arc<LiveCounters>) -> Self {
        ProviderActor { entry, _lease: ActorLease::actor(live) }
    }

    pub(crate) fn key(&self) -> u64 {
        self.entry.key
    }
}

impl Actor for ProviderActor {
    type Context = Context<Self>;
}

/// Stop the provider: run its shutdown hook (bounded), then stop the actor.
/// Replies with the provider's name.
#[derive(Message)]
#[rtype(result = "String")]
pub(crate) struct StopProvider {
    pub timeout: Duration,
}

impl Handler<StopProvider> for ProviderActor {
    type Result = ResponseActFuture<Self, String>;

    fn handle(&mut self, msg: StopProvider, _ctx: &mut Context<Self>) -> Self::Result {
        let name = self.entry.name().to_owned();
        let hook = super::run::contained(|| self.entry.provider.shutdown());
        let bounded = tokio::time::timeout(msg.timeout, hook);
        Box::pin(bounded.into_actor(self).map(move |outcome, _actor, ctx| {
            match outcome {
                Ok(Ok(())) => {}
                Ok(Err(panic)) => tracing::error!(provider = %name, %panic, "provider shutdown hook panicked"),
                Err(_) => tracing::warn!(provider = %name, "provider shutdown hook timed out"),
            }
            ctx.stop();
            name
        }))
    }
}
