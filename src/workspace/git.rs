//! The `git` program, run for the workspace: the user's own git, config
//! and hooks, never a library's copy of them.
//!
//! Every command runs with stdin closed, no terminal prompt, and without
//! the variables that would send git somewhere other than where it is
//! told (`GIT_DIR`, `GIT_WORK_TREE`, … a program started from a git hook
//! inherits them): the caller names the repository, and where it must,
//! the git directory, work tree and index. What git prints is read up to
//! a bound, so a repository that makes git print without end costs at
//! most that; its error text is made one safe line before anyone sees it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::{AsyncRead, AsyncReadExt};

/// The variables that point git at another repository, work tree or
/// index than the one a command names.
const REDIRECTING: [&str; 8] = [
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_COMMON_DIR",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_NAMESPACE",
    "GIT_PREFIX",
];

/// The most of a command's standard output kept (a conflict's hunks are
/// the largest thing read).
const MAX_STDOUT: usize = 4 * 1024 * 1024;

/// The most of a command's error output kept.
const MAX_STDERR: usize = 16 * 1024;

/// How much of git's error text an error shows.
const SHOWN_STDERR: usize = 600;

/// Why a git command did not do its work.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GitError {
    /// The `git` program could not be started.
    #[error("cannot run git: {0} (is git installed and on PATH?)")]
    Spawn(#[source] std::io::Error),
    /// git ran and failed; its own words, made one safe line.
    #[error("`git {command}` failed: {said}")]
    Failed {
        /// The subcommand and its first arguments.
        command: String,
        /// What git said on stderr.
        said: String,
    },
}

/// What a git command printed and how it exited.
#[derive(Debug)]
pub(crate) struct Output {
    /// Whether it exited 0.
    pub(crate) success: bool,
    /// Its standard output (up to [`MAX_STDOUT`]), lossily UTF-8.
    pub(crate) stdout: String,
    /// Its error output, made one safe line and cut.
    pub(crate) said: String,
}

/// A git command line being built: where it runs and what it is told.
#[derive(Clone, Debug)]
pub(crate) struct Git {
    dir: PathBuf,
    env: Vec<(&'static str, OsString)>,
}

impl Git {
    /// Commands run in `dir` (git finds the repository from there unless
    /// told otherwise with [`Git::env`]).
    pub(crate) fn at(dir: impl Into<PathBuf>) -> Git {
        Git { dir: dir.into(), env: Vec::new() }
    }

    /// Sets one variable for these commands (`GIT_DIR`, `GIT_INDEX_FILE`,
    /// the author's name, …).
    pub(crate) fn env(mut self, name: &'static str, value: impl Into<OsString>) -> Git {
        self.env.push((name, value.into()));
        self
    }

    /// Runs `git args…`; its trimmed standard output when it exits 0.
    pub(crate) async fn run(&self, args: &[&str]) -> Result<String, GitError> {
        let output = self.output(args).await?;
        if !output.success {
            return Err(GitError::Failed { command: shown_command(args), said: output.said });
        }
        Ok(output.stdout.trim_end().to_owned())
    }

    /// Runs `git args…` whatever its exit; `Err` only when git could not
    /// be run at all.
    pub(crate) async fn output(&self, args: &[&str]) -> Result<Output, GitError> {
        let mut command = tokio::process::Command::new("git");
        command.args(args).current_dir(&self.dir).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        // No prompt for a person, git's own words in English, and no
        // opportunistic index refresh (`status` would rewrite the user's).
        command.env("GIT_TERMINAL_PROMPT", "0").env("LC_ALL", "C").env("GIT_OPTIONAL_LOCKS", "0").kill_on_drop(true);
        for name in REDIRECTING {
            command.env_remove(name);
        }
        for (name, value) in &self.env {
            command.env(name, value);
        }
        let mut child = spawn(&mut command).map_err(GitError::Spawn)?;
        let _counted = Counted(child.id());
        let (stdout, stderr) = (child.stdout.take().expect("piped"), child.stderr.take().expect("piped"));
        let (stdout, stderr) = tokio::join!(read_bounded(stdout, MAX_STDOUT), read_bounded(stderr, MAX_STDERR));
        let status = child.wait().await.map_err(GitError::Spawn)?;
        let said = crate::seam::safe_line(&String::from_utf8_lossy(&stderr)).into_owned();
        let said = crate::seam::cut(said.trim(), SHOWN_STDERR).to_owned();
        Ok(Output { success: status.success(), stdout: String::from_utf8_lossy(&stdout).into_owned(), said })
    }
}

/// A program that adopts orphans (`subagents`) reaps every child it did
/// not spawn through `child_process`: git is counted there while it runs.
#[cfg(any(feature = "acp", feature = "process", feature = "mcp-client"))]
use crate::child_process::{forget, spawn_helper as spawn};

#[cfg(not(any(feature = "acp", feature = "process", feature = "mcp-client")))]
fn spawn(command: &mut tokio::process::Command) -> std::io::Result<tokio::process::Child> {
    command.spawn()
}

#[cfg(not(any(feature = "acp", feature = "process", feature = "mcp-client")))]
fn forget(_pid: u32) {}

/// Uncounts a git process once it is reaped (or dropped, which kills it).
struct Counted(Option<u32>);

impl Drop for Counted {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            forget(pid);
        }
    }
}

/// What a command is called in an error: `git` and its first three
/// arguments (never a whole message or path list).
fn shown_command(args: &[&str]) -> String {
    let shown: Vec<&str> = args.iter().take(3).copied().collect();
    crate::seam::safe_line(&shown.join(" ")).into_owned()
}

/// Everything `reader` yields, keeping the first `max` bytes: the rest is
/// read and dropped, so the writer never blocks on a full pipe.
async fn read_bounded(mut reader: impl AsyncRead + Unpin, max: usize) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buffer = [0u8; 8192];
    loop {
        match reader.read(&mut buffer).await {
            Ok(0) | Err(_) => return kept,
            Ok(read) => {
                let room = max.saturating_sub(kept.len());
                kept.extend_from_slice(&buffer[..read.min(room)]);
            }
        }
    }
}

/// `path` made absolute against `base` when git printed it relative.
pub(crate) fn absolute(base: &Path, path: &str) -> PathBuf {
    let path = Path::new(path);
    if path.is_absolute() {
        path.to_owned()
    } else {
        base.join(path)
    }
}
