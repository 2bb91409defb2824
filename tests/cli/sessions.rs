//! `subagents sessions`: list, show and tree over the session files a run
//! left behind; torn and corrupt files are reported, never fatal, and so are
//! files that are not files, lineage that loops and chains of any depth.

use std::io::Write;
use std::path::Path;
use std::process::Output;

use serde_json::{json, Value};

use super::{peak_rss_kib, run, subagents, text};

/// A session file as a run writes it under `sessions`: its header naming
/// `parent`, `events` (JSON lines), then a completed turn.
fn forge(sessions: &Path, id: &str, parent: Option<&str>, depth: usize, events: &[String]) {
    let mut file = std::io::BufWriter::new(std::fs::File::create(sessions.join(format!("{id}.jsonl"))).unwrap());
    let header = json!({"type": "header", "id": id, "parent_session": parent, "depth": depth,
        "cwd": "/tmp", "persona": null, "created_at_ms": 1_764_547_200_000u64 + depth as u64});
    writeln!(file, "{header}").unwrap();
    for event in events {
        writeln!(file, "{event}").unwrap();
    }
    writeln!(file, "{}", json!({"type": "turn_end", "reason": "completed"})).unwrap();
    file.flush().unwrap();
}

/// A home with an empty `sessions` directory.
fn home_with_sessions() -> (tempfile::TempDir, std::path::PathBuf) {
    let home = tempfile::tempdir().unwrap();
    let sessions = home.path().join("sessions");
    std::fs::create_dir(&sessions).unwrap();
    (home, sessions)
}

/// `subagents sessions ARGS --home HOME` (bounded, as every `run`).
fn sessions_in(home: &Path, args: &[&str]) -> Output {
    run(subagents().arg("sessions").args(args).arg("--home").arg(home))
}

#[test]
fn sessions_lists_shows_and_trees_what_a_run_left_and_reports_bad_files() {
    let home = tempfile::tempdir().unwrap();
    let ran = run(subagents().args(["run", "review the parser; check the docs", "--home"]).arg(home.path()));
    assert_eq!(ran.status.code(), Some(0), "{}", text(&ran.stderr));
    let sessions = |args: &[&str]| {
        let output = run(subagents().arg("sessions").args(args).arg("--home").arg(home.path()));
        (output.status.code(), text(&output.stdout), text(&output.stderr))
    };

    let (code, listed, _) = sessions(&["list", "--json"]);
    assert_eq!(code, Some(0));
    let listed: Value = serde_json::from_str(&listed).unwrap();
    let all = listed["sessions"].as_array().unwrap();
    assert_eq!(all.len(), 3, "the parent and its two children: {all:?}");
    let root = all.iter().find(|s| s["parent"].is_null()).unwrap();
    let root_id = root["id"].as_str().unwrap().to_owned();
    assert_eq!(root["last_stop_reason"], "completed");
    assert_eq!(all.iter().filter(|s| s["parent"] == root["id"] && s["depth"] == 1).count(), 2);

    let (code, tree, _) = sessions(&["tree", &root_id]);
    assert_eq!(code, Some(0));
    assert_eq!(tree.lines().count(), 3, "{tree}");
    assert!(tree.contains("├─ ") && tree.contains("└─ ") && tree.contains("(depth 1, completed)"), "{tree}");
    let (_, tree_json, _) = sessions(&["tree", &root_id, "--json"]);
    let tree_json: Value = serde_json::from_str(&tree_json).unwrap();
    assert_eq!(tree_json["children"].as_array().unwrap().len(), 2);

    let (code, shown, _) = sessions(&["show", &root_id]);
    assert_eq!(code, Some(0));
    assert!(shown.contains("user: review the parser; check the docs"), "{shown}");
    assert!(shown.contains("→ subagent") && shown.contains("← subagent") && shown.contains("turn end: completed"));

    // A torn last line is reported beside its session; a corrupt file is
    // reported and the rest still listed (exit 1: not everything was read).
    // The run wrote its sessions to shared segments, each line tagged.
    let sessions_dir = home.path().join("sessions");
    let tag = format!("{{\"session\":\"{root_id}\",");
    let root_segment = std::fs::read_dir(&sessions_dir)
        .unwrap()
        .flatten()
        .map(|entry| entry.path())
        .find(|path| std::fs::read_to_string(path).is_ok_and(|text| text.contains(&tag)))
        .expect("a segment holds the root's lines");
    let mut torn = std::fs::OpenOptions::new().append(true).open(root_segment).unwrap();
    std::io::Write::write_all(&mut torn, format!("{tag}\"type\":\"user\",\"cont").as_bytes()).unwrap();
    std::fs::write(sessions_dir.join("broken.jsonl"), "not json\n{}\n").unwrap();
    let (code, listed, _) = sessions(&["list"]);
    assert_eq!(code, Some(1), "{listed}");
    assert!(listed.contains("torn last line left out"), "{listed}");
    assert!(listed.contains("broken") && listed.contains("unreadable") && listed.contains("line 1"), "{listed}");
    assert_eq!(listed.lines().filter(|l| l.contains("completed")).count(), 3, "{listed}");

    let (code, _, stderr) = sessions(&["show", "no-such-session"]);
    assert_eq!(code, Some(2), "an unknown id is bad input");
    assert!(stderr.contains("no session"), "{stderr}");
}

#[test]
fn tree_reports_a_lineage_loop_and_exits_one_instead_of_overflowing() {
    let (home, sessions) = home_with_sessions();
    forge(&sessions, "narcissus", Some("narcissus"), 0, &[]);
    forge(&sessions, "a", Some("b"), 1, &[]);
    forge(&sessions, "b", Some("a"), 2, &[]);
    forge(&sessions, "c", Some("b"), 3, &[]);

    let tree = sessions_in(home.path(), &["tree", "narcissus"]);
    assert_eq!(tree.status.code(), Some(1), "{}", text(&tree.stderr));
    assert_eq!(
        text(&tree.stdout),
        "narcissus (depth 0, completed)\n└─ narcissus (its lineage loops back here; not followed)\n"
    );
    assert!(text(&tree.stderr).contains("lineage under narcissus loops"), "{}", text(&tree.stderr));

    let tree = sessions_in(home.path(), &["tree", "a"]);
    assert_eq!(tree.status.code(), Some(1));
    assert_eq!(
        text(&tree.stdout),
        "a (depth 1, completed)\n\
         └─ b (depth 2, completed)\n   \
         ├─ a (its lineage loops back here; not followed)\n   \
         └─ c (depth 3, completed)\n"
    );
    let tree = sessions_in(home.path(), &["tree", "a", "--json"]);
    assert_eq!(tree.status.code(), Some(1));
    let tree: Value = serde_json::from_slice(&tree.stdout).unwrap();
    let below_b = &tree["children"][0]["children"];
    assert_eq!(below_b[0], json!({"id": "a", "lineage_loop": true}));
    assert_eq!(below_b[1]["id"], "c");
}

#[test]
fn a_twenty_thousand_level_chain_trees_in_short_lines_and_as_json_any_reader_takes() {
    const LEVELS: usize = 20_000;
    let (home, sessions) = home_with_sessions();
    for level in 0..LEVELS {
        let parent = (level > 0).then(|| format!("s{}", level - 1));
        forge(&sessions, &format!("s{level}"), parent.as_deref(), level, &[]);
    }

    let tree = sessions_in(home.path(), &["tree", "s0"]);
    assert_eq!(tree.status.code(), Some(0), "{}", text(&tree.stderr));
    let printed = text(&tree.stdout);
    assert_eq!(printed.lines().count(), LEVELS);
    let widest = printed.lines().map(|line| line.chars().count()).max().unwrap();
    assert!(widest < 160, "the indent stops growing: {widest} columns");
    let last = printed.lines().last().unwrap();
    assert!(last.ends_with("[level 19999] s19999 (depth 19999, completed)"), "{last}");

    let tree = sessions_in(home.path(), &["tree", "s0", "--json"]);
    assert_eq!(tree.status.code(), Some(0), "{}", text(&tree.stderr));
    // serde_json's default reader refuses more than 128 levels of nesting.
    let tree: Value = serde_json::from_slice(&tree.stdout).expect("nested shallowly enough to read");
    let mut node = &tree;
    for level in 1..=50 {
        node = &node["children"][0];
        assert_eq!(node["id"], format!("s{level}"));
    }
    let descendants = node["descendants"].as_array().expect("the 50th level holds the rest flat");
    assert_eq!(descendants.len(), LEVELS - 51);
    assert_eq!((&descendants[0]["id"], &descendants[0]["level"]), (&json!("s51"), &json!(51)));
    assert_eq!(descendants.last().unwrap()["parent"], "s19998");
}

#[test]
fn list_reads_only_regular_files_and_bounds_each_line() {
    let (home, sessions) = home_with_sessions();
    forge(&sessions, "fine", None, 0, &[]);
    std::os::unix::fs::symlink("/dev/zero", sessions.join("zero.jsonl")).unwrap();
    forge(home.path(), "elsewhere", None, 0, &[]);
    std::os::unix::fs::symlink(home.path().join("elsewhere.jsonl"), sessions.join("linked.jsonl")).unwrap();
    let fifo = std::ffi::CString::new(sessions.join("fifo.jsonl").into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0, "mkfifo");
    // 256 MiB of zeros on no disk: one endless line.
    std::fs::File::create(sessions.join("sparse.jsonl")).unwrap().set_len(256 << 20).unwrap();

    let listed = sessions_in(home.path(), &["list", "--max-line-bytes", "65536"]);
    assert_eq!(listed.status.code(), Some(1), "unreadable files are work not done: {}", text(&listed.stderr));
    let listed = text(&listed.stdout);
    let line_of = |id: &str| listed.lines().find(|l| l.starts_with(id)).unwrap_or_default().to_owned();
    assert!(line_of("fine").contains("completed"), "{listed}");
    assert!(line_of("zero").contains("is a symbolic link, not a regular file"), "{listed}");
    assert!(line_of("linked").contains("is a symbolic link, not a regular file"), "{listed}");
    assert!(line_of("fifo").contains("is a FIFO, not a regular file"), "{listed}");
    assert!(line_of("sparse").contains("line 1: the line is longer than 65536 bytes"), "{listed}");

    let shown = sessions_in(home.path(), &["show", "zero"]);
    assert_eq!(shown.status.code(), Some(2));
    assert!(text(&shown.stderr).contains("symbolic link"), "{}", text(&shown.stderr));
}

#[test]
fn list_holds_each_session_in_brief_not_every_transcript() {
    let (home, sessions) = home_with_sessions();
    forge(&sessions, "small", None, 0, &[]);
    let (status, small) = peak_rss_kib(subagents().args(["sessions", "list", "--home"]).arg(home.path()));
    assert!(status.success());
    // Four transcripts of 8 MiB each, in 1 KiB tool results.
    let result = json!({"type": "tool_result", "call_id": "c1", "name": "read_file", "content": "x".repeat(1000)});
    let events = vec![result.to_string(); 8 * 1024];
    for n in 0..4 {
        forge(&sessions, &format!("large-{n}"), None, 0, &events);
    }
    let (status, large) = peak_rss_kib(subagents().args(["sessions", "list", "--home"]).arg(home.path()));
    assert!(status.success());
    // Holding the transcripts would cost over 32 MiB; one line at a time
    // costs the read buffer (and the allocator's own growth, which has
    // reached 8 MiB under load: half the transcripts is the bound).
    let grown = large.saturating_sub(small);
    assert!(grown < 16 * 1024, "peak RSS grew {grown} KiB for 32 MiB of sessions ({small} → {large} KiB)");
}

#[test]
fn a_file_whose_header_names_another_session_is_reported_not_shown_under_that_name() {
    let (home, sessions) = home_with_sessions();
    forge(&sessions, "real", None, 0, &[]);
    forge(&sessions, "victim", None, 0, &[]);
    // A copy of `victim` under another name: its header still says victim.
    std::fs::copy(sessions.join("victim.jsonl"), sessions.join("forged.jsonl")).unwrap();
    let listed = sessions_in(home.path(), &["list"]);
    assert_eq!(listed.status.code(), Some(1), "{}", text(&listed.stderr));
    let listed = text(&listed.stdout);
    let forged = listed.lines().find(|l| l.starts_with("forged")).expect("listed under its file name");
    assert!(forged.contains("its header names session \"victim\""), "{listed}");
    assert_eq!(listed.lines().filter(|l| l.starts_with("victim")).count(), 1, "victim once: {listed}");
    let shown = sessions_in(home.path(), &["show", "forged"]);
    assert_eq!(shown.status.code(), Some(2));
    assert!(text(&shown.stderr).contains("not the file's"), "{}", text(&shown.stderr));
}

#[test]
fn a_reader_that_went_away_ends_the_listing_quietly() {
    let (home, sessions) = home_with_sessions();
    for n in 0..200 {
        forge(&sessions, &format!("s{n:03}"), None, 0, &[]);
    }
    let home = home.path().to_str().unwrap();
    for command in [vec!["sessions", "list", "--home", home], vec!["providers", "list"]] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let output = subagents().args(&command).stdout(writer).stderr(std::process::Stdio::piped()).output().unwrap();
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(0), "{command:?}: {stderr}");
        assert!(!stderr.contains("Broken pipe") && !stderr.contains("panicked"), "{command:?}: {stderr}");
    }
}

/// A session with a header of its own choosing (`extra` merged in) and
/// `events`, without the turn end `forge` adds when `open`.
fn forge_with(sessions: &Path, id: &str, extra: Value, events: &[Value], open: bool) {
    let mut header = json!({"type": "header", "id": id, "parent_session": null, "depth": 0, "cwd": "/tmp",
        "persona": null, "created_at_ms": 1_764_547_200_000u64});
    header.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    let mut lines = vec![header.to_string()];
    lines.extend(events.iter().map(Value::to_string));
    if !open {
        lines.push(json!({"type": "turn_end", "reason": "completed"}).to_string());
    }
    std::fs::write(sessions.join(format!("{id}.jsonl")), lines.join("\n") + "\n").unwrap();
}

#[test]
fn list_shows_who_ran_each_session_its_state_and_words_newest_first_and_filters() {
    let (home, sessions) = home_with_sessions();
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    let user = |text: &str| json!({"type": "user", "content": [{"type": "text", "text": text}]});
    let calls = json!({"type": "assistant", "text": "", "tool_calls": [
        {"id": "c1", "name": "read_file", "arguments": {}}, {"id": "c2", "name": "bash", "arguments": {}}]});
    let failed = json!({"type": "tool_result", "call_id": "c2", "name": "bash", "content": "bubblewrap is unavailable", "is_error": true});
    forge_with(&sessions, "aaa-old", json!({"created_at_ms": 1_000u64}), &[user("an old question")], false);
    forge_with(
        &sessions,
        "bbb-child",
        json!({"created_at_ms": now_ms - 1_000, "provider": "codex", "label": "fix\u{1b}[2J the parser", "parent_session": "aaa-old", "depth": 1}),
        &[
            user("please fix the parser"),
            calls,
            failed,
            json!({"type": "turn_end", "reason": "completed", "duration_ms": 19_500,
                "usage": {"input_tokens": 1_000, "output_tokens": 234}}),
            user("and the tests"),
        ],
        false,
    );
    forge_with(
        &sessions,
        "bbc-open",
        json!({"created_at_ms": now_ms, "provider": "spawn"}),
        &[user("still thinking about a very long question that goes on and on and on well past sixty characters")],
        true,
    );

    let listed = text(&sessions_in(home.path(), &["list"]).stdout);
    let rows: Vec<&str> = listed.lines().skip(1).collect();
    assert_eq!(rows.iter().map(|r| &r[..8]).collect::<Vec<_>>(), ["bbc-open", "bbb-chil", "aaa-old "], "{listed}");
    assert!(
        rows[0].contains("spawn") && rows[0].contains(" open ") && rows[0].contains("\"still thinking"),
        "{listed}"
    );
    assert!(rows[0].ends_with("…\""), "a long prompt is cut: {listed}");
    let child = rows[1];
    assert!(child.contains("codex") && child.contains("completed") && child.contains("2 (1✗)"), "{listed}");
    assert!(child.contains(" 19.5s ") && child.contains(" 1234 "), "its time and tokens: {listed}");
    assert!(child.contains("fix the parser") && !child.contains('\u{1b}'), "the label, made safe: {listed}");
    assert!(rows[2].contains(" - ") && rows[2].contains("\"an old question\""), "{listed}");

    let only = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["list", "--json"];
        all.extend_from_slice(args);
        let listed: Value = serde_json::from_slice(&sessions_in(home.path(), &all).stdout).unwrap();
        listed["sessions"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(only(&["--provider", "codex"]), ["bbb-child"]);
    assert_eq!(only(&["--provider", "-"]), ["aaa-old"]);
    assert_eq!(only(&["--state", "open"]), ["bbc-open"]);
    assert_eq!(only(&["--state", "completed"]), ["bbb-child", "aaa-old"]);
    assert_eq!(only(&["--since", "1h"]), ["bbc-open", "bbb-child"]);
    assert_eq!(only(&["--since", "1970-01-02"]), ["bbc-open", "bbb-child"]);
    assert_eq!(only(&["--limit", "1"]), ["bbc-open"]);
    let listed: Value = serde_json::from_slice(&sessions_in(home.path(), &["list", "--json"]).stdout).unwrap();
    let child = listed["sessions"].as_array().unwrap().iter().find(|s| s["id"] == "bbb-child").unwrap().clone();
    assert_eq!(
        (&child["tool_calls"], &child["tool_calls_failed"], &child["state"]),
        (&json!(2), &json!(1), &json!("completed"))
    );
    assert_eq!((&child["duration_ms"], &child["usage"]["output_tokens"]), (&json!(19_500), &json!(234)));
    let refused = sessions_in(home.path(), &["list", "--since", "yesterday"]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused.stderr));
}

#[test]
fn show_and_tree_take_a_unique_id_prefix_and_an_ambiguous_one_names_the_candidates() {
    let (home, sessions) = home_with_sessions();
    forge(&sessions, "f00d-root", None, 0, &[]);
    forge(&sessions, "f00e-child", Some("f00d-root"), 1, &[]);
    forge(&sessions, "beef", None, 0, &[]);

    let shown = sessions_in(home.path(), &["show", "be"]);
    assert_eq!(shown.status.code(), Some(0), "{}", text(&shown.stderr));
    assert!(text(&shown.stdout).starts_with("session beef "), "{}", text(&shown.stdout));
    let tree = sessions_in(home.path(), &["tree", "f00d"]);
    assert_eq!(tree.status.code(), Some(0), "{}", text(&tree.stderr));
    assert_eq!(text(&tree.stdout), "f00d-root (depth 0, completed)\n└─ f00e-child (depth 1, completed)\n");

    let ambiguous = sessions_in(home.path(), &["show", "f00"]);
    assert_eq!(ambiguous.status.code(), Some(2));
    let said = text(&ambiguous.stderr);
    assert!(said.contains("ambiguous") && said.contains("f00d-root, f00e-child"), "{said}");
    let unknown = sessions_in(home.path(), &["tree", "cafe"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(text(&unknown.stderr).contains("no session"), "{}", text(&unknown.stderr));
}
