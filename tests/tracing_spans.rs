//! Runs you can trace: whatever a provider logs while its child works is
//! inside the run's span (`run{run_id, provider, parent, depth}`), so a
//! warning says which run wrote it.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use subagents::seam::{Capabilities, Child, Failure, Launch, LaunchError, LocalBoxFuture, Provider, RunResult};
use subagents::{CancellationToken, Parent, Runtime, StartRequest};

/// A provider whose child warns once while it runs.
struct Chatty;

struct ChattyChild;

impl Provider for Chatty {
    fn name(&self) -> &str {
        "chatty"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    fn launch(&self, _launch: Launch) -> LocalBoxFuture<'static, Result<Box<dyn Child>, LaunchError>> {
        Box::pin(async { Ok(Box::new(ChattyChild) as Box<dyn Child>) })
    }
}

impl Child for ChattyChild {
    fn id(&self) -> String {
        "chatty-child".to_owned()
    }

    fn run(&self) -> LocalBoxFuture<'static, RunResult> {
        Box::pin(async {
            tokio::task::yield_now().await;
            tracing::warn!("the child noticed something odd");
            RunResult::completed("done")
        })
    }

    fn dispose(&self) -> LocalBoxFuture<'static, Result<(), Failure>> {
        Box::pin(async { Ok(()) })
    }
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_warning_from_inside_a_run_names_the_run() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let home = tempfile::tempdir().unwrap();
    let runtime = Runtime::builder().workers(1).home(home.path()).build().unwrap();
    let subagents = runtime.subagents();
    subagents.register_provider(Chatty).unwrap().keep();
    let run_id = runtime.block_on(async move {
        let parent = Parent::root("/tmp").with_session("the-parent").with_depth(1);
        let run = subagents.start("chatty", StartRequest::new("go", parent, CancellationToken::new())).await.unwrap();
        run.result().await.unwrap();
        run.dispose().await.unwrap();
        run.run_id()
    });
    runtime.shutdown_blocking();
    let output = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let line = output.lines().find(|line| line.contains("the child noticed something odd")).expect("the warning");
    let span = format!(r#"run{{run_id={run_id} provider="chatty" parent="the-parent" depth=2}}"#);
    assert!(line.contains(&span), "{line}");
}
