//! Segments: many sessions' lines in shared append-only files.
//!
//! Creating a file is the dearest thing a session costs on a real disk
//! (tens to hundreds of microseconds on ext4, several times a run's own
//! work), so a store does not give each session a file of its own. Each
//! store writes one segment at a time, `<home>/sessions/<segment>.log`,
//! created 0600 on its first session; every line in it is one session's
//! record, tagged with that session's id before the record's own fields
//! (`{"session":"<id>","type":…}`). The lines of one session are in the
//! order they were appended; the lines of many interleave.
//!
//! A segment is only ever appended to, by the one store that created it,
//! whole lines at a time, so a crash tears at most its last line and every
//! other session's lines in it stay whole. A segment is rotated (new
//! sessions go to a fresh one) once it passes [`SEGMENT_BYTES`], and
//! whenever a session is continued whose lines lie in a segment that sorts
//! after the one being written: segment names begin with their creation
//! time, so a session read back in name order, and in file order within a
//! segment, is in the order it was written.
//!
//! Finding a session scans the segments' tails: the [`Index`] remembers, for
//! every segment, how far it was read, and for every session the stretches
//! of segment bytes that hold its lines. Reading a session then reads only
//! those stretches, through the same bounded line reader as a file of its
//! own. Removing a session appends a removal line: reads then forget its
//! earlier lines (the bytes stay until the segment is deleted).
//!
//! Known limits: the index keeps an entry for every session it has seen
//! (about a hundred bytes each) for as long as the store lives; a duplicate
//! id created by another process since this store last read the segments
//! is not seen; loading a session to continue it opens a segment for its
//! new lines even if none follow; and nothing deletes a segment whose
//! sessions were all removed.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use super::file::{next_line, open_regular, umask_keeps, Line, Record};
use super::lane::AppendTarget;
use super::{SessionError, SessionEvent, SessionHeader};

/// How a segment file's name ends (a session file of its own ends in
/// `.jsonl`, which is how the two are told apart).
pub(super) const SEGMENT_SUFFIX: &str = ".log";

/// The size past which new sessions go to a fresh segment.
pub(super) const SEGMENT_BYTES: u64 = 64 << 20;

/// The most of a line the index reads to learn whose it is.
const HEAD_BYTES: usize = 512;

/// The start of every segment line, before the session id.
const TAG_OPEN: &[u8] = b"{\"session\":\"";

/// `record`'s JSON object as a segment line of session `id`: the id first,
/// then the record's own fields, then `\n`. Ids are checked to need no
/// escaping.
pub(super) fn push_tagged_line(lines: &mut Vec<u8>, id: &str, record: &impl serde::Serialize) -> io::Result<()> {
    lines.extend_from_slice(TAG_OPEN);
    lines.extend_from_slice(id.as_bytes());
    lines.push(b'"');
    // The record's own `{` becomes the comma after the tag: no bytes move.
    let start = lines.len();
    serde_json::to_writer(&mut *lines, record)?;
    debug_assert_eq!(lines.get(start), Some(&b'{'));
    lines[start] = b',';
    lines.push(b'\n');
    Ok(())
}

/// The session id a segment line is tagged with, and the rest of the line
/// after the tag.
fn tag_of(line: &[u8]) -> Option<(&str, &[u8])> {
    let rest = line.strip_prefix(TAG_OPEN)?;
    let end = rest.iter().position(|&b| b == b'"')?;
    let after = rest[end + 1..].strip_prefix(b",")?;
    Some((std::str::from_utf8(&rest[..end]).ok()?, after))
}

/// A stretch of one segment holding lines of one session, `start..end`.
#[derive(Clone, Copy, Debug)]
struct Run {
    segment: usize,
    start: u64,
    end: u64,
}

/// What a segment's last scan found after its last whole line: bytes with
/// no `\n` yet, torn by a crash (or, in another process, still being
/// written).
#[derive(Debug)]
struct Tail {
    /// The session it is tagged with, when the tag survived.
    owner: Option<String>,
    len: u64,
}

#[derive(Debug)]
struct Segment {
    name: String,
    /// Bytes read so far: always the end of a whole line.
    scanned: u64,
    tail: Option<Tail>,
}

/// The segment being written and the target every session in it appends
/// to.
#[derive(Debug)]
struct Writer {
    segment: usize,
    target: AppendTarget,
}

/// Which segments hold which session's lines (see the module doc). Only
/// the session lane touches it.
#[derive(Debug, Default)]
pub(super) struct Index {
    segments: Vec<Segment>,
    by_name: HashMap<String, usize>,
    /// Every session seen, with the stretches holding its lines; a session
    /// created here is known before its first line was read back.
    sessions: HashMap<String, Vec<Run>>,
    /// The sessions in files of their own (`<id>.jsonl`) at the last look.
    own_files: HashSet<String>,
    writer: Option<Writer>,
    /// Segments written before the current one, kept open as long as the
    /// store: a session closing never closes its segment's file on its
    /// own thread.
    retired: Vec<AppendTarget>,
}

impl Index {
    /// Reads the segments' new bytes: segments created since the last
    /// look, and what was appended to the known ones.
    pub(super) fn refresh(&mut self, dir: &Path) -> io::Result<()> {
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(error),
        };
        let mut found = Vec::new();
        self.own_files.clear();
        for entry in entries {
            let name = entry?.file_name();
            let Some(name) = name.to_str() else { continue };
            if let Some(id) = name.strip_suffix(".jsonl") {
                self.own_files.insert(id.to_owned());
            } else if name.ends_with(SEGMENT_SUFFIX) && !self.by_name.contains_key(name) {
                found.push(name.to_owned());
            }
        }
        found.sort();
        for name in found {
            self.by_name.insert(name.clone(), self.segments.len());
            self.segments.push(Segment { name, scanned: 0, tail: None });
        }
        for segment in 0..self.segments.len() {
            if let Err(error) = self.scan(dir, segment) {
                let name = &self.segments[segment].name;
                tracing::warn!(segment = %name, %error, "could not read a session segment");
            }
        }
        Ok(())
    }

    /// Reads one segment from where the last scan stopped.
    fn scan(&mut self, dir: &Path, segment: usize) -> Result<(), SessionError> {
        let name = self.segments[segment].name.clone();
        let path = dir.join(&name);
        let mut at = self.segments[segment].scanned;
        // Unchanged since the last scan (most segments, most of the time):
        // no need to open it.
        if fs::symlink_metadata(&path).is_ok_and(|meta| meta.is_file() && meta.len() == at) {
            return Ok(());
        }
        let (file, len) = open_regular(&path, &name, false)?;
        if len <= at {
            return Ok(());
        }
        let mut reader = BufReader::with_capacity(64 * 1024, file);
        reader.seek(SeekFrom::Start(at)).map_err(|source| SessionError::io(&name, source))?;
        let mut reader = reader.take(len - at);
        let mut head = Vec::with_capacity(HEAD_BYTES);
        self.segments[segment].tail = None;
        loop {
            let (consumed, whole) =
                skip_line(&mut reader, &mut head).map_err(|source| SessionError::io(&name, source))?;
            if consumed == 0 {
                break;
            }
            let owner = tag_of(&head).map(|(id, rest)| (id.to_owned(), rest));
            if !whole {
                let owner = owner.map(|(id, _)| id);
                self.segments[segment].tail = Some(Tail { owner, len: consumed });
                break;
            }
            match owner {
                Some((id, rest)) if rest.starts_with(b"\"type\":\"removed\"") => {
                    self.sessions.remove(&id);
                }
                Some((id, _)) => {
                    let runs = self.sessions.entry(id).or_default();
                    match runs.last_mut() {
                        Some(run) if run.segment == segment && run.end == at => run.end += consumed,
                        _ => runs.push(Run { segment, start: at, end: at + consumed }),
                    }
                }
                None => tracing::warn!(segment = %name, offset = at, "skipping a segment line tagged with no session"),
            }
            at += consumed;
        }
        self.segments[segment].scanned = at;
        Ok(())
    }

    /// Whether session `id` was seen (and not removed since).
    pub(super) fn holds(&self, id: &str) -> bool {
        self.sessions.contains_key(id)
    }

    /// Whether session `id` had a file of its own at the last look.
    pub(super) fn has_own_file(&self, id: &str) -> bool {
        self.own_files.contains(id)
    }

    /// The segment being written, if a new session can go to it without
    /// a file being created: open, not failed, not full.
    pub(super) fn open_writer_for_new(&self) -> Option<AppendTarget> {
        let writer = self.writer.as_ref()?;
        let usable = writer.target.failed().is_none() && writer.target.written() < SEGMENT_BYTES;
        usable.then(|| writer.target.clone())
    }

    /// Every session seen.
    pub(super) fn ids(&self) -> impl Iterator<Item = &String> {
        self.sessions.keys()
    }

    /// Marks session `id` created (its lines are read back later).
    pub(super) fn created(&mut self, id: &str) {
        self.sessions.entry(id.to_owned()).or_default();
    }

    /// Forgets session `id` (its removal line is queued).
    pub(super) fn removed(&mut self, id: &str) {
        self.sessions.remove(id);
    }

    /// The target new lines of session `id` go to: the segment being
    /// written, or a fresh one when there is none, it is full, or `id` has
    /// lines in a segment that does not sort before it.
    pub(super) fn writer_for(&mut self, dir: &Path, id: &str) -> io::Result<AppendTarget> {
        let latest = self.sessions.get(id).into_iter().flatten().map(|run| &self.segments[run.segment].name).max();
        let usable = self.writer.as_ref().filter(|writer| {
            let name = &self.segments[writer.segment].name;
            writer.target.failed().is_none()
                && latest.is_none_or(|latest| latest <= name)
                && writer.target.written() < SEGMENT_BYTES
        });
        if let Some(writer) = usable {
            return Ok(writer.target.clone());
        }
        let after = latest.cloned();
        self.open_writer(dir, after.as_deref())
    }

    /// Creates a fresh segment whose name sorts after `after` and every
    /// segment known, 0600 whatever the umask.
    fn open_writer(&mut self, dir: &Path, after: Option<&str>) -> io::Result<AppendTarget> {
        let newest = self.segments.iter().map(|s| s.name.as_str()).chain(after).max().map(str::to_owned);
        let floor = newest.as_deref().and_then(|name| name.get(..13)?.parse::<u64>().ok()).map_or(0, |ms| ms + 1);
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let ms = now.max(floor);
        for attempt in 0..1_000u32 {
            let name = format!("{ms:013}-{}-{attempt:03}{SEGMENT_SUFFIX}", std::process::id());
            let opened = OpenOptions::new().append(true).create_new(true).mode(0o600).open(dir.join(&name));
            let file = match opened {
                Ok(file) => file,
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(error) => return Err(error),
            };
            // The mode above is cut by the umask, never widened.
            if !umask_keeps(0o600) {
                file.set_permissions(fs::Permissions::from_mode(0o600))?;
            }
            let segment = self.segments.len();
            self.by_name.insert(name.clone(), segment);
            self.segments.push(Segment { name, scanned: 0, tail: None });
            let target = AppendTarget::new(file);
            let previous = self.writer.replace(Writer { segment, target: target.clone() });
            self.retired.extend(previous.map(|writer| writer.target));
            return Ok(target);
        }
        Err(io::Error::new(io::ErrorKind::AlreadyExists, "no free segment name"))
    }

    /// Reads session `id` from its stretches, oldest first: its header
    /// (the last header line wins), each whole event handed to `event`,
    /// whether a torn last line was left out, and how many bytes its lines
    /// take. [`SessionError::NotFound`] when it has no lines, or only a
    /// header torn by a crash.
    pub(super) fn read(
        &self,
        dir: &Path,
        id: &str,
        max_line: usize,
        mut event: impl FnMut(SessionEvent) -> std::ops::ControlFlow<()>,
    ) -> Result<(SessionHeader, bool, u64), SessionError> {
        let corrupt = |line, reason| SessionError::Corrupt { id: id.to_owned(), line, reason };
        let mut runs = self.sessions.get(id).cloned().unwrap_or_default();
        runs.sort_by(|a, b| (&self.segments[a.segment].name, a.start).cmp(&(&self.segments[b.segment].name, b.start)));
        let mut header = None;
        let (mut number, mut bytes, mut torn) = (0, 0u64, false);
        let mut open: Option<(usize, File)> = None;
        let mut line = Vec::new();
        let mut stopped = false;
        'runs: for run in &runs {
            let segment = &self.segments[run.segment];
            if open.as_ref().is_none_or(|(at, _)| *at != run.segment) {
                let (file, _) = open_regular(&dir.join(&segment.name), id, false)?;
                open = Some((run.segment, file));
            }
            let (_, file) = open.as_mut().expect("opened above");
            let io_error = |source| SessionError::io(id, source);
            file.seek(SeekFrom::Start(run.start)).map_err(io_error)?;
            let mut reader = BufReader::with_capacity(64 * 1024, (&*file).take(run.end - run.start));
            let mut at = run.start;
            loop {
                let whole = match next_line(&mut reader, &mut line, max_line).map_err(io_error)? {
                    Line::End => break,
                    Line::TooLong => {
                        return Err(corrupt(number + 1, format!("the line is longer than {max_line} bytes")))
                    }
                    Line::Whole => true,
                    // The index only ever records whole lines: the file changed.
                    Line::Unterminated => false,
                };
                number += 1;
                at += line.len() as u64 + u64::from(whole);
                bytes += line.len() as u64 + u64::from(whole);
                let last_in_segment = at >= segment.scanned && segment.tail.is_none();
                let parsed = match tag_of(&line) {
                    Some((tag, _)) if tag == id => serde_json::from_slice::<Record>(&line).map_err(|e| e.to_string()),
                    _ => Err(format!("segment {} holds another session's line here", segment.name)),
                };
                // A torn line followed by more of the session (continued
                // in a later segment after the crash) is no longer its last.
                torn = false;
                match parsed {
                    Ok(_) if !whole => torn = true,
                    Ok(Record::Header(h)) if h.id != id => {
                        return Err(corrupt(number, format!("its header names session {:?}, not {id:?}", h.id)))
                    }
                    Ok(Record::Header(h)) => header = Some(h),
                    Ok(Record::Event(e)) => {
                        if event(e).is_break() {
                            // Asked to stop: what is left is not read.
                            stopped = true;
                            break 'runs;
                        }
                    }
                    Ok(Record::Removed) => header = None,
                    Err(_) if last_in_segment || !whole => torn = true,
                    Err(reason) => return Err(corrupt(number, reason)),
                }
            }
        }
        // Bytes after the last whole line of the segment holding the
        // session's newest lines, tagged with this session: its last line,
        // torn.
        let last = runs.last().and_then(|run| self.segments[run.segment].tail.as_ref());
        if let Some(tail) = last.filter(|tail| !stopped && tail.owner.as_deref() == Some(id)) {
            torn = true;
            bytes += tail.len;
        }
        if torn {
            tracing::warn!(session = id, "leaving out a torn last session line");
        }
        match header {
            Some(header) => Ok((header, torn, bytes)),
            // Killed before its header reached the segment: no session.
            None if number == 0 || (number == 1 && torn) => Err(SessionError::NotFound(id.to_owned())),
            None => Err(corrupt(1, "no header line".to_owned())),
        }
    }
}

/// Reads past the next line of `reader`, keeping its first [`HEAD_BYTES`]
/// in `head`: the bytes it took (0 at the end) and whether it ended in
/// `\n`.
fn skip_line(reader: &mut impl BufRead, head: &mut Vec<u8>) -> io::Result<(u64, bool)> {
    head.clear();
    let mut consumed = 0u64;
    loop {
        let buffer = reader.fill_buf()?;
        if buffer.is_empty() {
            return Ok((consumed, false));
        }
        let (taken, ends) = match buffer.iter().position(|&b| b == b'\n') {
            Some(at) => (at, true),
            None => (buffer.len(), false),
        };
        let room = HEAD_BYTES.saturating_sub(head.len()).min(taken);
        head.extend_from_slice(&buffer[..room]);
        let step = taken + usize::from(ends);
        reader.consume(step);
        consumed += step as u64;
        if ends {
            return Ok((consumed, true));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tagged_line_names_its_session_before_the_record() {
        let mut line = Vec::new();
        push_tagged_line(&mut line, "s-1", &Record::Removed).unwrap();
        assert_eq!(line, b"{\"session\":\"s-1\",\"type\":\"removed\"}\n");
        let (id, rest) = tag_of(&line).unwrap();
        assert_eq!((id, rest), ("s-1", &b"\"type\":\"removed\"}\n"[..]));
        assert!(matches!(serde_json::from_slice::<Record>(&line).unwrap(), Record::Removed));
        assert!(tag_of(b"{\"type\":\"user\"}").is_none());
    }
}
