//! What one configuration file may hold: every bound a hostile file meets,
//! in one place, so memory and time stay bounded whatever the file says.
//!
//! A configuration is read by every front door before anything starts, and
//! it may come from anywhere `--config` or `$SUBAGENTS_CONFIG` points: a
//! device that never ends (`/dev/zero`), a FIFO nobody writes, a generated
//! file of a hundred thousand tables, a chain of wrappers thousands deep.
//! Each bound below is checked before the work it bounds, and a file past
//! one is refused with its place and the bound, never read on until memory
//! or the stack runs out.
//!
//! | bound | what it keeps finite |
//! |---|---|
//! | [`MAX_FILE_BYTES`] (4 MiB) | memory: a file is a regular file, and its size is checked before it is read |
//! | [`MAX_ENTRIES`] (1,000) | `[providers]`, `[models]` and `[mcp_servers]` tables, each: the time the checks and the builds take |
//! | [`MAX_NAME_BYTES`] (64) | a table's name: it goes into tables, paths and tool names |
//! | [`MAX_WRAPS_DEPTH`] (16) | a chain of `chaos` wrappers: each layer is a call deeper on the stack of every run |
//!
//! ```
//! use subagents::config::{Config, MAX_NAME_BYTES};
//!
//! let name = "n".repeat(MAX_NAME_BYTES + 1);
//! let text = format!("[providers.{name}]\nkind = \"mock\"\n");
//! let error = Config::parse(&text, "example.toml").unwrap_err();
//! assert!(error.to_string().starts_with("example.toml:1:1: "), "{error}");
//! ```

use std::io::Read;
use std::path::Path;

use indexmap::IndexMap;
use toml::Spanned;

use super::{ConfigError, Source};

/// The largest file read, in bytes: a hand-written file is a few KiB.
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// The most tables of each of `[providers]`, `[models]` and `[mcp_servers]`.
pub const MAX_ENTRIES: usize = 1_000;

/// The longest name of a provider, a route or an MCP server, in bytes.
pub const MAX_NAME_BYTES: usize = 64;

/// The most `chaos` providers one chain of `wraps` goes through.
pub const MAX_WRAPS_DEPTH: usize = 16;

/// The text of the file at `path`, refused before anything is read when it
/// is not a regular file (a device never ends, a FIFO may never open) or
/// is larger than [`MAX_FILE_BYTES`]; `Err` says why, without the place.
pub(super) fn read_file(path: &Path) -> Result<String, String> {
    let cannot = |why: String| format!("cannot read it: {why}");
    let failed = |error: std::io::Error| cannot(error.to_string());
    // Checked before it is opened: opening a FIFO waits for a writer.
    regular(&std::fs::metadata(path).map_err(failed)?).map_err(cannot)?;
    let file = std::fs::File::open(path).map_err(failed)?;
    // It may have been replaced since: what was opened is checked again,
    // and read no further than the bound.
    regular(&file.metadata().map_err(failed)?).map_err(cannot)?;
    let mut text = String::new();
    file.take(MAX_FILE_BYTES + 1).read_to_string(&mut text).map_err(failed)?;
    size(text.len() as u64).map_err(cannot)?;
    Ok(text)
}

/// A regular file within [`MAX_FILE_BYTES`].
fn regular(metadata: &std::fs::Metadata) -> Result<(), String> {
    match crate::files::kind_of(metadata.file_type()) {
        None => size(metadata.len()),
        Some(what) => Err(format!("it is {what}, not a regular file")),
    }
}

/// `bytes` of text, within [`MAX_FILE_BYTES`].
fn size(bytes: u64) -> Result<(), String> {
    match bytes > MAX_FILE_BYTES {
        true => Err(format!("it is larger than {} MiB", MAX_FILE_BYTES / (1024 * 1024))),
        false => Ok(()),
    }
}

/// A text handed to [`Config::parse`](super::Config::parse) directly meets
/// the file's bound too.
pub(super) fn check_text(source: &Source<'_>) -> Result<(), ConfigError> {
    size(source.text.len() as u64).map_err(|why| source.error(None, why))
}

/// At most [`MAX_ENTRIES`] tables in `[section]`, each named within
/// [`MAX_NAME_BYTES`]; `what` is what one table defines ("provider").
pub(super) fn check_tables<T>(
    source: &Source<'_>,
    section: &str,
    what: &str,
    tables: &IndexMap<String, Spanned<T>>,
) -> Result<(), ConfigError> {
    if let Some((_, past)) = tables.get_index(MAX_ENTRIES) {
        let message = format!("more than {MAX_ENTRIES} [{section}] tables: a file holds at most {MAX_ENTRIES}");
        return Err(source.error(Some(past.span()), message));
    }
    for (name, table) in tables {
        if name.len() > MAX_NAME_BYTES {
            let message = format!("{what} name {} is {} bytes: at most {MAX_NAME_BYTES}", quoted(name), name.len());
            return Err(source.error(Some(table.span()), message));
        }
    }
    Ok(())
}

/// A name the file wrote, quoted for a message: cut after
/// [`MAX_NAME_BYTES`] (no name that long exists), so one line stays one
/// readable line.
pub(super) fn quoted(name: &str) -> String {
    match name.len() > MAX_NAME_BYTES {
        true => format!("{:?}…", crate::seam::cut(name, MAX_NAME_BYTES)),
        false => format!("{name:?}"),
    }
}
