//! The workspace's directories: where worktrees are made is the user's
//! alone, and cleaning up never goes through a link.
//!
//! - **Private.** The worktrees' root is made `0700` ([`make_private`]),
//!   whatever its parent: a worktree holds the repository's files, which
//!   may sit in a `0700` checkout, and the default root is under the shared
//!   temporary directory. There the user has a directory of their own,
//!   `subagents-worktrees-<uid>` ([`user_temp_dir`]), also `0700`, which
//!   holds the roots and `merge`'s scratch worktrees; one that is a link,
//!   not a directory, or another user's is refused, never used.
//! - **Never through a link.** A child may replace its worktree, or its
//!   batch's directory, with a symbolic link to a directory outside the
//!   root dressed up as a worktree. Before a worktree's work is committed
//!   or the worktree removed, every directory from the root down to it is
//!   checked to be a directory and not a link ([`first_replaced`]); one
//!   that is not is never read or removed through. A link is removed
//!   alone (`unlink` never follows it); anything else is left where it is.
//!   The same holds before a worktree is made: the default root, the batch's
//!   directory and the worktree's place are each looked at without
//!   following links, a link removed alone, never made private through.

use std::io::{self, ErrorKind};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The user's own directory in the system's temporary directory, holding
/// the default worktree roots and `merge`'s scratch worktrees.
pub(crate) fn user_temp_dir() -> PathBuf {
    let name = match effective_user() {
        Some(user) => format!("subagents-worktrees-{user}"),
        // No /proc (not Linux): the temporary directory is the user's own there.
        None => "subagents-worktrees".to_owned(),
    };
    std::env::temp_dir().join(name)
}

/// The user this process runs as (its effective uid), read once from
/// `/proc/self/status` (the crate has no `unsafe` for `geteuid`).
fn effective_user() -> Option<u32> {
    static USER: OnceLock<Option<u32>> = OnceLock::new();
    *USER.get_or_init(|| {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let ids = status.lines().find_map(|line| line.strip_prefix("Uid:"))?;
        ids.split_whitespace().nth(1)?.parse().ok()
    })
}

/// Makes `dir` (and any missing parent, as usual) a directory only its
/// user may enter: made `0700`, or, already there, checked to be a
/// directory (not a link) of this user's and narrowed to `0700`.
pub(crate) fn make_private(dir: &Path) -> io::Result<()> {
    let create = || std::fs::DirBuilder::new().mode(0o700).create(dir);
    let made = match create() {
        Err(error) if error.kind() == ErrorKind::NotFound => {
            if let Some(parent) = dir.parent() {
                std::fs::create_dir_all(parent)?;
            }
            create()
        }
        made => made,
    };
    match made {
        Ok(()) => {}
        Err(error) if error.kind() == ErrorKind::AlreadyExists => {}
        Err(error) => return Err(error),
    }
    let metadata = std::fs::symlink_metadata(dir)?;
    if !metadata.is_dir() {
        let found = describe(dir).unwrap_or_else(|| "not a directory".to_owned());
        return Err(io::Error::new(ErrorKind::AlreadyExists, format!("it is {found}, not a directory of this user's")));
    }
    if let Some(user) = effective_user().filter(|user| *user != metadata.uid()) {
        let owner = metadata.uid();
        return Err(io::Error::new(
            ErrorKind::PermissionDenied,
            format!("owned by user {owner}, not by this user ({user})"),
        ));
    }
    if metadata.mode() & 0o7777 != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// The first of `root` and the directories below it down to `path` that is
/// there but is not a directory (a link to one included): what a child put
/// in place of a directory of ours. `None` when each is a directory or
/// missing (nothing to go through).
pub(crate) fn first_replaced(root: &Path, path: &Path) -> Option<PathBuf> {
    let below = path.strip_prefix(root).ok()?;
    let mut at = root.to_owned();
    let mut components = below.components();
    loop {
        match std::fs::symlink_metadata(&at) {
            Ok(metadata) if metadata.is_dir() => {}
            Ok(_) => return Some(at),
            Err(_) => return None,
        }
        at.push(components.next()?);
    }
}

/// What is at `path`, when it is not a directory: `a symbolic link to …`,
/// `a FIFO`, `a regular file`…; `None` for a directory or nothing.
pub(crate) fn describe(path: &Path) -> Option<String> {
    let kind = std::fs::symlink_metadata(path).ok()?.file_type();
    match kind {
        _ if kind.is_symlink() => {
            let target = std::fs::read_link(path).map(|to| to.display().to_string()).unwrap_or_default();
            Some(format!("a symbolic link to {}", crate::seam::safe_line(&target)))
        }
        _ if kind.is_dir() => None,
        _ => Some(crate::files::kind_of(kind).unwrap_or("a regular file").to_owned()),
    }
}

/// Removes `path` when it is a symbolic link: the link alone, never what
/// it points at. `true` when it was one.
pub(crate) fn unlink_if_link(path: &Path) -> bool {
    let link = std::fs::symlink_metadata(path).is_ok_and(|metadata| metadata.file_type().is_symlink());
    link && std::fs::remove_file(path).is_ok()
}

/// Removes a directory tree off the caller's thread (a worktree may be
/// large; an actor's thread must not wait on it). Never through a link:
/// a link inside is removed alone, as is `path` if it is one.
pub(crate) async fn remove_tree(path: PathBuf) -> io::Result<()> {
    let removed = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(path)).await;
    removed.unwrap_or_else(|join| Err(io::Error::other(join.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("workspace-dirs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_directory_is_made_private_or_narrowed_and_a_link_in_its_place_is_refused() {
        let dir = scratch("private");
        let made = dir.join("made/under/missing/parents");
        make_private(&made).unwrap();
        assert_eq!(std::fs::metadata(&made).unwrap().mode() & 0o7777, 0o700);
        let wide = dir.join("wide");
        std::fs::create_dir(&wide).unwrap();
        std::fs::set_permissions(&wide, std::fs::Permissions::from_mode(0o1777)).unwrap();
        make_private(&wide).unwrap();
        assert_eq!(std::fs::metadata(&wide).unwrap().mode() & 0o7777, 0o700);
        let link = dir.join("link");
        std::os::unix::fs::symlink(&wide, &link).unwrap();
        let refused = make_private(&link).unwrap_err().to_string();
        assert!(refused.contains("a symbolic link to") && refused.contains("not a directory"), "{refused}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_first_directory_replaced_below_the_root_is_found() {
        let dir = scratch("replaced");
        let root = dir.join("root");
        std::fs::create_dir_all(root.join("batch/task")).unwrap();
        let task = root.join("batch/task");
        assert_eq!(first_replaced(&root, &task), None);
        assert_eq!(first_replaced(&root, &root.join("batch/gone")), None, "missing is not replaced");
        std::fs::remove_dir(&task).unwrap();
        std::os::unix::fs::symlink(&dir, &task).unwrap();
        assert_eq!(first_replaced(&root, &task), Some(task.clone()));
        assert!(describe(&task).unwrap().starts_with("a symbolic link to "));
        std::fs::remove_file(&task).unwrap();
        std::fs::rename(root.join("batch"), dir.join("moved")).unwrap();
        std::os::unix::fs::symlink(dir.join("moved"), root.join("batch")).unwrap();
        assert_eq!(first_replaced(&root, &root.join("batch/task")), Some(root.join("batch")));
        assert!(unlink_if_link(&root.join("batch")));
        assert!(dir.join("moved").is_dir(), "what the link pointed at is left");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
