//! `subagents ui --home DIR [--out FILE [--tasks FILE]]`: the web view of a home's runs
//! (see `subagents::serve::serve_ui`): its sessions as trees and
//! transcripts, and with `--out` the batch writing that results file,
//! followed as it grows.
//!
//! `fanout --ui` and `run --ui` serve the same page while they work
//! ([`serve_batch`], [`serve_run`]).
//!
//! It prints the page's address (with its token) on stderr once it
//! listens, serves until SIGINT, SIGTERM or SIGHUP and exits 0; it exits 2
//! with one line when it cannot start.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use subagents::agent::ModelRoute;
use subagents::serve::{serve_ui, Board, UiOptions, UiServer};
use subagents::CancellationToken;

use crate::args::HomeArgs;
use crate::terminal::say;

/// `subagents ui`'s flags.
#[derive(clap::Args, Debug)]
pub struct UiArgs {
    #[command(flatten)]
    home: HomeArgs,
    /// A batch's results file (`fanout --out`) to follow as it grows.
    #[arg(long)]
    out: Option<PathBuf>,
    /// The batch's tasks file: its lines are counted for the ETA of the
    /// batch `--out` follows.
    #[arg(long, requires = "out", value_name = "FILE")]
    tasks: Option<PathBuf>,
    /// Where to listen (default `127.0.0.1:0`, a free loopback port).
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// The environment variable that holds the token every request must
    /// carry (default: a random one, in the printed address).
    #[arg(long, value_name = "NAME")]
    token_env: Option<String>,
}

impl UiArgs {
    pub fn run(self) -> Result<ExitCode, String> {
        let mut options = UiOptions::new().home(self.home.resolve());
        if let Some(listen) = self.listen {
            options = options.listen(listen);
        }
        if let Some(name) = &self.token_env {
            let token = std::env::var(name).ok().filter(|token| !token.trim().is_empty());
            options = options.token(token.ok_or_else(|| format!("--token-env names {name}, which is not set"))?);
        }
        let following = CancellationToken::new();
        let board = match &self.out {
            Some(out) => {
                let board = Board::new();
                if let Some(tasks) = &self.tasks {
                    let lines = crate::tasks_file::count_lines(tasks)
                        .ok_or_else(|| format!("--tasks: cannot read the file {}", tasks.display()))?;
                    board.expect(lines);
                    board.steps(tasks);
                }
                board.follow(out, following.clone()).map_err(|e| format!("cannot follow {}: {e}", out.display()))?;
                Some(board)
            }
            None => None,
        };
        let server = serve_ui(options, board).map_err(|e| e.to_string())?;
        say!("subagents ui: open {}", server.url());
        let signal = server.serve_until_signal();
        following.cancel();
        tracing::debug!(signal, "the web view stopped");
        Ok(ExitCode::SUCCESS)
    }
}

/// The web view of a batch this process runs (`fanout --ui`): served on
/// loopback while the batch runs, its address said on stderr.
pub fn serve_batch(
    home: &std::path::Path,
    routes: impl Iterator<Item = Arc<ModelRoute>>,
) -> Result<(Board, UiServer), String> {
    let board = Board::new();
    board.routes(routes);
    let server = serve_ui(UiOptions::new().home(home), Some(board.clone())).map_err(|e| e.to_string())?;
    say!("subagents: the batch's web view: {}", server.url());
    Ok((board, server))
}

/// The web view of `run`'s tree (`run --ui`): the runtime's events feed
/// it while the handle is held; the address opens on the parent's tree.
pub fn serve_run(
    home: &std::path::Path,
    subagents: &subagents::Subagents,
    parent: &str,
    routes: impl Iterator<Item = Arc<ModelRoute>>,
) -> Result<(UiServer, subagents::events::ListenerHandle), String> {
    let board = Board::new();
    board.routes(routes);
    let events = board.watch(subagents);
    let server = serve_ui(UiOptions::new().home(home), Some(board)).map_err(|e| e.to_string())?;
    say!("subagents: the run's web view: {}#trees/{parent}", server.url());
    Ok((server, events))
}
