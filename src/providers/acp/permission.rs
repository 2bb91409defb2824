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
//! At most [`MAX_ASKED_AT_ONCE`] of a run's requests wait for an approver
//! at once; an agent asking more at once has the rest rejected at once,
//! saying so.
//!
//! Never granted by accident: no approver, the timeout, the run's cancel
//! or dispose ([`Asking::close`]) all answer reject, and an answer that
//! arrives after the run was closed is not used. The child gets only an
//! option it offered, by kind ([`crate::wire::acp::outcome_of`]).

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use agent_client_protocol::v1::schema::{ToolCall, ToolCallUpdate, ToolCallUpdateFields};
use tokio_util::sync::CancellationToken;

use super::AcpConfig;
use crate::seam::{Answer, Approvals, PermissionRequest, Policy, Rules, Verdict};

/// The tool calls an agent announced that a later request may name by id
/// alone; past this many the oldest are forgotten (a request then carries
/// only what it says itself).
const REMEMBERED_CALLS: usize = 256;
/// The most of one run's requests that wait for an approver at once: an
/// agent asking more at once has the rest rejected at once (each asked
/// request holds a question at a door, a parked file, a prompt).
pub(super) const MAX_ASKED_AT_ONCE: usize = 32;

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
    /// Places for requests waiting on the approver ([`MAX_ASKED_AT_ONCE`]).
    asked: tokio::sync::Semaphore,
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
            asked: tokio::sync::Semaphore::new(MAX_ASKED_AT_ONCE),
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
        let mut fields = fields;
        crate::wire::acp::keep_files_of(&mut fields, &call.content);
        calls.insert(call.tool_call_id.to_string(), fields);
    }

    /// Folds an update of a remembered tool call into it: what the update
    /// sets replaces what was said, and every file any message of the call
    /// named stays one of its files, so a request naming the call by id is
    /// judged on all it said (an update that moved the call to
    /// `/etc/passwd` is not judged on its first announcement).
    pub(super) fn note_update(&self, update: &ToolCallUpdate) {
        let mut calls = self.calls.lock().unwrap_or_else(|e| e.into_inner());
        let Some(known) = calls.get_mut(&update.tool_call_id.to_string()) else { return };
        crate::wire::acp::fold_update(known, &update.fields);
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
                let Ok(_asked) = self.asked.try_acquire() else {
                    return Answer::reject(format!(
                        "the agent has {MAX_ASKED_AT_ONCE} permission requests waiting already: one more at once is refused"
                    ));
                };
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use futures_util::future::BoxFuture;

    use super::*;
    use crate::seam::Approver;

    /// Counts what it is asked and never answers.
    #[derive(Debug, Default)]
    struct Silent(AtomicUsize);

    impl Approver for Silent {
        fn ask(&self, _: PermissionRequest, _: CancellationToken) -> BoxFuture<'static, Answer> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(std::future::pending())
        }
    }

    #[tokio::test]
    async fn an_agent_asking_past_the_cap_at_once_is_refused_at_once_and_its_place_comes_back() {
        let silent = Arc::new(Silent::default());
        let mut config = AcpConfig::new("agent", "/bin/true", Vec::new());
        config.permission = Rules::new(Policy::Ask);
        let run = CancellationToken::new();
        let asking = Arc::new(Asking::new(&config, Approvals::new(silent.clone()), &run));
        let waiting: Vec<_> = (0..MAX_ASKED_AT_ONCE)
            .map(|n| {
                let asking = asking.clone();
                tokio::spawn(async move {
                    asking.decide(PermissionRequest::new(Vec::new()).with_title(format!("{n}"))).await
                })
            })
            .collect();
        while silent.0.load(Ordering::SeqCst) < MAX_ASKED_AT_ONCE {
            tokio::task::yield_now().await;
        }
        for _ in 0..1000 {
            let more = asking.decide(PermissionRequest::new(Vec::new()).with_title("one more"));
            let answer = tokio::time::timeout(Duration::from_secs(1), more).await.expect("answered at once");
            assert_eq!(answer.verdict, Verdict::Reject);
        }
        assert_eq!(silent.0.load(Ordering::SeqCst), MAX_ASKED_AT_ONCE, "past the cap nobody is asked");
        for waiting in &waiting {
            waiting.abort();
        }
        for waiting in waiting {
            let _ = waiting.await;
        }
        let asked_again = tokio::spawn({
            let asking = asking.clone();
            async move { asking.decide(PermissionRequest::new(Vec::new()).with_title("later")).await }
        });
        while silent.0.load(Ordering::SeqCst) == MAX_ASKED_AT_ONCE {
            tokio::task::yield_now().await;
        }
        asked_again.abort();
    }
}
