//! Provider implementations. Each depends only on the seam vocabulary
//! (`crate::seam`), never on the actors or on each other.
//!
//! | provider | when to choose it |
//! |---|---|
//! | [`mock`] | tests, demos and fault injection of your own lifecycles |
//! | `spawn` | a fresh in-process child agent: cheap, isolated subtasks |
//! | `fork` | an in-process child that inherits the parent's completed turns |
//! | `process` | a fresh full `subagents` runtime per run, in its own process |
//! | `acp` | any agent process speaking the Agent Client Protocol (this crate's `subagents acp` included) |
//! | `a2a` | a task on a remote agent that speaks the Agent2Agent protocol (this crate's `subagents a2a` included) |
//! | `remote` | runs on `subagents worker` processes, on other machines too, through NATS JetStream |
//! | [`chaos`] | wraps any provider with seeded fault injection, to test your own lifecycles |
//!
//! Each has a submodule of its own below (those of the features this build
//! has; see the crate's feature table). `spawn` and `fork` are one type,
//! `InProcessProvider` (built with `InProcessProvider::spawn` or
//! `InProcessProvider::fork`).
//!
//! # Child environment
//!
//! `acp` and `process` children, and the MCP servers in-process children
//! mount, never get the parent's whole environment.
//! A child starts empty and gets
//! 1. the parent's `PATH`, `HOME`, `USER`, `LOGNAME`, `SHELL`, `LANG`,
//!    `LANGUAGE`, `LC_*`, `TERM`, `COLORTERM`, `NO_COLOR`, `TZ`, `TMPDIR`,
//!    `TMP`, `TEMP` and `RUST_BACKTRACE`: what a program needs to run;
//! 2. the parent's values of the names its config lists in `inherit_env`
//!    (`NAME` or `PREFIX*`), except credential-shaped ones (a name
//!    containing `KEY`, `PASSWORD`, `PASS`, `PWD`, `SECRET`, `TOKEN`, `DSN`,
//!    `AUTH`, `CREDENTIAL` or `COOKIE`, or with a `PAT` part, in any case),
//!    which are dropped with a warning naming them;
//! 3. the config's explicit `env` entries, as given: the only way to hand
//!    a child a key.
//!
//! So `DATABASE_URL`, `PGPASS`, `MYSQL_PWD`, `GH_PAT`, `SENTRY_DSN` or a
//! webhook URL in the parent never reach a child by accident.

#[cfg(feature = "a2a")]
pub mod a2a;
#[cfg(feature = "acp")]
pub mod acp;
pub mod chaos;
#[cfg(feature = "agent")]
pub mod fork;
#[cfg(feature = "agent")]
pub(crate) mod in_process;
pub mod mock;
#[cfg(feature = "process")]
pub mod process;
#[cfg(feature = "remote")]
pub mod remote;
#[cfg(feature = "agent")]
pub mod spawn;

/// Every provider kind's home in the configuration, in the order lists
/// show them: `config` declares one module per name
/// (`src/config/kinds/NAME.rs`, owning the kind's keys, checks, build and
/// capabilities) through this list, so a new kind is added here, beside
/// its provider's module, and nowhere else in the crate's own lists.
#[cfg(feature = "config")]
macro_rules! kinds {
    ($declare:ident) => {
        $declare! { in_process, mock, acp, process, remote, a2a, chaos }
    };
}
#[cfg(feature = "config")]
pub(crate) use kinds;

#[cfg(any(feature = "acp", feature = "process"))]
pub use crate::child_process::ChildProcessConfig;
#[cfg(all(any(feature = "acp", feature = "process"), any(target_os = "linux", target_os = "android")))]
pub use crate::child_process::{adopt_orphans, AdoptedOrphans};
#[cfg(feature = "a2a")]
pub use a2a::{A2aConfig, A2aError, A2aProvider, Limits as A2aLimits};
#[cfg(feature = "acp")]
pub use acp::{AcpConfig, AcpMcpServer, AcpProvider, PoolConfig, Reuse, RunDirs};
pub use chaos::{ChaosFault, ChaosProvider, ChaosSchedule, ChaosStage, Injected};
#[cfg(feature = "agent")]
pub use in_process::{ChildInfo, InProcessProvider, ModelRoutes, ToolFactory, STRUCTURED_OUTPUT_TOOL};
pub use mock::{Fault, FaultStage, MockEvent, MockProvider};
#[cfg(feature = "process")]
pub use process::{ProcessConfig, ProcessProvider};
#[cfg(feature = "remote")]
pub use remote::{BrokerSettings, RemoteConfig, RemoteError, RemoteProvider};

/// A request's `mcp_servers` must name servers the child would have: the
/// first name not `available` is refused, naming the ones it could have.
#[cfg(any(feature = "mcp-client", feature = "acp"))]
pub(crate) fn check_mcp_names<'a>(
    requested: &[String],
    available: impl Iterator<Item = &'a str> + Clone,
) -> Result<(), crate::seam::LaunchError> {
    let Some(unknown) = requested.iter().find(|name| !available.clone().any(|known| known == name.as_str())) else {
        return Ok(());
    };
    let offered: Vec<&str> = available.collect();
    let offered = if offered.is_empty() { "none".to_owned() } else { offered.join(", ") };
    Err(crate::seam::LaunchError::Invalid {
        field: "mcp_servers",
        reason: format!("the child has no MCP server named {unknown:?} (its servers: {offered})"),
    })
}
