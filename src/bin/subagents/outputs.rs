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
use std::fs::File;
use std::io::{ErrorKind, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::journal::{self, Prior};

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
    match std::fs::metadata(path) {
        Ok(metadata) if metadata.is_file() => {
            Some(Identity::Existing { device: metadata.dev(), inode: metadata.ino() })
        }
        Ok(_) => None,
        Err(error) if error.kind() == ErrorKind::NotFound => {
            let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
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
    pub results: Box<dyn Write + Send>,
    pub trace: Option<File>,
    /// What `--out` settled before (with `--resume`), by task id.
    pub settled: HashMap<String, Prior>,
    /// `--out`'s file, to make durable at the end.
    pub durable: Option<Arc<File>>,
}

impl Outputs {
    /// Opens `--out` (a [`journal`](crate::journal), read first with
    /// `resume`; else stdout) and creates `--trace`; call after
    /// [`refuse_shared`], so that neither truncates an input.
    pub fn open(out: Option<&Path>, trace: Option<&Path>, resume: bool) -> Result<Outputs, String> {
        let create = |path: &Path| File::create(path).map_err(|e| format!("cannot create {}: {e}", path.display()));
        let (results, settled, durable): (Box<dyn Write + Send>, _, _) = match out {
            Some(path) => {
                let (journal, settled) = journal::open(path, resume)?;
                let durable = journal.file();
                (Box::new(journal), settled, Some(durable))
            }
            None => (Box::new(std::io::stdout()), HashMap::new(), None),
        };
        let trace = trace.map(create).transpose()?;
        Ok(Outputs { results, trace, settled, durable })
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
