//! How a serving command is asked to stop by the process that started it:
//! SIGINT, SIGTERM or SIGHUP, each taken as the end of its input.
//!
//! A stdio server's client ends it by closing stdin, and that path is the
//! careful one: every run is cancelled and records its stop reason, every
//! request gets its answer, no child process survives. But clients also
//! stop servers with signals (an MCP client sends SIGINT, then SIGTERM,
//! then SIGKILL a moment apart; a terminal sends SIGHUP when it closes),
//! and a signal's default action kills the process mid-run, leaving
//! sessions without a turn end. So `subagents mcp`, `acp` and `serve` read
//! any of the three as EOF ([`StopSignals::recv`] beside the stdin reader),
//! and `subagents worker` drains on them as it does on SIGTERM.
//!
//! Once registered, the handlers stay for the life of the process: a
//! second signal changes nothing (the EOF path is already bounded), and
//! SIGKILL remains the way to end it at once.

use tokio::signal::unix::{signal, Signal, SignalKind};

/// The three stop signals, registered: from here on they no longer kill
/// the process.
#[derive(Debug)]
pub(crate) struct StopSignals {
    /// `None` where a handler could not be installed (logged): that signal
    /// keeps its default action.
    handlers: Vec<(&'static str, Option<Signal>)>,
}

impl StopSignals {
    /// Installs the handlers. Call it on a tokio runtime with I/O enabled.
    pub(crate) fn register() -> StopSignals {
        let kinds = [
            ("SIGINT", SignalKind::interrupt()),
            ("SIGTERM", SignalKind::terminate()),
            ("SIGHUP", SignalKind::hangup()),
        ];
        let handlers = kinds
            .into_iter()
            .map(|(name, kind)| match signal(kind) {
                Ok(handler) => (name, Some(handler)),
                Err(error) => {
                    tracing::warn!(signal = name, %error, "cannot handle the signal; it ends the process at once");
                    (name, None)
                }
            })
            .collect();
        StopSignals { handlers }
    }

    /// Waits for the next stop signal and names it.
    pub(crate) async fn recv(&mut self) -> &'static str {
        let waits = self.handlers.iter_mut().filter_map(|(name, handler)| {
            let handler = handler.as_mut()?;
            Some(Box::pin(async move {
                // `None`: the runtime is going away; that is no signal.
                if handler.recv().await.is_none() {
                    std::future::pending::<()>().await;
                }
                *name
            }))
        });
        let waits: Vec<_> = waits.collect();
        if waits.is_empty() {
            return std::future::pending().await;
        }
        futures_util::future::select_all(waits).await.0
    }
}
