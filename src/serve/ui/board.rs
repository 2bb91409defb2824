//! The [`Board`]: a batch's live state as the web view shows it, fed by
//! any of three sources at once — the batch engine's [`Report`] (the
//! `--ui` of a command that runs the batch), the batch's out file followed
//! as it grows (`subagents ui --out FILE`), and the runtime's events (every
//! run of every provider, the tasks' children included).
//!
//! Aggregates (counts by outcome, per provider, tokens, waits, rate, ETA)
//! are kept here, on the server, so a page never adds up 10,000 rows; the
//! settled runs are kept as small [`Row`]s (their text bounded) that the
//! page reads a window at a time. Every change bumps a version that the
//! event streams wait on.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::agent::ModelRoute;
use crate::batch::{read_line, Report, Settled};
use crate::events::ListenerHandle;
use crate::{SubagentEvent, Subagents};

/// The longest label or failure reason a row keeps, in characters.
const MAX_ROW_TEXT: usize = 500;
/// The most settled runs kept as rows; past it, runs are only counted.
pub(super) const MAX_ROWS: usize = 1_000_000;
/// The most runs (of every provider) the event feed remembers for trees.
const MAX_LIVE_RUNS: usize = 200_000;
/// The most pipeline steps read from a tasks file.
const MAX_STEPS: usize = 10_000;
/// The longest task line read for its steps.
const MAX_TASK_LINE: usize = 1 << 20;
/// The most providers counted from result lines (a file may name any).
const MAX_PROVIDERS: usize = 256;
/// The failures a live snapshot lists, newest first.
const RECENT_FAILURES: usize = 50;
/// How often a followed out file is looked at for new lines.
const FOLLOW_EVERY: Duration = Duration::from_millis(200);
/// The longest out-file line read; a result line carries a child's output
/// (up to 16 MiB, escaped), so this is far above it. A longer one is passed
/// over and counted.
const MAX_RESULT_LINE: usize = 64 << 20;

/// One settled run of the batch, as the page lists it.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Row {
    /// Its task line, from 1 (0 when unknown).
    pub(super) line: usize,
    /// The task's id.
    pub(super) id: Option<String>,
    pub(super) label: Option<String>,
    /// Its stop reason, `error`, `rejected (CODE)` or `interrupted`.
    pub(super) outcome: String,
    /// Why it failed, bounded.
    pub(super) detail: Option<String>,
    pub(super) latency_ms: u64,
    pub(super) tokens: u64,
    pub(super) limit_wait_ms: u64,
    /// The child's id (its session, for in-process children).
    pub(super) child: Option<String>,
    /// The provider that ran it, as its result line names it.
    pub(super) provider: Option<String>,
    /// When it settled, milliseconds since the Unix epoch.
    pub(super) at_ms: u64,
}

impl Row {
    /// Whether the run failed (not completed, not merely interrupted).
    pub(super) fn failed(&self) -> bool {
        self.outcome != "completed" && self.outcome != "interrupted"
    }

    /// A row read from a result line (as the batch writes it).
    fn from_record(record: &Value, outcome: Option<&str>, detail: Option<&str>, at_ms: u64) -> Row {
        let text = |key: &str| record.get(key).and_then(Value::as_str).map(bounded);
        let outcome = outcome.map(str::to_owned).unwrap_or_else(|| outcome_of(record));
        let detail = detail.map(bounded).or_else(|| detail_of(record));
        let usage = record.get("tree_usage").or_else(|| record.get("usage"));
        let count = |key: &str| usage.and_then(|usage| usage.get(key)).and_then(Value::as_u64).unwrap_or(0);
        let tokens = ["input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens"]
            .iter()
            .fold(0u64, |sum, key| sum.saturating_add(count(key)));
        Row {
            line: record.get("line").and_then(Value::as_u64).unwrap_or(0) as usize,
            id: text("id"),
            label: text("label"),
            outcome,
            detail,
            latency_ms: record.get("latency_ms").and_then(Value::as_f64).unwrap_or(0.0) as u64,
            tokens,
            limit_wait_ms: count("limit_wait_ms"),
            child: text("child_session").or_else(|| text("child_id")),
            provider: text("provider"),
            at_ms,
        }
    }
}

/// A result line's outcome in the batch's own words (see [`Settled`]).
fn outcome_of(record: &Value) -> String {
    if record.get("interrupted").and_then(Value::as_bool) == Some(true) {
        return "interrupted".to_owned();
    }
    if let Some(reason) = record.get("stop_reason").and_then(Value::as_str) {
        return bounded(reason);
    }
    // A pipeline step not run after a failure before it.
    if record.get("skipped").is_some() {
        return "skipped".to_owned();
    }
    match record.get("code").and_then(Value::as_str) {
        Some(code) => format!("rejected ({})", bounded(code)),
        None => "error".to_owned(),
    }
}

/// Why a result line's run failed: its error, its timeout, or its
/// diagnostic's reason.
fn detail_of(record: &Value) -> Option<String> {
    if let Some(error) = record.get("error").or_else(|| record.get("skipped")).and_then(Value::as_str) {
        return Some(bounded(error));
    }
    if record.get("reason").and_then(Value::as_str) == Some("timeout") {
        return Some("timeout".to_owned());
    }
    let diagnostic = record.get("diagnostic")?;
    let reason = ["detail", "reason", "message"].iter().find_map(|key| diagnostic.get(key).and_then(Value::as_str));
    Some(bounded(&reason.map_or_else(|| diagnostic.to_string(), str::to_owned)))
}

/// `text` cut to [`MAX_ROW_TEXT`] characters.
fn bounded(text: &str) -> String {
    match text.char_indices().nth(MAX_ROW_TEXT) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}

/// A run the runtime's events told of: any provider, any depth.
#[derive(Clone, Debug, Serialize)]
pub(super) struct LiveRun {
    pub(super) provider: String,
    pub(super) label: Option<String>,
    pub(super) parent: Option<String>,
    pub(super) started_ms: u64,
    pub(super) ended_ms: Option<u64>,
    pub(super) stop_reason: Option<String>,
}

/// One provider's figures, from the runtime's events.
#[derive(Clone, Debug, Default, Serialize)]
struct ProviderFigures {
    running: u64,
    done: u64,
    failed: u64,
    /// Of the batch's settled runs on this provider (their trees included).
    tokens: u64,
    limit_wait_ms: u64,
}

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) rows: Vec<Row>,
    /// Settled runs past [`MAX_ROWS`], counted only.
    unlisted: usize,
    outcomes: BTreeMap<String, usize>,
    failed: usize,
    recent_failures: VecDeque<Row>,
    skipped: usize,
    done_before: usize,
    retries: usize,
    lost: Option<String>,
    tokens: u64,
    limit_wait_ms: u64,
    /// Task lines in the batch, when known (for the ETA).
    total: Option<u64>,
    first_ms: Option<u64>,
    last_ms: Option<u64>,
    finished: bool,
    providers: BTreeMap<String, ProviderFigures>,
    /// Runs the events told of, by child id.
    pub(super) runs: HashMap<String, LiveRun>,
    /// Child ids by the run id their events carry.
    run_ids: HashMap<u64, String>,
    /// Out-file lines passed over (too long, or not JSON).
    unreadable_lines: usize,
    /// Fed by a followed file (no events: the rows alone count).
    following: bool,
    /// The model routes whose limiters the view shows.
    routes: Vec<Arc<ModelRoute>>,
    /// What each step of a pipeline waits on, by its id (see [`Board::steps`]).
    pub(super) steps: HashMap<String, Vec<String>>,
}

impl State {
    /// `row` as the page lists it: with its pipeline step (a map's run
    /// `fix[2]` belongs to `fix`) and what that step waited on, if it is one.
    pub(super) fn listed(&self, row: &Row) -> Value {
        let mut value = serde_json::to_value(row).unwrap_or_default();
        let step = row.id.as_deref().map(|id| id.split_once('[').map_or(id, |(step, _)| step));
        if let Some((step, waits)) = step.and_then(|step| self.steps.get_key_value(step)) {
            value["step"] = json!(step);
            value["waits_on"] = json!(waits);
        }
        value
    }

    fn add(&mut self, row: Row) {
        *self.outcomes.entry(row.outcome.clone()).or_default() += 1;
        self.tokens = self.tokens.saturating_add(row.tokens);
        self.limit_wait_ms = self.limit_wait_ms.saturating_add(row.limit_wait_ms);
        // A task run's provider, as the runtime's events named it, else as
        // its result line does. Without events (a followed file) the rows
        // alone count the provider's runs.
        let provider = row.child.as_ref().and_then(|child| self.runs.get(child)).map(|run| run.provider.clone());
        let from_events = provider.is_some();
        let provider = provider.or_else(|| row.provider.clone());
        let figures = match provider {
            Some(provider) if from_events || self.runs.is_empty() => {
                if !self.providers.contains_key(&provider) && self.providers.len() >= MAX_PROVIDERS {
                    None
                } else {
                    Some(self.providers.entry(provider).or_default())
                }
            }
            _ => None,
        };
        if let Some(figures) = figures {
            figures.tokens = figures.tokens.saturating_add(row.tokens);
            figures.limit_wait_ms = figures.limit_wait_ms.saturating_add(row.limit_wait_ms);
            if !from_events {
                figures.done += 1;
                figures.failed += u64::from(row.failed());
            }
        }
        self.first_ms.get_or_insert(row.at_ms);
        self.last_ms = Some(row.at_ms);
        if row.failed() {
            self.failed += 1;
            if self.recent_failures.len() == RECENT_FAILURES {
                self.recent_failures.pop_back();
            }
            self.recent_failures.push_front(row.clone());
        }
        match self.rows.len() < MAX_ROWS {
            true => self.rows.push(row),
            false => self.unlisted += 1,
        }
    }

    fn settled(&self) -> usize {
        self.rows.len() + self.unlisted
    }
}

/// The live state of one batch, shared by its sources and the server;
/// cheap to clone: a batch's [`Report`] (as `fanout --ui` feeds it), a
/// followed results file ([`Board::follow`]) and the runtime's events
/// ([`Board::watch`]) may all feed one board, which
/// [`serve_ui`](crate::serve::serve_ui) shows.
#[derive(Clone, Debug)]
pub struct Board {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    state: Mutex<State>,
    version: watch::Sender<u64>,
    /// When the board was made: the batch's elapsed time (monotonic).
    started: Instant,
}

impl Default for Board {
    fn default() -> Self {
        Board::new()
    }
}

impl Board {
    /// An empty board; its clock starts now.
    pub fn new() -> Board {
        let (version, _) = watch::channel(0);
        Board { inner: Arc::new(Inner { state: Mutex::default(), version, started: Instant::now() }) }
    }

    /// How many task lines the batch has, for its ETA.
    pub fn expect(&self, tasks: u64) {
        self.change(|state| state.total = Some(tasks));
    }

    /// Shows each of `routes` (a configuration's `[models.NAME]`) with
    /// what its limiter tells: its limits and any cool-down in force.
    pub fn routes(&self, routes: impl IntoIterator<Item = Arc<ModelRoute>>) {
        let routes: Vec<_> = routes.into_iter().collect();
        self.change(|state| state.routes = routes);
    }

    /// Reads the pipeline's steps from the tasks file `path`: for each line
    /// with an `id` and an `after` or a `for_each`, the ids it waits on (its
    /// `after`, and the ids its `for_each` template names), so each run's
    /// row says its step and what that step waited on. A file that cannot
    /// be read shows no steps; at most 10,000 are kept.
    pub fn steps(&self, path: &Path) {
        // A pipe (`fanout -`) is the batch's to read: a line read here
        // would never run.
        if !path.is_file() {
            return;
        }
        let Ok(file) = std::fs::File::open(path) else { return };
        let mut reader = BufReader::new(file);
        let (mut buffer, mut steps) = (Vec::new(), HashMap::new());
        while let Ok(Some(line)) = read_line(&mut reader, &mut buffer, MAX_TASK_LINE) {
            if steps.len() == MAX_STEPS {
                break;
            }
            let Some(task) = (!line.overlong).then(|| serde_json::from_slice::<Value>(&buffer).ok()).flatten() else {
                continue;
            };
            let Some(id) = task.get("id").and_then(Value::as_str) else { continue };
            let mut waits: Vec<String> = match task.get("after") {
                Some(Value::String(one)) => vec![bounded(one)],
                Some(Value::Array(many)) => many.iter().filter_map(Value::as_str).take(32).map(bounded).collect(),
                _ => Vec::new(),
            };
            if let Some(template) = task.get("for_each").and_then(Value::as_str) {
                waits.extend(named_ids(template).filter(|named| !waits.contains(named)).collect::<Vec<_>>());
            }
            if !waits.is_empty() || task.get("for_each").is_some() {
                steps.insert(bounded(id), waits);
            }
        }
        self.change(|state| state.steps = steps);
    }

    /// The batch is over: no more rows will come.
    pub fn finish(&self) {
        self.change(|state| state.finished = true);
    }

    /// Counts every run of `subagents` (any provider, any depth) by
    /// provider, and remembers each for the trees, while the handle is held.
    pub fn watch(&self, subagents: &Subagents) -> ListenerHandle {
        let board = self.clone();
        subagents.add_listener(move |event: &SubagentEvent| board.note(event))
    }

    /// Follows the results file `path` as a batch appends to it, from its
    /// start, until `stop` is cancelled: every whole line becomes a row. A
    /// file that is cut shorter (a new batch truncated it) starts the
    /// board over. Runs on a thread of its own (file reads block).
    pub fn follow(&self, path: impl Into<PathBuf>, stop: crate::CancellationToken) -> std::io::Result<()> {
        let (board, path) = (self.clone(), path.into());
        self.change(|state| state.following = true);
        std::thread::Builder::new().name("subagents-ui-follow".to_owned()).spawn(move || {
            let mut offset = 0u64;
            while !stop.is_cancelled() {
                offset = board.read_new_lines(&path, offset);
                std::thread::sleep(FOLLOW_EVERY);
            }
        })?;
        Ok(())
    }

    /// Reads the whole lines of `path` past `offset`; where it stopped.
    fn read_new_lines(&self, path: &Path, offset: u64) -> u64 {
        let Ok(mut file) = std::fs::File::open(path) else { return offset };
        let length = file.metadata().map_or(0, |meta| meta.len());
        let mut offset = offset;
        if length < offset {
            // Truncated: a new batch writes this file.
            let (total, routes, steps) = {
                let state = self.lock();
                (state.total, state.routes.clone(), state.steps.clone())
            };
            self.change(|state| *state = State { total, routes, steps, following: true, ..State::default() });
            offset = 0;
        }
        if length == offset || file.seek(SeekFrom::Start(offset)).is_err() {
            return offset;
        }
        let mut reader = BufReader::new(file);
        let mut buffer = Vec::new();
        let mut rows = Vec::new();
        let mut unreadable = 0;
        while let Ok(Some(line)) = read_line(&mut reader, &mut buffer, MAX_RESULT_LINE) {
            if !line.ended {
                break; // a line still being written: read it whole next time
            }
            offset += line.bytes;
            let record = (!line.overlong).then(|| serde_json::from_slice::<Value>(&buffer).ok()).flatten();
            match record {
                Some(record) if record.is_object() => rows.push(Row::from_record(&record, None, None, now_ms())),
                _ if buffer.iter().all(u8::is_ascii_whitespace) && !line.overlong => {}
                _ => unreadable += 1,
            }
            if rows.len() >= 1000 {
                break; // let the page see progress on a long file
            }
        }
        if !rows.is_empty() || unreadable > 0 {
            self.change(|state| {
                state.unreadable_lines += unreadable;
                rows.into_iter().for_each(|row| state.add(row));
            });
        }
        offset
    }

    fn note(&self, event: &SubagentEvent) {
        match event {
            SubagentEvent::Start(info) => self.change(|state| {
                state.providers.entry(info.provider.clone()).or_default().running += 1;
                if state.runs.len() < MAX_LIVE_RUNS {
                    state.run_ids.insert(info.run_id, info.child_id.clone());
                    let run = LiveRun {
                        provider: info.provider.clone(),
                        label: info.label.as_deref().map(bounded),
                        parent: info.parent_session.clone(),
                        started_ms: now_ms(),
                        ended_ms: None,
                        stop_reason: None,
                    };
                    state.runs.insert(info.child_id.clone(), run);
                }
            }),
            SubagentEvent::End(end) => self.change(|state| {
                let figures = state.providers.entry(end.provider.clone()).or_default();
                figures.running = figures.running.saturating_sub(1);
                figures.done += 1;
                if end.stop_reason != crate::StopReason::Completed {
                    figures.failed += 1;
                }
                let child = state.run_ids.remove(&end.run_id).unwrap_or_else(|| end.child_id.clone());
                if let Some(run) = state.runs.get_mut(&child) {
                    run.ended_ms = Some(now_ms());
                    run.stop_reason = Some(end.stop_reason.as_str().to_owned());
                }
            }),
            _ => {}
        }
    }

    /// Changes the state and tells the event streams.
    fn change(&self, change: impl FnOnce(&mut State)) {
        change(&mut self.lock());
        self.inner.version.send_modify(|version| *version += 1);
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A receiver that wakes on every change.
    pub(super) fn changes(&self) -> watch::Receiver<u64> {
        self.inner.version.subscribe()
    }

    /// The aggregates the Live view shows.
    pub(super) fn snapshot(&self) -> Value {
        let state = self.lock();
        let elapsed_ms = self.inner.started.elapsed().as_millis() as u64;
        let settled = state.settled();
        let span_ms = match (state.first_ms, state.last_ms) {
            (Some(first), Some(last)) if last > first => last - first,
            _ => elapsed_ms,
        };
        let rate = if span_ms > 0 { settled as f64 * 1000.0 / span_ms as f64 } else { 0.0 };
        let accounted = (settled + state.skipped + state.done_before) as u64;
        let remaining = state.total.map(|total| total.saturating_sub(accounted));
        let eta_ms = match (remaining, rate > 0.0, state.finished) {
            (Some(remaining), true, false) => Some((remaining as f64 / rate * 1000.0) as u64),
            _ => None,
        };
        let running: u64 = state.providers.values().map(|figures| figures.running).sum();
        let providers: Vec<Value> = state
            .providers
            .iter()
            .map(|(name, figures)| {
                serde_json::to_value(figures)
                    .map(|mut value| {
                        value["name"] = json!(name);
                        value
                    })
                    .unwrap_or_default()
            })
            .collect();
        json!({
            "elapsed_ms": elapsed_ms,
            "settled": settled,
            "total": state.total,
            "outcomes": state.outcomes,
            "failed": state.failed,
            "running": running,
            "rate_per_s": rate,
            "eta_ms": eta_ms,
            "skipped": state.skipped,
            "done_before": state.done_before,
            "retries": state.retries,
            "lost": state.lost,
            "tokens": state.tokens,
            "limit_wait_ms": state.limit_wait_ms,
            "providers": providers,
            "routes": state.routes.iter().map(|route| route_figures(route)).collect::<Vec<_>>(),
            "recent_failures": state.recent_failures,
            "unreadable_lines": state.unreadable_lines,
            "finished": state.finished,
            "following_file": state.following,
        })
    }
}

/// The ids a `{{ID.…}}` template names (the first name in each `{{ }}`).
fn named_ids(template: &str) -> impl Iterator<Item = String> + '_ {
    template.split("{{").skip(1).filter_map(|inside| {
        let name: String =
            inside.trim_start().chars().take_while(|c| c.is_alphanumeric() || matches!(c, '_' | '-')).collect();
        (!name.is_empty() && name != "item" && name != "index").then(|| bounded(&name))
    })
}

/// One route's figures as its limiter tells them. The page shows every
/// key it is given, so a figure the limiter comes to count is one more
/// key here.
fn route_figures(route: &ModelRoute) -> Value {
    let limiter = route.limiter();
    let limits = limiter.limits();
    let stats = limiter.stats();
    let cooling_ms = limiter
        .cooling_until()
        .map(|until| until.saturating_duration_since(tokio::time::Instant::now()).as_millis() as u64);
    json!({
        "name": bounded(&route.name),
        "api": route.api.name(),
        "model": bounded(&route.model),
        "requests_per_minute": limits.requests_per_minute,
        "tokens_per_minute": limits.tokens_per_minute,
        "max_concurrent": limits.max_concurrent,
        "cooling_ms": cooling_ms,
        "requests": stats.requests,
        "answered_429": stats.refused,
        "waited_ms": stats.waited.as_millis() as u64,
        "concurrency_now": stats.concurrency,
        "fleet_members": stats.shared.as_ref().map(|shared| shared.members),
        "fleet_fallback": stats.shared.as_ref().and_then(|shared| shared.fallback.as_deref().map(bounded)),
    })
}

impl Report for Board {
    fn settled(&self, settled: &Settled<'_>) {
        let row = Row::from_record(settled.record, Some(settled.outcome), settled.detail, now_ms());
        self.change(|state| state.add(row));
    }

    fn skipped(&self, _line: usize, _why: &str) {
        self.change(|state| state.skipped += 1);
    }

    fn done_before(&self) {
        self.change(|state| state.done_before += 1);
    }

    fn expanded(&self, _line: usize, runs: usize) {
        // The line was counted as one run.
        self.change(|state| state.total = state.total.map(|total| (total + runs as u64).saturating_sub(1)));
    }

    fn retrying(&self, _line: usize, _attempt: u32, _outcome: &str, _wait: Duration) {
        self.change(|state| state.retries += 1);
    }

    fn results_lost(&self, why: &str) {
        let why = bounded(why);
        self.change(|state| state.lost = Some(why));
    }
}

/// Two reports told the same things: the terminal's and the web view's.
#[derive(Debug)]
pub struct Both<A, B>(pub A, pub B);

impl<A: Report, B: Report> Report for Both<A, B> {
    fn settled(&self, settled: &Settled<'_>) {
        self.0.settled(settled);
        self.1.settled(settled);
    }

    fn skipped(&self, line: usize, why: &str) {
        self.0.skipped(line, why);
        self.1.skipped(line, why);
    }

    fn done_before(&self) {
        self.0.done_before();
        self.1.done_before();
    }

    fn expanded(&self, line: usize, runs: usize) {
        self.0.expanded(line, runs);
        self.1.expanded(line, runs);
    }

    fn tasks_unreadable(&self, error: &std::io::Error) {
        self.0.tasks_unreadable(error);
        self.1.tasks_unreadable(error);
    }

    fn retrying(&self, line: usize, attempt: u32, outcome: &str, wait: Duration) {
        self.0.retrying(line, attempt, outcome, wait);
        self.1.retrying(line, attempt, outcome, wait);
    }

    fn results_lost(&self, why: &str) {
        self.0.results_lost(why);
        self.1.results_lost(why);
    }
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_result_line_becomes_a_row_with_its_failure_reason_and_tree_tokens() {
        let record = json!({"line": 3, "label": "x", "error": "the child crashed", "code": "E1",
            "tree_usage": {"input_tokens": 2, "output_tokens": 5}, "latency_ms": 12.5});
        let row = Row::from_record(&record, None, None, 7);
        assert_eq!(
            (row.line, row.outcome.as_str(), row.detail.as_deref()),
            (3, "rejected (E1)", Some("the child crashed"))
        );
        assert_eq!((row.tokens, row.latency_ms), (7, 12));
        assert!(row.failed());
        let skipped = Row::from_record(&json!({"line": 2, "skipped": "after review: error: it broke"}), None, None, 0);
        assert_eq!(
            (skipped.outcome.as_str(), skipped.detail.as_deref()),
            ("skipped", Some("after review: error: it broke"))
        );
        assert!(skipped.failed());
        let interrupted = Row::from_record(&json!({"stop_reason": "cancelled", "interrupted": true}), None, None, 0);
        assert_eq!(interrupted.outcome, "interrupted");
        assert!(!interrupted.failed());
    }

    #[test]
    fn a_task_runs_tokens_and_waits_count_for_the_provider_its_start_event_named() {
        let board = Board::new();
        let start = crate::events::RunInfo {
            run_id: 1,
            child_id: "c1".to_owned(),
            provider: "spawn".to_owned(),
            parent_session: None,
            local: true,
            label: None,
        };
        board.note(&SubagentEvent::Start(Arc::new(start)));
        let record = json!({"child_id": "c1", "stop_reason": "completed", "tree_usage": {"input_tokens": 5, "output_tokens": 2, "limit_wait_ms": 40}});
        board.change(|state| state.add(Row::from_record(&record, None, None, 0)));
        let providers = &board.snapshot()["providers"];
        assert_eq!(providers[0]["name"], "spawn");
        assert_eq!((providers[0]["tokens"].as_u64(), providers[0]["limit_wait_ms"].as_u64()), (Some(7), Some(40)));
        assert_eq!(providers[0]["running"], 1, "its end event has not come");
    }

    #[test]
    fn a_steps_waits_are_its_after_and_the_ids_its_for_each_names() {
        let dir = tempfile::tempdir().unwrap();
        let tasks = dir.path().join("tasks.jsonl");
        let lines = [
            json!({"id": "triage", "prompt": "p"}),
            json!({"id": "fix", "for_each": "{{ triage.structured.failing }}", "prompt": "{{item.name}}"}),
            json!({"id": "report", "after": ["fix"], "prompt": "r"}),
        ];
        std::fs::write(&tasks, lines.iter().map(|line| format!("{line}\n")).collect::<String>() + "not json\n")
            .unwrap();
        let board = Board::new();
        board.steps(&tasks);
        let row = |id: &str| Row::from_record(&json!({"id": id, "stop_reason": "completed"}), None, None, 0);
        let state = board.lock();
        assert_eq!(state.listed(&row("fix[2]"))["waits_on"], json!(["triage"]), "a map's run belongs to its step");
        assert_eq!(state.listed(&row("report"))["step"], "report");
        assert!(state.listed(&row("triage")).get("step").is_none(), "a line that waits on nothing is no step");
    }

    #[test]
    fn a_followed_file_is_read_by_whole_lines_and_a_truncation_starts_over() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        std::fs::write(&path, "{\"line\":1,\"stop_reason\":\"completed\"}\n{\"line\":2,\"stop_re").unwrap();
        let board = Board::new();
        let offset = board.read_new_lines(&path, 0);
        assert_eq!(board.lock().settled(), 1, "the half-written line waits");
        std::fs::write(
            &path,
            "{\"line\":1,\"stop_reason\":\"completed\"}\n{\"line\":2,\"stop_reason\":\"max_steps\"}\nnot json\n",
        )
        .unwrap();
        let offset = board.read_new_lines(&path, offset);
        let snapshot = board.snapshot();
        assert_eq!((snapshot["settled"].as_u64(), snapshot["failed"].as_u64()), (Some(2), Some(1)));
        assert_eq!(snapshot["unreadable_lines"], 1);
        std::fs::write(&path, "{\"line\":1,\"stop_reason\":\"completed\"}\n").unwrap();
        board.read_new_lines(&path, offset);
        assert_eq!(board.lock().settled(), 1, "a truncated file starts the board over");
    }
}
