//! Built-in tools confined to the session's working directory.
//!
//! A path is resolved against the cwd and refused when it escapes it: first
//! lexically (so nothing outside is even looked at), then by opening it
//! beneath a handle on the cwd in one step (cap-std: `openat2` with
//! `RESOLVE_BENEATH` on Linux). There is no check-then-open: a directory
//! swapped for a symbolic link between two calls cannot lead a read out.
//! Symbolic links that stay inside the cwd are followed. File I/O runs on
//! the blocking pool, never on an actor thread.

use std::io::{self, Read};
use std::path::{Component, Path, PathBuf};

use cap_std::fs::Dir;

use futures_util::future::BoxFuture;
use serde_json::{json, Value};

use super::{reads_only, Tool, ToolContext, ToolOutput, ToolSpec};

/// Largest file `read_file` returns whole; longer files are cut with a note.
const READ_LIMIT: usize = 256 * 1024;
/// Most entries `list_dir` returns.
const LIST_LIMIT: usize = 1000;

/// `read_file(path)`: a UTF-8 file under the session's cwd.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadFile;

/// `list_dir(path?)`: the entries of a directory under the session's cwd.
#[derive(Clone, Copy, Debug, Default)]
pub struct ListDir;

impl Tool for ReadFile {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "read_file".to_owned(),
            description: "Reads a text file. The path is relative to the working directory.".to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {"path": {"type": "string", "description": "File path, relative to the working directory"}},
                "required": ["path"],
                "additionalProperties": false
            }),
        }
    }

    reads_only!();

    fn call(&self, arguments: Value, context: ToolContext) -> BoxFuture<'_, ToolOutput> {
        Box::pin(async move {
            let requested = arguments["path"].as_str().unwrap_or_default();
            let (bytes, total) = match beneath(&context, requested, ("read", "read"), read_beneath).await {
                Ok(read) => read,
                Err(refused) => return refused,
            };
            let mut text = String::from_utf8_lossy(&bytes).into_owned();
            if total > bytes.len() as u64 {
                text.push_str(&format!("\n[truncated: the file has {total} bytes]"));
            }
            ToolOutput::ok(text)
        })
    }
}

impl Tool for ListDir {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "list_dir".to_owned(),
            description: "Lists a directory (default: the working directory). Directories end with '/'.".to_owned(),
            parameters: json!({
                "type": "object",
                "properties": {"path": {"type": "string", "description": "Directory, relative to the working directory"}},
                "additionalProperties": false
            }),
        }
    }

    reads_only!();

    fn call(&self, arguments: Value, context: ToolContext) -> BoxFuture<'_, ToolOutput> {
        Box::pin(async move {
            let requested = arguments["path"].as_str().unwrap_or(".");
            let mut names = match beneath(&context, requested, ("list", "listing"), list_beneath).await {
                Ok(names) => names,
                Err(refused) => return refused,
            };
            names.sort();
            let total = names.len();
            names.truncate(LIST_LIMIT);
            let mut listing = names.join("\n");
            if total > LIST_LIMIT {
                listing.push_str(&format!("\n[{} more entries]", total - LIST_LIMIT));
            }
            ToolOutput::ok(listing)
        })
    }
}

/// `work` done on the blocking pool on `requested`, a path under the
/// session's cwd: one that escapes it is refused before anything is looked
/// at. A refusal is the model's error output, `verb` and `noun` naming the
/// work ("cannot read …: the read failed").
async fn beneath<T: Send + 'static>(
    context: &ToolContext,
    requested: &str,
    (verb, noun): (&str, &str),
    work: fn(&Path, &Path) -> io::Result<T>,
) -> Result<T, ToolOutput> {
    let relative = lexical(&context.cwd, requested).map_err(|outside| ToolOutput::error(outside.to_string()))?;
    let cwd = context.cwd.clone();
    match tokio::task::spawn_blocking(move || work(&cwd, &relative)).await {
        Ok(Ok(done)) => Ok(done),
        Ok(Err(error)) => Err(ToolOutput::error(refusal(requested, verb, &error))),
        Err(_) => Err(ToolOutput::error(format!("cannot {verb} {requested:?}: the {noun} failed"))),
    }
}

/// The cwd as a directory handle: everything below is opened relative to
/// it, and the kernel (`openat2` with `RESOLVE_BENEATH` where available,
/// else one component at a time without following symbolic links out)
/// refuses any step that leaves it, so a rename or symlink swapped in
/// between two calls cannot redirect an open.
fn root(cwd: &Path) -> io::Result<Dir> {
    Dir::open_ambient_dir(cwd, cap_std::ambient_authority())
}

/// Reads at most [`READ_LIMIT`] bytes of the file; also returns its size.
fn read_beneath(cwd: &Path, relative: &Path) -> io::Result<(Vec<u8>, u64)> {
    let file = root(cwd)?.open(relative)?;
    let total = file.metadata()?.len();
    let mut bytes = Vec::with_capacity(total.min(READ_LIMIT as u64) as usize);
    file.take(READ_LIMIT as u64).read_to_end(&mut bytes)?;
    let total = total.max(bytes.len() as u64);
    Ok((bytes, total))
}

/// The entry names of a directory, directories with a trailing `/`.
fn list_beneath(cwd: &Path, relative: &Path) -> io::Result<Vec<String>> {
    let root = root(cwd)?;
    let directory = if relative.as_os_str().is_empty() { root } else { root.open_dir(relative)? };
    let mut names = Vec::new();
    for entry in directory.entries()? {
        let entry = entry?;
        let mut name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
            name.push('/');
        }
        names.push(name);
    }
    Ok(names)
}

/// The message for a failed open: an escape (cap-std's own error, not an
/// OS one) reads like the lexical refusal; anything else names its kind.
fn refusal(requested: &str, verb: &str, error: &io::Error) -> String {
    if error.kind() == io::ErrorKind::PermissionDenied && error.raw_os_error().is_none() {
        return outside(requested);
    }
    format!("cannot {verb} {requested:?}: {}", error.kind())
}

/// A path that names something outside the session's working directory.
#[derive(Debug, thiserror::Error)]
#[error("path {0:?} is outside the session's working directory")]
struct OutsideCwd(String);

fn outside(requested: &str) -> String {
    OutsideCwd(requested.to_owned()).to_string()
}

/// `requested` made relative to the cwd without touching the file system;
/// a path that climbs above it or names another root is refused here,
/// before anything outside is even looked at.
fn lexical(cwd: &Path, requested: &str) -> Result<PathBuf, OutsideCwd> {
    // An absolute path is accepted when it names something under the cwd.
    let relative = Path::new(requested).strip_prefix(cwd).unwrap_or(Path::new(requested));
    let mut lexical = PathBuf::new();
    for component in relative.components() {
        match component {
            Component::Normal(part) => lexical.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                if !lexical.pop() {
                    return Err(OutsideCwd(requested.to_owned()));
                }
            }
            Component::RootDir | Component::Prefix(_) => return Err(OutsideCwd(requested.to_owned())),
        }
    }
    Ok(lexical)
}
