//! The Responses API's answer as serde types: a streamed event, a
//! response object, its output items.
//!
//! Every field may be missing and unknown fields are ignored. The fields
//! that events of other types may spell differently (`delta`, `arguments`,
//! an error's `code` and `message`, an `error` that is not an object) are
//! [`Text`] or [`Lenient`]: read when they have the expected shape, absent
//! otherwise, so an event this version does not know never fails the
//! answer.

use std::fmt;

use serde::de::{self, IgnoredAny};
use serde::{Deserialize, Deserializer};

use crate::agent::model::http::token_count;

/// One streamed event: its `type` says which of the other fields it uses.
#[derive(Deserialize)]
pub(super) struct Event {
    #[serde(rename = "type")]
    pub(super) kind: Option<String>,
    pub(super) output_index: Option<u64>,
    pub(super) item: Option<WireItem>,
    #[serde(default)]
    pub(super) delta: Text,
    #[serde(default)]
    pub(super) arguments: Text,
    /// `response.completed`, `.incomplete` and `.failed`: the response.
    pub(super) response: Option<WireResponse>,
    /// An `error` event's fields sit under `error`, or on the event.
    #[serde(default)]
    pub(super) error: Lenient<WireError>,
    #[serde(default)]
    pub(super) code: Text,
    #[serde(default)]
    pub(super) message: Text,
}

/// A response object: the whole body, or what a final event carries.
#[derive(Deserialize)]
pub(super) struct WireResponse {
    pub(super) output: Option<Vec<WireItem>>,
    pub(super) status: Option<String>,
    pub(super) incomplete_details: Option<IncompleteDetails>,
    pub(super) usage: Option<WireUsage>,
    #[serde(default)]
    pub(super) error: Lenient<WireError>,
}

#[derive(Deserialize)]
pub(super) struct IncompleteDetails {
    pub(super) reason: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct WireUsage {
    #[serde(default, deserialize_with = "token_count")]
    pub(super) input_tokens: Option<u64>,
    #[serde(default, deserialize_with = "token_count")]
    pub(super) output_tokens: Option<u64>,
    pub(super) input_tokens_details: Option<InputDetails>,
}

#[derive(Deserialize)]
pub(super) struct InputDetails {
    #[serde(default, deserialize_with = "token_count")]
    pub(super) cached_tokens: Option<u64>,
}

/// An output item: a `message` or a `function_call` is read, any other
/// type is skipped.
#[derive(Deserialize)]
pub(super) struct WireItem {
    #[serde(rename = "type")]
    pub(super) kind: Option<String>,
    pub(super) content: Option<Vec<WirePart>>,
    pub(super) call_id: Option<String>,
    pub(super) name: Option<String>,
    #[serde(default)]
    pub(super) arguments: Text,
}

#[derive(Deserialize)]
pub(super) struct WirePart {
    #[serde(rename = "type")]
    pub(super) kind: Option<String>,
    #[serde(default)]
    pub(super) text: Text,
    #[serde(default)]
    pub(super) refusal: Text,
}

#[derive(Default, Deserialize)]
pub(super) struct WireError {
    #[serde(default)]
    pub(super) code: Text,
    #[serde(default)]
    pub(super) message: Text,
}

/// A field read as text when it is text; anything else (a number, an
/// object, null) reads as absent.
#[derive(Default)]
pub(super) struct Text(Option<String>);

impl Text {
    pub(super) fn as_str(&self) -> Option<&str> {
        self.0.as_deref()
    }
}

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> de::Visitor<'de> for Visitor {
            type Value = Text;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any value")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Text, E> {
                Ok(Text(Some(text.to_owned())))
            }

            fn visit_string<E: de::Error>(self, text: String) -> Result<Text, E> {
                Ok(Text(Some(text)))
            }

            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Text, E> {
                Ok(Text(None))
            }

            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Text, E> {
                Ok(Text(None))
            }

            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Text, E> {
                Ok(Text(None))
            }

            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Text, E> {
                Ok(Text(None))
            }

            fn visit_unit<E: de::Error>(self) -> Result<Text, E> {
                Ok(Text(None))
            }

            fn visit_seq<A: de::SeqAccess<'de>>(self, mut items: A) -> Result<Text, A::Error> {
                while items.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Text(None))
            }

            fn visit_map<A: de::MapAccess<'de>>(self, mut entries: A) -> Result<Text, A::Error> {
                while entries.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Text(None))
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// A field read as `T` when it is an object; anything else reads as
/// absent.
pub(super) struct Lenient<T>(pub(super) Option<T>);

impl<T> Default for Lenient<T> {
    fn default() -> Self {
        Lenient(None)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Lenient<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> de::Visitor<'de> for Visitor<T> {
            type Value = Lenient<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any value")
            }

            fn visit_map<A: de::MapAccess<'de>>(self, entries: A) -> Result<Lenient<T>, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(entries)).map(|value| Lenient(Some(value)))
            }

            fn visit_seq<A: de::SeqAccess<'de>>(self, mut items: A) -> Result<Lenient<T>, A::Error> {
                while items.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Lenient(None))
            }

            fn visit_str<E: de::Error>(self, _: &str) -> Result<Lenient<T>, E> {
                Ok(Lenient(None))
            }

            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Lenient<T>, E> {
                Ok(Lenient(None))
            }

            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Lenient<T>, E> {
                Ok(Lenient(None))
            }

            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Lenient<T>, E> {
                Ok(Lenient(None))
            }

            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Lenient<T>, E> {
                Ok(Lenient(None))
            }

            fn visit_unit<E: de::Error>(self) -> Result<Lenient<T>, E> {
                Ok(Lenient(None))
            }
        }
        deserializer.deserialize_any(Visitor(std::marker::PhantomData))
    }
}
