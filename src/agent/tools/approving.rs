//! Tools that ask before they run: an in-process provider's `approve = [...]`.
//!
//! A [`Toolset`](super::Toolset) given an [`Approving`] asks, before a call
//! of a tool it names (a name or a `*`/`?` glob, built-in and MCP tools
//! alike) runs and once its arguments are valid, the calling agent's
//! route to the nearest approver ([`crate::seam::Approvals`]): a
//! [`PermissionRequest`] naming the tool, its arguments (bounded) and the
//! file a `path` argument names, offering allow once, allow always and
//! reject. A reject (no one to ask, no answer within the timeout, the turn
//! cancelled, or a person's no) does not run the tool: the model gets a
//! tool error saying so, and its turn goes on. "Allow always" holds for
//! the rest of the run (each run gets its own `Approving`) for what the
//! door said it covers ([`PermissionRequest::grant_key`]): a tool that only
//! reads, every call of it; any other, the same call again.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{ToolContext, ToolOutput};
use crate::agent::session::ToolCall;
use crate::seam::{glob, safe_line, OptionKind, PermissionOption, PermissionRequest, Verdict};

/// Which tools ask, how long they wait, and what this run was allowed
/// always.
#[derive(Debug)]
pub struct Approving {
    names: Arc<[String]>,
    timeout: Duration,
    granted: Mutex<HashSet<String>>,
}

impl Approving {
    /// Calls of the tools `names` (names or globs) ask, and wait at most
    /// `timeout` for an answer.
    pub fn new(names: Arc<[String]>, timeout: Duration) -> Self {
        Approving { names, timeout, granted: Mutex::default() }
    }

    /// Whether a call of `tool` asks first.
    pub(super) fn covers(&self, tool: &str) -> bool {
        self.names.iter().any(|name| glob(name, tool))
    }

    /// Asks about `call`; `Err` is the tool error the model sees instead
    /// of the tool's result.
    pub(super) async fn ask(&self, call: &ToolCall, read_only: bool, context: &ToolContext) -> Result<(), ToolOutput> {
        let options = vec![
            PermissionOption::new("allow_once", "Allow", OptionKind::AllowOnce),
            PermissionOption::new("allow_always", "Allow always (this run)", OptionKind::AllowAlways),
            PermissionOption::new("reject", "Reject", OptionKind::RejectOnce),
        ];
        let mut request = PermissionRequest::new(options).with_tool(&call.name).with_input(&call.arguments);
        // A tool that only reads says so: always then covers the tool (any
        // other may be a shell, and always covers its same call only).
        if read_only {
            request = request.with_kind("read");
        }
        if let Some(path) = call.arguments.get("path").and_then(|path| path.as_str()) {
            request = request.with_path(context.cwd.join(path).to_string_lossy());
        }
        let key = request.grant_key();
        let granted = |granted: &Mutex<HashSet<String>>| {
            key.as_ref().is_some_and(|key| granted.lock().unwrap_or_else(|e| e.into_inner()).contains(key))
        };
        if granted(&self.granted) {
            return Ok(());
        }
        let answer = context.agent.approvals().ask(request, self.timeout, &context.cancel).await;
        match answer.verdict {
            Verdict::AllowOnce => Ok(()),
            Verdict::AllowAlways => {
                if let Some(key) = key {
                    self.granted.lock().unwrap_or_else(|e| e.into_inner()).insert(key);
                }
                Ok(())
            }
            Verdict::Reject => Err(ToolOutput::error(format!(
                "the call of {:?} was rejected ({}): it did not run; go on without it",
                call.name,
                safe_line(&answer.by)
            ))),
        }
    }
}
