//! Provider implementations. Each depends only on the seam vocabulary
//! (`crate::seam`), never on the actors or on each other.
//!
//! | provider | when to choose it |
//! |---|---|
//! | [`mock`] | tests, demos and fault injection of your own lifecycles |
//! | [`spawn`] | a fresh in-process child agent: cheap, isolated subtasks |
//! | [`fork`] | an in-process child that inherits the parent's completed turns |
//! | [`process`] | a fresh full `subagents` runtime per run, in its own process |
//! | [`acp`] | any agent process speaking the Agent Client Protocol (this crate's `subagents acp` included) |
//!
//! | [`chaos`] | wraps any provider with seeded fault injection, to test your own lifecycles |
//!
//! `spawn` and `fork` share one driver, [`in_process`].

pub mod acp;
pub mod chaos;
pub mod child_process;
pub mod fork;
pub mod in_process;
pub mod mock;
pub mod process;
pub mod spawn;

pub use acp::{AcpConfig, AcpProvider, Permission};
pub use chaos::{ChaosFault, ChaosProvider, ChaosSchedule, ChaosStage, Injected};
pub use in_process::{ChildInfo, InProcessProvider, ModelRoutes, ToolFactory, STRUCTURED_OUTPUT_TOOL};
pub use mock::{Fault, FaultStage, MockEvent, MockProvider};
pub use process::{ProcessConfig, ProcessProvider};
