//! Reading one Responses API answer, whole or streamed, into a
//! [`ModelReply`].
//!
//! A stream is a sequence of events, each a `data:` payload naming its
//! `type`: `response.created`; `response.output_item.added` opens an output
//! item (a `message`, or a `function_call` with its `call_id` and name,
//! keyed by `output_index`); `response.output_text.delta` and
//! `response.refusal.delta` add to a message; the
//! `response.function_call_arguments.delta`s add to a call's arguments and
//! `.done` gives them whole; `response.output_item.done` gives the item
//! whole; `response.completed` or `response.incomplete` ends the answer
//! with its usage, `response.failed` and `error` end it as failed. Other
//! events and other item kinds (reasoning, built-in tools) are skipped. A
//! whole body is the final response object, its items in `output`.
//!
//! Both are read as the serde types of [`wire`](super::wire).

use std::collections::HashMap;

use super::wire::{Event, WireError, WireItem, WireResponse};

use crate::agent::model::http::{excerpt, kind_of, not_read, parse_arguments, read_event, Answer, CallLimits};
use crate::agent::model::{ChunkSink, Finish, ModelError, ModelReply, Usage};
use crate::agent::session::ToolCall;

/// What an answer that cannot be read is not.
const ANSWER: &str = "a Responses answer";

/// Most output items one answer may open; far above what a model writes.
const MAX_ITEMS: usize = 4096;

enum Item {
    Message {
        text: String,
        refusal: String,
    },
    Call {
        call_id: String,
        name: String,
        arguments: String,
    },
    /// Reasoning, a built-in tool's call, …: not part of the answer.
    Skipped,
}

/// How the response ended.
enum Ending {
    Completed,
    /// `response.incomplete`, with its reason.
    Incomplete(Option<String>),
}

/// The answer so far.
pub(super) struct Response {
    items: Vec<Item>,
    /// Where each wire `output_index` sits in `items`.
    positions: HashMap<u64, usize>,
    calls: usize,
    limits: CallLimits,
    ending: Option<Ending>,
    usage: Option<Usage>,
}

impl Response {
    /// Takes a whole (non-streamed) response object.
    fn from_body(body: &[u8], limits: CallLimits) -> Result<Self, ModelError> {
        let whole: WireResponse = serde_json::from_slice(body).map_err(|error| not_read(ANSWER, "the body", &error))?;
        if whole.output.is_none() {
            return Err(ModelError::Malformed("the body has no output".to_owned()));
        }
        if whole.status.as_deref() == Some("failed") {
            return Err(failure("the response failed", whole.error.0.as_ref().unwrap_or(&WireError::default())));
        }
        let mut response = Response::new(limits);
        response.end(Some(&whole))?;
        Ok(response)
    }

    /// The final response object: its ending and usage, and its items if
    /// none were streamed (a server may send them only here).
    fn end(&mut self, response: Option<&WireResponse>) -> Result<(), ModelError> {
        if self.items.is_empty() {
            let output = response.and_then(|response| response.output.as_deref()).unwrap_or_default();
            for (index, item) in output.iter().enumerate() {
                self.open(index as u64, Some(item))?;
            }
        }
        self.ending = Some(match response.and_then(|response| response.status.as_deref()) {
            Some("incomplete") => {
                Ending::Incomplete(response.and_then(|response| response.incomplete_details.as_ref()?.reason.clone()))
            }
            _ => Ending::Completed,
        });
        // The API counts cached tokens inside `input_tokens`; `Usage`
        // keeps them apart.
        let usage = response.and_then(|response| response.usage.as_ref());
        if let Some((usage, input_tokens)) = usage.and_then(|usage| Some((usage, usage.input_tokens?))) {
            let cached = usage.input_tokens_details.as_ref().and_then(|details| details.cached_tokens);
            let cached = cached.unwrap_or(0).min(input_tokens);
            self.usage = Some(Usage {
                input_tokens: input_tokens - cached,
                output_tokens: usage.output_tokens.unwrap_or(0),
                cache_read_tokens: cached,
                cache_write_tokens: 0,
            });
        }
        Ok(())
    }

    /// Opens the item at `index`, whole or as it starts.
    fn open(&mut self, index: u64, item: Option<&WireItem>) -> Result<(), ModelError> {
        if self.positions.contains_key(&index) {
            return Err(ModelError::Malformed(format!("output item {index} was added twice")));
        }
        if self.items.len() >= MAX_ITEMS {
            return Err(ModelError::Malformed(format!("the answer opens more than {MAX_ITEMS} output items")));
        }
        let Some(item) = item.filter(|item| item.kind.is_some()) else {
            return Err(ModelError::Malformed("an output item has no type".to_owned()));
        };
        let opened = match item.kind.as_deref() {
            Some("message") => {
                let (mut text, mut refusal) = (String::new(), String::new());
                for part in item.content.iter().flatten() {
                    match part.kind.as_deref() {
                        Some("output_text") => text.push_str(part.text.as_str().unwrap_or_default()),
                        Some("refusal") => refusal.push_str(part.refusal.as_str().unwrap_or_default()),
                        _ => {}
                    }
                }
                Item::Message { text, refusal }
            }
            Some("function_call") => {
                self.calls += 1;
                self.limits.check_calls(self.calls)?;
                let (Some(call_id), Some(name)) = (&item.call_id, &item.name) else {
                    return Err(ModelError::Malformed("a function_call item has no call_id or name".to_owned()));
                };
                let arguments = item.arguments.as_str().unwrap_or_default();
                self.limits.check_arguments(arguments.len())?;
                Item::Call { call_id: call_id.clone(), name: name.clone(), arguments: arguments.to_owned() }
            }
            _ => Item::Skipped,
        };
        self.positions.insert(index, self.items.len());
        self.items.push(opened);
        Ok(())
    }

    fn item(&mut self, index: u64) -> Result<&mut Item, ModelError> {
        match self.positions.get(&index) {
            Some(&position) => Ok(&mut self.items[position]),
            None => Err(ModelError::Malformed(format!("an event for output item {index}, which was never added"))),
        }
    }
}

impl Answer for Response {
    fn new(limits: CallLimits) -> Self {
        Response { items: Vec::new(), positions: HashMap::new(), calls: 0, limits, ending: None, usage: None }
    }

    fn whole(body: &[u8], limits: CallLimits) -> Result<ModelReply, ModelError> {
        Response::from_body(body, limits)?.into_reply()
    }

    /// Takes one streamed event's payload.
    fn event(&mut self, data: &[u8], sink: Option<&ChunkSink>) -> Result<(), ModelError> {
        let event: Event = read_event(ANSWER, data)?;
        let kind = kind_of(event.kind.as_deref())?;
        match kind {
            "response.output_item.added" => {
                self.open(index_of(&event)?, event.item.as_ref())?;
            }
            "response.output_text.delta" | "response.refusal.delta" => {
                let part = event.delta.as_str().unwrap_or_default();
                let Item::Message { text, refusal } = self.item(index_of(&event)?)? else {
                    return Err(ModelError::Malformed(format!("a {kind} for an output item that is no message")));
                };
                if kind == "response.output_text.delta" {
                    text.push_str(part);
                    if let (Some(sink), false) = (sink, part.is_empty()) {
                        sink(part);
                    }
                } else {
                    refusal.push_str(part);
                }
            }
            "response.function_call_arguments.delta" | "response.function_call_arguments.done" => {
                let limits = self.limits;
                let index = index_of(&event)?;
                let Item::Call { arguments, .. } = self.item(index)? else {
                    return Err(ModelError::Malformed(format!("a {kind} for an output item that is no call")));
                };
                if kind.ends_with(".delta") {
                    let part = event.delta.as_str().unwrap_or_default();
                    limits.check_arguments(arguments.len() + part.len())?;
                    arguments.push_str(part);
                } else if let Some(whole) = event.arguments.as_str() {
                    limits.check_arguments(whole.len())?;
                    whole.clone_into(arguments);
                }
            }
            "response.output_item.done" => {
                let index = index_of(&event)?;
                let item = event.item.as_ref();
                if !self.positions.contains_key(&index) {
                    self.open(index, item)?;
                }
                let limits = self.limits;
                let whole = item.and_then(|item| item.arguments.as_str());
                if let (Item::Call { arguments, .. }, Some(whole)) = (self.item(index)?, whole) {
                    limits.check_arguments(whole.len())?;
                    whole.clone_into(arguments);
                }
            }
            "response.completed" | "response.incomplete" => self.end(event.response.as_ref())?,
            "response.failed" => {
                let error = event.response.and_then(|response| response.error.0).unwrap_or_default();
                return Err(failure("the response failed", &error));
            }
            "error" => {
                // The error's fields sit on the event, or under `error`.
                let error = event.error.0.unwrap_or(WireError { code: event.code, message: event.message });
                return Err(failure("the stream reported an error", &error));
            }
            _ => {} // response.created, content parts, reasoning, types added since
        }
        Ok(())
    }

    /// Whether the response has ended (completed or incomplete).
    fn ended(&self) -> bool {
        self.ending.is_some()
    }

    fn into_reply(self) -> Result<ModelReply, ModelError> {
        let (mut text, mut refusal, mut tool_calls) = (String::new(), String::new(), Vec::new());
        for item in self.items {
            match item {
                Item::Message { text: part, refusal: refused } => {
                    text.push_str(&part);
                    refusal.push_str(&refused);
                }
                Item::Call { call_id, name, arguments } => {
                    tool_calls.push(ToolCall { id: call_id, name, arguments: parse_arguments(&arguments) })
                }
                Item::Skipped => {}
            }
        }
        let finish = match &self.ending {
            Some(Ending::Incomplete(reason)) if reason.as_deref() == Some("content_filter") => Finish::Refusal,
            Some(Ending::Incomplete(_)) => Finish::MaxTokens, // max_output_tokens
            _ if !refusal.is_empty() => Finish::Refusal,
            _ if !tool_calls.is_empty() => Finish::ToolCalls,
            _ => Finish::Stop,
        };
        let text = if text.is_empty() { refusal } else { text };
        Ok(ModelReply { text, tool_calls, finish, usage: self.usage })
    }
}

fn index_of(event: &Event) -> Result<u64, ModelError> {
    event.output_index.ok_or_else(|| ModelError::Malformed("an output event has no output_index".to_owned()))
}

/// A failure the endpoint reported mid-answer, with its code and message.
fn failure(what: &str, error: &WireError) -> ModelError {
    let code = error.code.as_str().unwrap_or("error");
    let message = error.message.as_str().unwrap_or_default();
    ModelError::BrokeOff(format!("{what}: {code}: {}", excerpt(message)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: CallLimits = CallLimits { calls: 4, argument_bytes: 64 };

    #[test]
    fn events_of_unknown_shapes_are_skipped_and_known_ones_still_read() {
        let mut response = Response::new(LIMITS);
        for data in [
            r#"{"type": "response.created", "response": {"status": "in_progress", "output": [], "error": null}}"#,
            r#"{"type": "response.future.delta", "delta": {"nested": [1, 2]}, "code": 7, "arguments": [true]}"#,
            r#"{"type": "response.output_item.added", "output_index": 0,
                "item": {"type": "function_call", "call_id": "c1", "name": "read", "arguments": ""}}"#,
            r#"{"type": "response.function_call_arguments.delta", "output_index": 0, "delta": "{\"a\": 1}"}"#,
            r#"{"type": "response.completed", "response": {"status": "completed",
                "usage": {"input_tokens": 9, "output_tokens": 2, "input_tokens_details": {"cached_tokens": 4}}}}"#,
        ] {
            response.event(data.as_bytes(), None).unwrap();
        }
        assert!(response.ended());
        let reply = response.into_reply().unwrap();
        assert_eq!(
            (reply.tool_calls[0].id.as_str(), &reply.tool_calls[0].arguments),
            ("c1", &serde_json::json!({"a": 1}))
        );
        let usage = reply.usage.unwrap();
        assert_eq!((usage.input_tokens, usage.cache_read_tokens, usage.output_tokens), (5, 4, 2));
    }

    #[test]
    fn a_usage_count_that_is_negative_reads_as_absent() {
        let mut response = Response::new(LIMITS);
        let completed = r#"{"type": "response.completed", "response": {"status": "completed",
            "usage": {"input_tokens": 9, "output_tokens": -2, "input_tokens_details": {"cached_tokens": -4}}}}"#;
        response.event(completed.as_bytes(), None).unwrap();
        let usage = response.into_reply().unwrap().usage.unwrap();
        assert_eq!((usage.input_tokens, usage.cache_read_tokens, usage.output_tokens), (9, 0, 0));
    }

    #[test]
    fn an_error_event_is_read_from_its_error_or_from_itself() {
        let under = br#"{"type": "error", "error": {"code": "rate_limited", "message": "slow"}}"#;
        let on_event = br#"{"type": "error", "error": "text", "code": "server_error", "message": "boom"}"#;
        for (data, expected) in [(&under[..], "rate_limited: slow"), (&on_event[..], "server_error: boom")] {
            let error = Response::new(LIMITS).event(data, None).unwrap_err().to_string();
            assert!(error.contains(expected), "{error}");
        }
    }

    #[test]
    fn a_whole_body_without_output_or_failed_says_so() {
        let no_output = Response::whole(br#"{"status": "completed"}"#, LIMITS).err().unwrap().to_string();
        assert!(no_output.contains("the body has no output"), "{no_output}");
        let failed = br#"{"status": "failed", "output": [], "error": {"code": "boom", "message": "it broke"}}"#;
        let failed = Response::whole(failed, LIMITS).err().unwrap().to_string();
        assert!(failed.contains("the response failed: boom: it broke"), "{failed}");
    }
}
