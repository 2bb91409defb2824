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
//!
//! With `--otlp URL` (or `OTEL_EXPORTER_OTLP_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) the runs', model calls' and tool
//! calls' spans also go to an OTLP/HTTP collector, in the GenAI conventions
//! of [`subagents::telemetry`]; no log event and no message content is
//! exported. [`export`] sets it up before the log is installed and
//! [`finish_export`] sends what is left at exit.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;

use tracing::Level;
use tracing_chrome::{ChromeLayerBuilder, FlushGuard, TraceStyle};
use tracing_subscriber::filter::{filter_fn, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

use crate::terminal;

/// Our warnings, and only errors from other crates: the default of every
/// command but the services. A dependency's warning is not ours to show
/// (the ACP crate warns about every error reply it sends or gets: a child
/// that is the wrong program would print one per line it echoed); what it
/// means reaches the person as the run's diagnostic. `RUST_LOG` shows it.
pub fn warnings() -> Targets {
    Targets::new().with_target("subagents", Level::WARN).with_default(Level::ERROR)
}

/// Our lifecycle lines (info) and warnings, only errors from other
/// crates: the default of `subagents worker` and `a2a`, long-lived
/// services whose operator wants to see them start, drain and stop.
pub fn our_lifecycle() -> Targets {
    Targets::new().with_target("subagents", Level::INFO).with_default(Level::ERROR)
}

/// Installs the stderr log with the level `RUST_LOG` asks for, else
/// `default`; and, given a trace file, a Chrome trace of the runtime's
/// spans (each run, its model calls and tool calls, nested runs inside
/// their parent's tool call) whatever the stderr level. Keep the returned
/// [`Trace`] until the work is done, then [`Trace::finish`] it.
pub fn install(default: Targets, trace: Option<File>) -> Option<Trace> {
    let default = || default.clone();
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.trim().is_empty() => Targets::from_str(&directives).unwrap_or_else(|error| {
            terminal::say!("subagents: RUST_LOG {directives:?} ignored ({error}); logging warnings");
            default()
        }),
        _ => default(),
    };
    let stderr = tracing_subscriber::fmt::layer().with_ansi(false).with_writer(|| TerminalStderr).with_filter(filter);
    let otlp = EXPORT.get().map(|provider| {
        let layer = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("subagents"))
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false);
        // Spans only, and only those in the GenAI conventions: an event may
        // quote a child or a model, and content is never exported.
        layer.with_filter(filter_fn(|meta| meta.is_span() && meta.fields().field("gen_ai.operation.name").is_some()))
    });
    let (chrome, trace) = match trace {
        Some(file) => {
            let failure = Arc::new(OnceLock::new());
            let (layer, guard) = ChromeLayerBuilder::new()
                .writer(BufWriter::new(TraceFile { file, failure: failure.clone() }))
                .trace_style(TraceStyle::Async)
                .include_args(true)
                .include_locations(false)
                .build();
            let spans = Targets::new().with_target("subagents", Level::DEBUG);
            (Some(layer.with_filter(spans)), Some(Trace { guard, failure }))
        }
        None => (None, None),
    };
    // Fails only when a subscriber is already set, which nothing here does.
    let _ = tracing_subscriber::registry().with(stderr).with(chrome).with(otlp).try_init();
    trace
}

/// The `--trace` file being written.
pub struct Trace {
    guard: FlushGuard,
    failure: Arc<OnceLock<String>>,
}

impl Trace {
    /// Finishes the file (call once every run's span has closed); answers
    /// why it is incomplete, when a write failed.
    pub fn finish(self) -> Result<(), String> {
        drop(self.guard);
        self.failure.get().map_or(Ok(()), |failure| Err(failure.clone()))
    }
}

/// The trace file under the Chrome layer's writing thread. After its first
/// failed write (a full disk) it takes every byte and keeps none, with one
/// warning: the thread neither panics on the error nor falls behind, where
/// the spans it had not written would pile up in its queue.
struct TraceFile {
    file: File,
    failure: Arc<OnceLock<String>>,
}

impl TraceFile {
    fn give_up(&self, error: &io::Error) {
        if self.failure.set(error.to_string()).is_ok() {
            terminal::say!("subagents: the trace stopped ({error}): the runs go on, the trace file will be incomplete");
        }
    }
}

impl Write for TraceFile {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        if self.failure.get().is_some() {
            return Ok(bytes.len());
        }
        match self.file.write(bytes) {
            Err(error) if error.kind() != io::ErrorKind::Interrupted => {
                self.give_up(&error);
                Ok(bytes.len())
            }
            written => written,
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.failure.get().is_none() {
            if let Err(error) = self.file.flush() {
                self.give_up(&error);
            }
        }
        Ok(())
    }
}

/// The OTLP span export, once [`export`] set it up.
static EXPORT: OnceLock<SdkTracerProvider> = OnceLock::new();

/// Sets up the OTLP/HTTP (protobuf) export of the GenAI spans to
/// `endpoint` (`--otlp`, a collector's base URL: `/v1/traces` is added),
/// else to what `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or
/// `OTEL_EXPORTER_OTLP_ENDPOINT` name; nothing when none is set. The
/// service is `OTEL_SERVICE_NAME`, else `subagents`. Call before [`install`].
pub fn export(endpoint: Option<&str>) -> Result<(), String> {
    let from_env = ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"]
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|value| !value.is_empty()));
    if endpoint.is_none() && !from_env {
        return Ok(());
    }
    let mut exporter = opentelemetry_otlp::SpanExporter::builder().with_http().with_protocol(Protocol::HttpBinary);
    if let Some(endpoint) = endpoint {
        let url = endpoint.trim_end_matches('/');
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!("--otlp {endpoint:?} is not an http:// or https:// URL"));
        }
        let url = if url.ends_with("/v1/traces") { url.to_owned() } else { format!("{url}/v1/traces") };
        exporter = exporter.with_endpoint(url);
    }
    // An https collector needs the TLS provider the model clients use.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let exporter = exporter.build().map_err(|error| format!("the OTLP exporter: {error}"))?;
    let named = std::env::var_os("OTEL_SERVICE_NAME").is_some_and(|name| !name.is_empty());
    let resource = match named {
        true => Resource::builder().build(),
        false => Resource::builder().with_service_name("subagents").build(),
    };
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
    if EXPORT.set(provider).is_ok() {
        subagents::telemetry::record_gen_ai(true);
    }
    Ok(())
}

/// Exports the spans still queued and stops the exporter (bounded by the
/// exporter's own timeout); a failure is reported on stderr.
pub fn finish_export() {
    if let Some(provider) = EXPORT.get() {
        if let Err(error) = provider.shutdown() {
            terminal::say!("subagents: OTLP export: {error}");
        }
    }
}

/// Stderr, each event's line made safe by [`terminal::line`].
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
