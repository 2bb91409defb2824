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
//! | `tool_call` | `execute_tool {tool}` | `internal` | `gen_ai.operation.name` = `execute_tool`, `gen_ai.tool.name`, `gen_ai.tool.call.id` |
//!
//! They are filled only after [`record_gen_ai`]`(true)`, which whoever
//! installs an exporter calls: a log on stderr keeps its short span lines,
//! and a process that exports nothing pays one relaxed load per span.
//! Message content (prompts, replies, tool arguments and results) is never
//! recorded on these spans, and while they are filled a run's `label`
//! (which a model may have written) is left off its span.
//!
//! ```
//! subagents::telemetry::record_gen_ai(true);
//! assert!(subagents::telemetry::records_gen_ai());
//! # subagents::telemetry::record_gen_ai(false);
//! ```

use std::sync::atomic::{AtomicBool, Ordering};

use tracing::Span;

use crate::seam::{RunResult, StopReason};

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
pub(crate) fn invoke_agent(span: &Span, provider: &str, run_id: u64, out_of_process: bool) {
    if !fill(span) {
        return;
    }
    span.record("otel.name", format_args!("invoke_agent {provider}"));
    span.record("otel.kind", if out_of_process { "client" } else { "internal" });
    span.record("gen_ai.operation.name", "invoke_agent");
    span.record("gen_ai.agent.name", provider);
    span.record("gen_ai.agent.id", format_args!("{run_id}"));
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
