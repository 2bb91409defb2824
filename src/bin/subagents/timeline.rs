//! Every run's lifecycle as the events report it: for the `run` tree and the
//! `fanout` trace.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use subagents::{ListenerHandle, StopReason, SubagentEvent, Subagents};

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
pub struct Timeline {
    origin: Instant,
    spans: Arc<Mutex<BTreeMap<u64, Span>>>,
    _listener: ListenerHandle,
}

impl Timeline {
    pub fn record(subagents: &Subagents) -> Timeline {
        let origin = Instant::now();
        let spans: Arc<Mutex<BTreeMap<u64, Span>>> = Arc::default();
        let sink = spans.clone();
        let listener = subagents.add_listener(move |event: &SubagentEvent| {
            let now = origin.elapsed();
            let mut spans = sink.lock().unwrap();
            match event {
                SubagentEvent::Start(info) => {
                    spans.insert(
                        info.run_id,
                        Span {
                            id: info.id.clone(),
                            provider: info.provider.clone(),
                            parent_session: info.parent_session.clone(),
                            label: info.label.clone(),
                            started: now,
                            ended: None,
                        },
                    );
                }
                SubagentEvent::End(end) => {
                    if let Some(span) = spans.get_mut(&end.run_id) {
                        span.ended = Some((now, end.stop_reason));
                    }
                }
                _ => {}
            }
        });
        Timeline { origin, spans, _listener: listener }
    }

    /// The spans so far, waiting (at most `within`) until every started run
    /// has ended: events arrive on their own thread.
    pub fn settled(&self, within: Duration) -> Vec<Span> {
        let deadline = Instant::now() + within;
        loop {
            let spans: Vec<Span> = self.spans.lock().unwrap().values().cloned().collect();
            if spans.iter().all(|s| s.ended.is_some()) || Instant::now() >= deadline {
                return spans;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// The runs below `root` as an indented tree.
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
        let label = span.label.as_deref().map(|l| format!(" \"{l}\"")).unwrap_or_default();
        out.push_str(&format!("{indent}{branch}{} {}{label}: {outcome}\n", span.provider, span.id));
        write_children(spans, Some(&span.id), &format!("{indent}{next}"), out);
    }
}

/// Writes a Chrome trace-event file (Perfetto and chrome://tracing open
/// it): one complete event per run, on lanes so overlapping runs do not
/// stack, with the run's provider, ids and stop reason as arguments.
pub fn write_trace(spans: &[Span], end: Duration, path: &Path) -> std::io::Result<()> {
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
                "run": span.id,
                "provider": span.provider,
                "parent_session": span.parent_session,
                "stop_reason": reason.map_or("unfinished".to_owned(), |r| r.to_string()),
            }
        }));
    }
    let trace = json!({"traceEvents": events, "displayTimeUnit": "ms"});
    let mut file = std::fs::File::create(path)?;
    file.write_all(serde_json::to_string(&trace)?.as_bytes())?;
    file.flush()
}
