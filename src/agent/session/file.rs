//! A session file on disk: how it is written (one whole JSON line per
//! record), how it is read back (line by line, bounded), and the private
//! directory it lives in.
//!
//! Reading trusts nothing about what sits under `<home>/sessions/`: a
//! `*.jsonl` name may be a symlink (to `/dev/zero`, say), a FIFO that no one
//! writes, a sparse file of a terabyte of zeros, or another user's
//! directory. So a session file is opened without following a symlink and
//! without blocking on a FIFO, is read only when the open handle is a
//! regular file, is read only up to the size it had when opened, and line
//! by line with each line bounded; an event goes to the caller as soon as
//! its line parses, so a reader that keeps only a summary holds one line at
//! a time. The directory itself is opened without following a symlink
//! before its mode is set, so a `sessions` symlink is refused and its
//! target left as it was.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use super::{SessionError, SessionEvent, SessionHeader};
use crate::files::kind_of;

/// One line of a session file: the header or an event (whose own tag makes
/// it a valid record).
#[derive(Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum Record {
    Header(SessionHeader),
    /// The session was removed: what came before it is forgotten (written
    /// only to a shared segment, see [`segment`](super::segment)).
    Removed,
    #[serde(untagged)]
    Event(SessionEvent),
}

/// Adds `record` to `lines` as one whole line.
pub(super) fn push_line(lines: &mut Vec<u8>, record: &impl Serialize) -> io::Result<()> {
    serde_json::to_writer(&mut *lines, record)?;
    lines.push(b'\n');
    Ok(())
}

/// Whether a file created with `mode` gets exactly that mode: whether the
/// process's umask (read once, from `/proc/self/status`) cuts none of its
/// bits. When it does, or it cannot be read, the caller sets the mode
/// after creating the file. The umask only ever narrows a mode, so a
/// umask changed later can make a file more private, never less.
pub(super) fn umask_keeps(mode: u32) -> bool {
    static UMASK: OnceLock<Option<u32>> = OnceLock::new();
    let umask = UMASK.get_or_init(|| {
        let status = fs::read_to_string("/proc/self/status").ok()?;
        let value = status.lines().find_map(|line| line.strip_prefix("Umask:"))?;
        u32::from_str_radix(value.trim(), 8).ok()
    });
    umask.is_some_and(|umask| mode & umask == 0)
}

/// Creates `dir` and its missing parents as 0700 whatever the umask
/// (transcripts hold prompts and file contents), and makes `dir` itself
/// 0700 if it already existed: it is ours. Existing parents (a home the
/// user made) are left as they are. A `dir` that is a symlink is refused:
/// its target is someone else's.
pub(super) fn create_private_dir(dir: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut cursor = Some(dir);
    while let Some(path) = cursor {
        if path.as_os_str().is_empty() || path.exists() {
            break;
        }
        missing.push(path);
        cursor = path.parent();
    }
    for path in missing.iter().rev() {
        match fs::DirBuilder::new().mode(0o700).create(path) {
            Ok(()) => fs::set_permissions(path, fs::Permissions::from_mode(0o700))?,
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
            Err(error) => return Err(error),
        }
    }
    // Checked and changed through a handle opened without following a
    // symlink: nothing can be swapped in between the check and the chmod.
    let opened = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_DIRECTORY).open(dir);
    let handle = opened.map_err(|error| {
        // With O_DIRECTORY, Linux reports a symlink as ENOTDIR, not ELOOP.
        match fs::symlink_metadata(dir) {
            Ok(metadata) if metadata.file_type().is_symlink() => io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is a symbolic link; sessions are not kept through one", dir.display()),
            ),
            _ => error,
        }
    })?;
    if handle.metadata()?.permissions().mode() & 0o777 != 0o700 {
        handle.set_permissions(fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// The `*.jsonl` names in `dir`, without the suffix (whatever kind of file
/// each is: reading one tells).
pub(super) fn list_ids(dir: &Path) -> io::Result<Vec<String>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error),
    };
    let mut ids = Vec::new();
    for entry in entries {
        let name = entry?.file_name();
        if let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".jsonl")) {
            ids.push(id.to_owned());
        }
    }
    Ok(ids)
}

/// Opens session `id`'s file for reading (and appending, when `append`)
/// if it is a regular file, with its size then: the most that is read.
pub(super) fn open_regular(path: &Path, id: &str, append: bool) -> Result<(File, u64), SessionError> {
    let io_error = |source| SessionError::Io { id: id.to_owned(), source };
    let not_regular = |found| SessionError::NotARegularFile { id: id.to_owned(), found };
    // O_NONBLOCK: opening a FIFO must not wait for a writer (for a regular
    // file the flag changes nothing).
    let flags = libc::O_NOFOLLOW | libc::O_NONBLOCK;
    let file = match OpenOptions::new().read(true).append(append).custom_flags(flags).open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Err(SessionError::NotFound(id.to_owned())),
        Err(error) if error.raw_os_error() == Some(libc::ELOOP) => return Err(not_regular("a symbolic link")),
        Err(error) if error.raw_os_error() == Some(libc::EISDIR) => return Err(not_regular("a directory")),
        Err(error) => return Err(io_error(error)),
    };
    let metadata = file.metadata().map_err(io_error)?;
    match kind_of(metadata.file_type()) {
        None => Ok((file, metadata.len())),
        Some(found) => Err(not_regular(found)),
    }
}

/// Reads a session file of `len` bytes line by line: the header (the last
/// header line wins), each whole event handed to `event` as its line
/// parses, and the length of the valid prefix. A line that does not parse
/// is a torn write when it is the last (left out) and corruption anywhere
/// else; a line longer than `max_line` bytes is refused wherever it is.
pub(super) fn read_records(
    id: &str,
    file: &File,
    len: u64,
    max_line: usize,
    mut event: impl FnMut(SessionEvent) -> std::ops::ControlFlow<()>,
) -> Result<(SessionHeader, u64), SessionError> {
    let corrupt = |line, reason| SessionError::Corrupt { id: id.to_owned(), line, reason };
    let mut reader = BufReader::with_capacity(64 * 1024, file.take(len));
    let mut header = None;
    let mut valid_len = 0u64;
    let mut line = Vec::new();
    let mut number = 0;
    loop {
        number += 1;
        let complete = match next_line(&mut reader, &mut line, max_line)
            .map_err(|source| SessionError::Io { id: id.to_owned(), source })?
        {
            Line::End => break,
            Line::TooLong => return Err(corrupt(number, format!("the line is longer than {max_line} bytes"))),
            Line::Whole => true,
            Line::Unterminated => false,
        };
        let consumed = line.len() as u64 + u64::from(complete);
        let is_last = valid_len + consumed >= len;
        match serde_json::from_slice::<Record>(&line) {
            Ok(_) if !complete => break,
            // A file renamed, copied or forged under another session's
            // name is not that session.
            Ok(Record::Header(h)) if h.id != id => {
                return Err(corrupt(number, format!("its header names session {:?}, not the file's", h.id)))
            }
            Ok(Record::Header(h)) => header = Some(h),
            Ok(Record::Event(e)) => {
                if event(e).is_break() {
                    // Asked to stop: what is left is not read, and not torn.
                    valid_len = len;
                    break;
                }
            }
            Ok(Record::Removed) => header = None,
            Err(_) if is_last => break,
            Err(error) => return Err(corrupt(number, error.to_string())),
        }
        valid_len += consumed;
    }
    // A process killed between creating the file and writing the header
    // leaves it empty (or with a torn header): that session never existed.
    let header = header.ok_or_else(|| match valid_len {
        0 => SessionError::NotFound(id.to_owned()),
        _ => corrupt(1, "no header line".to_owned()),
    })?;
    Ok((header, valid_len))
}

/// What [`next_line`] found.
pub(super) enum Line {
    /// A line and its `\n`.
    Whole,
    /// A last line without a `\n`.
    Unterminated,
    /// A line longer than the bound (what was read of it is dropped).
    TooLong,
    /// Nothing more.
    End,
}

/// The next line of `reader` into `line`, without its `\n`, growing `line`
/// to at most `max` bytes.
pub(super) fn next_line(reader: &mut impl BufRead, line: &mut Vec<u8>, max: usize) -> io::Result<Line> {
    line.clear();
    loop {
        let buffer = reader.fill_buf()?;
        if buffer.is_empty() {
            return Ok(if line.is_empty() { Line::End } else { Line::Unterminated });
        }
        let (taken, ends) = match buffer.iter().position(|&b| b == b'\n') {
            Some(at) => (at, true),
            None => (buffer.len(), false),
        };
        if line.len() + taken > max {
            return Ok(Line::TooLong);
        }
        line.extend_from_slice(&buffer[..taken]);
        reader.consume(taken + usize::from(ends));
        if ends {
            return Ok(Line::Whole);
        }
    }
}
