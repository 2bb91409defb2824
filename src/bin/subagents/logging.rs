//! The binary's log: the library's `tracing` warnings and errors, on stderr.
//!
//! The library reports what it cannot return (a child that could not be
//! created, a session line that could not be written, a listener that
//! panicked) through `tracing`. Without a subscriber all of it was dropped;
//! [`install`] sends it to stderr at `warn` and above.
//!
//! `RUST_LOG` picks the level, as a list of `target=level` directives with
//! an optional bare default level (`tracing_subscriber`'s `Targets` syntax,
//! chosen over `EnvFilter` so the binary carries no regex engine):
//!
//! ```text
//! RUST_LOG=off                       nothing
//! RUST_LOG=debug                     everything from debug up
//! RUST_LOG=warn,subagents::agent=debug
//! ```
//!
//! A value it cannot parse is reported once and the default kept. Lines go
//! through [`crate::terminal`]: a logged error may quote a child or a model.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::str::FromStr;

use tracing::Level;
use tracing_chrome::{ChromeLayerBuilder, FlushGuard, TraceStyle};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

use crate::terminal;

/// Warnings and errors from everywhere: the default of `run` and `fanout`.
pub fn warnings() -> Targets {
    Targets::new().with_default(Level::WARN)
}

/// Our warnings, and only errors from other crates: the default of
/// `subagents acp`, whose protocol crate warns about every error reply it
/// sends (a client's bad request is not our warning).
pub fn our_warnings() -> Targets {
    Targets::new().with_target("subagents", Level::WARN).with_default(Level::ERROR)
}

/// Our lifecycle lines (info) and everyone's warnings: the default of
/// `subagents worker`, a long-lived service whose operator wants to see it
/// start, drain and stop.
pub fn our_lifecycle() -> Targets {
    Targets::new().with_target("subagents", Level::INFO).with_default(Level::WARN)
}

/// Installs the stderr log with the level `RUST_LOG` asks for, else
/// `default`; and, given a trace file, a Chrome trace of the runtime's
/// spans (each run, its model calls and tool calls, nested runs inside
/// their parent's tool call) whatever the stderr level. Keep the returned
/// guard until the work is done: dropping it finishes the file.
pub fn install(default: Targets, trace: Option<File>) -> Option<FlushGuard> {
    let default = || default.clone();
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.trim().is_empty() => Targets::from_str(&directives).unwrap_or_else(|error| {
            terminal::say!("subagents: RUST_LOG {directives:?} ignored ({error}); logging warnings");
            default()
        }),
        _ => default(),
    };
    let stderr = tracing_subscriber::fmt::layer().with_ansi(false).with_writer(|| TerminalStderr).with_filter(filter);
    let (chrome, guard) = match trace {
        Some(file) => {
            let (layer, guard) = ChromeLayerBuilder::new()
                .writer(BufWriter::new(file))
                .trace_style(TraceStyle::Async)
                .include_args(true)
                .include_locations(false)
                .build();
            let spans = Targets::new().with_target("subagents", Level::DEBUG);
            (Some(layer.with_filter(spans)), Some(guard))
        }
        None => (None, None),
    };
    // Fails only when a subscriber is already set, which nothing here does.
    let _ = tracing_subscriber::registry().with(stderr).with(chrome).try_init();
    guard
}

/// Stderr, each event's line with its control characters removed.
struct TerminalStderr;

impl Write for TerminalStderr {
    /// The fmt layer writes each event as one whole line.
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(bytes);
        let (body, end) = match text.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (&*text, ""),
        };
        write!(io::stderr().lock(), "{}{end}", terminal::line(body))?;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}
