//! Helpers shared by the integration tests.
#![allow(dead_code)]

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
    runtime.block_on(async move {
        let run = subagents.start(&provider, request).await.unwrap();
        let result = run.result().await.unwrap();
        run.dispose().await.unwrap();
        result
    })
}
