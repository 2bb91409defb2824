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

use serde_json::Value;

use crate::agent::model::http::{excerpt, parse_arguments, CallLimits};
use crate::agent::model::{ChunkSink, Finish, ModelError, ModelReply, Usage};
use crate::agent::session::ToolCall;

/// Most content blocks one answer may open; far above what a model writes,
/// and each costs bytes of the stream besides.
const MAX_BLOCKS: usize = 4096;

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
    pub(super) stopped: bool,
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
    pub(super) fn new(limits: CallLimits) -> Self {
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

    /// Takes one streamed event's payload.
    pub(super) fn event(&mut self, data: &[u8], sink: Option<&ChunkSink>) -> Result<(), ModelError> {
        let event: Value = serde_json::from_slice(data)
            .map_err(|_| ModelError::Malformed("a streamed event is not JSON".to_owned()))?;
        let Some(kind) = event["type"].as_str() else {
            return Err(ModelError::Malformed("a streamed event has no type".to_owned()));
        };
        match kind {
            "message_start" => self.merge_usage(&event["message"]["usage"]),
            "content_block_start" => self.start_block(index_of(&event)?, &event["content_block"], sink)?,
            "content_block_delta" => self.delta(index_of(&event)?, &event["delta"], sink)?,
            "message_delta" => {
                if let Some(reason) = event["delta"]["stop_reason"].as_str() {
                    self.stop_reason = Some(reason.to_owned());
                }
                self.merge_usage(&event["usage"]);
            }
            "message_stop" => self.stopped = true,
            "error" => {
                let error = &event["error"];
                let kind = error["type"].as_str().unwrap_or("error");
                let message = error["message"].as_str().unwrap_or_default();
                return Err(ModelError::BrokeOff(format!("the stream reported {kind}: {}", excerpt(message))));
            }
            _ => {} // content_block_stop, ping, and types added since
        }
        Ok(())
    }

    /// Takes a whole (non-streamed) message.
    pub(super) fn whole(body: &[u8], limits: CallLimits) -> Result<Self, ModelError> {
        let value: Value =
            serde_json::from_slice(body).map_err(|_| ModelError::Malformed("the body is not JSON".to_owned()))?;
        let Some(content) = value["content"].as_array() else {
            return Err(ModelError::Malformed("the body has no content".to_owned()));
        };
        let mut message = Message::new(limits);
        for (index, block) in content.iter().enumerate() {
            message.start_block(index as u64, block, None)?;
        }
        message.stop_reason = value["stop_reason"].as_str().map(str::to_owned);
        message.merge_usage(&value["usage"]);
        message.stopped = true;
        Ok(message)
    }

    fn start_block(&mut self, index: u64, block: &Value, sink: Option<&ChunkSink>) -> Result<(), ModelError> {
        if self.positions.contains_key(&index) {
            return Err(ModelError::Malformed(format!("content block {index} started twice")));
        }
        if self.blocks.len() >= MAX_BLOCKS {
            return Err(ModelError::Malformed(format!("the answer opens more than {MAX_BLOCKS} content blocks")));
        }
        let started = match block["type"].as_str() {
            Some("text") => {
                let text = block["text"].as_str().unwrap_or_default();
                emit(sink, text);
                Block::Text(text.to_owned())
            }
            Some("tool_use") => {
                self.calls += 1;
                self.limits.check_calls(self.calls)?;
                let (Some(id), Some(name)) = (block["id"].as_str(), block["name"].as_str()) else {
                    return Err(ModelError::Malformed("a tool_use block has no id or name".to_owned()));
                };
                // Streamed, the input starts empty and comes as deltas;
                // whole, it is all here.
                let arguments = match &block["input"] {
                    Value::Object(input) if !input.is_empty() => block["input"].to_string(),
                    Value::Object(_) | Value::Null => String::new(),
                    _ => return Err(ModelError::Malformed("a tool_use block's input is not an object".to_owned())),
                };
                self.limits.check_arguments(arguments.len())?;
                Block::ToolUse { id: id.to_owned(), name: name.to_owned(), arguments }
            }
            Some(_) => Block::Skipped,
            None => return Err(ModelError::Malformed("a content block has no type".to_owned())),
        };
        self.positions.insert(index, self.blocks.len());
        self.blocks.push(started);
        Ok(())
    }

    fn delta(&mut self, index: u64, delta: &Value, sink: Option<&ChunkSink>) -> Result<(), ModelError> {
        let Some(&position) = self.positions.get(&index) else {
            return Err(ModelError::Malformed(format!("a delta for content block {index}, which never started")));
        };
        match (&mut self.blocks[position], delta["type"].as_str()) {
            (Block::Text(text), Some("text_delta")) => {
                let part = delta["text"].as_str().unwrap_or_default();
                emit(sink, part);
                text.push_str(part);
            }
            (Block::ToolUse { arguments, .. }, Some("input_json_delta")) => {
                let part = delta["partial_json"].as_str().unwrap_or_default();
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
    fn merge_usage(&mut self, usage: &Value) {
        if !usage.is_object() {
            return;
        }
        let mut merged = self.usage.unwrap_or_default();
        let field = |name: &str, old: u64| usage[name].as_u64().unwrap_or(old);
        merged.input = field("input_tokens", merged.input);
        merged.output = field("output_tokens", merged.output);
        merged.cache_read = field("cache_read_input_tokens", merged.cache_read);
        merged.cache_write = field("cache_creation_input_tokens", merged.cache_write);
        self.usage = Some(merged);
    }

    /// Whether the answer got as far as its stop reason.
    pub(super) fn finished(&self) -> bool {
        self.stopped || self.stop_reason.is_some()
    }

    pub(super) fn into_reply(self) -> ModelReply {
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
        ModelReply { text, tool_calls, finish, usage }
    }
}

fn index_of(event: &Value) -> Result<u64, ModelError> {
    event["index"].as_u64().ok_or_else(|| ModelError::Malformed("a content block event has no index".to_owned()))
}

fn emit(sink: Option<&ChunkSink>, text: &str) {
    if let (Some(sink), false) = (sink, text.is_empty()) {
        sink(text);
    }
}
