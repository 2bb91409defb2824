//! `--model`'s HTTP forms: `run` and `fanout` speak each API to a loopback
//! endpoint configured by that API's environment variables.

use super::output::endpoint_answering;
use super::{json_lines, run, subagents, text, write_file};

/// A whole Messages API answer.
const ANTHROPIC_ANSWER: &str = r#"{"id": "msg_1", "type": "message", "role": "assistant",
    "content": [{"type": "text", "text": "from the messages api"}], "stop_reason": "end_turn",
    "usage": {"input_tokens": 3, "output_tokens": 2}}"#;

/// A whole Responses API answer.
const RESPONSES_ANSWER: &str = r#"{"id": "resp_1", "object": "response", "status": "completed",
    "output": [{"type": "message", "role": "assistant",
        "content": [{"type": "output_text", "text": "from the responses api"}]}],
    "usage": {"input_tokens": 3, "output_tokens": 2}}"#;

#[test]
fn run_and_fanout_take_anthropic_and_openai_responses_models_from_their_environment() {
    let home = tempfile::tempdir().unwrap();
    let anthropic = endpoint_answering("200 OK", ANTHROPIC_ANSWER);
    let responses = endpoint_answering("200 OK", RESPONSES_ANSWER);
    let tasks = write_file(home.path(), "tasks.jsonl", "{\"prompt\": \"hello\"}\n");
    let cases = [
        ("anthropic:claude-test", "ANTHROPIC_BASE_URL", &anthropic, "from the messages api"),
        ("openai-responses:gpt-test", "SUBAGENTS_BASE_URL", &responses, "from the responses api"),
    ];
    for (model, variable, base_url, answer) in cases {
        let output = run(subagents()
            .args(["run", "hello", "--model", model, "--home"])
            .arg(home.path())
            .env(variable, base_url));
        let stdout = text(&output.stdout);
        assert!(output.status.success(), "{model}: {stdout}\n{}", text(&output.stderr));
        assert!(stdout.contains(answer), "{model}: {stdout}");

        let output = run(subagents()
            .args(["fanout", "--model", model])
            .arg(&tasks)
            .arg("--home")
            .arg(home.path())
            .env(variable, base_url));
        assert!(output.status.success(), "{model}: {}", text(&output.stderr));
        let results = json_lines(&output.stdout);
        assert_eq!(
            (&results[0]["stop_reason"], &results[0]["output"]),
            (&"completed".into(), &answer.into()),
            "{model}"
        );
    }
}

#[test]
fn an_unreachable_anthropic_endpoint_is_refused_before_any_run() {
    let home = tempfile::tempdir().unwrap();
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let output = run(subagents()
        .args(["run", "hi", "--model", "anthropic:claude-test", "--home"])
        .arg(home.path())
        .env("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{closed_port}")));
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("unreachable") && stderr.contains(&closed_port.to_string()), "{stderr}");
}

#[test]
fn openai_models_honour_openai_base_url_and_openai_api_key_and_ours_win_over_them() {
    use crate::common::loopback::{ok, Loopback};
    let home = tempfile::tempdir().unwrap();
    let answer = serde_json::json!({"id": "c", "object": "chat.completion", "choices": [{"index": 0,
        "message": {"role": "assistant", "content": "hello back"}, "finish_reason": "stop"}]});
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // Each run's probe of the endpoint takes a connection of its own.
    let server = runtime.block_on(Loopback::start((0..6).map(|_| ok(answer.clone())).collect()));
    let run_with = |extra: &[(&str, &str)]| {
        let mut command = subagents();
        command.args(["run", "hello", "--model", "openai:gpt-test", "--home"]).arg(home.path());
        command.env_remove("SUBAGENTS_BASE_URL").env_remove("SUBAGENTS_API_KEY");
        command.env("OPENAI_BASE_URL", format!("{}/v1", server.origin)).env("OPENAI_API_KEY", "sk-theirs");
        for (name, value) in extra {
            command.env(name, value);
        }
        run(&mut command)
    };
    let output = run_with(&[]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(text(&output.stdout).contains("hello back"), "{}", text(&output.stdout));
    let output = run_with(&[("SUBAGENTS_API_KEY", "sk-ours")]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(!text(&output.stderr).contains("no API key"), "{}", text(&output.stderr));
    // No key at all: the calls go, and the user is told once.
    let output = run_with(&[("OPENAI_API_KEY", "")]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert_eq!(stderr.matches("carry no API key: set SUBAGENTS_API_KEY or OPENAI_API_KEY").count(), 1, "{stderr}");
    let requests = server.requests.lock().unwrap();
    let keys: Vec<Option<&str>> =
        requests.iter().filter(|r| r.path.ends_with("/chat/completions")).map(|r| r.header("authorization")).collect();
    assert_eq!(keys, [Some("Bearer sk-theirs"), Some("Bearer sk-ours"), None]);
}

#[test]
fn a_route_marked_shared_outside_a_worker_says_once_that_its_limits_hold_for_this_process_alone() {
    const CHAT_ANSWER: &str = r#"{"choices": [{"message": {"role": "assistant", "content": "done"},
        "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}"#;
    let home = tempfile::tempdir().unwrap();
    let endpoint = endpoint_answering("200 OK", CHAT_ANSWER);
    let config = format!(
        "[models.fleet]\napi = \"openai-chat\"\nbase_url = \"{endpoint}\"\nmodel = \"m\"\nrpm = 6000\nshared = true\n\n\
         [models.alone]\napi = \"openai-chat\"\nbase_url = \"{endpoint}\"\nmodel = \"m\"\nrpm = 6000\n\n\
         [providers.fleet]\nkind = \"spawn\"\nmodel = \"fleet\"\n\n[providers.alone]\nkind = \"spawn\"\nmodel = \"alone\"\n"
    );
    let config = write_file(home.path(), "subagents.toml", &config);
    let tasks = write_file(home.path(), "tasks.jsonl", "{\"prompt\": \"hello\"}\n".repeat(3));
    let fanout = |provider: &str| {
        run(subagents()
            .args(["fanout", "--provider", provider, "--config"])
            .arg(&config)
            .arg(&tasks)
            .arg("--home")
            .arg(home.path()))
    };
    let output = fanout("fleet");
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(json_lines(&output.stdout).len(), 3, "the runs go: a warning, not an error");
    let warning = "route \"fleet\" is marked `shared = true`, but only a `subagents worker` shares";
    assert_eq!(stderr.matches(warning).count(), 1, "said once for three calls: {stderr}");
    assert!(stderr.contains("for this process alone"), "{stderr}");
    // A route not marked shared says nothing of it.
    let output = fanout("alone");
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(!text(&output.stderr).contains("shared = true"), "{}", text(&output.stderr));
}
