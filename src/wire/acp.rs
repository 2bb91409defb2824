//! ACP's side of what both ends agree on: the stop reasons of a turn, and
//! a permission request in our words and in ACP's, for the `acp` provider
//! (the client, which hears a child's request) and `subagents acp` (the
//! agent, which passes a grandchild's on to its own client). The messages
//! themselves are the official crate's.

#[cfg(any(feature = "agent", test))]
use agent_client_protocol::v1::schema::{PermissionOption as AcpOption, SessionId, ToolCallId, ToolCallUpdate};
use agent_client_protocol::v1::schema::{
    PermissionOptionKind, RequestPermissionOutcome, RequestPermissionRequest, SelectedPermissionOutcome,
    StopReason as AcpStop, ToolCallContent, ToolCallLocation, ToolCallUpdateFields, ToolKind,
};

use crate::seam::{Answer, OptionKind, PermissionOption, PermissionRequest, StopReason, MAX_PATHS};

/// Our stop reasons and ACP's, for both ends: this client and the agent in
/// `subagents acp`. `Error` has none: a failed turn is an error answer, and an
/// ACP reason not listed (`max_turn_requests`, …) is an error to us.
const STOP_REASONS: [(StopReason, AcpStop); 4] = [
    (StopReason::Completed, AcpStop::EndTurn),
    (StopReason::MaxTokens, AcpStop::MaxTokens),
    (StopReason::Refusal, AcpStop::Refusal),
    (StopReason::Aborted, AcpStop::Cancelled),
];

pub(crate) fn stop_reason_of(acp: AcpStop) -> StopReason {
    STOP_REASONS.iter().find(|(_, theirs)| *theirs == acp).map_or(StopReason::Error, |(ours, _)| *ours)
}

#[cfg(any(feature = "agent", test))]
pub(crate) fn acp_stop_of(stop: StopReason) -> Option<AcpStop> {
    STOP_REASONS.iter().find(|(ours, _)| *ours == stop).map(|(_, theirs)| *theirs)
}

const OPTION_KINDS: [(OptionKind, PermissionOptionKind); 4] = [
    (OptionKind::AllowOnce, PermissionOptionKind::AllowOnce),
    (OptionKind::AllowAlways, PermissionOptionKind::AllowAlways),
    (OptionKind::RejectOnce, PermissionOptionKind::RejectOnce),
    (OptionKind::RejectAlways, PermissionOptionKind::RejectAlways),
];

/// The option kind of ours an ACP kind is; a kind newer than this crate
/// has none, and such an option is never chosen.
fn option_kind_of(kind: &PermissionOptionKind) -> Option<OptionKind> {
    OPTION_KINDS.iter().find(|(_, theirs)| theirs == kind).map(|(ours, _)| *ours)
}

/// An ACP tool kind's wire name (`execute`, `edit`, …).
fn kind_name(kind: ToolKind) -> Option<String> {
    serde_json::to_value(kind).ok().and_then(|value| value.as_str().map(str::to_owned))
}

/// A child's `session/request_permission` in our words: what its
/// `toolCall` says, filled in from `earlier` (the `tool_call` the agent
/// announced it with, when it did), and the options it offered that we
/// know the kind of.
pub(crate) fn permission_request_of(
    request: &RequestPermissionRequest,
    earlier: Option<&ToolCallUpdateFields>,
) -> PermissionRequest {
    let options = request
        .options
        .iter()
        .filter_map(|option| {
            let kind = option_kind_of(&option.kind)?;
            Some(PermissionOption::new(option.option_id.to_string(), option.name.clone(), kind))
        })
        .collect();
    let fields = &request.tool_call.fields;
    /// What the request says, else what the announcement said.
    fn pick<T: Clone>(
        fields: &ToolCallUpdateFields,
        earlier: Option<&ToolCallUpdateFields>,
        field: fn(&ToolCallUpdateFields) -> &Option<T>,
    ) -> Option<T> {
        field(fields).clone().or_else(|| earlier.and_then(|earlier| field(earlier).clone()))
    }
    let mut ours = PermissionRequest::new(options);
    if let Some(name) = pick(fields, earlier, |e| &e.name) {
        ours = ours.with_tool(name);
    }
    if let Some(kind) = pick(fields, earlier, |e| &e.kind).and_then(kind_name) {
        ours = ours.with_kind(kind);
    }
    if let Some(title) = pick(fields, earlier, |e| &e.title) {
        ours = ours.with_title(title);
    }
    if let Some(input) = pick(fields, earlier, |e| &e.raw_input) {
        ours = ours.with_input(&input);
    }
    // Every file the call named, in this request or in any message before
    // it (its locations and the paths of its diffs): the request keeps what
    // the rules can judge, and says what it left out.
    let mut files: Vec<String> = Vec::new();
    let mut note = |path: &std::path::Path| {
        let path = path.display().to_string();
        if !files.contains(&path) {
            files.push(path);
        }
    };
    for said in std::iter::once(fields).chain(earlier) {
        said.locations.iter().flatten().for_each(|location| note(&location.path));
        diff_paths(&said.content).for_each(&mut note);
    }
    for path in files {
        ours = ours.with_path(path);
    }
    ours
}

/// The paths of the diffs in a tool call's `content`.
fn diff_paths(content: &Option<Vec<ToolCallContent>>) -> impl Iterator<Item = &std::path::Path> {
    content.iter().flatten().filter_map(|content| match content {
        ToolCallContent::Diff(diff) => Some(diff.path.as_path()),
        _ => None,
    })
}

/// Keeps the paths of `content`'s diffs among `fields`' locations (what a
/// remembered call keeps of its content: its files, not its text).
pub(crate) fn keep_files_of(fields: &mut ToolCallUpdateFields, content: &[ToolCallContent]) {
    let locations = fields.locations.get_or_insert_with(Vec::new);
    for content in content {
        if let ToolCallContent::Diff(diff) = content {
            if locations.len() <= MAX_PATHS && !locations.iter().any(|location| location.path == diff.path) {
                locations.push(ToolCallLocation::new(diff.path.clone()));
            }
        }
    }
}

/// Folds `update` into the remembered `known` fields of the same call:
/// what it sets replaces what was said, except the files, which add up
/// (a file the call named once stays one the rules judge).
pub(crate) fn fold_update(known: &mut ToolCallUpdateFields, update: &ToolCallUpdateFields) {
    if update.kind.is_some() {
        known.kind = update.kind;
    }
    if update.title.is_some() {
        known.title.clone_from(&update.title);
    }
    if update.name.is_some() {
        known.name.clone_from(&update.name);
    }
    if update.raw_input.is_some() {
        known.raw_input.clone_from(&update.raw_input);
    }
    let locations = known.locations.get_or_insert_with(Vec::new);
    for location in update.locations.iter().flatten() {
        // One past the most a request keeps is enough for it to say so.
        if locations.len() <= MAX_PATHS && !locations.iter().any(|known| known.path == location.path) {
            locations.push(location.clone());
        }
    }
    if let Some(content) = &update.content {
        keep_files_of(known, content);
    }
}

/// The ACP answer to `request` for `answer`: the option it names, else the
/// option of its verdict's kind the child offered, else `cancelled` (which
/// a child takes as no).
pub(crate) fn outcome_of(request: &PermissionRequest, answer: &Answer) -> RequestPermissionOutcome {
    match request.option_answering(answer) {
        Some(option) => RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(option.id.clone())),
        None => RequestPermissionOutcome::Cancelled,
    }
}

/// Our request as a `session/request_permission` of session `session`,
/// offering the same options, for a client to answer (`subagents acp`
/// passing a grandchild's request up). The title names who asks.
#[cfg(any(feature = "agent", test))]
pub(crate) fn acp_request_of(
    session: SessionId,
    call_id: &str,
    request: &PermissionRequest,
) -> RequestPermissionRequest {
    let mut fields =
        ToolCallUpdateFields::new().title(format!("{} asks: {}", request.asker_line(), request.call_line()));
    if let Some(kind) = request.kind.as_deref().and_then(|kind| serde_json::from_value::<ToolKind>(kind.into()).ok()) {
        fields = fields.kind(kind);
    }
    if let Some(input) = request.input.as_deref() {
        fields = fields.raw_input(serde_json::Value::String(input.to_owned()));
    }
    let options = request
        .options
        .iter()
        .filter_map(|option| {
            let kind = OPTION_KINDS.iter().find(|(ours, _)| *ours == option.kind).map(|(_, theirs)| *theirs)?;
            Some(AcpOption::new(option.id.clone(), option.name.clone(), kind))
        })
        .collect();
    RequestPermissionRequest::new(session, ToolCallUpdate::new(ToolCallId::new(call_id.to_owned()), fields), options)
}

/// What a client's answer to [`acp_request_of`] chose: the option, when it
/// is one offered; `None` (a reject) for anything else (cancelled, an
/// option never offered).
#[cfg(any(feature = "agent", test))]
pub(crate) fn option_chosen<'a>(
    request: &'a PermissionRequest,
    outcome: &RequestPermissionOutcome,
) -> Option<&'a PermissionOption> {
    let RequestPermissionOutcome::Selected(selected) = outcome else { return None };
    request.options.iter().find(|option| selected.option_id.to_string() == option.id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seam::Verdict;

    #[test]
    fn stop_reasons_map_both_ways_and_error_is_an_error_answer_not_a_reason() {
        for stop in [StopReason::Completed, StopReason::MaxTokens, StopReason::Refusal, StopReason::Aborted] {
            let acp = acp_stop_of(stop).expect("every outcome but Error has an ACP reason");
            assert_eq!(stop_reason_of(acp), stop);
        }
        assert_eq!(acp_stop_of(StopReason::Error), None);
        assert_eq!(stop_reason_of(AcpStop::MaxTurnRequests), StopReason::Error);
    }

    #[test]
    fn every_location_of_a_call_is_kept_for_the_rules() {
        use agent_client_protocol::v1::schema::{ToolCallLocation, ToolCallUpdate};
        let mut locations: Vec<ToolCallLocation> =
            (0..16).map(|at| ToolCallLocation::new(format!("/repo/src/{at}.rs"))).collect();
        locations.push(ToolCallLocation::new("/etc/passwd"));
        let fields = ToolCallUpdateFields::new().kind(ToolKind::Edit).locations(locations);
        let asked = RequestPermissionRequest::new(SessionId::new("s"), ToolCallUpdate::new("c1", fields), Vec::new());
        let ours = permission_request_of(&asked, None);
        assert_eq!(ours.paths.last().map(String::as_str), Some("/etc/passwd"), "{:?}", ours.paths);
        let rules = crate::seam::Rules::new(crate::seam::Policy::Ask)
            .with(crate::seam::Rule::new(crate::seam::Policy::Allow).kind("edit").path("/repo"));
        assert_eq!(rules.decide(&ours), crate::seam::Policy::Ask);
    }

    /// A path allow rule for `/repo` edits, asking otherwise.
    fn repo_edits() -> crate::seam::Rules {
        crate::seam::Rules::new(crate::seam::Policy::Ask)
            .with(crate::seam::Rule::new(crate::seam::Policy::Allow).kind("edit").path("/repo"))
    }

    #[test]
    fn a_call_moved_by_an_update_is_judged_on_every_file_it_named() {
        use agent_client_protocol::v1::schema::{ToolCallLocation, ToolCallUpdate};
        // Announced under /repo, then updated to /etc/passwd; the request
        // names the call by id alone.
        let mut known =
            ToolCallUpdateFields::new().kind(ToolKind::Edit).locations(vec![ToolCallLocation::new("/repo/a")]);
        fold_update(&mut known, &ToolCallUpdateFields::new().locations(vec![ToolCallLocation::new("/etc/passwd")]));
        let asked = RequestPermissionRequest::new(
            SessionId::new("s"),
            ToolCallUpdate::new("c1", ToolCallUpdateFields::new()),
            Vec::new(),
        );
        let ours = permission_request_of(&asked, Some(&known));
        assert!(ours.paths.iter().any(|path| path == "/etc/passwd"), "{:?}", ours.paths);
        assert_eq!(repo_edits().decide(&ours), crate::seam::Policy::Ask);
    }

    #[test]
    fn the_file_of_a_diff_is_a_file_of_the_call() {
        use agent_client_protocol::v1::schema::{Diff, ToolCallLocation, ToolCallUpdate};
        let diff = ToolCallContent::Diff(Diff::new("/etc/passwd", "root::0:0::/:/bin/sh"));
        let fields = ToolCallUpdateFields::new()
            .kind(ToolKind::Edit)
            .locations(vec![ToolCallLocation::new("/repo/a")])
            .content(vec![diff.clone()]);
        let asked = RequestPermissionRequest::new(SessionId::new("s"), ToolCallUpdate::new("c1", fields), Vec::new());
        assert_eq!(
            repo_edits().decide(&permission_request_of(&asked, None)),
            crate::seam::Policy::Ask,
            "in the request"
        );
        // In the announcement, kept as a file of the call.
        let mut known =
            ToolCallUpdateFields::new().kind(ToolKind::Edit).locations(vec![ToolCallLocation::new("/repo/a")]);
        keep_files_of(&mut known, &[diff]);
        let asked = RequestPermissionRequest::new(
            SessionId::new("s"),
            ToolCallUpdate::new("c1", ToolCallUpdateFields::new()),
            Vec::new(),
        );
        assert_eq!(
            repo_edits().decide(&permission_request_of(&asked, Some(&known))),
            crate::seam::Policy::Ask,
            "announced"
        );
    }

    #[test]
    fn an_input_too_large_to_keep_whole_is_never_allowed_by_a_rule() {
        use agent_client_protocol::v1::schema::{ToolCallLocation, ToolCallUpdate};
        let edit = |bytes: usize| {
            let fields = ToolCallUpdateFields::new()
                .kind(ToolKind::Edit)
                .locations(vec![ToolCallLocation::new("/repo/a")])
                .raw_input(serde_json::json!({"path": "/repo/a", "text": "x".repeat(bytes)}));
            let asked =
                RequestPermissionRequest::new(SessionId::new("s"), ToolCallUpdate::new("c1", fields), Vec::new());
            repo_edits().decide(&permission_request_of(&asked, None))
        };
        assert_eq!(edit(20_000), crate::seam::Policy::Allow, "an honest edit of 20 KB is judged whole");
        assert_eq!(edit(crate::seam::MAX_JUDGED_INPUT), crate::seam::Policy::Ask);
    }

    #[test]
    fn a_clients_answer_is_an_option_only_when_offered() {
        let request = PermissionRequest::new(vec![
            PermissionOption::new("yes", "Allow", OptionKind::AllowOnce),
            PermissionOption::new("no", "Reject", OptionKind::RejectOnce),
        ]);
        let chose = |id: &str| RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(id.to_owned()));
        let chosen = |outcome| option_chosen(&request, &outcome).map(|option| option.id.clone());
        assert_eq!(chosen(chose("yes")).as_deref(), Some("yes"));
        assert_eq!(chosen(chose("no")).as_deref(), Some("no"));
        assert_eq!(chosen(chose("always")), None, "never offered");
        assert_eq!(chosen(RequestPermissionOutcome::Cancelled), None);
        let asked = acp_request_of(SessionId::new("s"), "c1", &request);
        assert_eq!(asked.options.len(), 2);
        let back = permission_request_of(&asked, None);
        assert_eq!(back.options, request.options, "the options travel as they were offered");
    }

    #[test]
    fn the_child_is_given_the_option_chosen_even_beside_another_of_its_kind() {
        let request = PermissionRequest::new(vec![
            PermissionOption::new("edit-once", "Allow this edit", OptionKind::AllowOnce),
            PermissionOption::new("edit-dir", "Allow edits in this folder", OptionKind::AllowOnce),
            PermissionOption::new("no", "Reject", OptionKind::RejectOnce),
        ]);
        let given = |answer: &Answer| match outcome_of(&request, answer) {
            RequestPermissionOutcome::Selected(selected) => selected.option_id.to_string(),
            _ => "cancelled".to_owned(),
        };
        let second = &request.options[1];
        assert_eq!(given(&Answer::chose(second, "a client")), "edit-dir");
        assert_eq!(given(&Answer::new(Verdict::AllowOnce, "a policy")), "edit-once", "a bare verdict takes the first");
        // An answer naming an option of another verdict, or none offered,
        // falls back to its verdict: never an allow it did not give.
        let forged = Answer { option: Some("edit-dir".to_owned()), ..Answer::reject("a forged answer") };
        assert_eq!(given(&forged), "no");
        let unknown = Answer { option: Some("elsewhere".to_owned()), ..Answer::new(Verdict::AllowOnce, "x") };
        assert_eq!(given(&unknown), "edit-once");
    }
}
