//! What the ACP and MCP framings share, beside the line reader under both
//! ([`continuing_lines`]): stdout written one whole line at a time, the
//! stdin loop's handling of over-long lines and the end of input, the
//! excerpt a parse error quotes, and the bounded drain at EOF. Each framing
//! keeps its own judge of a line and its own book of requests in flight.

use std::future::Future;
use std::io;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::{AsyncWriteExt, Stdin};
use tokio_util::codec::FramedRead;
use tokio_util::sync::CancellationToken;

use crate::providers::child_process::{continuing_lines, Input, InputCodec, MAX_LINE};

/// How long requests in flight at EOF get to be answered before the
/// process exits anyway.
pub(crate) const EOF_ANSWER_BOUND: Duration = Duration::from_secs(30);

/// How much of a bad line an error reply quotes, in characters.
pub(crate) const EXCERPT_CHARS: usize = 64;

/// Enough bytes for [`EXCERPT_CHARS`] characters of any width.
const EXCERPT_BYTES: usize = EXCERPT_CHARS * 4;

/// At most the first [`EXCERPT_CHARS`] characters of `line`.
pub(crate) fn excerpt(line: &[u8]) -> String {
    String::from_utf8_lossy(&line[..line.len().min(EXCERPT_BYTES)]).chars().take(EXCERPT_CHARS).collect()
}

/// Stdout, written one whole line at a time.
pub(crate) struct StdoutLines(tokio::sync::Mutex<tokio::io::Stdout>);

impl StdoutLines {
    pub(crate) fn new() -> Self {
        StdoutLines(tokio::sync::Mutex::new(tokio::io::stdout()))
    }

    /// Writes `line` and its newline, then flushes.
    pub(crate) async fn write(&self, line: String) -> io::Result<()> {
        let mut bytes = line.into_bytes();
        bytes.push(b'\n');
        let mut stdout = self.0.lock().await;
        stdout.write_all(&bytes).await?;
        stdout.flush().await
    }
}

/// Stdin's lines, capped at [`MAX_LINE`], each over-long one cut to a head
/// long enough for an excerpt.
pub(crate) struct StdinLines(FramedRead<Stdin, InputCodec>);

impl StdinLines {
    pub(crate) fn new() -> Self {
        StdinLines(continuing_lines(tokio::io::stdin(), EXCERPT_BYTES))
    }

    /// The next whole line. An over-long line is answered on `out` with
    /// `parse_error(reason, head)` and skipped. `None` at EOF, when stdin
    /// fails (logged; treated as EOF) or when stdout is gone.
    pub(crate) async fn next(
        &mut self,
        out: &StdoutLines,
        parse_error: impl Fn(&str, &[u8]) -> String,
    ) -> Option<Vec<u8>> {
        loop {
            match self.0.next().await? {
                Ok(Input::Line(line)) => return Some(Vec::from(line)),
                Ok(Input::TooLong { head }) => {
                    let reason = format!("the line is longer than the {} MiB cap", MAX_LINE >> 20);
                    out.write(parse_error(&reason, &head)).await.ok()?;
                }
                Err(error) => {
                    tracing::warn!(%error, "reading stdin failed; closing as at EOF");
                    return None;
                }
            }
        }
    }
}

/// At EOF: cancel everything under `closing`, then wait up to
/// [`EOF_ANSWER_BOUND`] for `settled` (no request in flight), warning with
/// the count `in_flight` reads if the bound passes.
pub(crate) async fn drain_at_eof(
    closing: &CancellationToken,
    cancelling: &str,
    in_flight: impl Fn() -> usize,
    settled: impl Future<Output = ()>,
) {
    tracing::debug!(phase = "closing", "stdin ended: cancelling every {cancelling}");
    closing.cancel();
    tracing::debug!(phase = "draining", in_flight = in_flight(), "answering what is in flight");
    if tokio::time::timeout(EOF_ANSWER_BOUND, settled).await.is_err() {
        let in_flight = in_flight();
        tracing::warn!(in_flight, bound_s = EOF_ANSWER_BOUND.as_secs(), "requests still unanswered at exit");
    }
}
