//! `merge` run again while the user works on its result branch: checked
//! out in their checkout, in a worktree of theirs, mid-rebase there, or
//! unborn. The branch is never moved under them; the report says how to
//! bring it to the merge, and the merge itself is there to take.

use std::path::Path;

use serde_json::Value;

use super::{checkout, config, fanout, git, merge, outcomes, repository, text};

const RESULT: &str = "subagents/results.merged";

/// `merge --json` in `repo`, which must exit 0; its report.
fn merged(dir: &Path, repo: &Path, flags: &[&str]) -> Value {
    let mut flags = flags.to_vec();
    flags.push("--json");
    let output = merge(dir, repo, &flags);
    assert_eq!(output.status.code(), Some(0), "{}{}", text(&output.stdout), text(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The report left the result branch where it was, at `tip`, saying where
/// it is checked out and how to take the merge there, which holds `file`.
fn left_alone(repo: &Path, report: &Value, tip: &str, at: &Path, file: &str) {
    assert_eq!(git(repo, &["rev-parse", RESULT]), tip, "the result branch did not move: {report}");
    let why = report["result_not_moved"].as_str().unwrap_or_else(|| panic!("the report says why: {report}"));
    let commit = report["commit"].as_str().unwrap();
    assert!(why.contains(&*at.to_string_lossy()) && why.contains(&format!("git merge --ff-only {commit}")), "{why}");
    git(repo, &["cat-file", "-e", &format!("{commit}:{file}")]);
}

#[test]
fn merge_again_never_moves_the_result_branch_where_a_worktree_has_it() {
    let dir = tempfile::tempdir().unwrap();
    let dir = &dir.path().canonicalize().unwrap();
    let repo = repository(dir);
    config(dir, "");
    let tasks = [("a", "write a.txt alpha"), ("b", "write b.txt beta"), ("c", "write c.txt gamma")];
    let output = fanout(dir, &repo, &tasks, &[]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let first = merged(dir, &repo, &["--only", "a"]);
    let tip = git(&repo, &["rev-parse", RESULT]);
    assert_eq!(first["commit"], tip.as_str());

    // The user looks at the result in their own checkout; merging b now
    // would move their HEAD and show a.txt… as staged changes.
    git(&repo, &["checkout", "--quiet", RESULT]);
    let before = checkout(&repo);
    let report = merged(dir, &repo, &["--only", "a,b"]);
    assert_eq!(outcomes(&report)["b"], "merged");
    left_alone(&repo, &report, &tip, &repo, "b.txt");
    assert_eq!(checkout(&repo), before, "the user's checkout is untouched");

    // In a worktree of theirs, the same; and while a rebase holds it there.
    git(&repo, &["checkout", "--quiet", "main"]);
    let side = dir.join("side");
    git(&repo, &["worktree", "add", "--quiet", &side.to_string_lossy(), RESULT]);
    let report = merged(dir, &repo, &["--only", "a,b"]);
    left_alone(&repo, &report, &tip, &side, "b.txt");
    let stopped = std::process::Command::new("git")
        .args(["rebase", "--quiet", "--exec", "false", "HEAD~1"])
        .current_dir(&side)
        .output()
        .unwrap();
    assert!(!stopped.status.success(), "the rebase stops at its failing exec");
    let report = merged(dir, &repo, &["--only", "a,b"]);
    left_alone(&repo, &report, &tip, &side, "b.txt");
    git(&side, &["rebase", "--abort"]);
    git(&repo, &["worktree", "remove", &side.to_string_lossy()]);

    // Nobody has it: it moves, and the report says nothing of it.
    let report = merged(dir, &repo, &[]);
    assert_eq!(git(&repo, &["rev-parse", RESULT]), report["commit"].as_str().unwrap());
    assert!(report.get("result_not_moved").is_none(), "{report}");
    assert_eq!(git(&repo, &["show", &format!("{RESULT}:c.txt")]), "gamma");
}

#[test]
fn merge_never_makes_a_result_branch_that_a_worktree_is_on_unborn() {
    let dir = tempfile::tempdir().unwrap();
    let dir = &dir.path().canonicalize().unwrap();
    let repo = repository(dir);
    config(dir, "");
    let output = fanout(dir, &repo, &[("a", "write a.txt alpha")], &[]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    // A worktree on the result branch's name, unborn: making the branch
    // would fill its HEAD with the merge, its index empty.
    let side = dir.join("side");
    git(&repo, &["worktree", "add", "--quiet", "--orphan", "-b", RESULT, &side.to_string_lossy()]);
    let report = merged(dir, &repo, &[]);
    assert_eq!(outcomes(&report)["a"], "merged");
    let made = std::process::Command::new("git")
        .args(["rev-parse", "--verify", "--quiet", &format!("refs/heads/{RESULT}")])
        .current_dir(&repo)
        .output()
        .unwrap();
    assert!(!made.status.success(), "the branch was not made under the worktree");
    let why = report["result_not_moved"].as_str().unwrap_or_default();
    assert!(why.contains(&*side.to_string_lossy()), "{report}");
    assert_eq!(git(&side, &["status", "--porcelain"]), "", "nothing staged in the worktree");
}
