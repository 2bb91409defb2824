//! Lifecycle state machine (proptest-state-machine): random sequences of
//! start / send-message / cancel / dispose / child crash / provider removal
//! / panicking listener / runtime shutdown over the mock, spawn and chaos
//! providers. After every step:
//!
//! - each run has exactly one terminal outcome (it never changes once seen);
//! - every `End` pairs with an earlier `Start`, at most one of each per run;
//! - a returned `dispose()` means the run is gone from `runtime.live()`;
//! - after shutdown `runtime.live()` is all zero;
//! - no panic reaches the caller.
//!
//! `PROPTEST_CASES=500 cargo test --test lifecycle_machine` runs deeper.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use proptest::prelude::*;
use proptest_state_machine::{prop_state_machine, ReferenceStateMachine, StateMachineTest};
use subagents::agent::{ScriptMatch, ScriptedModel, Step};
use subagents::events::{EventStream, ListenerHandle};
use subagents::providers::{
    ChaosFault, ChaosProvider, ChaosSchedule, ChaosStage, Fault, FaultStage, InProcessProvider, MockProvider,
};
use subagents::{
    CancellationToken, Parent, Registration, Run, RunResult, Runtime, StartRequest, SubagentError, SubagentEvent,
    Subagents,
};

const PROVIDERS: [&str; 4] = ["mock", "spawn", "chaos", "crashy"];

#[derive(Clone, Debug)]
enum Transition {
    Start(usize),
    Message(usize),
    Cancel(usize),
    Dispose(usize),
    RemoveProvider(usize),
    PanickingListener,
    Shutdown,
}

/// What the test knows without running anything.
#[derive(Clone, Debug, Default)]
struct Model {
    runs: usize,
    registered: [bool; 4],
    shut_down: bool,
}

struct Machine;

impl ReferenceStateMachine for Machine {
    type State = Model;
    type Transition = Transition;

    fn init_state() -> BoxedStrategy<Model> {
        Just(Model { runs: 0, registered: [true; 4], shut_down: false }).boxed()
    }

    fn transitions(state: &Model) -> BoxedStrategy<Transition> {
        let run = 0..state.runs.max(1);
        prop_oneof![
            6 => (0..PROVIDERS.len()).prop_map(Transition::Start),
            2 => run.clone().prop_map(Transition::Message),
            2 => run.clone().prop_map(Transition::Cancel),
            3 => run.prop_map(Transition::Dispose),
            1 => (0..PROVIDERS.len()).prop_map(Transition::RemoveProvider),
            1 => Just(Transition::PanickingListener),
            1 => Just(Transition::Shutdown),
        ]
        .boxed()
    }

    fn preconditions(state: &Model, transition: &Transition) -> bool {
        match transition {
            Transition::Message(n) | Transition::Cancel(n) | Transition::Dispose(n) => *n < state.runs,
            Transition::Shutdown | Transition::RemoveProvider(_) | Transition::PanickingListener => !state.shut_down,
            Transition::Start(_) => true,
        }
    }

    fn apply(mut state: Model, transition: &Transition) -> Model {
        match transition {
            Transition::Start(_) => state.runs += 1,
            Transition::RemoveProvider(p) => state.registered[*p] = false,
            Transition::Shutdown => state.shut_down = true,
            _ => {}
        }
        state
    }
}

struct Sut {
    /// `None` once shut down.
    runtime: Option<Runtime>,
    subagents: Subagents,
    _home: tempfile::TempDir,
    registrations: Vec<Option<Registration>>,
    /// One per Start transition; `None` when the start was refused.
    runs: Vec<Option<Run>>,
    disposed: Vec<bool>,
    /// The first outcome seen per run.
    outcomes: HashMap<usize, Result<RunResult, SubagentError>>,
    events: EventStream,
    started: HashSet<u64>,
    ended: HashSet<u64>,
    listeners: Vec<ListenerHandle>,
    shut_down: bool,
}

fn build() -> Sut {
    let home = tempfile::tempdir().unwrap();
    let runtime = Runtime::builder()
        .workers(2)
        .home(home.path())
        .cancel_grace(Duration::from_millis(50))
        .dispose_timeout(Duration::from_millis(200))
        .shutdown_phase_timeout(Duration::from_millis(500))
        .build()
        .unwrap();
    let subagents = runtime.subagents();
    let events = subagents.subscribe();
    let slow = ScriptedModel::new().script(ScriptMatch::Any, vec![Step::text("done").after(Duration::from_millis(3))]);
    let chaos = ChaosSchedule::new()
        .rule(ChaosStage::Launch, ChaosFault::Error, 0.1)
        .rule(ChaosStage::Launch, ChaosFault::Panic, 0.05)
        .rule(ChaosStage::Run, ChaosFault::Hang, 0.1)
        .rule(ChaosStage::Run, ChaosFault::Panic, 0.1)
        .rule(ChaosStage::Run, ChaosFault::Crash, 0.1)
        .rule(ChaosStage::Dispose, ChaosFault::Error, 0.1)
        .rule(ChaosStage::Dispose, ChaosFault::Hang, 0.05)
        .rule(ChaosStage::Progress, ChaosFault::DuplicateProgress, 0.3);
    let providers: Vec<Box<dyn FnOnce() -> Registration>> = vec![
        Box::new({
            let s = subagents.clone();
            move || s.register_provider(MockProvider::new("mock").with_delay(Duration::from_millis(2))).unwrap()
        }),
        Box::new({
            let s = subagents.clone();
            move || s.register_provider(InProcessProvider::spawn("spawn", Arc::new(slow)).in_memory()).unwrap()
        }),
        Box::new({
            let s = subagents.clone();
            let inner = MockProvider::new("inner").with_delay(Duration::from_millis(2));
            move || s.register_provider(ChaosProvider::new("chaos", inner, chaos, 99)).unwrap()
        }),
        Box::new({
            let s = subagents.clone();
            let crashy = MockProvider::new("crashy")
                .with_delay(Duration::from_millis(2))
                .with_fault(FaultStage::MidRun, Fault::Crash);
            move || s.register_provider(crashy).unwrap()
        }),
    ];
    let registrations = providers.into_iter().map(|register| Some(register())).collect();
    Sut {
        runtime: Some(runtime),
        subagents,
        _home: home,
        registrations,
        runs: Vec::new(),
        disposed: Vec::new(),
        outcomes: HashMap::new(),
        events,
        started: HashSet::new(),
        ended: HashSet::new(),
        listeners: Vec::new(),
        shut_down: false,
    }
}

impl Sut {
    /// Runs `future` on the runtime's worker, or — once it is shut down —
    /// as a foreign caller would.
    fn block_on<F>(&self, future: F) -> F::Output
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.runtime {
            Some(runtime) => runtime.block_on(future),
            None => tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(future),
        }
    }

    fn live_undisposed(&self) -> usize {
        self.runs.iter().zip(&self.disposed).filter(|(run, disposed)| run.is_some() && !**disposed).count()
    }
}

impl StateMachineTest for Sut {
    type SystemUnderTest = Sut;
    type Reference = Machine;

    fn init_test(_: &Model) -> Sut {
        build()
    }

    fn apply(mut sut: Sut, model: &Model, transition: Transition) -> Sut {
        match transition {
            Transition::Start(p) => {
                let subagents = sut.subagents.clone();
                let request = StartRequest::new("task", Parent::root(std::env::temp_dir()), CancellationToken::new());
                let started = sut.block_on(async move { subagents.start(PROVIDERS[p], request).await });
                match &started {
                    Err(error) if model.shut_down => assert_eq!(error.code(), "RUNTIME_STOPPED"),
                    Err(error) if !model.registered[p] => assert_eq!(error.code(), "NO_PROVIDER"),
                    Err(error) => assert_eq!(error.code(), "STARTUP_FAILED", "{error}"),
                    Ok(_) => assert!(model.registered[p] && !model.shut_down, "a start succeeded where it must not"),
                }
                sut.runs.push(started.ok());
                sut.disposed.push(false);
            }
            Transition::Message(n) => {
                if let Some(steering) = sut.runs[n].as_ref().and_then(Run::steering) {
                    // Delivered or refused (the run ended): either way, no panic.
                    let _ = sut.block_on(async move { steering.send("note").await });
                }
            }
            Transition::Cancel(n) => {
                if let Some(run) = &sut.runs[n] {
                    run.cancel();
                }
            }
            Transition::Dispose(n) => {
                if let Some(run) = sut.runs[n].take() {
                    // Err(DISPOSE_FAILED) is a fault the chaos provider injects;
                    // quiescence is promised either way.
                    let _ = sut.block_on(async move {
                        let disposed = run.dispose().await;
                        (disposed, run)
                    });
                    sut.disposed[n] = true;
                    sut.runs[n] = None;
                    let live = sut.subagents.live();
                    assert!(live.runs <= sut.live_undisposed(), "a disposed run is still live: {live:?}");
                }
            }
            Transition::RemoveProvider(p) => {
                if let Some(registration) = sut.registrations[p].take() {
                    registration.remove();
                }
            }
            Transition::PanickingListener => {
                sut.listeners.push(sut.subagents.add_listener(|_: &SubagentEvent| -> () { panic!("listener bug") }));
            }
            Transition::Shutdown => {
                let shutdown = sut.runtime.take().expect("shut down once").shutdown_blocking();
                assert!(shutdown.live_after.is_quiescent(), "{:?}", shutdown.live_after);
                sut.shut_down = true;
            }
        }
        observe(&mut sut);
        check_pairs(&mut sut);
        sut
    }

    fn check_invariants(sut: &Sut, _: &Model) {
        if sut.shut_down {
            let live = sut.subagents.live();
            assert!(live.is_quiescent(), "after shutdown: {live:?}");
        }
    }

    fn teardown(mut sut: Sut, _: Model) {
        let runs: Vec<Run> = sut.runs.drain(..).flatten().collect();
        if let Some(runtime) = sut.runtime.take() {
            runtime.block_on(async move {
                for run in &runs {
                    let _ = run.dispose().await;
                }
            });
            let report = runtime.shutdown_blocking();
            assert!(report.live_after.is_quiescent(), "{:?}", report.live_after);
        }
        check_pairs(&mut sut);
    }
}

/// One terminal outcome per run: the first seen never changes.
fn observe(sut: &mut Sut) {
    for (n, run) in sut.runs.iter().enumerate() {
        let Some(run) = run else { continue };
        let Some(now) = run.result().now_or_never() else { continue };
        match sut.outcomes.get(&n) {
            Some(first) => assert_eq!(&now, first, "run {n} changed its outcome"),
            None => {
                sut.outcomes.insert(n, now);
            }
        }
    }
}

/// Every End pairs with an earlier Start; one of each per run.
fn check_pairs(sut: &mut Sut) {
    while let Some(event) = sut.events.try_recv() {
        let Ok(event) = event else { continue };
        match event {
            SubagentEvent::Start(info) => assert!(sut.started.insert(info.run_id), "two Starts for {}", info.run_id),
            SubagentEvent::End(end) => {
                assert!(sut.started.contains(&end.run_id), "End before Start for {}", end.run_id);
                assert!(sut.ended.insert(end.run_id), "two Ends for {}", end.run_id);
            }
            _ => {}
        }
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(24)
}

prop_state_machine! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn run_lifecycles_keep_their_promises_under_random_operations(sequential 1..24 => Sut);
}
