//! One route's limits over `process` children: real `subagents serve`
//! children of one parent, each calling the stand-in on the parent's
//! route, all drawing on the parent's limiter over the process wire.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt};
use subagents::agent::{ModelRoute, ModelSpec, RouteLimits};
use subagents::providers::{ProcessConfig, ProcessProvider};
use subagents::{CancellationToken, Parent, RunResult, Runtime, StartRequest, StopReason, Subagents};

use super::{route, server_on, Policy, Server};
use crate::common::{processes_mentioning, runtime_at, Within, WAIT_LIMIT};

/// A runtime whose `process` provider `name` runs its children on `route`,
/// lending them its limiter (unless `lend` is false: each child on its own).
fn parent_of_children(route: &ModelRoute, home: &Path, name: &str, lend: bool) -> (Runtime, Subagents) {
    let runtime = runtime_at(home);
    let subagents = runtime.subagents();
    let mut config = ProcessConfig::new(name, home.join(name));
    config.bin = PathBuf::from(env!("CARGO_BIN_EXE_subagents"));
    config.route_child_model(&ModelSpec::Route(Arc::new(route.clone())));
    if !lend {
        config.lent_limiters.clear();
    }
    subagents.register_provider(ProcessProvider::new(config).unwrap()).unwrap().keep();
    (runtime, subagents)
}

/// `count` runs on `provider`, `at_once` at a time; their results.
fn run_all(runtime: &Runtime, subagents: &Subagents, provider: &str, count: usize, at_once: usize) -> Vec<RunResult> {
    let (subagents, provider, cwd) = (subagents.clone(), provider.to_owned(), std::env::temp_dir());
    runtime.within(WAIT_LIMIT, "every run to settle", async move {
        stream::iter(0..count)
            .map(|n| {
                let (subagents, provider, cwd) = (subagents.clone(), provider.clone(), cwd.clone());
                async move {
                    let request = StartRequest::new(format!("task {n}"), Parent::root(cwd), CancellationToken::new());
                    let run = subagents.start(&provider, request).await.unwrap();
                    let result = run.result().await.unwrap();
                    run.dispose().await.unwrap();
                    result
                }
            })
            .buffer_unordered(at_once)
            .collect::<Vec<_>>()
            .await
    })
}

/// The most requests the stand-in saw in any `window`.
fn most_in_any(server: &Server, window: Duration) -> usize {
    let log = server.log.lock().unwrap();
    let arrivals: Vec<Instant> = log.iter().map(|(at, _)| *at).collect();
    (0..arrivals.len())
        .map(|i| arrivals[i..].iter().take_while(|at| at.duration_since(arrivals[i]) < window).count())
        .max()
        .unwrap_or(0)
}

#[test]
fn process_children_keep_together_to_their_parent_s_route_limits() {
    const RUNS: usize = 24;
    const AT_ONCE: usize = 6;
    let home = tempfile::tempdir().unwrap();
    // Admits 10 a second (a burst of 3), each answer after 200 ms.
    let server = server_on(Policy::Paced { per_second: 10.0, burst: 3, delay: Duration::from_millis(200) });
    let limits = RouteLimits { requests_per_minute: Some(600), max_concurrent: Some(2), ..RouteLimits::default() };
    let route = route(&server, limits);
    let (runtime, subagents) = parent_of_children(&route, home.path(), "children", true);

    // Six children at once, each its own process: alone, each would send
    // its call at once, six in flight.
    let results = run_all(&runtime, &subagents, "children", RUNS, AT_ONCE);

    let failed: Vec<_> = results.iter().filter(|r| r.stop_reason != StopReason::Completed).collect();
    assert!(failed.is_empty(), "every run completes: {failed:?}");
    let (answered, refused) = (server.answered.load(Ordering::Relaxed), server.refused.load(Ordering::Relaxed));
    let requests = answered + refused;
    let most = server.most_in_flight.load(Ordering::Acquire);
    let in_a_second = most_in_any(&server, Duration::from_secs(1));
    eprintln!("{RUNS} process runs: {requests} requests, {refused} answered 429, {most} in flight at most, {in_a_second} in a second at most");
    assert_eq!(answered, RUNS, "one answered call a run");
    assert!(most <= 2, "{most} calls in flight at once: the route lets in 2");
    assert!(in_a_second <= 10 + 3, "{in_a_second} requests within one second: the route allows 10");
    assert!(refused * 50 <= requests, "{refused} of {requests} requests were answered 429 (more than 2%)");
    // The parent's limiter admitted every call of every child, and counts them.
    let stats = route.limiter().stats();
    assert_eq!(stats.requests, requests as u64, "{stats:?}");
    assert_eq!(stats.refused, refused as u64, "{stats:?}");
    runtime.shutdown_blocking();
    no_children_left_in(home.path());
}

#[test]
fn process_children_that_keep_their_own_limits_together_exceed_the_route() {
    // The same batch without lending (as an older child does): each child
    // enforces the route alone, so together they exceed it. What the test
    // above asserts would fail here.
    let home = tempfile::tempdir().unwrap();
    let server = server_on(Policy::Slow { delay: Duration::from_millis(300) });
    let limits = RouteLimits { max_concurrent: Some(2), ..RouteLimits::default() };
    let route = route(&server, limits);
    let (runtime, subagents) = parent_of_children(&route, home.path(), "alone", false);

    let results = run_all(&runtime, &subagents, "alone", 6, 6);

    assert!(results.iter().all(|r| r.stop_reason == StopReason::Completed), "{results:?}");
    let most = server.most_in_flight.load(Ordering::Acquire);
    assert!(most > 2, "{most} in flight at most: children on their own do not share the parent's 2");
    assert_eq!(route.limiter().stats().requests, 0, "the parent's limiter was never asked");
    runtime.shutdown_blocking();
    no_children_left_in(home.path());
}

#[test]
fn a_child_killed_while_its_call_is_admitted_gives_the_parent_s_slot_back_at_once() {
    let home = tempfile::tempdir().unwrap();
    // The first call is held for two minutes; the rest are answered at once.
    let server = server_on(Policy::FirstHeld { hold: Duration::from_secs(120) });
    let limits = RouteLimits { max_concurrent: Some(1), ..RouteLimits::default() };
    let route = route(&server, limits);
    let (runtime, subagents) = parent_of_children(&route, home.path(), "children", true);
    let marker = home.path().join("children");

    // The first child holds the route's one slot, its call in flight.
    let subagents_for_first = subagents.clone();
    let first = runtime.within(WAIT_LIMIT, "the first run to start", async move {
        let request = StartRequest::new("held", Parent::root(std::env::temp_dir()), CancellationToken::new());
        subagents_for_first.start("children", request).await.unwrap()
    });
    let deadline = Instant::now() + WAIT_LIMIT;
    while server.most_in_flight.load(Ordering::Acquire) < 1 {
        assert!(Instant::now() < deadline, "the first child's call never reached the stand-in");
        std::thread::sleep(Duration::from_millis(20));
    }
    let children = processes_mentioning(&marker);
    assert_eq!(children.len(), 1, "one serve child: {children:?}");
    // SAFETY: a plain signal to a process this test started.
    assert_eq!(unsafe { libc::kill(children[0].0 as i32, libc::SIGKILL) }, 0);

    // Not disposed yet, so only its wire's end could give the slot back:
    // the next child's call gets it and is answered.
    let started = Instant::now();
    let next = run_all(&runtime, &subagents, "children", 1, 1);
    assert_eq!(next[0].stop_reason, StopReason::Completed, "{next:?}");
    assert!(started.elapsed() < Duration::from_secs(60), "the slot came back only after {:?}", started.elapsed());
    let killed = runtime.within(WAIT_LIMIT, "the killed run to settle", async move {
        let result = first.result().await.unwrap();
        first.dispose().await.unwrap();
        result
    });
    assert_eq!(killed.stop_reason, StopReason::Error, "{killed:?}");
    assert_eq!(route.limiter().stats().requests, 2, "both calls passed the parent's limiter");
    runtime.shutdown_blocking();
    no_children_left_in(home.path());
}

/// No serve child is left of the test at `home`.
fn no_children_left_in(home: &Path) {
    let left = processes_mentioning(home);
    assert!(left.is_empty(), "children survived: {left:?}");
}
