//! The one home of the integration tests' helpers, and the watchdog that
//! every test binary runs. Each binary is a `suite_*.rs` root that names
//! this module once and its test files as modules (see `suite_core.rs`);
//! a helper two files need lives here, not beside them.
//!
//! Waits on runs, processes and brokers have bounds of their own
//! ([`Within`], [`output_within`], [`eventually`], [`blocking`]); the
//! watchdog ends a binary in which no test starts or ends for
//! [`STALL_LIMIT`], or that runs past [`BINARY_LIMIT`], naming the tests
//! still running, so no wait without a bound can hang the suite.
#![allow(dead_code)]

#[cfg(feature = "openai")]
pub mod adapters;
pub mod env;
pub mod line_peer;
pub mod loopback;
pub mod pty;
pub mod small_disk;

use std::path::Path;
use std::time::Duration;

use subagents::{CancellationToken, Parent, RunResult, Runtime, StartRequest, Subagents};

/// A small runtime with short graces so fault tests stay fast.
pub fn runtime() -> Runtime {
    Runtime::builder()
        .workers(2)
        .home(std::env::temp_dir().join("subagents-tests"))
        .cancel_grace(Duration::from_millis(100))
        .dispose_timeout(Duration::from_millis(300))
        .shutdown_phase_timeout(Duration::from_millis(500))
        .build()
        .expect("runtime builds")
}

pub fn request(prompt: &str) -> StartRequest {
    StartRequest::new(prompt, Parent::root("/tmp"), CancellationToken::new())
}

pub fn request_with(prompt: &str, signal: CancellationToken) -> StartRequest {
    StartRequest::new(prompt, Parent::root("/tmp"), signal)
}

/// A request whose parent works in `cwd`.
pub fn request_in(prompt: &str, cwd: &Path) -> StartRequest {
    StartRequest::new(prompt, Parent::root(cwd), CancellationToken::new())
}

/// Poll `condition` until it holds or `within` passes.
pub async fn eventually(within: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + within;
    while std::time::Instant::now() < deadline {
        if condition() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    condition()
}

/// The same waits for tests that hold no async context: they block the
/// test's thread between polls.
pub mod blocking {
    use std::time::{Duration, Instant};

    /// Poll `condition` until it holds or `within` passes.
    pub fn eventually(within: Duration, mut condition: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if condition() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        condition()
    }

    /// Poll `condition` until it holds, or fail the test after `within`
    /// saying what it waited for.
    pub fn wait_until(within: Duration, what: &str, mut condition: impl FnMut() -> bool) {
        assert!(eventually(within, &mut condition), "waited {within:?} for {what}");
    }
}

/// Each tool result among `events`, in order, as `(tool, content, is_error)`.
#[cfg(feature = "agent")]
pub fn tool_results(events: &[subagents::agent::SessionEvent]) -> Vec<(String, String, bool)> {
    events
        .iter()
        .filter_map(|event| match event {
            subagents::agent::SessionEvent::ToolResult { name, content, is_error, .. } => {
                Some((name.clone(), content.clone(), *is_error))
            }
            _ => None,
        })
        .collect()
}

/// Live (non-zombie) processes whose command line mentions `marker`, as
/// `(pid, command line)`: a test's children all carry its temporary dir.
pub fn processes_mentioning(marker: &Path) -> Vec<(u32, String)> {
    let marker = marker.display().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let zombie = stat.rfind(')').is_some_and(|i| stat[i + 1..].trim_start().starts_with('Z'));
            (cmdline.contains(&marker) && !zombie).then_some((pid, cmdline))
        })
        .collect()
}

/// No live process mentions `marker`.
pub fn no_process_mentions(marker: &Path) {
    let survivors = processes_mentioning(marker);
    assert!(survivors.is_empty(), "child processes survived: {survivors:?}");
}

/// `runtime.live()` counts no run, actor or process.
/// The conformance kit over a child process that serves this crate's own
/// agent (whose `[delay:5000]` prompt keeps a run going): every rule kept,
/// every one exercised, and no process left that mentions `cwd`.
#[cfg(feature = "testing")]
pub fn passes_the_kit_with_a_slow_prompt(kit: subagents::testing::Conformance, cwd: &Path) {
    let report = kit.cwd(cwd).long_prompt("Say hello. [delay:5000]").concurrent_runs(4).run_blocking();
    report.assert_conformant();
    assert_eq!(report.with_verdict(subagents::testing::Verdict::NotExercised).count(), 0, "{report}");
    no_process_mentions(cwd);
}

pub fn no_children_left(runtime: &Runtime) {
    let live = runtime.live();
    assert_eq!(live.processes, 0, "{live:?}");
    assert!(live.is_quiescent(), "{live:?}");
}

/// A runtime at `home` with graces suited to real child processes.
pub fn runtime_at(home: &Path) -> Runtime {
    Runtime::builder()
        .workers(2)
        .home(home)
        .cancel_grace(Duration::from_millis(300))
        .dispose_timeout(Duration::from_secs(10))
        .build()
        .expect("runtime builds")
}

/// A runtime at `home` with graces suited to in-process children.
pub fn in_process_runtime(home: &Path) -> Runtime {
    Runtime::builder()
        .workers(2)
        .home(home)
        .cancel_grace(Duration::from_millis(200))
        .dispose_timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// Start on `provider`, collect the result, dispose.
pub fn lifecycle(runtime: &Runtime, subagents: &Subagents, provider: &str, request: StartRequest) -> RunResult {
    let (subagents, provider) = (subagents.clone(), provider.to_owned());
    let what = format!("a run on {provider:?} to start, settle and dispose");
    runtime.within(WAIT_LIMIT, &what, async move {
        let run = subagents.start(&provider, request).await.unwrap();
        let result = run.result().await.unwrap();
        run.dispose().await.unwrap();
        result
    })
}

/// The longest a test waits on runs, processes or a broker before it fails
/// saying what it waited for: generous for a loaded two-core machine, far
/// short of a hang.
pub const WAIT_LIMIT: Duration = Duration::from_secs(120);

/// Bounded waits on a [`Runtime`]: a test never hangs on a run that never
/// settles, it fails naming what it waited for.
pub trait Within {
    /// [`Runtime::block_on`], failing the test once `limit` passes.
    fn within<F>(&self, limit: Duration, what: &str, work: F) -> F::Output
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static;
}

impl Within for Runtime {
    fn within<F>(&self, limit: Duration, what: &str, work: F) -> F::Output
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match self.block_on(async move { tokio::time::timeout(limit, work).await }) {
            Ok(output) => output,
            Err(_) => panic!("waited more than {limit:?} for {what}"),
        }
    }
}

/// [`std::process::Command::output`] with a bound: past `limit` the child is
/// killed and the test fails naming what it waited for and what the child
/// had printed. Standard input is empty, as with `output()`.
pub fn output_within(command: &mut std::process::Command, limit: Duration, what: &str) -> std::process::Output {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("could not start {what}: {error}"));
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = stderr.join().unwrap_or_default();
            panic!("waited more than {limit:?} for {what}; its stderr: {}", String::from_utf8_lossy(&stderr));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    std::process::Output { status, stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() }
}

/// The longest a test binary may go without a thread starting or ending
/// (each test runs on a thread of its own): far past the slowest test on a
/// loaded two-core machine, far short of a hang. A binary holds many
/// files' tests, so its whole run is not the bound; a hung test stops the
/// churn once its neighbours are done.
pub const STALL_LIMIT: Duration = Duration::from_secs(600);

/// The longest one test binary may run at all, the backstop for a hang
/// that keeps starting threads.
pub const BINARY_LIMIT: Duration = Duration::from_secs(3600);

// Runs `start_watchdog` as the binary loads, before the test harness's main,
// so every test binary that includes this module is watched without any
// test opting in (an `.init_array` entry, as a C constructor).
#[cfg(target_os = "linux")]
#[used]
#[link_section = ".init_array"]
static START_WATCHDOG: extern "C" fn() = start_watchdog;

extern "C" fn start_watchdog() {
    let _ = std::thread::Builder::new().name("watchdog".into()).spawn(|| {
        let started = std::time::Instant::now();
        let (mut running, mut changed) = (running_tests(), started);
        loop {
            std::thread::sleep(Duration::from_secs(1));
            let now = std::time::Instant::now();
            let threads = running_tests();
            if threads != running {
                (running, changed) = (threads, now);
            }
            let stalled = now - changed > STALL_LIMIT;
            if stalled || now - started > BINARY_LIMIT {
                let why = if stalled {
                    format!("no test started or ended for {STALL_LIMIT:?}")
                } else {
                    format!("this test binary ran past {BINARY_LIMIT:?}")
                };
                let names: Vec<&str> = running.iter().map(|(_, name)| name.as_str()).collect();
                eprintln!(
                    "{why}, so some wait has no bound; still running (test names, cut to 15 characters): {names:?}"
                );
                std::process::exit(101);
            }
        }
    });
}

/// This process's threads but the main thread and the watchdog, as
/// `(thread id, name)`: the test harness runs each test on a thread named
/// after the test.
fn running_tests() -> std::collections::BTreeSet<(String, String)> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Default::default() };
    let main = std::process::id().to_string();
    tasks
        .flatten()
        .filter_map(|task| {
            let id = task.file_name().to_str()?.to_owned();
            let name = std::fs::read_to_string(task.path().join("comm")).ok()?.trim().to_owned();
            Some((id, name))
        })
        .filter(|(id, name)| *id != main && name != "watchdog" && !name.starts_with("tokio") && !name.is_empty())
        .collect()
}

/// The most runs of `subagents` alive at once since this was made, as its
/// events count them (Start up, End down); keep the handle while counting.
pub fn peak_running(subagents: &Subagents) -> (subagents::events::ListenerHandle, impl Fn() -> usize) {
    use std::sync::{Arc, Mutex};
    let running = Arc::new(Mutex::new((0usize, 0usize)));
    let counted = running.clone();
    let listener = subagents.add_listener(move |event: &subagents::SubagentEvent| {
        let mut running = counted.lock().unwrap();
        match event {
            subagents::SubagentEvent::Start(_) => running.0 += 1,
            subagents::SubagentEvent::End(_) => running.0 -= 1,
            _ => return,
        }
        running.1 = running.1.max(running.0);
    });
    (listener, move || running.lock().unwrap().1)
}
