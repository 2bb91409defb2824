//! What the out-of-process providers share: spawning a child with a
//! scrubbed environment in its own process group, reading its output one
//! bounded line at a time, and the dispose ladder.
//!
//! **Environment**: an allowlist plus `inherit_env` plus explicit `env`
//! ([`inherited`] decides a name; the policy is documented in the
//! `providers` module doc, "Child environment").
//!
//! **Ladder**: close stdin, wait `eof_grace` for the child to exit; SIGTERM
//! the process group, wait `grace`; SIGKILL the group. The child is reaped,
//! and the ladder fails loudly (`Err`) if anything of its process group
//! still lives afterwards.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::live::ProcessLease;
use crate::seam::{Category, Failure, Stage};

/// The longest line a child may write; a longer one is a protocol error
/// (memory stays bounded whatever the child sends).
pub(crate) const MAX_LINE: usize = 8 * 1024 * 1024;

/// The most answer text kept from one child run; more is a protocol error
/// (a child streaming forever cannot grow the parent's memory).
pub(crate) const MAX_OUTPUT: usize = 16 * 1024 * 1024;

/// The variables every child inherits from the parent (plus any `LC_*`).
pub(crate) const ALLOWED_ENV: [&str; 15] = [
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "TERM",
    "COLORTERM",
    "NO_COLOR",
    "TZ",
    "TMPDIR",
    "TMP",
    "TEMP",
    "RUST_BACKTRACE",
];

/// Whether an environment variable's name looks like it holds a credential.
pub(crate) fn credential_shaped(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    CREDENTIAL_WORDS.iter().any(|word| upper.contains(word))
        || upper.split(|c: char| !c.is_ascii_alphanumeric()).any(|part| CREDENTIAL_PARTS.contains(&part))
}

/// Words that mark a credential anywhere in a name (SPEC §7), plus
/// `COOKIE`.
const CREDENTIAL_WORDS: [&str; 10] =
    ["KEY", "PASSWORD", "PASS", "PWD", "SECRET", "TOKEN", "DSN", "AUTH", "CREDENTIAL", "COOKIE"];

/// Words that mark a credential only as a whole `_`-separated part (`GH_PAT`,
/// not `PATH`).
const CREDENTIAL_PARTS: [&str; 2] = ["PAT", "PW"];

/// Whether the parent's variable `name` goes to a child whose config lists
/// `inherit` (see the module doc).
pub(crate) fn inherited(name: &str, inherit: &[String]) -> bool {
    if ALLOWED_ENV.contains(&name) || name.starts_with("LC_") {
        return true;
    }
    let listed = inherit.iter().any(|pattern| match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    });
    if listed && credential_shaped(name) {
        tracing::warn!(variable = name, "inherit_env names a credential-shaped variable; it is not passed on");
        return false;
    }
    listed
}

/// The environment a child gets: see the module doc.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChildEnv<'a> {
    /// Names (or `PREFIX*` patterns) inherited beyond the allowlist.
    pub inherit: &'a [String],
    /// Entries set as given.
    pub explicit: &'a [(String, String)],
}

/// A spawned child: its pipes, its process, and the lease that counts it
/// in `Runtime::live()` until it is reaped.
pub(crate) struct Spawned {
    /// The process.
    pub child: Child,
    /// Its stdin, until taken.
    pub stdin: Option<ChildStdin>,
    /// Its stdout, until taken.
    pub stdout: Option<ChildStdout>,
    /// Its pid, which is also its process group id.
    pub pid: u32,
    lease: Option<ProcessLease>,
}

/// Spawns `program args…` in `cwd` with the environment `env` builds,
/// stdin and stdout piped, stderr discarded (it may carry secrets, and
/// diagnostics never include it), in a new process group.
pub(crate) fn spawn(
    program: &Path,
    args: &[String],
    cwd: &Path,
    env: ChildEnv<'_>,
    lease: ProcessLease,
) -> std::io::Result<Spawned> {
    let mut command = Command::new(program);
    command
        .args(args)
        .current_dir(cwd)
        .env_clear()
        .envs(std::env::vars_os().filter(|(name, _)| name.to_str().is_some_and(|name| inherited(name, env.inherit))))
        .envs(env.explicit.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = command.spawn()?;
    let pid = child.id().unwrap_or(0);
    Ok(Spawned { stdin: child.stdin.take(), stdout: child.stdout.take(), child, pid, lease: Some(lease) })
}

impl Spawned {
    /// The dispose ladder; `Ok` once the child and its whole process group
    /// are gone.
    pub(crate) async fn dispose(mut self, eof_grace: Duration, grace: Duration) -> Result<(), Failure> {
        drop(self.stdin.take()); // EOF
        let exited = tokio::time::timeout(eof_grace, self.child.wait()).await.is_ok();
        if !exited {
            signal_group(self.pid, libc::SIGTERM);
            if tokio::time::timeout(grace, self.child.wait()).await.is_err() {
                signal_group(self.pid, libc::SIGKILL);
                let _ = self.child.wait().await;
            }
        }
        // Whatever the child left in its group goes too; give the kernel a
        // moment to take what SIGKILL hit.
        for _ in 0..20 {
            if !group_alive(self.pid) {
                break;
            }
            signal_group(self.pid, libc::SIGKILL);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(self.lease.take());
        if group_alive(self.pid) {
            tracing::error!(pid = self.pid, "a child's process group survived SIGKILL");
            return Err(Failure::new(Stage::Dispose, Category::TimedOut));
        }
        Ok(())
    }

    /// Kills the group at once and reaps the child (a failed start).
    pub(crate) async fn kill(mut self) {
        signal_group(self.pid, libc::SIGKILL);
        let _ = self.child.wait().await;
        drop(self.lease.take());
    }
}

impl Drop for Spawned {
    /// A child dropped without its ladder (a dispose that ran out of time,
    /// a forced shutdown) takes its whole process group down with it.
    fn drop(&mut self) {
        if self.lease.is_some() {
            signal_group(self.pid, libc::SIGKILL);
        }
    }
}

fn signal_group(pid: u32, signal: i32) {
    if pid == 0 {
        return;
    }
    // SAFETY: kill(2) with a negative pid signals the process group; it has
    // no memory effects.
    unsafe {
        libc::kill(-(pid as i32), signal);
    }
}

/// Whether a process of group `pgid` still runs. Zombies do not count:
/// an orphan that died waits for its reaper, which may not be us.
pub(crate) fn group_alive(pgid: u32) -> bool {
    if pgid == 0 {
        return false;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        // No procfs: ask the kernel whether the group exists at all.
        // SAFETY: signal 0 only checks for existence.
        return unsafe { libc::kill(-(pgid as i32), 0) == 0 };
    };
    entries.flatten().any(|entry| {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { return false };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return false };
        // `pid (comm) state ppid pgrp …`; comm may hold spaces and parens.
        let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else { return false };
        let mut fields = after.split_whitespace();
        let state = fields.next().unwrap_or("Z");
        let pgrp = fields.nth(1).and_then(|f| f.parse::<u32>().ok());
        pgrp == Some(pgid) && state != "Z" && state != "X"
    })
}

/// Why a line could not be read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum LineError {
    /// The line exceeded [`MAX_LINE`].
    TooLong,
    /// The pipe failed.
    Io(String),
}

/// Reads newline-terminated lines of at most [`MAX_LINE`] bytes. A longer
/// line is an error after reading at most `MAX_LINE` bytes of it.
pub(crate) struct LineReader<R> {
    reader: BufReader<R>,
    buffer: Vec<u8>,
}

impl<R: AsyncRead + Unpin> LineReader<R> {
    /// Reads lines from `reader`.
    pub(crate) fn new(reader: R) -> Self {
        LineReader { reader: BufReader::with_capacity(64 * 1024, reader), buffer: Vec::new() }
    }

    /// The next line without its newline; `Ok(None)` at EOF (a partial last
    /// line without a newline is returned as a line).
    pub(crate) async fn next_line(&mut self) -> Result<Option<Vec<u8>>, LineError> {
        self.buffer.clear();
        loop {
            let available = self.reader.fill_buf().await.map_err(|e| LineError::Io(e.to_string()))?;
            if available.is_empty() {
                return Ok((!self.buffer.is_empty()).then(|| std::mem::take(&mut self.buffer)));
            }
            let (chunk, found) = match available.iter().position(|&b| b == b'\n') {
                Some(end) => (&available[..end], Some(end + 1)),
                None => (available, None),
            };
            if self.buffer.len() + chunk.len() > MAX_LINE {
                return Err(LineError::TooLong);
            }
            self.buffer.extend_from_slice(chunk);
            let consumed = found.unwrap_or(available.len());
            self.reader.consume(consumed);
            if found.is_some() {
                return Ok(Some(std::mem::take(&mut self.buffer)));
            }
        }
    }

    /// After [`LineError::TooLong`]: skips the rest of that line, through
    /// its newline (or to EOF), without keeping it, so reading can go on
    /// with the next line. Returns the line's first `keep` bytes (for an
    /// excerpt in an error reply).
    pub(crate) async fn discard_rest(&mut self, keep: usize) -> Result<Vec<u8>, LineError> {
        let mut head = std::mem::take(&mut self.buffer);
        head.truncate(keep);
        head.shrink_to_fit();
        loop {
            let available = self.reader.fill_buf().await.map_err(|e| LineError::Io(e.to_string()))?;
            if available.is_empty() {
                return Ok(head);
            }
            match available.iter().position(|&b| b == b'\n') {
                Some(end) => {
                    self.reader.consume(end + 1);
                    return Ok(head);
                }
                None => {
                    let skipped = available.len();
                    self.reader.consume(skipped);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_over_long_line_is_skipped_whole_and_reading_goes_on() {
        let mut input = vec![b'a'; MAX_LINE + 10];
        input.extend_from_slice(b"\nnext\n");
        let mut lines = LineReader::new(input.as_slice());
        assert_eq!(lines.next_line().await, Err(LineError::TooLong));
        assert_eq!(lines.discard_rest(4).await, Ok(b"aaaa".to_vec()));
        assert_eq!(lines.next_line().await, Ok(Some(b"next".to_vec())));
        assert_eq!(lines.next_line().await, Ok(None));
    }

    #[test]
    fn credentials_that_a_word_scrub_misses_are_not_on_the_allowlist() {
        for name in ["DATABASE_URL", "PGPASS", "DB_PASS", "MYSQL_PWD", "GH_PAT", "SENTRY_DSN", "SLACK_WEBHOOK_URL"] {
            assert!(!inherited(name, &[]), "{name}");
        }
        for name in ["PATH", "HOME", "LANG", "LC_ALL", "TERM", "TZ", "TMPDIR"] {
            assert!(inherited(name, &[]), "{name}");
        }
    }

    #[test]
    fn inherit_env_passes_listed_names_but_never_a_credential_shaped_one() {
        let inherit = ["DATABASE_URL".to_owned(), "APP_*".to_owned(), "GH_PAT".to_owned(), "MYSQL_PWD".to_owned()];
        assert!(inherited("DATABASE_URL", &inherit), "listed by name: the user's explicit choice");
        assert!(inherited("APP_MODE", &inherit));
        assert!(!inherited("APP_API_KEY", &inherit), "a pattern never lets a key through");
        assert!(!inherited("GH_PAT", &inherit));
        assert!(!inherited("MYSQL_PWD", &inherit));
        assert!(!inherited("OTHER", &inherit));
        assert!(!credential_shaped("PATH") && credential_shaped("gh_pat") && credential_shaped("Sentry_Dsn"));
    }
}
