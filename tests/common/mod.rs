//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::time::Duration;

use subagents::{CancellationToken, Parent, Runtime, StartRequest};

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
