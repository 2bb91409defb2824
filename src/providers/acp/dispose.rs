//! When an ACP agent's dispose stops waiting for it to exit on its own: the
//! graces of its ladder, what the connection saw the agent do, and the EOF
//! phase that follows from both.
//!
//! The ladder ([`crate::providers::child_process`]) closes stdin, waits
//! for the EOF phase to end, SIGTERMs the process group, waits
//! `dispose_grace`, and SIGKILLs it. Real agents (codex-acp,
//! claude-agent-acp) never exit when their stdin closes, so a fixed EOF
//! phase made every per-run dispose cost the whole `dispose_eof_grace`
//! (6 s), however long ago the run finished. The EOF phase therefore ends
//! at the first of:
//!
//! - `dispose_eof_grace` after EOF, always;
//! - `dispose_idle_eof_grace` after the later of EOF and the last line the
//!   agent wrote, **when the agent was idle at EOF**: every `session/prompt`
//!   sent to the process had been answered by the agent.
//!
//! So a finished run of an agent that ignores EOF is SIGTERMed half a
//! second after EOF instead of six (its dispose: 506–507 ms, against
//! 6.00 s with the EOF phase fixed, in `benches/acp_dispose.rs`). A prompt still unanswered at EOF (a
//! dispose right after a cancel the agent has not yet answered, a pooled
//! process retired because it did not answer) keeps the full grace: the
//! agent may be finishing a tool call and is owed its time to exit on its
//! own. An idle agent that goes on writing (late notifications) pushes its
//! deadline on with every line, up to the full grace: it is not signalled
//! mid-sentence. After EOF the agent's output is still read and dropped
//! (see the transport in `acp.rs`), so a writing agent is neither blocked
//! on a full pipe nor cut off by a closed one, and its lines stay visible
//! here.
//!
//! Whether a prompt is outstanding is taken once, at EOF: the connection is
//! closed then, so a later answer is never parsed. A prompt whose
//! connection closed before the agent answered it stays outstanding.
//!
//! Both reuse modes dispose through this: a per-run process at its run's
//! dispose, a pooled one when it is retired or the pool drains (an idle
//! pooled process has no prompt outstanding, so a drain takes the short
//! grace too).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::AcpConfig;

/// The ladder's graces, as configured (see [`AcpConfig`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Graces {
    /// The longest the EOF phase lasts.
    pub eof: Duration,
    /// How long the EOF phase lasts past EOF and the last line, for an
    /// agent idle at EOF.
    pub idle_eof: Duration,
    /// How long the agent has after SIGTERM.
    pub term: Duration,
}

impl Graces {
    pub(super) fn of(config: &AcpConfig) -> Graces {
        Graces { eof: config.dispose_eof_grace, idle_eof: config.dispose_idle_eof_grace, term: config.dispose_grace }
    }
}

/// What the connection saw of one agent process: prompts it has not
/// answered, and when it last wrote a line.
#[derive(Debug)]
pub(super) struct Activity {
    /// `session/prompt` requests sent and not yet answered by the agent.
    prompts: AtomicUsize,
    /// When the agent last wrote a line (its spawn, before the first).
    last_line: Mutex<Instant>,
}

impl Default for Activity {
    fn default() -> Self {
        Activity { prompts: AtomicUsize::new(0), last_line: Mutex::new(Instant::now()) }
    }
}

impl Activity {
    /// The agent wrote a line.
    pub(super) fn heard(&self) {
        *self.lock() = Instant::now();
    }

    /// A `session/prompt` went out.
    pub(super) fn prompt_sent(&self) {
        self.prompts.fetch_add(1, Ordering::AcqRel);
    }

    /// The agent answered a prompt (a stop reason or an error of its own;
    /// a connection that closed first is no answer).
    pub(super) fn prompt_answered(&self) {
        let _ = self.prompts.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    fn last_line(&self) -> Instant {
        *self.lock()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Instant> {
        self.last_line.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The EOF phase of a ladder whose EOF is now (see the module doc):
    /// resolves once the agent may be signalled.
    pub(super) fn eof_phase(self: &Arc<Self>, graces: Graces) -> impl std::future::Future<Output = ()> + 'static {
        let eof = Instant::now();
        let bound = eof + graces.eof;
        let idle = self.prompts.load(Ordering::Acquire) == 0;
        let activity = self.clone();
        async move {
            if !idle {
                return tokio::time::sleep_until(bound).await;
            }
            loop {
                // A line heard meanwhile moves the end on; it never comes sooner.
                let until = (activity.last_line().max(eof) + graces.idle_eof).min(bound);
                if Instant::now() >= until {
                    return;
                }
                tokio::time::sleep_until(until).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graces(eof_ms: u64, idle_eof_ms: u64) -> Graces {
        Graces {
            eof: Duration::from_millis(eof_ms),
            idle_eof: Duration::from_millis(idle_eof_ms),
            term: Duration::ZERO,
        }
    }

    async fn timed(phase: impl std::future::Future<Output = ()>) -> Duration {
        let began = Instant::now();
        phase.await;
        began.elapsed()
    }

    #[tokio::test]
    async fn an_idle_agent_gets_the_idle_grace_and_a_busy_one_the_full_grace() {
        let activity = Arc::new(Activity::default());
        let idle = timed(activity.eof_phase(graces(2_000, 50))).await;
        assert!(idle >= Duration::from_millis(50) && idle < Duration::from_millis(1_000), "{idle:?}");

        activity.prompt_sent();
        let busy = timed(activity.eof_phase(graces(400, 50))).await;
        assert!(busy >= Duration::from_millis(400), "a prompt in flight keeps the full grace: {busy:?}");

        activity.prompt_answered();
        let answered = timed(activity.eof_phase(graces(2_000, 50))).await;
        assert!(answered < Duration::from_millis(1_000), "answered, so idle again: {answered:?}");
    }

    #[tokio::test]
    async fn lines_heard_after_eof_push_the_idle_end_on_but_never_past_the_full_grace() {
        let activity = Arc::new(Activity::default());
        let talking = activity.clone();
        let chatter = tokio::spawn(async move {
            for _ in 0..10 {
                tokio::time::sleep(Duration::from_millis(40)).await;
                talking.heard();
            }
        });
        let phase = timed(activity.eof_phase(graces(5_000, 150))).await;
        chatter.await.unwrap();
        assert!(phase >= Duration::from_millis(400 + 150), "waited out the talk, then the idle grace: {phase:?}");

        let talking = activity.clone();
        let endless = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(20)).await;
                talking.heard();
            }
        });
        let capped = timed(activity.eof_phase(graces(300, 150))).await;
        endless.abort();
        assert!(capped >= Duration::from_millis(300) && capped < Duration::from_millis(1_500), "{capped:?}");
    }

    #[test]
    fn an_answer_without_a_prompt_never_underflows() {
        let activity = Activity::default();
        activity.prompt_answered();
        activity.prompt_sent();
        activity.prompt_answered();
        assert_eq!(activity.prompts.load(Ordering::Acquire), 0);
    }
}
