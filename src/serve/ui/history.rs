//! What a home's sessions store holds, as the web view reads it: the
//! sessions in brief (a page at a time), one transcript, a search across
//! transcripts, and a delegation tree that joins the store's lineage with
//! the live runs and result rows of a [`Board`].
//!
//! Reading goes through [`SessionStore`] (bounded, never repairing a file),
//! the home's own store and those of process children under
//! `<home>/children` (each child's runtime has a home of its own there).
//! The listing is read once and kept for [`LISTING_FRESH_FOR`], so a page
//! that scrolls does not re-read ten thousand summaries per request.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::board::Board;
use crate::agent::{SessionEvent, SessionStore, SessionSummary};

/// How long a read listing serves before it is read again.
const LISTING_FRESH_FOR: Duration = Duration::from_secs(2);
/// The most nodes one tree answer holds; the rest is counted.
const MAX_TREE_NODES: usize = 5_000;
/// The longest string of a transcript sent whole; longer ones are cut and
/// say how much was left out.
const MAX_TRANSCRIPT_TEXT: usize = 256 * 1024;
/// The most a transcript answer holds, its events' JSON together; the
/// rest is counted.
const MAX_TRANSCRIPT_BYTES: usize = 8 << 20;
/// A search stops after this many hits, or this many sessions read.
const MAX_SEARCH_HITS: usize = 100;
const MAX_SEARCHED_SESSIONS: usize = 5_000;

/// One listed session and where it was found.
#[derive(Clone, Debug)]
pub(super) struct Listed {
    summary: SessionSummary,
    /// `None` for the home's own store, else the index of a nested store.
    store: Option<usize>,
}

/// The sessions of one home; see the [module](self).
#[derive(Debug)]
pub(super) struct History {
    home: Option<PathBuf>,
    listing: Mutex<Option<(Instant, Arc<Listing>)>>,
}

#[derive(Debug, Default)]
pub(super) struct Listing {
    stores: Vec<SessionStore>,
    /// Oldest first.
    sessions: Vec<Listed>,
    unreadable: usize,
    by_id: HashMap<String, usize>,
}

impl History {
    pub(super) fn new(home: Option<PathBuf>) -> History {
        History { home, listing: Mutex::new(None) }
    }

    /// The listing, read again when stale. Blocking.
    pub(super) fn listing(&self) -> Arc<Listing> {
        let mut kept = self.listing.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((at, listing)) = kept.as_ref().filter(|(at, _)| at.elapsed() < LISTING_FRESH_FOR) {
            let _ = at;
            return listing.clone();
        }
        let listing = Arc::new(self.home.as_deref().map(read_listing).unwrap_or_default());
        *kept = Some((Instant::now(), listing.clone()));
        listing
    }

    /// A page of sessions, newest first, those whose id or parent contains
    /// `filter`.
    pub(super) fn sessions(&self, offset: usize, limit: usize, filter: &str) -> Value {
        let listing = self.listing();
        let matching: Vec<&Listed> = listing
            .sessions
            .iter()
            .rev()
            .filter(|listed| {
                let header = &listed.summary.header;
                filter.is_empty()
                    || header.id.contains(filter)
                    || header.parent_session.as_deref().is_some_and(|parent| parent.contains(filter))
            })
            .collect();
        let page: Vec<Value> =
            matching.iter().skip(offset).take(limit).map(|listed| brief(listed, &listing.stores)).collect();
        json!({"total": matching.len(), "offset": offset, "sessions": page, "unreadable": listing.unreadable})
    }

    /// The roots a tree can start from: sessions with no parent in the
    /// store, newest first.
    pub(super) fn roots(&self, offset: usize, limit: usize) -> Value {
        let listing = self.listing();
        let roots: Vec<&Listed> = listing
            .sessions
            .iter()
            .rev()
            .filter(|listed| {
                listed.summary.header.parent_session.as_ref().is_none_or(|parent| !listing.by_id.contains_key(parent))
            })
            .collect();
        let page: Vec<Value> =
            roots.iter().skip(offset).take(limit).map(|listed| brief(listed, &listing.stores)).collect();
        json!({"total": roots.len(), "offset": offset, "roots": page})
    }

    /// One session's transcript, its long texts cut. `None`: no such
    /// session in any store.
    pub(super) fn transcript(&self, id: &str, board: Option<&Board>) -> Option<Result<Value, String>> {
        let listing = self.listing();
        let listed = &listing.sessions[*listing.by_id.get(id)?];
        let store = store_of(listed, &listing);
        // Events are made into what the page is sent as they are read, and
        // the read stops once MAX_TRANSCRIPT_BYTES are shown: a long
        // session costs what is sent, not what it holds.
        let shown = Arc::new(Mutex::new(Shown::default()));
        let reading = shown.clone();
        let read = store.read_while(id, move |event| {
            let mut shown = reading.lock().unwrap_or_else(|e| e.into_inner());
            shown.note(&event);
            let json = event_json(&event);
            let size = json.to_string().len();
            if shown.bytes + size > MAX_TRANSCRIPT_BYTES {
                shown.cut = true;
                return std::ops::ControlFlow::Break(());
            }
            shown.bytes += size;
            shown.events.push(json);
            std::ops::ControlFlow::Continue(())
        });
        let (header, torn, _) = match read {
            Ok(read) => read,
            Err(error) => return Some(Err(error.to_string())),
        };
        let shown = std::mem::take(&mut *shown.lock().unwrap_or_else(|e| e.into_inner()));
        // A cut read did not reach the end: the stop reason is the listing's.
        let stop_reason = match shown.cut {
            true => listed.summary.last_stop_reason,
            false => shown.stop_reason,
        };
        Some(Ok(json!({
            "session": brief(listed, &listing.stores),
            "persona": header.persona.as_deref().map(cut),
            "cwd": cut(&header.cwd.display().to_string()),
            "events": shown.events,
            "left_out": shown.cut,
            "torn": torn,
            "failure": failure(id, stop_reason, shown.account, board),
        })))
    }

    /// Sessions whose transcript contains `query` (case-insensitive),
    /// newest first, with the text around each first hit.
    pub(super) fn search(&self, query: &str) -> Value {
        let listing = self.listing();
        let needle = query.to_lowercase();
        let mut hits = Vec::new();
        let mut searched = 0;
        for listed in listing.sessions.iter().rev() {
            if hits.len() == MAX_SEARCH_HITS || searched == MAX_SEARCHED_SESSIONS || needle.is_empty() {
                break;
            }
            searched += 1;
            let id = &listed.summary.header.id;
            let Ok(session) = store_of(listed, &listing).inspect(id) else { continue };
            let found = session.events.iter().enumerate().find_map(|(index, event)| {
                let text = event_text(event);
                let at = text.to_lowercase().find(&needle)?;
                Some((index, snippet(&text, at, needle.len())))
            });
            if let Some((event, snippet)) = found {
                hits.push(json!({"id": id, "event": event, "snippet": snippet}));
            }
        }
        json!({"hits": hits, "searched": searched, "total": listing.sessions.len()})
    }

    /// The delegation tree under `root` (a session or child id, or
    /// `batch` for the board's batch): the store's lineage joined with the
    /// board's runs, each node with its kind, state, times and tokens,
    /// depth first, at most [`MAX_TREE_NODES`].
    pub(super) fn tree(&self, root: &str, board: Option<&Board>) -> Option<Value> {
        let listing = self.listing();
        let mut nodes: HashMap<String, Value> = HashMap::new();
        for listed in &listing.sessions {
            let header = &listed.summary.header;
            let kind = kind_of(listed, &listing.stores);
            nodes.insert(
                header.id.clone(),
                json!({
                    "id": header.id, "parent": header.parent_session, "kind": kind, "label": null,
                    "state": listed.summary.last_stop_reason.map_or("no finished turn", |reason| reason.as_str()),
                    "start_ms": header.created_at_ms, "end_ms": null, "tokens": null, "session": true,
                }),
            );
        }
        // The batch's task runs, in the order met (a set beside, for 10,000s).
        let (mut batch_children, mut batch_set) = (Vec::new(), HashSet::new());
        if let Some(board) = board {
            let state = board.lock();
            for (id, run) in &state.runs {
                let node = nodes.entry(id.clone()).or_insert_with(|| json!({"id": id, "session": false}));
                node["parent"] = json!(run.parent);
                node["kind"] = json!(run.provider);
                node["label"] = json!(run.label);
                node["state"] = json!(run.stop_reason.as_deref().unwrap_or("running"));
                // The earlier of the session's creation and the run's start
                // event (events reach listeners a moment late).
                let created = node.get("start_ms").and_then(Value::as_u64).unwrap_or(u64::MAX);
                node["start_ms"] = json!(created.min(run.started_ms));
                node["end_ms"] = json!(run.ended_ms);
                if run.parent.is_none() && batch_set.insert(id.clone()) {
                    batch_children.push(id.clone());
                }
            }
            for row in &state.rows {
                let Some(child) = &row.child else { continue };
                let node = nodes.entry(child.clone()).or_insert_with(|| json!({"id": child, "session": false}));
                if node.get("label").is_none_or(Value::is_null) {
                    node["label"] = json!(row.label);
                }
                node["state"] = json!(row.outcome);
                node["tokens"] = json!(row.tokens);
                node["latency_ms"] = json!(row.latency_ms);
                // A run's end: from its events when live; else its start
                // (its session's creation) plus its latency; else when the
                // row came.
                if node.get("end_ms").is_none_or(Value::is_null) {
                    match node.get("start_ms").and_then(Value::as_u64) {
                        Some(start) => node["end_ms"] = json!(start + row.latency_ms),
                        None => {
                            node["end_ms"] = json!(row.at_ms);
                            node["start_ms"] = json!(row.at_ms.saturating_sub(row.latency_ms));
                        }
                    }
                }
                if batch_set.insert(child.clone()) {
                    batch_children.push(child.clone());
                }
            }
        }
        // A process or ACP child's run is named `KIND:PROVIDER:SESSION`,
        // and its agent's session, in the child's own home, names no
        // parent: the run is that parent.
        let runs: Vec<String> = nodes.keys().filter(|id| id.contains(':')).cloned().collect();
        for run in runs {
            let Some((_, session)) = run.rsplit_once(':') else { continue };
            if let Some(node) = nodes.get_mut(session).filter(|node| node.get("parent").is_none_or(Value::is_null)) {
                node["parent"] = json!(run);
            }
        }
        let root_node = match root {
            "batch" if board.is_some() => {
                json!({"id": "batch", "kind": "batch", "label": "this batch", "state": "", "session": false})
            }
            _ => nodes.get(root)?.clone(),
        };
        let mut children: HashMap<&str, Vec<&str>> = HashMap::new();
        for (id, node) in &nodes {
            if let Some(parent) = node.get("parent").and_then(Value::as_str) {
                children.entry(parent).or_default().push(id);
            }
        }
        children.insert("batch", batch_children.iter().map(String::as_str).collect());
        let start = |id: &&str| nodes.get(*id).and_then(|node| node.get("start_ms")).and_then(Value::as_u64);
        for kids in children.values_mut() {
            kids.sort_by_key(|id| (start(id), id.to_string()));
        }
        // Depth first with an explicit stack: lineage may be any depth, and
        // may loop (each node is met once).
        let mut out = Vec::new();
        let mut seen = HashSet::from([root.to_owned()]);
        let mut stack: Vec<(&str, usize)> = vec![];
        let mut first = root_node;
        first["level"] = json!(0);
        first["children"] = json!(children.get(root).map_or(0, Vec::len));
        out.push(first);
        for kid in children.get(root).into_iter().flatten().rev() {
            stack.push((kid, 1));
        }
        let mut left_out = 0;
        while let Some((id, level)) = stack.pop() {
            if !seen.insert(id.to_owned()) {
                continue;
            }
            if out.len() == MAX_TREE_NODES {
                left_out += 1;
                continue;
            }
            let mut node = nodes[id].clone();
            node["level"] = json!(level);
            node["children"] = json!(children.get(id).map_or(0, Vec::len));
            out.push(node);
            for kid in children.get(id).into_iter().flatten().rev() {
                stack.push((kid, level + 1));
            }
        }
        cancellation_paths(&mut out);
        Some(json!({"root": root, "nodes": out, "left_out": left_out}))
    }
}

/// The most ancestors a node's path names (the nearest ones).
const MAX_PATH: usize = 16;

/// Gives each node of a depth-first list its `path`: the runs above it,
/// from the root down, that a cancel travels through to reach it (a cancel
/// of any of them stops it, and its receipt lists it). A node that was
/// stopped (`aborted`, `interrupted`) under stopped parents also names the
/// highest of that unbroken chain, `stopped_with`: where the cancel that
/// reached it most likely began (the tree cannot tell a cancel from a
/// parent's own stop of one child).
fn cancellation_paths(nodes: &mut [Value]) {
    let stopped = |node: &Value| matches!(node.get("state").and_then(Value::as_str), Some("aborted" | "interrupted"));
    let name = |node: &Value| {
        let label = node.get("label").and_then(Value::as_str).filter(|label| !label.is_empty());
        let text = label.or_else(|| node.get("id").and_then(Value::as_str)).unwrap_or("?");
        let kind = node.get("kind").and_then(Value::as_str).unwrap_or("?");
        json!({"id": node.get("id"), "kind": kind, "name": crate::seam::cut(text, 80), "stopped": stopped(node)})
    };
    // The names of the nodes above the one being visited, root first.
    let mut trail: Vec<Value> = Vec::new();
    for node in nodes.iter_mut() {
        let level = node.get("level").and_then(Value::as_u64).unwrap_or(0) as usize;
        trail.truncate(level);
        let from = trail.len().saturating_sub(MAX_PATH);
        node["path"] = json!(&trail[from..]);
        if stopped(node) {
            let chain = trail.iter().rev().take_while(|above| above["stopped"] == true).last();
            node["stopped_with"] = chain.cloned().unwrap_or(Value::Null);
        }
        trail.push(name(node));
    }
}

fn store_of<'a>(listed: &Listed, listing: &'a Listing) -> &'a SessionStore {
    listed.store.map_or(&listing.stores[0], |nested| &listing.stores[nested + 1])
}

/// Where a session ran: `in-process` for the home's own, else the name of
/// the child's home under `<home>/children` (a process provider's name).
fn kind_of(listed: &Listed, stores: &[SessionStore]) -> String {
    let Some(nested) = listed.store else { return "in-process".to_owned() };
    let home = stores[nested + 1].dir().and_then(Path::parent);
    let name = home.and_then(|home| {
        let children = stores[0].dir()?.parent()?.join("children");
        home.strip_prefix(children).ok()?.components().next()?.as_os_str().to_str().map(str::to_owned)
    });
    name.unwrap_or_else(|| "child home".to_owned())
}

fn brief(listed: &Listed, stores: &[SessionStore]) -> Value {
    let summary = &listed.summary;
    let home = match listed.store {
        None => Value::Null,
        Some(nested) => json!(stores[nested + 1].dir().map(|dir| dir.display().to_string())),
    };
    json!({
        "id": summary.header.id,
        "parent": summary.header.parent_session,
        "depth": summary.header.depth,
        "created_at_ms": summary.header.created_at_ms,
        "last_stop_reason": summary.last_stop_reason.map(|reason| reason.as_str()),
        "bytes": summary.bytes,
        "torn": summary.torn,
        "kind": kind_of(listed, stores),
        "provider": summary.header.provider,
        "label": summary.header.label.as_deref().map(cut),
        "home": home,
    })
}

/// The home's store and its process children's, every session listed.
fn read_listing(home: &Path) -> Listing {
    let mut listing = Listing { stores: vec![SessionStore::new(home)], ..Listing::default() };
    listing.stores.extend(SessionStore::of_children(home));
    let mut seen = HashSet::new();
    for (index, store) in listing.stores.iter().enumerate() {
        let Ok(ids) = store.ids() else { continue };
        for id in ids {
            if !seen.insert(id.clone()) {
                continue;
            }
            match store.summarize(&id) {
                Ok(summary) => {
                    let nested = index.checked_sub(1);
                    listing.sessions.push(Listed { summary, store: nested });
                }
                Err(_) => listing.unreadable += 1,
            }
        }
    }
    listing.sessions.sort_by(|a, b| {
        (a.summary.header.created_at_ms, &a.summary.header.id)
            .cmp(&(b.summary.header.created_at_ms, &b.summary.header.id))
    });
    listing.by_id =
        listing.sessions.iter().enumerate().map(|(index, listed)| (listed.summary.header.id.clone(), index)).collect();
    listing
}

/// Why the session's run failed, when it did: how its last turn ended,
/// the failure's account its recorder wrote (`[the run failed: …]`, an ACP
/// or A2A child's), and the batch's outcome and reason for the run whose
/// child this session is. `null` when nothing says it failed.
fn failure(id: &str, stop_reason: Option<crate::StopReason>, account: Option<Value>, board: Option<&Board>) -> Value {
    let row = board.and_then(|board| {
        let state = board.lock();
        let row = state.rows.iter().rev().find(|row| row.child.as_deref() == Some(id))?;
        Some((row.failed(), row.outcome.clone(), row.detail.clone()))
    });
    let stopped_badly = stop_reason.is_some_and(|reason| reason != crate::StopReason::Completed);
    let row_failed = row.as_ref().is_some_and(|(failed, _, _)| *failed);
    if !stopped_badly && !row_failed && account.is_none() {
        return Value::Null;
    }
    let (outcome, detail) = row.map_or((None, None), |(_, outcome, detail)| (Some(outcome), detail));
    json!({
        "stop_reason": stop_reason.map(|reason| reason.as_str()),
        "account": account,
        "outcome": outcome,
        "detail": detail,
    })
}

/// What a transcript read keeps: the events shown, their size, and what
/// the failure is told from (the last stop reason and failure account met).
#[derive(Default)]
struct Shown {
    events: Vec<Value>,
    bytes: usize,
    /// The read stopped before the session's end.
    cut: bool,
    stop_reason: Option<crate::StopReason>,
    account: Option<Value>,
}

impl Shown {
    fn note(&mut self, event: &SessionEvent) {
        if let Some(reason) = event.ended() {
            self.stop_reason = Some(reason);
        }
        if let SessionEvent::Assistant { text, .. } = event {
            if let Some(rest) = text.strip_prefix(FAILURE_MARK) {
                self.account = Some(cut(rest.strip_suffix(']').unwrap_or(rest)));
            }
        }
    }
}

/// How a recorder starts the account of a run that failed.
const FAILURE_MARK: &str = "[the run failed: ";

/// A permission request and its answer, as a child's recorder writes them
/// (a `tool_result` named `permission`: `asked to run TITLE; options:
/// OPTIONS; answered: ANSWER, by WHO`), in parts. The texts are the
/// child's (hostile) but for `by`; a line of another shape is shown whole.
fn permission_json(call_id: &str, content: &str) -> Value {
    let parts = content.strip_prefix("asked to run ").and_then(|rest| {
        let (asked, rest) = rest.rsplit_once("; answered: ")?;
        let (answer, by) = rest.rsplit_once(", by ")?;
        let (call, options) = asked.rsplit_once("; options: ").unwrap_or((asked, ""));
        Some((call, options, answer, by))
    });
    match parts {
        Some((call, options, answer, by)) => json!({
            "type": "permission", "call_id": cut(call_id), "call": cut(call), "options": cut(options),
            "answer": cut(answer),
            // The option's kind is the recorder's, written last.
            "allowed": answer.ends_with("(AllowOnce)") || answer.ends_with("(AllowAlways)"),
            "by": cut(by),
        }),
        None => json!({"type": "permission", "call_id": cut(call_id), "text": cut(content)}),
    }
}

/// An event as the page shows it, its long texts cut.
fn event_json(event: &SessionEvent) -> Value {
    match event {
        SessionEvent::User { content } => json!({"type": "user", "text": cut(&crate::seam::text_of(content))}),
        SessionEvent::Assistant { text, tool_calls } => {
            let calls: Vec<Value> = tool_calls
                .iter()
                .map(|call| {
                    let arguments = serde_json::to_string_pretty(&call.arguments).unwrap_or_default();
                    json!({"id": cut(&call.id), "name": cut(&call.name), "arguments": cut(&arguments)})
                })
                .collect();
            json!({"type": "assistant", "text": cut(text), "tool_calls": calls})
        }
        SessionEvent::ToolResult { call_id, name, content, .. } if name == "permission" => {
            permission_json(call_id, content)
        }
        SessionEvent::ToolResult { call_id, name, content, is_error } => {
            json!({"type": "tool_result", "call_id": cut(call_id), "name": cut(name), "content": cut(content), "is_error": is_error})
        }
        SessionEvent::TurnEnd { reason, .. } => json!({"type": "turn_end", "reason": reason.as_str()}),
        // An event of a kind this view does not know yet is shown as its
        // JSON (as text, like everything else).
        #[allow(unreachable_patterns)]
        other => json!({"type": "other", "json": cut(&serde_json::to_string(other).unwrap_or_default())}),
    }
}

/// An event's searchable text.
fn event_text(event: &SessionEvent) -> String {
    match event {
        SessionEvent::User { content } => crate::seam::text_of(content),
        SessionEvent::Assistant { text, tool_calls } => {
            let mut all = text.clone();
            for call in tool_calls {
                all.push('\n');
                all.push_str(&call.name);
                all.push(' ');
                all.push_str(&call.arguments.to_string());
            }
            all
        }
        SessionEvent::ToolResult { name, content, .. } => format!("{name}\n{content}"),
        SessionEvent::TurnEnd { reason, .. } => reason.as_str().to_owned(),
        #[allow(unreachable_patterns)]
        other => serde_json::to_string(other).unwrap_or_default(),
    }
}

/// Up to 80 characters either side of the hit at byte `at`.
fn snippet(text: &str, at: usize, length: usize) -> String {
    let start = text[..at].char_indices().rev().nth(79).map_or(0, |(index, _)| index);
    let end = text[at + length.min(text.len() - at)..]
        .char_indices()
        .nth(80)
        .map_or(text.len(), |(index, _)| at + length.min(text.len() - at) + index);
    text[start..end].to_owned()
}

/// `text` whole when short; else its first [`MAX_TRANSCRIPT_TEXT`] bytes
/// (at a character boundary) and how many were left out.
fn cut(text: &str) -> Value {
    if text.len() <= MAX_TRANSCRIPT_TEXT {
        return json!(text);
    }
    let mut end = MAX_TRANSCRIPT_TEXT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    json!({"text": &text[..end], "left_out_bytes": text.len() - end})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snippet_is_cut_at_character_boundaries_around_the_hit() {
        let text = format!("{}needle{}", "é".repeat(200), "ü".repeat(200));
        let at = text.find("needle").unwrap();
        let shown = snippet(&text, at, 6);
        assert!(shown.contains("needle"));
        assert_eq!(shown.chars().count(), 80 + 6 + 80);
    }

    #[test]
    fn a_permission_line_is_read_in_parts_and_one_of_another_shape_is_shown_whole() {
        // An option named to look like an answer: the recorder's own
        // words, written last, decide.
        let line = "asked to run rm; options: Sure; answered: yes (AllowOnce) (RejectOnce), No (RejectOnce); \
                    answered: Sure; answered: yes (AllowOnce) (RejectOnce), by the ACP client";
        let shown = permission_json("t1", line);
        assert_eq!(shown["call"], "rm");
        assert_eq!((shown["by"].as_str(), shown["allowed"].as_bool()), (Some("the ACP client"), Some(false)));
        assert_eq!(shown["answer"], "yes (AllowOnce) (RejectOnce)");
        let odd = permission_json("t2", "something else");
        assert_eq!((odd["type"].as_str(), odd["text"].as_str()), (Some("permission"), Some("something else")));
    }

    #[test]
    fn a_long_text_is_cut_and_says_how_much_was_left_out() {
        let long = "ä".repeat(MAX_TRANSCRIPT_TEXT);
        let cut = cut(&long);
        assert_eq!(cut["left_out_bytes"].as_u64().unwrap() as usize + cut["text"].as_str().unwrap().len(), long.len());
        assert_eq!(super::cut("short"), json!("short"));
    }
}
