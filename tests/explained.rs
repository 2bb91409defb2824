//! docs/contract.md §2 `Diagnostic`: every failure explained. A failed
//! run's diagnostic keeps our fixed wording (`category`, `reason`) and
//! carries the child's own account as `detail`, bounded and made safe: an
//! ACP agent's error answer, its exit and the tail of its stderr (the
//! values of the environment its provider set replaced), a process child's
//! likewise, a contained panic's message; a child that outlived its cancel
//! grace is `timed-out`. Shell stand-ins and our own binary, real
//! processes; `fanout` shows the reason on its lines and keeps
//! dependencies' log lines and contained panics off stderr.

use crate::common;
use crate::stand_ins;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{lifecycle, no_children_left, request_in, runtime_at as runtime};
use serde_json::Value;
use stand_ins::shell_agent;
use subagents::providers::{AcpConfig, AcpProvider, Fault, FaultStage, MockProvider, ProcessConfig, ProcessProvider};
use subagents::seam::{Category, Diagnostic};
use subagents::{RunResult, Runtime, StopReason};

fn register_acp(runtime: &Runtime, config: AcpConfig) {
    let provider = runtime.block_on(async move { AcpProvider::new(config).await.unwrap() });
    runtime.subagents().register_provider(provider).unwrap().keep();
}

fn diagnostic(result: &RunResult) -> &Diagnostic {
    result.diagnostic.as_ref().unwrap_or_else(|| panic!("a failure carries a diagnostic: {result:?}"))
}

fn detail(result: &RunResult) -> &str {
    diagnostic(result).detail.as_deref().unwrap_or_else(|| panic!("a detail: {result:?}"))
}

#[test]
fn an_acp_agents_error_answer_is_the_detail_with_its_code_message_and_data() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let then = r#"take
printf '{"jsonrpc":"2.0","id":%s,"error":{"code":-32603,"message":"Internal error","data":"stream error: connection refused (os error 111)"}}\n' "$id"
cat > /dev/null"#;
    register_acp(&runtime, shell_agent(home.path(), "refused", then));
    let result = lifecycle(&runtime, &runtime.subagents(), "refused", request_in("go", home.path()));
    assert_eq!(result.stop_reason, StopReason::Error);
    assert_eq!(diagnostic(&result).category, Category::ChildError);
    let detail = detail(&result);
    assert!(detail.contains("-32603") && detail.contains("Internal error"), "{detail}");
    assert!(detail.contains("connection refused (os error 111)"), "its data: {detail}");
    no_children_left(&runtime);
}

#[test]
fn an_acp_agent_that_dies_says_how_it_exited_and_its_last_stderr_lines_without_secrets_or_escapes() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let then = r#"take
echo "starting with key $MODEL_API_KEY" >&2
printf 'fatal: bubblewrap is unavailable\033]0;pwned\007 here\n' >&2
exit 7"#;
    let mut config = shell_agent(home.path(), "dies", then);
    config.env.push(("MODEL_API_KEY".to_owned(), "sk-test-very-secret".to_owned()));
    register_acp(&runtime, config);
    let result = lifecycle(&runtime, &runtime.subagents(), "dies", request_in("go", home.path()));
    assert_eq!(result.stop_reason, StopReason::Error);
    assert_eq!(diagnostic(&result).category, Category::ChildCrashed);
    let detail = detail(&result);
    assert!(detail.contains("exited with status 7"), "{detail}");
    assert!(detail.contains("fatal: bubblewrap is unavailable here"), "stderr, escape gone: {detail}");
    assert!(detail.contains("starting with key [redacted]"), "{detail}");
    assert!(!detail.contains("sk-test-very-secret") && !detail.contains('\u{1b}'), "{detail}");
    assert!(detail.len() <= Diagnostic::MAX_DETAIL_BYTES + '…'.len_utf8(), "{}", detail.len());
    no_children_left(&runtime);
}

#[test]
fn a_flood_of_stderr_is_cut_to_a_bounded_detail() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let then = "take\nhead -c 3000000 /dev/zero | tr '\\0' 'x' >&2\necho >&2\nexit 1";
    register_acp(&runtime, shell_agent(home.path(), "floods", then));
    let result = lifecycle(&runtime, &runtime.subagents(), "floods", request_in("go", home.path()));
    let detail = detail(&result);
    assert!(detail.starts_with("exited with status 1; stderr: xxx") && detail.ends_with('…'), "{detail:.80}");
    assert!(detail.len() <= Diagnostic::MAX_DETAIL_BYTES + '…'.len_utf8(), "{}", detail.len());
    no_children_left(&runtime);
}

#[test]
fn a_wrong_program_as_the_acp_agent_is_refused_saying_what_it_did() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let probe = |command: &str, args: &[&str]| {
        let config = AcpConfig::new("wrong", command, args.iter().map(|a| a.to_string()).collect());
        runtime.block_on(async move { AcpProvider::new(config).await.unwrap_err().to_string() })
    };
    let exits = probe("false", &[]);
    assert!(exits.contains("exited with status 1"), "{exits}");
    let echoes = probe("cat", &[]);
    assert!(echoes.contains("-32601") && echoes.contains("Method not found"), "{echoes}");
    let complains = probe("sh", &["-c", "echo 'codex: unknown flag --acp' >&2; exit 2"]);
    assert!(complains.contains("exited with status 2") && complains.contains("unknown flag --acp"), "{complains}");
}

#[test]
fn a_process_child_that_dies_at_start_says_how_it_exited_and_what_it_wrote_on_stderr() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let cwd = home.path().join("broken");
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::write(cwd.join("serve"), "echo 'error: no model route named \"fast\"' >&2\nexit 3\n").unwrap();
    let mut config = ProcessConfig::new("broken", home.path().join("children"));
    config.bin = PathBuf::from("/bin/sh");
    config.cwd = Some(cwd);
    runtime.subagents().register_provider(ProcessProvider::new(config).unwrap()).unwrap().keep();
    let subagents = runtime.subagents();
    let request = request_in("go", home.path());
    let error = runtime.block_on(async move { subagents.start("broken", request).await.unwrap_err() });
    let subagents::StartError::StartupFailed { diagnostic, .. } = &error else { panic!("{error:?}") };
    assert_eq!(diagnostic.category, Category::ChildCrashed);
    let detail = diagnostic.detail.as_deref().unwrap_or_default();
    assert!(detail.contains("exited with status 3") && detail.contains("no model route named \"fast\""), "{detail}");
    assert!(error.to_string().contains("exited with status 3"), "the error's message shows it: {error}");
    no_children_left(&runtime);
}

#[test]
fn a_child_that_ignores_cancel_past_its_grace_is_timed_out_and_a_cooperative_one_is_not() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let subagents = runtime.subagents();
    let wedged = MockProvider::new("wedged").with_fault(FaultStage::MidRun, Fault::Hang);
    subagents.register_provider(wedged).unwrap().keep();
    subagents.register_provider(MockProvider::new("waits").with_wait_for_message()).unwrap().keep();
    let cancelled = |provider: &'static str| {
        let subagents = subagents.clone();
        runtime.block_on(async move {
            let run = subagents.start(provider, common::request("work")).await.unwrap();
            run.cancel();
            let result = run.result().await.unwrap();
            let _ = run.dispose().await;
            result
        })
    };
    let wedged = cancelled("wedged");
    assert_eq!(wedged.stop_reason, StopReason::Aborted);
    assert_eq!(diagnostic(&wedged).category, Category::TimedOut);
    assert!(diagnostic(&wedged).reason.as_deref().unwrap_or_default().contains("after it was told to stop"));
    let cooperative = cancelled("waits");
    assert_eq!(cooperative.stop_reason, StopReason::Aborted);
    assert_eq!(cooperative.diagnostic, None, "a child that stopped when asked has nothing to explain");
    no_children_left(&runtime);
}

#[test]
fn a_contained_panic_carries_its_message() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let subagents = runtime.subagents();
    subagents
        .register_provider(MockProvider::new("panics").with_fault(FaultStage::MidRun, Fault::Panic))
        .unwrap()
        .keep();
    let result = lifecycle(&runtime, &subagents, "panics", common::request("work"));
    assert_eq!(result.stop_reason, StopReason::Error);
    assert_eq!(diagnostic(&result).category, Category::Panicked);
    assert_eq!(detail(&result), "mock fault: panic during the run");
}

/// `fanout` of `tasks` on the providers of `config`, in `dir`, with the
/// default log filter and no `RUST_BACKTRACE` unless `backtrace`.
fn fanout(dir: &Path, config: &str, tasks: &str, backtrace: bool) -> (Vec<Value>, String) {
    let (config_path, tasks_path) = (dir.join("subagents.toml"), dir.join("tasks.jsonl"));
    std::fs::write(&config_path, config).unwrap();
    std::fs::write(&tasks_path, tasks).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_subagents"));
    command.env_remove("SUBAGENTS_HOME").env_remove("RUST_LOG").env_remove("RUST_BACKTRACE").current_dir(dir);
    if backtrace {
        command.env("RUST_BACKTRACE", "1");
    }
    command.arg("fanout").arg(&tasks_path).arg("--config").arg(&config_path).arg("--home").arg(dir.join("home"));
    let output = common::output_within(&mut command, common::WAIT_LIMIT, "fanout");
    let lines = String::from_utf8_lossy(&output.stdout).lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    (lines, String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn fanout_shows_an_acp_childs_reason_on_its_line_and_in_its_result() {
    let dir = tempfile::tempdir().unwrap();
    let then = "take\necho 'model endpoint http://127.0.0.1:9/v1 unreachable' >&2\nexit 5";
    let agent = shell_agent(dir.path(), "dead-endpoint", then);
    let config =
        format!("[providers.agent]\nkind = \"acp\"\ncommand = \"/bin/sh\"\nargs = [{:?}]\n", agent.args[0].as_str());
    let (results, stderr) = fanout(dir.path(), &config, "{\"prompt\": \"fix it\", \"label\": \"fixer\"}\n", false);
    let detail = results[0]["diagnostic"]["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("exited with status 5") && detail.contains("unreachable"), "{results:?}");
    let line = stderr.lines().find(|l| l.starts_with("line 1: fixer: error")).unwrap_or_default();
    assert!(line.contains("child-crashed") && line.contains("127.0.0.1:9/v1 unreachable"), "{stderr}");
    assert!(!stderr.contains("WARN agent_client_protocol"), "no dependency's log line: {stderr}");
}

#[test]
fn fanout_keeps_a_contained_panic_off_stderr_unless_a_backtrace_is_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let config = "[providers.echo]\nkind = \"mock\"\n\n[providers.boom]\nkind = \"chaos\"\nwraps = \"echo\"\nseed = 1\nfaults = [{ stage = \"run\", fault = \"panic\", probability = 1.0 }]\n";
    let tasks = "{\"prompt\": \"x\", \"provider\": \"boom\"}\n";
    let (results, stderr) = fanout(dir.path(), config, tasks, false);
    assert_eq!(results[0]["diagnostic"]["category"], "panicked", "{results:?}");
    assert_eq!(results[0]["diagnostic"]["detail"], "chaos: injected panic mid-run", "{results:?}");
    assert!(stderr.contains("chaos: injected panic mid-run"), "the line says why: {stderr}");
    assert!(!stderr.contains("panicked at") && !stderr.contains("backtrace"), "{stderr}");
    let (_, asked) = fanout(dir.path(), config, tasks, true);
    assert!(asked.contains("panicked at"), "RUST_BACKTRACE asks for the hook's report: {asked}");
}

#[test]
fn a_detail_is_made_safe_again_when_read_from_a_peer() {
    let long = "x".repeat(5000);
    let json = format!(
        r#"{{"provider":"far","stage":"session-run","category":"child-error","detail":"a\u001b]0;t\u0007b\u202e {long}"}}"#
    );
    let read: Diagnostic = serde_json::from_str(&json).unwrap();
    let detail = read.detail.unwrap();
    assert!(detail.starts_with("ab x") && detail.len() <= Diagnostic::MAX_DETAIL_BYTES + 3, "{detail:.40}");
}

#[test]
fn runs_final_tree_shows_why_each_failed_child_failed() {
    let dir = tempfile::tempdir().unwrap();
    let config = "[providers.cheap]\nkind = \"spawn\"\n\n[providers.boom]\nkind = \"chaos\"\nwraps = \"cheap\"\nseed = 1\nfaults = [{ stage = \"run\", fault = \"panic\", probability = 1.0 }]\n";
    std::fs::write(dir.path().join("subagents.toml"), config).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_subagents"));
    command.env_remove("SUBAGENTS_HOME").env_remove("RUST_LOG").env_remove("RUST_BACKTRACE").current_dir(dir.path());
    command.args(["run", "review the parser; check the docs", "--provider", "boom", "--config", "subagents.toml"]);
    command.arg("--home").arg(dir.path().join("home"));
    let output = common::output_within(&mut command, common::WAIT_LIMIT, "run");
    let tree = String::from_utf8_lossy(&output.stdout);
    let failed = tree.lines().filter(|l| l.contains(": error (panicked: chaos: injected panic mid-run), ")).count();
    assert_eq!(failed, 2, "each child's line says why: {tree}");
}
