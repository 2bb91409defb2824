//! The floor `benches/side_by_side.sh` measures `subagents fanout` against:
//! a bare `reqwest` + tokio client doing the same one-call runs, with
//! nothing of this crate in it.
//!
//! ```text
//! cargo run --release --example bare_client -- URL TASKS.jsonl CONCURRENCY
//! ```
//!
//! Each task line's `prompt` is sent as one chat completion request to
//! `URL` (at most `CONCURRENCY` in flight), the answer parsed, and one
//! result line (`{"line", "output"}`) written to stdout, buffered; the count
//! of answers and failures goes to stderr at the end. What it leaves out is
//! what `fanout` adds: sessions, events, the run's actor and agent, retries,
//! the summary.

use std::io::{BufRead, Write};

use futures_util::stream::{self, StreamExt};
use serde_json::{json, Value};

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, tasks, concurrency] = args.as_slice() else {
        eprintln!("usage: bare_client URL TASKS.jsonl CONCURRENCY");
        return std::process::ExitCode::from(2);
    };
    let concurrency: usize = concurrency.parse().expect("CONCURRENCY is a number");
    let file = std::io::BufReader::new(std::fs::File::open(tasks).expect("the tasks file opens"));
    let prompts: Vec<String> = file
        .lines()
        .map(|line| {
            let task: Value = serde_json::from_str(&line.expect("a task line")).expect("a JSON task line");
            task["prompt"].as_str().unwrap_or_default().to_owned()
        })
        .collect();
    // reqwest is built without a TLS provider of its own (as in the crate).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime");
    let failed = runtime.block_on(async {
        let client = reqwest::Client::new();
        let out = std::sync::Mutex::new(std::io::BufWriter::new(std::io::stdout().lock()));
        let failed = std::sync::atomic::AtomicUsize::new(0);
        stream::iter(prompts.iter().enumerate())
            .for_each_concurrent(concurrency, |(line, prompt)| {
                let body = json!({"model": "m", "messages": [{"role": "user", "content": prompt}]});
                let request = client.post(url.as_str()).json(&body);
                let (out, failed) = (&out, &failed);
                async move {
                    let answer = match request.send().await {
                        Ok(answer) => answer.json::<Value>().await.ok(),
                        Err(_) => None,
                    };
                    let Some(answer) = answer else {
                        failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        return;
                    };
                    let output = &answer["choices"][0]["message"]["content"];
                    let record = json!({"line": line + 1, "output": output});
                    let mut out = out.lock().unwrap();
                    let _ = writeln!(out, "{record}");
                }
            })
            .await;
        let _ = out.lock().unwrap().flush();
        failed.into_inner()
    });
    eprintln!("{} answered, {failed} failed", prompts.len() - failed);
    std::process::ExitCode::from(u8::from(failed > 0))
}
