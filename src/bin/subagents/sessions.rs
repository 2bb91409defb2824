//! `subagents sessions list | show ID | tree ID [--json]`: read what the
//! subagents did, from the session files under `<home>/sessions/`.
//!
//! - `list`: every session, oldest first: id, parent, depth, created, the
//!   last turn's stop reason, size.
//! - `show ID`: the transcript: user messages, answers with their tool
//!   calls, tool results, turn ends.
//! - `tree ID`: the delegation tree under a session (its children by
//!   lineage), each with its last stop reason.
//!
//! Reading never repairs or changes a file. A torn last line (a write cut
//! off by a crash) is reported beside the session; a corrupt or unreadable
//! file is reported as such and the others are still listed. With `--json`
//! each command prints one JSON document instead of text.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{json, Value};
use subagents::agent::{SessionEvent, SessionStore, StoredSession};

use crate::terminal;
use crate::Ended;

/// What `sessions` was asked to do.
pub enum Query {
    List,
    Show(String),
    Tree(String),
}

pub struct SessionsArgs {
    pub query: Query,
    pub home: Option<PathBuf>,
    pub json: bool,
}

/// A listed session: read whole, or the reason it could not be.
struct Listed {
    id: String,
    read: Result<StoredSession, String>,
}

pub fn sessions(args: SessionsArgs) -> Result<Ended, String> {
    let home = args.home.or_else(|| std::env::var_os("SUBAGENTS_HOME").map(PathBuf::from));
    let home = home.unwrap_or_else(|| PathBuf::from(".subagents"));
    let store = SessionStore::new(&home);
    match args.query {
        Query::List => list(&store, args.json),
        Query::Show(id) => show(&store, &id, args.json),
        Query::Tree(id) => tree(&store, &id, args.json),
    }
}

/// Every session of the store, oldest first (unreadable ones last).
fn read_all(store: &SessionStore) -> Result<Vec<Listed>, String> {
    let ids =
        store.ids().map_err(|e| format!("cannot list {}: {e}", store.dir().unwrap_or(&PathBuf::new()).display()))?;
    let mut listed: Vec<Listed> =
        ids.into_iter().map(|id| Listed { read: store.inspect(&id).map_err(|e| e.to_string()), id }).collect();
    listed.sort_by_key(|l| (l.read.as_ref().map_or(u64::MAX, |s| s.header.created_at_ms), l.id.clone()));
    Ok(listed)
}

fn summary(session: &StoredSession) -> Value {
    json!({
        "id": session.header.id,
        "parent": session.header.parent_session,
        "depth": session.header.depth,
        "created_at_ms": session.header.created_at_ms,
        "last_stop_reason": session.last_stop_reason(),
        "bytes": session.bytes,
        "torn": session.torn,
    })
}

fn list(store: &SessionStore, as_json: bool) -> Result<Ended, String> {
    let listed = read_all(store)?;
    let unreadable = listed.iter().filter(|l| l.read.is_err()).count();
    if as_json {
        let sessions: Vec<Value> = listed
            .iter()
            .map(|l| match &l.read {
                Ok(session) => summary(session),
                Err(error) => json!({"id": l.id, "error": error}),
            })
            .collect();
        println!("{}", json!({ "sessions": sessions }));
    } else if listed.is_empty() {
        println!("no sessions under {}", terminal::line(&store.dir().unwrap_or(&PathBuf::new()).display().to_string()));
    } else {
        println!("{:<38} {:<38} {:>5} {:<24} {:<12} {:>9}", "id", "parent", "depth", "created", "last stop", "bytes");
        for l in &listed {
            let line = match &l.read {
                Ok(s) => format!(
                    "{:<38} {:<38} {:>5} {:<24} {:<12} {:>9}{}",
                    s.header.id,
                    s.header.parent_session.as_deref().unwrap_or("-"),
                    s.header.depth,
                    created(s.header.created_at_ms),
                    s.last_stop_reason().map_or("-".to_owned(), |r| r.to_string()),
                    s.bytes,
                    if s.torn { "  (torn last line left out)" } else { "" }
                ),
                Err(error) => format!("{:<38} unreadable: {error}", l.id),
            };
            println!("{}", terminal::line(&line));
        }
    }
    // A corrupt file is reported, not fatal; it still counts as work not done.
    Ok(if unreadable == 0 { Ended::Completed } else { Ended::Incomplete })
}

fn show(store: &SessionStore, id: &str, as_json: bool) -> Result<Ended, String> {
    let session = store.inspect(id).map_err(|e| e.to_string())?;
    if as_json {
        let events = serde_json::to_value(&session.events).map_err(|e| e.to_string())?;
        println!(
            "{}",
            json!({"session": summary(&session), "cwd": session.header.cwd, "persona": session.header.persona, "events": events})
        );
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
            SessionEvent::User { content } => out.push(format!("user: {}", subagents::text_of(content))),
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
            SessionEvent::TurnEnd { reason } => out.push(format!("— turn end: {reason}")),
        }
    }
    if session.torn {
        out.push("(a torn last line was left out)".to_owned());
    }
    for line in out {
        println!("{}", terminal::text(&line));
    }
    Ok(Ended::Completed)
}

fn tree(store: &SessionStore, id: &str, as_json: bool) -> Result<Ended, String> {
    let root = store.inspect(id).map_err(|e| e.to_string())?;
    let listed = read_all(store)?;
    let mut children: BTreeMap<String, Vec<&StoredSession>> = BTreeMap::new();
    for session in listed.iter().filter_map(|l| l.read.as_ref().ok()) {
        if let Some(parent) = &session.header.parent_session {
            children.entry(parent.clone()).or_default().push(session);
        }
    }
    if as_json {
        println!("{}", node_json(&root, &children));
    } else {
        let mut out = String::new();
        out.push_str(&format!("{} {}\n", root.header.id, outcome(&root)));
        write_children(&root.header.id, &children, "", &mut out);
        print!("{}", terminal::text(&out));
    }
    Ok(Ended::Completed)
}

fn node_json(session: &StoredSession, children: &BTreeMap<String, Vec<&StoredSession>>) -> Value {
    let mut node = summary(session);
    let below: Vec<Value> = children
        .get(&session.header.id)
        .map(|kids| kids.iter().map(|kid| node_json(kid, children)).collect())
        .unwrap_or_default();
    node["children"] = Value::Array(below);
    node
}

fn write_children(parent: &str, children: &BTreeMap<String, Vec<&StoredSession>>, indent: &str, out: &mut String) {
    let Some(kids) = children.get(parent) else { return };
    for (n, kid) in kids.iter().enumerate() {
        let last = n + 1 == kids.len();
        let (branch, next) = if last { ("└─ ", "   ") } else { ("├─ ", "│  ") };
        out.push_str(&format!("{indent}{branch}{} {}\n", kid.header.id, outcome(kid)));
        write_children(&kid.header.id, children, &format!("{indent}{next}"), out);
    }
}

fn outcome(session: &StoredSession) -> String {
    let reason = session.last_stop_reason().map_or("no finished turn".to_owned(), |r| r.to_string());
    format!("(depth {}, {reason}{})", session.header.depth, if session.torn { ", torn last line" } else { "" })
}

/// A creation time as UTC `YYYY-MM-DD hh:mm:ss`.
fn created(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}Z", rest / 3600, rest % 3600 / 60, rest % 60)
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
    use super::created;

    #[test]
    fn creation_times_read_as_utc_dates() {
        assert_eq!(created(0), "1970-01-01 00:00:00Z");
        assert_eq!(created(1_764_547_200_000), "2025-12-01 00:00:00Z");
        assert_eq!(created(951_782_400_000 + 86_399_000), "2000-02-29 23:59:59Z");
    }
}
