//! The in-process agent's tests (feature `agent`): the turn loop and its
//! tools, sessions, replay, the spawn and fork children, the subagent tool,
//! the chaos wrapper, the lifecycle state machine and load. The suite's
//! layout is described in `suite_core.rs`.

mod common;

mod agent_loop;
mod chaos;
mod file_tools;
mod in_process;
mod lifecycle_machine;
mod load;
mod replay;
mod sessions;
mod subagent_tool;
