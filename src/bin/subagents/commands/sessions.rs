//! `subagents sessions list | show ID | tree ID [--json]`: read what the
//! subagents did, from the session files under `<home>/sessions/`.
//!
//! - `list`: every session, newest first: id, the provider that ran it,
//!   its state (the last turn's stop reason, `open` while a turn has not
//!   ended), created, turns, tool calls (and how many failed), size, and
//!   its label or the first words of its first prompt. `--provider`,
//!   `--state`, `--since` (`30m`, `2h`, `7d`, or a `YYYY-MM-DD` date, UTC)
//!   and `--limit` narrow it.
//! - `show ID`: the transcript: user messages, answers with their tool
//!   calls, tool results, turn ends.
//! - `tree ID`: the delegation tree under a session (its children by
//!   lineage), each with its last stop reason.
//!
//! `show` and `tree` take any unique prefix of a session id; a prefix that
//! several ids share is refused, naming them. Both also read the homes of
//! process children under `<home>/children`, and `show` takes a process
//! run's child id (`process:NAME:SESSION`) for its session there.
//!
//! Reading never repairs or changes a file. A torn last line (a write cut
//! off by a crash) is reported beside the session; a corrupt or unreadable
//! file (one that is not a regular file, or has a line longer than
//! `--max-line-bytes`) is reported as such and the others are still listed.
//! `list` and `tree` read each file line by line and keep only its summary,
//! so their memory follows the number of sessions and the longest line, not
//! the size of the transcripts. With `--json` each command prints one JSON
//! document instead of text.
//!
//! Lineage comes from the files, and files can lie: a session may name
//! itself or a descendant as its parent. `tree` walks without recursion,
//! meets every session once, and marks a session it reaches again as a
//! lineage loop (not followed; exit 1). A deep chain keeps its output
//! bounded: the text indent stops growing at [`INDENTED_LEVELS`] (deeper
//! lines name their level instead), and `--json` nests `children` for
//! [`NESTED_LEVELS`] levels below the root, where a session lists the rest
//! of its subtree flat in `descendants` (depth first, each with its
//! `level` below the root and its `parent`), so that any JSON reader takes
//! the document (serde_json refuses more than 128 levels of nesting).

use std::collections::{BTreeMap, HashSet};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{json, Value};
use subagents::agent::{SessionEvent, SessionStore, SessionSummary};

mod list;

use self::list::{state, ListFilters};
use crate::args::HomeArgs;
use crate::terminal::{self, say};
use crate::Ended;

/// Below this many levels the text tree stops indenting: a 10,000-deep
/// chain would otherwise print 150 MB of indent.
const INDENTED_LEVELS: usize = 24;
/// How many levels `tree --json` nests `children` (two levels of JSON
/// each, well below serde_json's 128).
const NESTED_LEVELS: usize = 50;

/// `subagents sessions`'s flags.
#[derive(clap::Args, Debug)]
pub struct SessionsArgs {
    #[command(subcommand)]
    query: Query,
    #[command(flatten)]
    home: HomeArgs,
    /// Print one JSON document instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// Longest session line read, in bytes (default 256 MiB); a file with a
    /// longer one is reported unreadable.
    #[arg(long, global = true, value_parser = clap::value_parser!(u64).range(1..))]
    max_line_bytes: Option<u64>,
}

/// What `sessions` was asked to do.
#[derive(clap::Subcommand, Debug)]
enum Query {
    /// Every session, newest first: id, provider, state, created, turns,
    /// tool calls, size, label or first prompt.
    List(ListFilters),
    /// One session's transcript.
    Show {
        /// The session id, or any unique prefix of it.
        id: String,
    },
    /// The delegation tree under a session.
    Tree {
        /// The session id, or any unique prefix of it.
        id: String,
    },
}

impl SessionsArgs {
    pub fn run(self) -> Result<ExitCode, String> {
        sessions(self).map(ExitCode::from)
    }
}

/// A listed session: its summary, or the reason it could not be read.
struct Listed {
    id: String,
    read: Result<SessionSummary, String>,
}

fn sessions(args: SessionsArgs) -> Result<Ended, String> {
    let home = args.home.resolve();
    let max_line_bytes = args.max_line_bytes.map(|n| usize::try_from(n).unwrap_or(usize::MAX));
    let mut store = SessionStore::new(&home);
    if let Some(bytes) = max_line_bytes {
        store = store.with_max_line_bytes(bytes);
    }
    match args.query {
        Query::List(filters) => list::list(&store, &filters, args.json),
        Query::Show { id } => {
            // A process child's run id names its session in its own home.
            let id =
                id.strip_prefix("process:").and_then(|rest| rest.split_once(':')).map_or(id.as_str(), |(_, id)| id);
            let nested = children_stores(&home, max_line_bytes);
            let stores: Vec<&SessionStore> = std::iter::once(&store).chain(&nested).collect();
            let id = unique(id, stores.iter().flat_map(|store| store.ids().unwrap_or_default()))?;
            // The home's own store first; else the child home that holds it.
            let holder = stores.iter().copied().find(|store| store.ids().is_ok_and(|ids| ids.contains(&id)));
            show(holder.unwrap_or(&store), &id, args.json)
        }
        Query::Tree { id } => {
            let nested = children_stores(&home, max_line_bytes);
            let ids = std::iter::once(&store).chain(&nested).flat_map(|store| store.ids().unwrap_or_default());
            tree(&store, &nested, &unique(&id, ids)?, args.json)
        }
    }
}

/// The session `id` names: itself when a session has it, else the one id
/// it is a prefix of; a prefix several ids share is refused naming them
/// (the first ten). An id no session has goes on as given, for the store
/// to say why.
fn unique(id: &str, ids: impl IntoIterator<Item = String>) -> Result<String, String> {
    let mut matching: Vec<String> = ids.into_iter().filter(|known| known.starts_with(id)).collect();
    matching.sort();
    matching.dedup();
    if id.is_empty() || matching.is_empty() || matching.iter().any(|known| known == id) {
        return Ok(id.to_owned());
    }
    if let [only] = &matching[..] {
        return Ok(only.clone());
    }
    let shown: Vec<String> = matching.iter().take(10).map(|known| terminal::line(known).into_owned()).collect();
    let more = matching.len().saturating_sub(10);
    let more = if more > 0 { format!(" and {more} more") } else { String::new() };
    Err(format!(
        "session id prefix {:?} is ambiguous: {} sessions match ({}{more})",
        terminal::line(id),
        matching.len(),
        shown.join(", ")
    ))
}

/// Every session of the store in brief, oldest first (unreadable ones last;
/// `list` shows them newest first).
fn read_all(store: &SessionStore) -> Result<Vec<Listed>, String> {
    let ids =
        store.ids().map_err(|e| format!("cannot list {}: {e}", store.dir().unwrap_or(&PathBuf::new()).display()))?;
    let mut listed: Vec<Listed> =
        ids.into_iter().map(|id| Listed { read: store.summarize(&id).map_err(|e| e.to_string()), id }).collect();
    listed.sort_by_key(|l| (l.read.as_ref().map_or(u64::MAX, |s| s.header.created_at_ms), l.id.clone()));
    Ok(listed)
}

fn summary(session: &SessionSummary) -> Value {
    json!({
        "id": session.header.id,
        "parent": session.header.parent_session,
        "depth": session.header.depth,
        "created_at_ms": session.header.created_at_ms,
        "provider": session.header.provider,
        "label": session.header.label,
        "first_prompt": session.first_prompt,
        "state": state(session),
        "last_stop_reason": session.last_stop_reason,
        "turns": session.turns,
        "tool_calls": session.tool_calls,
        "tool_calls_failed": session.tool_calls_failed,
        "duration_ms": session.duration_ms,
        "usage": session.usage,
        "bytes": session.bytes,
        "torn": session.torn,
    })
}

/// Stdout, buffered: a tree of 20,000 lines is not 20,000 flushes. A reader
/// that went away (`| head`) ends the output quietly; another failure is
/// reported, not a panic.
fn write_out(write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> Result<(), String> {
    let mut out = BufWriter::new(std::io::stdout().lock());
    match write(&mut out).and_then(|()| out.flush()) {
        Err(error) if error.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("cannot write to stdout: {error}")),
        _ => Ok(()),
    }
}

fn show(store: &SessionStore, id: &str, as_json: bool) -> Result<Ended, String> {
    let session = store.inspect(id).map_err(|e| e.to_string())?;
    if as_json {
        let events = serde_json::to_value(&session.events).map_err(|e| e.to_string())?;
        let header = &session.header;
        let shown = json!({"session": summary(&session.summary()), "cwd": header.cwd, "persona": header.persona, "events": events});
        write_out(|out| writeln!(out, "{shown}"))?;
        return Ok(Ended::Completed);
    }
    let header = &session.header;
    let mut out = vec![format!(
        "session {} (depth {}, parent {}, created {})",
        header.id,
        header.depth,
        header.parent_session.as_deref().unwrap_or("-"),
        created(header.created_at_ms)
    )];
    if let Some(persona) = &header.persona {
        out.push(format!("persona: {persona}"));
    }
    for event in &session.events {
        match event {
            SessionEvent::User { content } => out.push(format!("user: {}", subagents::seam::text_of(content))),
            SessionEvent::Assistant { text, tool_calls } => {
                if !text.is_empty() {
                    out.push(format!("assistant: {text}"));
                }
                for call in tool_calls {
                    out.push(format!("  → {} [{}] {}", call.name, call.id, call.arguments));
                }
            }
            SessionEvent::ToolResult { call_id, name, content, is_error } => {
                let kind = if *is_error { "error" } else { "result" };
                out.push(format!("  ← {name} [{call_id}] {kind}: {content}"));
            }
            SessionEvent::TurnEnd { reason, .. } => out.push(format!("— turn end: {reason}")),
        }
    }
    if session.torn {
        out.push("(a torn last line was left out)".to_owned());
    }
    write_out(|writer| out.iter().try_for_each(|line| writeln!(writer, "{}", terminal::text(line))))?;
    Ok(Ended::Completed)
}

/// One session of a tree, in the order a depth-first walk meets it.
struct Visit {
    /// Index into the sessions walked.
    session: usize,
    /// Levels below the root (0 for the root).
    level: usize,
    /// The last of its parent's children.
    last: bool,
    /// Reached a second time: its lineage loops, so it is not followed.
    looped: bool,
}

/// The sessions under `root` by lineage, depth first, each met once: a
/// session reached again is a [`Visit`] marked `looped` and not followed.
/// An explicit stack, not recursion: a chain may be any number of levels.
fn walk(sessions: &[SessionSummary], root: usize) -> Vec<Visit> {
    let mut children: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (index, session) in sessions.iter().enumerate() {
        if let Some(parent) = &session.header.parent_session {
            children.entry(parent).or_default().push(index);
        }
    }
    let kids_of = |index: usize| children.get(sessions[index].header.id.as_str()).map_or(&[][..], Vec::as_slice);
    let mut visits = vec![Visit { session: root, level: 0, last: true, looped: false }];
    let mut seen = HashSet::from([root]);
    // Per open level: its children, and how many of them were visited.
    let mut stack = vec![(kids_of(root), 0)];
    while let Some((kids, next)) = stack.last_mut() {
        let Some(&kid) = kids.get(*next) else {
            stack.pop();
            continue;
        };
        *next += 1;
        let last = *next == kids.len();
        let level = stack.len();
        let looped = !seen.insert(kid);
        visits.push(Visit { session: kid, level, last, looped });
        if !looped {
            stack.push((kids_of(kid), 0));
        }
    }
    visits
}

/// The stores of the process children under `home`, each reading lines of
/// at most `max_line_bytes` when given.
fn children_stores(home: &Path, max_line_bytes: Option<usize>) -> Vec<SessionStore> {
    let stores = SessionStore::of_children(home).into_iter();
    stores.map(|store| max_line_bytes.map_or(store.clone(), |bytes| store.with_max_line_bytes(bytes))).collect()
}

fn tree(store: &SessionStore, nested: &[SessionStore], id: &str, as_json: bool) -> Result<Ended, String> {
    let mut sessions: Vec<SessionSummary> = Vec::new();
    let mut root = None;
    let mut seen = HashSet::new();
    // The home's sessions, then those of its process children's homes
    // (whose sessions name their parents across the process).
    let nested_listed = nested.iter().filter_map(|store| read_all(store).ok()).flatten();
    for listed in read_all(store)?.into_iter().chain(nested_listed) {
        if let Ok(session) = listed.read {
            if !seen.insert(listed.id.clone()) {
                continue;
            }
            root = root.or((listed.id == id).then_some(sessions.len()));
            sessions.push(session);
        }
    }
    // Not among the readable sessions: say why in the store's own words.
    let root = match root {
        Some(root) => root,
        None => {
            sessions.push(store.summarize(id).map_err(|e| e.to_string())?);
            sessions.len() - 1
        }
    };
    let visits = walk(&sessions, root);
    if as_json {
        let tree = tree_json(&sessions, &visits);
        write_out(|out| writeln!(out, "{tree}"))?;
    } else {
        write_out(|out| write_tree(out, &sessions, &visits))?;
    }
    let loops = visits.iter().filter(|v| v.looped).count();
    if loops == 0 {
        return Ok(Ended::Completed);
    }
    say!(
        "subagents: the lineage under {} loops: {loops} session(s) reached again were not followed (marked in the tree)",
        sessions[root].header.id
    );
    Ok(Ended::Incomplete)
}

/// The tree as text, one line per visit; the indent grows for
/// [`INDENTED_LEVELS`] levels, and a deeper line names its level.
fn write_tree(out: &mut dyn Write, sessions: &[SessionSummary], visits: &[Visit]) -> std::io::Result<()> {
    // Per ancestor level below the root: whether it has siblings still to come.
    let mut open: Vec<bool> = Vec::new();
    for visit in visits {
        let session = &sessions[visit.session];
        let described =
            if visit.looped { "(its lineage loops back here; not followed)".to_owned() } else { outcome(session) };
        if visit.level == 0 {
            writeln!(out, "{}", terminal::line(&format!("{} {described}", session.header.id)))?;
            continue;
        }
        open.truncate(visit.level - 1);
        let mut line = String::new();
        for &more in open.iter().take(INDENTED_LEVELS - 1) {
            line.push_str(if more { "│  " } else { "   " });
        }
        line.push_str(if visit.last { "└─ " } else { "├─ " });
        if visit.level >= INDENTED_LEVELS {
            line.push_str(&format!("[level {}] ", visit.level));
        }
        line.push_str(&format!("{} {described}", session.header.id));
        writeln!(out, "{}", terminal::line(&line))?;
        open.push(!visit.last);
    }
    Ok(())
}

/// The tree as JSON: each session's summary with its `children`, nested
/// for [`NESTED_LEVELS`] levels; a session at that level holds the rest of
/// its subtree flat in `descendants`. A looped visit is `{"id",
/// "lineage_loop": true}`. Built without recursion, from the walk's order.
fn tree_json(sessions: &[SessionSummary], visits: &[Visit]) -> Value {
    // The nodes still taking children, one per level from the root down.
    let mut open: Vec<Value> = Vec::new();
    for visit in visits {
        let session = &sessions[visit.session];
        let mut node =
            if visit.looped { json!({"id": session.header.id, "lineage_loop": true}) } else { summary(session) };
        if visit.level > NESTED_LEVELS {
            close_to(&mut open, NESTED_LEVELS + 1);
            node["level"] = json!(visit.level);
            push(open.last_mut().expect("its ancestor at the last nested level is open"), "descendants", node);
        } else if visit.looped {
            close_to(&mut open, visit.level);
            push(open.last_mut().expect("a loop is met below the root"), "children", node);
        } else {
            close_to(&mut open, visit.level);
            let below = if visit.level == NESTED_LEVELS { "descendants" } else { "children" };
            node[below] = json!([]);
            open.push(node);
        }
    }
    close_to(&mut open, 1);
    open.pop().unwrap_or(Value::Null)
}

/// Closes the open nodes deeper than `levels` (the root stays open): each
/// goes into its parent's `children`.
fn close_to(open: &mut Vec<Value>, levels: usize) {
    while open.len() > levels.max(1) {
        let node = open.pop().expect("more than the root is open");
        push(open.last_mut().expect("its parent is open"), "children", node);
    }
}

/// Appends `node` to `parent[key]`, an array made on first use.
fn push(parent: &mut Value, key: &str, node: Value) {
    match parent.get_mut(key).and_then(Value::as_array_mut) {
        Some(list) => list.push(node),
        None => parent[key] = json!([node]),
    }
}

/// What the tree says of a session: the provider that ran it, then its
/// depth, last stop reason, failed tool calls and a torn line.
fn outcome(session: &SessionSummary) -> String {
    let reason = session.last_stop_reason.map_or("no finished turn".to_owned(), |r| r.to_string());
    let provider = session.header.provider.as_deref().map(|p| format!("{} ", terminal::line(p))).unwrap_or_default();
    let failed = match session.tool_calls_failed {
        0 => String::new(),
        1 => ", 1 tool call failed".to_owned(),
        n => format!(", {n} tool calls failed"),
    };
    let torn = if session.torn { ", torn last line" } else { "" };
    format!("{provider}(depth {}, {reason}{failed}{torn})", session.header.depth)
}

/// A creation time as UTC `YYYY-MM-DD hh:mm:ss`.
fn created(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}Z", rest / 3600, rest % 3600 / 60, rest % 60)
}

/// A proleptic Gregorian date as days since 1970-01-01 (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let mp = i64::from((month + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Days since 1970-01-01 as a proleptic Gregorian date (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {
    use super::{created, days_from_civil, unique};

    #[test]
    fn a_date_and_its_days_since_the_epoch_agree_both_ways() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2025, 12, 1) * 86_400_000, 1_764_547_200_000);
        assert_eq!(created(days_from_civil(2000, 2, 29) as u64 * 86_400_000), "2000-02-29 00:00:00Z");
    }

    #[test]
    fn an_id_prefix_names_one_session_or_is_refused_naming_the_candidates() {
        let ids = || ["ab12".to_owned(), "ab34".to_owned(), "cd56".to_owned(), "ab".to_owned()];
        assert_eq!(unique("cd", ids()).unwrap(), "cd56");
        assert_eq!(unique("ab", ids()).unwrap(), "ab", "a whole id wins over the ids it begins");
        assert_eq!(unique("zz", ids()).unwrap(), "zz", "no match goes on for the store to refuse");
        let refused = unique("ab1", ["ab12".to_owned(), "ab13".to_owned()]).unwrap_err();
        assert!(refused.contains("ambiguous") && refused.contains("ab12, ab13"), "{refused}");
    }

    #[test]
    fn creation_times_read_as_utc_dates() {
        assert_eq!(created(0), "1970-01-01 00:00:00Z");
        assert_eq!(created(1_764_547_200_000), "2025-12-01 00:00:00Z");
        assert_eq!(created(951_782_400_000 + 86_399_000), "2000-02-29 23:59:59Z");
    }
}
