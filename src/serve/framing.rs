//! What the ACP and MCP framings share, beside the line reader under both
//! ([`continuing_lines`]): stdout written one whole line at a time, the
//! stdin loop's handling of over-long lines and the end of input, the
//! excerpt a parse error quotes, and the bounded drain at EOF. Each framing
//! keeps its own judge of a line and its own book of requests in flight.

use std::future::Future;
use std::io;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::{AsyncRead, AsyncWriteExt, Stdin};
use tokio_util::bytes::{Bytes, BytesMut};
use tokio_util::codec::{AnyDelimiterCodec, AnyDelimiterCodecError, Decoder, FramedRead};
use tokio_util::sync::CancellationToken;

use crate::providers::child_process::{line_codec, MAX_LINE, READ_CAPACITY};

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
    use futures_util::StreamExt;

    use super::*;

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
