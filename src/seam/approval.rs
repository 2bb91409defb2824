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

/// The most of a tool call's input (or title) a request carries; what a
/// child sends beyond it is cut, marked with `…`.
pub const MAX_SHOWN_INPUT: usize = 2048;

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
/// cut to [`MAX_SHOWN_INPUT`] here, escaped wherever it is shown
/// ([`safe_line`]).
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
}

impl PermissionRequest {
    /// A request offering `options`, about nothing yet.
    pub fn new(options: Vec<PermissionOption>) -> Self {
        PermissionRequest { options, ..PermissionRequest::default() }
    }

    /// The tool's name.
    pub fn with_tool(mut self, tool: impl Into<String>) -> Self {
        self.tool = Some(bounded(tool.into()));
        self
    }

    /// The kind of call.
    pub fn with_kind(mut self, kind: impl Into<String>) -> Self {
        self.kind = Some(bounded(kind.into()));
        self
    }

    /// The agent's title for the call.
    pub fn with_title(mut self, title: impl Into<String>) -> Self {
        self.title = Some(bounded(title.into()));
        self
    }

    /// The call's raw input (shown as compact JSON, bounded).
    pub fn with_input(mut self, input: &serde_json::Value) -> Self {
        self.input = Some(bounded(input.to_string()));
        self
    }

    /// A file the call touches.
    pub fn with_path(mut self, path: impl Into<String>) -> Self {
        self.paths.push(bounded(path.into()));
        self
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
    /// the kind) and the input.
    pub fn call_line(&self) -> String {
        let what = self.title.as_deref().or(self.tool.as_deref()).or(self.kind.as_deref()).unwrap_or("a tool call");
        let mut line = safe_line(what).into_owned();
        if let Some(kind) = self.kind.as_deref().filter(|_| self.title.is_some() || self.tool.is_some()) {
            line.push_str(&format!(" ({})", safe_line(kind)));
        }
        if let Some(input) = &self.input {
            line.push_str(&format!(" {}", safe_line(input)));
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

    /// What "allow always" is remembered by within a run: the tool's
    /// name, else the kind of call, else its title.
    pub fn grant_key(&self) -> Option<String> {
        let (tag, value) = match (&self.tool, &self.kind, &self.title) {
            (Some(tool), _, _) => ("tool", tool),
            (None, Some(kind), _) => ("kind", kind),
            (None, None, Some(title)) => ("title", title),
            (None, None, None) => return None,
        };
        Some(format!("{tag}:{value}"))
    }
}

/// `text` cut to [`MAX_SHOWN_INPUT`] bytes (on a character boundary),
/// marked when cut.
fn bounded(mut text: String) -> String {
    if text.len() > MAX_SHOWN_INPUT {
        let mut end = MAX_SHOWN_INPUT;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
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
    fn what_a_child_sends_is_cut_and_shown_on_one_line() {
        let request = PermissionRequest::new(Vec::new())
            .with_title("rm -rf /\n\u{1b}[31mred")
            .with_input(&"x".repeat(10_000).into());
        assert!(request.input.as_ref().unwrap().len() <= MAX_SHOWN_INPUT + '…'.len_utf8());
        let line = request.call_line();
        assert!(!line.contains('\n') && !line.contains('\u{1b}'), "{line:?}");
    }

    #[test]
    fn the_timeout_is_said_in_words() {
        assert_eq!(human(Duration::from_secs(600)), "10 min");
        assert_eq!(human(Duration::from_secs(5)), "5 s");
        assert_eq!(human(Duration::from_millis(200)), "200 ms");
    }
}
