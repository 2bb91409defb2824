//! `subagents run "PROMPT"`: one parent agent that can delegate.

use std::process::ExitCode;

use subagents::agent::{Agent, SessionStore};
use subagents::{CancellationToken, StopReason};
use tracing::Instrument;

use crate::args::{RemoteArgs, Sources, TelemetryArgs};
use crate::asking::TerminalApprover;
use crate::setup::{cancel_on_ctrl_c, setup, toolset, Shown};
use crate::terminal::{self, say, QuietControlKeys};
use crate::timeline::{tree, Timeline};
use crate::Ended;

/// `subagents run`'s flags.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// The task.
    prompt: String,
    /// Serve a web view of the run's tree on loopback while it runs (its
    /// address, with its token, is printed on stderr).
    #[arg(long)]
    ui: bool,
    /// The one provider the parent's subagent tool delegates to
    /// (default: what the configuration's `[tool]` offers; built in: `spawn`).
    #[arg(long)]
    provider: Option<String>,
    #[command(flatten)]
    sources: Sources,
    #[command(flatten)]
    remote: RemoteArgs,
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
}

impl RunArgs {
    pub fn run(self) -> Result<ExitCode, String> {
        run(self).map(ExitCode::from)
    }
}

/// Prints the answer and the tree of delegated runs. The parent's turn
/// decides how it ended: completed, interrupted by Ctrl-C (its session is
/// still closed whole), or anything else, which is incomplete.
fn run(args: RunArgs) -> Result<Ended, String> {
    let config = &args.sources.config.load()?;
    if args.prompt.trim().is_empty() {
        return Err("the prompt is empty: give the task to run".to_owned());
    }
    let offered = match &args.provider {
        Some(provider) => vec![provider.clone()],
        None => config.tool_providers().to_vec(),
    };
    let provider = args.provider.as_deref().unwrap_or_default();
    let setup = setup(&args.sources.model.model, args.sources.home.resolve(), provider, &args.remote, config)?;
    offered.iter().try_for_each(|provider| setup.check_provider(provider))?;
    let cancel = CancellationToken::new();
    let built = Agent::builder_shared(setup.model.clone())
        .store(SessionStore::new(&setup.home))
        .cwd(&setup.cwd)
        .toolset(toolset(&setup.subagents, &setup.tasks, &offered, config.tool_max_depth()))
        .cancel_token(cancel.clone())
        .build();
    let parent = built.map_err(|error| format!("cannot create the parent agent: {error}"))?;
    let ui = args
        .ui
        .then(|| crate::commands::ui::serve_run(&setup.home, &setup.subagents, parent.id(), config.routes().cloned()))
        .transpose()?;
    let timeline = Timeline::record(&setup.runtime, parent.id(), &format!("parent ({})", parent.model_name()));
    cancel_on_ctrl_c(&setup.runtime, cancel.clone(), Shown::Live(timeline.live()));
    // On a terminal, what a child's provider leaves to `ask` is asked here.
    if let Some(approver) = TerminalApprover::on_terminal(timeline.live()) {
        setup.subagents.set_approver(approver);
    }
    // The echo of ^C would land inside the drawn tree, a line it does not count.
    let _quiet = QuietControlKeys::hold();
    // The parent is no run: its own span roots the trace its runs hang
    // under (filled only when exported, so log lines stay short).
    let span = tracing::info_span!(
        "parent",
        otel.name = tracing::field::Empty,
        otel.kind = tracing::field::Empty,
        gen_ai.operation.name = tracing::field::Empty,
        gen_ai.agent.name = tracing::field::Empty,
        gen_ai.conversation.id = tracing::field::Empty,
    );
    if subagents::telemetry::records_gen_ai() {
        span.record("otel.name", "invoke_agent parent");
        span.record("otel.kind", "internal");
        span.record("gen_ai.operation.name", "invoke_agent");
        span.record("gen_ai.agent.name", "parent");
        span.record("gen_ai.conversation.id", parent.id());
    }
    let (outcome, saved) = setup.runtime.block_on({
        let parent = parent.clone();
        async move {
            let outcome = parent.prompt(args.prompt).await;
            // Cancels and awaits any background task it left behind, then
            // closes the session after its last whole line.
            let saved = parent.shutdown().await;
            (outcome, saved)
        }
        .instrument(span)
    });
    drop(ui);
    let spans = timeline.finish(&setup.runtime);
    terminal::out(&terminal::text(&outcome.output));
    terminal::out("");
    let parent_line = format!("parent {} ({}): {}", parent.id(), parent.model_name(), outcome.stop_reason);
    terminal::out(&terminal::line(&parent_line));
    print!("{}", tree(&spans, parent.id()));
    terminal::out(&terminal::line(&format!("sessions: {}", setup.home.join("sessions").display())));
    let mut all_done = outcome.stop_reason == StopReason::Completed;
    if let Some(error) = &outcome.error {
        // The error may quote the model endpoint's own words.
        say!("subagents: the parent's turn failed: {error}");
    }
    if let Err(error) = saved {
        say!("subagents: the parent session was not saved: {error}");
        all_done = false;
    }
    let report = setup.runtime.shutdown();
    if !report.live_after.is_quiescent() {
        say!("subagents: runs left alive after shutdown: {:?}", report.live_after);
        all_done = false;
    }
    Ok(Ended::new(cancel.is_cancelled(), all_done))
}
