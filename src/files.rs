//! Reading files a person or a crash may have left as anything: a tasks
//! file, a batch's results read back by `--resume` or `merge`, a session,
//! the board's files.
//!
//! - [`kind_of`] names what a path is when it is not a regular file, for
//!   the error that refuses it (a device or a FIFO can feed a reader
//!   without end, or make its open wait for ever);
//! - [`read_line`] is the one line reader of the crate: it keeps at most
//!   its cap of a line, the rest read and dropped, so a torn line of
//!   400 MB, or a file with no newline at all, costs one cap of memory,
//!   never its length.
//!
//! ```
//! # #[cfg(feature = "batch")] {
//! use std::io::BufReader;
//! use subagents::batch::read_line;
//!
//! let mut reader = BufReader::new(&b"short\nmuch too long\n"[..]);
//! let mut buffer = Vec::new();
//! let first = read_line(&mut reader, &mut buffer, 8).unwrap().unwrap();
//! assert_eq!((buffer.as_slice(), first.overlong), (&b"short"[..], false));
//! let second = read_line(&mut reader, &mut buffer, 8).unwrap().unwrap();
//! assert!(second.overlong && buffer.is_empty() && second.bytes == 14);
//! # }
//! ```

use std::io::{self, BufRead};

/// The least a results line may be when it is read back: a result line
/// carries its run's output (a child's up to 16 MiB, escaped), so results
/// are read with the larger of this and `--max-line-bytes`.
pub(crate) const RESULT_LINE_FLOOR: u64 = 64 * 1024 * 1024;

/// What a file that is not a regular file is, in words (`None` for a
/// regular file).
pub(crate) fn kind_of(kind: std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    match () {
        () if kind.is_file() => None,
        () if kind.is_dir() => Some("a directory"),
        () if kind.is_fifo() => Some("a FIFO"),
        () if kind.is_socket() => Some("a socket"),
        () if kind.is_symlink() => Some("a symbolic link"),
        () => Some("a device"),
    }
}

/// One line as [`read_line`] found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(feature = "batch"), allow(unreachable_pub))]
pub struct RawLine {
    /// Longer than the cap: its bytes were dropped, not kept.
    pub overlong: bool,
    /// It ended with a newline (a last line without one may be torn).
    pub ended: bool,
    /// Its length in the file, newline included.
    pub bytes: u64,
}

/// Reads the next line of `reader` into `buffer` (newline not kept),
/// keeping at most `max_bytes` of it: past the cap the rest of the line is
/// read and dropped, so memory stays at one cap however long the line;
/// `None` at the end of the input. The one bounded line reader of the
/// crate: task files, the results files `--resume` and `merge` read back,
/// the board's files.
#[cfg_attr(not(feature = "batch"), allow(unreachable_pub))]
pub fn read_line(reader: &mut impl BufRead, buffer: &mut Vec<u8>, max_bytes: usize) -> io::Result<Option<RawLine>> {
    buffer.clear();
    let mut line = RawLine { overlong: false, ended: false, bytes: 0 };
    loop {
        let available = match reader.fill_buf() {
            Ok(available) => available,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        if available.is_empty() {
            // A last line without its newline still counts.
            return Ok((line.bytes > 0).then_some(line));
        }
        let newline = available.iter().position(|&b| b == b'\n');
        let chunk = &available[..newline.unwrap_or(available.len())];
        if !line.overlong && buffer.len() + chunk.len() > max_bytes {
            line.overlong = true;
            *buffer = Vec::new();
        }
        if !line.overlong {
            buffer.extend_from_slice(chunk);
        }
        let consumed = newline.map_or(available.len(), |at| at + 1);
        reader.consume(consumed);
        line.bytes += consumed as u64;
        if newline.is_some() {
            line.ended = true;
            return Ok(Some(line));
        }
    }
}
