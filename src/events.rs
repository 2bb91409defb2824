//! Lifecycle events: what happened to providers and runs, for observers.
//!
//! Events are observe-only. They travel on one bounded broadcast channel, so
//! a slow observer lags (and is told how many events it missed) instead of
//! blocking runs. Callback listeners run on the runtime's dedicated events
//! thread, never on a thread that hosts runs, and each call is contained: a
//! panic or an error is logged through `tracing` and the next listener and
//! the next event go on.
//!
//! Ordering: for every run, `Start` is sent before its `End`, even when the
//! child settled before `start` returned. Both carry the registry-minted
//! `run_id`.
//!
//! ```
//! use subagents::{Runtime, SubagentEvent};
//!
//! let runtime = Runtime::builder().workers(1).build().unwrap();
//! let subagents = runtime.subagents();
//! let _listener = subagents.add_listener(|event| {
//!     if let SubagentEvent::End(end) = event {
//!         println!("run {} ended: {}", end.run_id, end.stop_reason);
//!     }
//! });
//! drop(_listener);
//! runtime.shutdown_blocking();
//! ```

mod bus;

use std::sync::Arc;

use serde::Serialize;

pub use crate::live::Live;
pub(crate) use crate::seam::ProgressUpdate;
use crate::seam::{ContentBlock, Diagnostic, StopReason};

pub(crate) use bus::EventBus;
pub use bus::{EventRecvError, EventStream, ListenerError, ListenerHandle, ListenerOutcome};

/// A lifecycle event.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum SubagentEvent {
    /// A provider was registered.
    ProviderAdded {
        /// Its name.
        name: String,
    },
    /// A provider was unregistered.
    ProviderRemoved {
        /// Its name.
        name: String,
    },
    /// A run was published (its `start` succeeded).
    Start(Arc<RunInfo>),
    /// A run settled.
    End(Arc<RunEndInfo>),
    /// A running child reported progress.
    Progress(Arc<RunProgress>),
}

impl SubagentEvent {
    /// The delegating parent's session, for run events that have one.
    pub fn parent_session(&self) -> Option<&str> {
        match self {
            SubagentEvent::Start(info) => info.parent_session.as_deref(),
            SubagentEvent::End(info) => info.parent_session.as_deref(),
            SubagentEvent::Progress(info) => info.parent_session.as_deref(),
            SubagentEvent::ProviderAdded { .. } | SubagentEvent::ProviderRemoved { .. } => None,
        }
    }

    /// Whether this is a run event (`Start`, `End`, `Progress`).
    pub fn is_run_event(&self) -> bool {
        matches!(self, SubagentEvent::Start(_) | SubagentEvent::End(_) | SubagentEvent::Progress(_))
    }
}

/// A published run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RunInfo {
    /// The runtime-minted number shared by the run's events (`Run::run_id`).
    pub run_id: u64,
    /// The child's own name (`Run::child_id`).
    pub child_id: String,
    /// The provider that runs it.
    pub provider: String,
    /// The delegating parent's session.
    pub parent_session: Option<String>,
    /// Whether the run exposes a local agent (snapshot at start).
    pub local: bool,
    /// The request's label.
    pub label: Option<String>,
}

/// A settled run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunEndInfo {
    /// The runtime-minted number shared with `Start` (`Run::run_id`).
    pub run_id: u64,
    /// The child's own name (`Run::child_id`).
    pub child_id: String,
    /// The provider that ran it.
    pub provider: String,
    /// The delegating parent's session.
    pub parent_session: Option<String>,
    /// Why it stopped.
    pub stop_reason: StopReason,
    /// An owned copy of the child's last assistant message; absent when the
    /// run failed at the infrastructure level.
    pub last_message: Option<Vec<ContentBlock>>,
    /// Why it failed, when its result says (the result's own diagnostic).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diagnostic: Option<Diagnostic>,
}

/// Live progress from a running child.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunProgress {
    /// Registry-minted run id.
    pub run_id: u64,
    /// The provider running the child.
    pub provider: String,
    /// The delegating parent's session.
    pub parent_session: Option<String>,
    /// What happened.
    pub update: ProgressUpdate,
}
