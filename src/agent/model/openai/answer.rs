//! Reading one answer of the endpoint, whole or streamed, into a
//! [`ModelReply`]: its text, its tool calls (held to [`CallLimits`], the
//! same way on both paths), why it finished, what it used.
//!
//! A stream is a sequence of `data:` payloads, each a chunk whose delta adds
//! text, a refusal, or a piece of a tool call (an id, a name, or a slice of
//! the arguments, keyed by the call's `index`), until `data: [DONE]`.
//! Comments, blank lines and other fields are skipped.

use serde_json::Value;

use crate::agent::model::http::{excerpt, parse_arguments, CallLimits};
use crate::agent::model::{ChunkSink, Finish, ModelError, ModelReply, Usage};
use crate::agent::session::ToolCall;

/// The streamed answer so far.
pub(super) struct StreamedAnswer {
    text: String,
    refusal: String,
    calls: Vec<(String, String, String)>,
    limits: CallLimits,
    pub(super) finish_reason: Option<String>,
    usage: Option<Usage>,
    /// `data: [DONE]` arrived.
    pub(super) done: bool,
}

impl StreamedAnswer {
    pub(super) fn new(limits: CallLimits) -> Self {
        StreamedAnswer {
            text: String::new(),
            refusal: String::new(),
            calls: Vec::new(),
            limits,
            finish_reason: None,
            usage: None,
            done: false,
        }
    }

    /// Takes one `data:` payload of the stream.
    pub(super) fn data(&mut self, data: &[u8], sink: Option<&ChunkSink>) -> Result<(), ModelError> {
        if data == b"[DONE]" {
            self.done = true;
            return Ok(());
        }
        let chunk: Value = serde_json::from_slice(data)
            .map_err(|_| ModelError::Malformed("a streamed event is not JSON".to_owned()))?;
        if let Some(message) = chunk["error"]["message"].as_str() {
            return Err(ModelError::Transport(format!("the stream reported an error: {}", excerpt(message))));
        }
        if let Some(usage) = usage_of(&chunk["usage"]) {
            self.usage = Some(usage);
        }
        let Some(choice) = chunk["choices"].get(0) else {
            return Ok(());
        };
        let delta = &choice["delta"];
        if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
            self.text.push_str(text);
            if let Some(sink) = sink {
                sink(text);
            }
        }
        if let Some(refusal) = delta["refusal"].as_str() {
            self.refusal.push_str(refusal);
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().unwrap_or(self.calls.len() as u64) as usize;
            if index > self.calls.len() + 64 {
                return Err(ModelError::Malformed("a streamed tool call index is out of range".to_owned()));
            }
            if self.calls.len() <= index {
                self.limits.check_calls(index + 1)?;
                self.calls.resize(index + 1, Default::default());
            }
            let (id, name, arguments) = &mut self.calls[index];
            if let Some(part) = call["id"].as_str() {
                id.push_str(part);
            }
            if let Some(part) = call["function"]["name"].as_str() {
                name.push_str(part);
            }
            if let Some(part) = call["function"]["arguments"].as_str() {
                self.limits.check_arguments(arguments.len() + part.len())?;
                arguments.push_str(part);
            }
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            self.finish_reason = Some(reason.to_owned());
        }
        Ok(())
    }

    pub(super) fn into_reply(self) -> Result<ModelReply, ModelError> {
        let tool_calls: Vec<ToolCall> = self
            .calls
            .into_iter()
            .filter(|(_, name, _)| !name.is_empty())
            .enumerate()
            .map(|(n, (id, name, arguments))| ToolCall {
                id: if id.is_empty() { format!("call_{n}") } else { id },
                name,
                arguments: parse_arguments(&arguments),
            })
            .collect();
        let refused = !self.refusal.is_empty();
        let finish = finish_of(self.finish_reason.as_deref(), !tool_calls.is_empty(), refused);
        let text = if refused && self.text.is_empty() { self.refusal } else { self.text };
        Ok(ModelReply { text, tool_calls, finish, usage: self.usage })
    }
}

/// Parses a whole (non-streamed) chat completion.
pub(super) fn parse_completion(body: &[u8], limits: CallLimits) -> Result<ModelReply, ModelError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|_| ModelError::Malformed("the body is not JSON".to_owned()))?;
    let Some(choice) = value["choices"].get(0) else {
        return Err(ModelError::Malformed("the body has no choices".to_owned()));
    };
    let message = choice["message"]
        .as_object()
        .ok_or_else(|| ModelError::Malformed("the first choice has no message".to_owned()))?;
    let text = match message.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        Some(_) => return Err(ModelError::Malformed("the message content is not text".to_owned())),
    };
    let calls = message.get("tool_calls").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
    limits.check_calls(calls.len())?;
    let mut tool_calls = Vec::with_capacity(calls.len());
    for (n, call) in calls.iter().enumerate() {
        let name = call["function"]["name"]
            .as_str()
            .ok_or_else(|| ModelError::Malformed("a tool call has no function name".to_owned()))?;
        let id = call["id"].as_str().map_or_else(|| format!("call_{n}"), str::to_owned);
        let raw = call["function"]["arguments"].as_str().unwrap_or_default();
        limits.check_arguments(raw.len())?;
        let arguments = parse_arguments(raw);
        tool_calls.push(ToolCall { id, name: name.to_owned(), arguments });
    }
    let refusal = message.get("refusal").and_then(Value::as_str).filter(|r| !r.is_empty());
    let finish = finish_of(choice["finish_reason"].as_str(), !tool_calls.is_empty(), refusal.is_some());
    let text = match refusal {
        Some(refusal) if text.is_empty() => refusal.to_owned(),
        _ => text,
    };
    Ok(ModelReply { text, tool_calls, finish, usage: usage_of(&value["usage"]) })
}

fn finish_of(reason: Option<&str>, has_calls: bool, refused: bool) -> Finish {
    match reason {
        _ if refused => Finish::Refusal,
        Some("length") => Finish::MaxTokens,
        Some("content_filter") => Finish::Refusal,
        _ if has_calls => Finish::ToolCalls,
        _ => Finish::Stop,
    }
}

/// Chat completions count cached prompt tokens inside `prompt_tokens`;
/// [`Usage`] keeps them apart.
fn usage_of(usage: &Value) -> Option<Usage> {
    let prompt_tokens = usage["prompt_tokens"].as_u64()?;
    let cached = usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0).min(prompt_tokens);
    Some(Usage {
        input_tokens: prompt_tokens - cached,
        output_tokens: usage["completion_tokens"].as_u64().unwrap_or(0),
        cache_read_tokens: cached,
        cache_write_tokens: 0,
    })
}
