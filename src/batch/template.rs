//! A pipeline step's templates: its prompt and its `for_each`, in Jinja's
//! syntax (minijinja), over the results of the steps it waits for.
//!
//! A step's template sees one variable per step it names, by id:
//!
//! ```text
//! {{review.output}}                     a step's answer (text)
//! {{triage.structured.failing[0].name}} a field of its structured output
//! {{review.stop_reason}} {{review.completed}} {{review.error}} {{review.skipped}}
//! {{fix.outputs}}                       a map's answers, in element order
//! {{fix.results}}                       a map's results, each as above
//! {{item}} {{index}}                    in a for_each step: its element
//! {{review.output|truncate(2000)}}      at most 2000 bytes of it
//! ```
//!
//! Text goes in as it is; any other value (a list, an object, a number)
//! as JSON. Every inserted value is bounded ([`MAX_INSERTED_BYTES`]) and
//! so is the whole prompt ([`MAX_PROMPT_BYTES`]): a value past its bound
//! fails the step with an error that names it and the way out
//! (`|truncate(N)`), never a silently giant prompt. What a template names
//! is checked before anything runs ([`Templates::references`]); a name
//! that is undefined when it renders (a field the step did not write) is
//! an error, not an empty string. A child's answer is data: it is
//! inserted once and never read as a template itself.

use std::borrow::Cow;

use minijinja::value::{Serde, Value as TemplateValue};
use minijinja::{Environment, Error, ErrorKind, UndefinedBehavior};
use serde_json::Value;

/// The most bytes one inserted value may take (after its filters).
pub const MAX_INSERTED_BYTES: usize = 64 * 1024;

/// The most bytes a rendered prompt may take.
pub const MAX_PROMPT_BYTES: usize = 1024 * 1024;

/// The names a template may use besides step ids: minijinja's globals.
const GLOBALS: [&str; 3] = ["range", "dict", "namespace"];

/// The environment every step's templates render in.
pub(super) struct Templates {
    env: Environment<'static>,
}

impl std::fmt::Debug for Templates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Templates")
    }
}

/// A value as it goes into a prompt: text as it is, anything else as JSON.
fn text_of(value: &TemplateValue) -> Cow<'_, str> {
    match value.as_str() {
        Some(text) => Cow::Borrowed(text),
        None => Cow::Owned(serde_json::to_string(value).unwrap_or_default()),
    }
}

/// At most `bytes` of `text`, cut on a character boundary, with `…` (in
/// the budget) where it was cut.
pub(super) fn cut(text: &str, bytes: usize) -> String {
    if text.len() <= bytes {
        return text.to_owned();
    }
    const MARK: &str = "…";
    let mut end = bytes.saturating_sub(MARK.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    match bytes >= MARK.len() {
        true => format!("{}{MARK}", &text[..end]),
        false => String::new(),
    }
}

impl Templates {
    pub(super) fn new() -> Templates {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_formatter(|out, _state, value| {
            let text = text_of(value);
            if text.len() > MAX_INSERTED_BYTES {
                let why = format!(
                    "an inserted value is {} bytes, more than the {MAX_INSERTED_BYTES} one value may be: \
                     cut it with |truncate(N)",
                    text.len()
                );
                return Err(Error::new(ErrorKind::InvalidOperation, why));
            }
            out.write_str(&text).map_err(|_| Error::new(ErrorKind::WriteFailure, "the prompt could not be written"))
        });
        env.add_filter("truncate", |value: TemplateValue, bytes: usize| cut(&text_of(&value), bytes));
        Templates { env }
    }

    /// The names `source` looks up (`review.output`,
    /// `triage.structured.failing`, `item`), minijinja's globals left out;
    /// or why it is not a template.
    pub(super) fn references<'a>(&self, source: &'a str) -> Result<Vec<String>, String> {
        let env: &Environment<'a> = &self.env;
        let template = env.template_from_str(source).map_err(|e| describe(&e))?;
        Ok(without_globals(template.undeclared_variables(true)))
    }

    /// The names a `for_each` expression looks up; or why it is not one.
    pub(super) fn expression_references<'a>(&self, expression: &'a str) -> Result<Vec<String>, String> {
        let env: &Environment<'a> = &self.env;
        let compiled = env.compile_expression(for_each_expression(expression)).map_err(|e| describe(&e))?;
        Ok(without_globals(compiled.undeclared_variables(true)))
    }

    /// `source` rendered over `context` (an object of the names it uses),
    /// each value and the whole bounded.
    pub(super) fn render(&self, source: &str, context: &Value) -> Result<String, String> {
        let rendered = self.env.render_str(source, TemplateValue::from(Serde(context))).map_err(|e| describe(&e))?;
        if rendered.len() > MAX_PROMPT_BYTES {
            return Err(format!(
                "the rendered prompt is {} bytes, more than the {MAX_PROMPT_BYTES} a prompt may be: cut what it \
                 inserts with |truncate(N)",
                rendered.len()
            ));
        }
        Ok(rendered)
    }

    /// The list a `for_each` expression gives over `context`; or why it
    /// gave none.
    pub(super) fn list<'a>(&self, expression: &'a str, context: &Value) -> Result<Vec<Value>, String> {
        let env: &Environment<'a> = &self.env;
        let compiled = env.compile_expression(for_each_expression(expression)).map_err(|e| describe(&e))?;
        let value = compiled.eval(TemplateValue::from(Serde(context))).map_err(|e| describe(&e))?;
        match serde_json::to_value(&value).map_err(|e| e.to_string())? {
            Value::Array(items) => Ok(items),
            other => Err(format!("for_each gave {}, not a list", kind_of(&other))),
        }
    }
}

/// A `for_each` written `{{ expression }}` or bare.
fn for_each_expression(text: &str) -> &str {
    let trimmed = text.trim();
    match trimmed.strip_prefix("{{").and_then(|rest| rest.strip_suffix("}}")) {
        Some(inner) => inner.trim(),
        None => trimmed,
    }
}

fn without_globals(names: std::collections::HashSet<String>) -> Vec<String> {
    let mut names: Vec<String> = names.into_iter().filter(|name| !GLOBALS.contains(&name.as_str())).collect();
    names.sort();
    names
}

/// A JSON value's kind, in words.
pub(super) fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "text",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// A template error in words: what went wrong and where in the template.
fn describe(error: &Error) -> String {
    let detail = error.detail().map(str::to_owned).unwrap_or_else(|| error.kind().to_string());
    match error.line() {
        Some(line) if line > 1 => format!("{detail} (template line {line})"),
        _ => detail,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_prompt_inserts_text_as_it_is_and_other_values_as_json() {
        let templates = Templates::new();
        let context = json!({"review": {"output": "looks <fine>", "structured": {"n": [1, 2]}}});
        let rendered = templates.render("A: {{review.output}} B: {{review.structured.n}}", &context).unwrap();
        assert_eq!(rendered, "A: looks <fine> B: [1,2]");
    }

    #[test]
    fn a_value_past_the_bound_is_refused_and_truncate_fits_it() {
        let templates = Templates::new();
        let context = json!({"big": {"output": "x".repeat(MAX_INSERTED_BYTES + 1)}});
        let error = templates.render("{{big.output}}", &context).unwrap_err();
        assert!(error.contains("more than the 65536 one value may be"), "{error}");
        assert!(error.contains("|truncate(N)"), "{error}");
        let rendered = templates.render("{{big.output|truncate(10)}}", &context).unwrap();
        assert_eq!(rendered, "xxxxxxx…");
        assert!(rendered.len() <= 10);
    }

    #[test]
    fn an_undefined_name_is_an_error_not_an_empty_string() {
        let templates = Templates::new();
        let error = templates.render("{{review.outptu}}", &json!({"review": {"output": "x"}})).unwrap_err();
        assert!(error.contains("undefined"), "{error}");
    }

    #[test]
    fn references_name_the_paths_a_template_reads() {
        let templates = Templates::new();
        let names = templates
            .references("{% for o in fix.outputs %}{{ o }}{% endfor %} {{triage.structured.failing[0].name}} {{item}} {{ range(3) }}")
            .unwrap();
        assert_eq!(names, ["fix.outputs", "item", "triage.structured.failing"]);
        assert!(templates.references("{{ unclosed").is_err());
        assert_eq!(
            templates.expression_references("{{ triage.structured.failing }}").unwrap(),
            ["triage.structured.failing"]
        );
    }

    #[test]
    fn for_each_gives_a_list_or_says_what_it_gave() {
        let templates = Templates::new();
        let context = json!({"t": {"structured": {"list": ["a", "b"], "one": 3}}});
        assert_eq!(templates.list("{{t.structured.list}}", &context).unwrap(), [json!("a"), json!("b")]);
        assert_eq!(templates.list("t.structured.one", &context).unwrap_err(), "for_each gave a number, not a list");
    }

    #[test]
    fn a_child_answer_holding_template_syntax_is_inserted_as_text() {
        let templates = Templates::new();
        let context = json!({"a": {"output": "{{ 7 * 6 }}"}});
        assert_eq!(templates.render("{{a.output}}", &context).unwrap(), "{{ 7 * 6 }}");
    }
}
