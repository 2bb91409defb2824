//! The provider actor: hosts one registered provider for as long as it is
//! registered or still has live runs, then runs its shutdown hook.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

use super::entry::ProviderEntry;
use crate::live::{ActorLease, LiveCounters};

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
        let hook = crate::contain::contained(|| self.entry.provider.shutdown());
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
