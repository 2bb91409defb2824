//! `subagents sessions`: list, show and tree over the session files a run
//! left behind; torn and corrupt files are reported, never fatal.

use serde_json::Value;

use super::{run, subagents, text};

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
    let sessions_dir = home.path().join("sessions");
    let mut torn =
        std::fs::OpenOptions::new().append(true).open(sessions_dir.join(format!("{root_id}.jsonl"))).unwrap();
    std::io::Write::write_all(&mut torn, b"{\"type\":\"user\",\"cont").unwrap();
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
