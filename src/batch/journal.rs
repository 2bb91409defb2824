//! A batch's results file (`--out`): a journal that survives the batch's crash.
//!
//! The file is opened for appending and locked (an exclusive `flock`, so a
//! second batch on it is refused). Each result line goes out whole in one
//! append as its run settles, and a thread makes the file durable
//! (`fdatasync`) at most [`SYNC_EVERY`] after a line was written, and once
//! more at the end. A batch that is killed loses at most the runs in flight;
//! a machine that goes down loses at most the last second of lines. Either
//! may leave a torn last line, which `--resume` cuts off before it appends.
//!
//! With `--resume` the file is read first: every line that names an `id`
//! is a settled task (the last line of an id wins), with the hash of the
//! task line it ran and whether it completed.
//!
//! Beside it, `OUT.runs` ([`open_runs`]) records the runs a batch started
//! on a provider that detaches them (`remote`): one line
//! `{"id": TASK, "run": RUN, "task_hash": HASH}` per start, written (and made durable the same
//! way) before the run is started, so a resumed batch attaches to a run
//! still on the broker instead of starting it again. The last line of a
//! task id wins; it is read, truncated and locked with `OUT`.
//!
//! A resumed file is read line by line with a bound ([`resume_line_bound`]),
//! never whole: a line past it is reported and its task runs again. Only a
//! regular file can be read back; a device or pipe (`--out /dev/null`) is
//! written as a stream, opened write-only, neither locked, truncated nor
//! made durable, and refused with `--resume`. A FIFO (`--out` a named
//! pipe, or `/dev/stdout` on a pipe) must have a reader: one that none
//! opens within [`FIFO_READER_GRACE`] is refused, as a closed stdout is,
//! for what was written into it would be lost with the batch's exit; a
//! reader that goes away is a broken pipe, the batch's error.
//!
//! A line that cannot be written whole (a full disk, a closed pipe) is
//! cut back off the file at once, so the file ends with its last whole
//! line, and the error goes back to the batch, which stops: a result that
//! was not written is never counted as written. A failed `fdatasync` (the
//! disk filled after the write was taken) is reported the same way at
//! the next line or at the end.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Deserialize;

use super::tasks::{self, id_key, IdKey};
use super::BatchError;
use crate::files::RESULT_LINE_FLOOR;

/// How long a FIFO named by `--out` or `--trace` may go without a reader before the
/// batch is refused (`subagents fanout … --out fifo & cat fifo` may open
/// it a moment after the batch).
pub(super) const FIFO_READER_GRACE: Duration = Duration::from_secs(3);

/// The longest a written line waits to be made durable.
pub(super) const SYNC_EVERY: Duration = Duration::from_secs(1);

/// The bound on one line of a file read back by `--resume`.
pub fn resume_line_bound(max_line_bytes: u64) -> usize {
    usize::try_from(max_line_bytes.max(RESULT_LINE_FLOOR)).unwrap_or(usize::MAX)
}

/// Passed-over lines of a resumed file named one by one; past this, counted.
const NAMED_OVERLONG_LINES: usize = 10;

/// What an earlier batch settled for one task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Prior {
    /// The hash of the task line it ran (`task_hash`); `None` when the
    /// line's hash is not one we wrote, so it matches no task line.
    pub(super) hash: Option<u64>,
    /// Whether it completed.
    pub(super) completed: bool,
}

/// A line's hash as result lines carry it (`task_hash`).
pub(super) fn hash_text(hash: u64) -> String {
    format!("{hash:016x}")
}

fn parse_hash(text: &str) -> Option<u64> {
    u64::from_str_radix(text, 16).ok().filter(|_| text.len() == 16)
}

/// The results file (or stream), open for appending, and its syncing thread.
pub(super) struct Journal {
    file: Arc<File>,
    /// Bytes of whole lines in the file: where a line that could not be
    /// written whole is cut back to. `None` for a stream.
    length: Option<u64>,
    dirty: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    /// A failed `fdatasync` of the syncing thread, reported at the next line.
    sync_failure: Arc<Mutex<Option<io::Error>>>,
    syncer: Option<std::thread::JoinHandle<()>>,
}

/// The fields of a result line that `--resume` reads; the rest (the
/// output above all) is skipped by the parser, never held.
#[derive(Deserialize)]
struct ResultKeys {
    id: Option<String>,
    task_hash: Option<String>,
    stop_reason: Option<String>,
    /// Stopped by the batch's interruption: not settled.
    #[serde(default)]
    interrupted: bool,
}

/// Opens `path` for a batch: truncated, or with `resume` read for what it
/// settled (a torn last line cut off). Refused when another batch holds it.
pub(super) fn open(
    path: &Path,
    resume: bool,
    max_line_bytes: u64,
) -> Result<(Journal, HashMap<IdKey, Prior>), BatchError> {
    let mut settled = HashMap::new();
    let journal = open_with(path, resume, max_line_bytes, |keys: ResultKeys| {
        let Some(id) = keys.id else { return };
        let (Some(hash), false) = (keys.task_hash, keys.interrupted) else {
            // An interrupted run's line unsettles its task.
            settled.remove(&id_key(&id));
            return;
        };
        let completed = keys.stop_reason.as_deref() == Some("completed");
        settled.insert(id_key(&id), Prior { hash: parse_hash(&hash), completed });
    })?;
    Ok((journal, settled))
}

/// The result lines of an earlier batch's file by task id (the last of an
/// id wins; an interrupted run's line unsettles its id), each line read
/// whole with the bound of [`resume_line_bound`]: what a resumed pipeline
/// hands its steps' templates (the answers only of the ids `read_by_others`
/// names; of the rest, what says how they ended). Read after [`open`] cut
/// a torn last line.
pub(super) fn read_records(
    path: &Path,
    max_line_bytes: u64,
    read_by_others: impl Fn(&str) -> bool,
) -> Result<HashMap<String, serde_json::Value>, BatchError> {
    let io = |source| BatchError::Io { action: "read", path: path.to_owned(), source };
    let mut reader = BufReader::new(File::open(path).map_err(io)?);
    let (mut buffer, mut records) = (Vec::new(), HashMap::new());
    while let Some(line) = tasks::read_line(&mut reader, &mut buffer, resume_line_bound(max_line_bytes)).map_err(io)? {
        if line.overlong || !line.ended {
            continue; // reported by `open`; its task runs again
        }
        let Ok(mut record) = serde_json::from_slice::<serde_json::Value>(&buffer) else { continue };
        let Some(id) = record["id"].as_str().map(str::to_owned) else { continue };
        if !read_by_others(&id) {
            if let Some(fields) = record.as_object_mut() {
                fields.remove("output");
                fields.remove("structured");
            }
        }
        match record["interrupted"] == true {
            true => records.remove(&id),
            false => records.insert(id, record),
        };
    }
    Ok(records)
}

/// The runs journal beside `out` (`OUT.runs`).
pub fn runs_path(out: &Path) -> std::path::PathBuf {
    let mut name = out.as_os_str().to_owned();
    name.push(".runs");
    name.into()
}

/// A run an earlier batch started for a task (a line of `OUT.runs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Recorded {
    /// The run's id on its provider.
    pub(super) run: String,
    /// The hash of the task line it ran (`task_hash`).
    pub(super) hash: Option<u64>,
}

#[derive(Deserialize)]
struct RunKeys {
    id: String,
    run: String,
    task_hash: String,
}

/// Opens the runs journal at `path` like [`open`]: with `resume`, the run
/// each task id last started.
pub(super) fn open_runs(
    path: &Path,
    resume: bool,
    max_line_bytes: u64,
) -> Result<(Journal, HashMap<IdKey, Recorded>), BatchError> {
    let mut runs = HashMap::new();
    let journal = open_with(path, resume, max_line_bytes, |keys: RunKeys| {
        runs.insert(id_key(&keys.id), Recorded { run: keys.run, hash: parse_hash(&keys.task_hash) });
    })?;
    Ok((journal, runs))
}

/// Opens, locks, then reads every whole line (with `resume`) or truncates.
/// What is not a regular file is a stream: written, never read back.
fn open_with<K: for<'de> Deserialize<'de>>(
    path: &Path,
    resume: bool,
    max_line_bytes: u64,
    each: impl FnMut(K),
) -> Result<Journal, BatchError> {
    let io = |action, source| BatchError::Io { action, path: path.to_owned(), source };
    // A stream is opened for writing alone: opened to read too, a pipe
    // would have its own reader and take lines that no one reads.
    let stream = std::fs::metadata(path).is_ok_and(|metadata| !metadata.is_file());
    let file = match stream {
        true => None,
        false => Some(OpenOptions::new().read(true).append(true).create(true).open(path).map_err(|e| io("open", e))?),
    };
    let regular = match &file {
        Some(file) => file.metadata().map_err(|e| io("read", e))?.is_file(),
        None => false,
    };
    if !regular {
        if resume {
            let why = "a resumed batch reads its results back, and this is not a regular file";
            return Err(BatchError::NotAFile { path: path.to_owned(), why });
        }
        let file = open_stream(path)?;
        let failure = Arc::new(Mutex::new(None));
        let (dirty, stop) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        return Ok(Journal { file: Arc::new(file), length: None, dirty, stop, sync_failure: failure, syncer: None });
    }
    let file = file.expect("a regular file was opened");
    if let Err(error) = file.try_lock() {
        return Err(match error {
            std::fs::TryLockError::WouldBlock => BatchError::Locked(path.to_owned()),
            std::fs::TryLockError::Error(e) => io("lock", e),
        });
    }
    let length = match resume {
        true => read_whole_lines(&file, path, resume_line_bound(max_line_bytes), each).map_err(|e| io("read", e))?,
        false => {
            file.set_len(0).map_err(|e| io("truncate", e))?;
            0
        }
    };
    let (file, dirty, stop) = (Arc::new(file), Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let sync_failure = Arc::new(Mutex::new(None));
    let syncer = {
        let (file, dirty, stop, failure) = (file.clone(), dirty.clone(), stop.clone(), sync_failure.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                std::thread::park_timeout(SYNC_EVERY);
                if dirty.swap(false, Ordering::AcqRel) {
                    if let Err(error) = file.sync_data() {
                        failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get_or_insert(error);
                    }
                }
            }
        })
    };
    Ok(Journal { file, length: Some(length), dirty, stop, sync_failure, syncer: Some(syncer) })
}

/// Opens a device or pipe for writing; a FIFO only once a reader has it
/// open (within 3 s, else [`BatchError::NoReader`]), never
/// waiting for one for ever. `fanout --trace` opens a FIFO with it too.
pub fn open_stream(path: &Path) -> Result<File, BatchError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
    let io = |action, source| BatchError::Io { action, path: path.to_owned(), source };
    let fifo = std::fs::metadata(path).is_ok_and(|metadata| metadata.file_type().is_fifo());
    if !fifo {
        return OpenOptions::new().append(true).open(path).map_err(|e| io("open", e));
    }
    // Opened without waiting, a FIFO with no reader is ENXIO.
    let deadline = std::time::Instant::now() + FIFO_READER_GRACE;
    let probe = loop {
        match OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(path) {
            Ok(probe) => break probe,
            Err(error) if error.raw_os_error() == Some(libc::ENXIO) => {
                if std::time::Instant::now() >= deadline {
                    return Err(BatchError::NoReader { path: path.to_owned(), waited: FIFO_READER_GRACE });
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(error) => return Err(io("open", error)),
        }
    };
    // A reader has it: opened again to block on a full pipe as a stream
    // should (the crate has no `unsafe` for fcntl), this open returns at
    // once while the probe holds the pipe open.
    let file = OpenOptions::new().write(true).open(path).map_err(|e| io("open", e))?;
    let (probed, opened) = (probe.metadata().map_err(|e| io("read", e))?, file.metadata().map_err(|e| io("read", e))?);
    if (probed.dev(), probed.ino()) != (opened.dev(), opened.ino()) {
        let why = "it was replaced while it was being opened";
        return Err(BatchError::NotAFile { path: path.to_owned(), why });
    }
    Ok(file)
}

/// Hands the keys of every whole line of an earlier batch's file to
/// `each`, at most `max_bytes` a line (a longer one is reported and
/// passed over); a last line without its newline (torn by a crash) is cut
/// off, so the next append starts clean. Answers the length kept.
fn read_whole_lines<K: for<'de> Deserialize<'de>>(
    file: &File,
    path: &Path,
    max_bytes: usize,
    mut each: impl FnMut(K),
) -> io::Result<u64> {
    let mut reader = BufReader::new(file);
    reader.seek(SeekFrom::Start(0))?;
    let (mut buffer, mut whole, mut number, mut overlong) = (Vec::new(), 0u64, 0usize, 0usize);
    while let Some(line) = tasks::read_line(&mut reader, &mut buffer, max_bytes)? {
        if !line.ended {
            break; // torn: everything before it is whole
        }
        (whole, number) = (whole + line.bytes, number + 1);
        if line.overlong {
            overlong += 1;
            if overlong <= NAMED_OVERLONG_LINES {
                tracing::warn!(
                    "{}:{number}: longer than the {max_bytes} bytes a resumed line may be: its task runs again",
                    path.display()
                );
            }
            continue;
        }
        if let Ok(keys) = serde_json::from_slice::<K>(&buffer) {
            each(keys);
        }
    }
    if overlong > NAMED_OVERLONG_LINES {
        tracing::warn!("{}: {} more lines passed over as too long", path.display(), overlong - NAMED_OVERLONG_LINES);
    }
    if whole < file.metadata()?.len() {
        file.set_len(whole)?;
    }
    Ok(whole)
}

impl Journal {
    /// Appends one whole line (`bytes` ends with its newline) in one
    /// write. A line written in part is cut back off, so the file ends with
    /// a whole line, and the error returned; so is a failed sync since the
    /// last line.
    pub(super) fn write_line(&mut self, bytes: &[u8]) -> io::Result<()> {
        if let Some(error) = self.sync_failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() {
            return Err(error);
        }
        match (&*self.file).write_all(bytes) {
            Ok(()) => {
                if let Some(length) = &mut self.length {
                    *length += bytes.len() as u64;
                    self.dirty.store(true, Ordering::Release);
                }
                Ok(())
            }
            Err(error) => {
                if let Some(length) = self.length {
                    let _ = self.file.set_len(length);
                }
                Err(error)
            }
        }
    }

    /// Whether the journal is a regular file (else a stream).
    pub(super) fn is_file(&self) -> bool {
        self.length.is_some()
    }

    /// Makes every line written so far durable (a stream: nothing to do).
    pub(super) fn sync(&self) -> io::Result<()> {
        if let Some(error) = self.sync_failure.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() {
            return Err(error);
        }
        match self.length {
            Some(_) => self.file.sync_data(),
            None => Ok(()),
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(syncer) = self.syncer.take() {
            syncer.thread().unpark();
            let _ = syncer.join();
            let _ = self.file.sync_data();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_BOUND: u64 = 1024;

    #[test]
    fn a_resumed_file_keeps_its_whole_lines_cuts_a_torn_one_and_the_last_line_of_an_id_wins() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let lines = [
            r#"{"id":"a","task_hash":"0000000000000001","stop_reason":"error"}"#,
            r#"{"id":"b","task_hash":"0000000000000002","stop_reason":"completed"}"#,
            r#"{"id":"a","task_hash":"0000000000000001","stop_reason":"completed"}"#,
            r#"{"line":4,"stop_reason":"completed"}"#,
            r#"{"id":"d","task_hash":"0000000000000004","stop_reason":"completed"}"#,
            r#"{"id":"d","task_hash":"0000000000000004","stop_reason":"aborted","interrupted":true}"#,
        ];
        std::fs::write(&path, format!("{}\n{{\"id\":\"c\",\"task_ha", lines.join("\n"))).unwrap();
        let (mut journal, settled) = open(&path, true, NO_BOUND).unwrap();
        assert_eq!(settled.len(), 2, "an interrupted line unsettles its task: {settled:?}");
        assert!(settled[&id_key("a")].completed && settled[&id_key("b")].completed);
        assert_eq!(settled[&id_key("b")].hash, Some(2));
        journal
            .write_line(b"{\"id\":\"c\",\"task_hash\":\"0000000000000003\",\"stop_reason\":\"completed\"}\n")
            .unwrap();
        // A second batch on the same file is refused while this one holds it.
        assert!(matches!(open(&path, true, NO_BOUND).err().unwrap(), BatchError::Locked(_)));
        drop(journal);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.lines().all(|line| serde_json::from_str::<serde_json::Value>(line).is_ok()), "{text}");
        let (_, settled) = open(&path, true, NO_BOUND).unwrap();
        assert_eq!(settled.len(), 3);
        let (_, settled) = open(&path, false, NO_BOUND).unwrap();
        assert!(settled.is_empty() && std::fs::read(&path).unwrap().is_empty(), "without resume it starts empty");
    }

    #[test]
    fn the_runs_journal_maps_each_task_to_the_run_it_last_started() {
        let dir = tempfile::tempdir().unwrap();
        let path = runs_path(&dir.path().join("out.jsonl"));
        assert!(path.ends_with("out.jsonl.runs"));
        let lines = [
            r#"{"id":"a","run":"r1","task_hash":"0000000000000001"}"#,
            r#"{"id":"a","run":"r2","task_hash":"0000000000000001"}"#,
        ];
        std::fs::write(&path, format!("{}\n{}\n{{\"id\":\"b\",\"ru", lines[0], lines[1])).unwrap();
        let (_, runs) = open_runs(&path, true, NO_BOUND).unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[&id_key("a")].run, "r2", "the last start of a task wins; the torn line is cut");
    }
}
