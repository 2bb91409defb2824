//! Merging a batch's branches back: `subagents merge OUT.jsonl`.
//!
//! The results file (a regular file, read a line at a time within the
//! bound a batch reads its results back with) says, task by task, which
//! branch each run worked on and how the run ended. [`merge`] merges the
//! branches of the runs that completed, in task order, in a scratch
//! worktree of its own (never the user's checkout; in the user's private
//! directory of the temporary directory), starting from the target branch
//! (`--into`, default the checked-out one):
//!
//! - a branch whose merge conflicts is aborted cleanly (`git merge
//!   --abort`), recorded with its conflicting files and hunks, and the
//!   rest go on;
//! - a run that did not complete is not merged (its branch stays, for
//!   inspection), and one that left nothing is `empty`;
//! - the merges land on the result branch, `<the branches' prefix>.merged`
//!   (`subagents/<batch>.merged`); the target itself moves only when
//!   asked (`into`) and every merge it includes succeeded;
//! - a branch checked out in any worktree (on it, unborn, or mid-rebase or
//!   bisect there), the result branch as much as the target, is never
//!   moved: its `HEAD` would move and its files would not follow, the
//!   merge showing there as staged changes. The report says why and how
//!   to take the merge there (`git merge --ff-only <commit>`).
//!
//! A second merge starts from the result branch when the target has not
//! moved past it: the branches merged before are already in it and are
//! reported `already-merged`, so re-running after fixing a conflict picks
//! up where it stopped.

use std::collections::HashMap;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde_json::Value;

use super::git::{absolute, Git, GitError};

/// The longest results line read: the bound a batch reads its results
/// back with (a run's output rides on a line); a longer one is skipped.
const MAX_LINE: usize = crate::files::RESULT_LINE_FLOOR as usize;

/// The most of a conflict's hunks a report keeps per task.
const MAX_HUNKS: usize = 8 * 1024;

/// What to merge, and where.
#[derive(Clone, Debug, Default)]
pub struct MergeOptions {
    /// A directory of the repository (default the working directory).
    pub repo: Option<PathBuf>,
    /// The branch to merge into and move; `None`: the checked-out branch,
    /// which is not moved.
    pub into: Option<String>,
    /// Only these task ids (all the completed ones when `None`).
    pub only: Option<Vec<String>>,
    /// One squashed commit per task instead of a merge commit.
    pub squash: bool,
}

/// What happened to one task's branch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum MergeOutcome {
    /// Merged onto the result.
    Merged,
    /// Its work was in the result already (an earlier merge).
    AlreadyMerged,
    /// Its merge conflicted and was aborted.
    Conflict,
    /// The run left nothing to merge.
    Empty,
    /// The run did not complete: not merged, its branch kept.
    FailedRun,
    /// Its branch is gone from the repository.
    Missing,
    /// It could not be merged for another reason (see its detail).
    Error,
}

impl MergeOutcome {
    /// The outcome's name as the report writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            MergeOutcome::Merged => "merged",
            MergeOutcome::AlreadyMerged => "already-merged",
            MergeOutcome::Conflict => "conflict",
            MergeOutcome::Empty => "empty",
            MergeOutcome::FailedRun => "failed-run",
            MergeOutcome::Missing => "missing",
            MergeOutcome::Error => "error",
        }
    }

    /// Whether it stops the target from moving.
    pub fn blocks(self) -> bool {
        matches!(self, MergeOutcome::Conflict | MergeOutcome::Missing | MergeOutcome::Error)
    }
}

/// One task's line of the report.
#[derive(Clone, Debug, Serialize)]
pub struct MergedTask {
    /// The task's id.
    pub id: String,
    /// Its branch.
    pub branch: String,
    /// What happened.
    pub outcome: MergeOutcome,
    /// The conflicting files (a conflict).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
    /// The conflict's hunks as `git diff` showed them, cut at 8 KiB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hunks: Option<String>,
    /// Why, where the outcome needs a word (a failed run's stop reason,
    /// git's error).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// What [`merge`] did.
#[derive(Clone, Debug, Serialize)]
pub struct MergeReport {
    /// The branch merged into.
    pub target: String,
    /// The branch holding the merges.
    pub result_branch: String,
    /// Its tip.
    pub commit: String,
    /// Whether the target was moved to it.
    pub moved: bool,
    /// Why the target was not moved, when it was asked to be.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_moved: Option<String>,
    /// Why the result branch was left where it was (a worktree has it
    /// checked out), and how to bring it to `commit` there.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result_not_moved: Option<String>,
    /// Every task with a branch, in task order.
    pub tasks: Vec<MergedTask>,
}

impl MergeReport {
    /// How many tasks had `outcome`.
    pub fn count(&self, outcome: MergeOutcome) -> usize {
        self.tasks.iter().filter(|task| task.outcome == outcome).count()
    }

    /// Whether any included merge conflicted or failed.
    pub fn blocked(&self) -> bool {
        self.tasks.iter().any(|task| task.outcome.blocks())
    }
}

/// Why a merge could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MergeError {
    /// The results file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// The results file is not a regular file.
    #[error("{}: {found}, not a regular file (merge reads a batch's --out file)", path.display())]
    NotAFile {
        /// The path named.
        path: PathBuf,
        /// What it is.
        found: &'static str,
    },
    /// No line of the results file names a branch.
    #[error("{}: no run of it worked in a worktree (no `workspace` in its lines)", .0.display())]
    NoWorkspaces(PathBuf),
    /// `only` names ids the results file does not have.
    #[error("no task with a branch has id {}", .0.join(", "))]
    UnknownIds(Vec<String>),
    /// The directory is not in a git repository.
    #[error("{}: not a git repository", .0.display())]
    NotARepository(PathBuf),
    /// No `into` and no branch checked out.
    #[error("HEAD is not on a branch: name the branch to merge into with --into")]
    Detached,
    /// The scratch worktree's private directory could not be made.
    #[error("cannot make the merge's scratch worktree in {}: {source}", path.display())]
    Scratch {
        /// The directory.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// The target branch does not exist.
    #[error("no branch {0:?} to merge into")]
    NoTarget(String),
    /// git failed outside a task's merge.
    #[error(transparent)]
    Git(#[from] GitError),
}

/// A results line's task with a branch.
#[derive(Debug)]
struct Candidate {
    line: u64,
    id: String,
    branch: String,
    base: String,
    completed: Option<String>,
    error: Option<String>,
}

/// Merges the completed tasks' branches of the results file `out`; see
/// the [module](self).
pub async fn merge(out: &Path, options: &MergeOptions) -> Result<MergeReport, MergeError> {
    let candidates = read_candidates(out)?;
    if candidates.is_empty() {
        return Err(MergeError::NoWorkspaces(out.to_owned()));
    }
    let candidates = match &options.only {
        None => candidates,
        Some(only) => {
            let unknown: Vec<String> =
                only.iter().filter(|id| !candidates.iter().any(|c| &c.id == *id)).cloned().collect();
            if !unknown.is_empty() {
                return Err(MergeError::UnknownIds(unknown));
            }
            candidates.into_iter().filter(|c| only.contains(&c.id)).collect()
        }
    };
    let dir = match &options.repo {
        Some(dir) => dir.clone(),
        None => std::env::current_dir().map_err(|source| MergeError::Read { path: ".".into(), source })?,
    };
    let found = Git::at(&dir).output(&["rev-parse", "--show-toplevel", "--git-common-dir"]).await?;
    let mut lines = found.stdout.lines();
    let (Some(toplevel), Some(common), true) = (lines.next(), lines.next(), found.success) else {
        return Err(MergeError::NotARepository(dir));
    };
    let (toplevel, common) = (PathBuf::from(toplevel), absolute(&dir, common));
    let common = common.canonicalize().unwrap_or(common);
    let git = Git::at(&toplevel);
    let target = match &options.into {
        Some(into) => into.clone(),
        None => git.run(&["symbolic-ref", "--quiet", "--short", "HEAD"]).await.map_err(|_| MergeError::Detached)?,
    };
    let target_tip = tip(&git, &target).await?.ok_or_else(|| MergeError::NoTarget(target.clone()))?;
    let result_branch = match candidates[0].branch.rsplit_once('/') {
        Some((prefix, _)) => format!("{prefix}.merged"),
        None => "subagents.merged".to_owned(),
    };
    // Picks up where an earlier merge stopped, unless the target moved on.
    let result_tip = tip(&git, &result_branch).await?;
    let start = match &result_tip {
        Some(result) if ancestor(&git, &target_tip, result).await? => result.clone(),
        _ => target_tip.clone(),
    };
    let lock = super::repository_lock(&common);
    let scratch = Scratch::add(&git, &start, &lock).await?;
    let mut tasks = Vec::with_capacity(candidates.len());
    for candidate in &candidates {
        tasks.push(merge_one(&scratch.git, candidate, options.squash).await);
    }
    let commit = scratch.git.run(&["rev-parse", "HEAD"]).await;
    scratch.remove(&git, &lock).await;
    let commit = commit?;
    let mut report = MergeReport {
        target: target.clone(),
        result_branch: result_branch.clone(),
        commit,
        moved: false,
        not_moved: None,
        result_not_moved: None,
        tasks,
    };
    let wanted = report.commit != target_tip || result_tip.is_some();
    if wanted && result_tip.as_deref() != Some(report.commit.as_str()) {
        // Never under a worktree on it: its HEAD would move and its files
        // would not follow (the merge would show as staged changes).
        match checked_out_at(&git, &common, &result_branch).await? {
            Some(path) => {
                report.result_not_moved = Some(take_it_there(&git, &path, &report, result_tip.as_deref()).await)
            }
            None => {
                // Only from the tip read above: a branch moved since is not overwritten.
                let old = result_tip.as_deref().unwrap_or("");
                let reference = format!("refs/heads/{result_branch}");
                git.run(&["update-ref", "-m", "subagents merge", &reference, &report.commit, old]).await?;
            }
        }
    }
    if options.into.is_some() {
        report.not_moved = match checked_out_at(&git, &common, &target).await? {
            _ if report.blocked() => Some("a merge it includes did not succeed".to_owned()),
            Some(path) => Some(take_it_there(&git, &path, &report, Some(&target_tip)).await),
            None => None,
        };
        if report.not_moved.is_none() {
            let reference = format!("refs/heads/{target}");
            git.run(&["update-ref", "-m", "subagents merge", &reference, &report.commit, &target_tip]).await?;
            report.moved = true;
        }
    }
    Ok(report)
}

/// Why a branch checked out at `path` was left at `was`, and how to bring
/// it to the merge there.
async fn take_it_there(git: &Git, path: &Path, report: &MergeReport, was: Option<&str>) -> String {
    let forward = match was {
        Some(was) => ancestor(git, was, &report.commit).await.unwrap_or(false),
        None => true,
    };
    let command = match forward {
        true => format!("git merge --ff-only {}", report.commit),
        false => format!("git merge {}", report.commit),
    };
    format!(
        "it is checked out at {}, whose files would not follow: run `{command}` there",
        crate::seam::safe_line(&path.to_string_lossy())
    )
}

/// The scratch worktree the merges happen in.
struct Scratch {
    path: PathBuf,
    git: Git,
}

impl Scratch {
    /// Adds the scratch worktree at `start`, in the user's own private
    /// directory (never readable by another user: it holds the repository's
    /// files).
    async fn add(git: &Git, start: &str, lock: &super::Claims) -> Result<Scratch, MergeError> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let own = super::dirs::user_temp_dir();
        super::dirs::make_private(&own).map_err(|source| MergeError::Scratch { path: own.clone(), source })?;
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = own.join(format!("merge-{}-{nanos:x}-{n}", std::process::id()));
        let _lock = lock.lock().await;
        git.run(&["worktree", "add", "--quiet", "--detach", &path.to_string_lossy(), start]).await?;
        let scratch = Git::at(&path).env("GIT_MERGE_AUTOEDIT", "no");
        Ok(Scratch { path, git: scratch })
    }

    async fn remove(self, git: &Git, lock: &super::Claims) {
        let _lock = lock.lock().await;
        if let Err(error) = git.run(&["worktree", "remove", "--force", "--force", &self.path.to_string_lossy()]).await {
            tracing::warn!(%error, "could not remove the merge's scratch worktree");
        }
    }
}

/// Merges one task's branch onto the scratch worktree's `HEAD`.
async fn merge_one(git: &Git, candidate: &Candidate, squash: bool) -> MergedTask {
    let task = |outcome, detail: Option<String>| MergedTask {
        id: candidate.id.clone(),
        branch: candidate.branch.clone(),
        outcome,
        files: Vec::new(),
        hunks: None,
        detail,
    };
    if let Some(stop) = &candidate.completed {
        return task(MergeOutcome::FailedRun, Some(format!("the run ended {stop}; its branch is kept")));
    }
    if let Some(error) = &candidate.error {
        return task(MergeOutcome::Error, Some(format!("its work was not committed: {error}")));
    }
    let valid = git.output(&["check-ref-format", "--branch", &candidate.branch]).await;
    if candidate.branch.starts_with('-') || !valid.is_ok_and(|valid| valid.success) {
        return task(MergeOutcome::Error, Some("not a valid branch name".to_owned()));
    }
    let branch_tip = match tip(git, &candidate.branch).await {
        Ok(Some(branch_tip)) => branch_tip,
        Ok(None) => return task(MergeOutcome::Missing, None),
        Err(error) => return task(MergeOutcome::Error, Some(error.to_string())),
    };
    if branch_tip == candidate.base {
        return task(MergeOutcome::Empty, None);
    }
    match ancestor(git, &branch_tip, "HEAD").await {
        Ok(true) => return task(MergeOutcome::AlreadyMerged, None),
        Ok(false) => {}
        Err(error) => return task(MergeOutcome::Error, Some(error.to_string())),
    }
    let reference = format!("refs/heads/{}", candidate.branch);
    let id = crate::seam::safe_line(&candidate.id).into_owned();
    let merged = match squash {
        false => {
            let message = format!("Merge task {id} ({})", candidate.branch);
            git.output(&["merge", "--no-ff", "--no-edit", "-m", &message, &reference]).await
        }
        true => git.output(&["merge", "--squash", &reference]).await,
    };
    let merged = match merged {
        Ok(merged) => merged,
        Err(error) => return task(MergeOutcome::Error, Some(error.to_string())),
    };
    if merged.success && squash {
        let message = format!("Task {id} ({}), squashed", candidate.branch);
        return match git.output(&["commit", "--quiet", "-m", &message]).await {
            Ok(done) if done.success => task(MergeOutcome::Merged, None),
            // Nothing staged: its changes are in the result already.
            Ok(_) if staged_nothing(git).await => task(MergeOutcome::AlreadyMerged, None),
            Ok(failed) => task(MergeOutcome::Error, Some(failed.said)),
            Err(error) => task(MergeOutcome::Error, Some(error.to_string())),
        };
    }
    if merged.success {
        return task(MergeOutcome::Merged, None);
    }
    let conflicted = git.run(&["diff", "--name-only", "--diff-filter=U", "-z"]).await.unwrap_or_default();
    let files: Vec<String> = conflicted
        .split('\0')
        .filter(|file| !file.is_empty())
        .map(|file| crate::seam::safe_line(file).into_owned())
        .collect();
    let hunks = match files.is_empty() {
        true => None,
        false => git.run(&["diff"]).await.ok().map(|diff| crate::seam::cut(&diff, MAX_HUNKS).to_owned()),
    };
    // Back to where this merge began, whatever it left.
    let aborted = match squash {
        false => git.run(&["merge", "--abort"]).await,
        true => git.run(&["reset", "--hard", "--quiet", "HEAD"]).await,
    };
    if let Err(error) = aborted {
        tracing::warn!(%error, "aborting a conflicting merge failed; resetting the scratch worktree");
        let _ = git.run(&["reset", "--hard", "--quiet", "HEAD"]).await;
    }
    let _ = git.run(&["clean", "-fdq"]).await;
    match files.is_empty() {
        true => task(MergeOutcome::Error, Some(merged.said)),
        false => MergedTask { files, hunks, ..task(MergeOutcome::Conflict, None) },
    }
}

/// Whether the index holds nothing to commit.
async fn staged_nothing(git: &Git) -> bool {
    git.output(&["diff", "--cached", "--quiet"]).await.is_ok_and(|diff| diff.success)
}

/// A branch's tip, `None` when there is no such branch.
async fn tip(git: &Git, branch: &str) -> Result<Option<String>, GitError> {
    let found = git.output(&["rev-parse", "--verify", "--quiet", &format!("refs/heads/{branch}^{{commit}}")]).await?;
    Ok(found.success.then(|| found.stdout.trim().to_owned()))
}

/// Whether `commit` is an ancestor of (or is) `of`.
async fn ancestor(git: &Git, commit: &str, of: &str) -> Result<bool, GitError> {
    Ok(git.output(&["merge-base", "--is-ancestor", commit, of]).await?.success)
}

/// Where `branch` is checked out, if a worktree of the repository has it:
/// its `HEAD` on the branch (unborn too), or a rebase or bisect of it under
/// way there, as git itself counts it before it moves a branch. Read from
/// each worktree's administrative directory in the git directory `common`.
async fn checked_out_at(git: &Git, common: &Path, branch: &str) -> Result<Option<PathBuf>, GitError> {
    let listed = git.run(&["worktree", "list", "--porcelain"]).await?;
    let main = listed.lines().next().and_then(|line| line.strip_prefix("worktree ")).map(PathBuf::from);
    let mut worktrees: Vec<(PathBuf, PathBuf)> = main.map(|main| (common.to_owned(), main)).into_iter().collect();
    for entry in std::fs::read_dir(common.join("worktrees")).into_iter().flatten().flatten() {
        let admin = entry.path();
        let gitdir = std::fs::read_to_string(admin.join("gitdir")).unwrap_or_default();
        let path = Path::new(gitdir.trim_end()).parent().map_or_else(|| admin.clone(), Path::to_owned);
        worktrees.push((admin, path));
    }
    let reference = format!("refs/heads/{branch}");
    let holds = |admin: &Path| {
        let read = |name: &str| std::fs::read_to_string(admin.join(name)).map(|text| text.trim_end().to_owned());
        let head = read("HEAD").is_ok_and(|head| head.strip_prefix("ref: ") == Some(reference.as_str()));
        let rebasing = ["rebase-merge/head-name", "rebase-apply/head-name"]
            .iter()
            .any(|name| read(name).is_ok_and(|on| on == reference));
        let bisecting = read("BISECT_START").is_ok_and(|on| on == branch || on == reference);
        head || rebasing || bisecting
    };
    Ok(worktrees.into_iter().find(|(admin, _)| holds(admin)).map(|(_, path)| path))
}

/// The tasks of the results file that name a branch, the last line of
/// each id winning (a journal's rule), in task order. Only a regular file
/// is read (a device or a pipe could feed it without end), each line
/// within [`MAX_LINE`]: a longer one, torn or not, is passed over unheld.
fn read_candidates(out: &Path) -> Result<Vec<Candidate>, MergeError> {
    let failed = |source| MergeError::Read { path: out.to_owned(), source };
    // O_NONBLOCK: opening a FIFO must not wait for a writer (for a regular
    // file the flag changes nothing).
    let file = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(out).map_err(failed)?;
    if let Some(found) = crate::files::kind_of(file.metadata().map_err(failed)?.file_type()) {
        return Err(MergeError::NotAFile { path: out.to_owned(), found });
    }
    let mut reader = std::io::BufReader::new(file);
    let mut by_id: HashMap<String, Candidate> = HashMap::new();
    let (mut line, mut number) = (Vec::new(), 0usize);
    while let Some(raw) = crate::files::read_line(&mut reader, &mut line, MAX_LINE).map_err(failed)? {
        number += 1;
        if raw.overlong {
            tracing::warn!(
                "{}:{number}: longer than the {MAX_LINE} bytes a results line may be: passed over",
                out.display()
            );
            continue;
        }
        let Ok(record) = serde_json::from_slice::<Value>(&line) else { continue };
        let (Some(id), Some(workspace)) = (record["id"].as_str(), record.get("workspace")) else { continue };
        let (Some(branch), Some(base)) = (workspace["branch"].as_str(), workspace["base"].as_str()) else { continue };
        let stop = record["stop_reason"].as_str().unwrap_or("without a result");
        by_id.insert(
            id.to_owned(),
            Candidate {
                line: record["line"].as_u64().unwrap_or(u64::MAX),
                id: id.to_owned(),
                branch: branch.to_owned(),
                base: base.to_owned(),
                completed: (stop != "completed").then(|| crate::seam::safe_line(stop).into_owned()),
                error: workspace["error"].as_str().map(|error| crate::seam::safe_line(error).into_owned()),
            },
        );
    }
    let mut candidates: Vec<Candidate> = by_id.into_values().collect();
    candidates.sort_by(|a, b| (a.line, &a.id).cmp(&(b.line, &b.id)));
    Ok(candidates)
}
