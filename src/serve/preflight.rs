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

/// Creates the home and its sessions directory if missing (private, 0700:
/// see [`SessionStore`]) and proves the sessions directory writable by
/// creating and removing a file in it.
pub fn check_home(home: &Path) -> Result<(), ServeError> {
    let unusable = |source| ServeError::Home { home: home.to_path_buf(), source };
    let store = SessionStore::new(home);
    store.prepare().map_err(unusable)?;
    let sessions = store.dir().expect("a store under a home has a directory");
    let probe = sessions.join(format!(".subagents-probe-{}", std::process::id()));
    std::fs::OpenOptions::new().write(true).create_new(true).open(&probe).map_err(unusable)?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
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
