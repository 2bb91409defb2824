//! [`Session`]: one session as its agent holds it — the header and every
//! event in memory, and (when persisted) its open file, written only on the
//! session lane.
//!
//! An append is kept in memory at once and queued for the file as one whole
//! line; nothing waits for the disk. A write that failed is remembered and
//! reported by the next append or by the close, and the close answers only
//! once every queued line reached the file.

use std::fs::File;
use std::io;

use serde::Serialize;

use super::file::{push_line, Record};
use super::lane::{self, AppendTarget, LaneCall};
use super::segment::push_tagged_line;
use super::{completed_prefix, SessionError, SessionEvent, SessionHeader};

/// A session: header, events, and (when persisted) its open file.
#[derive(Debug)]
pub struct Session {
    header: SessionHeader,
    events: Vec<SessionEvent>,
    /// Written on the session lane, whole lines only.
    writer: Option<SessionFile>,
}

/// A persisted session's open file, written only on the session lane, and
/// the first write error (appends do not wait, so an error is reported by
/// the next append or by the close): a file of its own (the layout of
/// earlier versions, still continued), or a segment shared with other
/// sessions, where each line is tagged with the session's id.
#[derive(Debug)]
pub(super) struct SessionFile {
    target: AppendTarget,
    shared: bool,
    /// Where the session's last queued line ends among the bytes appended
    /// to the target: once the lane wrote that far, all of it is on disk.
    end: u64,
}

impl SessionFile {
    /// A file the session has to itself.
    pub(super) fn own(file: File) -> Self {
        SessionFile { target: AppendTarget::new(file), shared: false, end: 0 }
    }

    /// A segment shared with other sessions, the session's lines so far
    /// queued up to `end` (what [`lane::append`] answered).
    pub(super) fn shared(target: AppendTarget, end: u64) -> Self {
        SessionFile { target, shared: true, end }
    }

    /// The first write that failed, if any.
    fn check(&self, id: &str) -> Result<(), SessionError> {
        match self.target.failed() {
            Some((kind, message)) => Err(SessionError::io(id, io::Error::new(*kind, message.clone()))),
            None => Ok(()),
        }
    }

    /// On the lane, after every queued write: close the file and report the
    /// first write that failed.
    fn finish(self, id: &str) -> Result<(), SessionError> {
        let outcome = self.check(id);
        drop(self);
        outcome
    }
}

impl Session {
    /// A session that is never written anywhere.
    pub fn in_memory(header: SessionHeader) -> Self {
        Session { header, events: Vec::new(), writer: None }
    }

    /// A session in memory only, its log starting with `seed`.
    pub(super) fn in_memory_seeded(header: SessionHeader, seed: Vec<SessionEvent>) -> Self {
        Session { header, events: seed, writer: None }
    }

    /// A session whose `events` are already in `file`.
    pub(super) fn persisted(header: SessionHeader, events: Vec<SessionEvent>, file: SessionFile) -> Self {
        Session { header, events, writer: Some(file) }
    }

    /// The session id.
    pub fn id(&self) -> &str {
        &self.header.id
    }

    /// The header.
    pub fn header(&self) -> &SessionHeader {
        &self.header
    }

    /// Every event so far, oldest first.
    pub fn events(&self) -> &[SessionEvent] {
        &self.events
    }

    /// Whether the session is written to a file.
    pub fn is_persisted(&self) -> bool {
        self.writer.is_some()
    }

    /// The events up to and including the last turn end: what a fork
    /// inherits. The open turn, if any, is left out.
    pub fn completed_prefix(&self) -> &[SessionEvent] {
        completed_prefix(&self.events)
    }

    /// Appends an event: kept in memory at once, and queued for the file
    /// as one whole line (in order, on the session lane, written together
    /// with the appends queued beside it). An
    /// earlier write that failed is reported here (or by the close).
    pub fn append(&mut self, event: SessionEvent) -> Result<(), SessionError> {
        self.write_line(&event)?;
        // The first event gets room for one, not four: a child waiting on
        // its first answer holds only its prompt (later growth doubles).
        if self.events.capacity() == 0 {
            self.events.reserve_exact(1);
        }
        self.events.push(event);
        Ok(())
    }

    /// Closes the file once everything appended reached it, blocking the
    /// calling thread until then; the session stays readable in memory. In
    /// async code, [`Agent::shutdown`](crate::agent::Agent::shutdown)
    /// closes without blocking.
    pub fn close(&mut self) -> Result<(), SessionError> {
        self.closing().wait()
    }

    /// [`Session::close`], to wait for or await: the file is taken now, and
    /// the call answers once everything appended reached it.
    pub(crate) fn closing(&mut self) -> LaneCall<()> {
        match self.writer.take() {
            // Every line already written to a segment (which the store keeps
            // open): nothing left to wait for, and no file to close here.
            Some(writer) if writer.shared && writer.target.reached(writer.end) => {
                LaneCall::ready(&self.header.id, writer.finish(&self.header.id))
            }
            Some(writer) => {
                let id = self.header.id.clone();
                LaneCall::new(&self.header.id, move || writer.finish(&id))
            }
            None => LaneCall::ready(&self.header.id, Ok(())),
        }
    }

    /// On the lane: raises the depth to `depth` if it is deeper, queueing
    /// the new header before anything appended later (the last header line
    /// wins on load).
    pub(super) fn deepen(&mut self, depth: u32) -> Result<(), SessionError> {
        if depth <= self.header.depth {
            return Ok(());
        }
        self.header.depth = depth;
        self.write_line(&Record::Header(self.header.clone()))
    }

    /// On the lane: closes the file without waiting for anything (the
    /// session was never handed out).
    pub(super) fn forget_file(&mut self) {
        self.writer = None;
    }

    /// Queues one whole line: a header record or an event (whose own tag
    /// makes it a valid record).
    fn write_line(&mut self, record: &impl Serialize) -> Result<(), SessionError> {
        let Some(writer) = &mut self.writer else { return Ok(()) };
        writer.check(&self.header.id)?;
        let mut line = Vec::new();
        let pushed = match writer.shared {
            true => push_tagged_line(&mut line, &self.header.id, record),
            false => push_line(&mut line, record),
        };
        pushed.map_err(|source| SessionError::io(&self.header.id, source))?;
        writer.end = lane::append(&writer.target, line);
        Ok(())
    }
}

impl Drop for Session {
    /// A session dropped without a close still has its file closed on the
    /// lane, after its queued writes: waited for outside an async runtime
    /// (a program about to exit loses nothing), queued inside one.
    fn drop(&mut self) {
        if let Some(writer) = self.writer.take() {
            if tokio::runtime::Handle::try_current().is_ok() {
                lane::submit(move || drop(writer));
            } else {
                let _ = lane::call_blocking(move || drop(writer));
            }
        }
    }
}
