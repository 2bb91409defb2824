//! This process's stdin and stdout for the stdio servers (`subagents mcp`,
//! `acp` and `serve`), each on a thread of its own.
//!
//! tokio's `stdin()` and `stdout()` run each read and write on the
//! runtime's blocking pool, and a runtime does not finish shutting down
//! until its blocking threads return. A read waiting on a client that
//! neither writes nor closes (a server told to stop by a signal), or a
//! write waiting on one that no longer reads, would then hold the process
//! past its exit, for as long as the client likes. These threads are never
//! joined: the process exits past them.
//!
//! - [`stdin`]: an `AsyncRead` fed by a reader thread, one chunk at a time,
//!   at most [`CHUNKS_AHEAD`] chunks read ahead (memory stays bounded).
//! - [`StdoutLines`]: whole lines, written in order by a writer thread; a
//!   write resolves once its line is written. The first write that fails
//!   (the client's end of the pipe is gone) is logged once and marks the
//!   output [gone](StdoutLines::gone): every later line fails at once, and
//!   the servers take it as the end of input. After
//!   [`abandon`](StdoutLines::abandon) (the EOF bound passed) every line not
//!   yet written is dropped and its write resolves at once.

use std::future::Future;
use std::io::{self, Read, Write};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::{mpsc, oneshot};
use tokio_util::bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::child_process::READ_CAPACITY;

/// Chunks the reader thread may read before the server takes them.
pub(crate) const CHUNKS_AHEAD: usize = 4;

/// This process's stdin, read on a thread of its own.
pub(crate) fn stdin() -> ThreadRead {
    ThreadRead::spawn("subagents-stdin", io::stdin())
}

/// The bytes of a reader that a thread reads; EOF when it ends, an error
/// (then EOF) when it fails.
#[derive(Debug)]
pub(crate) struct ThreadRead {
    chunks: mpsc::Receiver<io::Result<Bytes>>,
    current: Bytes,
}

impl ThreadRead {
    fn spawn(name: &str, mut reader: impl Read + Send + 'static) -> ThreadRead {
        let (sender, chunks) = mpsc::channel(CHUNKS_AHEAD);
        let failed = sender.clone();
        let spawned = std::thread::Builder::new().name(name.to_owned()).spawn(move || {
            let mut buffer = vec![0; READ_CAPACITY];
            loop {
                let chunk = match reader.read(&mut buffer) {
                    Ok(0) => return,
                    Ok(read) => Ok(Bytes::copy_from_slice(&buffer[..read])),
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                    Err(error) => Err(error),
                };
                let last = chunk.is_err();
                if sender.blocking_send(chunk).is_err() || last {
                    return;
                }
            }
        });
        if let Err(error) = spawned {
            let _ = failed.try_send(Err(error));
        }
        ThreadRead { chunks, current: Bytes::new() }
    }
}

impl AsyncRead for ThreadRead {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.current.is_empty() {
            match ready!(self.chunks.poll_recv(cx)) {
                Some(Ok(chunk)) => self.current = chunk,
                Some(Err(error)) => return Poll::Ready(Err(error)),
                // Nothing put in `buf`: the end of input.
                None => return Poll::Ready(Ok(())),
            }
        }
        let take = self.current.len().min(buf.remaining());
        buf.put_slice(&self.current.split_to(take));
        Poll::Ready(Ok(()))
    }
}

/// One line for the writer thread, and who waits for it.
struct Queued {
    bytes: Vec<u8>,
    written: oneshot::Sender<io::Result<()>>,
}

/// What the writer thread and the writers share.
#[derive(Debug, Default)]
struct Shared {
    /// A write failed: the other end is gone.
    gone: CancellationToken,
    /// The EOF bound passed: what is not written is dropped.
    abandoned: CancellationToken,
    /// Lines handed over and not yet written.
    unwritten: AtomicUsize,
}

/// Stdout, one whole line at a time, on a thread of its own.
#[derive(Debug)]
pub(crate) struct StdoutLines {
    lines: mpsc::UnboundedSender<Queued>,
    shared: Arc<Shared>,
}

// The framings of `acp` and `mcp` use all of it; `serve` alone writes lines.
#[cfg_attr(not(any(all(feature = "acp", feature = "agent"), feature = "mcp-server")), allow(dead_code))]
impl StdoutLines {
    /// This process's stdout.
    pub(crate) fn new() -> Self {
        StdoutLines::spawn("subagents-stdout", io::stdout())
    }

    fn spawn(name: &str, mut out: impl Write + Send + 'static) -> Self {
        let (lines, mut queue) = mpsc::unbounded_channel::<Queued>();
        let shared = Arc::new(Shared::default());
        let writer = shared.clone();
        let spawned = std::thread::Builder::new().name(name.to_owned()).spawn(move || {
            while let Some(Queued { bytes, written }) = queue.blocking_recv() {
                let result = writer.write(&mut out, &bytes);
                writer.unwritten.fetch_sub(1, Ordering::SeqCst);
                let _ = written.send(result);
            }
        });
        if let Err(error) = spawned {
            tracing::error!(%error, "cannot start the stdout writer; nothing can be answered");
            shared.gone.cancel();
        }
        StdoutLines { lines, shared }
    }

    /// Writes `line` and its newline; resolves once it is written, or at
    /// once when the output is gone or abandoned.
    pub(crate) async fn write(&self, line: String) -> io::Result<()> {
        if self.shared.gone.is_cancelled() {
            return Err(gone());
        }
        let mut bytes = line.into_bytes();
        bytes.push(b'\n');
        let (written, done) = oneshot::channel();
        self.shared.unwritten.fetch_add(1, Ordering::SeqCst);
        if self.lines.send(Queued { bytes, written }).is_err() {
            self.shared.unwritten.fetch_sub(1, Ordering::SeqCst);
            return Err(gone());
        }
        tokio::select! {
            biased;
            result = done => result.unwrap_or_else(|_| Err(gone())),
            _ = self.shared.abandoned.cancelled() => Err(abandoned()),
        }
    }

    /// Whether a write has failed: the client's end is gone.
    pub(crate) fn is_gone(&self) -> bool {
        self.shared.gone.is_cancelled()
    }

    /// Resolves once a write has failed.
    pub(crate) fn gone(&self) -> impl Future<Output = ()> + '_ {
        self.shared.gone.cancelled()
    }

    /// Drops every line not yet written, now and later: their writes
    /// resolve at once (a line being written finishes on its own, or never).
    pub(crate) fn abandon(&self) {
        self.shared.abandoned.cancel();
    }

    /// Lines handed over and not yet written.
    pub(crate) fn unwritten(&self) -> usize {
        self.shared.unwritten.load(Ordering::SeqCst)
    }
}

impl Shared {
    fn write(&self, out: &mut impl Write, bytes: &[u8]) -> io::Result<()> {
        if self.abandoned.is_cancelled() {
            return Err(abandoned());
        }
        if self.gone.is_cancelled() {
            return Err(gone());
        }
        let written = out.write_all(bytes).and_then(|()| out.flush());
        if let Err(error) = &written {
            // Once: every later line fails without trying.
            tracing::warn!(%error, "stdout is gone: closing as at the end of input");
            self.gone.cancel();
        }
        written
    }
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "stdout is gone")
}

fn abandoned() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "the line was dropped at the end-of-input bound")
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::sync::Mutex;

    use tokio::io::AsyncReadExt;

    use super::*;

    /// A writer that keeps what it is given, fails once told to, and can be
    /// made to block.
    #[derive(Clone, Default)]
    struct Sink {
        written: Arc<Mutex<Vec<u8>>>,
        broken: Arc<AtomicBool>,
        blocked: Arc<AtomicBool>,
    }

    impl Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            while self.blocked.load(Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            if self.broken.load(Ordering::SeqCst) {
                return Err(io::Error::from(io::ErrorKind::BrokenPipe));
            }
            self.written.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_thread_read_yields_every_byte_then_eof() {
        let input: Vec<u8> = (0..200_000u32).map(|n| n as u8).collect();
        let mut read = ThreadRead::spawn("test-read", io::Cursor::new(input.clone()));
        let mut got = Vec::new();
        read.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, input);
    }

    #[tokio::test]
    async fn lines_are_written_whole_and_in_order_and_a_broken_pipe_fails_every_later_line_at_once() {
        let sink = Sink::default();
        let out = StdoutLines::spawn("test-write", sink.clone());
        for n in 0..3 {
            out.write(format!("line {n}")).await.unwrap();
        }
        assert_eq!(String::from_utf8(sink.written.lock().unwrap().clone()).unwrap(), "line 0\nline 1\nline 2\n");
        assert!(!out.is_gone());
        sink.broken.store(true, Ordering::SeqCst);
        assert_eq!(out.write("lost".to_owned()).await.unwrap_err().kind(), io::ErrorKind::BrokenPipe);
        assert!(out.is_gone());
        tokio::time::timeout(std::time::Duration::from_secs(1), out.gone()).await.expect("gone resolves");
        sink.broken.store(false, Ordering::SeqCst);
        assert!(out.write("after".to_owned()).await.is_err(), "gone stays gone");
        assert_eq!(out.unwritten(), 0);
    }

    #[tokio::test]
    async fn abandoning_resolves_a_write_the_reader_never_takes() {
        let sink = Sink::default();
        let out = Arc::new(StdoutLines::spawn("test-blocked", sink.clone()));
        sink.blocked.store(true, Ordering::SeqCst);
        let writing = tokio::spawn({
            let out = out.clone();
            async move { out.write("stuck".to_owned()).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!writing.is_finished(), "the write waits for its reader");
        assert_eq!(out.unwritten(), 1);
        out.abandon();
        let result = tokio::time::timeout(std::time::Duration::from_secs(1), writing).await.expect("resolved");
        assert_eq!(result.unwrap().unwrap_err().kind(), io::ErrorKind::TimedOut);
        sink.blocked.store(false, Ordering::SeqCst);
    }
}
