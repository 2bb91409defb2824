//! The run tree while `run` works, on stderr.
//!
//! On a terminal the tree is redrawn in place as events arrive: each child
//! with its provider, label, state and latest progress line (at most ten
//! times a second, and once more at the end); it is cleared when the runs
//! are done, leaving the final tree `run` prints on stdout. Elsewhere (a
//! pipe, a file) it is one plain line as each child starts and one as it
//! ends. Every piece of text goes through [`crate::terminal`]: labels and
//! progress come from a model.
//!
//! ```text
//! ─ spawn [review the parser] running: tool read_file: completed
//!   ─ spawn [check the docs] completed
//! ```
//!
//! `fanout`'s progress bar gets a line below it from [`per_provider`]:
//! how many runs each provider has going, and how many it finished.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use std::sync::Mutex;

use indicatif::ProgressBar;
use subagents::events::ListenerHandle;
use subagents::seam::ProgressUpdate;
use subagents::{StopReason, SubagentEvent, Subagents};

use crate::terminal;

/// The most children drawn; the rest are counted on one line.
const MAX_ROWS: usize = 40;
/// The longest progress line shown, in characters.
const MAX_PROGRESS: usize = 80;
/// How often the tree is redrawn at most.
const REDRAW_EVERY: Duration = Duration::from_millis(100);

struct Row {
    id: String,
    provider: String,
    label: Option<String>,
    depth: usize,
    latest: String,
    ended: Option<StopReason>,
}

/// The live tree of one `run`.
pub struct Live {
    terminal: bool,
    rows: BTreeMap<u64, Row>,
    drawn: usize,
    last_draw: Option<Instant>,
}

impl Live {
    /// A view on stderr: redrawn when it is a terminal, plain lines else.
    pub fn on_stderr() -> Live {
        Live { terminal: std::io::stderr().is_terminal(), rows: BTreeMap::new(), drawn: 0, last_draw: None }
    }

    /// Takes one event into the tree.
    pub fn note(&mut self, event: &SubagentEvent) {
        match event {
            SubagentEvent::Start(info) => {
                let parent = info.parent_session.as_deref();
                let depth =
                    self.rows.values().find(|row| Some(row.id.as_str()) == parent).map_or(0, |row| row.depth + 1);
                let row = Row {
                    id: info.child_id.clone(),
                    provider: info.provider.clone(),
                    label: info.label.clone(),
                    depth,
                    latest: String::new(),
                    ended: None,
                };
                if !self.terminal {
                    terminal::say!("{} started", row.title());
                }
                self.rows.insert(info.run_id, row);
            }
            SubagentEvent::End(end) => {
                if let Some(row) = self.rows.get_mut(&end.run_id) {
                    row.ended = Some(end.stop_reason);
                    if !self.terminal {
                        terminal::say!("{} {}", row.title(), end.stop_reason.as_str());
                    }
                }
            }
            SubagentEvent::Progress(progress) => {
                if let (Some(row), Some(line)) = (self.rows.get_mut(&progress.run_id), describe(&progress.update)) {
                    row.latest = line;
                }
            }
            _ => return,
        }
        let due = self.last_draw.is_none_or(|at| at.elapsed() >= REDRAW_EVERY);
        if self.terminal && (due || !matches!(event, SubagentEvent::Progress(_))) {
            self.draw();
        }
    }

    /// Clears the drawn tree (a terminal only): the runs are done.
    pub fn finish(&mut self) {
        if self.terminal && self.drawn > 0 {
            let mut stderr = std::io::stderr().lock();
            let _ = write!(stderr, "\x1b[{}A\x1b[J", self.drawn);
            let _ = stderr.flush();
            self.drawn = 0;
        }
    }

    fn draw(&mut self) {
        let mut block = String::new();
        if self.drawn > 0 {
            // Back to where the last drawing began, and clear below.
            block.push_str(&format!("\x1b[{}A\x1b[J", self.drawn));
        }
        let mut lines = 0;
        for row in self.rows.values().take(MAX_ROWS) {
            let state = match row.ended {
                Some(reason) => reason.as_str().to_owned(),
                None if row.latest.is_empty() => "running".to_owned(),
                None => format!("running: {}", row.latest),
            };
            let indent = "  ".repeat(row.depth.min(12));
            block.push_str(&format!("{indent}{} {}\n", row.title(), terminal::line(&state)));
            lines += 1;
        }
        if self.rows.len() > MAX_ROWS {
            block.push_str(&format!("… and {} more\n", self.rows.len() - MAX_ROWS));
            lines += 1;
        }
        let mut stderr = std::io::stderr().lock();
        let _ = stderr.write_all(block.as_bytes());
        let _ = stderr.flush();
        self.drawn = lines;
        self.last_draw = Some(Instant::now());
    }
}

impl Row {
    /// `─ provider [label]`, its text made safe for a terminal.
    fn title(&self) -> String {
        let title = match &self.label {
            Some(label) => format!("─ {} [{label}]", self.provider),
            None => format!("─ {}", self.provider),
        };
        terminal::line(&title).into_owned()
    }
}

/// One line for a progress update, shortened; a message chunk says only
/// that the child is writing.
fn describe(update: &ProgressUpdate) -> Option<String> {
    let line = match update {
        ProgressUpdate::MessageChunk { .. } => "writing".to_owned(),
        ProgressUpdate::ToolCall { name, status } => format!("tool {name}: {}", status.as_str()),
        ProgressUpdate::Plan { entries } => format!("plan: {}", entries.first()?),
        ProgressUpdate::Delegated { update } => describe(update)?,
        _ => return None,
    };
    Some(line.chars().take(MAX_PROGRESS).collect())
}

/// Keeps `bar`'s message at one line per provider, `spawn: 3 running, 12
/// done`, while the handle is held. Nothing for a hidden bar.
pub fn per_provider(subagents: &Subagents, bar: &ProgressBar) -> Option<ListenerHandle> {
    if bar.is_hidden() {
        return None;
    }
    let (bar, counts) = (bar.clone(), Mutex::new(BTreeMap::<String, (u64, u64)>::new()));
    let listener = move |event: &SubagentEvent| {
        let mut counts = counts.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match event {
            SubagentEvent::Start(info) => counts.entry(info.provider.clone()).or_default().0 += 1,
            SubagentEvent::End(end) => {
                let (running, done) = counts.entry(end.provider.clone()).or_default();
                *running = running.saturating_sub(1);
                *done += 1;
            }
            _ => return,
        }
        let lines: Vec<String> = counts
            .iter()
            .take(MAX_ROWS)
            .map(|(provider, (running, done))| {
                terminal::line(&format!("{provider}: {running} running, {done} done")).into_owned()
            })
            .collect();
        if bar.is_finished() {
            return; // an event after the batch: the bar is gone for good
        }
        // Every run counts, the tasks' own and the children they start.
        bar.set_message(format!("\nruns by provider, children included:\n{}", lines.join("\n")));
    };
    Some(subagents.add_listener(listener))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rows_title_loses_escapes_and_a_bidi_override() {
        let row = Row {
            id: "run-1".to_owned(),
            provider: "spawn".to_owned(),
            label: Some("review\u{202e}fdp.exe\u{1b}]0;pwned\u{7}".to_owned()),
            depth: 0,
            latest: String::new(),
            ended: None,
        };
        assert_eq!(row.title(), "─ spawn [reviewfdp.exe]");
    }
}
