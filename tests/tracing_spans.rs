//! Runs you can trace: whatever a provider logs while its child works is
//! inside the run's span (`run{run_id, provider, parent, depth}`), so a
//! warning says which run wrote it; and at debug each run says when it
//! started and how it ended.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use subagents::providers::MockProvider;
use subagents::seam::{Capabilities, Child, Failure, Launch, LaunchError, LocalBoxFuture, Provider, RunResult};
use subagents::{CancellationToken, Parent, Runtime, StartRequest, StopReason};

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

/// Everything logged at debug and above, by every test in this binary:
/// the subscriber is global, so each test finds its own lines by run id.
fn captured() -> &'static Captured {
    static CAPTURED: OnceLock<Captured> = OnceLock::new();
    CAPTURED.get_or_init(|| {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        captured
    })
}

fn output() -> String {
    String::from_utf8(captured().0.lock().unwrap().clone()).unwrap()
}

#[test]
fn a_warning_from_inside_a_run_names_the_run() {
    captured();
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
    let output = output();
    let line = output.lines().find(|line| line.contains("the child noticed something odd")).expect("the warning");
    let span = format!(r#"run{{run_id={run_id} provider="chatty" parent="the-parent" depth=2}}"#);
    assert!(line.contains(&span), "{line}");
}

#[test]
fn a_run_logs_one_line_as_it_starts_and_one_as_it_ends() {
    captured();
    let home = tempfile::tempdir().unwrap();
    let runtime = Runtime::builder().workers(1).home(home.path()).build().unwrap();
    let subagents = runtime.subagents();
    let mock = MockProvider::new("lifecycle-mock").with_reply("done").with_delay(Duration::from_millis(20));
    subagents.register_provider(mock).unwrap().keep();
    let (run_id, child_id) = runtime.block_on(async move {
        let parent = Parent::root("/tmp").with_session("the-parent");
        let run =
            subagents.start("lifecycle-mock", StartRequest::new("go", parent, CancellationToken::new())).await.unwrap();
        let result = run.result().await.unwrap();
        assert_eq!(result.stop_reason, StopReason::Completed);
        run.dispose().await.unwrap();
        (run.run_id(), run.child_id().to_owned())
    });
    runtime.shutdown_blocking();
    let output = output();
    let span = format!(r#"run{{run_id={run_id} provider="lifecycle-mock" parent="the-parent" depth=1}}"#);
    let ours: Vec<&str> = output.lines().filter(|line| line.contains(&span)).collect();
    let started: Vec<&&str> = ours.iter().filter(|line| line.contains("run started")).collect();
    let ended: Vec<&&str> = ours.iter().filter(|line| line.contains("run ended")).collect();
    assert_eq!(started.len(), 1, "{output}");
    assert_eq!(ended.len(), 1, "{output}");
    assert!(started[0].contains(&format!("child={child_id}")), "{}", started[0]);
    assert!(ended[0].contains(&format!("child={child_id}")), "{}", ended[0]);
    assert!(ended[0].contains(r#"stop_reason="completed""#), "{}", ended[0]);
    assert!(ended[0].contains("duration="), "{}", ended[0]);
}
