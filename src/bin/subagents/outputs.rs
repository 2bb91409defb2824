//! `fanout --trace FILE`: the trace file, created before any run starts,
//! so that a trace that cannot be written is a one-line error and exit 2
//! rather than a surprise after every run has finished. The results file
//! is the library's ([`subagents::batch`]), which also refuses a batch whose
//! files are not all different.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Creates `--trace`, truncating it only once it is known not to be the
/// `--out` just opened (a link made between the check and the open would
/// otherwise empty the results).
pub fn create_trace(path: &Path, out: Option<&Path>) -> Result<File, String> {
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
