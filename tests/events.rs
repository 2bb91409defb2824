//! docs/contract.md §5: lifecycle events — ordering, owned payloads, containment,
//! slow listeners, per-parent filtering.

use crate::common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{eventually, request, runtime};
use futures_util::StreamExt;
use subagents::events::EventRecvError;
use subagents::providers::{Fault, FaultStage, MockProvider};
use subagents::seam::ProgressUpdate;
use subagents::{CancellationToken, Parent, StartRequest, StopReason, SubagentEvent};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_precedes_end_even_for_a_child_that_settles_instantly() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("instant").with_reply("at once")).unwrap().keep();
    let mut events = subagents.subscribe();
    let mut run_ids = Vec::new();
    for _ in 0..50 {
        let run = subagents.start("instant", request("hi")).await.unwrap();
        run.result().await.unwrap();
        run_ids.push(run.run_id());
        run.dispose().await.unwrap();
    }
    let mut started = HashMap::new();
    let mut ended = 0;
    while let Some(event) = events.try_recv() {
        match event.unwrap() {
            SubagentEvent::Start(info) => {
                assert!(!info.local);
                assert!(info.child_id.starts_with("mock:instant:"));
                started.insert(info.run_id, info.child_id.clone());
            }
            SubagentEvent::End(end) => {
                assert_eq!(started.get(&end.run_id), Some(&end.child_id), "End without an earlier Start");
                assert_eq!(end.stop_reason, StopReason::Completed);
                let last = end.last_message.as_ref().expect("an owned copy of the last message");
                assert_eq!(subagents::seam::text_of(last), "at once");
                ended += 1;
            }
            SubagentEvent::Progress(progress) => {
                assert!(started.contains_key(&progress.run_id), "Progress before Start");
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(ended, 50);
    let mut seen: Vec<_> = started.into_keys().collect();
    seen.sort_unstable();
    assert_eq!(seen, run_ids, "Start and End share the registry-minted run id");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_arrives_between_start_and_end() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    subagents
        .register_provider(MockProvider::new("m").with_reply("halfway there").with_delay(Duration::from_millis(20)))
        .unwrap()
        .keep();
    let mut events = subagents.subscribe();
    let run = subagents.start("m", request("hi")).await.unwrap();
    run.result().await.unwrap();
    run.dispose().await.unwrap();
    let kinds: Vec<String> = std::iter::from_fn(|| events.try_recv())
        .map(|e| match e.unwrap() {
            SubagentEvent::Start(_) => "start".to_owned(),
            SubagentEvent::Progress(p) => match &p.update {
                ProgressUpdate::MessageChunk { text } => format!("chunk:{text}"),
                other => format!("{other:?}"),
            },
            SubagentEvent::End(_) => "end".to_owned(),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(kinds, vec!["start", "chunk:halfwa", "end"]);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_start_emits_nothing() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    subagents
        .register_provider(MockProvider::new("m").with_fault(FaultStage::BeforePublication, Fault::Error))
        .unwrap()
        .keep();
    let mut events = subagents.subscribe();
    subagents.start("m", request("hi")).await.unwrap_err();
    subagents.start("absent", request("hi")).await.unwrap_err();
    assert!(events.try_recv().is_none());
    runtime.shutdown().await;
}

fn panicking_listener(_: &SubagentEvent) {
    panic!("listener bug")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_or_failing_listener_does_not_stop_the_others() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("m")).unwrap().keep();
    let counted = Arc::new(AtomicUsize::new(0));
    let _panics = subagents.add_listener(panicking_listener);
    let _fails = subagents.add_listener(|_: &SubagentEvent| Err::<(), _>("listener error"));
    let _counts = {
        let counted = counted.clone();
        subagents.add_listener(move |event: &SubagentEvent| {
            if matches!(event, SubagentEvent::End(_)) {
                counted.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    for _ in 0..10 {
        let run = subagents.start("m", request("hi")).await.unwrap();
        assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Completed);
        run.dispose().await.unwrap();
    }
    assert!(eventually(Duration::from_secs(5), || counted.load(Ordering::SeqCst) == 10).await);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_listener_never_blocks_runs_and_lags_instead() {
    let runtime = subagents::Runtime::builder().workers(2).event_capacity(8).build().unwrap();
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("m")).unwrap().keep();
    let _slow = subagents.add_listener(|_: &SubagentEvent| std::thread::sleep(Duration::from_millis(200)));
    let mut lagging = subagents.subscribe();
    let began = Instant::now();
    for _ in 0..100 {
        let run = subagents.start("m", request("hi")).await.unwrap();
        run.result().await.unwrap();
        run.dispose().await.unwrap();
    }
    // 100 runs × 3 events at 200 ms each would be a minute if the listener blocked runs.
    assert!(began.elapsed() < Duration::from_secs(20), "runs waited for a listener");
    assert!(matches!(lagging.recv().await, Err(EventRecvError::Lagged(_))));
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_stream_reports_a_lag_as_one_item_then_yields_the_events_still_held() {
    let runtime = subagents::Runtime::builder().workers(2).event_capacity(8).build().unwrap();
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("m")).unwrap().keep();
    let mut events = subagents.subscribe();
    for _ in 0..10 {
        let run = subagents.start("m", request("hi")).await.unwrap();
        run.result().await.unwrap();
        run.dispose().await.unwrap();
    }
    let Some(Err(EventRecvError::Lagged(missed))) = events.next().await else { panic!("10 runs overflow 8 slots") };
    assert!(missed >= 12, "at least 20 events, 8 held: missed {missed}");
    let held: Vec<SubagentEvent> = (&mut events).take(8).map(Result::unwrap).collect().await;
    assert!(matches!(held.last(), Some(SubagentEvent::End(_))), "the newest event is the last run's End");
    assert!(events.try_recv().is_none(), "nothing more is queued");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_can_filter_run_events_by_parent_session() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("m")).unwrap().keep();
    let mut only_a = subagents.subscribe().for_parent("session-a");
    for parent in ["session-a", "session-b", "session-a"] {
        let request = StartRequest::new("hi", Parent::root("/tmp").with_session(parent), CancellationToken::new());
        let run = subagents.start("m", request).await.unwrap();
        run.result().await.unwrap();
        run.dispose().await.unwrap();
    }
    let mut starts = 0;
    while let Some(event) = only_a.try_recv() {
        let event = event.unwrap();
        assert_eq!(event.parent_session(), Some("session-a"));
        starts += usize::from(matches!(event, SubagentEvent::Start(_)));
    }
    assert_eq!(starts, 2);
    runtime.shutdown().await;
}

#[test]
fn add_listener_takes_closures_without_annotations() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("plain").with_reply("ok")).unwrap().keep();
    let ends = Arc::new(AtomicUsize::new(0));
    let counted = ends.clone();
    let _returns_unit = subagents.add_listener(move |event| {
        if let SubagentEvent::End(_) = event {
            counted.fetch_add(1, Ordering::SeqCst);
        }
    });
    let _returns_result = subagents.add_listener(|_| Ok::<(), String>(()));
    let run_subagents = subagents.clone();
    runtime.block_on(async move {
        let run = run_subagents.start("plain", request("hi")).await.unwrap();
        run.result().await.unwrap();
        run.dispose().await.unwrap();
        assert!(eventually(Duration::from_secs(5), || ends.load(Ordering::SeqCst) == 1).await);
    });
}
