//! A child that puts a symbolic link where its worktree (or its batch's
//! directory) was, pointing outside the worktrees' root at a directory
//! dressed up as a worktree: nothing is committed from it and nothing
//! removed through it; cleanup removes the link alone.

use std::path::Path;

use super::{checkout, config, fanout, git, lines_of, no_worktree_left, repository, subagents, text};

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

#[test]
fn a_link_in_place_of_the_default_root_is_never_followed_by_the_next_batch() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let dir = &dir.path().canonicalize().unwrap();
    let repo = repository(dir);
    let tmp = dir.join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    // The root left to its default: `<TMPDIR>/subagents-worktrees-<uid>/<repo>-<hash>`.
    let written = std::fs::read_to_string(config(dir, "")).unwrap();
    let kept: Vec<&str> = written.lines().filter(|line| !line.starts_with("worktree_root")).collect();
    std::fs::write(dir.join("subagents.toml"), kept.join("\n")).unwrap();
    let victim = precious(&dir.join("victim"));
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o755)).unwrap();
    let batch = |name: &str, id: &str, prompt: &str| {
        let tasks = dir.join(format!("{name}-tasks.jsonl"));
        std::fs::write(&tasks, format!("{}\n", serde_json::json!({"id": id, "prompt": prompt}))).unwrap();
        let mut command = subagents(&repo);
        command.arg("fanout").arg(&tasks).args(["--provider", "coder", "--out"]);
        command.arg(dir.join(format!("{name}.jsonl"))).arg("--config").arg(dir.join("subagents.toml"));
        command.arg("--home").arg(dir.join("home")).env("TMPDIR", &tmp);
        crate::common::output_within(&mut command, crate::common::WAIT_LIMIT, "fanout")
    };
    // One run's child puts a link to the victim in place of the root.
    let first = batch("first", "a", &format!("link-root {}", victim.display()));
    let own = std::fs::read_dir(&tmp).unwrap().flatten().next().unwrap().path();
    let roots: Vec<_> = std::fs::read_dir(&own).unwrap().flatten().map(|entry| entry.path()).collect();
    let root = roots.iter().find(|root| !root.to_string_lossy().ends_with(".moved")).unwrap().clone();
    assert!(std::fs::symlink_metadata(&root).unwrap().file_type().is_symlink(), "{}", text(&first.stderr));

    // The next batch on the repository makes its worktree in a directory of its own.
    let second = batch("out", "t1", "write made.txt here");
    let stderr = text(&second.stderr);
    let entries: Vec<_> = std::fs::read_dir(&victim).unwrap().flatten().map(|entry| entry.file_name()).collect();
    assert_eq!(entries, ["precious.txt"], "nothing made through the link: {stderr}");
    assert_eq!(std::fs::metadata(&victim).unwrap().permissions().mode() & 0o7777, 0o755, "not chmod'ed through");
    assert_eq!(std::fs::read_to_string(victim.join("precious.txt")).unwrap(), "keep me\n");
    assert_eq!(second.status.code(), Some(0), "{stderr}");
    assert!(std::fs::symlink_metadata(&root).unwrap().is_dir(), "the link removed, a directory made: {stderr}");
    let made = git(&repo, &["show", "subagents/out/t1:made.txt"]);
    assert_eq!(made.trim(), "here");
}
