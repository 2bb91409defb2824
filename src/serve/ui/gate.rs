//! Who gets a connection of the web view, so that connections without the
//! token cannot starve those with it.
//!
//! A new connection is *unproven*: it must send a whole request head
//! within [`HEAD_WITHIN`], and at most `max_unproven` wait at once; past
//! that the one that has waited longest is closed to let the new one in
//! (a browser sends its head at once, so only a silent connection is ever
//! the oldest). A connection is closed only for what it has not sent: when
//! its place is taken, what has arrived is still read without waiting
//! ([`read_head_now`]), and a whole head with the token found there is
//! served (one without it is closed: its place is gone). Under churn, many
//! connections can be accepted before a connection's task first reads the
//! head it sent at once; closing it then turned the page away. A head that
//! carries the token ([`super::http::Door`] checks it) *proves* the
//! connection: it moves to a budget of its own and is kept alive between
//! requests. A head without it is answered once (a refusal, most likely)
//! within [`UNPROVEN_SERVE_WITHIN`] and closed.
//!
//! The head is read here, then handed to hyper with the bytes already read
//! in front of the rest of the stream ([`Rewind`]).

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::CancellationToken;

/// How long a new connection may take to send its first request's head.
pub(super) const HEAD_WITHIN: Duration = Duration::from_secs(3);
/// How long a connection without the token may take to be answered once.
pub(super) const UNPROVEN_SERVE_WITHIN: Duration = Duration::from_secs(5);
/// The longest request head read (hyper's own buffer is the same).
pub(super) const MAX_HEAD: usize = 64 * 1024;

/// The two budgets of connections; see the [module](self).
pub(super) struct Gate {
    /// The unproven connections, oldest first: each one's number and the
    /// token that closes it.
    unproven: Mutex<VecDeque<(u64, CancellationToken)>>,
    next: std::sync::atomic::AtomicU64,
    max_unproven: usize,
    proven: Arc<Semaphore>,
}

/// An unproven connection's place; leaving drops it.
pub(super) struct Unproven {
    gate: Arc<Gate>,
    number: u64,
    /// Trips when a newer connection needs the place.
    pub(super) closed: CancellationToken,
}

impl Drop for Unproven {
    fn drop(&mut self) {
        let mut unproven = self.gate.unproven.lock().unwrap_or_else(|e| e.into_inner());
        unproven.retain(|(number, _)| *number != self.number);
    }
}

impl Gate {
    /// At most `max_unproven` connections waiting to prove themselves and
    /// `max_proven` proven ones at once.
    pub(super) fn new(max_unproven: usize, max_proven: usize) -> Arc<Gate> {
        Arc::new(Gate {
            unproven: Mutex::default(),
            next: std::sync::atomic::AtomicU64::new(0),
            max_unproven: max_unproven.max(1),
            proven: Arc::new(Semaphore::new(max_proven.max(1))),
        })
    }

    /// A place for a new connection, closing the oldest unproven one when
    /// every place is taken.
    pub(super) fn enter(self: &Arc<Self>) -> Unproven {
        let number = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let closed = CancellationToken::new();
        let mut unproven = self.unproven.lock().unwrap_or_else(|e| e.into_inner());
        while unproven.len() >= self.max_unproven {
            let Some((_, oldest)) = unproven.pop_front() else { break };
            oldest.cancel();
        }
        unproven.push_back((number, closed.clone()));
        Unproven { gate: self.clone(), number, closed }
    }

    /// A proven connection's place, if one is free.
    pub(super) fn prove(&self) -> Option<OwnedSemaphorePermit> {
        self.proven.clone().try_acquire_owned().ok()
    }
}

/// Reads `stream` into `head` up to the end of a request head (an empty
/// line), at most [`MAX_HEAD`] bytes; `None` at EOF, an error or an
/// over-long head. Cancel-safe: what was read stays in `head`.
pub(super) async fn read_head(stream: &mut TcpStream, head: &mut Vec<u8>) -> Option<()> {
    let mut chunk = [0u8; 4096];
    loop {
        let read = stream.read(&mut chunk).await.ok()?;
        if add_to_head(head, &chunk[..read])? {
            return Some(());
        }
    }
}

/// Reads into `head` what `stream` already holds, without waiting: whether
/// that completes a request head.
pub(super) fn read_head_now(stream: &TcpStream, head: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 4096];
    loop {
        let Ok(read) = stream.try_read(&mut chunk) else { return false };
        match add_to_head(head, &chunk[..read]) {
            Some(true) => return true,
            Some(false) => {}
            None => return false,
        }
    }
}

/// Adds `read` to `head`: whether the head is now whole, `None` at EOF (an
/// empty `read`) or past [`MAX_HEAD`].
fn add_to_head(head: &mut Vec<u8>, read: &[u8]) -> Option<bool> {
    if read.is_empty() {
        return None;
    }
    let searched_from = head.len().saturating_sub(3);
    head.extend_from_slice(read);
    if head[searched_from..].windows(4).any(|window| window == b"\r\n\r\n") {
        return Some(true);
    }
    (head.len() < MAX_HEAD).then_some(false)
}

/// A stream that yields `read` first, then the rest of `inner`.
pub(super) struct Rewind {
    read: Vec<u8>,
    at: usize,
    inner: TcpStream,
}

impl Rewind {
    pub(super) fn new(read: Vec<u8>, inner: TcpStream) -> Rewind {
        Rewind { read, at: 0, inner }
    }
}

impl AsyncRead for Rewind {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if self.at < self.read.len() {
            let count = (self.read.len() - self.at).min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.read[at..at + count]);
            self.at += count;
            if self.at == self.read.len() {
                self.read = Vec::new();
                self.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_connection_past_the_budget_closes_the_oldest_waiting_one() {
        let gate = Gate::new(2, 1);
        let (first, second) = (gate.enter(), gate.enter());
        let third = gate.enter();
        assert!(first.closed.is_cancelled() && !second.closed.is_cancelled() && !third.closed.is_cancelled());
        drop(second);
        let fourth = gate.enter();
        assert!(!third.closed.is_cancelled() && !fourth.closed.is_cancelled(), "a place given back is reused");
        assert!(gate.prove().is_some());
    }
}
