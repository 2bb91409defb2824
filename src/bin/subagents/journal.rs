//! `fanout --out FILE`: a results file that survives the batch's crash.
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

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

/// The longest a written line waits to be made durable.
pub const SYNC_EVERY: Duration = Duration::from_secs(1);

/// What an earlier batch settled for one task id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prior {
    /// The hash of the task line it ran (`task_hash`).
    pub hash: String,
    /// Whether it completed.
    pub completed: bool,
}

/// The results file, open for appending, and its syncing thread.
pub struct Journal {
    file: Arc<File>,
    dirty: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    syncer: Option<std::thread::JoinHandle<()>>,
}

/// Opens `path` for a batch: truncated, or with `resume` read for what it
/// settled (a torn last line cut off). Refused when another batch holds it.
pub fn open(path: &Path, resume: bool) -> Result<(Journal, HashMap<String, Prior>), String> {
    let mut settled = HashMap::new();
    let journal = open_with(path, resume, |record| {
        if let (Some(id), Some(hash)) = (record["id"].as_str(), record["task_hash"].as_str()) {
            let completed = record["stop_reason"] == "completed";
            settled.insert(id.to_owned(), Prior { hash: hash.to_owned(), completed });
        }
    })?;
    Ok((journal, settled))
}

/// The runs journal beside `out` (`OUT.runs`).
pub fn runs_path(out: &Path) -> std::path::PathBuf {
    let mut name = out.as_os_str().to_owned();
    name.push(".runs");
    name.into()
}

/// A run an earlier batch started for a task (a line of `OUT.runs`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// The run's id on its provider.
    pub run: String,
    /// The hash of the task line it ran (`task_hash`).
    pub hash: String,
}

/// Opens the runs journal at `path` like [`open`]: with `resume`, the run
/// each task id last started.
pub fn open_runs(path: &Path, resume: bool) -> Result<(Journal, HashMap<String, Recorded>), String> {
    let mut runs = HashMap::new();
    let journal = open_with(path, resume, |record| {
        if let (Some(id), Some(run), Some(hash)) =
            (record["id"].as_str(), record["run"].as_str(), record["task_hash"].as_str())
        {
            runs.insert(id.to_owned(), Recorded { run: run.to_owned(), hash: hash.to_owned() });
        }
    })?;
    Ok((journal, runs))
}

/// Opens, locks, then reads every whole line (with `resume`) or truncates.
fn open_with(path: &Path, resume: bool, each: impl FnMut(Value)) -> Result<Journal, String> {
    let shown = path.display();
    let file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| format!("cannot open {shown}: {e}"))?;
    if let Err(error) = file.try_lock() {
        return Err(match error {
            std::fs::TryLockError::WouldBlock => format!("{shown} is being written by another batch"),
            std::fs::TryLockError::Error(e) => format!("cannot lock {shown}: {e}"),
        });
    }
    if resume {
        read_whole_lines(&file, each).map_err(|e| format!("cannot read {shown}: {e}"))?;
    } else {
        file.set_len(0).map_err(|e| format!("cannot truncate {shown}: {e}"))?;
    }
    let (file, dirty, stop) = (Arc::new(file), Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let syncer = {
        let (file, dirty, stop) = (file.clone(), dirty.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                std::thread::park_timeout(SYNC_EVERY);
                if dirty.swap(false, Ordering::AcqRel) {
                    let _ = file.sync_data();
                }
            }
        })
    };
    Ok(Journal { file, dirty, stop, syncer: Some(syncer) })
}

/// Hands every whole JSON line of an earlier batch's file to `each`; a
/// last line without its newline (torn by a crash) is cut off, so the next
/// append starts clean.
fn read_whole_lines(file: &File, mut each: impl FnMut(Value)) -> std::io::Result<()> {
    let mut reader = BufReader::new(file);
    reader.seek(SeekFrom::Start(0))?;
    let (mut line, mut whole) = (Vec::new(), 0u64);
    loop {
        line.clear();
        let read = reader.read_until(b'\n', &mut line)?;
        if read == 0 {
            break;
        }
        if line.last() != Some(&b'\n') {
            break; // torn: everything before it is whole
        }
        whole += read as u64;
        if let Ok(record) = serde_json::from_slice::<Value>(&line) {
            each(record);
        }
    }
    if whole < file.metadata()?.len() {
        file.set_len(whole)?;
    }
    Ok(())
}

impl Write for Journal {
    /// One whole line per call: the batch writes each record with its
    /// newline in one `write_all`, and the file is in append mode.
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let written = (&*self.file).write(bytes)?;
        self.dirty.store(true, Ordering::Release);
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Journal {
    /// The file, to make durable at the batch's end (`sync_data`).
    pub fn file(&self) -> Arc<File> {
        self.file.clone()
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(syncer) = self.syncer.take() {
            syncer.thread().unpark();
            let _ = syncer.join();
        }
        let _ = self.file.sync_data();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resumed_file_keeps_its_whole_lines_cuts_a_torn_one_and_the_last_line_of_an_id_wins() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        let lines = [
            r#"{"id":"a","task_hash":"1","stop_reason":"error"}"#,
            r#"{"id":"b","task_hash":"2","stop_reason":"completed"}"#,
            r#"{"id":"a","task_hash":"1","stop_reason":"completed"}"#,
            r#"{"line":4,"stop_reason":"completed"}"#,
        ];
        std::fs::write(&path, format!("{}\n{{\"id\":\"c\",\"task_ha", lines.join("\n"))).unwrap();
        let (mut journal, settled) = open(&path, true).unwrap();
        assert_eq!(settled.len(), 2, "{settled:?}");
        assert!(settled["a"].completed && settled["b"].completed);
        journal.write_all(b"{\"id\":\"c\",\"task_hash\":\"3\",\"stop_reason\":\"completed\"}\n").unwrap();
        // A second batch on the same file is refused while this one holds it.
        assert!(open(&path, true).err().unwrap().contains("another batch"));
        drop(journal);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.lines().all(|line| serde_json::from_str::<Value>(line).is_ok()), "{text}");
        let (_, settled) = open(&path, true).unwrap();
        assert_eq!(settled.len(), 3);
        let (_, settled) = open(&path, false).unwrap();
        assert!(settled.is_empty() && std::fs::read(&path).unwrap().is_empty(), "without resume it starts empty");
    }

    #[test]
    fn the_runs_journal_maps_each_task_to_the_run_it_last_started() {
        let dir = tempfile::tempdir().unwrap();
        let path = runs_path(&dir.path().join("out.jsonl"));
        assert!(path.ends_with("out.jsonl.runs"));
        let lines = [r#"{"id":"a","run":"r1","task_hash":"1"}"#, r#"{"id":"a","run":"r2","task_hash":"1"}"#];
        std::fs::write(&path, format!("{}\n{}\n{{\"id\":\"b\",\"ru", lines[0], lines[1])).unwrap();
        let (_, runs) = open_runs(&path, true).unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs["a"].run, "r2", "the last start of a task wins; the torn line is cut");
    }
}
