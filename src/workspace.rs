//! Workspaces: each run of a coding child in its own git worktree, on its
//! own branch, its work committed there, and the branches merged back with
//! a conflict report ([`merge()`]).
//!
//! Twenty coding agents in one working tree clobber each other's files and
//! read each other's half-written ones, and afterwards nobody can say
//! which change came from which task. A provider that starts a child
//! process (`acp`, `process`) set to `workspace = "worktree"` instead
//! gives every run:
//!
//! - **a branch**, `subagents/<batch>/<task id>` ([`WorkspaceConfig::branch`]),
//!   made from one base commit ([`WorkspaceConfig::base`], default the
//!   repository's `HEAD` when the provider is built: every run of a batch
//!   starts from the same commit);
//! - **a worktree** of that branch (`git worktree add`), under
//!   [`WorkspaceConfig::root`] (default a directory of the system's
//!   temporary directory, named after the repository), which is the
//!   child's working directory; `{worktree}` in its arguments or
//!   environment values is replaced by its path;
//! - **a commit** when the run ends: whatever the child left in the
//!   worktree (tracked, new and deleted files; not what `.gitignore`
//!   ignores) is committed on the branch, author and message naming the
//!   task, and the result says so ([`WorkspaceReport`]: branch, base,
//!   commit, files changed, lines added and removed; no commit when there
//!   was nothing to commit);
//! - **cleanup** at dispose: the worktree is removed, the branch stays
//!   (a failed run's branch too, for inspection), unless
//!   [`WorkspaceConfig::keep`] keeps the worktrees. Cleanup removes only
//!   what it made, never through a link: a child that put a symbolic link
//!   in place of its worktree (or its batch's directory) has the link
//!   removed alone, and nothing is committed from where it points.
//!
//! The root is private to the user (`0700`) whatever its parent; by
//! default it is in a directory of the user's own in the temporary
//! directory, `subagents-worktrees-<uid>`, also `0700` (one that is
//! another user's, or a link, is refused).
//!
//! ```no_run
//! # #[cfg(feature = "acp")]
//! # async fn demo() -> Result<(), subagents::workspace::WorkspaceError> {
//! use subagents::providers::AcpConfig;
//! use subagents::workspace::{WorkspaceConfig, Workspaces};
//!
//! let mut config = AcpConfig::new("coder", "codex-acp", Vec::new());
//! // Resolves the repository and its base commit now, once.
//! config.workspace = Some(Workspaces::open(WorkspaceConfig::new("/src/project")).await?);
//! # Ok(()) }
//! ```
//!
//! # What is never touched
//!
//! The user's checkout: its files, its index, its `HEAD` and current
//! branch. A worktree is added beside it, and the commit is made without
//! any `HEAD` or index but its own: the branch's tip is read into a
//! private index, the worktree's files are added to it, and the tree is
//! committed on the branch by name (`git commit-tree`, `git update-ref`,
//! with the repository's git directory named explicitly). So a child that
//! deletes `.git` in its worktree, points it elsewhere or checks out
//! another branch there still has its files committed on its own branch,
//! and nothing lands anywhere else. What a child does outside its
//! worktree (an absolute path, `git -C` on the user's checkout) is not
//! confined: this is isolation from each other, not a sandbox.
//!
//! # Names
//!
//! A task id becomes one path segment of a ref name: ASCII letters,
//! digits, `-`, `_` and `.` are kept, every other character is `-`; a
//! leading `.` or `-` becomes `_`, `..` becomes `._`, the dot of a
//! trailing `.` or `.lock` becomes `_`; at most 80 bytes; nothing left is `_`. Two
//! tasks whose ids give one branch are refused (the second one's start
//! fails, naming both), and so is a branch that exists already, unless
//! the batch resumes ([`BatchTask::resumed`](crate::seam::BatchTask)):
//! then a task takes up the branch its earlier run left (and its
//! worktree, if a crash left one), never a second one.
//!
//! # Serialised per repository
//!
//! git locks its own files and fails a second writer rather than wait.
//! Adding, committing in and removing worktrees of one repository
//! therefore take one lock, keyed by the repository's git directory, in
//! this process: twenty runs starting at once queue for a few
//! milliseconds each instead of failing.

mod dirs;
mod git;
pub mod merge;
mod worktree;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};

use self::dirs::remove_tree;
pub use self::git::GitError;
use self::git::{absolute, Git};
pub use self::merge::{merge, MergeError, MergeOptions, MergeOutcome, MergeReport, MergedTask};
pub use self::worktree::Worktree;
use crate::seam::BatchTask;
pub use crate::seam::WorkspaceReport;

/// The placeholder replaced by a run's worktree path in a provider's
/// arguments and environment values.
pub const PLACEHOLDER: &str = "{worktree}";

/// The default branch name: `{batch}` and `{task}` are replaced.
pub const DEFAULT_BRANCH: &str = "subagents/{batch}/{task}";

/// The longest branch segment a task id or batch name becomes.
const MAX_SEGMENT: usize = 80;

/// How a provider gives each run a worktree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkspaceConfig {
    /// Any directory of the repository (its top level is found from it).
    pub repo: PathBuf,
    /// The commit the runs' branches start from (a branch, tag or commit
    /// id); default the repository's `HEAD` when the provider is built.
    pub base: Option<String>,
    /// The branch name of a run: `{batch}` and `{task}` are replaced by the
    /// batch's name and the task's id, each made a valid ref segment
    /// (default [`DEFAULT_BRANCH`]).
    pub branch: String,
    /// Where the worktrees are made, made private to the user (`0700`);
    /// default `<temporary directory>/subagents-worktrees-<uid>/<repository>-<hash>`.
    pub root: Option<PathBuf>,
    /// Keep each worktree after its run (the branch always stays).
    pub keep: bool,
}

impl WorkspaceConfig {
    /// Worktrees of the repository at `repo`, from its `HEAD`.
    pub fn new(repo: impl Into<PathBuf>) -> WorkspaceConfig {
        WorkspaceConfig { repo: repo.into(), base: None, branch: DEFAULT_BRANCH.to_owned(), root: None, keep: false }
    }
}

/// Why a workspace could not be opened, made, or its work committed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkspaceError {
    /// The repository is not a git repository.
    #[error("{}: not a git repository (workspace = \"worktree\" needs one: set `repo` to a directory inside it)", .0.display())]
    NotARepository(PathBuf),
    /// `base` names no commit.
    #[error("base {base:?} is not a commit of {}", repo.display())]
    NoBase {
        /// The repository.
        repo: PathBuf,
        /// What `base` said.
        base: String,
    },
    /// The user's checkout has uncommitted changes and no `base` was named.
    #[error(
        "{} has uncommitted changes ({}): the runs' worktrees start from commit {base}, without them; commit or stash them, or set `base` to start from a commit knowingly",
        repo.display(), paths.join(", ")
    )]
    Dirty {
        /// The repository.
        repo: PathBuf,
        /// The first changed paths (and how many more).
        paths: Vec<String>,
        /// The commit the runs would start from.
        base: String,
    },
    /// A run's branch exists already and the batch does not resume.
    #[error(
        "branch {branch:?} exists already (an earlier batch's?): resume that batch, delete the branch (git branch -D {branch}), or name this batch differently"
    )]
    BranchExists {
        /// The branch.
        branch: String,
    },
    /// A resumed run's branch is checked out in a worktree not its own.
    #[error("branch {branch:?} is checked out at {}: a run cannot take it up there", path.display())]
    BranchCheckedOut {
        /// The branch.
        branch: String,
        /// Where it is checked out.
        path: PathBuf,
    },
    /// Two task ids give one branch name.
    #[error(
        "tasks {first:?} and {second:?} both make branch {branch:?}: give them ids that differ in ASCII letters, digits, '-', '_' or '.'"
    )]
    SameBranch {
        /// The branch.
        branch: String,
        /// The task that made it first.
        first: String,
        /// The task refused.
        second: String,
    },
    /// The configured branch template gives no valid branch name.
    #[error("branch template {template:?} gives {branch:?}, which git refuses as a branch name")]
    BadBranch {
        /// The template.
        template: String,
        /// What it gave.
        branch: String,
    },
    /// A run's branch is gone when its work is to be committed.
    #[error("branch {0:?} was deleted during the run: its work is left in the worktree")]
    BranchGone(String),
    /// A directory of the workspace was replaced by something else (a
    /// child's link to a directory outside the root, say).
    #[error("{} was replaced by {found} during the run: nothing is committed from it or removed through it", path.display())]
    Replaced {
        /// The directory that is not one any more.
        path: PathBuf,
        /// What is there instead.
        found: String,
    },
    /// A directory of the workspace could not be made or removed.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// git could not do it.
    #[error(transparent)]
    Git(#[from] GitError),
}

/// The branches this process claimed in one repository, by the task that
/// claimed each; its lock serialises that repository's git operations.
type Claims = tokio::sync::Mutex<HashMap<String, String>>;

/// One lock per repository, keyed by its git directory.
fn repository_lock(common: &Path) -> Arc<Claims> {
    static LOCKS: LazyLock<Mutex<HashMap<PathBuf, Arc<Claims>>>> = LazyLock::new(Default::default);
    let mut locks = LOCKS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    locks.entry(common.to_owned()).or_default().clone()
}

/// A provider's resolved workspace: the repository, its base commit and
/// where worktrees go. Made once ([`Workspaces::open`]), shared by the
/// provider's runs.
#[derive(Debug)]
pub struct Workspaces {
    config: WorkspaceConfig,
    /// The repository's top level.
    toplevel: PathBuf,
    /// Its git directory (shared by its worktrees).
    common: PathBuf,
    /// The base, as a commit id.
    base: String,
    root: PathBuf,
    /// The batch name of runs that belong to no batch.
    own_batch: String,
    claims: Arc<Claims>,
}

impl Workspaces {
    /// Finds the repository, resolves the base to a commit, and checks
    /// the checkout: with no `base` named, uncommitted changes to tracked
    /// files are refused (the worktrees would start without them).
    pub async fn open(config: WorkspaceConfig) -> Result<Arc<Workspaces>, WorkspaceError> {
        let not_a_repository = || WorkspaceError::NotARepository(config.repo.clone());
        if !config.repo.is_dir() {
            return Err(not_a_repository());
        }
        let git = Git::at(&config.repo);
        let found = git.output(&["rev-parse", "--show-toplevel", "--git-common-dir"]).await?;
        let mut lines = found.stdout.lines();
        let (Some(toplevel), Some(common), true) = (lines.next(), lines.next(), found.success) else {
            return Err(not_a_repository());
        };
        let toplevel = PathBuf::from(toplevel);
        let common = absolute(&config.repo, common);
        let common = common.canonicalize().unwrap_or(common);
        let named = config.base.clone().unwrap_or_else(|| "HEAD".to_owned());
        let base = Git::at(&toplevel)
            .run(&["rev-parse", "--verify", "--quiet", "--end-of-options", &format!("{named}^{{commit}}")])
            .await
            .map_err(|_| WorkspaceError::NoBase { repo: toplevel.clone(), base: named })?;
        if config.base.is_none() {
            let status = Git::at(&toplevel).run(&["status", "--porcelain=v1", "-z", "--untracked-files=no"]).await?;
            let changed: Vec<&str> = status.split('\0').filter(|entry| entry.len() > 3).map(|e| &e[3..]).collect();
            if !changed.is_empty() {
                let mut paths: Vec<String> =
                    changed.iter().take(5).map(|path| crate::seam::safe_line(path).into_owned()).collect();
                if changed.len() > 5 {
                    paths.push(format!("and {} more", changed.len() - 5));
                }
                return Err(WorkspaceError::Dirty { repo: toplevel, paths, base });
            }
        }
        let root = match &config.root {
            Some(root) => root.clone(),
            None => dirs::user_temp_dir().join(repository_dir_name(&toplevel, &common)),
        };
        let seconds = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let own_batch = format!("run-{seconds}-{}", std::process::id());
        let claims = repository_lock(&common);
        Ok(Arc::new(Workspaces { config, toplevel, common, base, root, own_batch, claims }))
    }

    /// The repository's top level.
    pub fn repository(&self) -> &Path {
        &self.toplevel
    }

    /// The commit every run's branch starts from.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Whether worktrees are kept after their runs.
    pub fn keeps_worktrees(&self) -> bool {
        self.config.keep
    }

    /// Makes the worktree of one run: the branch of `task` (a run outside
    /// a batch is task `run-<run id>` of a batch named after this process),
    /// from the base, checked out in a fresh directory.
    pub async fn create(self: &Arc<Self>, task: Option<&BatchTask>, run_id: u64) -> Result<Worktree, WorkspaceError> {
        let (batch, id, resumed) = match task {
            Some(task) => (task.batch.as_str(), task.id.clone(), task.resumed),
            None => (self.own_batch.as_str(), format!("run-{run_id}"), false),
        };
        let (batch_segment, task_segment) = (ref_segment(batch), ref_segment(&id));
        let branch = self.config.branch.replace("{batch}", &batch_segment).replace("{task}", &task_segment);
        let git = Git::at(&self.toplevel);
        let mut claims = self.claims.lock().await;
        let valid = git.output(&["check-ref-format", "--branch", &branch]).await?;
        if !valid.success || branch.starts_with('-') {
            return Err(WorkspaceError::BadBranch { template: self.config.branch.clone(), branch });
        }
        let root = self.ready_root()?;
        let path = root.join(&batch_segment).join(&task_segment);
        // A link an earlier run's child left where a directory of ours
        // goes is removed alone, never followed; anything else is refused.
        while let Some(replaced) = dirs::first_replaced(&root, &path) {
            let found = dirs::describe(&replaced).unwrap_or_default();
            if replaced == root || !dirs::unlink_if_link(&replaced) {
                return Err(WorkspaceError::Replaced { path: replaced, found });
            }
            tracing::warn!(path = %replaced.display(), %found, "removed a link left in place of a worktree's directory");
        }
        let reference = format!("refs/heads/{branch}");
        let claimed_by = claims.get(&branch).cloned();
        if let Some(first) = claimed_by.as_ref().filter(|first| **first != id) {
            return Err(WorkspaceError::SameBranch { branch, first: first.clone(), second: id });
        }
        let exists = git.output(&["rev-parse", "--verify", "--quiet", &reference]).await?.success;
        // A retry of a task in this batch takes up its own branch too.
        let taken_up = exists && (resumed || claimed_by.is_some());
        if exists && !taken_up {
            return Err(WorkspaceError::BranchExists { branch });
        }
        let reused = match taken_up {
            true => self.take_up(&git, &branch, &root, &path).await?,
            false => false,
        };
        if !reused {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|source| WorkspaceError::Io {
                    action: "cannot make",
                    path: parent.to_owned(),
                    source,
                })?;
            }
            let path_text = path.to_string_lossy();
            let added = match taken_up {
                true => git.run(&["worktree", "add", "--quiet", &path_text, &branch]).await,
                false => git.run(&["worktree", "add", "--quiet", "-b", &branch, &path_text, &self.base]).await,
            };
            if let Err(error) = added {
                // git makes the branch before it checks it out: a failed
                // checkout (a full disk) must not leave a branch that a
                // second try would find taken.
                if !taken_up {
                    let _ = git.run(&["update-ref", "-d", &reference, &self.base]).await;
                }
                if dirs::first_replaced(&root, &path).is_none() {
                    let _ = remove_tree(path.clone()).await;
                }
                return Err(error.into());
            }
        }
        let admin = Git::at(&path).run(&["rev-parse", "--absolute-git-dir"]).await?;
        claims.insert(branch.clone(), id.clone());
        Ok(Worktree {
            workspaces: self.clone(),
            branch,
            reference,
            root,
            path,
            admin: PathBuf::from(admin),
            task: id,
            fresh: !exists,
            settled: tokio::sync::Mutex::new(None),
        })
    }

    /// Readies an existing branch to be taken up at `path`: `true` when a
    /// worktree of it is there already (a crashed run's, its files kept).
    async fn take_up(&self, git: &Git, branch: &str, root: &Path, path: &Path) -> Result<bool, WorkspaceError> {
        let listed = git.run(&["worktree", "list", "--porcelain"]).await?;
        let reference = format!("branch refs/heads/{branch}");
        let mut at: Option<PathBuf> = None;
        for entry in listed.split("\n\n") {
            let mut lines = entry.lines();
            let worktree = lines.next().and_then(|line| line.strip_prefix("worktree "));
            if let Some(worktree) = worktree.filter(|_| entry.lines().any(|line| line == reference)) {
                at = Some(PathBuf::from(worktree));
            }
        }
        match at {
            Some(at) if at == path && path.join(".git").exists() => Ok(true),
            Some(at) if at == path => {
                // Registered, its directory gone: forget it, then add again.
                git.run(&["worktree", "prune"]).await?;
                Ok(false)
            }
            Some(at) => Err(WorkspaceError::BranchCheckedOut { branch: branch.to_owned(), path: at }),
            None => {
                // A directory of ours no worktree claims: an earlier crash's.
                if path.starts_with(root) && path.exists() {
                    remove_tree(path.to_owned()).await.map_err(|source| WorkspaceError::Io {
                        action: "cannot remove",
                        path: path.to_owned(),
                        source,
                    })?;
                }
                Ok(false)
            }
        }
    }

    /// Makes the worktrees' root private (see [`dirs`]), and under the
    /// temporary directory the user's own directory holding it; its
    /// canonical path, which every worktree path starts from.
    fn ready_root(&self) -> Result<PathBuf, WorkspaceError> {
        let failed = |path: &Path| {
            let path = path.to_owned();
            move |source| WorkspaceError::Io { action: "cannot keep worktrees in", path, source }
        };
        if self.config.root.is_none() {
            let own = dirs::user_temp_dir();
            dirs::make_private(&own).map_err(failed(&own))?;
            // The default root is never a link: one in its place (a child's,
            // to anywhere) is removed alone, never followed or chmod'ed
            // through; anything else not a directory of this user's is
            // refused by `make_private`, which looks without following.
            if dirs::unlink_if_link(&self.root) {
                tracing::warn!(path = %self.root.display(), "removed a link left in place of the worktrees' root");
            }
            dirs::make_private(&self.root).map_err(failed(&self.root))?;
            // Checked to be directories, not links: the path the worktrees
            // go under is the user's own directory's (its parent, the
            // temporary directory, may be a link), then the root's name.
            let own = own.canonicalize().map_err(failed(&own))?;
            return Ok(own.join(self.root.file_name().unwrap_or_default()));
        }
        // A configured root may be a link (the user's own): its target is made private.
        let root = self.root.canonicalize().unwrap_or_else(|_| self.root.clone());
        dirs::make_private(&root).map_err(failed(&root))?;
        root.canonicalize().map_err(failed(&root))
    }
}

/// A start refused because its worktree could not be made: `provider`'s
/// diagnostic, the error in its detail.
#[cfg_attr(not(any(feature = "acp", feature = "process")), allow(dead_code))]
pub(crate) fn launch_error(provider: &str, error: &WorkspaceError) -> crate::seam::LaunchError {
    use crate::seam::{Category, Diagnostic, Stage};
    tracing::warn!(%provider, %error, "a run's worktree could not be made");
    let diagnostic = Diagnostic::new(provider, Stage::Initialize, Category::StartupFailed)
        .with_reason("its git worktree could not be made")
        .with_detail(error.to_string());
    crate::seam::LaunchError::Diagnosed(diagnostic)
}

/// A directory name for the repository's worktrees: its name and a hash
/// of its git directory (two checkouts named alike stay apart).
fn repository_dir_name(toplevel: &Path, common: &Path) -> String {
    let name = toplevel.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    let hash = common
        .as_os_str()
        .as_encoded_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3));
    format!("{}-{:08x}", ref_segment(&name), hash as u32)
}

/// `text` as one segment of a ref name (see the [module](self), "Names").
pub fn ref_segment(text: &str) -> String {
    let mut segment: String =
        text.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '-' }).collect();
    while segment.contains("..") {
        segment = segment.replace("..", "._");
    }
    if segment.starts_with(['.', '-']) {
        segment.replace_range(..1, "_");
    }
    segment.truncate(MAX_SEGMENT);
    if let Some(stem) = segment.strip_suffix(".lock") {
        segment = format!("{stem}_lock");
    }
    if segment.ends_with('.') {
        segment.pop();
        segment.push('_');
    }
    if segment.is_empty() {
        segment.push('_');
    }
    segment
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_id_becomes_one_valid_ref_segment() {
        assert_eq!(ref_segment("fix-login_2.1"), "fix-login_2.1");
        assert_eq!(ref_segment("a b/c:d~e^f?g*h[i\\j"), "a-b-c-d-e-f-g-h-i-j");
        assert_eq!(ref_segment("..hidden"), "__hidden");
        assert_eq!(ref_segment("-flag"), "_flag");
        assert_eq!(ref_segment("x..y"), "x._y");
        assert_eq!(ref_segment("name.lock"), "name_lock");
        assert_eq!(ref_segment("trailing."), "trailing_");
        assert_eq!(ref_segment(""), "_");
        assert_eq!(ref_segment("été"), "_t-");
        assert_eq!(ref_segment(&"x".repeat(200)).len(), MAX_SEGMENT);
        assert_eq!(ref_segment("@{up}"), "_-up-");
    }

    #[test]
    fn shortstat_reads_each_count_and_misses_none_it_lacks() {
        assert_eq!(worktree::shortstat(" 3 files changed, 10 insertions(+), 2 deletions(-)"), (3, 10, 2));
        assert_eq!(worktree::shortstat(" 1 file changed, 1 deletion(-)"), (1, 0, 1));
        assert_eq!(worktree::shortstat(""), (0, 0, 0));
    }
}
