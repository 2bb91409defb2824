//! How a run ends: the result, its stop reason and a safe diagnostic.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{ContentBlock, RunUsage};

/// Why a run stopped. Any reason but `Completed` means the output may be
/// partial.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum StopReason {
    /// The child finished its task.
    Completed,
    /// The run was cancelled.
    Aborted,
    /// The child, its model, a tool or its transport failed.
    Error,
    /// The child hit its token limit.
    MaxTokens,
    /// The child declined.
    Refusal,
}

impl StopReason {
    /// The serialised name (`max-tokens`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Completed => "completed",
            StopReason::Aborted => "aborted",
            StopReason::Error => "error",
            StopReason::MaxTokens => "max-tokens",
            StopReason::Refusal => "refusal",
        }
    }
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where in a run's life a failure happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Stage {
    /// Creating and publishing the child.
    Initialize,
    /// The child's work.
    SessionRun,
    /// Releasing the child.
    Dispose,
    /// Runtime or provider shutdown.
    Shutdown,
}

/// A fixed failure category: safe to log and show.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Category {
    /// The child reported a failure.
    ChildError,
    /// The child (or its process) died.
    ChildCrashed,
    /// Provider code panicked; the runtime contained it.
    Panicked,
    /// A bounded wait ran out.
    TimedOut,
    /// The child spoke the protocol wrongly.
    Protocol,
    /// The model call failed.
    Model,
    /// A tool failed.
    Tool,
    /// A structured result was required and never captured.
    MissingStructuredOutput,
    /// The child could not be created.
    StartupFailed,
    /// Every worker that took a remote run vanished (killed, frozen past its
    /// ack deadline) until the broker stopped redelivering it.
    WorkerLost,
    /// A remote run's caller lost its lease on the broker (it was out of
    /// touch for longer than the lease TTL), so the worker stopped the run.
    LeaseExpired,
    /// The broker of a remote run could not be reached (or refused to store
    /// it) for longer than the provider waits.
    BrokerUnreachable,
    /// No worker of a remote run's pool answered for longer than the
    /// provider waits.
    NoWorker,
    /// An attach ([`Detached::Attach`](crate::seam::Detached::Attach))
    /// named a run its provider does not know (never stored, or kept past
    /// its bound): start it again.
    RunUnknown,
}

impl Category {
    /// Whether a run failed this way was never served: its transport lost
    /// it before a child could carry it out (`worker-lost`,
    /// `lease-expired`, `broker-unreachable`, `no-worker`). `fanout` counts
    /// such a run as work not carried out (exit 1).
    pub fn is_unserved(self) -> bool {
        matches!(self, Category::WorkerLost | Category::LeaseExpired | Category::BrokerUnreachable | Category::NoWorker)
    }
}

/// Where and how a child's hook failed: the error of [`Child::dispose`]
/// (and of a process child's dispose ladder).
///
/// [`Child::dispose`]: crate::seam::Child::dispose
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
#[error("failed at stage {stage:?} ({category:?})")]
pub struct Failure {
    /// Where it failed.
    pub stage: Stage,
    /// What kind of failure.
    pub category: Category,
}

impl Failure {
    /// A failure at `stage` of kind `category`.
    pub fn new(stage: Stage, category: Category) -> Self {
        Failure { stage, category }
    }
}

/// Safe facts about a failure: provider name, stage, a fixed category,
/// where one is known a fixed-wording reason ("the model endpoint answered
/// 404"), and where the child said why, a `detail` in its own words (an
/// agent's error answer, its exit status and the tail of its stderr, an A2A
/// agent's status message, a panic's message).
///
/// `reason` is this crate's wording only. `detail` is someone else's text
/// made safe: one line through [`safe_line`](super::safe_line) (escapes,
/// control and bidi characters gone), at most
/// [`Diagnostic::MAX_DETAIL_BYTES`], and the providers that spawn a child
/// replace the values of the environment they set for it before it gets
/// here. A deserialised one is made safe again. The whole is at most
/// [`Diagnostic::MAX_BYTES`] when serialised.
///
/// ```
/// use subagents::seam::{Category, Diagnostic, Stage};
///
/// let diagnostic = Diagnostic::new("spawn", Stage::SessionRun, Category::Model)
///     .with_reason("the model endpoint answered 404");
/// assert_eq!(diagnostic.to_string(), "provider \"spawn\", stage session-run, category model: the model endpoint answered 404");
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Diagnostic {
    /// The provider that ran the child.
    pub provider: String,
    /// Where it failed.
    pub stage: Stage,
    /// What kind of failure.
    pub category: Category,
    /// A fixed-wording reason built by this crate (never a payload).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What the child said of the failure, made safe and bounded (see
    /// [`Diagnostic`]); set through [`Diagnostic::with_detail`].
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "safe_detail")]
    pub detail: Option<String>,
}

/// A deserialised `detail`, made safe as [`Diagnostic::with_detail`] makes it.
fn safe_detail<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<String>, D::Error> {
    let detail = Option::<String>::deserialize(deserializer)?;
    Ok(detail.and_then(|detail| Diagnostic::safe_detail(&detail)))
}

impl Diagnostic {
    /// Upper bound on a diagnostic's serialised size.
    pub const MAX_BYTES: usize = 4096;
    const MAX_PROVIDER_BYTES: usize = 256;
    const MAX_REASON_BYTES: usize = 256;
    /// Upper bound on a `detail` (a few lines of a child's stderr).
    pub const MAX_DETAIL_BYTES: usize = 600;

    /// A diagnostic; a provider name longer than 256 bytes is cut at a
    /// character boundary so the whole stays far below the cap.
    pub fn new(provider: &str, stage: Stage, category: Category) -> Self {
        let provider = cut(provider, Self::MAX_PROVIDER_BYTES).to_owned();
        Diagnostic { provider, stage, category, reason: None, detail: None }
    }

    /// The same diagnostic with a fixed-wording reason (cut at 256 bytes).
    /// Only text this crate composed belongs here: see [`Diagnostic`].
    pub fn with_reason(mut self, reason: impl Into<String>) -> Self {
        let reason = reason.into();
        self.reason = Some(cut(&reason, Self::MAX_REASON_BYTES).to_owned());
        self
    }

    /// The same diagnostic with the child's own account of the failure:
    /// made one safe line ([`safe_line`](super::safe_line)), blanks folded,
    /// cut at [`Diagnostic::MAX_DETAIL_BYTES`] with a trailing `…`. Blank
    /// text sets none. Text that may hold the values of a child's
    /// environment must have them replaced before it comes here.
    pub fn with_detail(mut self, detail: impl AsRef<str>) -> Self {
        self.detail = Self::safe_detail(detail.as_ref());
        self
    }

    fn safe_detail(detail: &str) -> Option<String> {
        let line = super::safe_line(detail);
        let mut folded = String::with_capacity(line.len().min(Self::MAX_DETAIL_BYTES + 4));
        for word in line.split_whitespace() {
            if folded.len() + word.len() + 1 > Self::MAX_DETAIL_BYTES {
                let room = Self::MAX_DETAIL_BYTES.saturating_sub(folded.len() + 1);
                if !folded.is_empty() && room > 0 {
                    folded.push(' ');
                }
                folded.push_str(cut(word, room));
                folded.push('…');
                break;
            }
            if !folded.is_empty() {
                folded.push(' ');
            }
            folded.push_str(word);
        }
        (!folded.is_empty()).then_some(folded)
    }

    /// What a person reads of the failure beyond its category: the
    /// reason, the detail, both (`reason: detail`), or `None`.
    pub fn explanation(&self) -> Option<String> {
        match (&self.reason, &self.detail) {
            (Some(reason), Some(detail)) => Some(format!("{reason}: {detail}")),
            (Some(said), None) | (None, Some(said)) => Some(said.clone()),
            (None, None) => None,
        }
    }

    /// The stage's serialised name (`session-run`, …).
    pub fn stage_name(&self) -> String {
        serde_json::to_value(self.stage).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
    }

    /// The category's serialised name (`model`, …).
    pub fn category_name(&self) -> String {
        serde_json::to_value(self.category).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
    }
}

/// `text` cut at a character boundary to at most `max` bytes.
pub(crate) fn cut(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "provider {:?}, stage {}, category {}", self.provider, self.stage_name(), self.category_name())?;
        match self.explanation() {
            Some(explanation) => write!(f, ": {explanation}"),
            None => Ok(()),
        }
    }
}

/// The terminal outcome of a run. A provider's [`Child::run`] builds one
/// with [`RunResult::completed`], [`RunResult::empty`] or
/// [`RunResult::failed`]:
///
/// ```
/// use subagents::seam::{Category, Diagnostic, RunResult, Stage, StopReason};
///
/// assert_eq!(RunResult::completed("done").text(), "done");
/// assert_eq!(RunResult::empty(StopReason::Aborted).stop_reason, StopReason::Aborted);
/// let failed = RunResult::failed(Diagnostic::new("echo", Stage::SessionRun, Category::ChildError));
/// assert_eq!(failed.stop_reason, StopReason::Error);
/// ```
///
/// [`Child::run`]: crate::seam::Child::run
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// The child's last non-empty assistant message, else its accumulated
    /// streamed text, else empty.
    pub output: Vec<ContentBlock>,
    /// The captured structured value, when one was requested and captured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured: Option<serde_json::Value>,
    /// Why the run stopped.
    pub stop_reason: StopReason,
    /// Safe facts about a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnostic: Option<Diagnostic>,
    /// The child's own session id, where the provider knows one the run id
    /// does not already say (`remote`: the session on the worker that ran
    /// it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_session: Option<String>,
    /// What the run's own model calls spent (not its descendants': see
    /// [`Receipt::usage_in_tree`](super::Receipt::usage_in_tree)); empty
    /// for a provider whose child reports none.
    #[serde(default, skip_serializing_if = "RunUsage::is_empty")]
    pub usage: RunUsage,
    /// The tool calls the child reported failed (an out-of-process agent's
    /// own tools: a run may complete with some of them failed); 0 where
    /// the provider cannot tell.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tool_calls_failed: u32,
    /// The branch the run worked on and what it left there, for a provider
    /// that gives each run a git worktree (`workspace = "worktree"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceReport>,
}

/// What a run left in its git worktree, committed on its own branch
/// (see [`crate::workspace`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceReport {
    /// The run's branch (`subagents/<batch>/<task id>`); it stays after the
    /// run, whatever its outcome.
    pub branch: String,
    /// The commit the branch started from.
    pub base: String,
    /// The branch's tip once the run's work was committed; `None` when the
    /// run left nothing (the branch is still at `base`).
    pub commit: Option<String>,
    /// Files that differ between `base` and `commit`.
    pub files_changed: u64,
    /// Lines added between `base` and `commit`.
    pub insertions: u64,
    /// Lines removed between `base` and `commit`.
    pub deletions: u64,
    /// Where the worktree is, when it is kept after the run (asked for, or
    /// its work could not be committed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worktree: Option<std::path::PathBuf>,
    /// Why the work could not be committed, when it could not (the
    /// worktree is then kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

fn is_zero(count: &u32) -> bool {
    *count == 0
}

impl RunResult {
    /// A completed result with text output.
    pub fn completed(text: impl Into<String>) -> Self {
        RunResult {
            output: vec![ContentBlock::text(text)],
            structured: None,
            stop_reason: StopReason::Completed,
            diagnostic: None,
            child_session: None,
            usage: RunUsage::default(),
            tool_calls_failed: 0,
            workspace: None,
        }
    }

    /// A result with no output and the given reason.
    pub fn empty(stop_reason: StopReason) -> Self {
        RunResult {
            output: Vec::new(),
            structured: None,
            stop_reason,
            diagnostic: None,
            child_session: None,
            usage: RunUsage::default(),
            tool_calls_failed: 0,
            workspace: None,
        }
    }

    /// A failed result carrying a diagnostic.
    pub fn failed(diagnostic: Diagnostic) -> Self {
        RunResult { diagnostic: Some(diagnostic), ..RunResult::empty(StopReason::Error) }
    }

    /// The output's text.
    pub fn text(&self) -> String {
        super::text_of(&self.output)
    }
}
