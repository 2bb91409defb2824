//! Which keys a table takes, checked before its values are read, so a key
//! in the wrong table is named with the table it belongs to and the keys
//! this one takes — never a parser's list of every key of every kind.
//!
//! A table's keys are the fields of the struct that reads it
//! ([`fields_of`]), so a key list is never written twice: adding a field
//! to a kind's table is adding its key.
//!
//! ```toml
//! [providers.cheap]
//! kind = "spawn"
//! rpm = 60      # `rpm` is not a key of a spawn provider: it is a key of [models.NAME]
//! ```

use std::cell::Cell;
use std::ops::Range;

use serde::de::{self, Visitor};
use toml::de::DeValue;
use toml::Spanned;

use super::{ConfigError, Source};

/// The keys of the struct `T` reads, as serde names them.
pub(super) fn fields_of<T: de::DeserializeOwned>() -> &'static [&'static str] {
    let fields = Cell::new(None);
    let _ = T::deserialize(FieldsOf(&fields));
    fields.get().unwrap_or_default()
}

/// A deserializer that only remembers the fields a struct asks for.
struct FieldsOf<'a>(&'a Cell<Option<&'static [&'static str]>>);

impl<'de> de::Deserializer<'de> for FieldsOf<'_> {
    type Error = de::value::Error;

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.set(Some(fields));
        Err(de::Error::custom("fields read"))
    }

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
        unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
    }
}

/// A table of the file and the keys it takes, for messages.
#[derive(Clone, Debug)]
pub(super) struct TableKeys {
    /// How the table is named in a message: `a spawn provider`, `[models.NAME]`.
    pub(super) what: &'static str,
    /// Where the table stands, for "it is a key of …": `[models.NAME]`.
    pub(super) place: &'static str,
    pub(super) keys: Vec<&'static str>,
}

/// `table`'s keys, each one `this` takes; another is refused at its place,
/// saying which of `elsewhere` takes it (or the nearest key of `this`).
pub(super) fn check(
    source: &Source<'_>,
    table: &Spanned<DeValue<'_>>,
    this: &TableKeys,
    elsewhere: &[TableKeys],
) -> Result<(), ConfigError> {
    match table.get_ref().as_table() {
        Some(entries) => check_table(source, entries, this, elsewhere),
        None => Ok(()),
    }
}

/// [`check`] of a table's entries.
pub(super) fn check_table(
    source: &Source<'_>,
    entries: &toml::de::DeTable<'_>,
    this: &TableKeys,
    elsewhere: &[TableKeys],
) -> Result<(), ConfigError> {
    for (key, value) in entries.iter() {
        let key_name = key.get_ref().as_ref();
        if this.keys.contains(&key_name) {
            continue;
        }
        // A key of another table is shown at its value (what was set where
        // it does not apply), an unknown one at the key itself.
        let belongs = elsewhere.iter().any(|table| table.keys.contains(&key_name));
        let span = if belongs { value.span() } else { key.span() };
        return Err(source.error(Some(span), unknown_key(key_name, this, elsewhere)));
    }
    Ok(())
}

/// Why `key` is not one of `this`'s, and where it would be.
pub(super) fn unknown_key(key: &str, this: &TableKeys, elsewhere: &[TableKeys]) -> String {
    let shown = shown(key);
    let homes: Vec<&str> =
        elsewhere.iter().filter(|table| table.keys.contains(&key)).map(|table| table.place).collect();
    let takes = format!("{} takes {}", this.what, keys_listed(&this.keys));
    match (homes.as_slice(), crate::actors::nearest(key, this.keys.iter().copied())) {
        ([], Some(near)) => format!("{shown} is not a key of {} (did you mean `{near}`?): {takes}", this.what),
        ([], None) => format!("{shown} is not a key of {}: {takes}", this.what),
        (homes, _) => format!("{shown} is a key of {}, not of {}: {takes}", or_list(homes), this.what),
    }
}

/// A key as a message shows it: in backquotes when it is a plain word,
/// else quoted and cut (a quoted key may hold anything).
fn shown(key: &str) -> String {
    match !key.is_empty()
        && key.len() <= super::MAX_NAME_BYTES
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        true => format!("`{key}`"),
        false => super::bounds::quoted(key),
    }
}

/// `a, b or c`.
fn or_list(items: &[&str]) -> String {
    match items {
        [] => String::new(),
        [one] => (*one).to_owned(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

/// `a, b and c` in backquotes, or `no keys`.
fn keys_listed(keys: &[&str]) -> String {
    let quoted: Vec<String> = keys.iter().map(|key| format!("`{key}`")).collect();
    match quoted.as_slice() {
        [] => "no keys".to_owned(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// Reads `T` from `value` (its keys checked first), each error at its place.
pub(super) fn read<T: de::DeserializeOwned>(
    source: &Source<'_>,
    value: Spanned<DeValue<'_>>,
) -> Result<T, ConfigError> {
    let span = value.span();
    T::deserialize(toml::de::ValueDeserializer::from(value)).map_err(|error| located(source, span, &error))
}

/// A parse error at its own place when it has one, else at `span`.
pub(super) fn located(source: &Source<'_>, span: Range<usize>, error: &toml::de::Error) -> ConfigError {
    source.error(Some(error.span().unwrap_or(span)), error.message().trim_end())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct Two {
        first: Option<u32>,
        #[serde(rename = "second_key")]
        second: Option<String>,
    }

    #[test]
    fn a_structs_keys_are_its_fields_as_the_file_spells_them() {
        assert_eq!(fields_of::<Two>(), ["first", "second_key"]);
    }

    #[test]
    fn a_key_of_another_table_is_named_with_where_it_belongs() {
        let this = TableKeys { what: "a spawn provider", place: "[providers.NAME]", keys: vec!["model", "tools"] };
        let route = TableKeys { what: "a route", place: "[models.NAME]", keys: vec!["rpm", "model"] };
        let message = unknown_key("rpm", &this, std::slice::from_ref(&route));
        assert_eq!(
            message,
            "`rpm` is a key of [models.NAME], not of a spawn provider: a spawn provider takes `model` and `tools`"
        );
        assert!(unknown_key("modle", &this, std::slice::from_ref(&route)).contains("(did you mean `model`?)"));
        assert!(unknown_key("a\u{1b}[2J", &this, &[route]).starts_with("\"a\\u{1b}[2J\" is not a key"));
    }
}
