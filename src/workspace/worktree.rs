//! One run's worktree once made: its work committed by name, and the
//! worktree removed at dispose (see the [workspace module](super)), neither
//! ever through a link a child put in place of a directory of ours.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::git::Git;
use super::{dirs, ref_segment, remove_tree, WorkspaceError, WorkspaceReport, Workspaces, PLACEHOLDER};

/// One run's worktree: made by [`Workspaces::create`], its work committed
/// by [`Worktree::settle`], removed by [`Worktree::release`].
#[derive(Debug)]
pub struct Worktree {
    pub(super) workspaces: Arc<Workspaces>,
    pub(super) branch: String,
    /// `refs/heads/<branch>`.
    pub(super) reference: String,
    /// The worktrees' root, canonical: every directory from it down to
    /// `path` is ours.
    pub(super) root: PathBuf,
    pub(super) path: PathBuf,
    /// Its administrative directory in the repository's git directory.
    pub(super) admin: PathBuf,
    pub(super) task: String,
    /// The branch was made for this run (not taken up).
    pub(super) fresh: bool,
    /// What settling found, once it ran.
    pub(super) settled: tokio::sync::Mutex<Option<WorkspaceReport>>,
}

impl Worktree {
    /// The worktree's directory: the child's working directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The run's branch.
    pub fn branch(&self) -> &str {
        &self.branch
    }

    /// `text` with [`PLACEHOLDER`] replaced by the worktree's path.
    pub fn expand(&self, text: &str) -> String {
        text.replace(PLACEHOLDER, &self.path.to_string_lossy())
    }

    /// Commits what the child left on the run's branch (once: a second
    /// call answers what the first found) and reports it. A failure is in
    /// the report's `error`, and the worktree is then kept.
    pub async fn settle(&self) -> WorkspaceReport {
        let mut settled = self.settled.lock().await;
        if let Some(report) = settled.as_ref() {
            return report.clone();
        }
        let report = match self.commit().await {
            Ok(report) => report,
            Err(error) => WorkspaceReport {
                branch: self.branch.clone(),
                base: self.workspaces.base.clone(),
                // Kept for the work in it; a replaced one holds none of ours.
                worktree: (!matches!(error, WorkspaceError::Replaced { .. })).then(|| self.path.clone()),
                error: Some(error.to_string()),
                ..WorkspaceReport::default()
            },
        };
        *settled = Some(report.clone());
        report
    }

    /// Commits the work under the repository's lock, without the
    /// worktree's own `HEAD`, index or `.git` (see the [module](self)).
    async fn commit(&self) -> Result<WorkspaceReport, WorkspaceError> {
        let workspaces = &self.workspaces;
        let _lock = workspaces.claims.lock().await;
        if let Some(replaced) = dirs::first_replaced(&self.root, &self.path) {
            let found = dirs::describe(&replaced).unwrap_or_default();
            return Err(WorkspaceError::Replaced { path: replaced, found });
        }
        let index = self.path.with_file_name(format!(
            ".{}.index",
            self.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
        ));
        let git = Git::at(&workspaces.toplevel).env("GIT_DIR", &workspaces.common).env("GIT_INDEX_FILE", &index);
        // `add` alone reads the worktree, and runs in it: git wants its
        // working directory inside the work tree it is given.
        let add = Git::at(&self.path)
            .env("GIT_DIR", &workspaces.common)
            .env("GIT_INDEX_FILE", &index)
            .env("GIT_WORK_TREE", &self.path);
        let tip = git
            .run(&["rev-parse", "--verify", "--quiet", &format!("{}^{{commit}}", self.reference)])
            .await
            .map_err(|_| WorkspaceError::BranchGone(self.branch.clone()))?;
        let committed = async {
            git.run(&["read-tree", &tip]).await?;
            add.run(&["add", "--all", "--", "."]).await?;
            let tree = git.run(&["write-tree"]).await?;
            let tip_tree = git.run(&["rev-parse", &format!("{tip}^{{tree}}")]).await?;
            if tree == tip_tree {
                return Ok::<_, WorkspaceError>(tip.clone());
            }
            let task = crate::seam::safe_line(&self.task).into_owned();
            let message = format!(
                "subagents: the work of task {task}\n\nWhat the run of task {task} left in its worktree, on branch {}.\n",
                self.branch
            );
            let author = format!("subagents task {}", ref_segment(&self.task));
            let git = git
                .clone()
                .env("GIT_AUTHOR_NAME", &author)
                .env("GIT_AUTHOR_EMAIL", "subagents@invalid")
                .env("GIT_COMMITTER_NAME", &author)
                .env("GIT_COMMITTER_EMAIL", "subagents@invalid");
            let commit = git.run(&["commit-tree", &tree, "-p", &tip, "-m", &message]).await?;
            git.run(&["update-ref", "-m", "subagents: commit a run's work", &self.reference, &commit, &tip]).await?;
            Ok(commit)
        }
        .await;
        let _ = std::fs::remove_file(&index);
        let commit = committed?;
        let stats = git.run(&["diff", "--shortstat", &workspaces.base, &commit]).await?;
        let (files_changed, insertions, deletions) = shortstat(&stats);
        Ok(WorkspaceReport {
            branch: self.branch.clone(),
            base: workspaces.base.clone(),
            commit: (commit != workspaces.base).then_some(commit),
            files_changed,
            insertions,
            deletions,
            worktree: workspaces.config.keep.then(|| self.path.clone()),
            error: None,
        })
    }

    /// At dispose: commits what is left if the run never settled, then
    /// removes the worktree unless kept (or its work could not be
    /// committed). The branch stays.
    pub async fn release(&self) {
        let report = self.settle().await;
        if report.worktree.is_some() {
            return;
        }
        self.remove().await;
    }

    /// After a start that failed before the child ran: removes the
    /// worktree, and the branch too when this run made it and it holds
    /// nothing.
    pub async fn discard(&self) {
        self.remove().await;
        if self.fresh {
            let _lock = self.workspaces.claims.lock().await;
            let git = Git::at(&self.workspaces.toplevel);
            let _ = git.run(&["update-ref", "-d", &self.reference, &self.workspaces.base]).await;
        }
    }

    /// Removes the worktree: by git, else (its `.git` deleted by the
    /// child, say) its directory and its administrative directory. A
    /// directory of ours replaced by a link has the link removed alone,
    /// and the worktree's registration; nothing is removed through it.
    async fn remove(&self) {
        let workspaces = &self.workspaces;
        let _lock = workspaces.claims.lock().await;
        let forget = || async {
            if self.admin.starts_with(workspaces.common.join("worktrees")) {
                let _ = remove_tree(self.admin.clone()).await;
            }
        };
        match dirs::first_replaced(&self.root, &self.path) {
            Some(replaced) => {
                let found = dirs::describe(&replaced).unwrap_or_default();
                let unlinked = replaced != self.root && dirs::unlink_if_link(&replaced);
                tracing::warn!(
                    worktree = %self.path.display(),
                    replaced = %replaced.display(),
                    %found,
                    unlinked,
                    "a run's worktree directory was replaced: nothing removed through it"
                );
                forget().await;
            }
            None => {
                let git = Git::at(&workspaces.toplevel);
                let path = self.path.to_string_lossy();
                if let Err(error) = git.run(&["worktree", "remove", "--force", "--force", &path]).await {
                    tracing::debug!(%error, worktree = %path, "git could not remove a worktree; removing its directories");
                    let _ = remove_tree(self.path.clone()).await;
                    forget().await;
                }
            }
        }
        // The batch's directory goes with its last worktree (`rmdir` never
        // follows a link: one there stays).
        if let Some(parent) = self.path.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// `git diff --shortstat`'s counts: files changed, insertions, deletions.
pub(super) fn shortstat(text: &str) -> (u64, u64, u64) {
    let mut counts = (0, 0, 0);
    for part in text.split(',') {
        let mut words = part.split_whitespace();
        let (Some(number), Some(word)) = (words.next().and_then(|n| n.parse().ok()), words.next()) else { continue };
        match word {
            _ if word.starts_with("file") => counts.0 = number,
            _ if word.starts_with("insertion") => counts.1 = number,
            _ if word.starts_with("deletion") => counts.2 = number,
            _ => {}
        }
    }
    counts
}
