//! A batch's tasks file: one JSON object per line, read lazily.
//!
//! [`TaskLines`] turns any buffered reader into a stream of [`Line`]s, one
//! per non-blank line: a [`Task`] to run, or the reason the line is skipped.
//! A line is skipped, never fatal, when it is not UTF-8, not JSON, not a JSON
//! object (serde would read `["prompt"]` as a struct), has unknown or
//! mistyped fields, or is longer than the cap. An overlong line is never
//! held: past the cap its bytes are read and dropped until its newline, so
//! memory stays at one cap per line however the file was written.
//!
//! ```text
//! {"prompt": "review the parser", "label": "parser"}   → Line::Task
//! ["prompt"]                                            → Line::Skipped (not a JSON object)
//! ```

use std::io::{self, BufRead};

pub use crate::files::{read_line, RawLine};

use serde::Deserialize;
use serde_json::Value;

/// The longest line read by default (`--max-line-bytes`).
pub const DEFAULT_MAX_LINE_BYTES: u64 = 1024 * 1024;

/// One task line.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Task {
    /// What the run is asked.
    pub prompt: String,
    /// A label for the run (events, the tree, its result line).
    #[serde(default)]
    pub label: Option<String>,
    /// The persona the run takes, where its provider supports one.
    #[serde(default)]
    pub persona: Option<String>,
    /// The JSON Schema the run's structured output must match.
    #[serde(default)]
    pub output_schema: Option<Value>,
    /// The deepest delegation below the run.
    #[serde(default)]
    pub max_depth: Option<u32>,
    /// This task's own delegation budget (`{"depth"?, "width"?, "runs"?,
    /// "tokens"?, "deadline_ms"?}`), on top of the batch's.
    #[serde(default, deserialize_with = "budget_object")]
    pub budget: Option<crate::Budget>,
    /// The provider to run this task on (default: the batch's `--provider`).
    #[serde(default)]
    pub provider: Option<String>,
    /// The task's id in the results (default: its line number and a hash
    /// of the line, see [`task_id`]).
    #[serde(default)]
    pub id: Option<String>,
    /// How long the run may take (`500ms`, `10m`; default `--timeout`).
    #[serde(default, deserialize_with = "timeout_text")]
    pub timeout: Option<std::time::Duration>,
    /// The ids of the tasks this one waits for: a line that says it (even
    /// `[]`) is a pipeline step; see [`pipeline`](super::pipeline).
    #[serde(default)]
    pub after: Option<Vec<String>>,
    /// A template naming a list of an earlier result: one run per element
    /// (`{{item}}`, `{{index}}` in the prompt).
    #[serde(default)]
    pub for_each: Option<String>,
    /// The most elements a `for_each` runs (default
    /// [`DEFAULT_MAX_ITEMS`](super::pipeline::DEFAULT_MAX_ITEMS)).
    #[serde(default)]
    pub max_items: Option<usize>,
    /// The field of each `for_each` element that names its run
    /// (`fix[parser]`), instead of its index (`fix[0]`).
    #[serde(default)]
    pub key: Option<String>,
    /// What this task does when a task it waits for did not complete.
    #[serde(default)]
    pub on_failure: OnFailure,
}

/// What a pipeline step does when a step it waits for did not complete.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum OnFailure {
    /// It does not run: its result line says `"skipped"` and why.
    #[default]
    Skip,
    /// It runs, the failures visible to its template.
    Continue,
}

impl Task {
    /// Whether the task is a pipeline step (it waits for others or maps
    /// over an earlier result): such a line needs the whole file checked
    /// before any run.
    pub fn is_step(&self) -> bool {
        self.after.is_some() || self.for_each.is_some()
    }
}

/// A task's `timeout`: a duration with its unit, more than zero.
fn timeout_text<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<std::time::Duration>, D::Error> {
    use serde::de::Error;
    match Option::<String>::deserialize(deserializer)? {
        None => Ok(None),
        Some(text) => crate::config::parse_positive_duration(&text).map(Some).map_err(D::Error::custom),
    }
}

/// A task's id: its own `id`, else `L<line>-<hash>` (the line number and
/// the first 12 hex digits of the line's hash), so an unchanged file gives
/// every line the same id on every run.
pub fn task_id(task: &Task, number: usize, hash: u64) -> String {
    match &task.id {
        Some(id) => id.clone(),
        None => format!("L{number}-{:012x}", hash >> 16),
    }
}

/// A task id as a batch keeps it: 128 bits of two keyed hashes of it, so
/// that a file of long ids costs a batch 16 bytes an id, not the ids. Only
/// compared within one process (never written).
pub(super) type IdKey = u128;

/// The [`IdKey`] of `id`.
pub(super) fn id_key(id: &str) -> IdKey {
    use std::hash::{Hash, Hasher};
    let half = |salt: u8| {
        let mut hasher = std::hash::DefaultHasher::new();
        (salt, id).hash(&mut hasher);
        hasher.finish()
    };
    (u128::from(half(0)) << 64) | u128::from(half(1))
}

/// The first line of each task's own `id`: a later line naming the same id
/// is skipped, by the batch and by `--resume`'s check of the file alike.
#[derive(Debug, Default)]
pub(super) struct FirstLines(std::collections::HashMap<IdKey, usize>);

impl FirstLines {
    /// Whether line `number` runs its task: `Err(first)` when the task
    /// names its own id and line `first` named it before.
    pub(super) fn claim(&mut self, task: &Task, id: &str, number: usize) -> Result<(), usize> {
        if task.id.is_none() {
            return Ok(()); // line numbers are unique
        }
        match self.0.entry(id_key(id)) {
            std::collections::hash_map::Entry::Occupied(first) if *first.get() != number => Err(*first.get()),
            std::collections::hash_map::Entry::Occupied(_) => Ok(()),
            std::collections::hash_map::Entry::Vacant(entry) => {
                entry.insert(number);
                Ok(())
            }
        }
    }
}

/// The hash of a line's content (64-bit FNV-1a of its bytes, surrounding
/// whitespace not counted): what `--resume` compares to tell a changed
/// line. Stable across builds and machines.
pub fn content_hash(bytes: &[u8]) -> u64 {
    let trimmed = bytes.trim_ascii();
    trimmed.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3))
}

/// A task's `budget`: a JSON object only (serde would read `[0]` by
/// position, as a depth of 0), each limit at least 1.
fn budget_object<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<crate::Budget>, D::Error> {
    use serde::de::Error;
    let value = Value::deserialize(deserializer)?;
    if value.is_null() {
        return Ok(None);
    }
    if !value.is_object() {
        return Err(D::Error::custom("budget must be an object such as {\"runs\": 10}"));
    }
    let budget: crate::Budget = serde_json::from_value(value).map_err(D::Error::custom)?;
    let zero = [budget.depth.map(u64::from), budget.width.map(u64::from), budget.runs, budget.tokens]
        .contains(&Some(0))
        || budget.deadline.is_some_and(|deadline| deadline.is_zero());
    if zero {
        return Err(D::Error::custom("a budget limit of 0 admits no run: give at least 1"));
    }
    Ok(Some(budget))
}

/// What one non-blank line of the file holds; `number` counts from 1.
#[derive(Debug)]
pub enum Line {
    /// A task, with the [`content_hash`] of its line.
    Task {
        /// The line's number, from 1.
        number: usize,
        /// The task.
        task: Box<Task>,
        /// The [`content_hash`] of the line.
        hash: u64,
    },
    /// A line that is not a task.
    Skipped {
        /// The line's number, from 1.
        number: usize,
        /// Why it is not a task.
        why: String,
    },
}

/// The lines of a tasks file, each at most `max_bytes` long (newline not
/// counted). Yields an `Err` when reading fails, and nothing after it.
#[derive(Debug)]
pub struct TaskLines<R> {
    reader: R,
    max_bytes: usize,
    number: usize,
    buffer: Vec<u8>,
    failed: bool,
}

impl<R: BufRead> TaskLines<R> {
    /// The lines of `reader`, each at most `max_bytes` long.
    pub fn new(reader: R, max_bytes: u64) -> Self {
        let max_bytes = usize::try_from(max_bytes).unwrap_or(usize::MAX);
        TaskLines { reader, max_bytes, number: 0, buffer: Vec::new(), failed: false }
    }
}

impl<R: io::Read> TaskLines<io::BufReader<R>> {
    /// Whether bytes were read and not yet taken: the next line may come
    /// without a `read` (and so without waiting on a pipe).
    pub(crate) fn has_buffered(&self) -> bool {
        !self.reader.buffer().is_empty()
    }
}

impl<R: BufRead> Iterator for TaskLines<R> {
    type Item = io::Result<Line>;

    fn next(&mut self) -> Option<Self::Item> {
        while !self.failed {
            let raw = match read_line(&mut self.reader, &mut self.buffer, self.max_bytes) {
                Ok(raw) => raw?,
                Err(error) => {
                    self.failed = true;
                    return Some(Err(error));
                }
            };
            self.number += 1;
            let number = self.number;
            let parsed = match raw.overlong {
                true => Err(format!("longer than the {} bytes --max-line-bytes allows", self.max_bytes)),
                false => parse(&self.buffer),
            };
            match parsed {
                Ok(Some(task)) => {
                    let hash = content_hash(&self.buffer);
                    return Some(Ok(Line::Task { number, task: Box::new(task), hash }));
                }
                Ok(None) => {} // a blank line
                Err(why) => return Some(Ok(Line::Skipped { number, why })),
            }
        }
        None
    }
}

/// A task, `None` for a blank line, or why the line cannot be one.
fn parse(bytes: &[u8]) -> Result<Option<Task>, String> {
    let text = std::str::from_utf8(bytes)
        .map_err(|error| format!("not UTF-8 (an invalid byte at column {})", error.valid_up_to() + 1))?;
    if text.trim().is_empty() {
        return Ok(None);
    }
    let value: Value = serde_json::from_str(text).map_err(|error| error.to_string())?;
    let kind = match &value {
        Value::Object(_) => None,
        Value::Array(_) => Some("an array"),
        Value::String(_) => Some("a string"),
        Value::Number(_) => Some("a number"),
        Value::Bool(_) => Some("a boolean"),
        Value::Null => Some("null"),
    };
    if let Some(kind) = kind {
        return Err(format!("not a JSON object but {kind}"));
    }
    Task::deserialize(value).map(Some).map_err(|error| error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(bytes: &[u8], max: u64) -> Vec<String> {
        // A tiny buffer, so lines straddle refills.
        let reader = io::BufReader::with_capacity(4, bytes);
        TaskLines::new(reader, max)
            .map(|line| match line.unwrap() {
                Line::Task { number, task, .. } => format!("{number}: {}", task.prompt),
                Line::Skipped { number, why } => format!("{number}: skipped: {why}"),
            })
            .collect()
    }

    #[test]
    fn tasks_come_numbered_and_blank_lines_are_passed_over() {
        let read = lines(b"{\"prompt\": \"a\"}\n\n  \n{\"prompt\": \"b\"}", 100);
        assert_eq!(read, ["1: a", "4: b"]);
    }

    #[test]
    fn bad_utf8_non_objects_unknown_fields_and_long_lines_are_skipped_with_their_reason() {
        let read = lines(
            b"{\"prompt\": \"\xff\"}\n[\"prompt\"]\n3\n{\"prompt\": \"x\", \"extra\": 1}\n{\"prompt\": \"0123456789abcdefghij\"}\n{\"prompt\": \"ok\"}\n",
            30,
        );
        assert_eq!(read.len(), 6, "{read:?}");
        assert!(read[0].starts_with("1: skipped: not UTF-8"), "{read:?}");
        assert_eq!(read[1], "2: skipped: not a JSON object but an array");
        assert_eq!(read[2], "3: skipped: not a JSON object but a number");
        assert!(read[3].starts_with("4: skipped: unknown field `extra`"), "{read:?}");
        assert_eq!(read[4], "5: skipped: longer than the 30 bytes --max-line-bytes allows");
        assert_eq!(read[5], "6: ok");
    }

    #[test]
    fn a_line_exactly_at_the_cap_is_read_and_one_byte_more_is_not() {
        let at_cap = b"{\"prompt\": \"abc\"}"; // 17 bytes
        let read = lines(&[&at_cap[..], b"\n", &at_cap[..], b" \n"].concat(), 17);
        assert_eq!(read, ["1: abc", "2: skipped: longer than the 17 bytes --max-line-bytes allows"]);
    }

    #[test]
    fn a_read_error_ends_the_lines() {
        struct Broken;
        impl io::Read for Broken {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(io::Error::other("disk on fire"))
            }
        }
        let mut read = TaskLines::new(io::BufReader::new(Broken), 10);
        assert!(read.next().unwrap().is_err());
        assert!(read.next().is_none());
    }
}
