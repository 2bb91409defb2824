//! `subagents serve --home DIR`: one session of a full runtime over stdio
//! JSON-RPC, the `process` provider's child (see `subagents::serve::serve_stdio`).

use std::path::PathBuf;
use std::process::ExitCode;

use subagents::serve::{serve_stdio, ServeOptions};

/// `subagents serve`'s flags.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// The child's home directory.
    #[arg(long)]
    home: PathBuf,
}

impl ServeArgs {
    /// Exit 0 when the parent closes the session (or a stop signal).
    pub fn run(self) -> Result<ExitCode, String> {
        // Required, never defaulted: the parent names the home it reads.
        serve_stdio(ServeOptions { home: self.home }).map(|()| ExitCode::SUCCESS).map_err(|e| e.to_string())
    }
}
