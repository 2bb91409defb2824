//! Every run's lifecycle as the events report it: for the `run` tree and the
//! `fanout` trace.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use subagents::{EventRecvError, StopReason, SubagentEvent, Subagents};

use crate::terminal;

#[derive(Clone, Debug)]
pub struct Span {
    pub id: String,
    pub provider: String,
    pub parent_session: Option<String>,
    pub label: Option<String>,
    pub started: Duration,
    pub ended: Option<(Duration, StopReason)>,
}

/// Records Start and End of every run from now on.
///
/// A thread of its own drains a subscription as events arrive (so a long
/// batch never lags the bounded channel); [`Timeline::finish`] then takes
/// what is left. Events are queued when they are emitted, so once every run
/// has been disposed, finishing sees all of them.
pub struct Timeline {
    origin: Instant,
    spans: Arc<Mutex<BTreeMap<u64, Span>>>,
    finish: Arc<tokio::sync::Notify>,
    drainer: Option<std::thread::JoinHandle<()>>,
}

impl Timeline {
    pub fn record(subagents: &Subagents) -> Timeline {
        let origin = Instant::now();
        let spans: Arc<Mutex<BTreeMap<u64, Span>>> = Arc::default();
        let finish = Arc::new(tokio::sync::Notify::new());
        let mut stream = subagents.subscribe();
        let (sink, finishing) = (spans.clone(), finish.clone());
        let drainer = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
            runtime.block_on(async move {
                loop {
                    tokio::select! {
                        event = stream.recv() => match event {
                            Ok(event) => note(&sink, origin, &event),
                            Err(EventRecvError::Lagged(missed)) => eprintln!("subagents: the timeline missed {missed} events"),
                            Err(EventRecvError::Closed) => return,
                        },
                        _ = finishing.notified() => break,
                    }
                }
                while let Some(Ok(event)) = stream.try_recv() {
                    note(&sink, origin, &event);
                }
            });
        });
        Timeline { origin, spans, finish, drainer: Some(drainer) }
    }

    /// Every span recorded, once the queued events are drained. Call after
    /// the runs were disposed.
    pub fn finish(mut self) -> Vec<Span> {
        self.finish.notify_one();
        if let Some(drainer) = self.drainer.take() {
            let _ = drainer.join();
        }
        let spans = self.spans.lock().unwrap();
        spans.values().cloned().collect()
    }

    pub fn elapsed(&self) -> Duration {
        self.origin.elapsed()
    }
}

fn note(spans: &Mutex<BTreeMap<u64, Span>>, origin: Instant, event: &SubagentEvent) {
    let now = origin.elapsed();
    let mut spans = spans.lock().unwrap();
    match event {
        SubagentEvent::Start(info) => {
            let span = Span {
                id: info.child_id.clone(),
                provider: info.provider.clone(),
                parent_session: info.parent_session.clone(),
                label: info.label.clone(),
                started: now,
                ended: None,
            };
            spans.insert(info.run_id, span);
        }
        SubagentEvent::End(end) => {
            if let Some(span) = spans.get_mut(&end.run_id) {
                span.ended = Some((now, end.stop_reason));
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
            Some((ended, reason)) => format!("{reason}, {:.1} ms", (ended - span.started).as_secs_f64() * 1e3),
            None => "still running".to_owned(),
        };
        // The label is often the model's own description of the task.
        let label = span.label.as_deref().map(|l| format!(" \"{}\"", terminal::line(l))).unwrap_or_default();
        let (provider, id) = (terminal::line(&span.provider), terminal::line(&span.id));
        out.push_str(&format!("{indent}{branch}{provider} {id}{label}: {outcome}\n"));
        write_children(spans, Some(&span.id), &format!("{indent}{next}"), out);
    }
}

/// Writes a Chrome trace-event file (Perfetto and chrome://tracing open
/// it): one complete event per run, on lanes so overlapping runs do not
/// stack, with the run's provider, ids and stop reason as arguments. The
/// file was created before the batch, so a path that cannot be written was
/// refused before any run.
pub fn write_trace(spans: &[Span], end: Duration, file: File) -> std::io::Result<()> {
    let mut ordered: Vec<&Span> = spans.iter().collect();
    ordered.sort_by_key(|s| s.started);
    let mut lanes: Vec<Duration> = Vec::new();
    let mut events = Vec::with_capacity(ordered.len());
    for span in ordered {
        let (finished, reason) = span.ended.map_or((end, None), |(at, reason)| (at, Some(reason)));
        let lane = match lanes.iter().position(|free_at| *free_at <= span.started) {
            Some(lane) => lane,
            None => {
                lanes.push(Duration::ZERO);
                lanes.len() - 1
            }
        };
        lanes[lane] = finished;
        events.push(json!({
            "name": span.label.clone().unwrap_or_else(|| span.id.clone()),
            "cat": span.provider,
            "ph": "X",
            "ts": span.started.as_secs_f64() * 1e6,
            "dur": (finished - span.started).as_secs_f64() * 1e6,
            "pid": 1,
            "tid": lane + 1,
            "args": {
                "child_id": span.id,
                "provider": span.provider,
                "parent_session": span.parent_session,
                "stop_reason": reason.map_or("unfinished".to_owned(), |r| r.to_string()),
            }
        }));
    }
    let trace = json!({"traceEvents": events, "displayTimeUnit": "ms"});
    let mut file = BufWriter::new(file);
    serde_json::to_writer(&mut file, &trace)?;
    file.flush()
}
