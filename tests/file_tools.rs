//! docs/contract.md §10.2 file tools: `read_file` and `list_dir` open beneath the cwd in
//! one step, so a directory swapped for a symbolic link to the outside
//! while they run never leads a read out of the cwd.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::json;
use subagents::agent::{Agent, ListDir, ReadFile, ScriptedModel, Tool, ToolContext};
use subagents::CancellationToken;

const READS: usize = 20_000;

fn context(cwd: &Path) -> ToolContext {
    let agent = Agent::builder(ScriptedModel::demo()).cwd(cwd).build().unwrap();
    ToolContext {
        session_id: agent.id().into(),
        agent,
        cwd: cwd.into(),
        call_id: "call".to_owned(),
        cancel: CancellationToken::new(),
    }
}

fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

/// Swaps `a` and `b` atomically (renameat2 RENAME_EXCHANGE) until `stop`.
fn swap_until(a: &Path, b: &Path, stop: Arc<AtomicBool>, swaps: Arc<AtomicU64>) -> std::thread::JoinHandle<()> {
    let (a, b) = (c_path(a), c_path(b));
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            // SAFETY: both paths are valid NUL-terminated strings that live
            // for the call; renameat2 touches no memory of ours besides them.
            let swapped = unsafe {
                libc::syscall(libc::SYS_renameat2, libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), 2)
            };
            assert_eq!(swapped, 0, "renameat2(RENAME_EXCHANGE) failed: {}", std::io::Error::last_os_error());
            swaps.fetch_add(1, Ordering::Relaxed);
        }
    })
}

/// A cwd holding `d/secret.txt` ("inside") and `swap`, a symbolic link to
/// an outside directory holding `secret.txt` ("OUTSIDE") and `only-outside`.
fn race_course() -> (tempfile::TempDir, tempfile::TempDir) {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "OUTSIDE").unwrap();
    std::fs::write(outside.path().join("only-outside"), "").unwrap();
    let cwd = tempfile::tempdir().unwrap();
    std::fs::create_dir(cwd.path().join("d")).unwrap();
    std::fs::write(cwd.path().join("d/secret.txt"), "inside").unwrap();
    std::os::unix::fs::symlink(outside.path(), cwd.path().join("swap")).unwrap();
    (cwd, outside)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_file_never_escapes_the_cwd_while_a_directory_is_swapped_for_a_symlink() {
    let (cwd, _outside) = race_course();
    let context = context(cwd.path());
    let (stop, swaps) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let swapper = swap_until(&cwd.path().join("d"), &cwd.path().join("swap"), stop.clone(), swaps.clone());
    let (mut inside, mut refused, mut escaped) = (0, 0, 0);
    for _ in 0..READS {
        let output = ReadFile.call(json!({"path": "d/secret.txt"}), context.clone()).await;
        match (output.is_error, output.content.as_str()) {
            (false, "inside") => inside += 1,
            (false, _) => escaped += 1,
            (true, _) => refused += 1,
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    assert_eq!(escaped, 0, "{escaped} of {READS} reads returned the outside file ({inside} inside, {refused} refused)");
    assert!(swaps.load(Ordering::Relaxed) > 100, "the race ran: {} swaps", swaps.load(Ordering::Relaxed));
    assert!(inside > 0 && refused > 0, "both sides of the race were seen: {inside} inside, {refused} refused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_dir_never_lists_outside_the_cwd_while_a_directory_is_swapped_for_a_symlink() {
    let (cwd, _outside) = race_course();
    let context = context(cwd.path());
    let (stop, swaps) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let swapper = swap_until(&cwd.path().join("d"), &cwd.path().join("swap"), stop.clone(), swaps.clone());
    let mut escaped = 0;
    for _ in 0..READS / 4 {
        let output = ListDir.call(json!({"path": "d"}), context.clone()).await;
        if !output.is_error && output.content.contains("only-outside") {
            escaped += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    assert_eq!(escaped, 0, "{escaped} listings showed the outside directory");
}

#[tokio::test]
async fn read_file_follows_a_symlink_that_stays_inside_and_cuts_a_large_file() {
    let cwd = tempfile::tempdir().unwrap();
    std::fs::create_dir(cwd.path().join("docs")).unwrap();
    std::fs::write(cwd.path().join("docs/a.txt"), "alpha").unwrap();
    std::os::unix::fs::symlink("docs/a.txt", cwd.path().join("a-link")).unwrap();
    std::fs::write(cwd.path().join("big.txt"), vec![b'x'; 300 * 1024]).unwrap();
    let context = context(cwd.path());
    let linked = ReadFile.call(json!({"path": "a-link"}), context.clone()).await;
    assert_eq!((linked.is_error, linked.content.as_str()), (false, "alpha"));
    let big = ReadFile.call(json!({"path": "big.txt"}), context.clone()).await;
    assert!(!big.is_error && big.content.ends_with("[truncated: the file has 307200 bytes]"), "{}", &big.content[..40]);
    let missing = ReadFile.call(json!({"path": "nope.txt"}), context).await;
    assert!(missing.is_error && missing.content.contains("not found"), "{}", missing.content);
}
