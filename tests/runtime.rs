//! The runtime: foreign callers, caller code on workers, fan-out leak
//! accounting, and phased bounded shutdown.

use crate::common;

use std::time::{Duration, Instant};

use common::{request, runtime};
use subagents::events::Live;
use subagents::providers::{Fault, FaultStage, MockEvent, MockProvider};
use subagents::{CancellationToken, Parent, Runtime, StartRequest, StopReason};

#[test]
fn subagents_works_from_a_plain_tokio_multi_thread_app() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("m").with_reply("hello")).unwrap().keep();
    let app = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let text = app.block_on(async move {
        let handles: Vec<_> = (0..16)
            .map(|_| {
                let subagents = subagents.clone();
                tokio::spawn(async move {
                    let run = subagents.start("m", request("hi")).await.unwrap();
                    let text = run.result().await.unwrap().text();
                    run.dispose().await.unwrap();
                    text
                })
            })
            .collect();
        let mut texts = Vec::new();
        for handle in handles {
            texts.push(handle.await.unwrap());
        }
        texts
    });
    assert!(text.iter().all(|t| t == "hello"));
    assert!(runtime.live().is_quiescent());
    let report = app.block_on(runtime.shutdown());
    assert_eq!(report.live_after, Live::default());
}

#[test]
fn subagents_works_from_plain_std_threads() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("m")).unwrap().keep();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let subagents = subagents.clone();
            std::thread::spawn(move || {
                let local = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                local.block_on(async {
                    for _ in 0..25 {
                        let run = subagents.start("m", request("hi")).await.unwrap();
                        assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Completed);
                        run.dispose().await.unwrap();
                    }
                })
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert!(runtime.live().is_quiescent());
    assert_eq!(runtime.shutdown_blocking().live_after, Live::default());
}

#[test]
fn caller_code_runs_on_a_runtime_worker() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("m").with_reply("inside")).unwrap().keep();
    let on_worker = runtime.block_on(async { std::thread::current().name().map(str::to_owned) });
    assert_ne!(on_worker.as_deref(), Some("main"));
    let task = runtime.spawn(async move {
        let run = subagents.start("m", request("hi")).await.unwrap();
        let text = run.result().await.unwrap().text();
        run.dispose().await.unwrap();
        text
    });
    let text = runtime.block_on(async move { task.await.unwrap() });
    assert_eq!(text, "inside");
    runtime.shutdown_blocking();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_runs_started_then_disposed_leave_nothing_alive() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    let mock = MockProvider::new("m").with_delay(Duration::from_millis(50));
    subagents.register_provider(mock.clone()).unwrap().keep();
    let baseline = runtime.live();
    let starts: Vec<_> = (0..1000)
        .map(|_| {
            let subagents = subagents.clone();
            tokio::spawn(async move { subagents.start("m", request("hi")).await.unwrap() })
        })
        .collect();
    let mut runs = Vec::with_capacity(1000);
    for start in starts {
        runs.push(start.await.unwrap());
    }
    assert_eq!(runtime.live().runs, 1000);
    assert_eq!(runtime.live().actors, baseline.actors + 1000);
    let disposals: Vec<_> = runs.into_iter().map(|run| tokio::spawn(async move { run.dispose().await })).collect();
    for disposal in disposals {
        disposal.await.unwrap().unwrap();
    }
    assert_eq!(runtime.live(), baseline);
    assert_eq!(mock.live_children(), 0);
    let report = runtime.shutdown().await;
    assert_eq!(report.live_after, Live::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_with_a_hundred_hung_runs_returns_within_its_bounds_and_reports_them_all() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    let mock = MockProvider::new("wedged")
        .with_fault(FaultStage::AfterPublication, Fault::Hang)
        .with_fault(FaultStage::OnDispose, Fault::Hang);
    subagents.register_provider(mock.clone()).unwrap().keep();
    let mut runs = Vec::new();
    for _ in 0..100 {
        runs.push(subagents.start("wedged", request("hi")).await.unwrap());
    }
    let began = Instant::now();
    let report = runtime.shutdown().await;
    // Four phases of 500 ms plus escalation: far below this generous bound.
    assert!(began.elapsed() < Duration::from_secs(15), "shutdown took {:?}", began.elapsed());
    assert_eq!(report.runs_stopped, 100);
    assert_eq!(report.live_after, Live::default());
    let names: Vec<_> = report.phases.iter().map(|p| p.name).collect();
    assert_eq!(names, ["refuse-starts", "dispose-runs", "stop-providers", "stop-registry"]);
    assert_eq!(report.providers_stopped, vec!["wedged"]);
    assert_eq!(mock.live_children(), 0);
    for run in &runs {
        assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Aborted);
        assert_eq!(run.dispose().await.unwrap_err().code(), "DISPOSE_FAILED");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_disposes_children_before_parents() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    let mock = MockProvider::new("m").with_delay(Duration::from_secs(30)).with_recording();
    subagents.register_provider(mock.clone()).unwrap().keep();
    let mut runs = Vec::new();
    for depth in [0, 2, 1, 0, 2] {
        let parent = Parent::root("/tmp").with_depth(depth);
        let run = subagents.start("m", StartRequest::new("hi", parent, CancellationToken::new())).await.unwrap();
        runs.push((depth, run.child_id().to_owned(), run));
    }
    let report = runtime.shutdown().await;
    assert_eq!(report.runs_stopped, 5);
    assert_eq!(report.runs_forced, 0);
    let disposed: Vec<u32> = mock
        .recorded()
        .iter()
        .filter_map(|event| match event {
            MockEvent::Disposed(id) => runs.iter().find(|(_, run_id, _)| run_id == id).map(|(depth, _, _)| *depth),
            _ => None,
        })
        .collect();
    assert_eq!(disposed, vec![2, 2, 1, 0, 0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_runtime_refuses_starts_and_registrations() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("m")).unwrap().keep();
    runtime.shutdown().await;
    assert_eq!(subagents.start("m", request("hi")).await.unwrap_err().code(), "RUNTIME_STOPPED");
    let error = subagents.register_provider(MockProvider::new("n")).unwrap_err();
    assert_eq!(error.code(), "RUNTIME_STOPPED");
}

#[test]
fn dropping_a_runtime_without_shutdown_stops_its_threads() {
    let runtime = Runtime::builder().workers(1).build().unwrap();
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("m")).unwrap().keep();
    drop(runtime);
    let local = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let error = local.block_on(subagents.start("m", request("hi"))).unwrap_err();
    assert_eq!(error.code(), "RUNTIME_STOPPED");
}

#[test]
fn a_plain_tokio_task_on_a_worker_thread_can_start_runs() {
    // `tokio::spawn` inside `block_on` runs on a worker thread but outside
    // its local set, where actors cannot be started in place.
    let runtime = common::runtime();
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("mock").with_reply("from a tokio task")).unwrap().keep();
    let text = runtime.block_on(async move {
        let task = tokio::spawn(async move {
            let run = subagents.start("mock", common::request("x")).await.unwrap();
            let result = run.result().await.unwrap();
            run.dispose().await.unwrap();
            result.text()
        });
        task.await.unwrap()
    });
    assert_eq!(text, "from a tokio task");
    assert!(runtime.shutdown_blocking().live_after.is_quiescent());
}
