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

use std::collections::HashMap;

use serde_json::Value;

use crate::agent::model::http::{excerpt, parse_arguments, CallLimits};
use crate::agent::model::{ChunkSink, Finish, ModelError, ModelReply, Usage};
use crate::agent::session::ToolCall;

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
    pub(super) fn new(limits: CallLimits) -> Self {
        Response { items: Vec::new(), positions: HashMap::new(), calls: 0, limits, ending: None, usage: None }
    }

    /// Whether the response has ended (completed or incomplete).
    pub(super) fn ended(&self) -> bool {
        self.ending.is_some()
    }

    /// Takes one streamed event's payload.
    pub(super) fn event(&mut self, data: &[u8], sink: Option<&ChunkSink>) -> Result<(), ModelError> {
        let event: Value = serde_json::from_slice(data)
            .map_err(|_| ModelError::Malformed("a streamed event is not JSON".to_owned()))?;
        let Some(kind) = event["type"].as_str() else {
            return Err(ModelError::Malformed("a streamed event has no type".to_owned()));
        };
        match kind {
            "response.output_item.added" => {
                self.open(index_of(&event)?, &event["item"])?;
            }
            "response.output_text.delta" | "response.refusal.delta" => {
                let part = event["delta"].as_str().unwrap_or_default();
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
                    let part = event["delta"].as_str().unwrap_or_default();
                    limits.check_arguments(arguments.len() + part.len())?;
                    arguments.push_str(part);
                } else if let Some(whole) = event["arguments"].as_str() {
                    limits.check_arguments(whole.len())?;
                    whole.clone_into(arguments);
                }
            }
            "response.output_item.done" => {
                let index = index_of(&event)?;
                let item = &event["item"];
                if !self.positions.contains_key(&index) {
                    self.open(index, item)?;
                }
                let limits = self.limits;
                if let (Item::Call { arguments, .. }, Some(whole)) = (self.item(index)?, item["arguments"].as_str()) {
                    limits.check_arguments(whole.len())?;
                    whole.clone_into(arguments);
                }
            }
            "response.completed" | "response.incomplete" => self.end(&event["response"])?,
            "response.failed" => {
                let error = &event["response"]["error"];
                return Err(failure("the response failed", error));
            }
            "error" => {
                // The error's fields sit on the event, or under `error`.
                let error = if event["error"].is_object() { &event["error"] } else { &event };
                return Err(failure("the stream reported an error", error));
            }
            _ => {} // response.created, content parts, reasoning, types added since
        }
        Ok(())
    }

    /// Takes a whole (non-streamed) response object.
    pub(super) fn whole(body: &[u8], limits: CallLimits) -> Result<Self, ModelError> {
        let value: Value =
            serde_json::from_slice(body).map_err(|_| ModelError::Malformed("the body is not JSON".to_owned()))?;
        if !value["output"].is_array() {
            return Err(ModelError::Malformed("the body has no output".to_owned()));
        }
        if value["status"] == "failed" {
            return Err(failure("the response failed", &value["error"]));
        }
        let mut response = Response::new(limits);
        response.end(&value)?;
        Ok(response)
    }

    /// The final response object: its ending and usage, and its items if
    /// none were streamed (a server may send them only here).
    fn end(&mut self, response: &Value) -> Result<(), ModelError> {
        if self.items.is_empty() {
            for (index, item) in response["output"].as_array().into_iter().flatten().enumerate() {
                self.open(index as u64, item)?;
            }
        }
        self.ending = Some(match response["status"].as_str() {
            Some("incomplete") => {
                Ending::Incomplete(response["incomplete_details"]["reason"].as_str().map(str::to_owned))
            }
            _ => Ending::Completed,
        });
        let usage = &response["usage"];
        // The API counts cached tokens inside `input_tokens`; `Usage`
        // keeps them apart.
        if let Some(input_tokens) = usage["input_tokens"].as_u64() {
            let cached = usage["input_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0).min(input_tokens);
            self.usage = Some(Usage {
                input_tokens: input_tokens - cached,
                output_tokens: usage["output_tokens"].as_u64().unwrap_or(0),
                cache_read_tokens: cached,
                cache_write_tokens: 0,
            });
        }
        Ok(())
    }

    /// Opens the item at `index`, whole or as it starts.
    fn open(&mut self, index: u64, item: &Value) -> Result<(), ModelError> {
        if self.positions.contains_key(&index) {
            return Err(ModelError::Malformed(format!("output item {index} was added twice")));
        }
        if self.items.len() >= MAX_ITEMS {
            return Err(ModelError::Malformed(format!("the answer opens more than {MAX_ITEMS} output items")));
        }
        let opened = match item["type"].as_str() {
            Some("message") => {
                let (mut text, mut refusal) = (String::new(), String::new());
                for part in item["content"].as_array().into_iter().flatten() {
                    match part["type"].as_str() {
                        Some("output_text") => text.push_str(part["text"].as_str().unwrap_or_default()),
                        Some("refusal") => refusal.push_str(part["refusal"].as_str().unwrap_or_default()),
                        _ => {}
                    }
                }
                Item::Message { text, refusal }
            }
            Some("function_call") => {
                self.calls += 1;
                self.limits.check_calls(self.calls)?;
                let (Some(call_id), Some(name)) = (item["call_id"].as_str(), item["name"].as_str()) else {
                    return Err(ModelError::Malformed("a function_call item has no call_id or name".to_owned()));
                };
                let arguments = item["arguments"].as_str().unwrap_or_default();
                self.limits.check_arguments(arguments.len())?;
                Item::Call { call_id: call_id.to_owned(), name: name.to_owned(), arguments: arguments.to_owned() }
            }
            Some(_) => Item::Skipped,
            None => return Err(ModelError::Malformed("an output item has no type".to_owned())),
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

    pub(super) fn into_reply(self) -> ModelReply {
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
        ModelReply { text, tool_calls, finish, usage: self.usage }
    }
}

fn index_of(event: &Value) -> Result<u64, ModelError> {
    event["output_index"]
        .as_u64()
        .ok_or_else(|| ModelError::Malformed("an output event has no output_index".to_owned()))
}

/// A failure the endpoint reported mid-answer, with its code and message.
fn failure(what: &str, error: &Value) -> ModelError {
    let code = error["code"].as_str().unwrap_or("error");
    let message = error["message"].as_str().unwrap_or_default();
    ModelError::BrokeOff(format!("{what}: {code}: {}", excerpt(message)))
}
