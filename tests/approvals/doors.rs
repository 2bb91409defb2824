//! docs/contract.md §11.11, the doors of `subagents mcp` and `subagents
//! a2a`: a child's permission request reaches the MCP client as
//! elicitation (the official SDK's client, declaring the capability or
//! not) and the A2A client as an input-required task answered on the same
//! task; the child gets exactly the option chosen, and anything else is a
//! reject.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, ElicitRequestParams, ElicitResult, ElicitationAction,
    Implementation,
};
use rmcp::service::{RequestContext, RoleClient};
use rmcp::{ClientHandler, ErrorData, ServiceExt};
use serde_json::{json, Value};

use super::{asking_with, chosen, OFFERED};
use crate::common;

/// A configuration whose provider `asker` is the stand-in that asks about
/// `calls`, with `permission = "ask"`, and `extra` after it.
fn asker_config(dir: &Path, calls: &[(&str, &str)], extra: &str) -> std::path::PathBuf {
    asker_config_with(dir, calls, extra, OFFERED)
}

/// [`asker_config`] whose stand-in offers `options` (ACP's array, as JSON).
fn asker_config_with(dir: &Path, calls: &[(&str, &str)], extra: &str, options: &str) -> std::path::PathBuf {
    let asker = asking_with(dir, "asker", calls, options);
    let config = dir.join("subagents.toml");
    let text = format!(
        "[providers.asker]\nkind = \"acp\"\ncommand = \"/bin/sh\"\nargs = [{script:?}]\npermission = \"ask\"\n{extra}",
        script = asker.args[0]
    );
    std::fs::write(&config, text).unwrap();
    config
}

/// What the MCP test client does with each elicitation, in order.
#[derive(Clone, Copy, Debug)]
enum Reply {
    /// Accepts, choosing the option whose title says so.
    Choose(&'static str),
    Decline,
    /// Never answers: waits until the server withdraws the question.
    Never,
}

/// The SDK's client: declares elicitation (or not), records what it is
/// asked (the message and the requested schema) and answers from a list.
#[derive(Clone)]
struct Eliciting {
    declares: bool,
    replies: Arc<Mutex<Vec<Reply>>>,
    asked: Arc<Mutex<Vec<(String, Value)>>>,
    /// Questions the server withdrew while they waited.
    withdrawn: Arc<Mutex<usize>>,
}

impl Eliciting {
    fn new(declares: bool, replies: &[Reply]) -> Self {
        let replies = Arc::new(Mutex::new(replies.iter().rev().copied().collect()));
        Eliciting { declares, replies, asked: Arc::default(), withdrawn: Arc::default() }
    }
}

impl ClientHandler for Eliciting {
    fn get_info(&self) -> ClientConfig {
        let capabilities = match self.declares {
            true => ClientCapabilities::builder().enable_elicitation().build(),
            false => ClientCapabilities::default(),
        };
        ClientConfig::new(capabilities, Implementation::new("approvals-test", "0"))
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let ElicitRequestParams::FormElicitationParams { message, requested_schema, .. } = request else {
            panic!("a form elicitation: {request:?}");
        };
        let schema = serde_json::to_value(&requested_schema).unwrap();
        self.asked.lock().unwrap().push((message, schema.clone()));
        let reply = self.replies.lock().unwrap().pop().expect("a reply for each question");
        Ok(match reply {
            Reply::Decline => ElicitResult::new(ElicitationAction::Decline),
            Reply::Never => {
                context.ct.cancelled().await;
                *self.withdrawn.lock().unwrap() += 1;
                return Err(ErrorData::internal_error("withdrawn", None));
            }
            Reply::Choose(said) => {
                let options = schema["properties"]["decision"]["oneOf"].as_array().cloned().unwrap_or_default();
                let option = options.iter().find(|option| option["title"].as_str().unwrap_or("").contains(said));
                let id = option.unwrap_or_else(|| panic!("an option saying {said:?}: {schema}"))["const"].clone();
                ElicitResult::new(ElicitationAction::Accept).with_content(json!({"decision": id}))
            }
        })
    }
}

/// `subagents mcp --config CONFIG --provider asker`, one `subagent` call
/// by `client`; the call's answer (whether it was an error, its text).
async fn call_through_mcp(dir: &Path, config: &Path, client: Eliciting) -> (bool, String) {
    let mut server = tokio::process::Command::new(env!("CARGO_BIN_EXE_subagents"))
        .env_remove("RUST_LOG")
        .arg("mcp")
        .arg("--home")
        .arg(dir.join("home"))
        .arg("--config")
        .arg(config)
        .args(["--provider", "asker"])
        .current_dir(dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let transport = (server.stdout.take().unwrap(), server.stdin.take().unwrap());
    let running = client.serve(transport).await.expect("the server initializes");
    let Value::Object(arguments) = json!({"description": "run tests", "prompt": "run the tests"}) else {
        unreachable!()
    };
    let call = running.call_tool(CallToolRequestParams::new("subagent").with_arguments(arguments));
    let result = tokio::time::timeout(common::WAIT_LIMIT, call).await.expect("answered in time").expect("a result");
    let text = result.content.iter().filter_map(|block| block.as_text()).map(|text| text.text.clone()).collect();
    running.cancel().await.unwrap();
    let status = tokio::time::timeout(common::WAIT_LIMIT, server.wait()).await.expect("exited in time").unwrap();
    assert!(status.success(), "{status}");
    (result.is_error == Some(true), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_subagents_mcp_a_childs_request_is_elicited_and_only_an_offered_choice_allows() {
    let dir = tempfile::tempdir().unwrap();
    let config = asker_config(dir.path(), &[("execute", "cargo test"), ("edit", "edit lib.rs")], "");
    let client = Eliciting::new(true, &[Reply::Choose("allow once"), Reply::Decline]);
    let (failed, text) = call_through_mcp(dir.path(), &config, client.clone()).await;
    assert!(!failed, "{text}");
    assert_eq!(chosen(dir.path(), "asker"), ["yes", "no"], "allowed once, then declined");
    let asked = client.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 2);
    let (message, schema) = &asked[0];
    assert!(message.contains("asker (run tests) at depth 1") && message.contains("cargo test"), "{message}");
    let ids: Vec<&str> = schema["properties"]["decision"]["oneOf"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o["const"].as_str())
        .collect();
    assert_eq!(ids, ["yes", "always", "no"], "exactly the child's options");
    assert_eq!(schema["required"], json!(["decision"]));
    assert!(asked[1].0.contains("edit lib.rs"), "{asked:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_elicitation_unanswered_within_the_timeout_is_withdrawn_and_a_reject() {
    let dir = tempfile::tempdir().unwrap();
    let config = asker_config(dir.path(), &[("execute", "cargo test")], "permission_timeout = \"1s\"\n");
    let client = Eliciting::new(true, &[Reply::Never]);
    let (failed, text) = call_through_mcp(dir.path(), &config, client.clone()).await;
    assert!(!failed, "{text}");
    assert_eq!(chosen(dir.path(), "asker"), ["no"]);
    assert_eq!(client.asked.lock().unwrap().len(), 1);
    let withdrawn = client.withdrawn.clone();
    assert!(common::eventually(common::WAIT_LIMIT, || *withdrawn.lock().unwrap() == 1).await, "withdrawn on the wire");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_without_elicitation_is_never_asked_and_the_policy_decides() {
    let dir = tempfile::tempdir().unwrap();
    let policy = "\n[approvals]\nrules = [{ title = \"cargo *\", permission = \"allow\" }]\n";
    let config = asker_config(dir.path(), &[("execute", "cargo test"), ("execute", "rm -rf /tmp/x")], policy);
    let client = Eliciting::new(false, &[]);
    let (failed, text) = call_through_mcp(dir.path(), &config, client.clone()).await;
    assert!(!failed, "{text}");
    assert_eq!(chosen(dir.path(), "asker"), ["yes", "no"], "the policy's allow, then its ask with no one to ask");
    assert!(client.asked.lock().unwrap().is_empty(), "a client that did not declare elicitation is not asked");

    // No policy at all: a reject.
    let dir = tempfile::tempdir().unwrap();
    let config = asker_config(dir.path(), &[("execute", "cargo test")], "");
    call_through_mcp(dir.path(), &config, Eliciting::new(false, &[])).await;
    assert_eq!(chosen(dir.path(), "asker"), ["no"]);
}

/// `subagents a2a` serving `asker` (the configuration `config`'s text),
/// without a token and told to offer approvals all the same.
fn a2a_server(config: &Path) -> crate::a2a::Server {
    a2a_server_with(config, &["--approvals-without-auth"])
}

/// [`a2a_server`] with the flags `extra` instead.
fn a2a_server_with(config: &Path, extra: &[&str]) -> crate::a2a::Server {
    let text = std::fs::read_to_string(config).unwrap();
    crate::a2a::server_with(&format!("{text}\n[tool]\nproviders = [\"asker\"]\n"), extra, &[])
}

#[test]
fn an_a2a_door_without_a_token_offers_no_approvals_and_the_policy_decides() {
    let dir = tempfile::tempdir().unwrap();
    let config = asker_config(dir.path(), &[("execute", "cargo test")], "");
    let server = a2a_server_with(&config, &[]);
    let task = a2a_call(&server, "SendMessage", crate::a2a::message("work", None))["task"].clone();
    assert_eq!(task["status"]["state"], "TASK_STATE_COMPLETED", "no client was asked: {task}");
    assert_eq!(chosen(dir.path(), "asker"), ["no"], "`ask` with no one to ask is a reject");
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_subagents")).args(["a2a", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--approvals-without-auth") && help.contains("any local process"), "{help}");
}

#[test]
fn an_a2a_door_with_a_token_offers_approvals_to_its_client() {
    let dir = tempfile::tempdir().unwrap();
    let config = asker_config(dir.path(), &[("execute", "cargo test")], "");
    let text = std::fs::read_to_string(&config).unwrap();
    let server = crate::a2a::server_with(
        &format!("{text}\n[tool]\nproviders = [\"asker\"]\n"),
        &["--token-env", "A2A_DOOR_TOKEN"],
        &[("A2A_DOOR_TOKEN", "door-token")],
    );
    let call = |params: Value| {
        let (status, body) =
            crate::a2a::post(&server.addr, &crate::a2a::rpc("SendMessage", params), Some("door-token"));
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<Value>(&body).unwrap()["result"]["task"].clone()
    };
    let task = call(crate::a2a::message("work", None));
    assert_eq!(task["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{task}");
    let done = call(on_task(&task, json!([{"text": "yes"}])));
    assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED", "{done}");
    assert_eq!(chosen(dir.path(), "asker"), ["yes"]);
}

/// One JSON-RPC call to `server`: its `result` (or its error, whole).
fn a2a_call(server: &crate::a2a::Server, method: &str, params: Value) -> Value {
    let (status, body) = crate::a2a::post(&server.addr, &crate::a2a::rpc(method, params), None);
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    match answer.get("result") {
        Some(result) => result.clone(),
        None => answer,
    }
}

/// A message on the task `task` carrying `parts`, with a message id of its own.
fn on_task(task: &Value, parts: Value) -> Value {
    static SENT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let id = format!("answer-{}", SENT.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    on_task_as(task, parts, &id)
}

/// A message on the task `task` carrying `parts`, with the message id `id`.
fn on_task_as(task: &Value, parts: Value, id: &str) -> Value {
    json!({"message": {"messageId": id, "role": "ROLE_USER", "taskId": task["id"], "contextId": task["contextId"],
        "parts": parts}})
}

#[test]
fn through_subagents_a2a_a_request_is_an_input_required_task_answered_on_the_same_task() {
    let dir = tempfile::tempdir().unwrap();
    let config = asker_config(dir.path(), &[("execute", "cargo test"), ("edit", "edit lib.rs")], "");
    let server = a2a_server(&config);
    // A blocking SendMessage comes back when the task waits on its client.
    let task = a2a_call(&server, "SendMessage", crate::a2a::message("work", None))["task"].clone();
    assert_eq!(task["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{task}");
    let question = &task["status"]["message"]["parts"];
    let text = question[0]["text"].as_str().unwrap();
    assert!(text.contains("asker at depth 1") && text.contains("cargo test"), "{text}");
    assert!(text.contains("yes (Allow: allow once)"), "the options as text: {text}");
    let ids: Vec<&str> = question[1]["data"]["permission"]["options"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o["id"].as_str())
        .collect();
    assert_eq!(ids, ["yes", "always", "no"], "and as data");

    // An answer that names nothing offered is refused; the question stays.
    let refused = a2a_call(&server, "SendMessage", on_task(&task, json!([{"text": "maybe"}])));
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap_or("").contains("yes, always, no"), "{refused}");
    let still = a2a_call(&server, "GetTask", json!({"id": task["id"]}));
    assert_eq!(still["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{still}");

    // A data part naming an option: the run resumes, and asks again.
    let first = on_task_as(&task, json!([{"data": {"optionId": "yes"}}]), "first-answer");
    let next = a2a_call(&server, "SendMessage", first.clone())["task"].clone();
    assert_eq!(next["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{next}");
    assert!(next["status"]["message"]["parts"][0]["text"].as_str().unwrap().contains("edit lib.rs"), "{next}");
    // The same message again (a client's retry) does not answer the next question.
    let retried = a2a_call(&server, "SendMessage", first);
    assert_eq!(retried["error"]["code"], -32602, "{retried}");
    // Text naming an option; the run goes on to its end.
    let done = a2a_call(&server, "SendMessage", on_task(&task, json!([{"text": "no"}])))["task"].clone();
    assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED", "{done}");
    assert_eq!(chosen(dir.path(), "asker"), ["yes", "no"]);
    let history = a2a_call(&server, "GetTask", json!({"id": task["id"]}))["history"].clone();
    assert_eq!(history.as_array().map(Vec::len), Some(3), "the prompt and both answers: {history}");
    let ended = a2a_call(&server, "SendMessage", on_task(&task, json!([{"text": "yes"}])));
    assert_eq!(ended["error"]["code"], -32004, "an ended task takes no answer: {ended}");
}

#[test]
fn an_a2a_question_nobody_answers_in_time_is_a_reject_and_the_task_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let calls = [("execute", "cargo test"), ("edit", "edit lib.rs")];
    let config = asker_config(dir.path(), &calls, "permission_timeout = \"1s\"\n");
    let server = a2a_server(&config);
    let task = a2a_call(&server, "SendMessage", crate::a2a::message("work", None))["task"].clone();
    assert_eq!(task["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{task}");
    // The first question expires; the task goes on to the next one.
    let next = common::blocking::eventually(common::WAIT_LIMIT, || {
        let now = a2a_call(&server, "GetTask", json!({"id": task["id"]}));
        now["status"]["message"]["parts"][0]["text"].as_str().is_some_and(|text| text.contains("edit lib.rs"))
    });
    assert!(next, "the expired question left the task");
    // An answer meant for the expired question is not given to the next one:
    // one that names no question is refused once the question changed, and
    // one naming the expired question too.
    let now = a2a_call(&server, "GetTask", json!({"id": task["id"]}));
    let asked = now["status"]["message"]["parts"][1]["data"]["permission"]["question"].clone();
    assert!(asked.is_u64(), "the question carries its number: {now}");
    let unnamed = a2a_call(&server, "SendMessage", on_task(&task, json!([{"text": "yes"}])));
    assert_eq!(unnamed["error"]["code"], -32602, "{unnamed}");
    let expired = json!([{"data": {"question": asked.as_u64().unwrap() - 1, "optionId": "yes"}}]);
    let stale = a2a_call(&server, "SendMessage", on_task(&task, expired));
    assert_eq!(stale["error"]["code"], -32602, "{stale}");
    let named = json!([{"data": {"question": asked, "optionId": "yes"}}]);
    let done = a2a_call(&server, "SendMessage", on_task(&task, named))["task"].clone();
    assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED", "{done}");
    assert_eq!(chosen(dir.path(), "asker"), ["no", "yes"]);
    let late = a2a_call(&server, "SendMessage", on_task(&task, json!([{"text": "yes"}])));
    assert!(late.get("error").is_some(), "a late answer is refused: {late}");
}

/// Two options of one kind: a client that chooses the second gives the
/// child exactly that one, not the first of its kind.
const TWO_ALLOWS: &str = r#"[{"optionId":"yes","name":"Allow this edit","kind":"allow_once"},{"optionId":"yes-dir","name":"Allow edits in this folder","kind":"allow_once"},{"optionId":"no","name":"Reject","kind":"reject_once"}]"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_that_chooses_the_second_of_two_allows_gives_the_child_that_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = asker_config_with(dir.path(), &[("edit", "edit lib.rs")], "", TWO_ALLOWS);
    let client = Eliciting::new(true, &[Reply::Choose("in this folder")]);
    let (failed, text) = call_through_mcp(dir.path(), &config, client).await;
    assert!(!failed, "{text}");
    assert_eq!(chosen(dir.path(), "asker"), ["yes-dir"]);
}

#[test]
fn an_a2a_client_that_chooses_the_second_of_two_allows_gives_the_child_that_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = asker_config_with(dir.path(), &[("edit", "edit lib.rs")], "", TWO_ALLOWS);
    let server = a2a_server(&config);
    let task = a2a_call(&server, "SendMessage", crate::a2a::message("work", None))["task"].clone();
    assert_eq!(task["status"]["state"], "TASK_STATE_INPUT_REQUIRED", "{task}");
    let done =
        a2a_call(&server, "SendMessage", on_task(&task, json!([{"data": {"optionId": "yes-dir"}}])))["task"].clone();
    assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED", "{done}");
    assert_eq!(chosen(dir.path(), "asker"), ["yes-dir"]);
}
