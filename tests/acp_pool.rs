//! The `acp` provider's warm pool (`Reuse::Pooled`), against our own
//! `subagents acp` as the agent: processes are reused and counted in
//! `/proc`, every run gets a fresh session, a dead process is replaced, idle
//! ones are reaped, a cancelled run leaves the pool usable, and nothing is
//! left after provider removal or runtime shutdown. Shell stand-ins
//! (`acp/stand_ins.rs`) play an agent that never answers and one that
//! ignores stdin EOF, whose drain takes the idle EOF grace.

use crate::common;
use crate::stand_ins;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::blocking::eventually;
use common::{no_children_left, no_process_mentions, processes_mentioning, request_in, runtime_at as runtime};
use stand_ins::{ignores_eof, logged, logged_at, shell_agent};
use subagents::providers::{AcpConfig, AcpProvider, PoolConfig, Reuse};
use subagents::{Runtime, ScopedRegistration, StopReason, Subagents};

/// Our own binary as a pooled ACP agent, its home (and so its command line)
/// under `home`.
fn pooled_agent(home: &Path, pool: PoolConfig) -> AcpConfig {
    let args = vec!["acp".to_owned(), "--home".to_owned(), agent_home(home).display().to_string()];
    let mut config = AcpConfig::new("pooled", env!("CARGO_BIN_EXE_subagents"), args);
    config.dispose_eof_grace = Duration::from_secs(5);
    config.reuse = Reuse::Pooled(pool);
    config
}

fn agent_home(home: &Path) -> PathBuf {
    home.join("agent-home")
}

fn register(runtime: &Runtime, config: AcpConfig) -> (Subagents, ScopedRegistration) {
    let subagents = runtime.subagents();
    let provider = runtime.block_on(async move { AcpProvider::new(config).await.unwrap() });
    let registration = subagents.register_provider(provider).unwrap().scoped();
    (subagents, registration)
}

/// The agent processes of this test (their command line names its home).
fn agent_pids(home: &Path) -> BTreeSet<u32> {
    processes_mentioning(&agent_home(home)).into_iter().map(|(pid, _)| pid).collect()
}

/// One start → result → dispose; the run's child id and its answer text.
fn lifecycle(runtime: &Runtime, subagents: &Subagents, prompt: &str, cwd: &Path) -> (String, StopReason, String) {
    let (subagents, request) = (subagents.clone(), request_in(prompt, cwd));
    runtime.block_on(async move {
        let run = subagents.start("pooled", request).await.unwrap();
        let result = run.result().await.unwrap();
        run.dispose().await.unwrap();
        (run.child_id().to_owned(), result.stop_reason, result.text())
    })
}

fn cold_pool() -> PoolConfig {
    PoolConfig { size: 0, ..PoolConfig::default() }
}

/// Every file under `dir`, recursively, with its text.
fn files_under(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if let Ok(text) = std::fs::read_to_string(&path) {
                found.push((path, text));
            }
        }
    }
    found
}

#[test]
fn pooled_runs_reuse_one_process_and_each_gets_a_fresh_session() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let (subagents, registration) = register(&runtime, pooled_agent(home.path(), cold_pool()));
    let mut pids = BTreeSet::new();
    let mut ids = BTreeSet::new();
    for task in ["alpha task", "bravo task", "charlie task", "delta task"] {
        let (id, stop, text) = lifecycle(&runtime, &subagents, task, home.path());
        assert_eq!((stop, text), (StopReason::Completed, format!("handled: {task}")), "only this run's answer");
        ids.insert(id);
        pids.extend(agent_pids(home.path()));
    }
    assert_eq!(pids.len(), 1, "four runs, one pooled process: {pids:?}");
    assert_eq!(ids.len(), 4, "a fresh session (and child id) per run: {ids:?}");
    // The agent keeps each session on disk: none holds another run's task.
    let sessions: Vec<_> =
        files_under(&agent_home(home.path())).into_iter().filter(|(_, text)| text.contains(" task")).collect();
    assert!(sessions.len() >= 4, "one session file per run: {sessions:?}");
    for (path, text) in &sessions {
        let tasks =
            ["alpha", "bravo", "charlie", "delta"].iter().filter(|t| text.contains(&format!("{t} task"))).count();
        assert_eq!(tasks, 1, "{} holds exactly one run's conversation", path.display());
    }
    drop(registration);
    assert!(eventually(Duration::from_secs(10), || agent_pids(home.path()).is_empty()), "removal drains the pool");
    runtime.shutdown_blocking();
}

#[test]
fn concurrent_sessions_share_a_process_when_allowed_and_keep_their_own_answers() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let pool = PoolConfig { sessions_per_process: 2, ..cold_pool() };
    let (subagents, _registration) = register(&runtime, pooled_agent(home.path(), pool));
    let cwd = home.path().to_owned();
    let answers = runtime.block_on(async move {
        let first = subagents.start("pooled", request_in("[delay:400] first", &cwd)).await.unwrap();
        let second = subagents.start("pooled", request_in("[delay:400] second", &cwd)).await.unwrap();
        let results = (first.result().await.unwrap().text(), second.result().await.unwrap().text());
        first.dispose().await.unwrap();
        second.dispose().await.unwrap();
        results
    });
    assert_eq!(answers, ("handled: [delay:400] first".to_owned(), "handled: [delay:400] second".to_owned()));
    assert_eq!(agent_pids(home.path()).len(), 1, "two live sessions on one process");
    runtime.shutdown_blocking();
}

#[test]
fn a_killed_pooled_process_is_replaced_by_a_fresh_one() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let (subagents, _registration) = register(&runtime, pooled_agent(home.path(), cold_pool()));
    lifecycle(&runtime, &subagents, "before", home.path());
    let before = agent_pids(home.path());
    assert_eq!(before.len(), 1);
    let killed = *before.first().unwrap();
    std::process::Command::new("kill").args(["-9", &killed.to_string()]).status().unwrap();
    assert!(eventually(Duration::from_secs(5), || !agent_pids(home.path()).contains(&killed)));
    let (_, stop, text) = lifecycle(&runtime, &subagents, "after", home.path());
    assert_eq!((stop, text.as_str()), (StopReason::Completed, "handled: after"), "the dead process is not handed out");
    let after = agent_pids(home.path());
    assert_eq!(after.len(), 1, "{after:?}");
    assert_ne!(after.first(), Some(&killed), "a new process took its place");
    assert_eq!(runtime.live().processes, 1, "the dead one is no longer counted");
    runtime.shutdown_blocking();
}

#[test]
fn idle_processes_beyond_size_are_reaped_and_size_stay_warm() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let pool = PoolConfig { size: 1, idle_timeout: Duration::from_millis(300), ..PoolConfig::default() };
    let (subagents, _registration) = register(&runtime, pooled_agent(home.path(), pool));
    let cwd = home.path().to_owned();
    runtime.block_on(async move {
        let mut runs = Vec::new();
        for task in ["[delay:300] a", "[delay:300] b", "[delay:300] c"] {
            runs.push(subagents.start("pooled", request_in(task, &cwd)).await.unwrap());
        }
        for run in &runs {
            assert_eq!(run.result().await.unwrap().stop_reason, StopReason::Completed);
            run.dispose().await.unwrap();
        }
    });
    assert!(agent_pids(home.path()).len() >= 3, "three concurrent runs, three processes");
    assert!(
        eventually(Duration::from_secs(10), || agent_pids(home.path()).len() == 1),
        "reaped down to size: {:?}",
        agent_pids(home.path())
    );
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(agent_pids(home.path()).len(), 1, "the warm one stays past idle_timeout");
    assert_eq!(runtime.live().processes, 1);
    runtime.shutdown_blocking();
}

#[test]
fn a_cancelled_run_leaves_its_pooled_process_idle_for_the_next_run() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let (subagents, _registration) = register(&runtime, pooled_agent(home.path(), cold_pool()));
    let (cwd, pooled) = (home.path().to_owned(), subagents.clone());
    let stop = runtime.block_on(async move {
        let run = pooled.start("pooled", request_in("[slow] never finishes", &cwd)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        run.cancel();
        let stop = run.result().await.unwrap().stop_reason;
        run.dispose().await.unwrap();
        stop
    });
    assert_eq!(stop, StopReason::Aborted);
    let before = agent_pids(home.path());
    assert_eq!(before.len(), 1, "the process answered the cancel and went back to the pool");
    let began = Instant::now();
    let (_, stop, text) = lifecycle(&runtime, &subagents, "next", home.path());
    assert_eq!((stop, text.as_str()), (StopReason::Completed, "handled: next"), "no stale prompt in the way");
    assert!(began.elapsed() < Duration::from_secs(10));
    assert_eq!(agent_pids(home.path()), before, "the same process served the next run");
    runtime.shutdown_blocking();
}

/// A shell agent that answers `initialize` and one `session/new`, then
/// reads prompts and never answers them (nor `session/cancel`).
fn deaf_agent(dir: &Path) -> AcpConfig {
    let mut config = shell_agent(dir, "deaf-agent", "while read -r line; do :; done");
    config.name = "pooled".to_owned();
    config.reuse = Reuse::Pooled(PoolConfig { cancel_grace: Duration::from_millis(300), ..cold_pool() });
    config
}

#[test]
fn a_prompt_unanswered_past_the_cancel_grace_retires_its_process() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let (subagents, _registration) = register(&runtime, deaf_agent(home.path()));
    let cwd = home.path().to_owned();
    let stop = runtime.block_on(async move {
        let run = subagents.start("pooled", request_in("anything", &cwd)).await.unwrap();
        run.cancel();
        let stop = run.result().await.unwrap().stop_reason;
        run.dispose().await.unwrap();
        stop
    });
    assert_eq!(stop, StopReason::Aborted, "settled by the runtime's cancel grace");
    assert!(
        eventually(Duration::from_secs(5), || processes_mentioning(&home.path().join("deaf-agent")).is_empty()),
        "a process still busy with a stale prompt is not pooled: it is disposed"
    );
    no_children_left(&runtime);
    runtime.shutdown_blocking();
}

#[test]
fn provider_removal_drains_the_warm_pool() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let (subagents, registration) = register(&runtime, pooled_agent(home.path(), PoolConfig::default()));
    lifecycle(&runtime, &subagents, "one", home.path());
    // The run's process came back, and two more were warmed behind it.
    assert!(
        eventually(Duration::from_secs(10), || agent_pids(home.path()).len() == 3),
        "size 2 kept warm: {:?}",
        agent_pids(home.path())
    );
    assert_eq!(runtime.live().processes, 3, "pooled processes count as live");
    drop(registration);
    assert!(eventually(Duration::from_secs(10), || agent_pids(home.path()).is_empty()), "drained at removal");
    assert!(eventually(Duration::from_secs(2), || runtime.live().processes == 0));
    no_children_left(&runtime);
    runtime.shutdown_blocking();
}

#[test]
fn runtime_shutdown_drains_the_warm_pool() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let (subagents, registration) = register(&runtime, pooled_agent(home.path(), PoolConfig::default()));
    registration.keep();
    lifecycle(&runtime, &subagents, "one", home.path());
    assert!(
        eventually(Duration::from_secs(10), || agent_pids(home.path()).len() == 3),
        "size 2 kept warm: {:?}",
        agent_pids(home.path())
    );
    let report = runtime.shutdown_blocking();
    assert!(report.phases.iter().all(|phase| !phase.timed_out), "{report:?}");
    no_process_mentions(&agent_home(home.path()));
}

#[test]
fn a_drained_pool_disposes_an_idle_agent_that_ignores_eof_within_a_second() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let mut config = ignores_eof(home.path(), "deaf-to-eof");
    config.name = "pooled".to_owned();
    config.reuse = Reuse::Pooled(cold_pool());
    let (subagents, registration) = register(&runtime, config);
    let (_, stop, text) = lifecycle(&runtime, &subagents, "work", home.path());
    assert_eq!((stop, text.as_str()), (StopReason::Completed, "done"));
    // The script's own forks (before `cat` execs) carry its command line
    // for an instant: wait for the one idle process.
    let idle = || processes_mentioning(&home.path().join("deaf-to-eof")).len() == 1;
    assert!(eventually(Duration::from_secs(10), idle), "back in the pool, idle");
    let began = Instant::now();
    drop(registration);
    let gone =
        eventually(Duration::from_secs(10), || processes_mentioning(&home.path().join("deaf-to-eof")).is_empty());
    let took = began.elapsed();
    assert!(gone && took < Duration::from_millis(1_500), "an idle pooled agent takes the idle grace: {took:?}");
    let (eof, term) = (logged_at(home.path(), "deaf-to-eof", "eof"), logged_at(home.path(), "deaf-to-eof", "sigterm"));
    assert!(eof.is_some() && term.is_some(), "it ignored EOF until SIGTERM: {:?}", logged(home.path(), "deaf-to-eof"));
    assert!(eventually(Duration::from_secs(2), || runtime.live().processes == 0));
    no_children_left(&runtime);
    runtime.shutdown_blocking();
}
