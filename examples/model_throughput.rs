//! Fan-out throughput through each HTTP model adapter, against a loopback
//! stand-in that answers every request at once, beside the floor: a bare
//! `reqwest` client sending the same number of requests at the same
//! concurrency to the same server.
//!
//! ```text
//! cargo run --release --example model_throughput [RUNS] [CONCURRENCY]
//! ```
//!
//! Prints one JSON object: per adapter the runs a second through the
//! runtime (a `spawn` child per task, in-memory sessions, one model call
//! each), the floor's requests a second, and `floor_over_adapter` (1.0
//! would be no cost at all over the bare client).

use std::sync::Arc;
use std::time::Instant;

use futures_util::stream::{self, StreamExt};
use serde_json::{json, Value};
use subagents::agent::{AnthropicConfig, AnthropicModel, Model, OpenAiConfig, OpenAiModel, OpenAiResponsesModel};
use subagents::providers::InProcessProvider;
use subagents::{CancellationToken, Parent, Runtime, StartRequest, StopReason};
use tokio::net::TcpListener;

#[path = "support/stand_in.rs"]
mod stand_in;

/// Requests a second of a bare client: `runs` POSTs, `concurrency` at once.
async fn floor(url: &str, runs: usize, concurrency: usize) -> f64 {
    let client = reqwest::Client::new();
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "task"}]});
    let started = Instant::now();
    stream::iter(0..runs)
        .for_each_concurrent(concurrency, |_| {
            let request = client.post(url).json(&body);
            async move {
                let answer = request.send().await.expect("the stand-in answers");
                let _: Value = answer.json().await.expect("a JSON answer");
            }
        })
        .await;
    runs as f64 / started.elapsed().as_secs_f64()
}

/// Runs a second of a fan-out of `runs` spawn children on `model`.
fn through_runtime(model: Arc<dyn Model>, runs: usize, concurrency: usize) -> f64 {
    let home = tempfile::tempdir().expect("a scratch home");
    let runtime = Runtime::builder().home(home.path()).build().expect("a runtime");
    let subagents = runtime.subagents();
    subagents.register_provider(InProcessProvider::spawn("spawn", model).in_memory()).expect("registered").keep();
    let cwd = home.path().to_path_buf();
    let rate = runtime.block_on(async move {
        let started = Instant::now();
        stream::iter(0..runs)
            .for_each_concurrent(concurrency, |_| {
                let (subagents, cwd) = (subagents.clone(), cwd.clone());
                async move {
                    let request = StartRequest::new("task", Parent::root(&cwd), CancellationToken::new());
                    let run = subagents.start("spawn", request).await.expect("started");
                    let result = run.result().await.expect("a result");
                    assert_eq!(result.stop_reason, StopReason::Completed, "{result:?}");
                    run.dispose().await.expect("disposed");
                }
            })
            .await;
        runs as f64 / started.elapsed().as_secs_f64()
    });
    runtime.shutdown_blocking();
    rate
}

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>().expect("a number"));
    let runs = args.next().unwrap_or(5_000);
    let concurrency = args.next().unwrap_or(50);
    let io = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let listener = io.block_on(TcpListener::bind("127.0.0.1:0")).expect("a loopback port");
    let origin = format!("http://{}", listener.local_addr().expect("bound"));
    io.spawn(stand_in::serve(listener, stand_in::FirstBody::default()));

    let chat = |url: &str| {
        let mut config = OpenAiConfig::new(url, "m");
        config.stream = false;
        config
    };
    let adapters: Vec<(&str, String, Arc<dyn Model>)> = vec![
        (
            "openai-chat",
            format!("{origin}/v1/chat/completions"),
            Arc::new(OpenAiModel::new(chat(&format!("{origin}/v1"))).expect("chat")),
        ),
        (
            "openai-responses",
            format!("{origin}/v1/responses"),
            Arc::new(OpenAiResponsesModel::new(chat(&format!("{origin}/v1"))).expect("responses")),
        ),
        ("anthropic", format!("{origin}/v1/messages"), {
            let mut config = AnthropicConfig::new(&origin, "m");
            config.stream = false;
            Arc::new(AnthropicModel::new(config).expect("anthropic"))
        }),
    ];
    let mut report = serde_json::Map::new();
    for (name, url, model) in adapters {
        let floor = io.block_on(floor(&url, runs, concurrency));
        let adapter = through_runtime(model, runs, concurrency);
        report.insert(
            name.to_owned(),
            json!({
                "runs_per_s": adapter.round(),
                "bare_client_requests_per_s": floor.round(),
                "floor_over_adapter": (floor / adapter * 100.0).round() / 100.0,
            }),
        );
    }
    let report = json!({"runs": runs, "concurrency": concurrency, "adapters": report});
    println!("{}", serde_json::to_string_pretty(&report).expect("JSON"));
}
