//! `Run::agent()`: a run's in-process child as the crate's own [`Agent`].
//!
//! The actors hand out a child's agent type-erased
//! ([`Run::local_agent`]); naming [`Agent`] there would make the actor
//! layer import the agent layer. The tool layer already stands on both, so
//! the typed accessor is written here, as an inherent method of [`Run`].

use crate::actors::Run;
use crate::agent::Agent;

impl Run {
    /// The child [`Agent`] of an in-process run (`spawn`, `fork`): its
    /// session, events and tools. `None` for other providers.
    pub fn agent(&self) -> Option<Agent> {
        self.local_agent()?.downcast::<Agent>().cloned()
    }
}
