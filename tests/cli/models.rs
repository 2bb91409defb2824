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
