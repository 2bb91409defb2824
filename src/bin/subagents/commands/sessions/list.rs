//! `subagents sessions list`: every session in brief (its provider, state,
//! turns, tool calls, time, tokens and size), newest first, and
//! the filters that narrow it (`--provider`, `--state`, `--since`,
//! `--limit`).

use std::path::PathBuf;

use serde_json::{json, Value};
use subagents::agent::{SessionStore, SessionSummary};

use super::{created, days_from_civil, read_all, summary, write_out};
use crate::terminal;
use crate::Ended;

/// What `sessions list` keeps.
#[derive(clap::Args, Debug, Default)]
pub(super) struct ListFilters {
    /// Only sessions this provider ran (`-` for those no provider did: top-level ones).
    #[arg(long)]
    provider: Option<String>,
    /// Only sessions in this state: a stop reason (`completed`, `error`,
    /// `aborted`, …), `open` (a turn not ended) or `torn`.
    #[arg(long)]
    state: Option<String>,
    /// Only sessions created since: a span back from now (`30m`, `2h`,
    /// `7d`) or a date (`YYYY-MM-DD`, UTC).
    #[arg(long, value_parser = since)]
    since: Option<u64>,
    /// At most this many sessions (the newest).
    #[arg(long)]
    limit: Option<usize>,
}

impl ListFilters {
    fn keeps(&self, session: &SessionSummary) -> bool {
        let provider = session.header.provider.as_deref().unwrap_or("-");
        self.provider.as_ref().is_none_or(|wanted| wanted == provider)
            && self.state.as_ref().is_none_or(|wanted| *wanted == state(session) || (wanted == "torn" && session.torn))
            && self.since.is_none_or(|since| session.header.created_at_ms >= since)
    }
}

/// `--since` as milliseconds since the epoch.
fn since(text: &str) -> Result<u64, String> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    if let Some((digits, unit)) = text.char_indices().last().map(|(at, unit)| (&text[..at], unit)) {
        let unit_ms = match unit {
            's' => Some(1_000),
            'm' => Some(60_000),
            'h' => Some(3_600_000),
            'd' => Some(86_400_000),
            _ => None,
        };
        if let (Some(unit_ms), Ok(count)) = (unit_ms, digits.parse::<u64>()) {
            return Ok(now.saturating_sub(count.saturating_mul(unit_ms)));
        }
    }
    let parts: Vec<&str> = text.split('-').collect();
    if let [year, month, day] = parts[..] {
        if let (Ok(year), Ok(month), Ok(day)) = (year.parse::<i64>(), month.parse::<u32>(), day.parse::<u32>()) {
            if (1..=12).contains(&month) && (1..=31).contains(&day) {
                return Ok(days_from_civil(year, month, day).max(0) as u64 * 86_400_000);
            }
        }
    }
    Err(format!("{text:?} is neither a span back from now (30m, 2h, 7d) nor a date (YYYY-MM-DD)"))
}

/// A session's state: the last turn's stop reason, `open` while a turn
/// has not ended, `-` when none ever began.
pub(super) fn state(session: &SessionSummary) -> String {
    match (session.open_turn, session.last_stop_reason) {
        (true, _) => "open".to_owned(),
        (false, Some(reason)) => reason.to_string(),
        (false, None) => "-".to_owned(),
    }
}

/// A session's label, else the first words of its first prompt (at most
/// 60 characters, one line).
fn described(session: &SessionSummary) -> String {
    let (text, quoted) = match (&session.header.label, &session.first_prompt) {
        (Some(label), _) => (label.as_str(), false),
        (None, Some(prompt)) => (prompt.as_str(), true),
        (None, None) => return String::new(),
    };
    let words = terminal::line(text).split_whitespace().collect::<Vec<_>>().join(" ");
    let mut cut: String = words.chars().take(60).collect();
    if cut.len() < words.len() {
        cut.push('…');
    }
    if quoted {
        format!("\"{cut}\"")
    } else {
        cut
    }
}

pub(super) fn list(store: &SessionStore, filters: &ListFilters, as_json: bool) -> Result<Ended, String> {
    let mut listed = read_all(store)?;
    let unreadable = listed.iter().filter(|l| l.read.is_err()).count();
    // Newest first, the unreadable ones still last; then the filters.
    let split = listed.iter().position(|l| l.read.is_err()).unwrap_or(listed.len());
    listed[..split].reverse();
    listed.retain(|l| l.read.as_ref().map_or(true, |session| filters.keeps(session)));
    listed.truncate(filters.limit.unwrap_or(usize::MAX));
    if as_json {
        let sessions: Vec<Value> = listed
            .iter()
            .map(|l| match &l.read {
                Ok(session) => summary(session),
                Err(error) => json!({"id": l.id, "error": error}),
            })
            .collect();
        write_out(|out| writeln!(out, "{}", json!({ "sessions": sessions })))?;
    } else if listed.is_empty() {
        let dir = store.dir().unwrap_or(&PathBuf::new()).display().to_string();
        write_out(|out| writeln!(out, "no sessions under {}", terminal::line(&dir)))?;
    } else {
        write_out(|out| {
            writeln!(
                out,
                "{:<38} {:<12} {:<10} {:<21} {:>5} {:>11} {:>8} {:>9} {:>9}  label or prompt",
                "id", "provider", "state", "created", "turns", "tools", "time", "tokens", "bytes"
            )?;
            for l in &listed {
                let line = match &l.read {
                    Ok(s) => format!(
                        "{:<38} {:<12} {:<10} {:<21} {:>5} {:>11} {:>8} {:>9} {:>9}  {}{}",
                        s.header.id,
                        s.header.provider.as_deref().map_or("-".to_owned(), |p| p.chars().take(12).collect()),
                        state(s),
                        created(s.header.created_at_ms),
                        s.turns,
                        match s.tool_calls_failed {
                            0 => s.tool_calls.to_string(),
                            failed => format!("{} ({failed}✗)", s.tool_calls),
                        },
                        s.duration_ms.map_or("-".to_owned(), |ms| match ms {
                            0 => "<1ms".to_owned(),
                            ms => terminal::human(std::time::Duration::from_millis(ms)),
                        }),
                        match s.usage.tokens() {
                            0 => "-".to_owned(),
                            tokens => tokens.to_string(),
                        },
                        s.bytes,
                        described(s),
                        if s.torn { "  (torn last line left out)" } else { "" }
                    ),
                    Err(error) => format!("{:<38} unreadable: {error}", l.id),
                };
                writeln!(out, "{}", terminal::line(&line))?;
            }
            Ok(())
        })?;
    }
    // A corrupt file is reported, not fatal; it still counts as work not done.
    Ok(if unreadable == 0 { Ended::Completed } else { Ended::Incomplete })
}
