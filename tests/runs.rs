//! docs/contract.md §4: ownership, cancellation, faults and quiescence of one run.

use crate::common;

use std::time::{Duration, Instant};

use common::{request, request_with, runtime};
use subagents::providers::{Fault, FaultStage, MockEvent, MockProvider};
use subagents::seam::{Category, Stage};
use subagents::{CancellationToken, StopReason};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn result_is_shared_by_many_awaiters() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    subagents
        .register_provider(MockProvider::new("m").with_reply("same").with_delay(Duration::from_millis(20)))
        .unwrap()
        .keep();
    let run = std::sync::Arc::new(subagents.start("m", request("hi")).await.unwrap());
    let waiters: Vec<_> = (0..8)
        .map(|_| {
            let run = run.clone();
            tokio::spawn(async move { run.result().await.unwrap() })
        })
        .collect();
    for waiter in waiters {
        assert_eq!(waiter.await.unwrap().text(), "same");
    }
    assert_eq!(run.result().await.unwrap().text(), "same", "awaitable again after settling");
    run.dispose().await.unwrap();
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispose_is_idempotent_and_safe_concurrently() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    let mock = MockProvider::new("m").with_delay(Duration::from_secs(30));
    subagents.register_provider(mock.clone()).unwrap().keep();
    let run = std::sync::Arc::new(subagents.start("m", request("hi")).await.unwrap());
    let disposers: Vec<_> = (0..4)
        .map(|_| {
            let run = run.clone();
            tokio::spawn(async move { run.dispose().await })
        })
        .collect();
    for disposer in disposers {
        disposer.await.unwrap().unwrap();
        // Every call returns only after quiescence.
        assert_eq!(runtime.live().runs, 0);
        assert_eq!(mock.live_children(), 0);
    }
    run.dispose().await.unwrap();
    assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Aborted);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_signal_cancels_a_published_run_which_settles_aborted() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    subagents
        .register_provider(MockProvider::new("m").with_reply("long answer").with_delay(Duration::from_secs(30)))
        .unwrap()
        .keep();
    let signal = CancellationToken::new();
    let run = subagents.start("m", request_with("hi", signal.clone())).await.unwrap();
    signal.cancel();
    let result = run.result().await.unwrap();
    assert_eq!(result.stop_reason, StopReason::Aborted);
    assert!(run.is_cancelled());
    run.dispose().await.unwrap();
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_cancel_settles_aborted_but_a_completed_run_stays_completed() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("slow").with_delay(Duration::from_secs(30))).unwrap().keep();
    subagents.register_provider(MockProvider::new("fast")).unwrap().keep();

    let slow = subagents.start("slow", request("hi")).await.unwrap();
    slow.cancel();
    assert_eq!(slow.result().await.unwrap().stop_reason, StopReason::Aborted);
    slow.dispose().await.unwrap();

    let fast = subagents.start("fast", request("hi")).await.unwrap();
    assert_eq!(fast.result().await.unwrap().stop_reason, StopReason::Completed);
    fast.cancel();
    assert_eq!(fast.result().await.unwrap().stop_reason, StopReason::Completed);
    fast.dispose().await.unwrap();
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_during_a_slow_publication_rejects_only_after_rollback() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    let mock = MockProvider::new("m")
        .with_fault(FaultStage::BeforePublication, Fault::Delay(Duration::from_secs(30)))
        .with_recording();
    subagents.register_provider(mock.clone()).unwrap().keep();
    let signal = CancellationToken::new();
    let canceller = {
        let signal = signal.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            signal.cancel();
        })
    };
    let began = Instant::now();
    let error = subagents.start("m", request_with("hi", signal)).await.unwrap_err();
    assert_eq!(error.code(), "ABORTED");
    assert!(began.elapsed() < Duration::from_secs(10));
    // Rolled back before the rejection arrived: nothing is alive right now.
    assert_eq!(mock.live_children(), 0);
    assert_eq!(runtime.live().runs, 0);
    let recorded = mock.recorded();
    assert!(matches!(recorded.as_slice(), [MockEvent::Created(_), MockEvent::RolledBack(_)]), "{recorded:?}");
    canceller.await.unwrap();
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_that_ignores_cancellation_is_abandoned_after_the_grace() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    let mock = MockProvider::new("m").with_fault(FaultStage::BeforePublication, Fault::Hang);
    subagents.register_provider(mock.clone()).unwrap().keep();
    let signal = CancellationToken::new();
    let start = subagents.start("m", request_with("hi", signal.clone()));
    let cancel = async {
        tokio::time::sleep(Duration::from_millis(30)).await;
        signal.cancel();
    };
    let (outcome, ()) = tokio::join!(start, cancel);
    assert_eq!(outcome.unwrap_err().code(), "ABORTED");
    assert_eq!(mock.live_children(), 0, "the abandoned launch was dropped");
    assert!(runtime.live().is_quiescent());
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_faults_reject_with_a_safe_diagnostic_and_leave_nothing() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    for (name, fault, category) in [
        ("error", Fault::Error, Category::ChildError),
        ("crash", Fault::Crash, Category::ChildCrashed),
        ("panic", Fault::Panic, Category::Panicked),
    ] {
        let mock = MockProvider::new(name).with_fault(FaultStage::BeforePublication, fault);
        subagents.register_provider(mock.clone()).unwrap().keep();
        let error = subagents.start(name, request("secret task text")).await.unwrap_err();
        let subagents::StartError::StartupFailed { diagnostic, .. } = &error else {
            panic!("{name}: expected STARTUP_FAILED, got {error:?}");
        };
        assert_eq!(diagnostic.category, category);
        assert_eq!(diagnostic.stage, Stage::Initialize);
        assert!(!error.to_string().contains("secret"), "diagnostics never carry task text");
        assert_eq!(mock.live_children(), 0);
        assert_eq!(runtime.live().runs, 0);
    }
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_faults_settle_error_with_partial_output_and_never_kill_the_actor() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    let cases = [
        (FaultStage::AfterPublication, Fault::Error, Category::ChildError, ""),
        (FaultStage::AfterPublication, Fault::Panic, Category::Panicked, ""),
        (FaultStage::MidRun, Fault::Crash, Category::ChildCrashed, "abc"),
        (FaultStage::MidRun, Fault::Panic, Category::Panicked, ""),
    ];
    for (index, (stage, fault, category, partial)) in cases.into_iter().enumerate() {
        let name = format!("m{index}");
        let mock = MockProvider::new(name.clone()).with_reply("abcdef").with_fault(stage, fault);
        subagents.register_provider(mock.clone()).unwrap().keep();
        let run = subagents.start(&name, request("hi")).await.unwrap();
        let result = run.result().await.unwrap();
        assert_eq!(result.stop_reason, StopReason::Error, "{stage:?} {fault:?}");
        let diagnostic = result.diagnostic.clone().expect("a failed run carries a diagnostic");
        assert_eq!(diagnostic.category, category);
        assert_eq!(diagnostic.stage, Stage::SessionRun);
        assert_eq!(diagnostic.provider, name);
        if category != Category::Panicked {
            assert_eq!(result.text(), partial);
        }
        run.dispose().await.unwrap();
        assert_eq!(mock.live_children(), 0);
    }
    assert!(runtime.live().is_quiescent());
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_child_is_aborted_after_the_cancel_grace_and_released_on_dispose() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    let mock = MockProvider::new("m").with_fault(FaultStage::MidRun, Fault::Hang);
    subagents.register_provider(mock.clone()).unwrap().keep();
    let run = subagents.start("m", request("hi")).await.unwrap();
    run.cancel();
    let result = tokio::time::timeout(Duration::from_secs(10), run.result()).await.unwrap().unwrap();
    assert_eq!(result.stop_reason, StopReason::Aborted);
    run.dispose().await.unwrap();
    assert_eq!(mock.live_children(), 0);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dispose_faults_are_reported_but_the_run_still_quiesces() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    for (name, fault, category) in [
        ("error", Fault::Error, Category::ChildError),
        ("panic", Fault::Panic, Category::Panicked),
        ("hang", Fault::Hang, Category::TimedOut),
    ] {
        let mock = MockProvider::new(name).with_fault(FaultStage::OnDispose, fault);
        subagents.register_provider(mock.clone()).unwrap().keep();
        let run = subagents.start(name, request("hi")).await.unwrap();
        assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Completed);
        let error = tokio::time::timeout(Duration::from_secs(10), run.dispose())
            .await
            .expect("dispose is bounded")
            .unwrap_err();
        let subagents::DisposeError::DisposeFailed { diagnostic, .. } = &error else {
            panic!("{name}: expected DISPOSE_FAILED, got {error:?}");
        };
        assert_eq!(diagnostic.category, category, "{name}");
        assert_eq!(error.code(), "DISPOSE_FAILED");
        assert_eq!(run.dispose().await.unwrap_err(), error, "a second dispose reports the same");
        assert_eq!(mock.live_children(), 0);
        assert_eq!(runtime.live().runs, 0);
    }
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configured_stop_reasons_pass_through_and_cancel_turns_them_aborted() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    for reason in [StopReason::MaxTokens, StopReason::Refusal, StopReason::Error] {
        let name = reason.to_string();
        subagents.register_provider(MockProvider::new(name.clone()).with_stop_reason(reason)).unwrap().keep();
        let run = subagents.start(&name, request("hi")).await.unwrap();
        assert_eq!(run.result().await.unwrap().stop_reason, reason);
        run.dispose().await.unwrap();
    }
    let slow =
        MockProvider::new("slow-refusal").with_stop_reason(StopReason::Refusal).with_delay(Duration::from_millis(200));
    subagents.register_provider(slow).unwrap().keep();
    let run = subagents.start("slow-refusal", request("hi")).await.unwrap();
    run.cancel();
    assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Aborted);
    run.dispose().await.unwrap();
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn structured_value_defaults_to_the_reply_when_a_schema_is_requested() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("m").with_reply("ok")).unwrap().keep();
    let schema = serde_json::json!({"type": "object", "properties": {"reply": {"type": "string"}}});
    let run = subagents.start("m", request("hi").with_output_schema(schema)).await.unwrap();
    assert_eq!(run.result().await.unwrap().structured, Some(serde_json::json!({"reply": "ok"})));
    run.dispose().await.unwrap();
    let plain = subagents.start("m", request("hi")).await.unwrap();
    assert_eq!(plain.result().await.unwrap().structured, None);
    plain.dispose().await.unwrap();
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_echoing_mock_answers_with_the_prompt_after_only_a_reply_it_was_given() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    subagents.register_provider(MockProvider::new("echo").with_echo_prompt()).unwrap().keep();
    subagents.register_provider(MockProvider::new("prefixed").with_reply("seen: ").with_echo_prompt()).unwrap().keep();
    // The default reply `done` is what a mock says when it has nothing to echo, not a prefix.
    for (provider, expected) in [("echo", "alpha"), ("prefixed", "seen: alpha")] {
        let run = subagents.start(provider, request("alpha")).await.unwrap();
        assert_eq!(run.result().await.unwrap().text(), expected, "{provider}");
        run.dispose().await.unwrap();
    }
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steering_reaches_the_running_child_and_is_refused_after_it_settles() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    let mock = MockProvider::new("m").with_wait_for_message().with_recording();
    subagents.register_provider(mock.clone()).unwrap().keep();
    let run = subagents.start("m", request("wait for me")).await.unwrap();
    assert!(run.local_agent().is_none());
    #[cfg(feature = "agent")]
    assert!(run.agent().is_none(), "a mock run has no in-process agent");
    assert!(run.child_id().starts_with("mock:m:"));
    let steering = run.steering().expect("the mock supports steering");
    steering.send("go ahead").await.unwrap();
    assert_eq!(run.result().await.unwrap().text(), "go ahead");
    let error = steering.send("too late").await.unwrap_err();
    assert_eq!(error.code(), "INVALID_REQUEST");
    run.dispose().await.unwrap();
    assert_eq!(steering.send("gone").await.unwrap_err().code(), "INVALID_REQUEST");
    assert!(mock.recorded().iter().any(|e| matches!(e, MockEvent::Steered(_, text) if text == "go ahead")));
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_an_undisposed_run_still_releases_it() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    let mock = MockProvider::new("m").with_delay(Duration::from_secs(30));
    subagents.register_provider(mock.clone()).unwrap().keep();
    let run = subagents.start("m", request("hi")).await.unwrap();
    drop(run);
    assert!(common::eventually(Duration::from_secs(5), || runtime.live().runs == 0).await);
    assert_eq!(mock.live_children(), 0);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoning_start_midway_leaves_nothing_running() {
    let runtime = runtime();
    let subagents = runtime.subagents();
    let mock = MockProvider::new("m")
        .with_fault(FaultStage::BeforePublication, Fault::Delay(Duration::from_millis(50)))
        .with_delay(Duration::from_secs(30));
    subagents.register_provider(mock.clone()).unwrap().keep();
    let abandoned = tokio::time::timeout(Duration::from_millis(10), subagents.start("m", request("hi"))).await;
    assert!(abandoned.is_err(), "the start was still in flight");
    assert!(common::eventually(Duration::from_secs(5), || runtime.live().runs == 0).await);
    assert_eq!(mock.live_children(), 0);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fan_out_runs_a_thousand_requests_never_more_than_its_cap_at_once_and_disposes_each() {
    use futures_util::StreamExt;
    let runtime = runtime();
    let subagents = runtime.subagents();
    // The registration handle is dropped at once: the provider stays.
    drop(subagents.register_provider(MockProvider::new("m").with_delay(Duration::from_millis(2))).unwrap());
    let (_listener, peak) = common::peak_running(&subagents);
    let requests = (0..1000).map(|n| request(&format!("task {n}")));
    let mut seen = vec![false; 1000];
    let mut results = subagents.fan_out("m", requests, 8);
    while let Some((index, result)) = results.next().await {
        assert_eq!(result.unwrap().stop_reason, StopReason::Completed);
        assert!(!std::mem::replace(&mut seen[index], true), "each request once");
    }
    assert!(seen.iter().all(|&s| s));
    assert!(common::eventually(Duration::from_secs(5), || runtime.live().is_quiescent()).await, "each run disposed");
    assert!(peak() <= 8, "at most 8 runs at once, saw {}", peak());
    runtime.shutdown().await;
}
