//! Reading one answer of the endpoint, whole or streamed, into a
//! [`ModelReply`]: its text, its tool calls (held to [`CallLimits`], the
//! same way on both paths), why it finished, what it used.
//!
//! A stream is a sequence of `data:` payloads, each a chunk whose delta adds
//! text, a refusal, or a piece of a tool call (an id, a name, or a slice of
//! the arguments, keyed by the call's `index`), until `data: [DONE]`.
//! Comments, blank lines and other fields are skipped.
//!
//! Both shapes are read as serde types: every field may be missing (or
//! null) and unknown fields are ignored, so an endpoint that says less or
//! more than OpenAI still reads; a field of the wrong type makes the
//! answer malformed.

use std::fmt;

use serde::de::{self, IgnoredAny};
use serde::{Deserialize, Deserializer};

use crate::agent::model::http::{excerpt, not_read, parse_arguments, read_event, token_count, Answer, CallLimits};
use crate::agent::model::{ChunkSink, Finish, ModelError, ModelReply, Usage};
use crate::agent::session::ToolCall;

/// What an answer that cannot be read is not.
const ANSWER: &str = "a chat completion";

/// A whole chat completion.
#[derive(Deserialize)]
struct Completion {
    choices: Option<Vec<Choice>>,
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct Choice {
    message: Option<Message>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Message {
    #[serde(default)]
    content: Content,
    tool_calls: Option<Vec<WholeCall>>,
    refusal: Option<String>,
}

/// A message's content: text, or parts whose texts join (parts without
/// text, such as audio, add nothing).
#[derive(Default)]
struct Content(String);

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> de::Visitor<'de> for Visitor {
            type Value = Content;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("the message content as text")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Content, E> {
                Ok(Content(text.to_owned()))
            }

            fn visit_string<E: de::Error>(self, text: String) -> Result<Content, E> {
                Ok(Content(text))
            }

            fn visit_unit<E: de::Error>(self) -> Result<Content, E> {
                Ok(Content::default())
            }

            fn visit_none<E: de::Error>(self) -> Result<Content, E> {
                Ok(Content::default())
            }

            fn visit_seq<A: de::SeqAccess<'de>>(self, mut parts: A) -> Result<Content, A::Error> {
                let mut text = String::new();
                while let Some(part) = parts.next_element::<TextPart>()? {
                    text.push_str(part.text.as_deref().unwrap_or_default());
                }
                Ok(Content(text))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

#[derive(Deserialize)]
struct TextPart {
    text: Option<String>,
}

/// A tool call of a whole completion.
#[derive(Deserialize)]
struct WholeCall {
    id: Option<String>,
    function: Option<FunctionPart>,
}

/// A call's function, whole or one streamed piece of it.
#[derive(Deserialize)]
struct FunctionPart {
    name: Option<String>,
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default, deserialize_with = "token_count")]
    prompt_tokens: Option<u64>,
    #[serde(default, deserialize_with = "token_count")]
    completion_tokens: Option<u64>,
    prompt_tokens_details: Option<PromptDetails>,
}

#[derive(Deserialize)]
struct PromptDetails {
    #[serde(default, deserialize_with = "token_count")]
    cached_tokens: Option<u64>,
}

/// One streamed chunk.
#[derive(Deserialize)]
struct Chunk {
    error: Option<StreamError>,
    usage: Option<WireUsage>,
    choices: Option<Vec<StreamChoice>>,
}

/// An error a stream reports: an object with a message, or anything else
/// (which says nothing to report).
#[derive(Deserialize)]
#[serde(untagged)]
enum StreamError {
    Object { message: Option<String> },
    Other(IgnoredAny),
}

#[derive(Deserialize)]
struct StreamChoice {
    delta: Option<Delta>,
    finish_reason: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    content: Option<String>,
    refusal: Option<String>,
    tool_calls: Option<Vec<CallDelta>>,
}

/// A piece of one streamed tool call.
#[derive(Deserialize)]
struct CallDelta {
    index: Option<u64>,
    id: Option<String>,
    function: Option<FunctionPart>,
}

/// A streamed tool call as its pieces arrived so far.
#[derive(Clone, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// The streamed answer so far.
pub(super) struct StreamedAnswer {
    text: String,
    refusal: String,
    calls: Vec<PartialCall>,
    limits: CallLimits,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    /// `data: [DONE]` arrived.
    done: bool,
}

impl StreamedAnswer {
    fn delta(&mut self, delta: Delta, sink: Option<&ChunkSink>) -> Result<(), ModelError> {
        if let Some(text) = delta.content.filter(|t| !t.is_empty()) {
            self.text.push_str(&text);
            if let Some(sink) = sink {
                sink(&text);
            }
        }
        if let Some(refusal) = delta.refusal {
            self.refusal.push_str(&refusal);
        }
        for piece in delta.tool_calls.into_iter().flatten() {
            let index = piece.index.unwrap_or(self.calls.len() as u64);
            if index > self.calls.len() as u64 + 64 {
                return Err(ModelError::Malformed("a streamed tool call index is out of range".to_owned()));
            }
            let index = index as usize;
            if self.calls.len() <= index {
                self.limits.check_calls(index + 1)?;
                self.calls.resize(index + 1, PartialCall::default());
            }
            let call = &mut self.calls[index];
            if let Some(part) = piece.id {
                call.id.push_str(&part);
            }
            let function = piece.function.unwrap_or(FunctionPart { name: None, arguments: None });
            if let Some(part) = function.name {
                call.name.push_str(&part);
            }
            if let Some(part) = function.arguments {
                self.limits.check_arguments(call.arguments.len() + part.len())?;
                call.arguments.push_str(&part);
            }
        }
        Ok(())
    }
}

impl Answer for StreamedAnswer {
    fn new(limits: CallLimits) -> Self {
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

    fn whole(body: &[u8], limits: CallLimits) -> Result<ModelReply, ModelError> {
        parse_completion(body, limits)
    }

    /// Takes one `data:` payload of the stream.
    fn event(&mut self, data: &[u8], sink: Option<&ChunkSink>) -> Result<(), ModelError> {
        if data == b"[DONE]" {
            self.done = true;
            return Ok(());
        }
        let chunk: Chunk = read_event(ANSWER, data)?;
        if let Some(StreamError::Object { message: Some(message) }) = &chunk.error {
            return Err(ModelError::Transport(format!("the stream reported an error: {}", excerpt(message))));
        }
        if let Some(usage) = chunk.usage.as_ref().and_then(usage_of) {
            self.usage = Some(usage);
        }
        let Some(choice) = chunk.choices.and_then(|choices| choices.into_iter().next()) else {
            return Ok(());
        };
        if let Some(delta) = choice.delta {
            self.delta(delta, sink)?;
        }
        if let Some(reason) = choice.finish_reason {
            self.finish_reason = Some(reason);
        }
        Ok(())
    }

    fn ended(&self) -> bool {
        self.done
    }

    /// A stream that closes without `[DONE]` after the finish reason has
    /// still finished (some servers leave it out).
    fn finished(&self) -> bool {
        self.done || self.finish_reason.is_some()
    }

    fn into_reply(self) -> Result<ModelReply, ModelError> {
        let tool_calls: Vec<ToolCall> = self
            .calls
            .into_iter()
            .filter(|call| !call.name.is_empty())
            .enumerate()
            .map(|(n, call)| ToolCall {
                id: if call.id.is_empty() { format!("call_{n}") } else { call.id },
                name: call.name,
                arguments: parse_arguments(&call.arguments),
            })
            .collect();
        let refused = !self.refusal.is_empty();
        let finish = finish_of(self.finish_reason.as_deref(), !tool_calls.is_empty(), refused);
        let text = if refused && self.text.is_empty() { self.refusal } else { self.text };
        Ok(ModelReply { text, tool_calls, finish, usage: self.usage })
    }
}

/// Parses a whole (non-streamed) chat completion.
fn parse_completion(body: &[u8], limits: CallLimits) -> Result<ModelReply, ModelError> {
    let completion: Completion = serde_json::from_slice(body).map_err(|error| not_read(ANSWER, "the body", &error))?;
    let Some(choice) = completion.choices.and_then(|choices| choices.into_iter().next()) else {
        return Err(ModelError::Malformed("the body has no choices".to_owned()));
    };
    let message = choice.message.ok_or_else(|| ModelError::Malformed("the first choice has no message".to_owned()))?;
    let calls = message.tool_calls.unwrap_or_default();
    limits.check_calls(calls.len())?;
    let mut tool_calls = Vec::with_capacity(calls.len());
    for (n, call) in calls.into_iter().enumerate() {
        let FunctionPart { name, arguments } = call.function.unwrap_or(FunctionPart { name: None, arguments: None });
        let name = name.ok_or_else(|| ModelError::Malformed("a tool call has no function name".to_owned()))?;
        let id = call.id.unwrap_or_else(|| format!("call_{n}"));
        let raw = arguments.unwrap_or_default();
        limits.check_arguments(raw.len())?;
        tool_calls.push(ToolCall { id, name, arguments: parse_arguments(&raw) });
    }
    let refusal = message.refusal.filter(|r| !r.is_empty());
    let finish = finish_of(choice.finish_reason.as_deref(), !tool_calls.is_empty(), refusal.is_some());
    let text = match refusal {
        Some(refusal) if message.content.0.is_empty() => refusal,
        _ => message.content.0,
    };
    Ok(ModelReply { text, tool_calls, finish, usage: completion.usage.as_ref().and_then(usage_of) })
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
fn usage_of(usage: &WireUsage) -> Option<Usage> {
    let prompt_tokens = usage.prompt_tokens?;
    let cached = usage.prompt_tokens_details.as_ref().and_then(|d| d.cached_tokens).unwrap_or(0).min(prompt_tokens);
    Some(Usage {
        input_tokens: prompt_tokens - cached,
        output_tokens: usage.completion_tokens.unwrap_or(0),
        cache_read_tokens: cached,
        cache_write_tokens: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: CallLimits = CallLimits { calls: 4, argument_bytes: 64 };

    #[test]
    fn a_completion_reads_with_fields_missing_null_or_unknown() {
        let body = br#"{"id": "x", "extra": [1, 2], "choices": [{"index": 0, "message": {"role": "assistant",
            "content": null, "tool_calls": [{"function": {"name": "ls"}, "novel": true}]}}], "usage": null}"#;
        let reply = parse_completion(body, LIMITS).unwrap();
        assert_eq!((reply.text.as_str(), reply.finish, reply.usage), ("", Finish::ToolCalls, None));
        assert_eq!((reply.tool_calls[0].id.as_str(), reply.tool_calls[0].name.as_str()), ("call_0", "ls"));
        assert_eq!(reply.tool_calls[0].arguments, serde_json::json!({}));
    }

    #[test]
    fn content_parts_join_their_texts_and_cached_tokens_are_kept_apart() {
        let body = br#"{"choices": [{"message": {"content": [{"type": "text", "text": "a"}, {"type": "audio"},
            {"type": "text", "text": "b"}]}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}}}"#;
        let reply = parse_completion(body, LIMITS).unwrap();
        assert_eq!((reply.text.as_str(), reply.finish), ("ab", Finish::MaxTokens));
        let usage = reply.usage.unwrap();
        assert_eq!((usage.input_tokens, usage.cache_read_tokens, usage.output_tokens), (6, 4, 3));
    }

    #[test]
    fn a_usage_count_that_is_negative_fractional_or_not_a_number_reads_as_absent() {
        let body = br#"{"choices": [{"message": {"content": "ok"}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": -3, "prompt_tokens_details": {"cached_tokens": 1.5}}}"#;
        let usage = parse_completion(body, LIMITS).unwrap().usage.unwrap();
        assert_eq!((usage.input_tokens, usage.cache_read_tokens, usage.output_tokens), (10, 0, 0));
        let body = br#"{"choices": [{"message": {"content": "ok"}}], "usage": {"prompt_tokens": "10"}}"#;
        assert_eq!(parse_completion(body, LIMITS).unwrap().usage, None);
        let mut answer = StreamedAnswer::new(LIMITS);
        answer.event(br#"{"choices": [{"delta": {"content": "ok"}}], "usage": {"prompt_tokens": -1}}"#, None).unwrap();
        assert_eq!(answer.into_reply().unwrap().usage, None);
    }

    #[test]
    fn a_body_without_choices_or_message_says_which() {
        let no_choices = parse_completion(br#"{"choices": []}"#, LIMITS).unwrap_err().to_string();
        assert!(no_choices.contains("the body has no choices"), "{no_choices}");
        let no_message = parse_completion(br#"{"choices": [{}]}"#, LIMITS).unwrap_err().to_string();
        assert!(no_message.contains("the first choice has no message"), "{no_message}");
        let not_json = parse_completion(b"<html>", LIMITS).unwrap_err().to_string();
        assert!(not_json.contains("the body is not JSON"), "{not_json}");
    }

    #[test]
    fn streamed_pieces_of_a_call_join_by_index_within_the_limits() {
        let mut answer = StreamedAnswer::new(LIMITS);
        for data in [
            r#"{"choices": [{"delta": {"content": "hi", "tool_calls": [{"index": 0, "id": "c", "function": {"name": "re"}}]}}]}"#,
            r#"{"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "ad", "arguments": "{\"a\":"}}]}}]}"#,
            r#"{"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}, "finish_reason": "tool_calls"}]}"#,
            r#"{"usage": {"prompt_tokens": 2, "completion_tokens": 1}, "choices": []}"#,
            "[DONE]",
        ] {
            answer.event(data.as_bytes(), None).unwrap();
        }
        let reply = answer.into_reply().unwrap();
        assert_eq!(reply.text, "hi");
        assert_eq!(
            (reply.tool_calls[0].name.as_str(), &reply.tool_calls[0].arguments),
            ("read", &serde_json::json!({"a": 1}))
        );
        assert_eq!(reply.usage.unwrap().output_tokens, 1);

        let mut wide = StreamedAnswer::new(LIMITS);
        let too_many = r#"{"choices": [{"delta": {"tool_calls": [{"index": 4, "function": {"name": "x"}}]}}]}"#;
        assert!(matches!(wide.event(too_many.as_bytes(), None), Err(ModelError::Oversized(_))));
    }
}
