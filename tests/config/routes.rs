//! Model routes (`[models.NAME]`): read with their limits, refused at
//! their place, and run end to end for each API against loopback
//! stand-ins, through `fanout` and through the library, their limiter
//! shared by every model built from one route.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use subagents::agent::{Limiter, Model, ModelRequest, ModelSpec, SessionEvent};
use subagents::seam::ContentBlock;
use subagents::CancellationToken;

use super::common::loopback::{ok, status, Loopback};
use super::{fanout, result_lines, run, text};

/// Config files are read by the library exactly as the binary reads them;
/// these cases need no process.
fn parse(text: &str) -> Result<subagents::config::Config, String> {
    subagents::config::Config::parse(text, "routes.toml").map_err(|error| error.to_string())
}

#[test]
fn model_routes_are_read_with_their_limits_and_a_provider_picks_one_by_name() {
    let mut environment = super::common::env::lock();
    environment.set("SUBAGENTS_TEST_ROUTE_KEY", "sk-route");
    let config = parse(
        r#"
[models.fast]
api = "openai-chat"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "SUBAGENTS_TEST_ROUTE_KEY"
model = "gpt-4o-mini"
max_tokens = 1024
timeout = "30s"
retries = 5
rpm = 300
tpm = 200000
max_concurrent = 16

[providers.a]
kind = "spawn"
model = "fast"

[providers.b]
kind = "fork"
model = "fast"

[providers.c]
kind = "spawn"
model = "openai:gpt-4o"
"#,
    )
    .unwrap();
    let route = config.route("fast").expect("the route is read");
    assert_eq!(route.api, subagents::agent::Api::OpenAiChat);
    assert_eq!((route.model.as_str(), route.base_url.as_deref()), ("gpt-4o-mini", Some("http://127.0.0.1:9/v1")));
    assert_eq!(route.api_key.as_deref(), Some("sk-route"));
    assert!(!format!("{route:?}").contains("sk-route"), "the key is redacted");
    assert_eq!((route.max_tokens, route.timeout, route.retries), (Some(1024), Some(Duration::from_secs(30)), Some(5)));
    let limits = route.limiter().limits();
    assert_eq!(
        (limits.requests_per_minute, limits.tokens_per_minute, limits.max_concurrent),
        (Some(300), Some(200_000), Some(16))
    );
    // Every provider naming the route gets it, with the one limiter.
    let (ModelSpec::Route(first), ModelSpec::Route(second)) =
        (config.model_spec("fast").unwrap(), config.model_spec("fast").unwrap())
    else {
        panic!("a route name picks the route")
    };
    assert_eq!(first.limiter(), second.limiter());
    assert_eq!(config.model_spec("openai:gpt-4o").unwrap(), ModelSpec::OpenAi(Some("gpt-4o".to_owned())));
    assert_eq!(config.routes().len(), 1);
}

#[test]
fn a_bad_model_route_or_a_model_that_names_nothing_is_refused_at_its_place() {
    let route = |extra: &str| format!("[models.x]\napi = \"openai-chat\"\nmodel = \"m\"\n{extra}");
    let cases = [
        (route("bogus = 1\n"), "routes.toml:4:1: `bogus` is not a key of a model route: a model route takes `api`,"),
        ("[models.x]\napi = \"gemini\"\nmodel = \"m\"\n".to_owned(), "routes.toml:2:7: unknown variant `gemini`"),
        (
            "[models.x]\napi = \"anthropic\"\nmodel = \"m\"\nmax_tokens = 0\n".to_owned(),
            "routes.toml:4:14: `max_tokens` must be at least 1",
        ),
        ("[models.x]\napi = \"openai-chat\"\n".to_owned(), "missing field `model`"),
        (route("rpm = 0\n"), "routes.toml:4:7: `rpm` must be at least 1"),
        (route("max_concurrent = 0\n"), "routes.toml:4:18: `max_concurrent` must be at least 1"),
        (route("tpm = -5\n"), "routes.toml:4:7: invalid value"),
        (route("timeout = \"5\"\n"), "routes.toml:4:11: `timeout`: \"5\" needs a unit"),
        (route("base_url = \"ftp://x\"\n"), "routes.toml:4:12: `base_url` must start with http:// or https://"),
        (
            format!("{}[providers.a]\nkind = \"spawn\"\nmodel = \"nope\"\n", route("")),
            "routes.toml:6:9: unknown model \"nope\": not a [models] route (x), \"scripted\", \"openai:NAME\", \"openai-responses:NAME\" or \"anthropic:NAME\"",
        ),
        (
            "[providers.a]\nkind = \"fork\"\nmodel = \"openai:\"\n".to_owned(),
            "routes.toml:3:9: unknown model \"openai:\": not a [models] route (none defined)",
        ),
        (
            "[models.scripted]\napi = \"openai-chat\"\nmodel = \"m\"\n".to_owned(),
            "route name \"scripted\" would read as a model of the command line",
        ),
    ];
    for (file, expected) in cases {
        let error = parse(&file).expect_err(&file);
        assert!(error.contains(expected), "{file}\nwanted: {expected}\ngot:    {error}");
    }
}

#[test]
fn a_route_whose_key_is_unset_blocks_only_what_uses_it() {
    let text =
        "[models.paid]\napi = \"openai-chat\"\nmodel = \"m\"\napi_key_env = \"SUBAGENTS_TEST_UNSET_ROUTE_KEY\"\n\n\
                [providers.cheap]\nkind = \"spawn\"\n\n[providers.dear]\nkind = \"spawn\"\nmodel = \"paid\"\n";
    let config = parse(text).expect("the file itself is sound");
    let problem = config.route_problem("paid").expect("the route is unusable here").to_string();
    let said =
        "routes.toml:4:15: route \"paid\": `api_key_env` names \"SUBAGENTS_TEST_UNSET_ROUTE_KEY\", which is not set";
    assert!(problem.starts_with(said), "{problem}");
    assert_eq!(config.model_spec("paid").unwrap_err().to_string(), problem, "asking for it says why");
    assert!(config.check_used(&["cheap"]).is_ok(), "a provider on another model is not blocked");
    let blocked = config.check_used(&["dear"]).expect_err("the provider on the route is");
    assert_eq!(blocked.to_string(), problem);

    // From the command line: `providers list` shows it, `run` on the other
    // provider works, and `run` on the route's provider says why.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("routes.toml"), text).unwrap();
    let command = |args: &[&str]| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_subagents"));
        command.args(args).args(["--config", "routes.toml"]).current_dir(dir.path());
        command.env_remove("SUBAGENTS_TEST_UNSET_ROUTE_KEY").env_remove("SUBAGENTS_HOME");
        command.output().unwrap()
    };
    let listed = command(&["providers", "list"]);
    assert!(listed.status.success(), "{}", text_of(&listed.stderr));
    assert!(text_of(&listed.stdout).contains("SUBAGENTS_TEST_UNSET_ROUTE_KEY"), "{}", text_of(&listed.stdout));
    let cheap = command(&["run", "check a", "--provider", "cheap", "--home", "home"]);
    assert!(cheap.status.success(), "{}", text_of(&cheap.stderr));
    let dear = command(&["run", "check a", "--provider", "dear", "--home", "home"]);
    assert_eq!(dear.status.code(), Some(2), "{}", text_of(&dear.stderr));
    assert!(text_of(&dear.stderr).contains("SUBAGENTS_TEST_UNSET_ROUTE_KEY"), "{}", text_of(&dear.stderr));
}

fn text_of(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A chat-completions stand-in on loopback answering every request with
/// one fixed completion; the requests it answered.
fn completion_server() -> (String, Arc<AtomicUsize>) {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let answered = Arc::new(AtomicUsize::new(0));
    let count = answered.clone();
    std::thread::spawn(move || {
        for socket in listener.incoming().flatten() {
            let count = count.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(socket.try_clone().unwrap());
                let mut socket = socket;
                loop {
                    let mut length = 0usize;
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            length = value.trim().parse().unwrap_or(0);
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let mut body = vec![0u8; length];
                    if reader.read_exact(&mut body).is_err() {
                        return;
                    }
                    count.fetch_add(1, Ordering::Relaxed);
                    let answer = r#"{"choices":[{"message":{"role":"assistant","content":"routed"},"finish_reason":"stop"}],"usage":{"prompt_tokens":30,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":10}}}"#;
                    let response = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
                        answer.len()
                    );
                    if socket.write_all(response.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, answered)
}

#[test]
fn fanout_runs_a_provider_on_a_configured_route_and_each_line_says_what_it_used() {
    let dir = tempfile::tempdir().unwrap();
    let (url, answered) = completion_server();
    let config = dir.path().join("routes.toml");
    let file = format!(
        "[models.local]\napi = \"openai-chat\"\nbase_url = \"{url}\"\nmodel = \"stand-in\"\nrpm = 6000\n\
         max_concurrent = 2\n\n[providers.worker]\nkind = \"spawn\"\nmodel = \"local\"\ntools = []\n"
    );
    std::fs::write(&config, file).unwrap();
    let tasks = dir.path().join("tasks.jsonl");
    std::fs::write(&tasks, (0..5).map(|n| format!("{{\"prompt\": \"task {n}\"}}\n")).collect::<String>()).unwrap();
    let output = run(&mut fanout(dir.path(), &tasks, &["--provider", "worker"], &config));
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let lines = result_lines(&output.stdout);
    assert_eq!(lines.len(), 5, "{stderr}");
    assert_eq!(answered.load(Ordering::Relaxed), 5, "each run called the route's endpoint once");
    for line in &lines {
        assert_eq!(line["output"], "routed", "{line}");
        let usage = &line["usage"];
        assert_eq!((usage["input_tokens"].as_u64(), usage["cache_read_tokens"].as_u64()), (Some(20), Some(10)));
        assert_eq!((usage["output_tokens"].as_u64(), usage["attempts"].as_u64()), (Some(7), Some(1)), "{line}");
        assert_eq!(line["tree_usage"], line["usage"], "no children: the tree is the run");
    }
    assert!(stderr.contains("tokens 185 (input 100, output 35, cache read 50, cache write 0)"), "{stderr}");
    assert!(stderr.contains("model calls 5, attempts 5"), "{stderr}");
}

/// An Anthropic Messages answer: `text`, with 10 plain input tokens, 30
/// read from the cache and 20 written to it, and 5 output tokens.
fn anthropic_answer(text: &str) -> Value {
    json!({"type": "message", "role": "assistant", "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn", "usage": {"input_tokens": 10, "output_tokens": 5,
        "cache_creation_input_tokens": 20, "cache_read_input_tokens": 30}})
}

/// An OpenAI Responses answer: `text`, with 12 input tokens of which 8
/// were cached, and 3 output tokens.
fn responses_answer(text: &str) -> Value {
    json!({"id": "resp_1", "object": "response", "status": "completed", "model": "gpt-test",
        "output": [{"type": "message", "id": "msg_0", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}],
        "usage": {"input_tokens": 12, "input_tokens_details": {"cached_tokens": 8}, "output_tokens": 3}})
}

/// A file with an `anthropic` route and an `openai-responses` route to
/// the stand-ins, and a provider on each.
fn two_api_routes(anthropic: &Loopback, responses: &Loopback) -> String {
    format!(
        "[models.claude]\napi = \"anthropic\"\nbase_url = \"{anthropic}\"\nmodel = \"claude-test\"\nmax_tokens = 256\n\
         rpm = 6000\n\n[models.gpt]\napi = \"openai-responses\"\nbase_url = \"{responses}/v1\"\nmodel = \"gpt-test\"\n\
         max_tokens = 128\nmax_concurrent = 4\n\n[providers.claude]\nkind = \"spawn\"\nmodel = \"claude\"\ntools = []\n\n\
         [providers.gpt]\nkind = \"spawn\"\nmodel = \"gpt\"\ntools = []\n",
        anthropic = anthropic.origin,
        responses = responses.origin,
    )
}

#[test]
fn fanout_runs_anthropic_and_responses_routes_end_to_end_with_each_run_s_usage() {
    let io = tokio::runtime::Runtime::new().unwrap();
    // Three answers each: fanout's probe of the endpoint takes a connection first.
    let anthropic = io.block_on(Loopback::start((0..3).map(|_| ok(anthropic_answer("from claude"))).collect()));
    let responses = io.block_on(Loopback::start((0..3).map(|_| ok(responses_answer("from gpt"))).collect()));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("routes.toml");
    std::fs::write(&config, two_api_routes(&anthropic, &responses)).unwrap();
    let tasks = dir.path().join("tasks.jsonl");
    let lines: String = ["claude", "gpt", "claude", "gpt"]
        .iter()
        .enumerate()
        .map(|(n, provider)| format!("{{\"prompt\": \"task {n}\", \"provider\": \"{provider}\"}}\n"))
        .collect();
    std::fs::write(&tasks, lines).unwrap();
    let output = run(&mut fanout(dir.path(), &tasks, &[], &config));
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let lines = result_lines(&output.stdout);
    assert_eq!(lines.len(), 4, "{stderr}");
    for line in &lines {
        let usage = &line["usage"];
        let tokens = |kind: &str| usage[kind].as_u64();
        let counts = (tokens("input_tokens"), tokens("output_tokens"), tokens("cache_read_tokens"));
        match line["output"].as_str() {
            // Anthropic reports cached input apart: nothing is taken out.
            Some("from claude") => assert_eq!(counts, (Some(10), Some(5), Some(30)), "{line}"),
            // The Responses API counts the 8 cached inside its 12.
            Some("from gpt") => assert_eq!(counts, (Some(4), Some(3), Some(8)), "{line}"),
            _ => panic!("an answer from neither stand-in: {line}"),
        }
        assert_eq!(usage["attempts"].as_u64(), Some(1), "{line}");
        assert_eq!(line["tree_usage"], line["usage"], "no children: the tree is the run");
    }
    // 2 × (10 + 5 + 30 + 20) + 2 × (4 + 3 + 8)
    assert!(stderr.contains("tokens 160 (input 28, output 16, cache read 76, cache write 40)"), "{stderr}");
    let sent = |server: &Loopback| server.requests.lock().unwrap().iter().map(|r| r.path.clone()).collect::<Vec<_>>();
    assert_eq!(sent(&anthropic), ["/v1/messages", "/v1/messages"]);
    assert_eq!(sent(&responses), ["/v1/responses", "/v1/responses"]);
    for body in anthropic.bodies() {
        assert_eq!((body["model"].as_str(), body["max_tokens"].as_u64()), (Some("claude-test"), Some(256)), "{body}");
    }
    for body in responses.bodies() {
        assert_eq!((body["model"].as_str(), body["max_output_tokens"].as_u64()), (Some("gpt-test"), Some(128)));
    }
}

fn request(prompt: &str) -> ModelRequest {
    ModelRequest {
        session_id: "s".to_owned(),
        system: Arc::from("You help."),
        messages: Arc::from(vec![SessionEvent::User { content: vec![ContentBlock::text(prompt)] }]),
        tools: Arc::from(Vec::new()),
        options: Default::default(),
        chunks: None,
        meter: Default::default(),
    }
}

/// Two models built from one route, as two providers naming it get: the
/// first is refused with `retry-after: 1`, and the second, asking while
/// the route cools down, waits it out too instead of meeting a 429.
async fn a_429_on_one_model_pauses_the_other(
    first: Arc<dyn Model>,
    second: Arc<dyn Model>,
    limiter: &Limiter,
    server: &Loopback,
) {
    let asked = request("first");
    let meter = asked.meter.clone();
    let refused_first = tokio::spawn(async move { first.complete(asked, CancellationToken::new()).await });
    // Not only sent: the 429 came back and set the route's cool-down, so the
    // second call is certain to meet it.
    let refused = super::common::eventually(Duration::from_secs(10), || {
        server.requests.lock().unwrap().len() == 1 && limiter.cooling_until().is_some()
    });
    assert!(refused.await, "the first call reached the stand-in and met its 429");
    let asked = request("second");
    let waited = asked.meter.clone();
    let reply = second.complete(asked, CancellationToken::new()).await.expect("the second call is answered");
    assert!(!reply.text.is_empty());
    refused_first.await.unwrap().expect("the first call is answered after its 429");
    assert_eq!(meter.attempts(), 2, "the refused call tried again once");
    assert_eq!(waited.attempts(), 1, "the second call never met the 429");
    assert!(
        waited.limit_wait() >= Duration::from_millis(500),
        "it waited out the cool-down: {:?}",
        waited.limit_wait()
    );
    assert_eq!(server.requests.lock().unwrap().len(), 3);
}

#[test]
fn every_model_built_from_an_anthropic_or_responses_route_shares_its_limiter() {
    let io = tokio::runtime::Runtime::new().unwrap();
    let refusal = || status(429, vec![("retry-after", "1".to_owned())], json!({"error": {"message": "slow down"}}));
    let anthropic =
        io.block_on(Loopback::start(vec![refusal(), ok(anthropic_answer("one")), ok(anthropic_answer("two"))]));
    let responses =
        io.block_on(Loopback::start(vec![refusal(), ok(responses_answer("one")), ok(responses_answer("two"))]));
    let config = parse(&two_api_routes(&anthropic, &responses)).unwrap();
    for (name, server) in [("claude", &anthropic), ("gpt", &responses)] {
        let (ModelSpec::Route(first), ModelSpec::Route(second)) =
            (config.model_spec(name).unwrap(), config.model_spec(name).unwrap())
        else {
            panic!("{name} names a route")
        };
        assert_eq!(first.limiter(), second.limiter(), "{name}: one limiter");
        let limiter = first.limiter().clone();
        let (first, second) = (first.build().unwrap(), second.build().unwrap());
        io.block_on(a_429_on_one_model_pauses_the_other(first, second, &limiter, server));
    }
}
