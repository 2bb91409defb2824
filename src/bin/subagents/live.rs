//! The run tree while `run` works, on stderr.
//!
//! On a terminal the tree is drawn from the moment the parent starts and
//! redrawn in place: the parent on top, each child below its parent with
//! its provider, label, state, time so far and latest progress line (at
//! most ten times a second, and every quarter second for the clocks); it
//! is cleared when the runs are done, leaving the final tree `run` prints
//! on stdout. A line said meanwhile ([`Live::above`], Ctrl-C's) is written
//! above the tree, never into it. Elsewhere (a pipe, a file) it is one
//! plain line as each child starts and one as it ends. Every piece of text
//! goes through [`crate::terminal`]: labels and progress come from a model.
//!
//! ```text
//! parent (scripted) running 3.2s
//! ├─ spawn [review the parser] running 2.9s: tool read_file: completed
//! │  └─ spawn [check the docs] completed 616µs
//! └─ spawn [check the tests] running 2.8s
//! ```
//!
//! `fanout`'s progress bar gets a line below it from [`per_provider`]:
//! how many runs each provider has going, and how many it finished.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::ProgressBar;
use subagents::events::ListenerHandle;
use subagents::seam::ProgressUpdate;
use subagents::{StopReason, SubagentEvent, Subagents};

use crate::terminal;

/// The most children drawn; the rest are counted on one line.
const MAX_ROWS: usize = 40;
/// The deepest indentation drawn.
const MAX_INDENT: usize = 12;
/// The longest progress line shown, in characters.
const MAX_PROGRESS: usize = 80;
/// How often the tree is redrawn at most.
const REDRAW_EVERY: Duration = Duration::from_millis(100);
/// How often the clocks move while nothing happens.
pub const TICK_EVERY: Duration = Duration::from_millis(250);

struct Row {
    id: String,
    parent: Option<String>,
    provider: String,
    label: Option<String>,
    latest: String,
    started: Instant,
    ended: Option<(StopReason, Duration)>,
    /// Why it failed, when its result says.
    why: Option<String>,
}

/// The live tree of one `run`: a handle, shared by the task that feeds it
/// events and whoever says something above it.
#[derive(Clone)]
pub struct Live(Arc<Mutex<View>>);

struct View {
    terminal: bool,
    /// The parent's session: the runs it started hang under it.
    root: String,
    /// The parent's line, `parent (model)`.
    root_title: String,
    started: Instant,
    rows: BTreeMap<u64, Row>,
    drawn: usize,
    last_draw: Option<Instant>,
    /// Cleared for good: what is said now is said plainly.
    finished: bool,
    /// A question is on the screen: the tree waits below it.
    asking: bool,
}

impl Live {
    /// A view on stderr of the runs under session `root` (titled `title`):
    /// drawn at once and redrawn when stderr is a terminal, plain lines else.
    pub fn on_stderr(root: &str, title: &str) -> Live {
        let view = View {
            terminal: std::io::stderr().is_terminal(),
            root: root.to_owned(),
            root_title: terminal::line(title).into_owned(),
            started: Instant::now(),
            rows: BTreeMap::new(),
            drawn: 0,
            last_draw: None,
            finished: false,
            asking: false,
        };
        let live = Live(Arc::new(Mutex::new(view)));
        live.view().redraw(true);
        live
    }

    fn view(&self) -> std::sync::MutexGuard<'_, View> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes one event into the tree.
    pub fn note(&self, event: &SubagentEvent) {
        let mut view = self.view();
        match event {
            SubagentEvent::Start(info) => {
                let row = Row {
                    id: info.child_id.clone(),
                    parent: info.parent_session.clone(),
                    provider: info.provider.clone(),
                    label: info.label.clone(),
                    latest: String::new(),
                    started: Instant::now(),
                    ended: None,
                    why: None,
                };
                if !view.terminal {
                    terminal::say!("{} started", row.title());
                }
                view.rows.insert(info.run_id, row);
            }
            SubagentEvent::End(end) => {
                let terminal = view.terminal;
                if let Some(row) = view.rows.get_mut(&end.run_id) {
                    row.ended = Some((end.stop_reason, row.started.elapsed()));
                    row.why = end.diagnostic.as_ref().map(|diagnostic| match diagnostic.explanation() {
                        Some(explanation) => format!("{}: {explanation}", diagnostic.category_name()),
                        None => diagnostic.category_name(),
                    });
                    if !terminal {
                        match &row.why {
                            Some(why) => {
                                terminal::say!("{} {} ({})", row.title(), end.stop_reason.as_str(), terminal::line(why))
                            }
                            None => terminal::say!("{} {}", row.title(), end.stop_reason.as_str()),
                        }
                    }
                }
            }
            SubagentEvent::Progress(progress) => {
                if let (Some(row), Some(line)) = (view.rows.get_mut(&progress.run_id), describe(&progress.update)) {
                    row.latest = line;
                }
            }
            _ => return,
        }
        view.redraw(!matches!(event, SubagentEvent::Progress(_)));
    }

    /// Moves the clocks (a terminal only), at most every [`REDRAW_EVERY`].
    pub fn tick(&self) {
        self.view().redraw(false);
    }

    /// Says `text` (made safe by the caller) on stderr above the tree,
    /// which is drawn again below it.
    pub fn above(&self, text: &str) {
        let mut view = self.view();
        if !view.terminal || view.finished {
            eprintln!("{text}");
            return;
        }
        let mut block = view.clear();
        block.push_str(text);
        block.push('\n');
        view.write(&block);
        view.redraw(true);
    }

    /// Clears the tree and writes `question` (made safe by the caller) in
    /// its place, on a terminal; the tree is not drawn again until
    /// [`Live::resume`], so a person can read and answer it. What they
    /// type stays on the screen above the tree.
    pub fn ask(&self, question: &str) {
        let mut view = self.view();
        let mut block = view.clear();
        block.push_str(question);
        view.asking = true;
        view.write(&block);
    }

    /// Draws the tree again below the question and its answer.
    pub fn resume(&self) {
        let mut view = self.view();
        view.asking = false;
        view.redraw(true);
    }

    /// Clears the drawn tree (a terminal only): the runs are done.
    pub fn finish(&self) {
        let mut view = self.view();
        view.finished = true;
        let block = view.clear();
        view.write(&block);
    }
}

impl View {
    /// The escapes that take the cursor back to where the drawing began
    /// and clear below; nothing drawn, nothing to clear.
    fn clear(&mut self) -> String {
        let drawn = std::mem::take(&mut self.drawn);
        match drawn {
            0 => String::new(),
            lines => format!("\x1b[{lines}A\x1b[J"),
        }
    }

    fn write(&self, block: &str) {
        if block.is_empty() {
            return;
        }
        let mut stderr = std::io::stderr().lock();
        let _ = stderr.write_all(block.as_bytes());
        let _ = stderr.flush();
    }

    /// Draws the tree again on a terminal: at once when `now`, else when
    /// the last drawing is old enough.
    fn redraw(&mut self, now: bool) {
        let due = self.last_draw.is_none_or(|at| at.elapsed() >= REDRAW_EVERY);
        if !self.terminal || self.finished || self.asking || !(now || due) {
            return;
        }
        let mut block = self.clear();
        let state = match self.rows.values().all(|row| row.ended.is_some()) && !self.rows.is_empty() {
            true => "waiting on its last turn",
            false => "running",
        };
        block.push_str(&format!("{} {state} {}\n", self.root_title, terminal::human(self.started.elapsed())));
        let mut lines = vec![];
        self.lines(Some(self.root.as_str()), "", &mut lines);
        // A run whose parent is no row (a parent the tree does not know).
        let known: Vec<&str> = self.rows.values().map(|row| row.id.as_str()).collect();
        let strays: Vec<&Row> = self
            .rows
            .values()
            .filter(|row| row.parent.as_deref().is_none_or(|p| p != self.root && !known.contains(&p)))
            .collect();
        for row in strays {
            lines.push(format!("? {}", self.describe(row)));
        }
        let shown = lines.len().min(MAX_ROWS);
        for line in &lines[..shown] {
            block.push_str(line);
            block.push('\n');
        }
        let mut drawn = 1 + shown;
        if lines.len() > MAX_ROWS {
            block.push_str(&format!("… and {} more\n", lines.len() - MAX_ROWS));
            drawn += 1;
        }
        self.write(&block);
        self.drawn = drawn;
        self.last_draw = Some(Instant::now());
    }

    /// The rows under `parent`, depth first, each with its branch glyphs.
    fn lines(&self, parent: Option<&str>, indent: &str, out: &mut Vec<String>) {
        let children: Vec<&Row> = self.rows.values().filter(|row| row.parent.as_deref() == parent).collect();
        for (n, row) in children.iter().enumerate() {
            let last = n + 1 == children.len();
            let (branch, next) = if last { ("└─", "   ") } else { ("├─", "│  ") };
            out.push(format!("{indent}{branch}{}", &self.describe(row)["─".len()..]));
            if indent.chars().count() < MAX_INDENT * 3 && out.len() <= MAX_ROWS {
                self.lines(Some(&row.id), &format!("{indent}{next}"), out);
            }
        }
    }

    /// `─ provider [label] state time: latest`.
    fn describe(&self, row: &Row) -> String {
        let state = match row.ended {
            Some((reason, took)) => match &row.why {
                Some(why) => format!("{} {} ({why})", reason.as_str(), terminal::human(took)),
                None => format!("{} {}", reason.as_str(), terminal::human(took)),
            },
            None if row.latest.is_empty() => format!("running {}", terminal::human(row.started.elapsed())),
            None => format!("running {}: {}", terminal::human(row.started.elapsed()), row.latest),
        };
        format!("{} {}", row.title(), terminal::line(&state))
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
            parent: None,
            provider: "spawn".to_owned(),
            label: Some("review\u{202e}fdp.exe\u{1b}]0;pwned\u{7}".to_owned()),
            latest: String::new(),
            started: Instant::now(),
            ended: None,
            why: None,
        };
        assert_eq!(row.title(), "─ spawn [reviewfdp.exe]");
    }
}
