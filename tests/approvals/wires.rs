//! docs/contract.md §11.11, across wires: a request raised inside a
//! `process` child's runtime (its `acp` grandchild asking) crosses the
//! serve wire to the parent, whose door answers it, and the answer comes
//! back to exactly that grandchild; a parent that dies answers reject to
//! it at once, and leaves nothing running.

use std::path::{Path, PathBuf};

use super::{approve, asking, chosen, permission_lines, subagents_at};
use crate::common;

/// A `process` provider `isolated` whose child (`subagents serve`)
/// delegates to an ACP `asker` that asks about `cargo test` (and records
/// the option it is given); the configuration's path.
fn process_over_an_asking_grandchild(dir: &Path) -> PathBuf {
    let asker = asking(dir, "asker", &[("execute", "cargo test")]);
    let child = dir.join("child.toml");
    let provider = format!(
        "[providers.asker]\nkind = \"acp\"\ncommand = \"/bin/sh\"\nargs = [{script:?}]\npermission = \"ask\"\n",
        script = asker.args[0]
    );
    std::fs::write(&child, provider).unwrap();
    let config = dir.join("subagents.toml");
    std::fs::write(&config, "[providers.isolated]\nkind = \"process\"\nconfig = \"child.toml\"\n").unwrap();
    config
}

/// `fanout` of one task through `isolated`, its request parked for
/// `subagents approve`.
fn fanout_parking(dir: &Path, home: &Path, config: &Path) -> std::process::Child {
    let tasks = dir.join("tasks.jsonl");
    let prompt = r#"[tool:subagent {"description": "run tests", "prompt": "run the tests"}]"#;
    std::fs::write(&tasks, format!("{}\n", serde_json::json!({"id": "t1", "prompt": prompt}))).unwrap();
    let policy = dir.join("approvals.toml");
    std::fs::write(&policy, "[approvals]\npermission = \"ask\"\n").unwrap();
    let mut fanout = subagents_at("fanout", home);
    fanout.arg(&tasks).args(["--provider", "isolated", "--config"]).arg(config);
    fanout.arg("--approvals").arg(&policy).arg("--out").arg(dir.join("out.jsonl"));
    fanout.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::piped()).spawn().unwrap()
}

/// What waits, once something does: `(id, the line shown)`.
fn parked(home: &Path) -> (String, String) {
    let mut listed = String::new();
    let found = common::blocking::eventually(common::WAIT_LIMIT, || {
        listed = approve(home, &[]).1;
        !listed.is_empty()
    });
    assert!(found, "the grandchild's request is parked and listed");
    let (id, shown) = listed.trim().split_once("  ").unwrap();
    (id.to_owned(), shown.to_owned())
}

#[test]
fn a_process_childs_grandchild_asks_through_the_wire_and_the_answer_from_another_process_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let config = process_over_an_asking_grandchild(dir.path());
    let mut running = fanout_parking(dir.path(), &home, &config);
    let (id, shown) = parked(&home);
    // The whole path from the root: the process run, then the grandchild
    // one level further down than its own runtime counts it.
    assert!(shown.contains("asker (run tests) at depth 2 [isolated"), "{shown}");
    assert!(shown.contains("› asker (run tests)]") && shown.contains("cargo test (execute)"), "{shown}");
    let (code, _, said) = approve(&home, &[&id, "allow"]);
    assert_eq!(code, Some(0), "{said}");

    let status = running.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(running.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "{stderr}");
    assert_eq!(chosen(dir.path(), "asker"), ["yes"], "the grandchild got the allow the other process gave");
    let lines = permission_lines(&home.join("children/isolated"), "asker");
    assert!(lines.len() == 1 && lines[0].contains("answered: Allow (AllowOnce)"), "{lines:?}");
    let out = std::fs::read_to_string(dir.path().join("out.jsonl")).unwrap();
    assert!(out.contains(r#""stop_reason":"completed""#), "{out}");
    common::no_process_mentions(dir.path());
}

#[test]
fn a_process_child_whose_parent_is_killed_rejects_its_grandchilds_pending_request_and_ends() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let config = process_over_an_asking_grandchild(dir.path());
    let mut running = fanout_parking(dir.path(), &home, &config);
    parked(&home);
    running.kill().unwrap(); // SIGKILL: no cleanup of its own.
    running.wait().unwrap();
    let answered = || !chosen(dir.path(), "asker").is_empty();
    assert!(common::blocking::eventually(common::WAIT_LIMIT, answered), "the grandchild was answered");
    assert_eq!(chosen(dir.path(), "asker"), ["no"], "a dead parent's answer is a reject");
    // Rejected for the parent's death, before the session's turn was cancelled.
    let gone = || common::processes_mentioning(dir.path()).is_empty();
    assert!(common::blocking::eventually(common::WAIT_LIMIT, gone), "the serve child and its grandchild ended");
    let lines = permission_lines(&home.join("children/isolated"), "asker");
    assert!(lines.len() == 1 && lines[0].contains("by the parent is gone"), "{lines:?}");
}
