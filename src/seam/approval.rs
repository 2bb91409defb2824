//! Approvals: a child's request for permission, carried up the tree to the
//! nearest door that has someone (or a policy) to ask, and the answer
//! carried back down to exactly that child.
//!
//! Real coding agents ask before they act: an ACP agent sends
//! `session/request_permission` before an edit or a command. The child's
//! provider turns that into a [`PermissionRequest`] (who asks, what, the
//! options the child offered), decides what its own [`Rules`] can decide
//! (`allow`, `reject`), and hands what they leave open (`ask`) to the run's
//! [`Approvals`]: the route to the nearest [`Approver`]. A door installs
//! one — on the runtime for every run
//! ([`Subagents::set_approver`](crate::Subagents::set_approver)), or on the
//! [`Parent`](crate::Parent) of the starts one agent makes
//! ([`Parent::with_approvals`](crate::Parent::with_approvals)) — and a run
//! inherits its parent's route with itself appended, so the request names
//! the whole path from the root ([`Hop`]s: provider, label, depth) and a
//! grandchild's question reaches the same door as a child's.
//!
//! **Never granted by accident.** [`Approvals::ask`] answers
//! [`Verdict::Reject`] when there is no approver, when the run is cancelled
//! or disposed while it waits, when nobody answers within the timeout, and
//! when the approver goes away without answering; what it says is in the
//! [`Answer`]'s `by`, which the child's transcript records. The answer
//! becomes an option the child offered, by kind and never by position
//! ([`PermissionRequest::option_for`]): a child that offered no option of
//! the answer's kind gets none (for ACP, `cancelled`, a rejection).
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use subagents::seam::{
//!     Answer, Approvals, Approver, BoxFuture, OptionKind, PermissionOption, PermissionRequest, Verdict,
//! };
//! use subagents::CancellationToken;
//!
//! /// Allows anything that only reads.
//! #[derive(Debug)]
//! struct ReadsOnly;
//!
//! impl Approver for ReadsOnly {
//!     fn ask(&self, request: PermissionRequest, _cancel: CancellationToken) -> BoxFuture<'static, Answer> {
//!         let verdict = if request.kind.as_deref() == Some("read") { Verdict::AllowOnce } else { Verdict::Reject };
//!         Box::pin(async move { Answer::new(verdict, "reads-only") })
//!     }
//! }
//!
//! let options = vec![
//!     PermissionOption::new("yes", "Allow", OptionKind::AllowOnce),
//!     PermissionOption::new("no", "Reject", OptionKind::RejectOnce),
//! ];
//! let request = PermissionRequest::new(options).with_kind("read").with_title("Read README.md");
//! let approvals = Approvals::new(Arc::new(ReadsOnly));
//! let answer = tokio::runtime::Runtime::new().unwrap().block_on(approvals.ask(
//!     request.clone(),
//!     Duration::from_secs(60),
//!     &CancellationToken::new(),
//! ));
//! assert_eq!(answer.verdict, Verdict::AllowOnce);
//! assert_eq!(request.option_for(answer.verdict).map(|option| option.id.as_str()), Some("yes"));
//! ```

mod rules;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

#[cfg(feature = "agent")]
pub(crate) use self::rules::glob;
pub use self::rules::{Policy, Rule, Rules};
use super::safe_line;

/// How long a request waits for an answer unless its provider says
/// otherwise: a person may be away from the terminal for a while, and no
/// answer is a reject.
pub const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(600);

/// The most of a tool call's input (or title) a door shows on its line
/// ([`PermissionRequest::call_line`]); the rest is kept, for the rules.
pub const MAX_SHOWN_INPUT: usize = 2048;

/// The most of each text of a request (tool, kind, title) kept whole, for
/// the rules to judge; a child's text past it is cut, marked with `…`, and
/// the request says so ([`PermissionRequest::cut`]).
pub const MAX_JUDGED: usize = 16 * 1024;

/// The most of a request's raw input kept whole (an edit carries its new
/// text, so more than the other texts); past it the input is cut as they are.
pub const MAX_JUDGED_INPUT: usize = 256 * 1024;

/// The most bytes of one path a request keeps (Linux's `PATH_MAX`: no
/// longer path names a file); a longer one is cut, and the request says so.
pub const MAX_PATH_BYTES: usize = 4096;

/// The most paths a request keeps; a call that names more is kept with
/// these, and the request says the rest was left out.
pub const MAX_PATHS: usize = 64;

/// One run on the way from the root to the child that asks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hop {
    /// The provider that runs it.
    pub provider: String,
    /// Its display label, when its start had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Its delegation depth (1 for a child of a top-level agent).
    pub depth: u32,
}

impl fmt::Display for Hop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.label {
            Some(label) => write!(f, "{} ({})", safe_line(&self.provider), safe_line(label)),
            None => f.write_str(&safe_line(&self.provider)),
        }
    }
}

/// What an option the child offered does, as ACP names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OptionKind {
    /// Allow this call.
    AllowOnce,
    /// Allow this call and its like from now on.
    AllowAlways,
    /// Reject this call.
    RejectOnce,
    /// Reject this call and its like from now on.
    RejectAlways,
}

impl OptionKind {
    /// What choosing it does, in words for a person.
    pub fn said(self) -> &'static str {
        match self {
            OptionKind::AllowOnce => "allow once",
            OptionKind::AllowAlways => "allow always, for this run",
            OptionKind::RejectOnce => "reject",
            OptionKind::RejectAlways => "reject always",
        }
    }
}

/// A part of a request that a child sent more of than is kept
/// ([`PermissionRequest::cut`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestField {
    /// The tool's name, past [`MAX_JUDGED`].
    Tool,
    /// The kind of call, past [`MAX_JUDGED`].
    Kind,
    /// The title, past [`MAX_JUDGED`].
    Title,
    /// The input, past [`MAX_JUDGED_INPUT`].
    Input,
    /// A path past [`MAX_PATH_BYTES`], or paths past [`MAX_PATHS`].
    Paths,
}

/// One option the child offered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PermissionOption {
    /// The child's id for it, sent back when it is chosen.
    pub id: String,
    /// Its name as the child shows it.
    pub name: String,
    /// What it does.
    pub kind: OptionKind,
}

impl PermissionOption {
    /// An option `id` named `name` of `kind`.
    pub fn new(id: impl Into<String>, name: impl Into<String>, kind: OptionKind) -> Self {
        PermissionOption { id: id.into(), name: name.into(), kind }
    }
}

/// A child's request for permission: who asks, what for, and what it
/// offered to be answered with. Every text is the child's, so hostile:
/// kept whole up to [`MAX_JUDGED`] (paths: [`MAX_PATH_BYTES`] each, at
/// most [`MAX_PATHS`]) so that rules judge the whole request, and what is
/// cut is named in [`cut`](Self::cut); shown cut to [`MAX_SHOWN_INPUT`],
/// escaped wherever it is shown ([`safe_line`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PermissionRequest {
    /// The path from the root to the child that asks (the child last);
    /// [`Approvals::ask`] fills it.
    #[serde(default)]
    pub asker: Vec<Hop>,
    /// The tool's name, when the child says it (an in-process tool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<String>,
    /// The kind of call (ACP's `read`, `edit`, `delete`, `move`, `search`,
    /// `execute`, `think`, `fetch`, `other`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The agent's title for the call (`Run cargo test`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// The call's raw input, as JSON text, bounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// The files the call touches, as the child names them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// The options the child offered.
    pub options: Vec<PermissionOption>,
    /// What the child sent more of than is kept: empty when the request is
    /// whole. No rule allows a request whose judged parts were cut (it is
    /// asked), and "allow always" remembers nothing of a cut request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cut: Vec<RequestField>,
}

impl PermissionRequest {
    /// A request offering `options`, about nothing yet.
    pub fn new(options: Vec<PermissionOption>) -> Self {
        PermissionRequest { options, ..PermissionRequest::default() }
    }

    /// The tool's name.
    pub fn with_tool(mut self, tool: impl Into<String>) -> Self {
        self.tool = Some(self.bounded(tool.into(), MAX_JUDGED, RequestField::Tool));
        self
    }

    /// The kind of call.
    pub fn with_kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(self.bounded(kind.into(), MAX_JUDGED, RequestField::Kind));
        self
    }

    /// The agent's title for the call.
    pub fn with_title(mut self, title: impl Into<String>) -> Self {
        self.title = Some(self.bounded(title.into(), MAX_JUDGED, RequestField::Title));
        self
    }

    /// The call's raw input (kept as compact JSON, bounded).
    pub fn with_input(mut self, input: &serde_json::Value) -> Self {
        self.input = Some(self.bounded(input.to_string(), MAX_JUDGED_INPUT, RequestField::Input));
        self
    }

    /// The call's raw input as text already (from a wire), bounded.
    #[cfg_attr(not(feature = "process"), allow(dead_code))]
    pub(crate) fn with_input_text(mut self, input: String) -> Self {
        self.input = Some(self.bounded(input, MAX_JUDGED_INPUT, RequestField::Input));
        self
    }

    /// A file the call touches; past [`MAX_PATHS`] it is left out, and the
    /// request says so.
    pub fn with_path(mut self, path: impl Into<String>) -> Self {
        if self.paths.len() >= MAX_PATHS {
            self.mark_cut(RequestField::Paths);
            return self;
        }
        let path = self.bounded(path.into(), MAX_PATH_BYTES, RequestField::Paths);
        self.paths.push(path);
        self
    }

    /// Says that `field` was cut (once).
    pub(crate) fn mark_cut(&mut self, field: RequestField) {
        if !self.cut.contains(&field) {
            self.cut.push(field);
        }
    }

    /// Whether the request is whole: nothing of it was cut. The input
    /// counts too, though no rule matches on it: it is what the call does,
    /// and a rule allows a call only on all of it.
    pub fn judged_whole(&self) -> bool {
        self.cut.is_empty()
    }

    /// `text` cut to `max` bytes (on a character boundary), marked with
    /// `…` and named in [`cut`](Self::cut) when cut.
    fn bounded(&mut self, mut text: String, max: usize, field: RequestField) -> String {
        if text.len() > max {
            text.truncate(super::cut(&text, max).len());
            text.push('…');
            self.mark_cut(field);
        }
        text
    }

    /// The child that asks (the last hop), as one safe line.
    pub fn asker_line(&self) -> String {
        match self.asker.last() {
            None => "a child".to_owned(),
            Some(hop) => {
                let path: Vec<String> = self.asker.iter().map(Hop::to_string).collect();
                format!("{hop} at depth {} [{}]", hop.depth, path.join(" › "))
            }
        }
    }

    /// What is asked for, as one safe line: the title (else the tool, else
    /// the kind) and the input, each shown to [`MAX_SHOWN_INPUT`] bytes.
    pub fn call_line(&self) -> String {
        let what = self.title.as_deref().or(self.tool.as_deref()).or(self.kind.as_deref()).unwrap_or("a tool call");
        let mut line = shown(what);
        if let Some(kind) = self.kind.as_deref().filter(|_| self.title.is_some() || self.tool.is_some()) {
            line.push_str(&format!(" ({})", shown(kind)));
        }
        if let Some(input) = &self.input {
            line.push_str(&format!(" {}", shown(input)));
        }
        if !self.cut.is_empty() {
            line.push_str(" [cut: too large to keep whole]");
        }
        line
    }

    /// Which verdicts the child's options allow: an answer is one of them.
    pub fn offers(&self, verdict: Verdict) -> bool {
        self.option_for(verdict).is_some()
    }

    /// The option a verdict picks, by kind and never by position: allow
    /// once takes `allow_once`; allow always takes `allow_always`, else
    /// `allow_once`; reject takes `reject_once`, else `reject_always`.
    /// `None` when the child offered nothing of the kind.
    pub fn option_for(&self, verdict: Verdict) -> Option<&PermissionOption> {
        let kinds: &[OptionKind] = match verdict {
            Verdict::AllowOnce => &[OptionKind::AllowOnce],
            Verdict::AllowAlways => &[OptionKind::AllowAlways, OptionKind::AllowOnce],
            Verdict::Reject => &[OptionKind::RejectOnce, OptionKind::RejectAlways],
        };
        kinds.iter().find_map(|kind| self.options.iter().find(|option| option.kind == *kind))
    }

    /// The option `answer` gives the child: the one it names, when offered
    /// and of its verdict; else the one its verdict picks
    /// ([`option_for`](Self::option_for)).
    pub fn option_answering(&self, answer: &Answer) -> Option<&PermissionOption> {
        let named = answer.option.as_deref().and_then(|id| {
            self.options.iter().find(|option| option.id == id && Verdict::of(option.kind) == answer.verdict)
        });
        named.or_else(|| self.option_for(answer.verdict))
    }

    /// What "allow always" is remembered by within a run, and so all it
    /// covers: the tool, when the child names one (the door says "every
    /// call of the tool") when the call says a kind that runs no command
    /// (`read`, `edit`, …), else the tool with this same command (title and
    /// input: a shell tool is one tool for every command); else exactly this call (its kind, title, input
    /// and paths), never its kind alone. `None` (so "always" allows this
    /// call once) when the request was cut or names nothing to remember it
    /// by. Doors say the same in words: [`always_covers`](Self::always_covers).
    pub fn grant_key(&self) -> Option<String> {
        if !self.cut.is_empty() {
            return None;
        }
        // A tool that runs commands is one tool for every command: always
        // on `cargo test` must not allow `rm -rf ~/`, so it covers the
        // tool with this same command only; so does a tool whose call says
        // no kind (or one we do not know), which may be a shell as well.
        if let Some(tool) = &self.tool {
            if self.kind_without_command() {
                return Some(format!("tool:{tool}"));
            }
            let command = serde_json::json!([self.title, self.input]);
            return Some(format!("tool:{tool}:command:{command}"));
        }
        if self.kind.is_none() && self.title.is_none() && self.input.is_none() && self.paths.is_empty() {
            return None;
        }
        let call = serde_json::json!([self.kind, self.title, self.input, self.paths]);
        Some(format!("call:{call}"))
    }

    /// Whether the call says it is of a kind that runs no command (ACP's
    /// kinds but `execute` and `other`), so that its tool alone says what
    /// it does; a call of no kind, or of another, may run anything.
    fn kind_without_command(&self) -> bool {
        const WITHOUT_COMMAND: [&str; 8] =
            ["read", "edit", "delete", "move", "search", "think", "fetch", "switch_mode"];
        self.kind.as_deref().is_some_and(|kind| WITHOUT_COMMAND.contains(&kind))
    }

    /// What "allow always" will cover, in words for a person, as every
    /// door shows it beside the answer (see [`grant_key`](Self::grant_key)).
    pub fn always_covers(&self) -> String {
        match (&self.tool, self.grant_key()) {
            (_, None) => "this call only: it is too large or too vague to remember, so always is once".to_owned(),
            (Some(tool), Some(_)) if !self.kind_without_command() => {
                format!("the tool {} with this same command and input again, for the rest of this run", shown(tool))
            }
            (Some(tool), Some(_)) => format!("every call of the tool {} for the rest of this run", shown(tool)),
            (None, Some(_)) => {
                "only this same call again (kind, title, input and files as shown), for the rest of this run".to_owned()
            }
        }
    }

    /// What choosing an option of `kind` does for this request, in words:
    /// for "allow always", exactly what it covers.
    pub fn option_said(&self, kind: OptionKind) -> String {
        match kind {
            OptionKind::AllowAlways => format!("allow always: {}", self.always_covers()),
            other => other.said().to_owned(),
        }
    }
}

/// `text` as one safe line of at most [`MAX_SHOWN_INPUT`] bytes, marked
/// with `…` when cut.
fn shown(text: &str) -> String {
    let kept = super::cut(text, MAX_SHOWN_INPUT);
    let mut line = safe_line(kept).into_owned();
    if kept.len() < text.len() {
        line.push('…');
    }
    line
}

/// What a door answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Allow this call.
    AllowOnce,
    /// Allow this call, and calls of the same tool for the rest of this
    /// run (never longer: the grant dies with the run).
    AllowAlways,
    /// Reject this call.
    Reject,
}

impl Verdict {
    /// What choosing an option of `kind` decides.
    pub fn of(kind: OptionKind) -> Verdict {
        match kind {
            OptionKind::AllowOnce => Verdict::AllowOnce,
            OptionKind::AllowAlways => Verdict::AllowAlways,
            OptionKind::RejectOnce | OptionKind::RejectAlways => Verdict::Reject,
        }
    }

    /// Whether the call may go ahead.
    pub fn allows(self) -> bool {
        !matches!(self, Verdict::Reject)
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::AllowOnce => "allow once",
            Verdict::AllowAlways => "allow always",
            Verdict::Reject => "reject",
        })
    }
}

/// A verdict and who (or what) gave it, as the transcript records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// The verdict.
    pub verdict: Verdict,
    /// Who answered, or why nobody did: `the terminal`, `the ACP client`,
    /// `no answer within 600 s`, `the run was cancelled`.
    pub by: String,
    /// The id of the option chosen, when the door showed the child's own
    /// options (an ACP, MCP or A2A client): the child is given exactly
    /// that option, even where it offered two of one kind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub option: Option<String>,
}

impl Answer {
    /// `verdict`, given by `by`.
    pub fn new(verdict: Verdict, by: impl Into<String>) -> Self {
        Answer { verdict, by: by.into(), option: None }
    }

    /// `option` chosen by `by`: its verdict, and the option itself.
    pub fn chose(option: &PermissionOption, by: impl Into<String>) -> Self {
        Answer { option: Some(option.id.clone()), ..Answer::new(Verdict::of(option.kind), by) }
    }

    /// A reject, and why.
    pub fn reject(why: impl Into<String>) -> Self {
        Answer::new(Verdict::Reject, why)
    }
}

/// A door that asks someone: a person at a terminal, an ACP client, an MCP
/// client, a policy file with a queue for what it leaves open. Installed
/// by the door ([`Subagents::set_approver`](crate::Subagents::set_approver)).
///
/// `cancel` trips when the request is no longer wanted (the run was
/// cancelled or disposed, or the timeout passed): an approver withdraws
/// its question then, and its answer is not used. The future may resolve
/// to a reject of its own (nobody to ask here).
pub trait Approver: Send + Sync + fmt::Debug {
    /// Asks about `request`; resolves to the answer.
    fn ask(&self, request: PermissionRequest, cancel: CancellationToken) -> BoxFuture<'static, Answer>;
}

/// A run's route to the nearest approver, and its path from the root.
/// Cloned into each run's context.
#[derive(Clone, Default)]
pub struct Approvals {
    approver: Option<Arc<dyn Approver>>,
    path: Arc<[Hop]>,
}

impl fmt::Debug for Approvals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Approvals").field("approver", &self.approver).field("path", &self.path).finish()
    }
}

impl Approvals {
    /// A route to `approver`, at the root.
    pub fn new(approver: Arc<dyn Approver>) -> Self {
        Approvals { approver: Some(approver), path: Arc::from([]) }
    }

    /// No one to ask: every request that reaches it is rejected.
    pub fn nobody() -> Self {
        Approvals::default()
    }

    /// Whether a request would reach an approver.
    pub fn has_approver(&self) -> bool {
        self.approver.is_some()
    }

    /// The runs from the root to this one (the runtime keeps it only on a
    /// route that reaches an approver: no one else sees it).
    pub fn path(&self) -> &[Hop] {
        &self.path
    }

    /// The same approver, one run further down.
    pub fn under(&self, hop: Hop) -> Self {
        let path: Vec<Hop> = self.path.iter().cloned().chain([hop]).collect();
        Approvals { approver: self.approver.clone(), path: Arc::from(path) }
    }

    /// Asks the approver about `request` (its `asker` set to this route's
    /// path), within `timeout`, unless `cancel` trips first. Every way of
    /// not being answered is a reject, saying why.
    pub async fn ask(&self, mut request: PermissionRequest, timeout: Duration, cancel: &CancellationToken) -> Answer {
        request.asker = self.path.to_vec();
        let Some(approver) = &self.approver else {
            return Answer::reject("no one to ask");
        };
        // A cancelled run's requests never reach a person.
        if cancel.is_cancelled() {
            return Answer::reject("the run was cancelled");
        }
        let withdrawn = cancel.child_token();
        let asked = approver.ask(request, withdrawn.clone());
        let _withdraw = withdrawn.clone().drop_guard();
        tokio::select! {
            biased;
            _ = cancel.cancelled() => Answer::reject("the run was cancelled"),
            answered = tokio::time::timeout(timeout, asked) => match answered {
                Ok(answer) => answer,
                Err(_) => Answer::reject(format!("no answer within {}", human(timeout))),
            },
        }
    }
}

impl Approvals {
    /// Asks about a request that crossed a wire from a runtime below this
    /// run (a `process` child's, a remote worker's): its `asker`, the path
    /// within that runtime (depths counted from the root, as the wire's
    /// side makes them), is put under this route's path, so the person
    /// sees the whole path from the root. Otherwise as [`Approvals::ask`].
    pub async fn ask_from_below(
        &self,
        request: PermissionRequest,
        timeout: Duration,
        cancel: &CancellationToken,
    ) -> Answer {
        let path: Vec<Hop> = self.path.iter().chain(&request.asker).cloned().collect();
        let route = Approvals { approver: self.approver.clone(), path: Arc::from(path) };
        route.ask(request, timeout, cancel).await
    }
}

/// `600 s`, `2 min`: how the timeout is said in a reject's reason.
fn human(duration: Duration) -> String {
    let seconds = duration.as_secs_f64();
    if seconds >= 120.0 && duration.as_secs().is_multiple_of(60) {
        format!("{} min", duration.as_secs() / 60)
    } else if seconds >= 1.0 {
        format!("{} s", seconds.round())
    } else {
        format!("{} ms", duration.as_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offered(kinds: &[OptionKind]) -> PermissionRequest {
        let options = kinds.iter().enumerate().map(|(i, kind)| PermissionOption::new(format!("o{i}"), "x", *kind));
        PermissionRequest::new(options.collect())
    }

    #[test]
    fn a_verdict_picks_only_an_option_of_its_kind_the_child_offered() {
        let both = offered(&[OptionKind::RejectOnce, OptionKind::AllowOnce]);
        assert_eq!(both.option_for(Verdict::AllowOnce).unwrap().id, "o1");
        assert_eq!(both.option_for(Verdict::AllowAlways).unwrap().id, "o1", "always falls back to once");
        assert_eq!(both.option_for(Verdict::Reject).unwrap().id, "o0");
        let always_only = offered(&[OptionKind::AllowAlways]);
        assert!(always_only.option_for(Verdict::AllowOnce).is_none(), "once never widens to always");
        assert!(always_only.option_for(Verdict::Reject).is_none());
    }

    #[test]
    fn what_a_child_sends_is_kept_whole_to_a_bound_and_shown_cut_on_one_line() {
        let request = PermissionRequest::new(Vec::new())
            .with_title("rm -rf /\n\u{1b}[31mred")
            .with_input(&"x".repeat(10_000).into());
        assert_eq!(request.input.as_ref().unwrap().len(), 10_002, "kept whole, for the rules");
        assert!(request.cut.is_empty());
        let line = request.call_line();
        assert!(!line.contains('\n') && !line.contains('\u{1b}'), "{line:?}");
        assert!(line.len() < 2 * MAX_SHOWN_INPUT, "shown cut: {}", line.len());
        let huge = PermissionRequest::new(Vec::new()).with_input(&"x".repeat(MAX_JUDGED_INPUT * 2).into());
        assert!(huge.input.as_ref().unwrap().len() <= MAX_JUDGED_INPUT + '…'.len_utf8());
        assert_eq!(huge.cut, [RequestField::Input]);
        assert!(!huge.judged_whole(), "the input is what the call does: cut, it is not judged whole");
    }

    #[test]
    fn always_covers_the_tool_named_else_only_the_same_call_and_says_so() {
        let run = |title: &str| PermissionRequest::new(Vec::new()).with_kind("execute").with_title(title);
        assert_ne!(run("cargo test").grant_key(), run("rm -rf ~/").grant_key(), "never the kind alone");
        assert_eq!(run("cargo test").grant_key(), run("cargo test").grant_key());
        assert!(run("cargo test").always_covers().contains("only this same call again"));
        let read = || PermissionRequest::new(Vec::new()).with_tool("read_file").with_kind("read");
        let tool = read().with_title("read a");
        assert_eq!(tool.grant_key(), read().with_title("read b").grant_key());
        assert!(tool.always_covers().contains("every call of the tool read_file"), "{}", tool.always_covers());
        let shell = |title: &str| run(title).with_tool("Bash");
        assert_ne!(
            shell("cargo test").grant_key(),
            shell("rm -rf ~/").grant_key(),
            "a shell tool is never the tool alone"
        );
        assert_eq!(shell("cargo test").grant_key(), shell("cargo test").grant_key());
        assert!(shell("cargo test").always_covers().contains("this same command"), "{}", shell("x").always_covers());
        // A kind left out, `other`, or one we do not know is no promise.
        for kind in [None, Some("other"), Some("shell")] {
            let call = |title: &str| {
                let call = PermissionRequest::new(Vec::new()).with_tool("Bash").with_title(title);
                match kind {
                    Some(kind) => call.with_kind(kind),
                    None => call,
                }
            };
            assert_ne!(call("cargo test").grant_key(), call("rm -rf ~/").grant_key(), "kind {kind:?}");
        }
        let long = run(&"x".repeat(MAX_JUDGED + 1));
        assert_eq!(long.grant_key(), None, "a cut request is never remembered");
        assert!(long.option_said(OptionKind::AllowAlways).contains("once"));
    }

    #[test]
    fn the_timeout_is_said_in_words() {
        assert_eq!(human(Duration::from_secs(600)), "10 min");
        assert_eq!(human(Duration::from_secs(5)), "5 s");
        assert_eq!(human(Duration::from_millis(200)), "200 ms");
    }
}
