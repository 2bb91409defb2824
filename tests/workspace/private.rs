//! Where worktrees are made is the user's alone: the root is 0700 whatever
//! its parent (a world-writable temporary directory, a root made wider
//! before), under the shared temporary directory a directory of the
//! user's own holds it, and `merge`'s scratch worktree is made there too.
//! The tests run as root, so they read the mode bits and the owner rather
//! than try another user.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::{config, fanout, git, repository, subagents, text};

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// A directory anyone may write in, as `/tmp` is.
fn shared(path: &Path) -> PathBuf {
    std::fs::create_dir_all(path).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o1777)).unwrap();
    path.to_owned()
}

/// The directories between `top` (left out) and `path` (included).
fn between(top: &Path, path: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = path.ancestors().take_while(|dir| *dir != top).map(Path::to_owned).collect();
    dirs.reverse();
    dirs
}

/// The working directory the `where` task recorded on its branch.
fn where_it_ran(repo: &Path, branch: &str) -> PathBuf {
    let whereabouts = git(repo, &["show", &format!("{branch}:where.txt")]);
    PathBuf::from(whereabouts.lines().last().unwrap())
}

#[test]
fn a_configured_root_is_made_private_whatever_its_parent_and_however_it_was_left() {
    let dir = tempfile::tempdir().unwrap();
    let dir = &dir.path().canonicalize().unwrap();
    let repo = repository(dir);
    config(dir, "");
    // `config` puts the root at <dir>/worktrees: under a shared directory.
    shared(dir);
    let output = fanout(dir, &repo, &[("a", "where")], &[]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let root = dir.join("worktrees");
    assert_eq!(mode(&root), 0o700, "a root it made");
    assert!(where_it_ran(&repo, "subagents/results/a").starts_with(&root));
    // A root left readable by all is made private again before a run.
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let output = fanout(dir, &repo, &[("b", "where")], &[]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(mode(&root), 0o700, "a root left wide");
}

#[test]
fn a_root_another_user_owns_is_refused_naming_it() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return; // only root can give a directory to another user
    }
    let dir = tempfile::tempdir().unwrap();
    let dir = &dir.path().canonicalize().unwrap();
    let repo = repository(dir);
    config(dir, "");
    let root = dir.join("worktrees");
    std::fs::create_dir(&root).unwrap();
    std::os::unix::fs::chown(&root, Some(65534), Some(65534)).unwrap();
    fanout(dir, &repo, &[("a", "write a.txt 1")], &[]);
    let refused = super::lines_of(dir, "a").to_string();
    assert!(refused.contains(&*root.to_string_lossy()) && refused.contains("owned by user 65534"), "{refused}");
    assert_eq!(std::fs::metadata(&root).unwrap().uid(), 65534, "left as it was");
}

#[test]
fn under_the_shared_temporary_directory_the_worktrees_and_merges_scratch_are_private() {
    let dir = tempfile::tempdir().unwrap();
    let dir = &dir.path().canonicalize().unwrap();
    let repo = repository(dir);
    let tmp = shared(&dir.join("tmp"));
    // The root left to its default, under TMPDIR.
    let written = std::fs::read_to_string(config(dir, "")).unwrap();
    let kept: Vec<&str> = written.lines().filter(|line| !line.starts_with("worktree_root")).collect();
    std::fs::write(dir.join("subagents.toml"), kept.join("\n")).unwrap();
    std::fs::write(dir.join("tasks.jsonl"), "{\"id\": \"a\", \"prompt\": \"where\"}\n").unwrap();
    let mut command = subagents(&repo);
    command.arg("fanout").arg(dir.join("tasks.jsonl")).args(["--provider", "coder", "--out"]);
    command.arg(dir.join("results.jsonl")).arg("--config").arg(dir.join("subagents.toml"));
    command.arg("--home").arg(dir.join("home")).env("TMPDIR", &tmp);
    let output = crate::common::output_within(&mut command, crate::common::WAIT_LIMIT, "fanout");
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let ran = where_it_ran(&repo, "subagents/results/a");
    let dirs = between(&tmp, &ran);
    assert!(dirs.len() >= 3, "{ran:?} is under {tmp:?}");
    // The user's own directory in the shared one, and the root in it.
    let (own, root) = (&dirs[0], &dirs[dirs.len() - 3]);
    assert_eq!((mode(own), mode(root)), (0o700, 0o700), "{own:?} {root:?}");
    assert_eq!(std::fs::symlink_metadata(own).unwrap().uid(), std::fs::metadata(dir).unwrap().uid());

    // `merge` merges in a scratch worktree: a hook records where it is.
    let hook = repo.join(".git/hooks/post-merge");
    std::fs::write(&hook, format!("#!/bin/sh\npwd -P > '{}'\n", dir.join("scratch.txt").display())).unwrap();
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut command = subagents(&repo);
    command.arg("merge").arg(dir.join("results.jsonl")).env("TMPDIR", &tmp);
    let output = crate::common::output_within(&mut command, crate::common::WAIT_LIMIT, "merge");
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let scratch = PathBuf::from(std::fs::read_to_string(dir.join("scratch.txt")).unwrap().trim_end());
    let dirs = between(&tmp, &scratch);
    assert!(!dirs.is_empty() && mode(&dirs[0]) == 0o700, "{scratch:?}: {:o}", mode(&dirs[0]));
}
