//! Built-in tools confined to the session's working directory.
//!
//! A path is resolved against the cwd and refused when it escapes it: first
//! lexically (so nothing outside is even looked at), then after resolving
//! symbolic links.

use std::path::{Component, Path, PathBuf};

use futures_util::future::BoxFuture;
use serde_json::{json, Value};

use super::{Tool, ToolContext, ToolOutput, ToolSpec};

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

    fn concurrent(&self) -> bool {
        true
    }

    fn call(&self, arguments: Value, context: ToolContext) -> BoxFuture<'_, ToolOutput> {
        Box::pin(async move {
            let requested = arguments["path"].as_str().unwrap_or_default().to_owned();
            let path = match confine(&context.cwd, &requested).await {
                Ok(path) => path,
                Err(message) => return ToolOutput::error(message),
            };
            match tokio::fs::read(&path).await {
                Ok(bytes) => {
                    let cut = bytes.len() > READ_LIMIT;
                    let mut text = String::from_utf8_lossy(&bytes[..bytes.len().min(READ_LIMIT)]).into_owned();
                    if cut {
                        text.push_str(&format!("\n[truncated: the file has {} bytes]", bytes.len()));
                    }
                    ToolOutput::ok(text)
                }
                Err(error) => ToolOutput::error(format!("cannot read {requested:?}: {}", error.kind())),
            }
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

    fn concurrent(&self) -> bool {
        true
    }

    fn call(&self, arguments: Value, context: ToolContext) -> BoxFuture<'_, ToolOutput> {
        Box::pin(async move {
            let requested = arguments["path"].as_str().unwrap_or(".").to_owned();
            let path = match confine(&context.cwd, &requested).await {
                Ok(path) => path,
                Err(message) => return ToolOutput::error(message),
            };
            let mut entries = match tokio::fs::read_dir(&path).await {
                Ok(entries) => entries,
                Err(error) => return ToolOutput::error(format!("cannot list {requested:?}: {}", error.kind())),
            };
            let mut names = Vec::new();
            while let Ok(Some(entry)) = entries.next_entry().await {
                let mut name = entry.file_name().to_string_lossy().into_owned();
                if entry.file_type().await.is_ok_and(|t| t.is_dir()) {
                    name.push('/');
                }
                names.push(name);
            }
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

/// Resolves `requested` under `cwd`, refusing any path that leaves it.
async fn confine(cwd: &Path, requested: &str) -> Result<PathBuf, String> {
    let escapes = || format!("path {requested:?} is outside the session's working directory");
    // An absolute path is accepted when it names something under the cwd.
    let relative = Path::new(requested).strip_prefix(cwd).unwrap_or(Path::new(requested));
    let mut lexical = PathBuf::new();
    for component in relative.components() {
        match component {
            Component::Normal(part) => lexical.push(part),
            Component::CurDir => {}
            Component::ParentDir => {
                if !lexical.pop() {
                    return Err(escapes());
                }
            }
            Component::RootDir | Component::Prefix(_) => return Err(escapes()),
        }
    }
    let root = tokio::fs::canonicalize(cwd).await.map_err(|_| "the session's working directory is unavailable")?;
    let resolved = tokio::fs::canonicalize(root.join(&lexical))
        .await
        .map_err(|error| format!("cannot open {requested:?}: {}", error.kind()))?;
    if !resolved.starts_with(&root) {
        return Err(escapes());
    }
    Ok(resolved)
}
