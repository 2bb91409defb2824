//! The web view of runs: `subagents ui` and the `--ui` of `fanout`. One
//! page served from the binary — an HTML file, a script and a style sheet,
//! hand-written and embedded, nothing fetched from anywhere else — with
//! three views:
//!
//! - **Live**: a batch as it runs: counts by outcome, rate, elapsed and
//!   ETA, tokens and time waited on rate limits, per-provider figures,
//!   each model route with what its limiter says, failures with their
//!   reasons as they happen, and every settled run in a list the page
//!   reads a window at a time; and the permission requests parked in the
//!   home, each answerable from the page. Pushed as server-sent events
//!   whenever the [`Board`] or the parked requests change.
//! - **Trees**: a run's delegation tree across kinds — the store's lineage
//!   joined with the live runs the runtime's events told of — each node
//!   with its kind (provider), label, state, duration and tokens, the runs
//!   a cancel reaches it through, folded and unfolded, and beside it a
//!   waterfall of the same nodes.
//! - **Transcripts**: a session as the store holds it (messages, tool
//!   calls with arguments, results, permission requests with their answers
//!   and who gave them, and why a failed run failed), long outputs folded,
//!   and a search across the home's sessions.
//!
//! Where it reads: the home's sessions store (and the stores of process
//! children under `<home>/children`), and a [`Board`] fed by a batch's
//! [`Report`](crate::batch::Report) (what `--ui` adds: the in-memory state
//! of the batch that runs in this process), by a followed out file
//! ([`Board::follow`]) or by the runtime's events ([`Board::watch`]).
//!
//! # Safe by default
//!
//! It listens on loopback unless told otherwise, and every request must
//! carry the server's token (random unless one is given) in its query;
//! the URL printed carries it and the page passes it on. The one request
//! that changes anything, an answer to a parked permission request, is a
//! `POST` with the token in a header, a JSON body, and no other origin (see
//! `approvals`). A request on
//! loopback must name a loopback host (a page elsewhere cannot reach it by
//! rebinding a DNS name). No CORS header is ever sent; every response
//! carries a strict Content-Security-Policy (no inline script, no other
//! origin), `nosniff`, no referrer and no caching. Everything a model or
//! an agent wrote reaches the page as JSON and is put into the page as
//! text (never as HTML), with control characters and bidi overrides shown
//! as visible escapes; long texts arrive cut and are folded. Connections
//! and event streams are capped, connections without the token on a budget
//! of their own (they cannot crowd out the page: see `gate`), request
//! heads and bodies must arrive within seconds, and every answer is bounded (a page of rows, a tree of at most
//! 5,000 nodes, a transcript's texts cut at 256 KiB each and 8 MiB in all, read only
//! that far).
//!
//! ```no_run
//! use subagents::serve::{serve_ui, Board, UiOptions};
//!
//! let board = Board::new();
//! let server = serve_ui(UiOptions::new().home("/tmp/home"), Some(board.clone())).unwrap();
//! println!("open {}", server.url());
//! // … feed `board` as the batch runs (it is a `batch::Report`) …
//! server.stop();
//! ```

mod approvals;
mod board;
mod gate;
mod history;
mod http;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;

pub use board::{Board, Both};

use crate::serve::ServeError;
use crate::CancellationToken;

/// How `subagents ui` serves; see [`serve_ui`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct UiOptions {
    /// Where to listen (default `127.0.0.1:0`, a free loopback port).
    pub listen: SocketAddr,
    /// The token every request must carry (default: 128 random bits).
    pub token: Option<String>,
    /// The home whose sessions are shown.
    pub home: Option<PathBuf>,
    /// Most connections open at once (default 64).
    pub max_connections: usize,
    /// Most event streams open at once (default 8): a page holds one.
    pub max_streams: usize,
}

impl Default for UiOptions {
    fn default() -> Self {
        UiOptions::new()
    }
}

impl UiOptions {
    /// Loopback, a free port, a random token, no home.
    pub fn new() -> UiOptions {
        UiOptions {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            token: None,
            home: None,
            max_connections: 64,
            max_streams: 8,
        }
    }

    /// Listens on `listen`.
    pub fn listen(mut self, listen: SocketAddr) -> UiOptions {
        self.listen = listen;
        self
    }

    /// Requires `token` (16 to 128 letters, digits, `-` or `_`).
    pub fn token(mut self, token: impl Into<String>) -> UiOptions {
        self.token = Some(token.into());
        self
    }

    /// Shows the sessions of `home`.
    pub fn home(mut self, home: impl Into<PathBuf>) -> UiOptions {
        self.home = Some(home.into());
        self
    }
}

/// A running web view: its address, and the way to stop it. Dropping it
/// stops it too.
#[derive(Debug)]
pub struct UiServer {
    url: String,
    address: SocketAddr,
    stop: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl UiServer {
    /// The page's address, token included: what a person opens.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The address it listens on.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Serves until SIGINT, SIGTERM or SIGHUP, then stops; the signal's name.
    pub fn serve_until_signal(mut self) -> &'static str {
        let stop = self.stop.clone();
        let signal = tokio::runtime::Builder::new_current_thread().enable_all().build().map_or("none", |runtime| {
            runtime.block_on(async {
                let mut signals = crate::serve::signals::StopSignals::register();
                tokio::select! {
                    signal = signals.recv() => signal,
                    () = stop.cancelled() => "stop",
                }
            })
        });
        self.halt();
        signal
    }

    /// Stops serving: open streams end, the port is closed.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.cancel();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for UiServer {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Binds `options.listen` and serves the web view on a thread of its own
/// (with its own small runtime): the Live view of `board` when given, and
/// the trees and transcripts of the sessions of `options.home`.
///
/// The page, its script and its style are embedded in the binary; nothing
/// is fetched from elsewhere. Every request must carry the token (random
/// unless [`UiOptions::token`] sets it) in its query, as the address in
/// [`UiServer::url`] does; on loopback its `Host` must be a loopback name.
/// No CORS header is sent, and every answer carries a Content-Security-Policy
/// with no inline script, `nosniff` and no referrer. The page puts every
/// text of a model or an agent into the page as text, never as HTML, with
/// control characters and bidi overrides shown as escapes; connections,
/// event streams and every answer are bounded.
pub fn serve_ui(options: UiOptions, board: Option<Board>) -> Result<UiServer, ServeError> {
    let token = match options.token.clone() {
        Some(token) if valid_token(&token) => token,
        Some(_) => {
            return Err(ServeError::Options("a UI token is 16 to 128 letters, digits, `-` or `_`".to_owned()));
        }
        None => crate::mix::kernel_random_hex().map_err(ServeError::Runtime)?,
    };
    let listener = std::net::TcpListener::bind(options.listen)
        .map_err(|e| ServeError::Options(format!("cannot listen on {}: {e}", options.listen)))?;
    listener.set_nonblocking(true).map_err(ServeError::Runtime)?;
    let address = listener.local_addr().map_err(ServeError::Runtime)?;
    let url = format!("http://{address}/?token={token}");
    let stop = CancellationToken::new();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(ServeError::Runtime)?;
    let door = http::Door::new(token, address, board, options.home.clone(), options.max_streams);
    let (halt, max_connections) = (stop.clone(), options.max_connections.max(1));
    let thread = std::thread::Builder::new()
        .name("subagents-ui".to_owned())
        .spawn(move || {
            runtime.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(listener) => http::serve(listener, door, max_connections, halt).await,
                    Err(error) => tracing::warn!(%error, "the web view cannot use its port"),
                }
            });
            // A store read still going (a long search) is not waited for.
            runtime.shutdown_timeout(std::time::Duration::from_secs(1));
        })
        .map_err(ServeError::Runtime)?;
    Ok(UiServer { url, address, stop, thread: Some(thread) })
}

fn valid_token(token: &str) -> bool {
    (16..=128).contains(&token.len()) && token.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}
