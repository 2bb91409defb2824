//! A child's own account of why it failed: the tail of its stderr, how it
//! exited, and both put in words with the values of the environment the
//! provider set for it replaced.
//!
//! A child's stderr is read from the moment it is spawned to its end and
//! only its last [`STDERR_TAIL_BYTES`] are kept: a chatty child costs a
//! reader task and never memory, and it never blocks on a full pipe. What
//! is kept is shown only in a failure's
//! [`Diagnostic::detail`](crate::seam::Diagnostic::detail) (bounded and
//! made safe there) and logged whole at debug under target `subagents`.

use std::collections::VecDeque;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt};
use tokio_util::sync::CancellationToken;

/// The most of a child's stderr kept: its last bytes.
pub(crate) const STDERR_TAIL_BYTES: usize = 4096;

/// The lines of the kept tail a detail shows, at most.
const DETAIL_LINES: usize = 5;

/// The last bytes a child wrote on stderr, kept by a reader task that
/// drains the pipe to its end.
#[derive(Clone, Debug, Default)]
pub(crate) struct StderrTail {
    kept: Arc<Mutex<VecDeque<u8>>>,
    /// Tripped when the pipe reached its end (every writer closed it).
    ended: CancellationToken,
}

impl StderrTail {
    /// Drains `pipe` on a task of its own, keeping its tail.
    pub(crate) fn read(pipe: impl AsyncRead + Send + Unpin + 'static) -> StderrTail {
        let tail = StderrTail::default();
        let (kept, ended) = (tail.kept.clone(), tail.ended.clone());
        tokio::spawn(async move {
            let _ended = ended.drop_guard();
            let mut pipe = pipe;
            let mut buffer = vec![0; 8192];
            while let Ok(read) = pipe.read(&mut buffer).await {
                if read == 0 {
                    break;
                }
                let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
                kept.extend(&buffer[..read]);
                let over = kept.len().saturating_sub(STDERR_TAIL_BYTES);
                kept.drain(..over);
            }
        });
        tail
    }

    /// A tail that never reads anything (no pipe).
    pub(crate) fn none() -> StderrTail {
        let tail = StderrTail::default();
        tail.ended.cancel();
        tail
    }

    /// Waits at most `within` for the pipe's end (a child that just died
    /// may still have lines in it), then gives the tail's last lines.
    pub(crate) async fn settled(&self, within: Duration) -> String {
        let _ = tokio::time::timeout(within, self.ended.cancelled()).await;
        self.last_lines()
    }

    /// The last non-blank lines kept so far (at most five), joined by
    /// ` | `; a line cut at the tail's start is dropped.
    pub(crate) fn last_lines(&self) -> String {
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let bytes: Vec<u8> = kept.iter().copied().collect();
        let full = kept.len() >= STDERR_TAIL_BYTES;
        drop(kept);
        let text = String::from_utf8_lossy(&bytes);
        let mut lines: Vec<&str> = text.lines().collect();
        if full && lines.len() > 1 {
            lines.remove(0);
        }
        let shown: Vec<&str> = lines.iter().map(|line| line.trim()).filter(|line| !line.is_empty()).collect();
        shown[shown.len().saturating_sub(DETAIL_LINES)..].join(" | ")
    }
}

/// How a child exited, in words: `exited with status 1`, `killed by
/// signal 9 (SIGKILL)`.
pub(crate) fn exit_words(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => match nix::sys::signal::Signal::try_from(signal) {
            Ok(name) => format!("killed by signal {signal} ({name})"),
            Err(_) => format!("killed by signal {signal}"),
        },
        (None, None) => "exited".to_owned(),
    }
}

/// `said` (the child's error, if it gave one), its exit and the tail of
/// its stderr as one account: `said; exited with status 1; stderr: …`.
pub(crate) fn account(said: Option<&str>, exit: Option<String>, stderr: &str) -> String {
    let stderr = (!stderr.is_empty()).then(|| format!("stderr: {stderr}"));
    [said.map(str::to_owned), exit, stderr].into_iter().flatten().collect::<Vec<_>>().join("; ")
}

/// `text` with every value of `env` (the variables a provider set for its
/// child, where a key is handed over) replaced by `[redacted]`; values of
/// fewer than four bytes are left, as they would redact ordinary words.
pub(crate) fn redacted(text: &str, env: &[(String, String)]) -> String {
    let mut values: Vec<&str> = env.iter().map(|(_, value)| value.trim()).filter(|value| value.len() >= 4).collect();
    // The longest first: a value that contains another is replaced whole.
    values.sort_by_key(|value| std::cmp::Reverse(value.len()));
    values.iter().fold(text.to_owned(), |text, value| text.replace(value, "[redacted]"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_tail_keeps_the_last_lines_of_a_flood_and_no_more_than_its_cap() {
        let mut flood = "noise\n".repeat(10_000);
        flood.push_str("first\n\nsecond\nthird\nfourth\nfifth\nlast words\n");
        let tail = StderrTail::read(std::io::Cursor::new(flood.into_bytes()));
        let lines = tail.settled(Duration::from_secs(10)).await;
        assert_eq!(lines, "second | third | fourth | fifth | last words");
        assert!(tail.kept.lock().unwrap().len() <= STDERR_TAIL_BYTES);
    }

    #[test]
    fn an_account_joins_what_is_known_and_redacts_the_childs_env_values() {
        assert_eq!(account(None, Some("exited with status 1".into()), ""), "exited with status 1");
        assert_eq!(account(Some("error -32603: boom"), None, "a | b"), "error -32603: boom; stderr: a | b");
        let env = [("API_KEY".to_owned(), "sk-secret-123".to_owned()), ("N".to_owned(), "1".to_owned())];
        assert_eq!(redacted("key sk-secret-123 rejected, 1 try", &env), "key [redacted] rejected, 1 try");
    }
}
