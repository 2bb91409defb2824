//! The values a table's strings stand for, resolved the same way for
//! providers and MCP servers: `${VAR}` from the environment, and a command
//! as the child will be started.

use std::ops::Range;
use std::path::{Path, PathBuf};

use super::{ConfigError, Source};

/// Replaces each `${VAR}` in `text` by that environment variable.
pub(super) fn expand(source: &Source<'_>, text: &str, span: Range<usize>) -> Result<String, ConfigError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| source.error(Some(span.clone()), format!("`${{` without a closing `}}` in {text:?}")))?;
        let name = &after[..end];
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(source.error(Some(span.clone()), format!("`${{{name}}}` is not an environment variable name")));
        }
        match std::env::var(name) {
            Ok(value) => out.push_str(&value),
            Err(_) => {
                return Err(source.error(Some(span.clone()), format!("${{{name}}} is not set in the environment")))
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `command` as the child will be started: a path that exists, or a name
/// found on `PATH`.
pub(super) fn find_command(command: &str) -> Option<PathBuf> {
    let path = Path::new(command);
    if command.contains('/') {
        return path.is_file().then(|| path.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?).map(|dir| dir.join(command)).find(|candidate| candidate.is_file())
}
