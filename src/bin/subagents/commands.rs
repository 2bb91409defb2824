//! One file per subcommand: each is a `clap::Args` struct that owns its
//! `run`, returning the process's exit code, or `Err(message)` for a
//! refusal before any work started (one line on stderr, exit 2). The
//! flags several commands share are declared once in [`crate::args`].

pub mod a2a;
pub mod acp;
pub mod approve;
pub mod fanout;
pub mod mcp;
pub mod merge;
pub mod providers;
pub mod run;
pub mod serve;
pub mod sessions;
pub mod ui;
pub mod worker;
