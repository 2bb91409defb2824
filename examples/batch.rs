//! A resumable batch from a program: the engine of `subagents fanout`,
//! embedded. Runs `examples/tasks.jsonl` on the scripted demo model (no key,
//! no network), four at a time, results in a durable journal; run it twice
//! and the second run settles nothing again (`done before`).
//!
//! `cargo run --example batch -- [OUT.jsonl]`

use std::sync::Arc;

use subagents::agent::ScriptedModel;
use subagents::batch::{Batch, Report, Settled};
use subagents::providers::InProcessProvider;
use subagents::{CancellationToken, Runtime};

/// One line per settled task on stderr.
struct Lines;

impl Report for Lines {
    fn settled(&self, settled: &Settled<'_>) {
        eprintln!("line {}: {}", settled.line, settled.outcome);
    }

    fn skipped(&self, line: usize, why: &str) {
        eprintln!("line {line}: skipped: {why}");
    }
}

fn main() {
    let out = std::env::args().nth(1).unwrap_or_else(|| "batch-results.jsonl".to_owned());
    let home = std::env::temp_dir().join("subagents-batch-example");
    let runtime = Runtime::builder().home(&home).build().expect("runtime");
    let subagents = runtime.subagents();
    let spawn = InProcessProvider::spawn("spawn", Arc::new(ScriptedModel::demo()));
    subagents.register_provider(spawn).expect("register").keep();
    let tasks = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/tasks.jsonl");
    let resume = std::path::Path::new(&out).exists();
    let opened = Batch::new(&subagents, "spawn")
        .concurrency(4)
        .out(&out)
        .resume(resume)
        .open(tasks, CancellationToken::new())
        .unwrap_or_else(|error| panic!("the batch was refused: {error}"));
    let summary = runtime.block_on(opened.run(Lines));
    let _ = summary.write_to(&mut std::io::stderr());
    eprintln!("results: {out}");
}
