//! docs/contract.md §8: the structured-output schema subset.

use serde_json::json;
use subagents::schema::check_subset;

#[test]
fn the_whole_accepted_subset_passes() {
    let schema = json!({
        "type": "object",
        "title": "Report",
        "description": "what the child found",
        "properties": {
            "summary": {"type": "string", "default": "", "examples": ["ok"]},
            "count": {"type": "integer", "enum": [1, 2, 3], "const": 2},
            "ratio": {"type": "number"},
            "done": {"type": "boolean"},
            "nothing": {"type": "null"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "anything": {},
            "either": {"oneOf": [{"type": "string"}, {"type": "object", "additionalProperties": false}]}
        },
        "required": ["summary", "count"],
        "additionalProperties": false
    });
    assert_eq!(check_subset(&schema), Ok(()));
}

#[test]
fn the_root_must_be_an_object_schema() {
    for schema in [json!({"type": "string"}), json!(true), json!({"oneOf": [{}, {}]})] {
        let violations = check_subset(&schema).unwrap_err();
        assert!(violations[0].starts_with("$: the root"), "{violations:?}");
    }
}

#[test]
fn every_unsupported_keyword_is_named_with_its_path() {
    for keyword in ["$ref", "anyOf", "allOf", "pattern", "minimum", "format", "not", "if"] {
        let schema = json!({"type": "object", "properties": {"x": {"type": "string", keyword: 1}}});
        let violations = check_subset(&schema).unwrap_err();
        assert_eq!(violations, vec![format!("$.properties.x: keyword \"{keyword}\" is not supported")]);
    }
}

#[test]
fn enum_const_and_one_of_rules_are_enforced() {
    let cases = [
        (json!({"type": "string", "enum": []}), "$.properties.x.enum: must be a non-empty array"),
        (json!({"type": "string", "enum": [1]}), "$.properties.x.enum[0]: 1 is not of type \"string\""),
        (json!({"enum": [{"a": 1}]}), "$.properties.x.enum[0]: must be a scalar"),
        (json!({"type": "integer", "const": 1.5}), "$.properties.x.const: 1.5 is not of type \"integer\""),
        (
            json!({"type": "string", "enum": ["a"], "const": "b"}),
            "$.properties.x.const: must be one of the enum values",
        ),
        (json!({"oneOf": [{"type": "string"}]}), "$.properties.x.oneOf: needs an array of at least two schemas"),
        (json!({"type": "string", "oneOf": [{}, {}]}), "$.properties.x.oneOf: not allowed beside type"),
        (json!({"type": "string", "items": {}}), "$.properties.x.items: only allowed with \"type\": \"array\""),
        (
            json!({"type": "object", "additionalProperties": {}}),
            "$.properties.x.additionalProperties: must be a boolean",
        ),
        (json!({"type": "wat"}), "$.properties.x.type: unknown type \"wat\""),
    ];
    for (node, expected) in cases {
        let violations = check_subset(&json!({"type": "object", "properties": {"x": node}})).unwrap_err();
        assert!(violations.iter().any(|v| v.starts_with(expected)), "{expected} not in {violations:?}");
    }
}

#[test]
fn nested_violations_are_all_listed() {
    let schema = json!({
        "type": "object",
        "properties": {
            "list": {"type": "array", "items": {"type": "object", "properties": {"a": {"format": "uri"}}}},
            "choice": {"oneOf": [{"type": ["a"]}, {"pattern": "x"}]}
        }
    });
    let violations = check_subset(&schema).unwrap_err();
    assert_eq!(violations.len(), 3, "{violations:?}");
    assert!(violations.iter().any(|v| v.starts_with("$.properties.list.items.properties.a:")));
    assert!(violations.iter().any(|v| v.starts_with("$.properties.choice.oneOf[0].type:")));
    assert!(violations.iter().any(|v| v.starts_with("$.properties.choice.oneOf[1]:")));
}
