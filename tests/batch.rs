//! `subagents::batch` from the public API alone, as an embedder uses it: a
//! file of tasks under a concurrency cap, a durable results file, an
//! interruption that settles nothing, and a resume that finishes the batch
//! with each task settled exactly once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use std::time::Duration;

use serde_json::Value;
use subagents::batch::{Batch, Quiet, Report, Settled};
use subagents::providers::MockProvider;
use subagents::{CancellationToken, Runtime};

/// Counts settled runs and cancels the batch after `stop_after` of them.
struct StopAfter {
    settled: AtomicUsize,
    stop_after: usize,
    cancel: CancellationToken,
}

impl Report for StopAfter {
    fn settled(&self, _: &Settled<'_>) {
        if self.settled.fetch_add(1, Ordering::SeqCst) + 1 == self.stop_after {
            self.cancel.cancel();
        }
    }
}

fn lines_by_id(out: &Path) -> HashMap<String, Vec<Value>> {
    let mut by_id: HashMap<String, Vec<Value>> = HashMap::new();
    for line in std::fs::read_to_string(out).unwrap().lines() {
        let record: Value = serde_json::from_str(line).expect("whole lines only");
        by_id.entry(record["id"].as_str().unwrap().to_owned()).or_default().push(record);
    }
    by_id
}

/// A runtime with a quick echoing `mock` provider, and `lines` as a tasks
/// file beside where its results go: (the directory, the runtime, the
/// tasks file, the out file).
fn batch_of(lines: &str) -> (tempfile::TempDir, Runtime, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::builder().workers(2).home(dir.path().join("home")).build().unwrap();
    let mock = MockProvider::new("mock").with_delay(Duration::from_millis(5)).with_echo_prompt();
    // Dropping the guard would unregister the provider: keep it registered.
    runtime.subagents().register_provider(mock).unwrap().keep();
    let tasks = dir.path().join("tasks.jsonl");
    std::fs::write(&tasks, lines).unwrap();
    let out = dir.path().join("out.jsonl");
    (dir, runtime, tasks, out)
}

#[test]
fn a_batch_runs_under_its_cap_is_interrupted_without_settling_and_resumes_to_each_task_once() {
    let lines: Vec<String> = (0..1000).map(|i| format!("{{\"id\": \"t{i}\", \"prompt\": \"task {i}\"}}")).collect();
    let (dir, runtime, tasks, out) = batch_of(&(lines.join("\n") + "\n"));
    let subagents = runtime.subagents();

    // Runs at once, as the runtime's events count them.
    let (_listener, peak) = crate::common::peak_running(&subagents);

    let cancel = CancellationToken::new();
    let opened = Batch::new(&subagents, "mock").concurrency(16).out(&out).open(&tasks, cancel.clone()).unwrap();
    let report = StopAfter { settled: AtomicUsize::new(0), stop_after: 300, cancel };
    let first = runtime.block_on(opened.run(report));
    assert!(first.was_interrupted() && first.lost().is_none() && first.resumable());
    assert!(first.runs() >= 300 && first.runs() < 1000, "{}", first.runs());
    assert!(peak() <= 16, "at most 16 runs at once, saw {}", peak());
    let written = lines_by_id(&out);
    let interrupted = written.values().flatten().filter(|line| line["interrupted"] == true).count();
    assert_eq!(interrupted, first.interrupted_runs());

    let opened = Batch::new(&subagents, "mock").concurrency(16).out(&out).resume(true);
    let second = runtime.block_on(opened.open(&tasks, CancellationToken::new()).unwrap().run(Quiet));
    assert!(!second.was_interrupted() && second.all_ran() && second.all_completed());
    assert_eq!(second.done_before() + second.runs(), 1000);
    let finished = lines_by_id(&out);
    assert_eq!(finished.len(), 1000, "every task has a line");
    for (id, lines) in &finished {
        let settled: Vec<&Value> = lines.iter().filter(|line| line["interrupted"] != true).collect();
        assert_eq!(settled.len(), 1, "{id} settled exactly once");
        let output = settled[0]["output"].as_str().unwrap();
        assert!(output.ends_with(&format!("task {}", &id[1..])), "{id}: {output}");
    }
    assert!(peak() <= 16);
    drop(runtime);
    // The batch wrote only what it was told to: its results file and home.
    let mut names: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names.retain(|name| name != "home");
    assert_eq!(names, ["out.jsonl", "tasks.jsonl"]);
}

#[test]
fn a_pipeline_maps_under_the_cap_resumes_after_an_interruption_and_its_reduce_sees_every_element() {
    let (dir, runtime, tasks, out) = batch_of(concat!(
        "{\"id\": \"each\", \"for_each\": \"range(200)\", \"prompt\": \"element {{item}}\"}\n",
        "{\"id\": \"all\", \"after\": [\"each\"], \"prompt\": \"{{each.outputs|length}} outputs, last {{each.outputs[199]}}\"}\n",
    ));
    let subagents = runtime.subagents();
    let (_listener, peak) = crate::common::peak_running(&subagents);

    let cancel = CancellationToken::new();
    let opened = Batch::new(&subagents, "mock").concurrency(8).out(&out).open(&tasks, cancel.clone()).unwrap();
    let first = runtime.block_on(opened.run(StopAfter { settled: AtomicUsize::new(0), stop_after: 50, cancel }));
    assert!(first.was_interrupted() && first.runs() < 201, "{}", first.runs());
    let waiting: Vec<(usize, String)> = first.waiting_steps().map(|(line, id, _)| (line, id.to_owned())).collect();
    assert_eq!(waiting, [(1, "each".to_owned()), (2, "all".to_owned())]);

    let opened = Batch::new(&subagents, "mock").concurrency(8).out(&out).resume(true);
    let second = runtime.block_on(opened.open(&tasks, CancellationToken::new()).unwrap().run(Quiet));
    assert!(second.all_ran() && second.all_completed() && second.waiting_steps().next().is_none());
    let finished = lines_by_id(&out);
    assert_eq!(finished.len(), 201, "200 elements and the reduce");
    for (id, lines) in &finished {
        assert_eq!(lines.iter().filter(|line| line["interrupted"] != true).count(), 1, "{id} settled once");
    }
    let reduce = finished["all"][0]["output"].as_str().unwrap();
    assert!(reduce.contains("200 outputs, last ") && reduce.ends_with("element 199"), "{reduce}");
    assert!(peak() <= 8, "at most 8 runs at once, saw {}", peak());

    // Resumed once more: nothing runs, and the map still tells how wide it is.
    #[derive(Clone, Default)]
    struct Widths(std::sync::Arc<std::sync::Mutex<Vec<(usize, usize)>>>, std::sync::Arc<AtomicUsize>);
    impl Report for Widths {
        fn expanded(&self, line: usize, runs: usize) {
            self.0.lock().unwrap().push((line, runs));
        }
        fn done_before(&self) {
            self.1.fetch_add(1, Ordering::SeqCst);
        }
    }
    let widths = Widths::default();
    let opened = Batch::new(&subagents, "mock").out(&out).resume(true).open(&tasks, CancellationToken::new()).unwrap();
    let third = runtime.block_on(opened.run(widths.clone()));
    assert_eq!((third.runs(), widths.1.load(Ordering::SeqCst)), (0, 201));
    assert_eq!(*widths.0.lock().unwrap(), [(1, 200)]);

    // A circle is a typed refusal an embedder can match, before any run.
    std::fs::write(&tasks, "{\"id\": \"a\", \"after\": [\"b\"], \"prompt\": \"a\"}\n{\"id\": \"b\", \"after\": [\"a\"], \"prompt\": \"b\"}\n")
        .unwrap();
    let refused =
        Batch::new(&subagents, "mock").out(dir.path().join("other.jsonl")).open(&tasks, CancellationToken::new());
    let error = refused.unwrap_err();
    assert!(
        matches!(&error, subagents::batch::BatchError::Pipeline { error: subagents::batch::PipelineError::Cycle { lines, .. }, .. } if lines.len() == 2),
        "{error}"
    );
}

#[test]
fn a_batch_runs_on_every_worker_under_one_cap_and_a_duplicate_id_is_refused_once() {
    // 400 tasks, one id twice (lines 2 and 301), so far apart that the two
    // lines are likely read by different workers' shares.
    let mut lines: Vec<String> = (0..400).map(|i| format!("{{\"id\": \"t{i}\", \"prompt\": \"task {i}\"}}")).collect();
    lines[300] = "{\"id\": \"t1\", \"prompt\": \"again\"}".to_owned();
    let (_dir, runtime, tasks, out) = batch_of(&(lines.join("\n") + "\n"));
    let subagents = runtime.subagents();
    let (_listener, peak) = crate::common::peak_running(&subagents);

    /// The threads runs settled on, and the lines skipped.
    #[derive(Default)]
    struct Threads(std::sync::Mutex<(std::collections::HashSet<std::thread::ThreadId>, Vec<usize>)>);
    impl Report for Threads {
        fn settled(&self, _: &Settled<'_>) {
            self.0.lock().unwrap().0.insert(std::thread::current().id());
        }
        fn skipped(&self, line: usize, _: &str) {
            self.0.lock().unwrap().1.push(line);
        }
    }
    let threads = std::sync::Arc::new(Threads::default());
    let opened =
        Batch::new(&subagents, "mock").concurrency(10).out(&out).open(&tasks, CancellationToken::new()).unwrap();
    let summary = runtime.block_on(opened.run(threads.clone()));
    assert_eq!((summary.runs(), summary.skipped()), (399, 1));
    assert!(summary.all_completed());
    let (seen, skipped) = &*threads.0.lock().unwrap();
    assert_eq!(seen.len(), 2, "runs settled on both workers");
    assert_eq!(skipped, &[301], "the second line with id t1");
    assert!(peak() <= 10, "at most 10 runs at once across the workers, saw {}", peak());
    assert_eq!(lines_by_id(&out).len(), 399);
}

#[test]
fn an_interrupted_batch_does_not_say_every_task_ran() {
    let lines: Vec<String> = (0..1000).map(|i| format!("{{\"id\": \"t{i}\", \"prompt\": \"task {i}\"}}")).collect();
    let (_dir, runtime, tasks, out) = batch_of(&(lines.join("\n") + "\n"));
    let subagents = runtime.subagents();

    let cancel = CancellationToken::new();
    let opened = Batch::new(&subagents, "mock").concurrency(4).out(&out).open(&tasks, cancel.clone()).unwrap();
    let stopped = runtime.block_on(opened.run(StopAfter { settled: AtomicUsize::new(0), stop_after: 20, cancel }));
    assert!(stopped.was_interrupted() && stopped.runs() < 1000, "{}", stopped.runs());
    assert!(!stopped.all_ran(), "{} of 1000 tasks ran, yet all_ran() said true", stopped.runs());

    // Interrupted before its first run: nothing ran.
    let cancel = CancellationToken::new();
    cancel.cancel();
    let opened = Batch::new(&subagents, "mock").out(&out).resume(true).open(&tasks, cancel).unwrap();
    let nothing = runtime.block_on(opened.run(Quiet));
    assert!(!nothing.all_ran(), "{} runs, yet all_ran() said true", nothing.runs());

    // The resume that finishes it says so.
    let opened = Batch::new(&subagents, "mock").out(&out).resume(true).open(&tasks, CancellationToken::new()).unwrap();
    let finished = runtime.block_on(opened.run(Quiet));
    assert!(finished.all_ran() && finished.done_before() + finished.runs() == 1000);
}

#[test]
fn a_batch_on_a_provider_the_runtime_lacks_is_refused_before_anything_runs() {
    let lines: Vec<String> = (0..1000).map(|i| format!("{{\"prompt\": \"task {i}\"}}")).collect();
    let (_dir, runtime, tasks, out) = batch_of(&(lines.join("\n") + "\n"));
    std::fs::write(&out, "kept\n").unwrap();
    let refused = Batch::new(&runtime.subagents(), "mokc").out(&out).open(&tasks, CancellationToken::new());
    let Err(error) = refused else { panic!("a batch on no provider is refused") };
    assert!(
        matches!(&error, subagents::batch::BatchError::UnknownBatchProvider { name, suggestion, available }
            if name == "mokc" && suggestion.as_deref() == Some("mock") && available == &["mock"]),
        "{error}"
    );
    assert!(error.to_string().contains("\"mokc\"") && error.to_string().contains("did you mean \"mock\"?"), "{error}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "kept\n", "nothing truncated");
}

/// The CPU time, in clock ticks, of this process's threads named `name`.
fn cpu_ticks_of_threads(name: &str) -> u64 {
    let mut ticks = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else { continue };
        let Some((head, rest)) = stat.rsplit_once(')') else { continue };
        if head.split_once('(').map(|(_, comm)| comm) != Some(name) {
            continue;
        }
        let fields: Vec<&str> = rest.split_whitespace().collect();
        ticks += fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    }
    ticks
}

#[test]
fn two_thousand_parked_requests_cost_one_look_a_tick_not_one_each_and_still_get_their_answers() {
    use subagents::batch::{answer, pending, ParkedApprover};
    use subagents::seam::{Approver, PermissionRequest, Policy, Rules, Verdict};
    let home = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("parked-probe")
        .enable_all()
        .build()
        .unwrap();
    let approver = ParkedApprover::new(Rules::new(Policy::Ask), home.path());
    let asked: Vec<_> =
        runtime.block_on(async {
            (0..2000)
                .map(|n| {
                    tokio::spawn(approver.ask(
                        PermissionRequest::new(Vec::new()).with_title(format!("call {n}")),
                        CancellationToken::new(),
                    ))
                })
                .collect()
        });
    while pending(home.path()).unwrap().len() < 2000 {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    let (ticks, started) = (cpu_ticks_of_threads("parked-probe"), std::time::Instant::now());
    std::thread::sleep(Duration::from_secs(3));
    let cpu = (cpu_ticks_of_threads("parked-probe") - ticks) as f64 / 100.0 / started.elapsed().as_secs_f64();
    assert!(cpu < 0.1, "2000 parked requests waiting used {cpu:.2} CPU-seconds a second");
    // Every one still gets its own answer.
    for parked in pending(home.path()).unwrap() {
        answer(home.path(), &parked.id, Verdict::Reject).unwrap();
    }
    let answers = runtime.block_on(futures_util::future::join_all(asked));
    assert!(answers.into_iter().all(|answer| answer.unwrap().verdict == Verdict::Reject));
}
