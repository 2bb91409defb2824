//! The chat-completions request as serde types: what [`OpenAiModel`]
//! sends, borrowed from the [`ModelRequest`] it answers (nothing of the
//! conversation is copied but an image's data URL and non-text tool
//! arguments, which the wire spells differently).
//!
//! [`OpenAiModel`]: super::OpenAiModel

use std::borrow::Cow;

use serde::Serialize;

use crate::agent::model::http::{arguments_text, functions, user_content, Content, Function, WireText};
use crate::agent::model::ModelRequest;
use crate::agent::session::{SessionEvent, ToolCall};

/// One request body.
#[derive(Serialize)]
pub(super) struct ChatRequest<'a> {
    pub(super) model: &'a str,
    pub(super) messages: Vec<Message<'a>>,
    /// Written out once per tool list ([`WireTools`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) tools: Option<WireText>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) reasoning_effort: Option<&'a str>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(super) stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) stream_options: Option<StreamOptions>,
}

/// Asks a stream to end with a chunk that reports the usage.
#[derive(Serialize)]
pub(super) struct StreamOptions {
    pub(super) include_usage: bool,
}

/// One message of the conversation, tagged by its role.
#[derive(Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub(super) enum Message<'a> {
    System {
        content: &'a str,
    },
    User {
        content: Content<'a, Part<'a>>,
    },
    Assistant {
        content: &'a str,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<WireCall<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: &'a str,
    },
}

/// A part of a user message.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum Part<'a> {
    Text { text: &'a str },
    ImageUrl { image_url: ImageUrl },
}

/// An image, inline as a data URL.
#[derive(Serialize)]
pub(super) struct ImageUrl {
    url: String,
}

/// A tool call the assistant made earlier.
#[derive(Serialize)]
pub(super) struct WireCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: FunctionCall<'a>,
}

/// The function a call names, with its arguments as the JSON text the
/// model wrote.
#[derive(Serialize)]
struct FunctionCall<'a> {
    name: &'a str,
    arguments: Cow<'a, str>,
}

/// A tool the model may call.
#[derive(Serialize)]
pub(super) struct Tool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: Function<'a>,
}

/// The conversation as messages: the system prompt first (when there is
/// one), then each event but the turn ends.
pub(super) fn messages(request: &ModelRequest) -> Vec<Message<'_>> {
    let mut messages = Vec::with_capacity(request.messages.len() + 1);
    if !request.system.is_empty() {
        messages.push(Message::System { content: &request.system });
    }
    for event in request.messages.iter() {
        messages.push(match event {
            SessionEvent::User { content } => {
                let image = |url| Part::ImageUrl { image_url: ImageUrl { url } };
                Message::User { content: user_content(content, |text| Part::Text { text }, image) }
            }
            SessionEvent::Assistant { text, tool_calls } => {
                Message::Assistant { content: text, tool_calls: tool_calls.iter().map(wire_call).collect() }
            }
            SessionEvent::ToolResult { call_id, content, .. } => Message::Tool { tool_call_id: call_id, content },
            SessionEvent::TurnEnd { .. } => continue,
        });
    }
    messages
}

/// The request's tools as the wire names them.
pub(super) fn tools(request: &ModelRequest) -> Vec<Tool<'_>> {
    functions(request).map(|function| Tool { kind: "function", function }).collect()
}

fn wire_call(call: &ToolCall) -> WireCall<'_> {
    let arguments = arguments_text(&call.arguments);
    WireCall { id: &call.id, kind: "function", function: FunctionCall { name: &call.name, arguments } }
}
