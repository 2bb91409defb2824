//! `subagents approve [ID allow|always|reject]`: answers a child's
//! permission request that a `fanout` parked in the home (see
//! [`subagents::batch::ParkedApprover`]), from another terminal or
//! process. Without an id it lists what waits: each request's id, who
//! asks and the call, one safe line each.
//!
//! Only a request that still waits can be answered, once: an id that was
//! answered, expired or whose run ended is refused (exit 1), as is one that
//! was never parked, and one whose batch is gone (killed while it waited):
//! such an answer is never kept for anything later. `always` covers what
//! the request says it covers (the tool it names, else only this same
//! call), and the answer says so.

use std::process::ExitCode;

use subagents::batch::{answer, pending, AnswerError};
use subagents::seam::Verdict;

use crate::args::HomeArgs;
use crate::terminal::{self, say};

/// `subagents approve`'s flags.
#[derive(clap::Args, Debug)]
pub struct ApproveArgs {
    /// The request to answer, as the list shows it (without: list those that wait).
    id: Option<String>,
    /// The answer: allow (once), always (the tool the request names, else only this same call, for the rest of its run; the answer says which) or reject.
    #[arg(value_enum, requires = "id")]
    answer: Option<AnswerName>,
    #[command(flatten)]
    home: HomeArgs,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum AnswerName {
    Allow,
    Always,
    Reject,
}

impl ApproveArgs {
    pub fn run(self) -> Result<ExitCode, String> {
        let home = self.home.resolve();
        let (id, verdict) = match (self.id, self.answer) {
            (None, _) => return list(&home),
            (Some(id), None) => {
                return Err(format!("answer {id} with allow, always or reject: subagents approve {id} allow"))
            }
            (Some(id), Some(answer)) => (id, answer),
        };
        let verdict = match verdict {
            AnswerName::Allow => Verdict::AllowOnce,
            AnswerName::Always => Verdict::AllowAlways,
            AnswerName::Reject => Verdict::Reject,
        };
        match answer(&home, &id, verdict) {
            Ok(parked) => {
                say!("{id}: {verdict} — {} asked to run: {}", parked.request.asker_line(), parked.request.call_line());
                if verdict == Verdict::AllowAlways {
                    say!("{id}: always covers {}", parked.request.always_covers());
                }
                Ok(ExitCode::SUCCESS)
            }
            Err(error @ (AnswerError::NotPending(_) | AnswerError::NotAnId(_) | AnswerError::Gone(_))) => {
                say!("subagents: {error}");
                Ok(ExitCode::from(1))
            }
            Err(error) => Err(error.to_string()),
        }
    }
}

fn list(home: &std::path::Path) -> Result<ExitCode, String> {
    let waiting = pending(home).map_err(|error| error.to_string())?;
    if waiting.is_empty() {
        say!("no permission request is waiting in {}", home.display());
    }
    for parked in waiting {
        let line = format!(
            "{}  {} asks to run: {} (always would cover {})",
            parked.id,
            parked.request.asker_line(),
            parked.request.call_line(),
            parked.request.always_covers()
        );
        terminal::out(&terminal::line(&line));
    }
    Ok(ExitCode::SUCCESS)
}
