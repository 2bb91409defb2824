//! `fanout --trace FILE`: the trace file, created before any run starts,
//! so that a trace that cannot be written is a one-line error and exit 2
//! rather than a surprise after every run has finished. The results file
//! is the library's ([`subagents::batch`]), which also refuses a batch whose
//! files are not all different.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

/// Creates `--trace`, truncating it only once it is known not to be the
/// `--out` just opened (a link made between the check and the open would
/// otherwise empty the results).
pub fn create_trace(path: &Path, out: Option<&Path>) -> Result<File, String> {
    let shown = path.display();
    // A FIFO is opened only once a reader has it (an open for writing
    // would otherwise wait for one for ever, before any run starts).
    if std::fs::metadata(path).is_ok_and(|metadata| metadata.file_type().is_fifo()) {
        return subagents::batch::open_stream(path).map_err(|error| match error {
            subagents::batch::BatchError::NoReader { waited, .. } => format!(
                "{shown} is a FIFO and no one reads it (waited {waited:?}): the trace would be lost; \
                 start its reader first, or name a file"
            ),
            error => error.to_string(),
        });
    }
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
