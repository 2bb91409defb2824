//! docs/contract.md §7.6 `acp`, approvals: an ACP child's permission
//! request is decided by its provider's rules, or climbs to the nearest
//! approver and its answer goes back to exactly that child; no approver, no
//! answer in time, a cancel or a dispose is a reject; "allow always" holds
//! for its run only; the child gets only an option it offered; each
//! decision is in the child's transcript, saying who answered.
//!
//! The stand-in agent asks about calls it announced, and writes each
//! option id it is given (or `none` for `cancelled`) to `<dir>/<name>.chose`.

#[path = "approvals/doors.rs"]
mod doors;
#[path = "approvals/wires.rs"]
mod wires;

use crate::common;
use crate::stand_ins;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{lifecycle, no_children_left, runtime_at as runtime, Within};
use stand_ins::shell_agent;
use subagents::agent::{SessionEvent, SessionStore};
use subagents::providers::{AcpConfig, AcpProvider};
use subagents::seam::{Answer, Approver, BoxFuture, PermissionRequest, Policy, Rule, Rules, Verdict};
use subagents::{CancellationToken, Parent, Runtime, StartRequest, StopReason};

/// The options [`asking`] offers: `yes` (allow once), `always` (allow
/// always) and `no` (reject once).
const OFFERED: &str = r#"[{"optionId":"yes","name":"Allow","kind":"allow_once"},{"optionId":"always","name":"Always","kind":"allow_always"},{"optionId":"no","name":"Reject","kind":"reject_once"}]"#;

/// A stand-in that announces and asks about one call per `(kind, title)`,
/// in order, then answers its turn. Offers `yes` (allow once), `always`
/// (allow always) and `no` (reject once).
pub(crate) fn asking(dir: &Path, name: &str, calls: &[(&str, &str)]) -> AcpConfig {
    asking_with(dir, name, calls, OFFERED)
}

/// [`asking`], offering `options` (ACP's `options` array, as JSON).
pub(crate) fn asking_with(dir: &Path, name: &str, calls: &[(&str, &str)], options: &str) -> AcpConfig {
    let chose = dir.join(format!("{name}.chose"));
    let mut then = String::from("take\nprompt_id=$id\n");
    for (at, (kind, title)) in calls.iter().enumerate() {
        then.push_str(&format!(
            r#"printf '{{"jsonrpc":"2.0","method":"session/update","params":{{"sessionId":"s1","update":{{"sessionUpdate":"tool_call","toolCallId":"t{at}","title":"{title}","kind":"{kind}","status":"pending","rawInput":{{"command":"{title}"}},"locations":[{{"path":"/repo/src/lib.rs"}}]}}}}}}\n'
printf '{{"jsonrpc":"2.0","id":"p{at}","method":"session/request_permission","params":{{"sessionId":"s1","toolCall":{{"toolCallId":"t{at}"}},"options":{options}}}}}\n'
read -r permission || exit 0
printf '%s\n' "$permission" | sed -E 's/.*"optionId":"([^"]*)".*/\1/;t;s/.*/none/' >> '{chose}'
"#,
            chose = chose.display(),
        ));
    }
    then.push_str("id=$prompt_id\nchunk done\nanswer '{\"stopReason\":\"end_turn\"}'\ncat > /dev/null");
    shell_agent(dir, name, &then)
}

/// The option ids the stand-in was given, in order.
pub(crate) fn chosen(dir: &Path, name: &str) -> Vec<String> {
    let text = std::fs::read_to_string(dir.join(format!("{name}.chose"))).unwrap_or_default();
    text.lines().map(str::to_owned).collect()
}

/// An approver that records what it is asked and answers from a list; a
/// request past the list is never answered (it waits to be withdrawn).
#[derive(Debug, Default)]
struct Recording {
    answers: Mutex<Vec<Verdict>>,
    asked: Mutex<Vec<PermissionRequest>>,
    /// Questions the asker gave up on while they were unanswered.
    withdrawn: Arc<AtomicUsize>,
}

impl Recording {
    fn answering(answers: &[Verdict]) -> Arc<Self> {
        Arc::new(Recording { answers: Mutex::new(answers.iter().rev().copied().collect()), ..Recording::default() })
    }

    fn asked(&self) -> Vec<PermissionRequest> {
        self.asked.lock().unwrap().clone()
    }
}

impl Approver for Recording {
    fn ask(&self, request: PermissionRequest, cancel: CancellationToken) -> BoxFuture<'static, Answer> {
        self.asked.lock().unwrap().push(request);
        let answer = self.answers.lock().unwrap().pop();
        if answer.is_none() {
            // Asked and never answered: the asker gives up on it, and says so.
            let withdrawn = self.withdrawn.clone();
            tokio::spawn(async move {
                cancel.cancelled().await;
                withdrawn.fetch_add(1, Ordering::SeqCst);
            });
        }
        Box::pin(async move {
            match answer {
                Some(verdict) => Answer::new(verdict, "the test"),
                None => std::future::pending().await,
            }
        })
    }
}

fn register(runtime: &Runtime, config: AcpConfig) {
    let provider = runtime.block_on(async move { AcpProvider::new(config).await.unwrap() });
    runtime.subagents().register_provider(provider).unwrap().keep();
}

fn request(home: &Path, label: &str) -> StartRequest {
    StartRequest::new("work", Parent::root(home).with_session("parent"), CancellationToken::new()).with_label(label)
}

/// The permission lines of the child's transcript.
fn permission_lines(home: &Path, provider: &str) -> Vec<String> {
    let store = SessionStore::new(home);
    let stored = store.inspect(&format!("acp:{provider}:s1")).unwrap();
    stored
        .events
        .iter()
        .filter_map(|event| match event {
            SessionEvent::ToolResult { name, content, .. } if name == "permission" => Some(content.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn an_ask_climbs_to_the_approver_naming_the_child_and_its_answer_is_the_option_it_offered() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let mut config = asking(home.path(), "asker", &[("execute", "cargo test")]);
    config.permission = Rules::new(Policy::Ask);
    register(&runtime, config);
    let approver = Recording::answering(&[Verdict::AllowOnce]);
    runtime.subagents().set_approver(approver.clone());
    let result = lifecycle(&runtime, &runtime.subagents(), "asker", request(home.path(), "tests"));
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(chosen(home.path(), "asker"), ["yes"]);
    let asked = approver.asked();
    assert_eq!(asked.len(), 1);
    let hop = &asked[0].asker;
    assert_eq!(hop.len(), 1, "{hop:?}");
    assert_eq!((hop[0].provider.as_str(), hop[0].label.as_deref(), hop[0].depth), ("asker", Some("tests"), 1));
    assert_eq!(asked[0].kind.as_deref(), Some("execute"), "filled in from the announced call");
    assert_eq!(asked[0].title.as_deref(), Some("cargo test"));
    assert_eq!(asked[0].input.as_deref(), Some(r#"{"command":"cargo test"}"#));
    assert_eq!(asked[0].paths, ["/repo/src/lib.rs"]);
    let ids: Vec<&str> = asked[0].options.iter().map(|option| option.id.as_str()).collect();
    assert_eq!(ids, ["yes", "always", "no"]);
    no_children_left(&runtime);
    drop(runtime);
    let lines = permission_lines(home.path(), "asker");
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("answered: Allow (AllowOnce), by the test"), "{lines:?}");
}

#[test]
fn allow_always_holds_for_the_rest_of_its_run_and_no_longer() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let mut config = asking(home.path(), "twice", &[("execute", "cargo test"), ("execute", "cargo test")]);
    config.permission = Rules::new(Policy::Ask);
    register(&runtime, config);
    let approver = Recording::answering(&[Verdict::AllowAlways, Verdict::Reject, Verdict::Reject]);
    runtime.subagents().set_approver(approver.clone());
    lifecycle(&runtime, &runtime.subagents(), "twice", request(home.path(), "first"));
    assert_eq!(chosen(home.path(), "twice"), ["always", "yes"], "the same call again is not asked");
    assert_eq!(approver.asked().len(), 1);
    // A new run asks again: the grant died with its run.
    lifecycle(&runtime, &runtime.subagents(), "twice", request(home.path(), "second"));
    assert_eq!(chosen(home.path(), "twice"), ["always", "yes", "no", "no"]);
    assert_eq!(approver.asked().len(), 3);
    no_children_left(&runtime);
}

#[test]
fn allow_always_for_a_call_that_names_no_tool_covers_that_call_and_no_other_of_its_kind() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let calls = [("execute", "cargo test"), ("execute", "rm -rf ~/"), ("execute", "cargo test")];
    let mut config = asking(home.path(), "kinds", &calls);
    config.permission = Rules::new(Policy::Ask);
    register(&runtime, config);
    let approver = Recording::answering(&[Verdict::AllowAlways, Verdict::Reject]);
    runtime.subagents().set_approver(approver.clone());
    lifecycle(&runtime, &runtime.subagents(), "kinds", request(home.path(), "first"));
    assert_eq!(chosen(home.path(), "kinds"), ["always", "no", "yes"], "another command of the kind is asked");
    let asked: Vec<Option<String>> = approver.asked().into_iter().map(|request| request.title).collect();
    assert_eq!(asked, [Some("cargo test".to_owned()), Some("rm -rf ~/".to_owned())]);
    // The door said what "always" would cover.
    let covers = approver.asked()[0].always_covers();
    assert!(covers.contains("only this same call again"), "{covers}");
    no_children_left(&runtime);
}

#[test]
fn rules_decide_before_anyone_is_asked_and_leave_only_ask_to_the_approver() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let calls = [("read", "read README"), ("execute", "rm -rf /"), ("edit", "edit lib.rs")];
    let mut config = asking(home.path(), "ruled", &calls);
    config.permission = Rules::new(Policy::Ask)
        .with(Rule::new(Policy::Allow).kind("read"))
        .with(Rule::new(Policy::Reject).title("*rm -rf*"));
    register(&runtime, config);
    let approver = Recording::answering(&[Verdict::AllowOnce]);
    runtime.subagents().set_approver(approver.clone());
    lifecycle(&runtime, &runtime.subagents(), "ruled", request(home.path(), "ruled"));
    assert_eq!(chosen(home.path(), "ruled"), ["yes", "no", "yes"]);
    let asked: Vec<Option<String>> = approver.asked().into_iter().map(|request| request.title).collect();
    assert_eq!(asked, [Some("edit lib.rs".to_owned())], "only what the rules left open was asked");
    no_children_left(&runtime);
    drop(runtime);
    let lines = permission_lines(home.path(), "ruled");
    assert!(lines[0].contains("by the provider's rules (allow)"), "{lines:?}");
    assert!(lines[1].contains("by the provider's rules (reject)"), "{lines:?}");
}

#[test]
fn a_reject_rule_sees_the_whole_of_a_long_command() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let long = format!("echo {} && rm -rf important/", "a".repeat(2300));
    let mut config = asking(home.path(), "long", &[("execute", long.as_str())]);
    config.permission = Rules::new(Policy::Allow).with(Rule::new(Policy::Reject).title("*rm -rf*"));
    register(&runtime, config);
    let approver = Recording::answering(&[Verdict::AllowOnce]);
    runtime.subagents().set_approver(approver.clone());
    lifecycle(&runtime, &runtime.subagents(), "long", request(home.path(), "long"));
    assert_eq!(chosen(home.path(), "long"), ["no"], "past 2 KiB the rule still sees `rm -rf`");
    assert!(approver.asked().is_empty());
    no_children_left(&runtime);
}

#[test]
fn with_no_one_to_ask_an_ask_is_a_reject() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let mut config = asking(home.path(), "alone", &[("execute", "cargo test")]);
    config.permission = Rules::new(Policy::Ask);
    register(&runtime, config);
    lifecycle(&runtime, &runtime.subagents(), "alone", request(home.path(), "alone"));
    assert_eq!(chosen(home.path(), "alone"), ["no"]);
    no_children_left(&runtime);
    drop(runtime);
    assert!(permission_lines(home.path(), "alone")[0].contains("by no one to ask"));
}

#[test]
fn no_answer_within_the_timeout_is_a_reject_and_the_question_is_withdrawn() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let mut config = asking(home.path(), "slow", &[("execute", "cargo test")]);
    config.permission = Rules::new(Policy::Ask);
    config.permission_timeout = Duration::from_millis(300);
    register(&runtime, config);
    let approver = Recording::answering(&[]);
    runtime.subagents().set_approver(approver.clone());
    let result = lifecycle(&runtime, &runtime.subagents(), "slow", request(home.path(), "slow"));
    assert_eq!(result.stop_reason, StopReason::Completed);
    assert_eq!(chosen(home.path(), "slow"), ["no"]);
    assert_eq!(approver.asked().len(), 1);
    assert!(common::blocking::eventually(common::WAIT_LIMIT, || approver.withdrawn.load(Ordering::SeqCst) == 1));
    no_children_left(&runtime);
    drop(runtime);
    assert!(permission_lines(home.path(), "slow")[0].contains("by no answer within 300 ms"));
}

#[test]
fn a_cancelled_run_rejects_what_it_was_waiting_on() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let mut config = asking(home.path(), "cancelled", &[("execute", "cargo test")]);
    config.permission = Rules::new(Policy::Ask);
    register(&runtime, config);
    let approver = Recording::answering(&[]);
    runtime.subagents().set_approver(approver.clone());
    let subagents = runtime.subagents();
    let (asked, home_path) = (approver.clone(), home.path().to_path_buf());
    let result = runtime.within(common::WAIT_LIMIT, "a run cancelled while it asks", async move {
        let run = subagents.start("cancelled", request(&home_path, "cancelled")).await.unwrap();
        assert!(common::eventually(common::WAIT_LIMIT, || !asked.asked().is_empty()).await, "it asks");
        run.cancel();
        let result = run.result().await.unwrap();
        run.dispose().await.unwrap();
        result
    });
    // The stand-in may answer its turn before the cancel lands.
    assert!(matches!(result.stop_reason, StopReason::Aborted | StopReason::Completed), "{result:?}");
    let withdrawn = || approver.withdrawn.load(Ordering::SeqCst) == 1;
    assert!(common::blocking::eventually(common::WAIT_LIMIT, withdrawn), "the question was withdrawn");
    // Whatever reached the child before it was reaped (its answer, or the
    // cancel notification read in its place) was never an allow.
    let given = chosen(home.path(), "cancelled");
    assert!(given.iter().all(|id| id == "no" || id == "none"), "{given:?}");
    no_children_left(&runtime);
}

/// `subagents acp` as the door: its session delegates to an ACP child
/// that asks, and the question reaches the test's ACP client (the official
/// crate's), which allows it once; the child gets its own `yes`.
#[tokio::test]
async fn through_subagents_acp_a_grandchilds_request_reaches_its_acp_client_and_the_answer_comes_back() {
    use agent_client_protocol::schema::ProtocolVersion;
    use agent_client_protocol::v1::schema::{
        ContentBlock, InitializeRequest, NewSessionRequest, PermissionOptionKind, PromptRequest,
        RequestPermissionOutcome, RequestPermissionRequest, RequestPermissionResponse, SelectedPermissionOutcome,
        SessionNotification, SessionUpdate,
    };
    use agent_client_protocol::{v1, ByteStreams, Client};
    use tokio_util::compat::{TokioAsyncReadCompatExt, TokioAsyncWriteCompatExt};

    let dir = tempfile::tempdir().unwrap();
    let asker = asking(dir.path(), "asker", &[("execute", "cargo test")]);
    let config = dir.path().join("subagents.toml");
    std::fs::write(
        &config,
        format!(
            "[providers.asker]\nkind = \"acp\"\ncommand = \"/bin/sh\"\nargs = [{script:?}]\npermission = \"ask\"\n",
            script = asker.args[0]
        ),
    )
    .unwrap();
    let mut agent = tokio::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .env_remove("RUST_LOG")
        .arg("acp")
        .arg("--home")
        .arg(dir.path().join("home"))
        .arg("--config")
        .arg(&config)
        .args(["--provider", "asker"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let transport = ByteStreams::new(agent.stdin.take().unwrap().compat_write(), agent.stdout.take().unwrap().compat());
    let asked = Arc::new(Mutex::new(Vec::<RequestPermissionRequest>::new()));
    let titles = Arc::new(Mutex::new(Vec::<String>::new()));
    let (heard, shown) = (asked.clone(), titles.clone());
    let cwd = dir.path().to_path_buf();
    let prompt = r#"[tool:subagent {"description": "run tests", "prompt": "run the tests"}]"#;
    let served = Client
        .v1()
        .name("approvals-test")
        .on_receive_request(
            async move |request: RequestPermissionRequest,
                        responder: v1::Responder<RequestPermissionResponse>,
                        _cx: v1::ConnectionTo<agent_client_protocol::Agent>| {
                let once = request.options.iter().find(|option| option.kind == PermissionOptionKind::AllowOnce);
                let outcome = RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(
                    once.expect("an allow-once option").option_id.clone(),
                ));
                heard.lock().unwrap().push(request);
                responder.respond(RequestPermissionResponse::new(outcome))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |notification: SessionNotification, _cx: v1::ConnectionTo<agent_client_protocol::Agent>| {
                if let SessionUpdate::ToolCall(call) = notification.update {
                    shown.lock().unwrap().push(call.title);
                }
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .connect_with(transport, async |cx: v1::ConnectionTo<agent_client_protocol::Agent>| {
            cx.send_request(InitializeRequest::new(ProtocolVersion::V1)).block_task().await?;
            let session = cx.send_request(NewSessionRequest::new(cwd)).block_task().await?;
            let prompt = vec![ContentBlock::from(prompt.to_owned())];
            cx.send_request(PromptRequest::new(session.session_id, prompt)).block_task().await
        });
    let answered = tokio::time::timeout(common::WAIT_LIMIT, served).await.expect("the prompt is answered in time");
    answered.expect("the prompt is answered");
    assert_eq!(chosen(dir.path(), "asker"), ["yes"], "the grandchild got the option the client chose");
    let asked = asked.lock().unwrap();
    assert_eq!(asked.len(), 1);
    let ids: Vec<String> = asked[0].options.iter().map(|option| option.option_id.to_string()).collect();
    assert_eq!(ids, ["yes", "always", "no"], "the child's own options, as it offered them");
    let title = asked[0].tool_call.fields.title.clone().unwrap_or_default();
    assert!(title.contains("asker (run tests) at depth 1") && title.contains("cargo test"), "{title}");
    assert!(titles.lock().unwrap().contains(&title), "the question is announced as a tool call first");
    drop(agent);
}

/// `subagents COMMAND --home HOME`.
fn subagents_at(command: &str, home: &Path) -> std::process::Command {
    let mut binary = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"));
    binary.env_remove("RUST_LOG").env_remove("SUBAGENTS_HOME").arg(command).arg("--home").arg(home);
    binary
}

fn approve(home: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let mut command = subagents_at("approve", home);
    command.args(args);
    let output = common::output_within(&mut command, common::WAIT_LIMIT, "subagents approve");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (output.status.code(), text(&output.stdout), text(&output.stderr))
}

/// A fanout running in the background with its approvals file.
struct Parking {
    running: std::process::Child,
    /// Its config file, holding `provider` (the stand-in's table).
    config: std::path::PathBuf,
    provider: String,
    /// Its one task.
    tasks: std::path::PathBuf,
}

/// Starts `fanout` of one task on the ACP stand-in `asker` (which asks
/// `calls`, its provider's permission `ask`) under the approvals file
/// `policy`, its stderr to `stderr`: what it asks is parked in `home`.
fn fanout_parking(
    dir: &Path,
    home: &Path,
    calls: &[(&str, &str)],
    policy: &str,
    stderr: std::process::Stdio,
) -> Parking {
    let asker = asking(dir, "asker", calls);
    let config = dir.join("subagents.toml");
    let provider = format!(
        "[providers.asker]\nkind = \"acp\"\ncommand = \"/bin/sh\"\nargs = [{script:?}]\npermission = \"ask\"\n",
        script = asker.args[0]
    );
    std::fs::write(&config, &provider).unwrap();
    let approvals = dir.join("approvals.toml");
    std::fs::write(&approvals, policy).unwrap();
    let tasks = dir.join("tasks.jsonl");
    std::fs::write(&tasks, "{\"id\": \"t1\", \"prompt\": \"work\"}\n").unwrap();
    let mut fanout = subagents_at("fanout", home);
    fanout.arg(&tasks).args(["--provider", "asker", "--config"]).arg(&config);
    fanout.arg("--approvals").arg(&approvals).arg("--out").arg(dir.join("out.jsonl"));
    let running = fanout.stdout(std::process::Stdio::null()).stderr(stderr).spawn().unwrap();
    Parking { running, config, provider, tasks }
}

#[test]
fn fanout_answers_by_its_policy_parks_the_rest_and_another_process_answers_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let calls = [("execute", "cargo test"), ("execute", "rm -rf /tmp/x")];
    let policy = "[approvals]\nrules = [{ title = \"*rm -rf*\", permission = \"reject\" }]\n";
    let Parking { mut running, config, provider, tasks } =
        fanout_parking(dir.path(), &home, &calls, policy, std::process::Stdio::piped());

    // From another process: what waits, then the answer.
    let mut listed = String::new();
    let found = common::blocking::eventually(common::WAIT_LIMIT, || {
        listed = approve(&home, &[]).1;
        !listed.is_empty()
    });
    assert!(found, "the request is parked and listed");
    let (id, shown) = listed.trim().split_once("  ").unwrap();
    assert!(shown.contains("asker at depth 1") && shown.contains("cargo test (execute)"), "{listed}");
    let (code, _, said) = approve(&home, &[id, "allow"]);
    assert_eq!(code, Some(0), "{said}");
    let (code, _, said) = approve(&home, &[id, "reject"]);
    assert_eq!(code, Some(1), "a second answer is refused: {said}");
    assert!(said.contains("is waiting for an answer"), "{said}");

    let status = running.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(running.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains(&format!("subagents approve {id} allow|always|reject")), "fanout says how: {stderr}");
    assert_eq!(chosen(dir.path(), "asker"), ["yes", "no"], "the parked one allowed, the policy's rejected");
    assert_eq!(approve(&home, &[]).1, "", "nothing waits");
    let (code, _, _) = approve(&home, &[id, "allow"]);
    assert_eq!(code, Some(1), "an answer after its run ended is refused");

    // `[approvals]` in the configuration; nobody answers within the
    // provider's timeout: a reject, and nothing is left waiting.
    std::fs::write(&config, format!("{provider}permission_timeout = \"1s\"\n\n[approvals]\npermission = \"ask\"\n"))
        .unwrap();
    std::fs::remove_file(dir.path().join("asker.chose")).unwrap();
    let mut fanout = subagents_at("fanout", &home);
    fanout.arg(&tasks).args(["--provider", "asker", "--config"]).arg(&config);
    let output = common::output_within(&mut fanout, common::WAIT_LIMIT, "fanout");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(chosen(dir.path(), "asker"), ["no", "no"]);
    assert_eq!(approve(&home, &[]).1, "", "the expired requests were taken back");
}

#[test]
fn an_answer_to_a_request_whose_batch_was_killed_is_refused_and_applies_to_nothing_later() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let policy = "[approvals]\npermission = \"ask\"\n";
    let Parking { mut running, .. } =
        fanout_parking(dir.path(), &home, &[("execute", "cargo test")], policy, std::process::Stdio::null());
    let mut listed = String::new();
    let found = common::blocking::eventually(common::WAIT_LIMIT, || {
        listed = approve(&home, &[]).1;
        !listed.is_empty()
    });
    assert!(found, "the request is parked and listed");
    let id = listed.trim().split_once("  ").unwrap().0.to_owned();
    assert!(!id.starts_with(&format!("{}-", running.id())), "an id says nothing a later batch could say again: {id}");
    running.kill().unwrap(); // SIGKILL: the request is left in the home.
    running.wait().unwrap();

    let (code, out, said) = approve(&home, &[&id, "allow"]);
    assert_eq!(code, Some(1), "an answer for a batch that is gone is refused: {out}{said}");
    assert!(said.contains("gone"), "{said}");
    assert!(!home.join("approvals/answered").read_dir().unwrap().any(|_| true), "no answer is left to be taken");
    assert_eq!(approve(&home, &[]).1, "", "nothing is listed as waiting");
}

#[test]
fn an_in_process_tool_marked_approve_asks_first_and_a_reject_is_a_tool_error_the_turn_goes_on_from() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "the notes").unwrap();
    let config = dir.path().join("subagents.toml");
    let rules = r#"[{ tool = "read_file", permission = "allow" }, { tool = "list_dir", permission = "reject" }]"#;
    let text = format!(
        "[providers.careful]\nkind = \"spawn\"\napprove = [\"read_file\", \"list_dir\"]\n\n[approvals]\nrules = {rules}\n"
    );
    std::fs::write(&config, text).unwrap();
    let tasks = dir.path().join("tasks.jsonl");
    let prompt = r#"[tool:read_file {"path": "notes.txt"}] then [tool:list_dir {"path": "."}]"#;
    std::fs::write(&tasks, format!("{}\n", serde_json::json!({"id": "t1", "prompt": prompt}))).unwrap();
    let out = dir.path().join("out.jsonl");
    let mut fanout = subagents_at("fanout", &dir.path().join("home"));
    fanout.current_dir(dir.path()).arg(&tasks).args(["--provider", "careful", "--config"]).arg(&config);
    fanout.arg("--out").arg(&out);
    let output = common::output_within(&mut fanout, common::WAIT_LIMIT, "fanout");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let result: serde_json::Value = serde_json::from_str(std::fs::read_to_string(&out).unwrap().trim()).unwrap();
    assert_eq!(result["stop_reason"], "completed", "the turn went on: {result}");
    let said = result["output"].as_str().unwrap();
    assert!(said.contains("the notes"), "the allowed call ran: {said}");
    assert!(said.contains("\"list_dir\" was rejected (the approvals policy (reject)): it did not run"), "{said}");
    assert!(!said.contains("notes.txt\n") && !said.contains("subagents.toml"), "the rejected call never ran: {said}");
}

#[test]
fn permission_rules_and_approvals_are_checked_when_the_file_is_read() {
    use subagents::config::Config;
    let provider = "[providers.a]\nkind = \"acp\"\ncommand = \"sh\"\n";
    let refused = |extra: &str| {
        let text = format!("{provider}{extra}\n");
        Config::parse(&text, "f.toml").expect_err(&text).to_string()
    };
    let said = refused("permission_rules = [{ kind = \"write\", permission = \"allow\" }]");
    assert!(said.contains("f.toml:4") && said.contains("not \"write\"") && said.contains("execute"), "{said}");
    let said = refused("permission_rules = [{ path = \"src\", permission = \"allow\" }]");
    assert!(said.contains("absolute"), "{said}");
    let said = refused("permission_rules = [{ permission = \"allow\" }]");
    assert!(said.contains("names at least one of"), "{said}");
    let said = refused("permission_rules = [{ kind = \"read\", then = \"allow\" }]");
    assert!(said.contains("`then`") && said.contains("permission"), "{said}");
    let said = refused("permission = \"maybe\"");
    assert!(said.contains("maybe"), "{said}");
    let said = refused("permission_timeout = \"0s\"");
    assert!(said.contains("longer than zero"), "{said}");
    let said = refused("[approvals]\npermission = \"ask\"\ntimeout = \"1s\"");
    assert!(said.contains("`timeout`") && said.contains("[approvals]"), "{said}");
    let spawn = |extra: &str| {
        let text = format!("[providers.s]\nkind = \"spawn\"\n{extra}\n");
        Config::parse(&text, "f.toml").expect_err(&text).to_string()
    };
    let said = spawn("approve = [\"write_file\"]");
    assert!(said.contains("f.toml:3") && said.contains("write_file") && said.contains("read_file"), "{said}");
    let said = spawn("approve = [\"subagent\"]\npermission_timeout = \"0s\"");
    assert!(said.contains("longer than zero"), "{said}");

    let text = format!(
        "{provider}permission = \"ask\"\npermission_rules = [{{ kind = \"read\", permission = \"allow\" }}]\n\n[approvals]\nrules = [{{ title = \"*rm*\", permission = \"reject\" }}]\n"
    );
    let config = Config::parse(&text, "f.toml").unwrap();
    let approvals = config.approvals().expect("[approvals] read");
    assert_eq!(approvals.otherwise, Policy::Ask, "ask unless set");
    let rm = PermissionRequest::new(Vec::new()).with_title("rm -rf x");
    assert_eq!(approvals.decide(&rm), Policy::Reject);
}

#[test]
fn a_grandchilds_request_climbs_through_an_in_process_child_naming_the_whole_path() {
    use subagents::agent::{ScriptedModel, Toolset};
    use subagents::providers::{ChildInfo, InProcessProvider};
    use subagents::tool::{MaxDepth, SubagentTool, SubagentToolConfig, TaskService};

    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let subagents = runtime.subagents();
    let mut config = asking(home.path(), "asker", &[("edit", "edit lib.rs")]);
    config.permission = Rules::new(Policy::Ask);
    register(&runtime, config);
    // `kid`'s children delegate to `asker` (an ACP agent keeps its own depth).
    let tool = SubagentToolConfig::new("asker").with_max_depth(MaxDepth::ProviderManaged);
    let subagent: Arc<dyn subagents::agent::Tool> =
        Arc::new(SubagentTool::mount(&subagents, tool, Some(TaskService::new())).unwrap());
    let kid =
        InProcessProvider::spawn("kid", Arc::new(ScriptedModel::demo())).with_tools(Arc::new(move |_: &ChildInfo| {
            let mut tools = Toolset::new();
            tools.add_shared(subagent.clone()).unwrap();
            tools
        }));
    subagents.register_provider(kid).unwrap().keep();
    let approver = Recording::answering(&[Verdict::AllowOnce]);
    subagents.set_approver(approver.clone());
    let prompt = r#"[tool:subagent {"description": "edit it", "prompt": "edit lib.rs"}]"#;
    let request = StartRequest::new(prompt, Parent::root(home.path()), CancellationToken::new()).with_label("middle");
    let result = lifecycle(&runtime, &subagents, "kid", request);
    assert_eq!(result.stop_reason, StopReason::Completed, "{result:?}");
    assert_eq!(chosen(home.path(), "asker"), ["yes"]);
    let asked = approver.asked();
    let path: Vec<(&str, Option<&str>, u32)> =
        asked[0].asker.iter().map(|hop| (hop.provider.as_str(), hop.label.as_deref(), hop.depth)).collect();
    assert_eq!(path, [("kid", Some("middle"), 1), ("asker", Some("edit it"), 2)]);
    assert_eq!(asked[0].asker_line(), "asker (edit it) at depth 2 [kid (middle) › asker (edit it)]");
    no_children_left(&runtime);
}
