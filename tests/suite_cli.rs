//! The tests that need every door (feature `cli`): the `subagents` binary
//! run as a user runs it, and the providers and servers that cross a
//! process boundary — acp, process, remote on a real broker, mcp — with
//! crash, budget, receipt and telemetry checks; and `subagents::batch` as
//! an embedder drives it. The suite's layout is
//! described in `suite_core.rs`.

mod common;
// The shell ACP agents of `acp.rs` and `acp_pool.rs` (and a bench).
#[path = "acp/stand_ins.rs"]
mod stand_ins;

mod a2a;
mod acp;
mod acp_agent;
mod acp_pool;
mod approvals;
mod batch;
mod budget;
mod cli;
mod config;
mod crash;
mod explained;
mod mcp;
mod mcp_tools;
mod process;
mod receipts;
mod remote;
mod telemetry;
mod transcripts;
mod ui;
mod workspace;
