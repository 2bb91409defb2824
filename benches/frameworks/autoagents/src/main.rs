// AutoAgents 0.4 doing the side-by-side script's one-call runs, as
// `examples/bare_client.rs` does them with bare reqwest: for each task line
// a fresh agent (its basic executor, direct, a sliding-window memory) on
// one shared OpenAI chat-completions LLM, at most CONCURRENCY at once, and
// a JSON result line each on stdout. Nothing is persisted.
use std::io::{BufRead, Write};
use std::sync::Arc;

use autoagents::core::agent::memory::SlidingWindowMemory;
use autoagents::core::agent::prebuilt::executor::BasicAgent;
use autoagents::core::agent::task::Task;
use autoagents::core::agent::{AgentBuilder, DirectAgent};
use autoagents::llm::backends::openai::{OpenAI, OpenAIApiMode};
use autoagents::llm::builder::LLMBuilder;
use autoagents::llm::LLMProvider;
use autoagents_derive::{agent, AgentHooks};
use futures::stream::{self, StreamExt};
use serde_json::{json, Value};

#[agent(name = "worker", description = "You are a worker. Answer the task.", tools = [])]
#[derive(Default, Clone, AgentHooks)]
pub struct Worker {}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [base_url, tasks, concurrency] = args.as_slice() else {
        eprintln!("usage: autoagents_client BASE_URL TASKS.jsonl CONCURRENCY");
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
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime");
    let failed = runtime.block_on(async {
        let llm: Arc<OpenAI> = LLMBuilder::<OpenAI>::new()
            .api_key("none")
            .base_url(base_url.clone())
            .model("m")
            .api_mode(OpenAIApiMode::ChatCompletions)
            .build()
            .expect("an LLM");
        let llm: Arc<dyn LLMProvider> = llm;
        let out = std::sync::Mutex::new(std::io::BufWriter::new(std::io::stdout().lock()));
        let failed = std::sync::atomic::AtomicUsize::new(0);
        stream::iter(prompts.iter().enumerate())
            .for_each_concurrent(concurrency, |(line, prompt)| {
                let (out, failed, llm) = (&out, &failed, llm.clone());
                async move {
                    let handle = AgentBuilder::<_, DirectAgent>::new(BasicAgent::new(Worker {}))
                        .llm(llm)
                        .memory(Box::new(SlidingWindowMemory::new(10)))
                        .build()
                        .await;
                    let answer = match handle {
                        Ok(handle) => match handle.agent.run(Task::new(prompt)).await {
                            Ok(answer) => Some(answer),
                            Err(error) => {
                                if failed.load(std::sync::atomic::Ordering::Relaxed) == 0 {
                                    eprintln!("run failed: {error:?}");
                                }
                                None
                            }
                        },
                        Err(error) => {
                            eprintln!("build failed: {error:?}");
                            None
                        }
                    };
                    let Some(answer) = answer else {
                        failed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        return;
                    };
                    let record = json!({"line": line + 1, "output": Value::from(answer)});
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
