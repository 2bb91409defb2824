//! Lines for stdout or stderr gathered and written together.
//!
//! A fan-out settles thousands of runs a second; written one `write` each,
//! their result lines (and, off a terminal, their progress lines) were a
//! third of the command's system calls. A [`Coalesced`] stream takes whole
//! lines into a buffer and a thread of its own writes what gathered
//! [`FLUSH_AFTER`] after the first line came, in one `write`, or at once
//! when [`FLUSH_BYTES`] gathered. So a line reaches its reader at most
//! 20 ms late, an idle stream wakes no thread, and a busy one costs a
//! write per 20 ms instead of per line.
//!
//! Nothing is lost on the way out: the buffer is written when the stream
//! is flushed or dropped, and [`flush_all`] writes every stream's buffer
//! before the process exits on a signal (a second Ctrl-C, SIGTERM). A write
//! that fails (a closed pipe, a full disk) is kept and answered to the next
//! line or flush, so the batch learns of it and stops as before; the lines
//! of the failed write count as written to the batch (they were handed
//! over), and the batch fails with the error.

use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::Duration;

/// How long the first line of a burst waits for the others.
pub const FLUSH_AFTER: Duration = Duration::from_millis(20);

/// Gathered bytes written at once, without waiting for the thread.
pub const FLUSH_BYTES: usize = 64 * 1024;

/// Where a stream's bytes go when written.
type Sink = Box<dyn FnMut(&[u8]) -> io::Result<()> + Send>;

struct Shared {
    state: Mutex<State>,
    /// Signalled when a burst begins, and when the stream is closed.
    work: Condvar,
    /// Held while bytes are written, so writes leave in the order taken.
    sink: Mutex<Sink>,
}

#[derive(Default)]
struct State {
    gathered: Vec<u8>,
    /// The first write that failed, answered to the next line or flush.
    failed: Option<io::Error>,
    closed: bool,
}

/// A stream of whole lines, written together (see the module).
pub struct Coalesced {
    shared: Arc<Shared>,
    writer: Option<std::thread::JoinHandle<()>>,
}

/// Every open stream, for [`flush_all`].
fn open_streams() -> &'static Mutex<Vec<Weak<Shared>>> {
    static STREAMS: OnceLock<Mutex<Vec<Weak<Shared>>>> = OnceLock::new();
    STREAMS.get_or_init(Mutex::default)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Coalesced {
    /// A stream whose gathered bytes `sink` writes, each time whole.
    pub fn new(sink: impl FnMut(&[u8]) -> io::Result<()> + Send + 'static) -> Coalesced {
        let shared =
            Arc::new(Shared { state: Mutex::default(), work: Condvar::new(), sink: Mutex::new(Box::new(sink)) });
        lock(open_streams()).push(Arc::downgrade(&shared));
        let writer = {
            let shared = shared.clone();
            std::thread::Builder::new().name("subagents-output".into()).spawn(move || shared.write_bursts()).ok()
        };
        Coalesced { shared, writer }
    }

    /// Stderr.
    pub fn stderr() -> Coalesced {
        Coalesced::new(|bytes| io::stderr().lock().write_all(bytes))
    }

    /// Takes `line` and a newline.
    pub fn line(&self, line: &str) -> io::Result<()> {
        self.shared.take(&[line.as_bytes(), b"\n"])
    }
}

impl Shared {
    /// Gathers `parts`; a failure of an earlier write is answered instead.
    fn take(&self, parts: &[&[u8]]) -> io::Result<()> {
        let mut state = lock(&self.state);
        if let Some(error) = state.failed.take() {
            return Err(error);
        }
        let burst_begins = state.gathered.is_empty();
        for part in parts {
            state.gathered.extend_from_slice(part);
        }
        if state.gathered.len() >= FLUSH_BYTES {
            drop(state);
            return self.write_gathered();
        }
        if burst_begins {
            self.work.notify_one();
        }
        Ok(())
    }

    /// Writes what gathered now; answers the first failure not yet answered.
    fn write_gathered(&self) -> io::Result<()> {
        let sink = lock(&self.sink);
        self.write_with(sink)
    }

    /// Writes what gathered through `sink`, already held.
    fn write_with(&self, mut sink: std::sync::MutexGuard<'_, Sink>) -> io::Result<()> {
        let gathered = std::mem::take(&mut lock(&self.state).gathered);
        let written = match gathered.is_empty() {
            true => Ok(()),
            false => sink(&gathered),
        };
        drop(sink);
        let earlier = lock(&self.state).failed.take();
        match (earlier, written) {
            (Some(error), _) | (None, Err(error)) => Err(error),
            (None, Ok(())) => Ok(()),
        }
    }

    /// The thread's write: a failure is kept for the next line or flush
    /// before the sink is let go, so a flush waiting on the sink finds it.
    fn write_burst(&self) {
        let mut sink = lock(&self.sink);
        let gathered = std::mem::take(&mut lock(&self.state).gathered);
        if gathered.is_empty() {
            return;
        }
        if let Err(error) = sink(&gathered) {
            lock(&self.state).failed.get_or_insert(error);
        }
    }

    /// The stream's thread: waits for a burst, lets it gather, writes it.
    fn write_bursts(&self) {
        loop {
            {
                let mut state = lock(&self.state);
                while state.gathered.is_empty() && !state.closed {
                    state = self.work.wait(state).unwrap_or_else(std::sync::PoisonError::into_inner);
                }
                if state.closed {
                    return;
                }
                let (state, _) =
                    self.work.wait_timeout(state, FLUSH_AFTER).unwrap_or_else(std::sync::PoisonError::into_inner);
                if state.closed {
                    return;
                }
            }
            self.write_burst();
        }
    }
}

impl Write for Coalesced {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.shared.take(&[bytes]).map(|()| bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.shared.write_gathered()
    }
}

impl Drop for Coalesced {
    fn drop(&mut self) {
        lock(&self.shared.state).closed = true;
        self.shared.work.notify_one();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
        let _ = self.shared.write_gathered();
    }
}

/// Writes what every open stream gathered: before the process exits
/// without unwinding (a second Ctrl-C, SIGTERM). A stream whose write is
/// stuck (a reader that stopped reading) is passed over, so the exit
/// never waits on it.
pub fn flush_all() {
    let streams: Vec<Arc<Shared>> = lock(open_streams()).iter().filter_map(Weak::upgrade).collect();
    for stream in streams {
        if let Ok(sink) = stream.sink.try_lock() {
            let _ = stream.write_with(sink);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each write a sink took.
    type Writes = Arc<Mutex<Vec<Vec<u8>>>>;

    /// A sink that keeps each write, and fails while its flag is set.
    fn recording() -> (Coalesced, Writes, Arc<std::sync::atomic::AtomicBool>) {
        let writes = Arc::new(Mutex::new(Vec::new()));
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (kept, failing) = (writes.clone(), fail.clone());
        let stream = Coalesced::new(move |bytes| {
            if failing.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(io::Error::new(io::ErrorKind::StorageFull, "no space left"));
            }
            kept.lock().unwrap().push(bytes.to_vec());
            Ok(())
        });
        (stream, writes, fail)
    }

    #[test]
    fn lines_taken_together_leave_in_one_write_and_in_order_after_a_short_wait() {
        let (stream, writes, _) = recording();
        for i in 0..100 {
            stream.line(&format!("line {i}")).unwrap();
        }
        let expected: String = (0..100).map(|i| format!("line {i}\n")).collect();
        // Until every byte came (another test's `flush_all` may write the
        // first lines early, from its own thread).
        let written = || writes.lock().unwrap().iter().map(Vec::len).sum::<usize>();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while written() < expected.len() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let writes = writes.lock().unwrap().clone();
        let text: String = writes.iter().map(|w| String::from_utf8_lossy(w).into_owned()).collect();
        assert_eq!(text, expected, "every line, in order, without waiting for a flush");
        assert!(writes.len() < 100, "lines taken together are written together: {} writes", writes.len());
    }

    #[test]
    fn dropping_or_flush_all_writes_what_gathered_and_a_failed_write_is_answered_to_the_next_line() {
        let (stream, writes, fail) = recording();
        stream.line("kept").unwrap();
        flush_all();
        assert_eq!(writes.lock().unwrap().concat(), b"kept\n", "flush_all wrote it before the thread did");
        fail.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut stream = stream;
        stream.line("lost").unwrap();
        let failed = stream.flush().unwrap_err();
        assert_eq!(failed.kind(), io::ErrorKind::StorageFull);
        stream.line("later").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let answered = loop {
            match stream.line("again") {
                Err(error) => break error,
                Ok(()) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
                Ok(()) => panic!("the thread's failed write was never answered"),
            }
        };
        assert_eq!(answered.kind(), io::ErrorKind::StorageFull, "the thread's failure reaches the next line");
        fail.store(false, std::sync::atomic::Ordering::SeqCst);
        stream.line("last").unwrap();
        drop(stream);
        assert!(writes.lock().unwrap().concat().ends_with(b"last\n"), "dropping writes what gathered");
    }
}
