//! The registry: registrations, and the registry actor that supervises
//! provider actors. The provider table itself lives in the runtime's core
//! (starts read it without a hop); the actor keeps only the addresses of
//! the provider actors it supervises, retired ones included until drained.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use futures_util::future::join_all;

use super::core::Core;
use super::entry::{ProviderDrained, ProviderEntry};
use super::provider::{ProviderActor, StopProvider};
use crate::events::SubagentEvent;
use crate::live::ActorLease;
use crate::seam::{Provider, RegisterError};

/// Add `provider` to the table; fails if the name is taken.
pub(crate) fn register(
    core: &Arc<Core>,
    registry: &Addr<RegistryActor>,
    provider: Arc<dyn Provider>,
) -> Result<Registration, RegisterError> {
    static NEXT_KEY: AtomicU64 = AtomicU64::new(1);
    if !core.is_accepting() {
        return Err(RegisterError::RuntimeStopped);
    }
    let key = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
    let entry = Arc::new(ProviderEntry::new(key, provider, registry.clone().recipient()));
    if !core.insert_provider(entry.clone()) {
        return Err(RegisterError::DuplicateProvider(entry.name().to_owned()));
    }
    // The actor (and its place in `live()`) exists before `register` returns;
    // the registry starts it.
    registry.do_send(AddProvider(ProviderActor::new(entry.clone(), core.live())));
    core.bus().emit(SubagentEvent::ProviderAdded { name: entry.name().to_owned() });
    Ok(Registration { core: core.clone(), registry: registry.clone(), key, name: entry.name().to_owned() })
}

/// Remove the entry with `key`, if it is still registered.
fn unregister(core: &Core, registry: &Addr<RegistryActor>, key: u64) {
    if let Some(entry) = core.remove_provider(key) {
        core.bus().emit(SubagentEvent::ProviderRemoved { name: entry.name().to_owned() });
        registry.do_send(RetireProvider(entry));
    }
}

/// A provider's registration. The provider stays registered for the
/// runtime's life whatever becomes of this handle; [`remove`](Self::remove)
/// unregisters it now, and [`scoped`](Self::scoped) makes the handle a
/// guard that unregisters it when dropped. Removal stops new starts; runs
/// already returned to callers continue.
pub struct Registration {
    core: Arc<Core>,
    registry: Addr<RegistryActor>,
    key: u64,
    name: String,
}

impl Registration {
    /// The registered name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Unregister now.
    pub fn remove(self) {
        unregister(&self.core, &self.registry, self.key);
    }

    /// Keep the provider registered for the runtime's whole life: what
    /// dropping the handle does too, said out loud.
    pub fn keep(self) {}

    /// A guard that unregisters the provider when it is dropped (or
    /// [`removed`](ScopedRegistration::remove)): a provider for one scope.
    pub fn scoped(self) -> ScopedRegistration {
        ScopedRegistration(Some(self))
    }
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration").field("name", &self.name).finish()
    }
}

/// A [`Registration`] that unregisters its provider when dropped.
#[must_use = "dropping a ScopedRegistration unregisters the provider at once"]
#[derive(Debug)]
pub struct ScopedRegistration(Option<Registration>);

impl ScopedRegistration {
    /// The registered name.
    pub fn name(&self) -> &str {
        self.0.as_ref().map_or("", Registration::name)
    }

    /// Unregister now.
    pub fn remove(self) {
        drop(self);
    }

    /// Keep the provider registered after all, for the runtime's life.
    pub fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for ScopedRegistration {
    fn drop(&mut self) {
        if let Some(registration) = self.0.take() {
            registration.remove();
        }
    }
}

/// Supervises provider actors: starts one per registration, stops it once
/// it is retired and drained, and stops them all at shutdown.
pub(crate) struct RegistryActor {
    core: Arc<Core>,
    providers: HashMap<u64, Addr<ProviderActor>>,
    _lease: ActorLease,
}

impl RegistryActor {
    pub(crate) fn new(core: Arc<Core>) -> Self {
        let lease = ActorLease::actor(core.live());
        RegistryActor { core, providers: HashMap::new(), _lease: lease }
    }

    fn stop_provider(&mut self, key: u64) {
        if let Some(addr) = self.providers.remove(&key) {
            addr.do_send(StopProvider { timeout: self.core.config().shutdown_phase_timeout });
        }
    }
}

impl Actor for RegistryActor {
    type Context = Context<Self>;
}

#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct AddProvider(ProviderActor);

impl Handler<AddProvider> for RegistryActor {
    type Result = ();

    fn handle(&mut self, msg: AddProvider, _ctx: &mut Context<Self>) {
        let key = msg.0.key();
        self.providers.insert(key, msg.0.start());
    }
}

#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct RetireProvider(Arc<ProviderEntry>);

impl Handler<RetireProvider> for RegistryActor {
    type Result = ();

    fn handle(&mut self, msg: RetireProvider, _ctx: &mut Context<Self>) {
        if msg.0.retire() {
            self.stop_provider(msg.0.key);
        }
    }
}

impl Handler<ProviderDrained> for RegistryActor {
    type Result = ();

    fn handle(&mut self, msg: ProviderDrained, _ctx: &mut Context<Self>) {
        self.stop_provider(msg.0);
    }
}

/// Shutdown phase: stop every provider actor, each hook bounded by `timeout`.
#[derive(Message)]
#[rtype(result = "ProvidersStopped")]
pub(crate) struct StopProviders {
    pub timeout: Duration,
}

/// The providers whose actor stopped, and whether the phase hit its bound.
#[derive(MessageResponse)]
pub(crate) struct ProvidersStopped {
    pub names: Vec<String>,
    pub timed_out: bool,
}

impl Handler<StopProviders> for RegistryActor {
    type Result = ResponseFuture<ProvidersStopped>;

    fn handle(&mut self, msg: StopProviders, _ctx: &mut Context<Self>) -> Self::Result {
        let stops: Vec<_> =
            self.providers.drain().map(|(_, addr)| addr.send(StopProvider { timeout: msg.timeout })).collect();
        // Each hook is bounded by `timeout` in its actor; allow the replies a
        // moment more before calling the phase timed out.
        let bound = msg.timeout + Duration::from_millis(100);
        Box::pin(async move {
            match tokio::time::timeout(bound, join_all(stops)).await {
                Ok(replies) => {
                    ProvidersStopped { names: replies.into_iter().filter_map(Result::ok).collect(), timed_out: false }
                }
                Err(_) => ProvidersStopped { names: Vec::new(), timed_out: true },
            }
        })
    }
}

/// Last shutdown phase: stop the registry itself.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct StopRegistry;

impl Handler<StopRegistry> for RegistryActor {
    type Result = ();

    fn handle(&mut self, _msg: StopRegistry, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}
