//! A permission request crossing a wire: what the `process` and `remote`
//! wires both do with a [`PermissionRequest`] and its [`Answer`] when they
//! carry them between a runtime below and the run above it.
//!
//! Whatever arrives is the peer's, so hostile: a request read from a wire
//! is cut again as [`PermissionRequest`]'s builders cut what a child says
//! (its paths, its options and their names too, bounded in number; what
//! was cut below stays marked cut), and an
//! answer's `by` is made one safe line of at most [`MAX_BY`] bytes. A
//! connection has at most [`MAX_PENDING`] requests waiting; one more is
//! rejected at once.

use std::time::Duration;

use serde_json::Value;

use crate::seam::{cut, safe_line, Answer, Hop, PermissionOption, PermissionRequest};

/// How long a request that crossed a wire waits above at most: the asker
/// below withdraws it at its own timeout, so this only bounds one that
/// never does.
pub(crate) const LONGEST_WAIT: Duration = Duration::from_secs(24 * 60 * 60);

/// Requests one connection may have waiting for an answer at once.
pub(crate) const MAX_PENDING: usize = 64;

/// Hops of a path, and options of a request, kept from a wire.
const MAX_LISTED: usize = 32;

/// The most of an answer's `by` kept from a wire, in bytes.
pub(crate) const MAX_BY: usize = 200;

/// The names a hop or an option carries, cut.
const MAX_NAME: usize = 256;

/// `request` as read from a wire, cut as a child's words are.
pub(crate) fn received(request: PermissionRequest) -> PermissionRequest {
    let name = |text: &str| cut(text, MAX_NAME).to_owned();
    let options = request.options.iter().take(MAX_LISTED);
    let options = options.map(|option| PermissionOption::new(name(&option.id), name(&option.name), option.kind));
    let mut bounded = PermissionRequest::new(options.collect());
    bounded.asker = request
        .asker
        .iter()
        .take(MAX_LISTED)
        .map(|hop| Hop { provider: name(&hop.provider), label: hop.label.as_deref().map(name), depth: hop.depth })
        .collect();
    if let Some(tool) = request.tool {
        bounded = bounded.with_tool(tool);
    }
    if let Some(kind) = request.kind {
        bounded = bounded.with_kind(kind);
    }
    if let Some(title) = request.title {
        bounded = bounded.with_title(title);
    }
    if let Some(input) = request.input {
        bounded = bounded.with_input_text(input);
    }
    for path in request.paths {
        bounded = bounded.with_path(path);
    }
    // What was cut below stays cut: the rules above must not judge it whole.
    for field in request.cut {
        bounded.mark_cut(field);
    }
    bounded
}

/// The answer a peer sent as a JSON-RPC `result` (or `error`), made safe;
/// anything unreadable is a reject saying so.
pub(crate) fn answer_received(result: Option<&Value>, error: Option<&Value>) -> Answer {
    match (result, error) {
        (Some(result), None) => match serde_json::from_value::<Answer>(result.clone()) {
            Ok(answer) => Answer {
                // An option id no child could have offered is dropped: the
                // verdict alone picks the option then.
                option: answer.option.filter(|id| id.len() <= MAX_NAME),
                ..Answer::new(answer.verdict, safe_line(cut(&answer.by, MAX_BY)).into_owned())
            },
            Err(_) => Answer::reject("an answer from above that could not be read"),
        },
        (None, Some(error)) => {
            let message = error["message"].as_str().unwrap_or_default();
            Answer::reject(format!("the parent refused to answer: {}", safe_line(cut(message, MAX_BY))))
        }
        _ => Answer::reject("an answer from above that could not be read"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seam::{OptionKind, Verdict};
    use serde_json::json;

    #[test]
    fn what_a_wire_brings_is_cut_and_an_unreadable_answer_is_a_reject() {
        let mut request =
            PermissionRequest::new(vec![PermissionOption::new("y".repeat(9000), "n", OptionKind::AllowOnce); 100]);
        request.title = Some("t".repeat(100_000));
        request.asker = vec![Hop { provider: "p".repeat(9000), label: None, depth: 1 }; 100];
        let bounded = received(request);
        assert_eq!(bounded.options.len(), MAX_LISTED);
        assert_eq!(bounded.asker.len(), MAX_LISTED);
        assert!(bounded.options[0].id.len() <= MAX_NAME && bounded.asker[0].provider.len() <= MAX_NAME);
        assert!(bounded.title.unwrap().len() <= crate::seam::MAX_JUDGED + '…'.len_utf8());
        assert_eq!(bounded.cut, [crate::seam::RequestField::Title], "and says it was cut");
        let mut named = PermissionRequest::new(Vec::new());
        named.paths = vec!["/repo/a".to_owned(); crate::seam::MAX_PATHS + 1];
        named.cut = vec![crate::seam::RequestField::Tool];
        let bounded = received(named);
        assert_eq!(bounded.paths.len(), crate::seam::MAX_PATHS);
        assert!(!bounded.judged_whole(), "a cut below stays cut above: {:?}", bounded.cut);
        let said = json!({"verdict": "allow_once", "by": "a\u{1b}[31m person\n"});
        assert_eq!(answer_received(Some(&said), None), Answer::new(Verdict::AllowOnce, "a person "));
        let chose = json!({"verdict": "allow_once", "by": "x", "option": "edit-dir"});
        assert_eq!(answer_received(Some(&chose), None).option.as_deref(), Some("edit-dir"), "the option crosses");
        let long = json!({"verdict": "allow_once", "by": "x", "option": "o".repeat(MAX_NAME + 1)});
        assert_eq!(answer_received(Some(&long), None).option, None, "no child offers an id this long");
        assert_eq!(answer_received(Some(&json!({"verdict": "sure"})), None).verdict, Verdict::Reject);
        assert_eq!(answer_received(None, Some(&json!({"code": 1, "message": "no"}))).verdict, Verdict::Reject);
    }
}
