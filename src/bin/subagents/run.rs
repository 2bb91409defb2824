//! `subagents run "PROMPT"`: one parent agent that can delegate.

use std::path::PathBuf;

use subagents::agent::{Agent, SessionStore};
use subagents::{CancellationToken, StopReason};

use crate::setup::{cancel_on_ctrl_c, setup, toolset};
use crate::terminal::{self, say};
use crate::timeline::{tree, Timeline};

pub struct RunArgs {
    pub prompt: String,
    pub provider: String,
    pub model: String,
    pub home: Option<PathBuf>,
}

/// Prints the answer and the tree of delegated runs; `Ok(false)` when the
/// parent's turn did not complete.
pub fn run(args: RunArgs) -> Result<bool, String> {
    let setup = setup(&args.model, args.home)?;
    if !setup.subagents.has_provider(&args.provider) {
        let available = setup.subagents.list().join(", ");
        setup.runtime.shutdown_blocking();
        return Err(format!("unknown provider {:?} (available: {available})", args.provider));
    }
    let cancel = CancellationToken::new();
    cancel_on_ctrl_c(cancel.clone());
    let parent = Agent::builder_shared(setup.model.clone())
        .store(SessionStore::new(&setup.home))
        .cwd(&setup.cwd)
        .toolset(toolset(&setup.subagents, &setup.tasks, &args.provider))
        .cancel_token(cancel)
        .build()
        .map_err(|e| format!("cannot create the parent agent: {e}"))?;
    let timeline = Timeline::record(&setup.subagents);
    let outcome = setup.runtime.block_on({
        let parent = parent.clone();
        async move {
            let outcome = parent.prompt(args.prompt).await;
            // Cancels and awaits any background task it left behind.
            if let Err(error) = parent.shutdown().await {
                say!("subagents: the parent session was not saved: {error}");
            }
            outcome
        }
    });
    let spans = timeline.finish();
    println!("{}", terminal::text(&outcome.output));
    println!();
    let parent_line = format!("parent {} ({}): {}", parent.id(), parent.model_name(), outcome.stop_reason);
    println!("{}", terminal::line(&parent_line));
    print!("{}", tree(&spans, parent.id()));
    println!("{}", terminal::line(&format!("sessions: {}", setup.home.join("sessions").display())));
    if let Some(error) = &outcome.error {
        // The error may quote the model endpoint's own words.
        say!("subagents: the parent's turn failed: {error}");
    }
    let report = setup.runtime.shutdown_blocking();
    if !report.live_after.is_quiescent() {
        return Err(format!("runs left alive after shutdown: {:?}", report.live_after));
    }
    Ok(outcome.stop_reason == StopReason::Completed)
}
