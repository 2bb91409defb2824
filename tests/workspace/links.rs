//! A child that puts a symbolic link where its worktree (or its batch's
//! directory) was, pointing outside the worktrees' root at a directory
//! dressed up as a worktree: nothing is committed from it and nothing
//! removed through it; cleanup removes the link alone.

use std::path::Path;

use super::{checkout, config, fanout, git, lines_of, no_worktree_left, repository, text};

/// A directory outside the worktrees' root with a file that must survive.
fn precious(dir: &Path) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("precious.txt"), "keep me\n").unwrap();
    dir.to_owned()
}

#[test]
fn a_link_in_place_of_a_worktree_is_removed_alone_and_nothing_is_committed_through_it() {
    let dir = tempfile::tempdir().unwrap();
    let dir = &dir.path().canonicalize().unwrap();
    let repo = repository(dir);
    config(dir, "");
    let before = checkout(&repo);
    let victim = precious(&dir.join("victim"));
    let output = fanout(dir, &repo, &[("a", &format!("link-away {}", victim.display()))], &[]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(std::fs::read_to_string(victim.join("precious.txt")).unwrap(), "keep me\n", "nothing removed there");
    let workspace = &lines_of(dir, "a")["workspace"];
    let error = workspace["error"].as_str().unwrap_or_default();
    assert!(error.contains("replaced by a symbolic link") && error.contains(&*victim.to_string_lossy()), "{workspace}");
    let tree = git(&repo, &["ls-tree", "-r", "--name-only", "subagents/results/a"]);
    assert!(!tree.contains("precious.txt"), "nothing committed from the link's target: {tree}");
    let link = dir.join("worktrees/results/a");
    assert!(std::fs::symlink_metadata(&link).is_err(), "the link itself is gone");
    assert_eq!(checkout(&repo), before);
    no_worktree_left(dir, &repo);
}

#[test]
fn a_link_in_place_of_a_batch_directory_is_never_removed_through() {
    let dir = tempfile::tempdir().unwrap();
    let dir = &dir.path().canonicalize().unwrap();
    let repo = repository(dir);
    config(dir, "");
    let before = checkout(&repo);
    let victim = dir.join("victim");
    precious(&victim.join("b"));
    let output = fanout(dir, &repo, &[("b", &format!("link-batch {}", victim.display()))], &[]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(std::fs::read_to_string(victim.join("b/precious.txt")).unwrap(), "keep me\n", "nothing removed there");
    let workspace = &lines_of(dir, "b")["workspace"];
    let error = workspace["error"].as_str().unwrap_or_default();
    assert!(error.contains("replaced by a symbolic link"), "{workspace}");
    let tree = git(&repo, &["ls-tree", "-r", "--name-only", "subagents/results/b"]);
    assert!(!tree.contains("precious.txt"), "nothing committed from the link's target: {tree}");
    let link = dir.join("worktrees/results");
    assert!(std::fs::symlink_metadata(&link).is_err(), "the link itself is gone");
    let listed = git(&repo, &["worktree", "list", "--porcelain"]);
    assert_eq!(listed.matches("worktree ").count(), 1, "the run's worktree is forgotten: {listed}");
    assert_eq!(checkout(&repo), before);
}
