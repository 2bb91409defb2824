//! Where a batch's results go, and the files it must not confuse.
//!
//! Naming one file twice used to cost a whole batch (`--out` the tasks
//! file, truncated while it was still being read; `--out` and `--trace`
//! one file). [`refuse_shared`] compares what the paths lead to, before
//! anything is created.
//!
//! Regular files and pipes (and paths yet to be created, through dangling
//! links too) are compared: `fanout - --out /dev/stdin` would write its
//! results into the pipe its tasks come from and read them back as tasks
//! for ever. Devices are not: writing results and a trace to `/dev/null`,
//! or reading tasks from a terminal while writing results to it, clobbers
//! nothing.
//!
//! [`Results`] writes each result line whole as its run settles, to the
//! journal (`--out`) or to the caller's writer (one `write_all` a line,
//! one `flush` at the end, so a writer may gather lines); the first failure to write
//! one is the batch's error: reported once, no new run starts (the batch's
//! token is cancelled) and nothing more is written, so the place holds
//! exactly the lines that were written whole.

use std::collections::HashMap;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use serde_json::Value;

use super::journal::{self, Journal, Prior};
use super::tasks::IdKey;
use super::{BatchError, Report};
use crate::CancellationToken;

/// What a path leads to.
#[derive(Debug, PartialEq, Eq)]
enum Identity {
    /// An existing regular file or pipe (a FIFO, a socket): its device and
    /// inode, so hard links, symbolic links, `./` spellings and
    /// `/dev/stdin` beside `/proc/self/fd/0` all compare equal.
    Existing { device: u64, inode: u64 },
    /// A file to be created: its directory resolved, then its name.
    ToCreate(PathBuf),
}

/// Symbolic links followed by hand, as the kernel would (`ELOOP` past it).
const MAX_LINK_HOPS: usize = 40;

/// `None` for what cannot be clobbered or fed back (devices) or cannot
/// be resolved (opening it will say why).
fn identity(path: &Path, hops: usize) -> Option<Identity> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::metadata(path) {
        Ok(metadata) if metadata.is_file() || metadata.file_type().is_fifo() || metadata.file_type().is_socket() => {
            Some(Identity::Existing { device: metadata.dev(), inode: metadata.ino() })
        }
        Ok(_) => None,
        Err(error) if error.kind() == ErrorKind::NotFound => {
            let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            // A dangling link creates the file it points at: compare that.
            if let Ok(target) = std::fs::read_link(path) {
                return identity(&parent.join(target), hops.checked_sub(1)?);
            }
            Some(Identity::ToCreate(parent.canonicalize().ok()?.join(path.file_name()?)))
        }
        Err(_) => None,
    }
}

/// Refuses files that are not all different: each `(role, path)` names
/// what a file is for (`the tasks file`, `--out`, `--trace`).
pub fn refuse_shared(named: &[(&'static str, &Path)]) -> Result<(), BatchError> {
    let identities: Vec<Option<Identity>> = named.iter().map(|(_, path)| identity(path, MAX_LINK_HOPS)).collect();
    for (i, first) in identities.iter().enumerate() {
        for (j, second) in identities.iter().enumerate().skip(i + 1) {
            if first.is_some() && first == second {
                let ((first, _), (second, path)) = (named[i], named[j]);
                return Err(BatchError::SameFile { first, second, path: path.to_owned() });
            }
        }
    }
    Ok(())
}

/// Where result lines go.
enum Sink {
    Writer(Box<dyn Write + Send>),
    Journal(Journal),
    /// Only to the report.
    Nowhere,
}

/// The batch's results and the first failure to write one.
pub(super) struct Results {
    sink: Mutex<Sink>,
    /// The results file's path, or the writer's name: where a failure says
    /// it happened.
    place: String,
    failure: OnceLock<String>,
    halt: CancellationToken,
}

impl Results {
    /// Opens `out` (a [`journal`], read first with `resume`), else the
    /// caller's writer; the first result that cannot be written cancels
    /// `halt`. With `resume`, what `out` settled before, by task id.
    pub(super) fn open(
        out: Option<&Path>,
        resume: bool,
        max_line_bytes: u64,
        writer: Option<(String, Box<dyn Write + Send>)>,
        halt: CancellationToken,
    ) -> Result<(Results, HashMap<IdKey, Prior>), BatchError> {
        let (sink, settled, place) = match (out, writer) {
            (Some(path), _) => {
                let (journal, settled) = journal::open(path, resume, max_line_bytes)?;
                (Sink::Journal(journal), settled, path.display().to_string())
            }
            (None, Some((name, writer))) => (Sink::Writer(writer), HashMap::new(), name),
            (None, None) => (Sink::Nowhere, HashMap::new(), String::new()),
        };
        Ok((Results { sink: Mutex::new(sink), place, failure: OnceLock::new(), halt }, settled))
    }

    fn sink(&self) -> std::sync::MutexGuard<'_, Sink> {
        self.sink.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Writes `record` as one line; `false` when it was not written (this
    /// line failed, or an earlier one did).
    pub(super) fn write(&self, record: &Value, report: &dyn Report) -> bool {
        if self.failure.get().is_some() {
            return false;
        }
        // Written straight into the line's bytes: `Value`'s `Display`
        // goes through the formatting machinery a piece at a time.
        let mut line = Vec::with_capacity(512);
        if let Err(error) = serde_json::to_writer(&mut line, record) {
            self.fail(&std::io::Error::other(error), report);
            return false;
        }
        line.push(b'\n');
        let written = match &mut *self.sink() {
            // Flushed at the end only: a writer that gathers lines (the
            // command's stdout does, for 20 ms) writes them together.
            Sink::Writer(writer) => writer.write_all(&line),
            Sink::Journal(journal) => journal.write_line(&line),
            Sink::Nowhere => Ok(()),
        };
        match written {
            Ok(()) => true,
            Err(error) => {
                self.fail(&error, report);
                false
            }
        }
    }

    /// Makes what was written durable (a journal) or flushes it (a
    /// writer), at the batch's end; answers the first failure of the
    /// batch, if any.
    pub(super) fn finish(&self, report: &dyn Report) -> Result<(), &str> {
        if self.failure.get().is_none() {
            let finished = match &mut *self.sink() {
                Sink::Writer(writer) => writer.flush(),
                Sink::Journal(journal) => journal.sync(),
                Sink::Nowhere => Ok(()),
            };
            if let Err(error) = finished {
                self.fail(&error, report);
            }
        }
        self.failure.get().map_or(Ok(()), |failure| Err(failure.as_str()))
    }

    /// Whether a resume can finish the batch from where results went.
    pub(super) fn resumable(&self) -> bool {
        matches!(&*self.sink(), Sink::Journal(journal) if journal.is_file())
    }

    /// Records the first failure, reports it and stops the batch.
    fn fail(&self, error: &std::io::Error, report: &dyn Report) {
        let what = match error.kind() {
            ErrorKind::BrokenPipe => format!("{} was closed by its reader ({error})", self.place),
            _ => format!("cannot write to {}: {error}", self.place),
        };
        if self.failure.set(what.clone()).is_ok() {
            report.results_lost(&what);
            self.halt.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_and_spellings_of_one_file_are_the_same_file() {
        let dir = tempfile::tempdir().unwrap();
        let tasks = dir.path().join("tasks.jsonl");
        std::fs::write(&tasks, "{}\n").unwrap();
        let linked = dir.path().join("linked.jsonl");
        std::os::unix::fs::symlink(&tasks, &linked).unwrap();
        let refused = refuse_shared(&[("the tasks file", &tasks), ("--out", &linked)]).unwrap_err();
        assert!(refused.to_string().contains("the tasks file and --out"), "{refused}");
        let new = dir.path().join("new.json");
        let dotted = dir.path().join(".").join("new.json");
        let refused = refuse_shared(&[("the tasks file", &tasks), ("--out", &new), ("--trace", &dotted)]).unwrap_err();
        assert!(refused.to_string().contains("--out and --trace"), "{refused}");
        let other = dir.path().join("other.json");
        assert!(refuse_shared(&[("the tasks file", &tasks), ("--out", &new), ("--trace", &other)]).is_ok());
        let dangling = dir.path().join("dangling.json");
        std::os::unix::fs::symlink(&other, &dangling).unwrap();
        assert!(refuse_shared(&[("--out", &dangling), ("--trace", &other)]).is_err(), "a dangling link's target");
    }

    #[test]
    fn one_pipe_named_twice_is_the_same_file() {
        let (reader, _writer) = std::io::pipe().unwrap();
        use std::os::fd::AsRawFd;
        let named = PathBuf::from(format!("/proc/self/fd/{}", reader.as_raw_fd()));
        let linked = PathBuf::from(format!("/dev/fd/{}", reader.as_raw_fd()));
        assert!(refuse_shared(&[("the tasks file", &named), ("--out", &linked)]).is_err());
    }

    #[test]
    fn devices_are_never_refused() {
        let null = Path::new("/dev/null");
        assert!(refuse_shared(&[("the tasks file", null), ("--out", null), ("--trace", null)]).is_ok());
    }
}
