//! The values a table's strings stand for, resolved the same way for
//! providers, routes and MCP servers: `${VAR}` from the environment, a
//! command as the child will be started, a directory as it will be made,
//! URLs and headers as an HTTP client will send them.

use std::ops::Range;
use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use toml::Spanned;

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

/// Why `path` cannot be a directory when one is made there (`create_dir_all`,
/// as a run directory's root is): it, or the nearest of its ancestors that
/// exists, is something else. `None` when it is one or can become one.
pub(super) fn not_a_directory(path: &Path) -> Option<String> {
    let existing = path.ancestors().find(|ancestor| ancestor.symlink_metadata().is_ok())?;
    match existing.is_dir() {
        true => None,
        false if existing == path => Some(format!("{path:?} is not a directory")),
        false => Some(format!("{path:?} cannot be made a directory: {existing:?} is not a directory")),
    }
}

/// The value of `key` at `span`, `${VAR}`-expanded, as a URL an HTTP
/// client takes: `http://` or `https://`, and no space or control
/// character (a newline from a variable would end the request line).
pub(super) fn http_url(source: &Source<'_>, key: &str, value: &Spanned<String>) -> Result<String, ConfigError> {
    let url = expand(source, value.get_ref(), value.span())?;
    let problem = if !(url.starts_with("http://") || url.starts_with("https://")) {
        format!("`{key}` must start with http:// or https:// (it is {url:?})")
    } else if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        format!("`{key}` has a space or a control character, which no URL carries")
    } else {
        return Ok(url);
    };
    Err(source.error(Some(value.span()), problem))
}

/// `headers`, each value `${VAR}`-expanded, each pair refused at its value
/// when `problem` finds one (the name a token, the value one line of
/// visible text, and whatever the protocol adds); the values themselves
/// (tokens, often) are never shown.
pub(super) fn http_headers(
    source: &Source<'_>,
    headers: &IndexMap<String, Spanned<String>>,
    problem: impl Fn(&str, &str) -> Option<String>,
) -> Result<Vec<(String, String)>, ConfigError> {
    let mut expanded = Vec::with_capacity(headers.len());
    for (name, value) in headers {
        let text = expand(source, value.get_ref(), value.span())?;
        if let Some(problem) = problem(name, &text) {
            return Err(source.error(Some(value.span()), format!("`headers`: {problem}")));
        }
        expanded.push((name.clone(), text));
    }
    Ok(expanded)
}

/// The `url` and `headers` the file writes out in full (no `${VAR}`),
/// checked as [`http_url`] and [`http_headers`] check them: their faults
/// are the file's, found when it is read; the others wait for the
/// environment.
pub(super) fn check_written_http(
    source: &Source<'_>,
    url: Option<&Spanned<String>>,
    headers: Option<&IndexMap<String, Spanned<String>>>,
    problem: impl Fn(&str, &str) -> Option<String>,
) -> Result<(), ConfigError> {
    let written = |value: &Spanned<String>| !value.get_ref().contains("${");
    if let Some(url) = url.filter(|url| written(url)) {
        http_url(source, "url", url)?;
    }
    let literal: IndexMap<String, Spanned<String>> = headers
        .into_iter()
        .flatten()
        .filter(|(_, value)| written(value))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    http_headers(source, &literal, problem).map(drop)
}
