//! Pipelines run whole on a mock provider that echoes its prompt: a step
//! named through the table of steps, a map over a wide structured list,
//! and templates that would never end, beside runs that must not wait for
//! them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::batch::{Batch, Report, Settled, Summary};
use crate::providers::MockProvider;
use crate::{CancellationToken, Runtime};

/// Whether to cancel the batch, given a settled run's id and how many
/// have settled.
type CancelAfter = Box<dyn Fn(&str, usize) -> bool + Send + Sync>;

/// What a batch told its report: each settled run's id and when, from the
/// start; it cancels the batch when `cancel_after` says so.
struct Watch {
    started: Instant,
    settled: Mutex<Vec<(String, Duration)>>,
    cancel_after: CancelAfter,
    cancel: CancellationToken,
}

impl Report for &'static Watch {
    fn settled(&self, settled: &Settled<'_>) {
        let id = settled.record["id"].as_str().unwrap_or_default().to_owned();
        let mut seen = self.settled.lock().unwrap();
        seen.push((id.clone(), self.started.elapsed()));
        if (self.cancel_after)(&id, seen.len()) {
            self.cancel.cancel();
        }
    }
}

/// What a batch of `lines` did, run on a thread of its own: its summary,
/// its result lines by id, what its report saw, and how long `run` took;
/// `None` when it had not ended within `limit`.
struct Ran {
    summary: Summary,
    results: HashMap<String, Value>,
    watch: &'static Watch,
    took: Duration,
}

fn run_within(
    limit: Duration,
    lines: Vec<Value>,
    structured: Option<Value>,
    concurrency: usize,
    cancel_after: impl Fn(&str, usize) -> bool + Send + Sync + 'static,
) -> Option<Ran> {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let dir = tempfile::tempdir().unwrap();
        let runtime = Runtime::builder().workers(2).home(dir.path().join("home")).build().unwrap();
        let mut mock = MockProvider::new("mock").with_echo_prompt();
        if let Some(structured) = structured {
            mock = mock.with_structured(structured);
        }
        runtime.subagents().register_provider(mock).unwrap().keep();
        let tasks = dir.path().join("tasks.jsonl");
        std::fs::write(&tasks, lines.iter().map(|line| format!("{line}\n")).collect::<String>()).unwrap();
        let out = dir.path().join("out.jsonl");
        let cancel = CancellationToken::new();
        let watch: &'static Watch = Box::leak(Box::new(Watch {
            started: Instant::now(),
            settled: Mutex::default(),
            cancel_after: Box::new(cancel_after),
            cancel: cancel.clone(),
        }));
        let opened = Batch::new(&runtime.subagents(), "mock").concurrency(concurrency).out(&out).open(&tasks, cancel);
        let summary = runtime.block_on(opened.unwrap().run(watch));
        let took = watch.started.elapsed();
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        let results = text
            .lines()
            .map(|line| serde_json::from_str::<Value>(line).unwrap())
            .map(|record| (record["id"].as_str().unwrap().to_owned(), record))
            .collect();
        drop(sender.send(Ran { summary, results, watch, took }));
    });
    receiver.recv_timeout(limit).ok()
}

const NEVER: fn(&str, usize) -> bool = |_, _| false;

#[test]
fn a_step_named_through_the_table_of_steps_renders_its_result() {
    let lines = vec![
        json!({"id": "fix-login", "prompt": "log in"}),
        json!({"id": "item", "prompt": "an item"}),
        json!({"id": "report", "after": [], "prompt": "A {{steps[\"fix-login\"].output}} B {{steps.item.output}}"}),
    ];
    let ran = run_within(Duration::from_secs(60), lines, None, 4, NEVER).expect("the batch ends");
    assert!(ran.summary.all_completed(), "{:?}", ran.results);
    let output = |id: &str| ran.results[id]["output"].as_str().unwrap().to_owned();
    let report = output("report");
    assert!(report.ends_with(&format!("A {} B {}", output("fix-login"), output("item"))), "{report}");
}

#[test]
fn a_map_over_twenty_thousand_structured_elements_expands_in_linear_time() {
    let elements = 20_000;
    let failing: Vec<Value> = (0..elements)
        .map(|n| json!({"name": format!("test_{n}"), "module": format!("module_{}", n % 97), "detail": "x".repeat(40)}))
        .collect();
    let schema = json!({"type": "object", "properties": {"failing": {"type": "array"}}});
    let lines = vec![
        json!({"id": "triage", "prompt": "list", "output_schema": schema}),
        json!({"id": "fix", "for_each": "{{triage.structured.failing}}", "max_items": elements, "prompt": "fix {{item.name}} in {{item.module}}"}),
    ];
    // The triage, then the first element: the map was expanded whole.
    let ran = run_within(Duration::from_secs(60), lines, Some(json!({"failing": failing})), 8, |_, seen| seen == 2);
    let ran = ran.expect("a map of 20,000 expands in well under a minute (it took minutes when quadratic)");
    let (first, _) = &ran.watch.settled.lock().unwrap()[1];
    assert!(
        first.starts_with("fix[") && ran.results[first]["output"].as_str().unwrap().contains("fix test_"),
        "{first}"
    );
    assert!(ran.took < Duration::from_secs(30), "expanding took {:?}", ran.took);
}

#[test]
fn a_template_that_would_never_end_fails_its_step_and_the_other_steps_settle() {
    let endless = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    let lines = vec![
        json!({"id": "endless", "after": [], "prompt": endless}),
        json!({"id": "other", "prompt": "plain"}),
        json!({"id": "after_other", "after": ["other"], "prompt": "then {{other.completed}}"}),
    ];
    let ran = run_within(Duration::from_secs(60), lines, None, 4, NEVER).expect("the batch ends");
    let error = ran.results["endless"]["error"].as_str().unwrap();
    assert!(error.contains("steps a template may take"), "{error}");
    assert_eq!(ran.results["other"]["stop_reason"], "completed");
    assert!(ran.results["after_other"]["output"].as_str().unwrap().ends_with("then true"));
}

#[test]
fn renders_never_hold_up_the_runs_and_a_cancel_stops_them_at_once() {
    // A thousand renders of a few milliseconds each (well within the bound):
    // seconds of rendering in all.
    let busy = "{% for i in range(100) %}{% for j in range(300) %}{% endfor %}{% endfor %}{{item}}";
    let lines = vec![
        json!({"id": "map", "for_each": "range(1000)", "prompt": busy}),
        json!({"id": "quick", "prompt": "at once"}),
    ];
    let ran = run_within(Duration::from_secs(120), lines, None, 4, |id, _| id == "quick").expect("the batch ends");
    let settled = ran.watch.settled.lock().unwrap().clone();
    let quick = settled.iter().find(|(id, _)| id == "quick").map(|(_, at)| *at).expect("quick settled");
    assert!(quick < Duration::from_secs(5), "quick waited {quick:?} for the map's renders");
    assert!(ran.summary.was_interrupted());
    assert!(ran.took < quick + Duration::from_secs(5), "the cancel at {quick:?} ended the batch at {:?}", ran.took);
}
