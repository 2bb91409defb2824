//! The Messages API request as serde types, borrowed from the
//! [`ModelRequest`] it answers.

use std::borrow::Cow;

use serde::Serialize;
use serde_json::{Map, Value};

use crate::agent::model::http::WireText;
use crate::agent::model::ModelRequest;
use crate::agent::session::SessionEvent;
use crate::seam::ContentBlock;

/// One request body.
#[derive(Serialize)]
pub(super) struct MessagesRequest<'a> {
    pub(super) model: &'a str,
    pub(super) max_tokens: u64,
    pub(super) messages: Vec<Turn<'a>>,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub(super) system: &'a str,
    /// Written out once per tool list ([`WireTools`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) tools: Option<WireText>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(super) stream: bool,
}

/// One message: a role and its blocks.
#[derive(Serialize)]
pub(super) struct Turn<'a> {
    role: &'static str,
    content: Vec<Block<'a>>,
}

/// A content block of a request.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block<'a> {
    Text { text: &'a str },
    Image { source: ImageSource<'a> },
    ToolUse { id: &'a str, name: &'a str, input: Cow<'a, Value> },
    ToolResult { tool_use_id: &'a str, content: &'a str, is_error: bool },
}

#[derive(Serialize)]
struct ImageSource<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    media_type: &'a str,
    data: &'a str,
}

/// A tool the model may call.
#[derive(Serialize)]
pub(super) struct Tool<'a> {
    name: &'a str,
    description: &'a str,
    input_schema: &'a Value,
}

/// The conversation as the API takes it: roles alternate, so blocks of the
/// same role in a row join one message, and a message left without blocks
/// is not sent (the API refuses it).
pub(super) fn turns(request: &ModelRequest) -> Vec<Turn<'_>> {
    let mut turns = Vec::new();
    for event in request.messages.iter() {
        match event {
            SessionEvent::User { content } => push(&mut turns, "user", content.iter().filter_map(user_block).collect()),
            SessionEvent::Assistant { text, tool_calls } => {
                let text = (!text.is_empty()).then_some(Block::Text { text });
                let calls = tool_calls.iter().map(|call| {
                    // The API takes an object; arguments the model wrote
                    // as something else were refused as such already.
                    let input = match &call.arguments {
                        arguments @ Value::Object(_) => Cow::Borrowed(arguments),
                        _ => Cow::Owned(Value::Object(Map::new())),
                    };
                    Block::ToolUse { id: &call.id, name: &call.name, input }
                });
                push(&mut turns, "assistant", text.into_iter().chain(calls).collect());
            }
            SessionEvent::ToolResult { call_id, content, is_error, .. } => {
                push(&mut turns, "user", vec![Block::ToolResult { tool_use_id: call_id, content, is_error: *is_error }])
            }
            SessionEvent::TurnEnd { .. } => {}
        }
    }
    turns
}

/// Adds `blocks` to the last message when it has the same role, else as a
/// new one; no blocks, no message.
fn push<'a>(turns: &mut Vec<Turn<'a>>, role: &'static str, blocks: Vec<Block<'a>>) {
    if blocks.is_empty() {
        return;
    }
    match turns.last_mut() {
        Some(last) if last.role == role => last.content.extend(blocks),
        _ => turns.push(Turn { role, content: blocks }),
    }
}

/// The request's tools as the API names them.
pub(super) fn tools(request: &ModelRequest) -> Vec<Tool<'_>> {
    request
        .tools
        .iter()
        .map(|tool| Tool { name: &tool.name, description: &tool.description, input_schema: &tool.parameters })
        .collect()
}

/// A user block as the API takes it; an empty text is left out (the API
/// refuses empty text blocks).
fn user_block(block: &ContentBlock) -> Option<Block<'_>> {
    match block {
        ContentBlock::Text { text } if text.is_empty() => None,
        ContentBlock::Text { text } => Some(Block::Text { text }),
        ContentBlock::Image { mime_type, data } => {
            Some(Block::Image { source: ImageSource { kind: "base64", media_type: mime_type, data } })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::ToolCall;
    use serde_json::json;

    #[test]
    fn roles_alternate_and_what_the_api_refuses_is_left_out() {
        let call = |id: &str, arguments| ToolCall { id: id.into(), name: "read".into(), arguments };
        let messages: Vec<SessionEvent> = vec![
            SessionEvent::User { content: vec![ContentBlock::text("hi"), ContentBlock::text("")] },
            SessionEvent::Assistant {
                text: String::new(),
                tool_calls: vec![call("a", json!({"path": "x"})), call("b", json!("not an object"))],
            },
            SessionEvent::ToolResult {
                call_id: "a".into(),
                name: "read".into(),
                content: "x!".into(),
                is_error: false,
            },
            SessionEvent::ToolResult { call_id: "b".into(), name: "read".into(), content: "no".into(), is_error: true },
            SessionEvent::User { content: vec![ContentBlock::text("")] },
        ];
        let request = ModelRequest {
            session_id: "s".into(),
            system: "".into(),
            messages: messages.into(),
            tools: Vec::new().into(),
            options: Default::default(),
            chunks: None,
            meter: Default::default(),
        };
        let body = MessagesRequest {
            model: "m",
            max_tokens: 8,
            messages: turns(&request),
            system: &request.system,
            tools: crate::agent::model::http::WireTools::default().of(&request, tools).unwrap(),
            stream: false,
        };
        assert_eq!(
            serde_json::to_value(&body).unwrap(),
            json!({"model": "m", "max_tokens": 8, "messages": [
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "a", "name": "read", "input": {"path": "x"}},
                    {"type": "tool_use", "id": "b", "name": "read", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "a", "content": "x!", "is_error": false},
                    {"type": "tool_result", "tool_use_id": "b", "content": "no", "is_error": true}]}
            ]})
        );
    }
}
