//! What `merge` reads: a results file, line by line within the bound the
//! batch reads its results back with, however long a torn line; never a
//! device or a pipe, which could feed it without end.

use std::process::Stdio;

use super::{config, fanout, git, repository, subagents, text};
use crate::cli::peak_rss_kib;

#[test]
fn merge_reads_a_torn_line_of_400_mb_within_the_bound_and_merges_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let dir = &dir.path().canonicalize().unwrap();
    let repo = repository(dir);
    config(dir, "");
    let output = fanout(dir, &repo, &[("a", "write a.txt alpha")], &[]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    // 400 MB of zeros on no disk after the last line: one torn line.
    let results = dir.join("results.jsonl");
    let length = std::fs::metadata(&results).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&results).unwrap().set_len(length + 400_000_000).unwrap();
    let mut command = subagents(&repo);
    command.arg("merge").arg(&results).stdin(Stdio::null());
    let (status, peak_kib) = peak_rss_kib(&mut command);
    assert_eq!(status.code(), Some(0), "a's branch merged");
    assert!(peak_kib < 160 * 1024, "the torn line was not held whole: {peak_kib} KiB");
    assert_eq!(git(&repo, &["show", "subagents/results.merged:a.txt"]), "alpha");
}

#[test]
fn merge_refuses_a_device_a_fifo_or_a_directory_naming_what_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let dir = &dir.path().canonicalize().unwrap();
    let repo = repository(dir);
    let fifo = dir.join("results.fifo");
    let fifo_name = std::ffi::CString::new(fifo.clone().into_os_string().into_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo_name.as_ptr(), 0o600) }, 0, "mkfifo");
    let cases =
        [("/dev/zero".into(), "not a regular file"), (fifo, "not a regular file"), (dir.clone(), "not a regular file")];
    for (path, said) in cases {
        let mut command = subagents(&repo);
        command.arg("merge").arg(&path);
        // Address space for the binary, far short of /dev/zero read whole.
        let limit = 1u64 << 30;
        // SAFETY: setrlimit only, which is async-signal-safe, between fork and exec.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                let bound = libc::rlimit { rlim_cur: limit, rlim_max: limit };
                match libc::setrlimit(libc::RLIMIT_AS, &bound) {
                    0 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                }
            });
        }
        let output = crate::common::output_within(&mut command, std::time::Duration::from_secs(30), "merge");
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{}: {stderr}", path.display());
        assert!(stderr.contains(&*path.to_string_lossy()) && stderr.contains(said), "{stderr}");
    }
}
