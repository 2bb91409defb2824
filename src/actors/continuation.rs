//! Resuming a settled child's session in a new run: [`Continuation`], and
//! [`Run::continuation`] that hands one out. It sits above the start path
//! (a continuation is an ordinary start) and the run handle.

use std::fmt;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::core::Core;
use super::run_handle::Run;
use super::run_shared::RunShared;
use super::start::start;
use crate::seam::{LocalAgent, Parent, StartError, StartRequest};

impl Run {
    /// Resume, when the child supports it: a new run continuing this child's
    /// session (same session id and depth) once this run has settled.
    pub fn continuation(&self) -> Option<Continuation> {
        let (core, parent) = self.continuation.as_deref().cloned()?;
        Some(Continuation { core, parent, agent: self.local_agent.clone()?, previous: self.control.shared.clone() })
    }
}

/// Continues a settled child's session in a new run on the same provider.
/// The new run is an ordinary run: its own `Run`, events and dispose.
#[derive(Clone)]
pub struct Continuation {
    core: Arc<Core>,
    /// The parent the previous run was started from.
    parent: Parent,
    agent: LocalAgent,
    previous: Arc<RunShared>,
}

impl Continuation {
    /// The session it continues.
    pub fn session_id(&self) -> &str {
        self.agent.session_id()
    }

    /// [`Continuation::start_with`] a plain request: `prompt`, `signal`,
    /// no options.
    pub async fn start(&self, prompt: impl Into<String>, signal: CancellationToken) -> Result<Run, StartError> {
        self.start_with(StartRequest::new(prompt, self.parent.clone(), signal)).await
    }

    /// Waits until the previous run has settled, disposes it (the session
    /// gets one owner at a time: its background tasks and per-session
    /// state end with the old run, not with the new one), then starts a run
    /// that continues the session with `request`: its prompt, signal and
    /// options (label, persona, output schema, tool filter, route, depth
    /// cap) as for any start, and the same checks; its parent is replaced
    /// by the previous run's. The session keeps its id, depth and cwd.
    pub async fn start_with(&self, mut request: StartRequest) -> Result<Run, StartError> {
        let _ = self.previous.result().await;
        if let Some(control) = self.core.run_control(self.previous.run_id) {
            control.dispose();
        }
        // Err(DISPOSE_FAILED) still means quiescent; the session is on disk.
        let _ = self.previous.quiescent().await;
        request.parent = self.parent.clone();
        request.resume = Some(self.agent.clone());
        start(&self.core, self.previous.provider(), Box::new(request)).await
    }
}

impl fmt::Debug for Continuation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Continuation").field("session_id", &self.session_id()).finish_non_exhaustive()
    }
}
