//! A descendant's permission request, asked of the MCP client with
//! elicitation.
//!
//! The client's root agent carries a route to an [`ElicitingApprover`]
//! ([`crate::seam::Approvals`]): a child or grandchild of a call (an ACP
//! agent with `permission = "ask"`, an in-process tool marked `approve`)
//! whose request climbs this far is asked of the client as
//! `elicitation/create` in form mode — a message naming who asks and what
//! (`<who> asks: <what>`, made safe to show) and a requested schema of one
//! required property, `decision`, a single-select enum offering exactly
//! the child's options (each `const` the child's option id, its `title`
//! the child's name for it and what it does).
//!
//! The client's answer is a verdict only when it accepts with a
//! `decision` the child offered; a decline, a cancel, an option never
//! offered, an error answer or the connection closing is a reject. When
//! the asker stops waiting (its run's cancel, its timeout) the request is
//! withdrawn on the wire (`notifications/cancelled`).
//!
//! A client that did not declare the `elicitation` capability (or only its
//! URL mode) is not asked: the configuration's `[approvals]` rules decide
//! (`allow` allows once, `reject` and `ask` reject), and without them the
//! request is rejected.

use std::sync::OnceLock;

use futures_util::future::BoxFuture;
use rmcp::model::{
    CancelledNotification, CancelledNotificationParam, ClientResult, ElicitRequest, ElicitRequestParams,
    ElicitationAction, ElicitationSchema, ServerNotification, ServerRequest,
};
use rmcp::service::{Peer, PeerRequestOptions, RoleServer};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::seam::{safe_line, Answer, Approver, PermissionOption, PermissionRequest, Policy, Rules, Verdict};

/// Who answered, as the asker's transcript records it.
const BY_CLIENT: &str = "the MCP client of subagents mcp";

/// The property of the requested schema that carries the chosen option.
const DECISION: &str = "decision";

/// Asks the client of one `subagents mcp` session.
pub(super) struct ElicitingApprover {
    /// The client, known from its first call (a request can only come
    /// from a run one of its calls started).
    peer: OnceLock<Peer<RoleServer>>,
    /// What decides for a client that cannot be asked.
    policy: Option<Rules>,
}

impl ElicitingApprover {
    /// An approver whose client, when it takes no elicitation, is answered
    /// by `policy` (else rejected).
    pub(super) fn new(policy: Option<Rules>) -> Self {
        ElicitingApprover { peer: OnceLock::new(), policy }
    }

    /// The client to ask, from a request it sent.
    pub(super) fn attach(&self, peer: &Peer<RoleServer>) {
        let _ = self.peer.set(peer.clone());
    }

    /// The answer for a client that cannot be asked.
    fn by_policy(&self, request: &PermissionRequest) -> Answer {
        let Some(rules) = &self.policy else {
            return Answer::reject(format!("{BY_CLIENT} takes no elicitation, and no [approvals] policy allows it"));
        };
        match rules.decide(request) {
            Policy::Allow => Answer::new(Verdict::AllowOnce, "the [approvals] policy (allow)"),
            Policy::Reject => Answer::reject("the [approvals] policy (reject)"),
            Policy::Ask => {
                Answer::reject(format!("the [approvals] policy (ask), and {BY_CLIENT} takes no elicitation"))
            }
        }
    }
}

impl std::fmt::Debug for ElicitingApprover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElicitingApprover")
            .field("attached", &self.peer.get().is_some())
            .field("policy", &self.policy)
            .finish()
    }
}

/// Whether the client declared elicitation in form mode (a capability that
/// names neither mode means form, as MCP has it).
fn takes_elicitation(peer: &Peer<RoleServer>) -> bool {
    let info = peer.peer_info();
    let elicitation = info.as_ref().and_then(|info| info.capabilities.elicitation.as_ref());
    elicitation.is_some_and(|modes| modes.form.is_some() || modes.url.is_none())
}

impl Approver for ElicitingApprover {
    fn ask(&self, request: PermissionRequest, cancel: CancellationToken) -> BoxFuture<'static, Answer> {
        let peer = self.peer.get().filter(|peer| takes_elicitation(peer)).cloned();
        let Some(peer) = peer else {
            let answer = self.by_policy(&request);
            return Box::pin(async move { answer });
        };
        // Its own task: when the asker stops waiting it drops this future,
        // and the question must still be withdrawn on the wire.
        let asking = tokio::spawn(elicit(peer, request, cancel));
        Box::pin(async move { asking.await.unwrap_or_else(|_| Answer::reject(format!("asking {BY_CLIENT} failed"))) })
    }
}

/// Asks the client about `request` until it answers or `cancel` trips.
async fn elicit(peer: Peer<RoleServer>, request: PermissionRequest, cancel: CancellationToken) -> Answer {
    let Some(requested_schema) = decision_schema(&request) else {
        return Answer::reject("the child offered no option to choose");
    };
    let params =
        ElicitRequestParams::FormElicitationParams { meta: None, message: question(&request), requested_schema };
    let asked = ServerRequest::ElicitRequest(ElicitRequest::new(params));
    let Ok(handle) = peer.send_request_with_option(asked, PeerRequestOptions::no_options()).await else {
        return Answer::reject(format!("{BY_CLIENT} is gone"));
    };
    let id = handle.id.clone();
    let answered = tokio::select! {
        answered = handle.await_response() => answered,
        _ = cancel.cancelled() => {
            let withdrawn = CancelledNotificationParam::new(Some(id), Some("the asker stopped waiting".to_owned()));
            let notification = ServerNotification::CancelledNotification(CancelledNotification::new(withdrawn));
            let _ = peer.send_notification(notification).await;
            return Answer::reject("the question was withdrawn");
        }
    };
    match answered {
        Ok(ClientResult::ElicitResult(result)) => match result.action {
            ElicitationAction::Accept => match chosen(&request, result.content.as_ref()) {
                Some(option) => Answer::chose(option, BY_CLIENT),
                None => Answer::reject(format!("{BY_CLIENT} chose no option the child offered")),
            },
            ElicitationAction::Decline => Answer::reject(format!("{BY_CLIENT} (declined)")),
            _ => Answer::reject(format!("{BY_CLIENT} (cancelled)")),
        },
        Ok(_) => Answer::reject(format!("{BY_CLIENT} answered something else")),
        Err(_) => Answer::reject(format!("{BY_CLIENT} did not answer")),
    }
}

/// The message the client shows: who asks, and what for, on one safe line.
fn question(request: &PermissionRequest) -> String {
    format!("{} asks: {}", request.asker_line(), request.call_line())
}

/// `{decision: one of the child's options}`, the options as titled
/// constants; `None` when the child offered none.
fn decision_schema(request: &PermissionRequest) -> Option<ElicitationSchema> {
    if request.options.is_empty() {
        return None;
    }
    let one_of: Vec<Value> = request
        .options
        .iter()
        .map(|option| {
            let said = request.option_said(option.kind);
            json!({"const": option.id, "title": format!("{} ({said})", safe_line(&option.name))})
        })
        .collect();
    let schema = json!({
        "type": "object",
        "properties": {DECISION: {"type": "string", "title": "Your answer", "oneOf": one_of}},
        "required": [DECISION],
    });
    let Value::Object(schema) = schema else { unreachable!("an object literal") };
    ElicitationSchema::from_json_schema(schema).ok()
}

/// The option `content` names, when the child offered it.
fn chosen<'a>(request: &'a PermissionRequest, content: Option<&Value>) -> Option<&'a PermissionOption> {
    let id = content?.get(DECISION)?.as_str()?;
    request.options.iter().find(|option| option.id == id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seam::OptionKind;

    fn offered() -> PermissionRequest {
        PermissionRequest::new(vec![
            PermissionOption::new("yes", "Allow\u{1b}[31m", OptionKind::AllowOnce),
            PermissionOption::new("no", "Reject", OptionKind::RejectOnce),
        ])
        .with_title("cargo test")
    }

    #[test]
    fn the_schema_offers_exactly_the_childs_options_and_an_answer_must_name_one() {
        let request = offered();
        let schema = serde_json::to_value(decision_schema(&request).unwrap()).unwrap();
        let one_of = &schema["properties"][DECISION]["oneOf"];
        let ids: Vec<&str> = one_of.as_array().unwrap().iter().map(|o| o["const"].as_str().unwrap()).collect();
        assert_eq!(ids, ["yes", "no"]);
        assert!(!one_of.to_string().contains("\\u001b"), "names are made safe: {one_of}");
        assert_eq!(schema["required"], json!([DECISION]));
        assert_eq!(chosen(&request, Some(&json!({DECISION: "yes"}))).map(|option| option.id.as_str()), Some("yes"));
        assert_eq!(chosen(&request, Some(&json!({DECISION: "no"}))).map(|option| option.id.as_str()), Some("no"));
        assert_eq!(
            chosen(&request, Some(&json!({DECISION: "always"}))).map(|option| option.id.as_str()),
            None,
            "never offered"
        );
        assert_eq!(chosen(&request, None), None);
        assert!(decision_schema(&PermissionRequest::new(Vec::new())).is_none());
    }

    #[test]
    fn a_client_that_cannot_be_asked_gets_the_policy_and_else_a_reject() {
        let nobody = ElicitingApprover::new(None);
        assert_eq!(nobody.by_policy(&offered()).verdict, Verdict::Reject);
        let rules = Rules::new(Policy::Ask).with(crate::seam::Rule::new(Policy::Allow).title("cargo *"));
        let policy = ElicitingApprover::new(Some(rules));
        assert_eq!(policy.by_policy(&offered()).verdict, Verdict::AllowOnce);
        let other = PermissionRequest::new(Vec::new()).with_title("rm -rf /");
        assert_eq!(policy.by_policy(&other).verdict, Verdict::Reject);
    }
}
