//! What the adapters' wires spell alike, written once: a tool call's
//! arguments as text, the OpenAI wires' function tools, a user message's content (its text, or typed parts
//! with images as data URLs), and why an answer could not be read.

use std::borrow::Cow;
use std::sync::{Arc, Mutex, PoisonError};

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::agent::model::{ModelError, ModelRequest};
use crate::agent::ToolSpec;
use crate::seam::{text_of, ContentBlock};

/// A tool call's arguments as the JSON text the model wrote: kept as it
/// came when it was not JSON, else written out.
pub(in crate::agent::model) fn arguments_text(arguments: &Value) -> Cow<'_, str> {
    match arguments {
        Value::String(raw) => Cow::Borrowed(raw.as_str()),
        other => Cow::Owned(other.to_string()),
    }
}

/// One adapter's tools as its wire spells them, written out once per tool
/// list and spliced into every body that offers that list: every request
/// of a tool set shares one list ([`Toolset::visible_specs`]), and its
/// schemas are most of a small body.
///
/// [`Toolset::visible_specs`]: crate::agent::Toolset::visible_specs
#[derive(Default)]
pub(in crate::agent::model) struct WireTools {
    /// The last list and its text; holding the list keeps its address
    /// from being reused by another.
    last: Mutex<Option<(Arc<[ToolSpec]>, WireText)>>,
}

impl WireTools {
    /// `request`'s tools as `wire` spells them, `None` when it offers none.
    pub(in crate::agent::model) fn of<'a, T: Serialize>(
        &self,
        request: &'a ModelRequest,
        wire: impl FnOnce(&'a ModelRequest) -> T,
    ) -> Result<Option<WireText>, ModelError> {
        if request.tools.is_empty() {
            return Ok(None);
        }
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((tools, text)) = &*last {
            if Arc::ptr_eq(tools, &request.tools) {
                return Ok(Some(text.clone()));
            }
        }
        let text = serde_json::value::to_raw_value(&wire(request))
            .map_err(|e| ModelError::Config(format!("cannot encode the request's tools: {e}")))?;
        let text = WireText(Arc::new(text));
        *last = Some((request.tools.clone(), text.clone()));
        Ok(Some(text))
    }
}

/// JSON written out before, shared, and written into a body as it is.
#[derive(Clone)]
pub(in crate::agent::model) struct WireText(Arc<Box<RawValue>>);

impl Serialize for WireText {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn request(tools: &Arc<[ToolSpec]>) -> ModelRequest {
        ModelRequest {
            session_id: "s".into(),
            system: "".into(),
            messages: Vec::new().into(),
            tools: tools.clone(),
            options: Default::default(),
            chunks: None,
            meter: Default::default(),
        }
    }

    fn spec(name: &str) -> ToolSpec {
        ToolSpec { name: name.into(), description: "d \"quoted\"".into(), parameters: json!({"type": "object"}) }
    }

    fn wire(request: &ModelRequest) -> Vec<Function<'_>> {
        functions(request).collect()
    }

    #[test]
    fn tools_are_written_once_per_list_and_spliced_as_they_would_be_written() {
        let (one, other): (Arc<[ToolSpec]>, Arc<[ToolSpec]>) = (vec![spec("a")].into(), vec![spec("b")].into());
        let tools = WireTools::default();
        let first = tools.of(&request(&one), wire).unwrap().unwrap();
        let again = tools.of(&request(&one), |_| -> Vec<Function<'_>> { panic!("written again") }).unwrap().unwrap();
        assert!(Arc::ptr_eq(&first.0, &again.0));
        // Spliced into a body, the text is what writing the list inline gives.
        let inline = serde_json::to_string(&json!({"tools": wire(&request(&one))})).unwrap();
        assert_eq!(serde_json::to_string(&json!({"tools": serde_json::to_value(&first).unwrap()})).unwrap(), inline);
        let body = serde_json::to_string(&std::collections::BTreeMap::from([("tools", &first)])).unwrap();
        assert_eq!(body, inline);
        // Another list is written anew; no list, no field.
        let second = tools.of(&request(&other), wire).unwrap().unwrap();
        assert!(second.0.get().contains("\"b\"") && !Arc::ptr_eq(&first.0, &second.0));
        assert!(tools.of(&request(&Vec::new().into()), wire).unwrap().is_none());
    }
}
