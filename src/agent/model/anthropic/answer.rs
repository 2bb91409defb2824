//! Reading one Messages API answer, whole or streamed, into a
//! [`ModelReply`].
//!
//! A stream is a sequence of events, each a `data:` payload naming its
//! `type`: `message_start` (the usage so far), `content_block_start` (a
//! text block, or a `tool_use` block with its id and name, keyed by
//! `index`), `content_block_delta` (a `text_delta`, or an
//! `input_json_delta` slice of a call's arguments), `content_block_stop`,
//! `message_delta` (the stop reason and the cumulative usage),
//! `message_stop`, `ping`, and `error`, which ends the answer. Events of
//! other types, and blocks of other kinds (thinking, server tools), are
//! skipped, as the API asks of clients. A whole body is the same blocks in
//! its `content`.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::Value;

use crate::agent::model::http::{
    excerpt, kind_of, not_read, parse_arguments, read_event, token_count, Answer, CallLimits,
};
use crate::agent::model::{ChunkSink, Finish, ModelError, ModelReply, Usage};
use crate::agent::session::ToolCall;

/// What an answer that cannot be read is not.
const ANSWER: &str = "a Messages answer";

/// Most content blocks one answer may open; far above what a model writes,
/// and each costs bytes of the stream besides.
const MAX_BLOCKS: usize = 4096;

/// One streamed event: its `type` says which of the other fields it uses.
/// Every field may be missing; unknown ones are ignored.
#[derive(Deserialize)]
struct Event {
    #[serde(rename = "type")]
    kind: Option<String>,
    index: Option<u64>,
    /// `message_start`: the message so far (its usage).
    message: Option<StartedMessage>,
    /// `content_block_start`.
    content_block: Option<WireBlock>,
    /// `content_block_delta` (a piece of a block) or `message_delta` (the
    /// stop reason).
    delta: Option<WireDelta>,
    usage: Option<UsageFields>,
    error: Option<ErrorBody>,
}

#[derive(Deserialize)]
struct StartedMessage {
    usage: Option<UsageFields>,
}

/// A whole (non-streamed) message.
#[derive(Deserialize)]
struct WholeMessage {
    content: Option<Vec<WireBlock>>,
    stop_reason: Option<String>,
    usage: Option<UsageFields>,
}

/// A content block as the wire has it: `text` or `tool_use` are read, any
/// other type is skipped.
#[derive(Deserialize)]
struct WireBlock {
    #[serde(rename = "type")]
    kind: Option<String>,
    text: Option<String>,
    id: Option<String>,
    name: Option<String>,
    /// A call's arguments, whole: kept as JSON (an object, checked).
    input: Option<Value>,
}

#[derive(Deserialize)]
struct WireDelta {
    #[serde(rename = "type")]
    kind: Option<String>,
    text: Option<String>,
    partial_json: Option<String>,
    stop_reason: Option<String>,
}

/// Usage counts, each where reported.
#[derive(Deserialize)]
struct UsageFields {
    #[serde(default, deserialize_with = "token_count")]
    input_tokens: Option<u64>,
    #[serde(default, deserialize_with = "token_count")]
    output_tokens: Option<u64>,
    #[serde(default, deserialize_with = "token_count")]
    cache_read_input_tokens: Option<u64>,
    #[serde(default, deserialize_with = "token_count")]
    cache_creation_input_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(rename = "type")]
    kind: Option<String>,
    message: Option<String>,
}

enum Block {
    Text(String),
    ToolUse {
        id: String,
        name: String,
        arguments: String,
    },
    /// Thinking, a server tool's use or result, …: not part of the answer.
    Skipped,
}

/// The answer so far.
pub(super) struct Message {
    blocks: Vec<Block>,
    /// Where each wire `index` sits in `blocks`.
    positions: HashMap<u64, usize>,
    calls: usize,
    limits: CallLimits,
    stop_reason: Option<String>,
    usage: Option<WireUsage>,
    /// `message_stop` arrived.
    stopped: bool,
}

/// The usage as the API counts it: cached input apart from the rest.
#[derive(Default, Clone, Copy)]
struct WireUsage {
    input: u64,
    output: u64,
    cache_read: u64,
    cache_write: u64,
}

impl Message {
    /// Takes a whole (non-streamed) message.
    fn from_body(body: &[u8], limits: CallLimits) -> Result<Self, ModelError> {
        let whole: WholeMessage = serde_json::from_slice(body).map_err(|error| not_read(ANSWER, "the body", &error))?;
        let Some(content) = whole.content else {
            return Err(ModelError::Malformed("the body has no content".to_owned()));
        };
        let mut message = Message::new(limits);
        for (index, block) in content.into_iter().enumerate() {
            message.start_block(index as u64, Some(block), None)?;
        }
        message.stop_reason = whole.stop_reason;
        message.merge_usage(whole.usage);
        message.stopped = true;
        Ok(message)
    }

    fn start_block(
        &mut self,
        index: u64,
        block: Option<WireBlock>,
        sink: Option<&ChunkSink>,
    ) -> Result<(), ModelError> {
        if self.positions.contains_key(&index) {
            return Err(ModelError::Malformed(format!("content block {index} started twice")));
        }
        if self.blocks.len() >= MAX_BLOCKS {
            return Err(ModelError::Malformed(format!("the answer opens more than {MAX_BLOCKS} content blocks")));
        }
        let Some(block) = block.filter(|block| block.kind.is_some()) else {
            return Err(ModelError::Malformed("a content block has no type".to_owned()));
        };
        let started = match block.kind.as_deref() {
            Some("text") => {
                let text = block.text.unwrap_or_default();
                emit(sink, &text);
                Block::Text(text)
            }
            Some("tool_use") => {
                self.calls += 1;
                self.limits.check_calls(self.calls)?;
                let (Some(id), Some(name)) = (block.id, block.name) else {
                    return Err(ModelError::Malformed("a tool_use block has no id or name".to_owned()));
                };
                // Streamed, the input starts empty and comes as deltas;
                // whole, it is all here.
                let arguments = match &block.input {
                    Some(input @ Value::Object(fields)) if !fields.is_empty() => input.to_string(),
                    Some(Value::Object(_) | Value::Null) | None => String::new(),
                    Some(_) => {
                        return Err(ModelError::Malformed("a tool_use block's input is not an object".to_owned()))
                    }
                };
                self.limits.check_arguments(arguments.len())?;
                Block::ToolUse { id, name, arguments }
            }
            Some(_) => Block::Skipped,
            None => return Err(ModelError::Malformed("a content block has no type".to_owned())),
        };
        self.positions.insert(index, self.blocks.len());
        self.blocks.push(started);
        Ok(())
    }

    fn delta(&mut self, index: u64, delta: Option<WireDelta>, sink: Option<&ChunkSink>) -> Result<(), ModelError> {
        let Some(&position) = self.positions.get(&index) else {
            return Err(ModelError::Malformed(format!("a delta for content block {index}, which never started")));
        };
        let Some(delta) = delta else { return Ok(()) };
        match (&mut self.blocks[position], delta.kind.as_deref()) {
            (Block::Text(text), Some("text_delta")) => {
                let part = delta.text.as_deref().unwrap_or_default();
                emit(sink, part);
                text.push_str(part);
            }
            (Block::ToolUse { arguments, .. }, Some("input_json_delta")) => {
                let part = delta.partial_json.as_deref().unwrap_or_default();
                self.limits.check_arguments(arguments.len() + part.len())?;
                arguments.push_str(part);
            }
            (Block::Text(_), Some("input_json_delta")) | (Block::ToolUse { .. }, Some("text_delta")) => {
                return Err(ModelError::Malformed(format!("content block {index} got a delta of another kind")));
            }
            _ => {} // citations, thinking, signatures, a skipped block's deltas
        }
        Ok(())
    }

    /// Usage fields present here replace those seen before (the stream's
    /// counts are cumulative).
    fn merge_usage(&mut self, usage: Option<UsageFields>) {
        let Some(usage) = usage else { return };
        let mut merged = self.usage.unwrap_or_default();
        merged.input = usage.input_tokens.unwrap_or(merged.input);
        merged.output = usage.output_tokens.unwrap_or(merged.output);
        merged.cache_read = usage.cache_read_input_tokens.unwrap_or(merged.cache_read);
        merged.cache_write = usage.cache_creation_input_tokens.unwrap_or(merged.cache_write);
        self.usage = Some(merged);
    }
}

impl Answer for Message {
    fn new(limits: CallLimits) -> Self {
        Message {
            blocks: Vec::new(),
            positions: HashMap::new(),
            calls: 0,
            limits,
            stop_reason: None,
            usage: None,
            stopped: false,
        }
    }

    fn whole(body: &[u8], limits: CallLimits) -> Result<ModelReply, ModelError> {
        Message::from_body(body, limits)?.into_reply()
    }

    /// Takes one streamed event's payload.
    fn event(&mut self, data: &[u8], sink: Option<&ChunkSink>) -> Result<(), ModelError> {
        let event: Event = read_event(ANSWER, data)?;
        match kind_of(event.kind.as_deref())? {
            "message_start" => self.merge_usage(event.message.and_then(|message| message.usage)),
            "content_block_start" => self.start_block(index_of(&event)?, event.content_block, sink)?,
            "content_block_delta" => self.delta(index_of(&event)?, event.delta, sink)?,
            "message_delta" => {
                if let Some(reason) = event.delta.and_then(|delta| delta.stop_reason) {
                    self.stop_reason = Some(reason);
                }
                self.merge_usage(event.usage);
            }
            "message_stop" => self.stopped = true,
            "error" => {
                let error = event.error.unwrap_or(ErrorBody { kind: None, message: None });
                let kind = error.kind.as_deref().unwrap_or("error");
                let message = error.message.as_deref().unwrap_or_default();
                return Err(ModelError::BrokeOff(format!("the stream reported {kind}: {}", excerpt(message))));
            }
            _ => {} // content_block_stop, ping, and types added since
        }
        Ok(())
    }

    fn ended(&self) -> bool {
        self.stopped
    }

    /// Whether the answer got as far as its stop reason.
    fn finished(&self) -> bool {
        self.stopped || self.stop_reason.is_some()
    }

    fn into_reply(self) -> Result<ModelReply, ModelError> {
        let mut text = String::new();
        let mut tool_calls = Vec::new();
        for block in self.blocks {
            match block {
                Block::Text(part) => text.push_str(&part),
                Block::ToolUse { id, name, arguments } => {
                    tool_calls.push(ToolCall { id, name, arguments: parse_arguments(&arguments) })
                }
                Block::Skipped => {}
            }
        }
        let finish = match self.stop_reason.as_deref() {
            // A paused turn (a server tool's long run) is not resumed: no
            // server tools are ever sent, and the answer as it stands is
            // cut short, as at the token limit.
            Some("max_tokens" | "model_context_window_exceeded" | "pause_turn") => Finish::MaxTokens,
            Some("refusal") => Finish::Refusal,
            // `tool_use`; and calls under any other reason are still asked
            // for, as the chat adapter does.
            _ if !tool_calls.is_empty() => Finish::ToolCalls,
            _ => Finish::Stop, // end_turn, stop_sequence
        };
        let usage = self.usage.map(|u| Usage {
            // The API counts cached input apart already, as `Usage` does.
            input_tokens: u.input,
            output_tokens: u.output,
            cache_read_tokens: u.cache_read,
            cache_write_tokens: u.cache_write,
        });
        Ok(ModelReply { text, tool_calls, finish, usage })
    }
}

fn index_of(event: &Event) -> Result<u64, ModelError> {
    event.index.ok_or_else(|| ModelError::Malformed("a content block event has no index".to_owned()))
}

fn emit(sink: Option<&ChunkSink>, text: &str) {
    if let (Some(sink), false) = (sink, text.is_empty()) {
        sink(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: CallLimits = CallLimits { calls: 4, argument_bytes: 64 };

    #[test]
    fn a_usage_count_that_is_negative_reads_as_absent() {
        let body = br#"{"content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 10, "output_tokens": -1, "cache_read_input_tokens": -7}}"#;
        let reply = Message::whole(body, LIMITS).unwrap();
        let usage = reply.usage.unwrap();
        assert_eq!(
            (reply.text.as_str(), usage.input_tokens, usage.output_tokens, usage.cache_read_tokens),
            ("ok", 10, 0, 0)
        );
    }
}
