//! `subagents merge OUT.jsonl [--into BRANCH] [--only ID,…] [--squash]
//! [--json]`: the branches a batch's runs worked on (`workspace =
//! "worktree"`), merged back in task order in a scratch worktree, with a
//! report of what merged, conflicted, was empty or came from a failed run
//! (see `subagents::workspace::merge`).
//!
//! The report is a table on stdout (every task id, branch and file name
//! made one safe line), or with `--json` one JSON document. Exit 0 when
//! nothing conflicted or failed to merge, 1 when something did, 2 when
//! the merge could not start.

use std::path::PathBuf;
use std::process::ExitCode;

use subagents::workspace::{merge, MergeOptions, MergeOutcome, MergeReport};

use crate::terminal::{line, out};

/// `subagents merge`'s flags.
#[derive(clap::Args, Debug)]
pub struct MergeArgs {
    /// The batch's results file (`fanout --out`).
    out: PathBuf,
    /// The branch to merge into, moved when every merge succeeded
    /// (default: the checked-out branch, not moved).
    #[arg(long, value_name = "BRANCH")]
    into: Option<String>,
    /// Only these task ids, comma-separated.
    #[arg(long, value_name = "ID,…", value_delimiter = ',')]
    only: Option<Vec<String>>,
    /// One squashed commit per task instead of a merge commit.
    #[arg(long)]
    squash: bool,
    /// Print the report as one JSON document.
    #[arg(long)]
    json: bool,
}

impl MergeArgs {
    pub fn run(self) -> Result<ExitCode, String> {
        let options = MergeOptions { repo: None, into: self.into, only: self.only, squash: self.squash };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
        let report = runtime.block_on(merge(&self.out, &options)).map_err(|e| e.to_string())?;
        match self.json {
            true => out(&serde_json::to_string(&report).map_err(|e| e.to_string())?),
            false => print_table(&report),
        }
        Ok(ExitCode::from(u8::from(report.blocked())))
    }
}

/// The report as a table, then what became of the target.
fn print_table(report: &MergeReport) {
    let id_width = report.tasks.iter().map(|task| task.id.chars().count().min(32)).max().unwrap_or(4).max(4);
    out(&format!("{:<id_width$}  {:<14}  branch", "task", "outcome"));
    for task in &report.tasks {
        let id: String = task.id.chars().take(32).collect();
        let mut row = format!("{:<id_width$}  {:<14}  {}", line(&id), task.outcome.as_str(), line(&task.branch));
        if !task.files.is_empty() {
            row.push_str(&format!("  ({})", line(&task.files.join(", "))));
        }
        if let Some(detail) = &task.detail {
            row.push_str(&format!("  {}", line(detail)));
        }
        out(&row);
    }
    let counts = [
        (MergeOutcome::Merged, "merged"),
        (MergeOutcome::AlreadyMerged, "already merged"),
        (MergeOutcome::Conflict, "conflicting"),
        (MergeOutcome::Empty, "empty"),
        (MergeOutcome::FailedRun, "failed runs"),
        (MergeOutcome::Missing, "missing"),
        (MergeOutcome::Error, "errors"),
    ];
    let said: Vec<String> = counts
        .iter()
        .filter(|(outcome, _)| report.count(*outcome) > 0)
        .map(|(outcome, name)| format!("{} {name}", report.count(*outcome)))
        .collect();
    out(&format!("{}; result on branch {} ({})", said.join(", "), line(&report.result_branch), short(&report.commit)));
    if let Some(why) = &report.result_not_moved {
        out(&format!("{} not moved: {}", line(&report.result_branch), line(why)));
    }
    match (&report.not_moved, report.moved) {
        (_, true) => out(&format!("{} moved to {}", line(&report.target), short(&report.commit))),
        (Some(why), false) => out(&format!("{} not moved: {}", line(&report.target), line(why))),
        (None, false) => out(&format!("{} not moved (--into moves it)", line(&report.target))),
    }
}

/// A commit id's first twelve characters.
fn short(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}
