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

    /// Writes a ballast file until the disk refuses; that refusal.
    pub fn fill(&self) -> std::io::Error {
        use std::io::Write;
        let mut ballast = std::fs::File::create(self.ballast()).unwrap();
        let chunk = vec![0u8; 64 * 1024];
        loop {
            if let Err(error) = ballast.write_all(&chunk) {
                return error;
            }
        }
    }

    /// Removes the ballast [`fill`](Self::fill) wrote: space returns.
    pub fn free(&self) {
        std::fs::remove_file(self.ballast()).unwrap();
    }

    fn ballast(&self) -> PathBuf {
        self.dir.path().join("ballast")
    }
}

fn mount(options: &[&str], on: &Path) {
    let how = "these drills mount a small tmpfs: run the tests as root with CAP_SYS_ADMIN \
               (in a container: --cap-add SYS_ADMIN, or --privileged) and util-linux's mount";
    match Command::new("mount").args(options).arg(on).output() {
        Ok(output) if output.status.success() => {}
        Ok(output) => panic!(
            "cannot mount a tmpfs on {} ({}: {}): {how}",
            on.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ),
        Err(error) => panic!("cannot run mount ({error}): {how}"),
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let unmounted = Command::new("umount").arg(self.dir.path()).status().is_ok_and(|s| s.success());
        if !unmounted {
            // Something still holds it open: detach it now, freed when let go.
            let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
        }
    }
}
