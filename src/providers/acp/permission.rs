//! A run's answers to its agent's `session/request_permission`.
//!
//! The provider's rules ([`AcpConfig::permission`]) decide first: `allow`
//! and `reject` answer at once, `ask` hands the request to the run's
//! [`Approvals`] (the nearest door: a terminal, an ACP client, a policy
//! file), within [`AcpConfig::permission_timeout`]. An "allow always"
//! answer is remembered for the rest of this run only, and covers no more
//! than the door showed ([`PermissionRequest::grant_key`]): the tool, when
//! the agent names one, else only this same call (kind, title, input and
//! paths: never every call of its kind); a later request it covers is
//! allowed without asking.
//!
//! Never granted by accident: no approver, the timeout, the run's cancel
//! or dispose ([`Asking::close`]) all answer reject, and an answer that
//! arrives after the run was closed is not used. The child gets only an
//! option it offered, by kind ([`crate::wire::acp::outcome_of`]).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use agent_client_protocol::v1::schema::{ToolCall, ToolCallUpdateFields};
use tokio_util::sync::CancellationToken;

use super::AcpConfig;
use crate::seam::{Answer, Approvals, PermissionRequest, Policy, Rules, Verdict};

/// The tool calls an agent announced that a later request may name by id
/// alone; past this many the oldest are forgotten (a request then carries
/// only what it says itself).
const REMEMBERED_CALLS: usize = 256;

/// One run's permission state.
pub(super) struct Asking {
    rules: Rules,
    approvals: Approvals,
    timeout: Duration,
    /// Trips at the run's cancel or dispose: whatever is pending rejects.
    closed: CancellationToken,
    /// What "allow always" was said for, in this run.
    granted: Mutex<HashSet<String>>,
    /// What each announced tool call said (kind, title, input, paths), by id.
    calls: Mutex<HashMap<String, ToolCallUpdateFields>>,
}

impl Asking {
    /// The state of a run whose context routes to `approvals`, closed when
    /// `cancel` trips or [`Asking::close`] is called.
    pub(super) fn new(config: &AcpConfig, approvals: Approvals, cancel: &CancellationToken) -> Self {
        Asking {
            rules: config.permission.clone(),
            approvals,
            timeout: config.permission_timeout,
            closed: cancel.child_token(),
            granted: Mutex::default(),
            calls: Mutex::default(),
        }
    }

    /// The run is over: pending and later requests are rejected.
    pub(super) fn close(&self) {
        self.closed.cancel();
    }

    /// Remembers an announced tool call, for a request that names it by id.
    pub(super) fn note_call(&self, call: &ToolCall) {
        let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        if calls.len() >= REMEMBERED_CALLS {
            calls.clear();
        }
        let fields = ToolCallUpdateFields::new()
            .kind(call.kind)
            .title(call.title.clone())
            .locations(call.locations.clone())
            .raw_input(call.raw_input.clone());
        let fields = match &call.name {
            Some(name) => fields.name(name.clone()),
            None => fields,
        };
        calls.insert(call.tool_call_id.to_string(), fields);
    }

    /// The agent's request in our words, filled in from its announcement.
    pub(super) fn request_of(
        &self,
        request: &agent_client_protocol::v1::schema::RequestPermissionRequest,
    ) -> PermissionRequest {
        let calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        let earlier = calls.get(&request.tool_call.tool_call_id.to_string());
        crate::wire::acp::permission_request_of(request, earlier)
    }

    /// The answer to `request`: the rules, a grant of this run, or the
    /// nearest approver; a reject whenever nobody says yes.
    pub(super) async fn decide(&self, request: PermissionRequest) -> Answer {
        if self.closed.is_cancelled() {
            return Answer::reject("the run was over");
        }
        let key = request.grant_key();
        let granted =
            key.as_ref().is_some_and(|key| self.granted.lock().unwrap_or_else(|e| e.into_inner()).contains(key));
        if granted && request.offers(Verdict::AllowOnce) {
            return Answer::new(Verdict::AllowOnce, "allowed always earlier in this run");
        }
        match self.rules.decide(&request) {
            Policy::Allow => {
                // A blanket allow takes the agent's "always" when it offers
                // no "once"; a finer rule never lets the agent skip asking.
                let verdict = match request.offers(Verdict::AllowOnce) || !self.rules.rules.is_empty() {
                    true => Verdict::AllowOnce,
                    false => Verdict::AllowAlways,
                };
                Answer::new(verdict, "the provider's rules (allow)")
            }
            Policy::Reject => Answer::reject("the provider's rules (reject)"),
            Policy::Ask => {
                let answer = self.approvals.ask(request, self.timeout, &self.closed).await;
                if self.closed.is_cancelled() && answer.verdict.allows() {
                    return Answer::reject("the run was over before the answer came");
                }
                if answer.verdict == Verdict::AllowAlways {
                    if let Some(key) = key {
                        self.granted.lock().unwrap_or_else(|e| e.into_inner()).insert(key);
                    }
                }
                answer
            }
        }
    }
}

impl std::fmt::Debug for Asking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Asking").field("rules", &self.rules).field("timeout", &self.timeout).finish_non_exhaustive()
    }
}
