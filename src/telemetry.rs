//! The runtime's spans in the OpenTelemetry GenAI semantic conventions.
//!
//! Every run, model call and tool call already has a `tracing` span
//! (`run`, `model_call`, `tool_call`). Each span also declares, empty, the
//! fields a `tracing`-to-OpenTelemetry bridge (such as
//! `tracing-opentelemetry`) reads as the span's name, kind and attributes:
//!
//! | span | `otel.name` | `otel.kind` | attributes |
//! | --- | --- | --- | --- |
//! | `run` | `invoke_agent {provider}` | `client` for a child in another process (acp, process, remote), else `internal` | `gen_ai.operation.name` = `invoke_agent`, `gen_ai.agent.name` (the provider), `gen_ai.agent.id` (the run id), `gen_ai.conversation.id` (the child's session, once known), `error.type` on failure |
//! | `model_call` | `chat {model}` | `client` | `gen_ai.operation.name` = `chat`, `gen_ai.provider.name`, `gen_ai.request.model`, `gen_ai.response.finish_reasons`, `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens` |
//! | `served` (`subagents serve`'s session, `subagents acp`'s prompt) | `invoke_agent {agent}` | `server` | `gen_ai.operation.name` = `invoke_agent`, `gen_ai.agent.name`, `gen_ai.conversation.id`, `gen_ai.request.model` |
//! | `served_tool` (a call `subagents mcp` answers) | `execute_tool {tool}` | `server` | `gen_ai.operation.name` = `execute_tool`, `gen_ai.tool.name` |
//! | `tool_call` | `execute_tool {tool}` | `internal` | `gen_ai.operation.name` = `execute_tool`, `gen_ai.tool.name`, `gen_ai.tool.call.id` |
//!
//! A run's span also carries `gen_ai.request.model` (the run's model when
//! its request or provider names one) and, once it ends,
//! `gen_ai.usage.input_tokens` / `gen_ai.usage.output_tokens`: what the
//! run's model calls spent, its children's included.
//!
//! They are filled only after [`record_gen_ai`]`(true)`, which whoever
//! installs an exporter calls: a log on stderr keeps its short span lines,
//! and a process that exports nothing pays one relaxed load per span.
//! Message content (prompts, replies, tool arguments and results) is never
//! recorded on these spans, and while they are filled a run's `label`
//! (which a model may have written) is left off its span.
//!
//! ## Across wires
//!
//! With the `otel` feature and recording on, a child in another process
//! joins its parent's trace: the W3C `traceparent` (and `tracestate`) of
//! the span that starts it crosses the wire — the `process` provider's
//! `initialize`, the `remote` provider's run request, MCP and ACP `_meta` —
//! and the receiving side makes it the remote parent of its own span.
//! Without the feature, or with recording off, nothing is sent and a
//! received one is ignored. A received context is untrusted: one that is
//! malformed or oversized is dropped, never an error.
//!
//! ```
//! subagents::telemetry::record_gen_ai(true);
//! assert!(subagents::telemetry::records_gen_ai());
//! # subagents::telemetry::record_gen_ai(false);
//! ```

use std::sync::atomic::{AtomicBool, Ordering};

use tracing::Span;

/// A span declaring, empty, every OpenTelemetry and GenAI field the table
/// above names (a field never recorded is never exported), after the
/// span's own fields: one list, so the spans cannot drift apart.
macro_rules! gen_ai_span {
    ($level:ident, $name:literal, $($field:tt)*) => {
        tracing::span!(
            tracing::Level::$level,
            $name,
            $($field)*
            otel.name = tracing::field::Empty,
            otel.kind = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
            gen_ai.operation.name = tracing::field::Empty,
            gen_ai.agent.name = tracing::field::Empty,
            gen_ai.agent.id = tracing::field::Empty,
            gen_ai.conversation.id = tracing::field::Empty,
            gen_ai.provider.name = tracing::field::Empty,
            gen_ai.request.model = tracing::field::Empty,
            gen_ai.response.finish_reasons = tracing::field::Empty,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            gen_ai.tool.name = tracing::field::Empty,
            gen_ai.tool.call.id = tracing::field::Empty,
            error.type = tracing::field::Empty,
        )
    };
}
pub(crate) use gen_ai_span;

use crate::seam::{RunResult, StopReason, TraceContext};

/// The context of the span we are in, to send to a child: only while
/// recording, and only when an OpenTelemetry layer gave it an id.
pub(crate) fn current_trace() -> Option<TraceContext> {
    #[cfg(feature = "otel")]
    {
        use opentelemetry::trace::TraceContextExt as _;
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        let span = Span::current();
        if !fill(&span) {
            return None;
        }
        let context = span.context();
        let span_context = context.span().span_context().clone();
        if !span_context.is_valid() {
            return None;
        }
        let traceparent = format!(
            "00-{}-{}-{:02x}",
            span_context.trace_id(),
            span_context.span_id(),
            span_context.trace_flags().to_u8()
        );
        let state = span_context.trace_state().header();
        let tracestate = (!state.is_empty()).then_some(state);
        Some(TraceContext { traceparent, tracestate })
    }
    #[cfg(not(feature = "otel"))]
    None
}

/// Makes `remote` (a context received from a peer) the parent of `span`,
/// which must not have been entered yet; nothing when not recording.
pub(crate) fn adopt_parent(remote: &TraceContext, span: &Span) {
    #[cfg(feature = "otel")]
    {
        use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState};
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        if !fill(span) {
            return;
        }
        let parts: Vec<&str> = remote.traceparent.split('-').collect();
        let (Ok(trace_id), Ok(span_id), Ok(flags)) =
            (TraceId::from_hex(parts[1]), SpanId::from_hex(parts[2]), u8::from_str_radix(parts[3], 16))
        else {
            return;
        };
        let state = remote.tracestate.as_deref().and_then(|state| state.parse::<TraceState>().ok()).unwrap_or_default();
        let remote = SpanContext::new(trace_id, span_id, TraceFlags::new(flags), true, state);
        let parent = opentelemetry::Context::new().with_remote_span_context(remote);
        // Only a span already entered refuses, and we are given new ones.
        let _ = span.set_parent(parent);
    }
    #[cfg(not(feature = "otel"))]
    let _ = (remote, span);
}

static RECORDING: AtomicBool = AtomicBool::new(false);

/// Fill the GenAI fields of the spans created from now on (`true`), or
/// leave them empty (`false`, the default).
pub fn record_gen_ai(on: bool) {
    RECORDING.store(on, Ordering::Relaxed);
}

/// Whether the spans' GenAI fields are being filled.
pub fn records_gen_ai() -> bool {
    RECORDING.load(Ordering::Relaxed)
}

/// Whether to fill `span`'s fields: asked for, and someone listens.
fn fill(span: &Span) -> bool {
    records_gen_ai() && !span.is_disabled()
}

/// A run's span, just created: its name, kind and identity.
pub(crate) fn invoke_agent(span: &Span, provider: &str, run_id: u64, out_of_process: bool, model: Option<&str>) {
    if !fill(span) {
        return;
    }
    if let Some(model) = model {
        span.record("gen_ai.request.model", model);
    }
    span.record("otel.name", format_args!("invoke_agent {provider}"));
    span.record("otel.kind", if out_of_process { "client" } else { "internal" });
    span.record("gen_ai.operation.name", "invoke_agent");
    span.record("gen_ai.agent.name", provider);
    span.record("gen_ai.agent.id", format_args!("{run_id}"));
}

/// The span of a session served to a peer in another process: named
/// `invoke_agent {agent}`, a `server` span whose remote parent is the
/// peer's run when the peer sent its trace context.
#[cfg(any(feature = "process", all(feature = "acp", feature = "agent")))]
pub(crate) fn served(agent: &str, session: &str, model: Option<&str>, parent: Option<&TraceContext>) -> Span {
    let span = gen_ai_span!(WARN, "served", agent,);
    if !fill(&span) {
        return span;
    }
    if let Some(parent) = parent {
        adopt_parent(parent, &span);
    }
    span.record("otel.name", format_args!("invoke_agent {agent}"));
    span.record("otel.kind", "server");
    span.record("gen_ai.operation.name", "invoke_agent");
    span.record("gen_ai.agent.name", agent);
    span.record("gen_ai.conversation.id", session);
    if let Some(model) = model {
        span.record("gen_ai.request.model", model);
    }
    span
}

/// The span of a tool call served to a peer (`subagents mcp`): named
/// `execute_tool {tool}`, a `server` span whose remote parent is the
/// caller's when it sent its trace context; the runs the call starts are
/// inside it. A span that records nothing while not exporting.
#[cfg(feature = "mcp-server")]
pub(crate) fn served_tool(tool: &str, parent: Option<&TraceContext>) -> Span {
    if !records_gen_ai() {
        return Span::none();
    }
    let span = gen_ai_span!(WARN, "served_tool", tool,);
    if !fill(&span) {
        return span;
    }
    if let Some(parent) = parent {
        adopt_parent(parent, &span);
    }
    span.record("otel.name", format_args!("execute_tool {tool}"));
    span.record("otel.kind", "server");
    span.record("gen_ai.operation.name", "execute_tool");
    span.record("gen_ai.tool.name", tool);
    span
}

/// The child's session, once the run knows it.
pub(crate) fn conversation(span: &Span, session: &str) {
    if fill(span) {
        span.record("gen_ai.conversation.id", session);
    }
}

/// How the run ended: its session if it reported one, and on failure the
/// error's type (the diagnostic's category, else the stop reason).
pub(crate) fn run_ended(span: &Span, result: &RunResult) {
    if !fill(span) {
        return;
    }
    if let Some(session) = &result.child_session {
        span.record("gen_ai.conversation.id", session.as_str());
    }
    // As integers: the bridge exports a `u64` as a string.
    let count = |tokens: u64| i64::try_from(tokens).unwrap_or(i64::MAX);
    span.record("gen_ai.usage.input_tokens", count(result.usage.input_tokens));
    span.record("gen_ai.usage.output_tokens", count(result.usage.output_tokens));
    if result.stop_reason == StopReason::Error {
        match &result.diagnostic {
            Some(diagnostic) => span.record("error.type", diagnostic.category_name().as_str()),
            None => span.record("error.type", StopReason::Error.as_str()),
        };
        span.record("otel.status_code", "error");
    }
}

/// A run that failed before or outside its child's result.
pub(crate) fn run_failed(span: &Span, error_type: &str) {
    if fill(span) {
        span.record("error.type", error_type);
        span.record("otel.status_code", "error");
    }
}

/// A model call's span, just created. `model` is the model's log name,
/// `provider:model` (`openai:gpt-4o`) or one word (`scripted`).
#[cfg(feature = "agent")]
pub(crate) fn chat(span: &Span, model: &str) {
    if !fill(span) {
        return;
    }
    let (provider, requested) = model.split_once(':').unwrap_or((model, model));
    span.record("otel.name", format_args!("chat {requested}"));
    span.record("otel.kind", "client");
    span.record("gen_ai.operation.name", "chat");
    span.record("gen_ai.provider.name", provider);
    span.record("gen_ai.request.model", requested);
}

/// What a model call answered: why it finished (the conventions' name,
/// as OpenAI spells it: `stop`, `tool_calls`, `length`, `content_filter`)
/// and, when the model said, its input and output tokens.
#[cfg(feature = "agent")]
pub(crate) fn chat_answered(span: &Span, finish_reason: &str, usage: Option<(u64, u64)>) {
    if !fill(span) {
        return;
    }
    span.record("gen_ai.response.finish_reasons", finish_reason);
    if let Some((input, output)) = usage {
        span.record("gen_ai.usage.input_tokens", input);
        span.record("gen_ai.usage.output_tokens", output);
    }
}

/// A model call that failed, its `error.type` the kind of failure.
#[cfg(feature = "agent")]
pub(crate) fn chat_failed(span: &Span, error_type: &str) {
    run_failed(span, error_type);
}

/// A tool call's span, just created.
#[cfg(feature = "agent")]
pub(crate) fn execute_tool(span: &Span, tool: &str, call_id: &str) {
    if !fill(span) {
        return;
    }
    span.record("otel.name", format_args!("execute_tool {tool}"));
    span.record("otel.kind", "internal");
    span.record("gen_ai.operation.name", "execute_tool");
    span.record("gen_ai.tool.name", tool);
    span.record("gen_ai.tool.call.id", call_id);
}

#[cfg(all(test, feature = "process"))]
mod tests {
    use super::TraceContext;

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn a_received_context_is_kept_only_when_well_formed_and_bounded() {
        let kept = TraceContext::received(Some(PARENT), Some("vendor=a1")).expect("well formed");
        assert_eq!((kept.traceparent.as_str(), kept.tracestate.as_deref()), (PARENT, Some("vendor=a1")));
        for malformed in [
            "",
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
            "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
        ] {
            assert_eq!(TraceContext::received(Some(malformed), None), None, "{malformed:?}");
        }
        let long = "a=".to_owned() + &"b".repeat(600);
        for state in [long.as_str(), "", "bad\nline"] {
            let kept = TraceContext::received(Some(PARENT), Some(state)).expect("the trace is still joined");
            assert_eq!(kept.tracestate, None, "{state:?} is dropped");
        }
    }
}
