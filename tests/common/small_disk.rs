//! A small disk for tests of what a full one does: a `tmpfs` of a few
//! kilobytes mounted on a temporary directory, grown on demand (space
//! that "returns") and unmounted when dropped, even after a failed assert.
//!
//! Mounting needs root (`CAP_SYS_ADMIN`), which the suite's machines and
//! CI have; elsewhere the test fails saying so, never skips.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A mounted `tmpfs`; unmounted on drop.
pub struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    /// A disk of `bytes` (rounded up to pages by the kernel).
    pub fn mount(bytes: u64) -> SmallDisk {
        let dir = tempfile::tempdir().unwrap();
        mount(&["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"], dir.path());
        SmallDisk { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The disk grown to `bytes`: space returns, its files kept.
    pub fn grow(&self, bytes: u64) {
        mount(&["-o", &format!("remount,size={bytes}")], self.dir.path());
    }
}

fn mount(options: &[&str], on: &Path) {
    let output = Command::new("mount").args(options).arg(on).output();
    match output {
        Ok(output) if output.status.success() => {}
        Ok(output) => panic!(
            "this test needs a small tmpfs and could not mount one ({}): run the suite as root (mount needs CAP_SYS_ADMIN)",
            String::from_utf8_lossy(&output.stderr).trim()
        ),
        Err(error) => panic!("this test needs `mount` (util-linux) to make a small disk: {error}"),
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}
