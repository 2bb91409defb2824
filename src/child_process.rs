//! What the out-of-process providers share: spawning a child with a
//! scrubbed environment in its own process group, reading its output one
//! bounded line at a time ([`lines`]), and the dispose ladder.
//!
//! **Environment**: an allowlist plus `inherit_env` plus explicit `env`
//! ([`inherited`] decides a name; the policy is documented in the
//! `providers` module doc, "Child environment").
//!
//! **Ladder**: close stdin, wait for the child to exit until the EOF phase
//! ends; SIGTERM the process group and the child's descendants, wait
//! `grace`; SIGKILL them. The child is reaped, and the ladder fails loudly
//! (`Err`) if anything of its tree still lives afterwards. The caller says
//! when the EOF phase ends: a fixed `dispose_eof_grace`
//! (`tokio::time::sleep`), or sooner when it knows the child is idle (the
//! `acp` provider's `dispose_idle_eof_grace`). An owner whose protocol
//! client holds the child's stdin hands the ladder the closing of it: the
//! ladder looks for descendants first, since a child that exits at EOF
//! leaves its grandchildren to init, out of reach.
//!
//! **Descendants**: the process group alone does not hold a grandchild
//! that made a session or group of its own (`setsid`); `tree.rs` finds
//! them by their parent links in `/proc`, and says what that guarantees
//! and what escapes it. Signals go through `nix` (no `unsafe`); the scans
//! read `/proc`, so they run on a blocking thread, never on the actor
//! thread that climbs the ladder.
//!
//! **Orphans**: what escapes the scans — a descendant whose parent exited
//! before a scan saw it — goes to init, unless the program asked for it
//! ([`adopt_orphans`], the `subagents` binary does): then it is ours, is
//! collected when it exits, and is killed once no child of ours is left
//! (the last dispose), or at the latest when the program drops its
//! [`AdoptedOrphans`], since it cannot say which child it came from.
//!
//! **Configuration**: what both providers let a user set about their child
//! (where it runs, its environment, its graces) is one
//! [`ChildProcessConfig`], held by `AcpConfig` and `ProcessConfig` alike.

// A stdio MCP server (feature `mcp-client` alone) is spawned and reaped
// here without a provider's configuration or ladder around it.
#![cfg_attr(not(any(feature = "acp", feature = "process")), allow(dead_code, unreachable_pub))]

mod account;
mod tree;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use tokio::io::AsyncRead;
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio_util::codec::{AnyDelimiterCodec, FramedRead};

#[cfg(any(feature = "acp", feature = "process"))]
pub(crate) use self::account::{account, redacted};
pub(crate) use self::account::{exit_words, StderrTail};
use self::tree::{nix_pid, Tree};
use crate::live::ProcessLease;
use crate::seam::{Category, Failure, LaunchError, Stage};

/// How a child process is started and stopped: what the `acp` and
/// `process` providers configure alike (their configs dereference to it,
/// so `config.env` reads as before).
#[derive(Clone, Debug)]
pub struct ChildProcessConfig {
    /// Working directory; default the parent's.
    pub cwd: Option<PathBuf>,
    /// Variables set in the child as given (the only way to hand it a key).
    pub env: Vec<(String, String)>,
    /// Parent variables the child inherits beyond the allowlist: `NAME` or
    /// `PREFIX*`; credential-shaped names are never passed (see
    /// [the child environment](super#child-environment)).
    pub inherit_env: Vec<String>,
    /// Grace after stdin EOF (6 s): the longest the child is left to exit
    /// on its own.
    pub dispose_eof_grace: Duration,
    /// Grace after SIGTERM (3 s).
    pub dispose_grace: Duration,
}

impl Default for ChildProcessConfig {
    fn default() -> Self {
        ChildProcessConfig {
            cwd: None,
            env: Vec::new(),
            inherit_env: Vec::new(),
            dispose_eof_grace: Duration::from_secs(6),
            dispose_grace: Duration::from_secs(3),
        }
    }
}

impl ChildProcessConfig {
    /// The child's environment: the allowlist, `inherit_env`, then `env`.
    pub(crate) fn child_env(&self) -> ChildEnv<'_> {
        ChildEnv { inherit: &self.inherit_env, explicit: &self.env }
    }

    /// Where a run's child runs: `cwd`, else the parent's; checked before
    /// anything is spawned, so a bad one is the request's fault
    /// (`INVALID_REQUEST`), never a failed spawn.
    pub(crate) fn run_cwd(&self, parent: &Path) -> Result<PathBuf, LaunchError> {
        let cwd = self.cwd.clone().unwrap_or_else(|| parent.to_owned());
        // Listing it proves more than `is_dir`: the child can read where it starts.
        if !cwd.is_absolute() || std::fs::read_dir(&cwd).is_err() {
            return Err(LaunchError::Invalid {
                field: "cwd",
                reason: "must be an absolute path to an enterable directory".to_owned(),
            });
        }
        Ok(cwd)
    }

    /// Where a probe's child runs (no parent asks): `cwd`, else ours.
    pub(crate) fn probe_cwd(&self) -> Result<PathBuf, String> {
        match &self.cwd {
            Some(cwd) => Ok(cwd.clone()),
            None => std::env::current_dir().map_err(|e| format!("no working directory: {e}")),
        }
    }
}

/// How long a child's opening handshake may take (`initialize`, and for
/// `acp` its `session/new`).
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest line a child may write; a longer one is a protocol error
/// (memory stays bounded whatever the child sends).
pub(crate) const MAX_LINE: usize = 8 * 1024 * 1024;

/// How much a line reader asks its pipe for at a time.
pub(crate) const READ_CAPACITY: usize = 64 * 1024;

/// The newline-delimited lines of `reader`, each without its newline and
/// at most [`MAX_LINE`] bytes long; a partial last line at EOF is a line.
///
/// A longer line is an `Err(MaxChunkLengthExceeded)` once `MAX_LINE` bytes
/// of it are buffered, never more. After any error `FramedRead` ends the
/// stream, so a reader that must go on past an over-long line wraps
/// [`line_codec`] instead (the codec itself skips the rest of that line on
/// its next `decode`).
pub(crate) fn lines<R: AsyncRead>(reader: R) -> FramedRead<R, AnyDelimiterCodec> {
    FramedRead::with_capacity(reader, line_codec(), READ_CAPACITY)
}

/// The codec behind [`lines`]: bytes up to each `\n`, at most [`MAX_LINE`]
/// of them. Bytes, not `String`: a reader decides for itself what invalid
/// UTF-8 costs.
pub(crate) fn line_codec() -> AnyDelimiterCodec {
    AnyDelimiterCodec::new_with_max_length(b"\n".to_vec(), Vec::new(), MAX_LINE)
}

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

/// Words that mark a credential anywhere in a name (docs/contract.md §7.1), plus
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

/// Whether this process adopts its children's orphans ([`adopt_orphans`]).
static ADOPTING: AtomicBool = AtomicBool::new(false);

/// While [`ADOPTING`], the children spawned here and not yet reaped: every
/// other child of this process is an adopted orphan. Held across a spawn,
/// so a sweep never takes a child being born for one.
static SPAWNED: Mutex<Vec<u32>> = Mutex::new(Vec::new());

/// Makes this process the reaper of its children's orphans (Linux's
/// `PR_SET_CHILD_SUBREAPER`): a descendant of a child whose own parent
/// exits is re-parented here rather than to init, collected when it
/// exits, and killed once no child of the runtime is left — a dispose then
/// leaves nothing behind, whatever escaped the ladder's scans (a double
/// fork, the orphans of a child that died on its own).
///
/// Process-wide, and so the program's call, never a library's: every
/// child of the process that the runtime did not spawn is taken for such an
/// orphan. Call it only in a program whose child processes all come from
/// the runtime, and hold what it returns until the program ends; the
/// `subagents` binary does, for `main`.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub fn adopt_orphans() -> std::io::Result<AdoptedOrphans> {
    nix::sys::prctl::set_child_subreaper(true)?;
    ADOPTING.store(true, Ordering::Release);
    Ok(AdoptedOrphans { _private: () })
}

/// This process adopts its children's orphans ([`adopt_orphans`]) while it
/// is held. Dropping it kills every orphan still adopted and collects it,
/// blocking briefly on `/proc`: the program's last act, never an actor's.
#[derive(Debug)]
#[must_use = "dropping it kills the adopted orphans at once: hold it until the program ends"]
pub struct AdoptedOrphans {
    _private: (),
}

impl Drop for AdoptedOrphans {
    fn drop(&mut self) {
        tree::kill_adopted_orphans();
    }
}

/// The children spawned here and not yet reaped, while adopting orphans.
fn spawned_children() -> Option<MutexGuard<'static, Vec<u32>>> {
    ADOPTING.load(Ordering::Acquire).then(|| SPAWNED.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Spawns `command`, a short-lived helper this process waits for itself
/// (`git`): while orphans are adopted it counts as spawned here, so the
/// orphan sweep never reaps it first, until [`forget`] after its wait.
pub(crate) fn spawn_helper(command: &mut Command) -> std::io::Result<Child> {
    let mut spawned = spawned_children();
    let child = command.spawn()?;
    if let (Some(spawned), Some(pid)) = (spawned.as_mut(), child.id()) {
        spawned.push(pid);
    }
    Ok(child)
}

/// `pid` is reaped (or about to be, by its dropped `Child`): no longer ours.
pub(crate) fn forget(pid: u32) {
    if let Some(mut spawned) = spawned_children() {
        spawned.retain(|&child| child != pid);
    }
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
    /// The last of what it wrote on stderr (see `account.rs`).
    pub stderr: StderrTail,
    lease: Option<ProcessLease>,
}

/// Spawns `program args…` in `cwd` with the environment `env` builds,
/// stdin and stdout piped, stderr drained by a task that keeps only its
/// tail (for a failure's account: `account.rs`), in a new process group.
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
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut spawned = spawned_children();
    let mut child = command.spawn()?;
    let pid = child.id().unwrap_or(0);
    if let Some(spawned) = spawned.as_mut() {
        spawned.push(pid);
    }
    let stderr = child.stderr.take().map_or_else(StderrTail::none, StderrTail::read);
    Ok(Spawned { stdin: child.stdin.take(), stdout: child.stdout.take(), child, pid, stderr, lease: Some(lease) })
}

impl Spawned {
    /// How the child exited, in words, once it has (checked until `within`
    /// passes: a child whose output just ended may still be exiting).
    pub(crate) async fn exit_within(&mut self, within: Duration) -> Option<String> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(exit_words(status));
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The dispose ladder; `Ok` once the child and its whole tree are
    /// gone. The child's descendants are looked for first; then its input
    /// ends (stdin, if still held here, and `close_input`: the owner's
    /// protocol client may hold it); then the child may exit on its own
    /// until the phase `eof_phase` makes (from that moment) ends.
    pub(crate) async fn dispose<Eof: std::future::Future<Output = ()>>(
        mut self,
        close_input: impl std::future::Future<Output = ()>,
        eof_phase: impl FnOnce() -> Eof,
        grace: Duration,
    ) -> Result<(), Failure> {
        let mut tree = Tree::of(self.pid);
        tree.scan().await;
        drop(self.stdin.take()); // EOF
        close_input.await;
        let exited = tokio::select! {
            biased;
            _ = self.child.wait() => true,
            () = eof_phase() => false,
        };
        if !exited {
            tree.scan().await;
            tree.signal(Signal::SIGTERM);
            if tokio::time::timeout(grace, self.child.wait()).await.is_err() {
                tree.scan().await;
                tree.signal(Signal::SIGKILL);
                let _ = self.child.wait().await;
            }
        }
        self.sweep(tree).await
    }

    /// Kills the tree at once and reaps the child (a failed start).
    pub(crate) async fn kill(mut self) {
        let mut tree = Tree::of(self.pid);
        tree.scan().await;
        tree.signal(Signal::SIGKILL);
        let _ = self.child.wait().await;
        let _ = self.sweep(tree).await;
    }

    /// After the reap: whatever the child left goes too; the kernel is
    /// given a moment to take what SIGKILL hit.
    async fn sweep(mut self, mut tree: Tree) -> Result<(), Failure> {
        forget(self.pid);
        let mut survives = true;
        for _ in 0..20 {
            survives = tree.scan().await;
            if !survives {
                break;
            }
            tree.signal(Signal::SIGKILL);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(self.lease.take());
        if survives && tree.scan().await {
            tracing::error!(pid = self.pid, "a child's process tree survived SIGKILL");
            return Err(Failure::new(Stage::Dispose, Category::TimedOut));
        }
        Ok(())
    }
}

impl Drop for Spawned {
    /// A child dropped without its ladder (a dispose that ran out of time,
    /// a forced shutdown) takes its whole process group down with it (no
    /// scan for descendants here: a drop must not block on `/proc`).
    fn drop(&mut self) {
        forget(self.pid);
        if self.lease.is_some() {
            if let Some(group) = nix_pid(self.pid) {
                let _ = killpg(group, Signal::SIGKILL);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;
    use tokio_util::codec::AnyDelimiterCodecError;

    use super::*;

    #[tokio::test]
    async fn an_over_long_line_is_an_error_after_at_most_the_cap_is_buffered() {
        let mut input = b"first\n".to_vec();
        input.extend(std::iter::repeat_n(b'a', MAX_LINE + 10));
        input.extend_from_slice(b"\nnext");
        let mut lines = lines(input.as_slice());
        assert_eq!(lines.next().await.unwrap().unwrap(), &b"first"[..]);
        assert!(matches!(lines.next().await, Some(Err(AnyDelimiterCodecError::MaxChunkLengthExceeded))));
        assert!(lines.read_buffer().len() <= MAX_LINE + 64 * 1024, "bounded: {}", lines.read_buffer().len());
    }

    #[tokio::test]
    async fn a_last_line_without_a_newline_is_a_line() {
        let mut lines = lines(&b"one\n\ntwo"[..]);
        let mut read = Vec::new();
        while let Some(line) = lines.next().await {
            read.push(line.unwrap());
        }
        assert_eq!(read, [&b"one"[..], b"", b"two"]);
    }

    #[tokio::test]
    async fn a_killed_group_does_not_survive_and_pid_0_is_never_our_own_group() {
        let lease = ProcessLease::new(std::sync::Arc::default());
        let env = ChildEnv { inherit: &[], explicit: &[] };
        let spawned = spawn(Path::new("sleep"), &["30".to_owned()], Path::new("/"), env, lease).unwrap();
        let pid = spawned.pid;
        assert!(Tree::of(pid).scan().await, "a sleeping child is alive");
        spawned.kill().await;
        assert!(!Tree::of(pid).scan().await, "killed and reaped");
        assert!(!Tree::of(0).scan().await);
    }

    /// A child running `script` under `sh`, and the pid of the grandchild
    /// it reports on its first line.
    async fn with_grandchild(script: &str) -> (Spawned, u32) {
        let lease = ProcessLease::new(std::sync::Arc::default());
        let env = ChildEnv { inherit: &[], explicit: &[] };
        let args = ["-c".to_owned(), script.to_owned()];
        let mut spawned = spawn(Path::new("sh"), &args, Path::new("/"), env, lease).unwrap();
        let first = lines(spawned.stdout.take().unwrap()).next().await.unwrap().unwrap();
        let grandchild = std::str::from_utf8(&first).unwrap().trim().parse().unwrap();
        (spawned, grandchild)
    }

    /// Whether `pid` runs (a zombie does not).
    fn running(pid: u32) -> bool {
        tree::running(pid)
    }

    #[tokio::test]
    async fn dispose_kills_a_grandchild_that_left_for_a_session_of_its_own() {
        let (spawned, grandchild) = with_grandchild("setsid sleep 600 & echo $!; exec sleep 600").await;
        assert!(running(grandchild));
        spawned
            .dispose(async {}, || tokio::time::sleep(Duration::from_millis(50)), Duration::from_millis(200))
            .await
            .unwrap();
        assert!(!running(grandchild), "the grandchild in its own session survived the dispose");
    }

    #[tokio::test]
    async fn dispose_kills_the_new_session_of_a_child_that_exits_at_eof() {
        // `read` returns at EOF and the child exits, orphaning its grandchild.
        let (spawned, grandchild) = with_grandchild("setsid sleep 600 & echo $!; read line").await;
        spawned
            .dispose(async {}, || tokio::time::sleep(Duration::from_secs(5)), Duration::from_millis(200))
            .await
            .unwrap();
        assert!(!running(grandchild), "the orphaned grandchild survived the dispose");
    }

    #[tokio::test]
    async fn a_failed_start_kills_the_grandchildren_too() {
        let (spawned, grandchild) = with_grandchild("setsid sleep 600 & echo $!; exec sleep 600").await;
        spawned.kill().await;
        assert!(!running(grandchild));
    }

    #[test]
    fn a_run_cwd_must_be_an_absolute_directory_and_the_configured_one_wins() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "x").unwrap();
        let parent = ChildProcessConfig::default();
        assert_eq!(parent.run_cwd(dir.path()).unwrap(), dir.path());
        for refused in [Path::new("relative"), &dir.path().join("missing"), &file] {
            let error = parent.run_cwd(refused).unwrap_err();
            assert!(matches!(error, LaunchError::Invalid { field: "cwd", .. }), "{refused:?}: {error:?}");
        }
        let configured = ChildProcessConfig { cwd: Some(dir.path().to_owned()), ..Default::default() };
        assert_eq!(configured.run_cwd(Path::new("relative")).unwrap(), dir.path(), "the configured cwd wins");
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
