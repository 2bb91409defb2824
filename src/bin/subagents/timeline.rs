//! Every run's lifecycle as the events report it: the tree `run` prints,
//! and meanwhile the [live](crate::live) one on stderr.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use subagents::events::EventRecvError;
use subagents::{Runtime, RuntimeTask, StopReason, SubagentEvent};
use tokio::sync::Notify;

use crate::live::Live;
use crate::terminal;

#[derive(Clone, Debug)]
pub struct Span {
    pub id: String,
    pub provider: String,
    pub parent_session: Option<String>,
    pub label: Option<String>,
    pub started: Duration,
    pub ended: Option<(Duration, StopReason)>,
    /// Why it failed, in words: the reason and the child's own account.
    pub failure: Option<String>,
}

/// Records Start and End of every run from now on: a task on one of the
/// runtime's workers drains a subscription as events arrive (so a chatty
/// child never lags the bounded channel), and [`Timeline::finish`] stops it
/// once it has taken what is queued. Events are queued when they are
/// emitted, so once every run has been disposed, finishing sees all of
/// them. (`fanout --trace` writes the runtime's spans instead.)
pub struct Timeline {
    finish: Arc<Notify>,
    drained: RuntimeTask<Vec<Span>>,
    live: Live,
}

impl Timeline {
    /// Records the runs under session `root`, drawn live under `title`.
    pub fn record(runtime: &Runtime, root: &str, title: &str) -> Timeline {
        let origin = Instant::now();
        let finish = Arc::new(Notify::new());
        let mut stream = runtime.subagents().subscribe();
        let finishing = finish.clone();
        let live = Live::on_stderr(root, title);
        let drawn = live.clone();
        let drained = runtime.spawn(async move {
            let (mut spans, live) = (BTreeMap::new(), drawn);
            let mut clock = tokio::time::interval(crate::live::TICK_EVERY);
            loop {
                tokio::select! {
                    event = stream.recv() => match event {
                        Ok(event) => {
                            live.note(&event);
                            note(&mut spans, origin, &event);
                        }
                        Err(EventRecvError::Lagged(missed)) => {
                            live.above(&format!("subagents: the run tree missed {missed} events"));
                        }
                        Err(EventRecvError::Closed) => break,
                    },
                    _ = clock.tick() => live.tick(),
                    _ = finishing.notified() => break,
                }
            }
            while let Some(Ok(event)) = stream.try_recv() {
                live.note(&event);
                note(&mut spans, origin, &event);
            }
            live.finish();
            spans.into_values().collect()
        });
        Timeline { finish, drained, live }
    }

    /// The live view, to say something above it.
    pub fn live(&self) -> Live {
        self.live.clone()
    }

    /// Every span recorded, once the queued events are drained. Call after
    /// the runs were disposed, from outside the runtime.
    pub fn finish(self, runtime: &Runtime) -> Vec<Span> {
        self.finish.notify_one();
        let drained = self.drained;
        runtime.block_on(drained).unwrap_or_default()
    }
}

fn note(spans: &mut BTreeMap<u64, Span>, origin: Instant, event: &SubagentEvent) {
    let now = origin.elapsed();
    match event {
        SubagentEvent::Start(info) => {
            let span = Span {
                id: info.child_id.clone(),
                provider: info.provider.clone(),
                parent_session: info.parent_session.clone(),
                label: info.label.clone(),
                started: now,
                ended: None,
                failure: None,
            };
            spans.insert(info.run_id, span);
        }
        SubagentEvent::End(end) => {
            if let Some(span) = spans.get_mut(&end.run_id) {
                span.ended = Some((now, end.stop_reason));
                span.failure = end.diagnostic.as_ref().map(|d| match d.explanation() {
                    Some(explanation) => format!("{}: {explanation}", d.category_name()),
                    None => d.category_name(),
                });
            }
        }
        _ => {}
    }
}

/// The runs below `root` as an indented tree, ready for a terminal.
pub fn tree(spans: &[Span], root: &str) -> String {
    let mut out = String::new();
    write_children(spans, Some(root), "", &mut out);
    if out.is_empty() {
        out.push_str("(no runs delegated)\n");
    }
    out
}

fn write_children(spans: &[Span], parent: Option<&str>, indent: &str, out: &mut String) {
    let children: Vec<&Span> = spans.iter().filter(|s| s.parent_session.as_deref() == parent).collect();
    for (n, span) in children.iter().enumerate() {
        let last = n + 1 == children.len();
        let (branch, next) = if last { ("└─ ", "   ") } else { ("├─ ", "│  ") };
        let outcome = match span.ended {
            Some((ended, reason)) => match &span.failure {
                // The child's account: its own words, made safe again here.
                Some(failure) => {
                    format!("{reason} ({}), {}", terminal::line(failure), terminal::human(ended - span.started))
                }
                None => format!("{reason}, {}", terminal::human(ended - span.started)),
            },
            None => "still running".to_owned(),
        };
        // The label is often the model's own description of the task.
        let label = span.label.as_deref().map(|l| format!(" \"{}\"", terminal::line(l))).unwrap_or_default();
        let (provider, id) = (terminal::line(&span.provider), terminal::line(&span.id));
        out.push_str(&format!("{indent}{branch}{provider} {id}{label}: {outcome}\n"));
        write_children(spans, Some(&span.id), &format!("{indent}{next}"), out);
    }
}
