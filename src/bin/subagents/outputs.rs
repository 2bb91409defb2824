//! The files a `fanout` batch writes (`--out`, `--trace`), settled before
//! any run starts.
//!
//! Two mistakes used to cost a whole batch: naming one file twice (`--out`
//! and `--trace` the same, or either one the tasks file, which `--out`
//! truncated while it was still being read), and a `--trace` that could not
//! be written, found only after every run had finished. [`refuse_shared`]
//! compares what the paths lead to, and [`Outputs::open`] creates both files
//! up front, so either mistake is a one-line error and exit 2.
//!
//! Only regular files (and paths yet to be created) are compared: writing
//! results and a trace to `/dev/null`, or reading tasks from a terminal
//! while writing results to it, clobbers nothing.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use serde_json::Value;
use subagents::CancellationToken;

use crate::journal::{self, Journal, Prior};
use crate::tasks::IdKey;
use crate::terminal::say;

/// What a path leads to.
#[derive(Debug, PartialEq, Eq)]
enum Identity {
    /// An existing regular file: its device and inode, so hard links,
    /// symbolic links and `./` spellings all compare equal.
    Existing { device: u64, inode: u64 },
    /// A file to be created: its directory resolved, then its name.
    ToCreate(PathBuf),
}

/// `None` for what cannot be clobbered (devices, pipes) or cannot be
/// resolved (opening it will say why).
fn identity(path: &Path) -> Option<Identity> {
    identity_within(path, MAX_LINK_HOPS)
}

/// Symbolic links followed by hand, as the kernel would (`ELOOP` past it).
const MAX_LINK_HOPS: usize = 40;

fn identity_within(path: &Path, hops: usize) -> Option<Identity> {
    match std::fs::metadata(path) {
        Ok(metadata) if metadata.is_file() => {
            Some(Identity::Existing { device: metadata.dev(), inode: metadata.ino() })
        }
        Ok(_) => None,
        Err(error) if error.kind() == ErrorKind::NotFound => {
            let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            // A dangling link creates the file it points at: compare that.
            if let Ok(target) = std::fs::read_link(path) {
                return identity_within(&parent.join(target), hops.checked_sub(1)?);
            }
            Some(Identity::ToCreate(parent.canonicalize().ok()?.join(path.file_name()?)))
        }
        Err(_) => None,
    }
}

/// Refuses a batch whose tasks file, `--out` and `--trace` are not three
/// different files.
pub fn refuse_shared(tasks: &Path, out: Option<&Path>, trace: Option<&Path>) -> Result<(), String> {
    let named: Vec<(&str, &Path)> = [("the tasks file", Some(tasks)), ("--out", out), ("--trace", trace)]
        .into_iter()
        .filter_map(|(role, path)| Some((role, path?)))
        .collect();
    let identities: Vec<Option<Identity>> = named.iter().map(|(_, path)| identity(path)).collect();
    for (i, first) in identities.iter().enumerate() {
        for (j, second) in identities.iter().enumerate().skip(i + 1) {
            if first.is_some() && first == second {
                let ((a, _), (b, path)) = (named[i], named[j]);
                return Err(format!("{a} and {b} are the same file ({}); name different files", path.display()));
            }
        }
    }
    Ok(())
}

/// Where results go, and the trace file when one was asked for.
pub struct Outputs {
    pub results: Results,
    pub trace: Option<File>,
    /// What `--out` settled before (with `--resume`), by task id.
    pub settled: HashMap<IdKey, Prior>,
}

impl Outputs {
    /// Opens `--out` (a [`journal`](crate::journal), read first with
    /// `resume`; else stdout) and creates `--trace`; call after
    /// [`refuse_shared`], so that neither truncates an input. The first
    /// result that cannot be written cancels `halt`.
    pub fn open(
        out: Option<&Path>,
        trace: Option<&Path>,
        resume: bool,
        max_line_bytes: u64,
        halt: CancellationToken,
    ) -> Result<Outputs, String> {
        let (sink, settled, place) = match out {
            Some(path) => {
                let (journal, settled) = journal::open(path, resume, max_line_bytes)?;
                (Sink::Journal(journal), settled, path.display().to_string())
            }
            None => (Sink::Stdout(std::io::stdout()), HashMap::new(), "stdout".to_owned()),
        };
        let trace = match trace {
            Some(path) => Some(create_trace(path, out)?),
            None => None,
        };
        let results = Results { sink: Mutex::new(sink), place, failure: OnceLock::new(), halt };
        Ok(Outputs { results, trace, settled })
    }
}

/// Creates `--trace`, truncating it only once it is known not to be the
/// `--out` just opened (a link made between the check and the open would
/// otherwise empty the results).
fn create_trace(path: &Path, out: Option<&Path>) -> Result<File, String> {
    let shown = path.display();
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| format!("cannot create {shown}: {e}"))?;
    let metadata = file.metadata().map_err(|e| format!("cannot create {shown}: {e}"))?;
    if metadata.is_file() {
        let out = out.and_then(|out| std::fs::metadata(out).ok()).filter(std::fs::Metadata::is_file);
        if out.is_some_and(|out| (out.dev(), out.ino()) == (metadata.dev(), metadata.ino())) {
            return Err(format!("--out and --trace are the same file ({shown}); name different files"));
        }
        file.set_len(0).map_err(|e| format!("cannot truncate {shown}: {e}"))?;
    }
    Ok(file)
}

/// Where result lines go.
enum Sink {
    Stdout(std::io::Stdout),
    Journal(Journal),
}

/// The batch's results: each line written whole as its run settles, and
/// the first failure to write one. A result that could not be written is
/// the batch's error: it is said at once on stderr, no new run starts (the
/// batch's token is cancelled) and nothing more is written, so the place
/// holds exactly the lines that were written whole.
pub struct Results {
    sink: Mutex<Sink>,
    /// `--out`'s path, or `stdout`: where the failure says it happened.
    place: String,
    failure: OnceLock<String>,
    halt: CancellationToken,
}

impl Results {
    /// Writes `record` as one line; `false` when it was not written (this
    /// line failed, or an earlier one did).
    pub fn write(&self, record: &Value) -> bool {
        if self.failure.get().is_some() {
            return false;
        }
        let line = format!("{record}\n");
        let mut sink = self.sink.lock().unwrap();
        let written = match &mut *sink {
            Sink::Stdout(stdout) => stdout.write_all(line.as_bytes()).and_then(|()| stdout.flush()),
            Sink::Journal(journal) => journal.write_line(line.as_bytes()),
        };
        match written {
            Ok(()) => true,
            Err(error) => {
                self.fail(&error);
                false
            }
        }
    }

    /// Makes what was written durable (`--out`) or flushes it (stdout), at
    /// the batch's end; answers the first failure of the batch, if any.
    pub fn finish(&self) -> Result<(), &str> {
        if self.failure.get().is_none() {
            let sink = self.sink.lock().unwrap();
            let finished = match &*sink {
                Sink::Stdout(stdout) => stdout.lock().flush(),
                Sink::Journal(journal) => journal.sync(),
            };
            if let Err(error) = finished {
                self.fail(&error);
            }
        }
        self.failure.get().map_or(Ok(()), |failure| Err(failure.as_str()))
    }

    /// Whether `--resume` can finish the batch from where results went.
    pub fn resumable(&self) -> bool {
        matches!(&*self.sink.lock().unwrap(), Sink::Journal(journal) if journal.is_file())
    }

    /// Records the first failure, says it and stops the batch.
    fn fail(&self, error: &std::io::Error) {
        let what = match error.kind() {
            ErrorKind::BrokenPipe => format!("{} was closed by its reader ({error})", self.place),
            _ => format!("cannot write to {}: {error}", self.place),
        };
        if self.failure.set(what.clone()).is_ok() {
            say!("subagents: results lost: {what}. No new run starts and the runs in flight are stopped.");
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
        assert!(refuse_shared(&tasks, Some(&linked), None).unwrap_err().contains("the tasks file and --out"));
        let new = dir.path().join("new.json");
        let dotted = dir.path().join(".").join("new.json");
        assert!(refuse_shared(&tasks, Some(&new), Some(&dotted)).unwrap_err().contains("--out and --trace"));
        assert!(refuse_shared(&tasks, Some(&new), Some(&dir.path().join("other.json"))).is_ok());
    }

    #[test]
    fn devices_are_never_refused() {
        let null = Path::new("/dev/null");
        assert!(refuse_shared(null, Some(null), Some(null)).is_ok());
    }
}
