//! docs/contract.md §11.11 over the broker: a worker's child asks, the
//! question travels to the run's caller, whose approver decides, and the
//! answer comes back to exactly that child; a caller that says nothing
//! leaves the worker's child to its own timeout, a reject, and the
//! question is withdrawn on the caller's side.

use std::path::Path;
use std::sync::{Arc, Mutex};

use super::support::{broker, caller, Worker};
use crate::approvals::{asking, chosen};
use crate::common::{self, Within, WAIT_LIMIT};
use subagents::seam::{Answer, Approver, BoxFuture, PermissionRequest, Verdict};
use subagents::{CancellationToken, Parent, StartRequest, StopReason};

/// Answers `verdict` (or never, withdrawn noted) and keeps what it was asked.
#[derive(Debug, Default)]
struct Asked {
    verdict: Option<Verdict>,
    requests: Mutex<Vec<PermissionRequest>>,
    withdrawn: Arc<Mutex<bool>>,
}

impl Approver for Asked {
    fn ask(&self, request: PermissionRequest, cancel: CancellationToken) -> BoxFuture<'static, Answer> {
        self.requests.lock().unwrap().push(request);
        let (verdict, withdrawn) = (self.verdict, self.withdrawn.clone());
        if verdict.is_none() {
            // Asked and never answered: the asker gives up on it, and says so.
            tokio::spawn(async move {
                cancel.cancelled().await;
                *withdrawn.lock().unwrap() = true;
            });
        }
        Box::pin(async move {
            match verdict {
                Some(verdict) => Answer::new(verdict, "the caller's test"),
                None => std::future::pending().await,
            }
        })
    }
}

/// A worker whose runs are an ACP `asker` asking about `cargo test`.
fn asking_worker(dir: &Path, url: &str, extra: &str) -> Worker {
    let asker = asking(dir, "asker", &[("execute", "cargo test")]);
    let config = dir.join("worker.toml");
    let provider = format!(
        "[providers.asker]\nkind = \"acp\"\ncommand = \"/bin/sh\"\nargs = [{script:?}]\npermission = \"ask\"\n{extra}",
        script = asker.args[0]
    );
    std::fs::write(&config, provider).unwrap();
    let config = config.display().to_string();
    Worker::start(dir, url, "w1", &["--config", &config, "--provider", "asker"])
}

/// One run on `remote`; `before_dispose` holds once it settled.
fn run_once(runtime: &subagents::Runtime, before_dispose: impl Fn() -> bool + Send + 'static) -> subagents::RunResult {
    let subagents = runtime.subagents();
    runtime.within(WAIT_LIMIT, "a remote run that asks", async move {
        let parent = Parent::root("/tmp").with_session("parent");
        let request = StartRequest::new("work", parent, CancellationToken::new()).with_label("tests");
        let run = subagents.start("remote", request).await.unwrap();
        let result = run.result().await.unwrap();
        assert!(common::eventually(WAIT_LIMIT, before_dispose).await, "before the run is disposed");
        run.dispose().await.unwrap();
        result
    })
}

#[test]
fn a_workers_child_asks_its_caller_through_the_broker_and_gets_the_callers_answer() {
    let (_serial, dir, server) = broker();
    let _worker = asking_worker(dir.path(), &server.url(), "");
    let runtime = caller(dir.path(), &server);
    let approver = Arc::new(Asked { verdict: Some(Verdict::AllowOnce), ..Asked::default() });
    runtime.subagents().set_approver(approver.clone());
    let result = run_once(&runtime, || true);
    assert_eq!(result.stop_reason, StopReason::Completed, "{result:?}");
    assert_eq!(chosen(dir.path(), "asker"), ["yes"], "the worker's child got the caller's allow");
    let asked = approver.requests.lock().unwrap().clone();
    assert_eq!(asked.len(), 1);
    let path: Vec<(&str, Option<&str>, u32)> =
        asked[0].asker.iter().map(|hop| (hop.provider.as_str(), hop.label.as_deref(), hop.depth)).collect();
    assert_eq!(
        path,
        [("remote", Some("tests"), 1), ("asker", Some("tests"), 1)],
        "the caller's run, then the worker's"
    );
    assert_eq!(asked[0].title.as_deref(), Some("cargo test"));
    runtime.shutdown_blocking();
}

#[test]
fn a_caller_that_never_answers_leaves_the_workers_child_to_its_timeout_and_the_question_is_withdrawn() {
    let (_serial, dir, server) = broker();
    let _worker = asking_worker(dir.path(), &server.url(), "permission_timeout = \"2s\"\n");
    let runtime = caller(dir.path(), &server);
    let approver = Arc::new(Asked::default());
    runtime.subagents().set_approver(approver.clone());
    // Withdrawn by the worker, while the caller still holds the run.
    let withdrawn = approver.withdrawn.clone();
    let result = run_once(&runtime, move || *withdrawn.lock().unwrap());
    assert_eq!(result.stop_reason, StopReason::Completed, "{result:?}");
    assert_eq!(chosen(dir.path(), "asker"), ["no"], "no answer in the worker's time is a reject");
    assert_eq!(approver.requests.lock().unwrap().len(), 1, "the caller was asked");
    runtime.shutdown_blocking();
}
