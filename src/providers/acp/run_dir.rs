//! A private directory per agent process: `{run_dir}` in an ACP
//! provider's `args` or `env` values.
//!
//! Real agents keep state in a home directory (`CODEX_HOME`, `~/.claude`,
//! XDG directories), so agents running side by side need one each. When
//! `{run_dir}` appears in the provider's arguments or environment values,
//! every agent process it spawns gets a fresh directory (mode 0700) under
//! [`RunDirs::root`], first filled with a copy of [`RunDirs::template`]
//! when one is set, and `{run_dir}` is replaced by its path. The directory
//! goes once the process is reaped, unless [`RunDirs::keep`]. A per-run
//! provider spawns a process per run, so each run has its own; a pooled
//! process keeps one for its whole life, shared by the runs it serves.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The placeholder replaced by the directory's path.
pub(super) const PLACEHOLDER: &str = "{run_dir}";

/// How an ACP provider makes its processes' private directories.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunDirs {
    /// Where the directories are made; default the system's temporary
    /// directory.
    pub root: Option<PathBuf>,
    /// A directory copied into each fresh one (files, directories and
    /// symbolic links, with their permissions).
    pub template: Option<PathBuf>,
    /// Keep each directory after its process is gone (for inspection).
    pub keep: bool,
}

/// One process's directory; removed by [`RunDir::remove`], or on drop as a
/// last resort.
#[derive(Debug)]
pub(super) struct RunDir {
    path: PathBuf,
    keep: bool,
    removed: bool,
}

/// Whether any of `texts` names the placeholder.
pub(super) fn wanted<'a>(mut texts: impl Iterator<Item = &'a str>) -> bool {
    texts.any(|text| text.contains(PLACEHOLDER))
}

impl RunDir {
    /// Makes a fresh directory for `provider`'s next process (off the
    /// caller's thread: the template copy may be large).
    pub(super) async fn create(provider: &str, dirs: &RunDirs) -> io::Result<RunDir> {
        let (provider, dirs) = (provider.to_owned(), dirs.clone());
        let created = tokio::task::spawn_blocking(move || create_blocking(&provider, &dirs)).await;
        created.unwrap_or_else(|join| Err(io::Error::other(join.to_string())))
    }

    /// `text` with the placeholder replaced by the directory's path.
    pub(super) fn expand(&self, text: &str) -> String {
        text.replace(PLACEHOLDER, &self.path.to_string_lossy())
    }

    /// Removes the directory (unless kept), off the caller's thread.
    pub(super) async fn remove(self) {
        let keep = self.keep;
        self.remove_if(!keep).await;
    }

    /// Removes the directory even when kept (a probe's).
    pub(super) async fn discard(self) {
        self.remove_if(true).await;
    }

    async fn remove_if(mut self, remove: bool) {
        self.removed = true;
        if !remove {
            return;
        }
        let path = std::mem::take(&mut self.path);
        let removed = tokio::task::spawn_blocking(move || remove_blocking(&path)).await;
        if let Err(error) = removed {
            tracing::warn!(%error, "removing a run directory panicked");
        }
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if !self.removed && !self.keep {
            remove_blocking(&self.path);
        }
    }
}

fn create_blocking(provider: &str, dirs: &RunDirs) -> io::Result<RunDir> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let root = dirs.root.clone().unwrap_or_else(std::env::temp_dir);
    std::fs::create_dir_all(&root)?;
    let safe: String =
        provider.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).take(40).collect();
    let path = loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let candidate = root.join(format!("subagents-{safe}-{}-{n}", std::process::id()));
        match make_private_dir(&candidate) {
            Ok(()) => break candidate,
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(error) => return Err(error),
        }
    };
    // From here on the guard removes what was made if the copy fails.
    let dir = RunDir { path, keep: dirs.keep, removed: false };
    if let Some(template) = &dirs.template {
        copy_tree(template, &dir.path)
            .map_err(|error| io::Error::new(error.kind(), format!("copying {}: {error}", template.display())))?;
    }
    Ok(dir)
}

fn make_private_dir(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(0o700).create(path)
}

/// Copies the contents of `from` into the existing directory `to`.
fn copy_tree(from: &Path, to: &Path) -> io::Result<()> {
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type()?;
        if kind.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&source)?, &target)?;
        } else if kind.is_dir() {
            std::fs::create_dir(&target)?;
            std::fs::set_permissions(&target, std::fs::metadata(&source)?.permissions())?;
            copy_tree(&source, &target)?;
        } else if kind.is_file() {
            std::fs::copy(&source, &target)?;
        }
        // Sockets, fifos and devices are not copied.
    }
    Ok(())
}

fn remove_blocking(path: &Path) {
    if path.as_os_str().is_empty() {
        return;
    }
    if let Err(error) = std::fs::remove_dir_all(path) {
        if error.kind() != io::ErrorKind::NotFound {
            tracing::warn!(path = %path.display(), %error, "could not remove a run directory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch() -> PathBuf {
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "run-dir-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[tokio::test]
    async fn each_directory_is_fresh_private_filled_from_the_template_and_removed() {
        use std::os::unix::fs::PermissionsExt;
        let (root, template) = (scratch(), scratch());
        std::fs::create_dir(template.join("nested")).unwrap();
        std::fs::write(template.join("nested/config.toml"), "model = 'x'\n").unwrap();
        std::os::unix::fs::symlink("nested/config.toml", template.join("link")).unwrap();
        let dirs = RunDirs { root: Some(root.clone()), template: Some(template.clone()), keep: false };
        let (a, b) =
            (RunDir::create("codex one", &dirs).await.unwrap(), RunDir::create("codex one", &dirs).await.unwrap());
        assert_ne!(a.path, b.path);
        assert!(a.path.starts_with(&root));
        assert_eq!(std::fs::metadata(&a.path).unwrap().permissions().mode() & 0o777, 0o700);
        assert_eq!(std::fs::read_to_string(a.path.join("nested/config.toml")).unwrap(), "model = 'x'\n");
        assert_eq!(std::fs::read_to_string(a.path.join("link")).unwrap(), "model = 'x'\n");
        std::fs::write(a.path.join("nested/config.toml"), "changed").unwrap();
        assert_eq!(std::fs::read_to_string(b.path.join("nested/config.toml")).unwrap(), "model = 'x'\n");
        assert_eq!(a.expand("{run_dir}/codex"), format!("{}/codex", a.path.display()));
        let (a_path, b_path) = (a.path.clone(), b.path.clone());
        a.remove().await;
        drop(b);
        assert!(!a_path.exists() && !b_path.exists());
        std::fs::remove_dir_all(root).unwrap();
        std::fs::remove_dir_all(template).unwrap();
    }

    #[tokio::test]
    async fn a_kept_directory_stays_and_a_missing_template_fails_leaving_nothing() {
        let root = scratch();
        let kept =
            RunDir::create("p", &RunDirs { root: Some(root.clone()), template: None, keep: true }).await.unwrap();
        let path = kept.path.clone();
        kept.remove().await;
        assert!(path.is_dir());
        let missing = RunDirs { root: Some(root.clone()), template: Some(root.join("absent")), keep: false };
        let error = RunDir::create("p", &missing).await.unwrap_err();
        assert!(error.to_string().contains("absent"), "{error}");
        assert_eq!(std::fs::read_dir(&root).unwrap().count(), 1, "only the kept directory is left");
        std::fs::remove_dir_all(root).unwrap();
    }
}
