//! What the ACP and MCP framings share, beside the line reader under both
//! ([`continuing_lines`]) and the stdio threads ([`pipes`](super::pipes)):
//! the stdin loop's handling of over-long lines and of the end of input, the
//! excerpt a parse error quotes, and the bounded drain at EOF. Each framing
//! keeps its own judge of a line and its own book of requests in flight,
//! kept in a [`Ledger`] that wakes whoever waits on it.
//!
//! **The end of input** is any of: EOF on stdin, a failed read, a stop
//! signal (SIGINT, SIGTERM, SIGHUP: see [`signals`](super::signals)) and
//! stdout gone (a write failed: no answer can reach the client any more).
//! Each ends the reading loop the same way, into [`drain_at_eof`].
//!
//! **The drain** is bounded by [`EOF_ANSWER_BOUND`] from its start: the
//! answers computed in that time are written as the client reads them; at
//! the bound, what is still unwritten is dropped (stdout is abandoned) and
//! one warning names the requests left unanswered, so that a client that
//! never reads cannot keep the process alive.

use std::future::Future;
use std::io;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::AsyncRead;
use tokio::sync::watch;
use tokio_util::bytes::{Bytes, BytesMut};
use tokio_util::codec::{AnyDelimiterCodec, AnyDelimiterCodecError, Decoder, FramedRead};
use tokio_util::sync::CancellationToken;

use super::pipes::{self, StdoutLines, ThreadRead};
use super::signals::StopSignals;
use crate::child_process::{line_codec, MAX_LINE, READ_CAPACITY};

/// How long, from the end of input, the requests in flight get to be
/// answered and their answers written before the process exits anyway.
pub(crate) const EOF_ANSWER_BOUND: Duration = Duration::from_secs(30);

/// How much of a bad line an error reply quotes, in characters.
pub(crate) const EXCERPT_CHARS: usize = 64;

/// A framing's book of requests in flight, and a wake-up for whoever waits
/// on it each time an answer settles something.
pub(crate) struct Ledger<B> {
    book: Mutex<B>,
    answered: watch::Sender<u64>,
}

impl<B: Default> Default for Ledger<B> {
    fn default() -> Self {
        Ledger { book: Mutex::default(), answered: watch::Sender::new(0) }
    }
}

impl<B> Ledger<B> {
    /// The book, for reading or a change that wakes no one.
    pub(crate) fn book(&self) -> MutexGuard<'_, B> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An answer went out: `settle` updates the book, then the waits wake.
    pub(crate) fn answered(&self, settle: impl FnOnce(&mut B)) {
        settle(&mut self.book());
        self.answered.send_modify(|answers| *answers += 1);
    }

    /// Waits until `done` holds for the book.
    pub(crate) async fn wait_until(&self, done: impl Fn(&B) -> bool) {
        // Subscribed before the check, so an answer in between still wakes us.
        let mut answered = self.answered.subscribe();
        while !done(&self.book()) {
            if answered.changed().await.is_err() {
                return;
            }
        }
    }
}

/// Enough bytes for [`EXCERPT_CHARS`] characters of any width.
const EXCERPT_BYTES: usize = EXCERPT_CHARS * 4;

/// The most request ids a warning lists; the rest are counted.
const LISTED_IDS: usize = 64;

/// At most the first [`EXCERPT_CHARS`] characters of `line`.
pub(crate) fn excerpt(line: &[u8]) -> String {
    String::from_utf8_lossy(&line[..line.len().min(EXCERPT_BYTES)]).chars().take(EXCERPT_CHARS).collect()
}

/// `ids`, sorted, at most [`LISTED_IDS`] of them: `5, 7, 9` or `5, 7, … and
/// 70 more`.
pub(crate) fn id_list(mut ids: Vec<String>) -> String {
    ids.sort_by(|a, b| (a.len(), a).cmp(&(b.len(), b)));
    let more = ids.len().saturating_sub(LISTED_IDS);
    ids.truncate(LISTED_IDS);
    let listed = ids.join(", ");
    if more == 0 {
        listed
    } else {
        format!("{listed}, … and {more} more")
    }
}

/// Stdin's lines, capped at [`MAX_LINE`], each over-long one cut to a head
/// long enough for an excerpt, until the end of input (see the module docs).
pub(crate) struct StdinLines {
    lines: FramedRead<ThreadRead, InputCodec>,
    signals: StopSignals,
}

impl StdinLines {
    /// Stdin, with the stop signals registered: from here on they end the
    /// input instead of the process.
    pub(crate) fn new() -> Self {
        StdinLines { lines: continuing_lines(pipes::stdin(), EXCERPT_BYTES), signals: StopSignals::register() }
    }

    /// The next whole line. An over-long line is answered on `out` with
    /// `parse_error(reason, head)` and skipped. `None` at the end of input:
    /// EOF, a failed read (logged), a stop signal (logged) or `out` gone.
    pub(crate) async fn next(
        &mut self,
        out: &StdoutLines,
        parse_error: impl Fn(&str, &[u8]) -> String,
    ) -> Option<Vec<u8>> {
        loop {
            let read = tokio::select! {
                biased;
                signal = self.signals.recv() => {
                    tracing::info!(signal, "stopped by a signal: closing as at the end of input");
                    return None;
                }
                () = out.gone() => return None,
                read = self.lines.next() => read?,
            };
            match read {
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

/// At the end of input: cancel everything under `closing`, then wait up to
/// [`EOF_ANSWER_BOUND`] for `settled` (every request answered and its
/// answer written). Past the bound, `out` is abandoned and one warning says
/// what was dropped: `unanswered()` describes the requests still in flight.
pub(crate) async fn drain_at_eof(
    closing: &CancellationToken,
    out: &StdoutLines,
    cancelling: &str,
    unanswered: impl Fn() -> String,
    settled: impl Future<Output = ()>,
) {
    tracing::debug!(phase = "closing", "the input ended: cancelling every {cancelling}");
    closing.cancel();
    tracing::debug!(phase = "draining", "answering what is in flight");
    if tokio::time::timeout(EOF_ANSWER_BOUND, settled).await.is_err() {
        out.abandon();
        let (bound_s, unwritten) = (EOF_ANSWER_BOUND.as_secs(), out.unwritten());
        tracing::warn!(bound_s, unwritten, "dropped at the end-of-input bound: {}", unanswered());
    }
}

/// The lines of `reader` for a server that must keep serving past a bad
/// line: an over-long one is an [`Input::TooLong`] item carrying its first
/// `head_bytes` (the rest is skipped), not the end of the stream.
pub(crate) fn continuing_lines<R: AsyncRead>(reader: R, head_bytes: usize) -> FramedRead<R, InputCodec> {
    FramedRead::with_capacity(reader, InputCodec { lines: line_codec(), head_bytes }, READ_CAPACITY)
}

/// One line of input as [`continuing_lines`] yields it.
#[derive(Debug, PartialEq)]
pub(crate) enum Input {
    /// A whole line, without its newline.
    Line(Bytes),
    /// A line past [`MAX_LINE`]: its first bytes (as many as the reader
    /// asked for), for an excerpt. The codec skips the rest of it.
    TooLong {
        /// The line's first bytes.
        head: Bytes,
    },
}

/// The shared line codec, with an over-long line made an item instead of an
/// error: `FramedRead` ends its stream after a decoder error, but one bad
/// line must cost one reply, not the session. The inner codec, called
/// again, discards the rest of that line and reads on.
pub(crate) struct InputCodec {
    lines: AnyDelimiterCodec,
    head_bytes: usize,
}

impl InputCodec {
    fn judged(
        &self,
        decoded: Result<Option<Bytes>, AnyDelimiterCodecError>,
        buffer: &BytesMut,
    ) -> io::Result<Option<Input>> {
        match decoded {
            Ok(line) => Ok(line.map(Input::Line)),
            // The codec leaves the over-long line at the buffer's start.
            Err(AnyDelimiterCodecError::MaxChunkLengthExceeded) => {
                let head = Bytes::copy_from_slice(&buffer[..buffer.len().min(self.head_bytes)]);
                Ok(Some(Input::TooLong { head }))
            }
            Err(AnyDelimiterCodecError::Io(error)) => Err(error),
        }
    }
}

impl Decoder for InputCodec {
    type Item = Input;
    type Error = io::Error;

    fn decode(&mut self, buffer: &mut BytesMut) -> io::Result<Option<Input>> {
        let decoded = self.lines.decode(buffer);
        self.judged(decoded, buffer)
    }

    fn decode_eof(&mut self, buffer: &mut BytesMut) -> io::Result<Option<Input>> {
        let decoded = self.lines.decode_eof(buffer);
        self.judged(decoded, buffer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_list_is_in_order_and_cut_short() {
        assert_eq!(id_list(vec!["10".into(), "9".into(), "\"b\"".into()]), "9, 10, \"b\"");
        let many = (0..70).map(|n| n.to_string()).collect();
        assert!(id_list(many).ends_with(", 63, … and 6 more"));
    }

    #[tokio::test]
    async fn an_over_long_line_costs_its_head_and_reading_goes_on() {
        let mut input = b"\xff\xfe\n".to_vec();
        input.extend(std::iter::repeat_n(b'a', MAX_LINE + 10));
        input.extend_from_slice(b"\nnext\n");
        let mut lines = continuing_lines(input.as_slice(), 256);
        let mut read = Vec::new();
        while let Some(line) = lines.next().await {
            read.push(line.unwrap());
        }
        let expected = [
            Input::Line(Bytes::from_static(b"\xff\xfe")),
            Input::TooLong { head: Bytes::from(vec![b'a'; 256]) },
            Input::Line(Bytes::from_static(b"next")),
        ];
        assert_eq!(read, expected, "invalid UTF-8 is a line for `judge`; an over-long one costs its head");
    }
}
