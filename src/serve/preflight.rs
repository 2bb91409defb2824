//! What a command checks before it starts any work, so that a setup that
//! cannot work is refused at once (exit 2, one line naming the problem)
//! instead of failing every run on its own, late, with a bare
//! `startup-failed` or `subagent run failed`:
//!
//! - [`check_home`]: the home can take sessions (every run writes one);
//! - [`reachable_model`]: the model can be built and, for an HTTP model
//!   (`openai:`, `openai-responses:`, `anthropic:`, or a configured route),
//!   its endpoint accepts a connection.
//!
//! `subagents run`, `fanout` and `mcp` make both checks.
//!
//! ```no_run
//! use subagents::agent::ModelSpec;
//! use subagents::serve::{check_home, reachable_model};
//!
//! # async fn checked() -> Result<(), subagents::serve::ServeError> {
//! check_home(std::path::Path::new(".subagents"))?;
//! let model = reachable_model(&ModelSpec::parse("openai:gpt-4o-mini")?).await?;
//! # Ok(()) }
//! ```

use std::path::Path;
use std::sync::Arc;

use super::ServeError;
use crate::agent::{Model, ModelSpec, SessionStore};

/// Bytes the home check writes: a small session's worth. An empty file
/// proves nothing: a full disk still creates one (it costs an inode, not a
/// block), then refuses the session's first line.
const PROBE_BYTES: usize = 16 * 1024;

/// Creates the home and its sessions directory if missing (private, 0700:
/// see [`SessionStore`]) and proves the sessions directory writable by
/// writing 16 KiB to a file in it and removing it. A full disk or
/// quota fails it with the OS's reason (`ENOSPC`, `EDQUOT`): local file
/// systems reserve the blocks a write needs when it is made.
pub fn check_home(home: &Path) -> Result<(), ServeError> {
    use std::io::Write;
    let unusable = |source| ServeError::Home { home: home.to_path_buf(), source };
    let store = SessionStore::new(home);
    store.prepare().map_err(unusable)?;
    let sessions = store.dir().expect("a store under a home has a directory");
    // One name per check: a worker probes its home from several runs at once.
    static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let probe_number = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let probe = sessions.join(format!(".subagents-probe-{}-{probe_number}", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .and_then(|mut file| file.write_all(&[b'\n'; PROBE_BYTES]));
    // Removed whether or not the bytes fit: a probe must not fill the disk.
    let _ = std::fs::remove_file(&probe);
    written.map_err(unusable)
}

/// Whether a home check failed because the disk or the user's quota is
/// full: a state that passes, unlike a home that is not a directory.
#[cfg(feature = "remote")]
pub(crate) fn out_of_space(error: &ServeError) -> bool {
    let ServeError::Home { source, .. } = error else { return false };
    matches!(source.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

/// The model `spec` names, built; an HTTP model's endpoint is probed
/// first (a connection within its timeout, at most 5 s), so that one that
/// cannot be reached at all is refused before any run.
pub async fn reachable_model(spec: &ModelSpec) -> Result<Arc<dyn Model>, ServeError> {
    spec.build_reachable().await.map_err(|(base_url, source)| match base_url {
        Some(base_url) => ServeError::Unreachable { base_url, source },
        None => ServeError::from(source),
    })
}
