//! The Responses API request as serde types, borrowed from the
//! [`ModelRequest`] it answers. Nothing is stored on the server
//! (`store: false`): each request carries the whole conversation.

use std::borrow::Cow;

use serde::Serialize;

use crate::agent::model::http::{arguments_text, functions, user_content, Content, Function, WireText};
use crate::agent::model::ModelRequest;
use crate::agent::session::SessionEvent;

/// One request body.
#[derive(Serialize)]
pub(super) struct ResponsesRequest<'a> {
    pub(super) model: &'a str,
    pub(super) input: Vec<InputItem<'a>>,
    pub(super) store: bool,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub(super) instructions: &'a str,
    /// Written out once per tool list ([`WireTools`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) tools: Option<WireText>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) max_output_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) reasoning: Option<Reasoning<'a>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(super) stream: bool,
}

/// How hard a reasoning model thinks.
#[derive(Serialize)]
pub(super) struct Reasoning<'a> {
    pub(super) effort: &'a str,
}

/// One item of the conversation.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum InputItem<'a> {
    Message { role: &'static str, content: Content<'a, Part<'a>> },
    FunctionCall { call_id: &'a str, name: &'a str, arguments: Cow<'a, str> },
    FunctionCallOutput { call_id: &'a str, output: &'a str },
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum Part<'a> {
    InputText { text: &'a str },
    InputImage { image_url: String },
}

/// A tool the model may call.
#[derive(Serialize)]
pub(super) struct Tool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(flatten)]
    function: Function<'a>,
}

/// The conversation as input items: each event but the turn ends, an
/// assistant's empty text left out.
pub(super) fn input(request: &ModelRequest) -> Vec<InputItem<'_>> {
    let mut input = Vec::with_capacity(request.messages.len());
    for event in request.messages.iter() {
        match event {
            SessionEvent::User { content } => {
                let content =
                    user_content(content, |text| Part::InputText { text }, |image_url| Part::InputImage { image_url });
                input.push(InputItem::Message { role: "user", content })
            }
            SessionEvent::Assistant { text, tool_calls } => {
                if !text.is_empty() {
                    input.push(InputItem::Message { role: "assistant", content: Content::Text(Cow::Borrowed(text)) });
                }
                for call in tool_calls {
                    let arguments = arguments_text(&call.arguments);
                    input.push(InputItem::FunctionCall { call_id: &call.id, name: &call.name, arguments });
                }
            }
            SessionEvent::ToolResult { call_id, content, .. } => {
                input.push(InputItem::FunctionCallOutput { call_id, output: content })
            }
            SessionEvent::TurnEnd { .. } => {}
        }
    }
    input
}

/// The request's tools as the API names them.
pub(super) fn tools(request: &ModelRequest) -> Vec<Tool<'_>> {
    functions(request).map(|function| Tool { kind: "function", function }).collect()
}
