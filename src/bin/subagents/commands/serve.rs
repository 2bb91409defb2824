//! `subagents serve --home DIR [--config FILE]`: one session of a full
//! runtime over stdio JSON-RPC, the `process` provider's child (see
//! `subagents::serve::serve_stdio`).

use std::path::PathBuf;
use std::process::ExitCode;

use subagents::config::{Config, Configured};
use subagents::serve::{serve_stdio, ServeOptions};

/// `subagents serve`'s flags.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// The child's home directory.
    #[arg(long)]
    home: PathBuf,
    /// A configuration file whose providers the session delegates to (what
    /// its `[tool]` offers); without one, a `spawn` of its own. Only this
    /// flag names it: the parent chooses.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

impl ServeArgs {
    /// Exit 0 when the parent closes the session (or a stop signal).
    pub fn run(self) -> Result<ExitCode, String> {
        // Required, never defaulted: the parent names the home it reads.
        let mut options = ServeOptions::new(self.home);
        if let Some(path) = &self.config {
            let config = Config::read(path).map_err(|e| e.to_string())?;
            options.configured = Some(Configured::new(config, None).map_err(|e| e.to_string())?);
        }
        serve_stdio(options).map(|()| ExitCode::SUCCESS).map_err(|e| e.to_string())
    }
}
