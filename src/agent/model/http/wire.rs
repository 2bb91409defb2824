//! What the adapters' wires spell alike, written once: a tool call's
//! arguments as text, the OpenAI wires' function tools, a user message's content (its text, or typed parts
//! with images as data URLs), and why an answer could not be read.

use std::borrow::Cow;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::agent::model::{ModelError, ModelRequest};
use crate::seam::{text_of, ContentBlock};

/// A tool call's arguments as the JSON text the model wrote: kept as it
/// came when it was not JSON, else written out.
pub(in crate::agent::model) fn arguments_text(arguments: &Value) -> Cow<'_, str> {
    match arguments {
        Value::String(raw) => Cow::Borrowed(raw.as_str()),
        other => Cow::Owned(other.to_string()),
    }
}

/// A tool the model may call, as the OpenAI wires name its function.
#[derive(Serialize)]
pub(in crate::agent::model) struct Function<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

/// The request's tools as the OpenAI wires name their functions.
pub(in crate::agent::model) fn functions(request: &ModelRequest) -> impl Iterator<Item = Function<'_>> {
    request.tools.iter().map(|tool| Function {
        name: &tool.name,
        description: &tool.description,
        parameters: &tool.parameters,
    })
}

/// A message's content: one string when it is all text, else typed parts
/// (`P`, as the wire spells a part).
#[derive(Serialize)]
#[serde(untagged)]
pub(in crate::agent::model) enum Content<'a, P> {
    Text(Cow<'a, str>),
    Parts(Vec<P>),
}

/// A user message's `content`: its text when every block is text, else
/// each block as a part, made by `text`, or by `image` from the image's
/// data URL.
pub(in crate::agent::model) fn user_content<'a, P>(
    content: &'a [ContentBlock],
    text: impl Fn(&'a str) -> P,
    image: impl Fn(String) -> P,
) -> Content<'a, P> {
    if content.iter().all(|block| block.as_text().is_some()) {
        return Content::Text(Cow::Owned(text_of(content)));
    }
    let parts = content
        .iter()
        .map(|block| match block {
            ContentBlock::Image { mime_type, data } => image(format!("data:{mime_type};base64,{data}")),
            other => text(other.as_text().unwrap_or_default()),
        })
        .collect();
    Content::Parts(parts)
}

/// One streamed event's payload, read as `E`; not `answer`'s event, it
/// is refused as [`not_read`] says.
pub(in crate::agent::model) fn read_event<E: DeserializeOwned>(answer: &str, data: &[u8]) -> Result<E, ModelError> {
    serde_json::from_slice(data).map_err(|error| not_read(answer, "a streamed event", &error))
}

/// A streamed event's `type`, which every typed event has.
pub(in crate::agent::model) fn kind_of(kind: Option<&str>) -> Result<&str, ModelError> {
    kind.ok_or_else(|| ModelError::Malformed("a streamed event has no type".to_owned()))
}

/// Why `what` could not be read as `answer` (`"a chat completion"`, …):
/// not JSON at all, or JSON of the wrong shape (the message says which
/// field).
pub(in crate::agent::model) fn not_read(answer: &str, what: &str, error: &serde_json::Error) -> ModelError {
    match error.classify() {
        serde_json::error::Category::Data => ModelError::Malformed(format!("{what} is not {answer}: {error}")),
        _ => ModelError::Malformed(format!("{what} is not JSON")),
    }
}
