//! The structured-output schema subset.
//!
//! A request's `output_schema` must be an object-rooted JSON Schema using
//! only the keywords below; anything else is rejected up front with every
//! path-qualified violation, so a child is never started with a schema it
//! cannot be held to.
//!
//! Accepted: `type` (one of object, array, string, number, integer,
//! boolean, null); `properties`, `required` (each name declared) and
//! `additionalProperties` (boolean) on objects; `items` on arrays; `enum`
//! (non-empty, scalars, matching `type`); `const` (scalar, matching `type`,
//! inside `enum` when both); `oneOf` (two or more branches, not beside
//! `type` or object/array keywords); the annotations `description`,
//! `title`, `default`, `examples`. A node with neither `type` nor `oneOf`
//! accepts any JSON.
//!
//! ```
//! use serde_json::json;
//! use subagents::schema::check_subset;
//!
//! assert!(check_subset(&json!({"type": "object", "properties": {"n": {"type": "integer"}}})).is_ok());
//! let violations = check_subset(&json!({"type": "object", "properties": {"n": {"type": ["integer", "null"]}}}))
//!     .unwrap_err();
//! assert_eq!(violations, vec!["$.properties.n.type: type arrays are not supported; use oneOf".to_string()]);
//! ```

use serde_json::{Map, Value};

/// A JSON Schema compiled for validating values (tool arguments, structured
/// results; feature `agent`). Violations come back path-qualified, like [`check_subset`]'s.
///
/// ```
/// use serde_json::json;
/// use subagents::schema::CompiledSchema;
///
/// let schema = CompiledSchema::compile(&json!({"type": "object", "required": ["n"]})).unwrap();
/// assert!(schema.violations(&json!({"n": 1})).is_empty());
/// assert_eq!(schema.violations(&json!({})).len(), 1);
/// ```
#[cfg(feature = "agent")]
pub struct CompiledSchema {
    validator: jsonschema::Validator,
}

#[cfg(feature = "agent")]
impl std::fmt::Debug for CompiledSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CompiledSchema")
    }
}

/// Why a schema is not a usable JSON Schema, in the validator's words.
#[cfg(feature = "agent")]
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SchemaError(String);

#[cfg(feature = "agent")]
impl SchemaError {
    /// The reason, as displayed.
    pub fn reason(&self) -> &str {
        &self.0
    }
}

#[cfg(feature = "agent")]
impl CompiledSchema {
    /// Compiles `schema`; `Err` says why it is not a usable JSON Schema.
    pub fn compile(schema: &Value) -> Result<Self, SchemaError> {
        jsonschema::validator_for(schema)
            .map(|validator| CompiledSchema { validator })
            .map_err(|e| SchemaError(e.to_string()))
    }

    /// Every violation of `value`, each prefixed by its path (`$`, `$.city`,
    /// `$.items[2]`); empty when `value` is valid.
    pub fn violations(&self, value: &Value) -> Vec<String> {
        self.validator
            .iter_errors(value)
            .map(|error| format!("{}: {}", json_path(error.instance_path().as_str()), error.masked()))
            .collect()
    }
}

/// `/items/2/name` → `$.items[2].name`.
#[cfg(feature = "agent")]
fn json_path(pointer: &str) -> String {
    let mut path = String::from("$");
    for segment in pointer.split('/').skip(1) {
        let segment = segment.replace("~1", "/").replace("~0", "~");
        if !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit()) {
            path.push_str(&format!("[{segment}]"));
        } else {
            path.push('.');
            path.push_str(&segment);
        }
    }
    path
}

const TYPES: [&str; 7] = ["object", "array", "string", "number", "integer", "boolean", "null"];
const ANNOTATIONS: [&str; 4] = ["description", "title", "default", "examples"];
const OBJECT_KEYWORDS: [&str; 3] = ["properties", "required", "additionalProperties"];

/// Check `schema` against the subset; `Err` lists every violation, each
/// prefixed by its path (`$`, `$.properties.name`, `$.oneOf[1]`, …).
pub fn check_subset(schema: &Value) -> Result<(), Vec<String>> {
    let mut violations = Vec::new();
    match schema.as_object() {
        Some(root) if root.get("type").and_then(Value::as_str) == Some("object") => {}
        _ => violations.push("$: the root must be a schema with \"type\": \"object\"".to_owned()),
    }
    check_node(schema, "$", &mut violations);
    if violations.is_empty() {
        Ok(())
    } else {
        Err(violations)
    }
}

fn check_node(node: &Value, path: &str, out: &mut Vec<String>) {
    let Some(node) = node.as_object() else {
        out.push(format!("{path}: a schema must be a JSON object"));
        return;
    };
    let kind = check_type(node, path, out);
    for key in node.keys() {
        let known = matches!(
            key.as_str(),
            "type" | "properties" | "required" | "additionalProperties" | "items" | "enum" | "const" | "oneOf"
        ) || ANNOTATIONS.contains(&key.as_str());
        if !known {
            out.push(format!("{path}: keyword \"{key}\" is not supported"));
        }
    }
    for key in OBJECT_KEYWORDS {
        if node.contains_key(key) && kind != Some("object") {
            out.push(format!("{path}.{key}: only allowed with \"type\": \"object\""));
        }
    }
    if node.contains_key("items") && kind != Some("array") {
        out.push(format!("{path}.items: only allowed with \"type\": \"array\""));
    }
    if let Some(properties) = node.get("properties") {
        match properties.as_object() {
            Some(properties) => {
                for (name, child) in properties {
                    check_node(child, &format!("{path}.properties.{name}"), out);
                }
            }
            None => out.push(format!("{path}.properties: must be an object of schemas")),
        }
    }
    if let Some(required) = node.get("required") {
        check_required(required, node.get("properties").and_then(Value::as_object), path, out);
    }
    if let Some(additional) = node.get("additionalProperties") {
        if !additional.is_boolean() {
            out.push(format!("{path}.additionalProperties: must be a boolean"));
        }
    }
    if let Some(items) = node.get("items") {
        check_node(items, &format!("{path}.items"), out);
    }
    check_enum_and_const(node, kind, path, out);
    if let Some(branches) = node.get("oneOf") {
        check_one_of(node, branches, path, out);
    }
    for key in ["description", "title"] {
        if node.get(key).is_some_and(|v| !v.is_string()) {
            out.push(format!("{path}.{key}: must be a string"));
        }
    }
    if node.get("examples").is_some_and(|v| !v.is_array()) {
        out.push(format!("{path}.examples: must be an array"));
    }
}

/// The node's declared type, after checking it is one known string.
fn check_type<'a>(node: &'a Map<String, Value>, path: &str, out: &mut Vec<String>) -> Option<&'a str> {
    match node.get("type")? {
        Value::String(kind) if TYPES.contains(&kind.as_str()) => Some(kind.as_str()),
        Value::String(kind) => {
            out.push(format!("{path}.type: unknown type \"{kind}\""));
            None
        }
        Value::Array(_) => {
            out.push(format!("{path}.type: type arrays are not supported; use oneOf"));
            None
        }
        _ => {
            out.push(format!("{path}.type: must be a string"));
            None
        }
    }
}

fn check_required(required: &Value, properties: Option<&Map<String, Value>>, path: &str, out: &mut Vec<String>) {
    let Some(names) = required.as_array() else {
        out.push(format!("{path}.required: must be an array of property names"));
        return;
    };
    for (index, name) in names.iter().enumerate() {
        match name.as_str() {
            Some(name) if properties.is_some_and(|p| p.contains_key(name)) => {}
            Some(name) => out.push(format!("{path}.required[{index}]: \"{name}\" is not declared in properties")),
            None => out.push(format!("{path}.required[{index}]: must be a string")),
        }
    }
}

fn check_enum_and_const(node: &Map<String, Value>, kind: Option<&str>, path: &str, out: &mut Vec<String>) {
    let mut members: Option<&Vec<Value>> = None;
    if let Some(values) = node.get("enum") {
        match values.as_array() {
            Some(values) if !values.is_empty() => {
                members = Some(values);
                for (index, value) in values.iter().enumerate() {
                    check_scalar(value, kind, &format!("{path}.enum[{index}]"), out);
                }
            }
            _ => out.push(format!("{path}.enum: must be a non-empty array")),
        }
    }
    if let Some(value) = node.get("const") {
        check_scalar(value, kind, &format!("{path}.const"), out);
        if members.is_some_and(|m| !m.contains(value)) {
            out.push(format!("{path}.const: must be one of the enum values"));
        }
    }
}

fn check_scalar(value: &Value, kind: Option<&str>, path: &str, out: &mut Vec<String>) {
    if value.is_object() || value.is_array() {
        out.push(format!("{path}: must be a scalar (string, number, boolean or null)"));
        return;
    }
    if let Some(kind) = kind {
        if !matches_type(value, kind) {
            out.push(format!("{path}: {value} is not of type \"{kind}\""));
        }
    }
}

fn matches_type(value: &Value, kind: &str) -> bool {
    match kind {
        "string" => value.is_string(),
        "number" => value.is_number(),
        "integer" => value.is_i64() || value.is_u64() || value.as_f64().is_some_and(|f| f.fract() == 0.0),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        _ => false,
    }
}

fn check_one_of(node: &Map<String, Value>, branches: &Value, path: &str, out: &mut Vec<String>) {
    let beside: Vec<&str> = ["type", "properties", "required", "additionalProperties", "items"]
        .into_iter()
        .filter(|k| node.contains_key(*k))
        .collect();
    if !beside.is_empty() {
        out.push(format!("{path}.oneOf: not allowed beside {}", beside.join(", ")));
    }
    match branches.as_array() {
        Some(branches) if branches.len() >= 2 => {
            for (index, branch) in branches.iter().enumerate() {
                check_node(branch, &format!("{path}.oneOf[{index}]"), out);
            }
        }
        _ => out.push(format!("{path}.oneOf: needs an array of at least two schemas")),
    }
}
