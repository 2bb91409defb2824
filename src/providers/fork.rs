//! `fork`: an in-process child seeded with the parent's conversation.
//!
//! **Choose it** when the subtask needs what the parent already knows: the
//! child's session starts with the parent's completed-turn prefix —
//! everything up to and including the parent's last turn end — so the
//! prompt only needs to state what is new. The parent's open turn (which
//! holds the delegating tool call) is never copied; a parent without a
//! completed turn forks like `spawn`. Only history is copied: not the
//! parent's tools, filter or authority.
//!
//! The prefix comes from the live parent agent when the request's
//! [`Parent`](crate::Parent) carries it ([`Agent::as_parent`]), else from
//! the parent's stored session (`parent.session_id`); a parent session that
//! cannot be read is an `INVALID_REQUEST`, never a silent fresh child.
//!
//! **Advertises** every start-time capability, steering and continuation,
//! like [`spawn`](super::spawn); `inherits_parent_context()` is true. The
//! child's result is its own last answer: it never echoes seeded parent
//! output. Failure handling and limits are those of `spawn`.
//!
//! [`Agent::as_parent`]: crate::agent::Agent::as_parent

use std::sync::Arc;

use super::in_process::InProcessProvider;
use crate::agent::Model;

impl InProcessProvider {
    /// A `fork` provider named `name` whose children talk to `model`;
    /// configure it with the `with_*` methods.
    pub fn fork(name: impl Into<String>, model: Arc<dyn Model>) -> InProcessProvider {
        InProcessProvider::new(name.into(), model, true)
    }
}
