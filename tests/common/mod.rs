//! Helpers shared by the integration tests, and the watchdog that every test
//! binary including this module runs: waits on runs, processes and brokers
//! have bounds of their own ([`Within`], [`output_within`], `eventually`);
//! the watchdog ends a binary that runs past [`BINARY_LIMIT`] anyway, naming
//! the tests still running, so no wait without a bound can hang the suite.
#![allow(dead_code)]

pub mod loopback;

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

/// The longest one test binary may run: far past the slowest binary on a
/// loaded two-core machine (about a minute), far short of a hang.
pub const BINARY_LIMIT: Duration = Duration::from_secs(600);

// Runs `start_watchdog` as the binary loads, before the test harness's main,
// so every test binary that includes this module is watched without any
// test opting in (an `.init_array` entry, as a C constructor).
#[cfg(target_os = "linux")]
#[used]
#[link_section = ".init_array"]
static START_WATCHDOG: extern "C" fn() = start_watchdog;

extern "C" fn start_watchdog() {
    let _ = std::thread::Builder::new().name("watchdog".into()).spawn(|| {
        std::thread::sleep(BINARY_LIMIT);
        eprintln!(
            "this test binary ran past {BINARY_LIMIT:?}, so some wait has no bound; still running \
             (test names, cut to 15 characters): {:?}",
            running_tests()
        );
        std::process::exit(101);
    });
}

/// The names of this process's threads but the main thread and the
/// watchdog: the test harness names each test's thread after the test.
fn running_tests() -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    let main = std::process::id().to_string();
    tasks
        .flatten()
        .filter(|task| task.file_name().to_str() != Some(main.as_str()))
        .filter_map(|task| std::fs::read_to_string(task.path().join("comm")).ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| name != "watchdog" && !name.starts_with("tokio") && !name.is_empty())
        .collect()
}
