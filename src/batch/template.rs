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
//! An id that is not a plain name (`fix-login`, which Jinja reads as
//! `fix` minus `login`) is named through the table of the steps a
//! template waits for: `{{steps["fix-login"].output}}` ([`STEPS_TABLE`];
//! any id can be named so, `{{steps.review.output}}` too).
//!
//! Text goes in as it is; any other value (a list, an object, a number)
//! as JSON. Every inserted value is bounded ([`MAX_INSERTED_BYTES`]) and
//! so is the whole prompt ([`MAX_PROMPT_BYTES`]): a value past its bound
//! fails the step with an error that names it and the way out
//! (`|truncate(N)`), never a silently giant prompt. The prompt is bounded
//! as it is written, not after, and a render is bounded in steps
//! ([`MAX_RENDER_STEPS`], minijinja's fuel: each instruction, each 64
//! bytes a template makes), so no template can run for long or hold much
//! memory, whatever it loops over or builds; constants, which minijinja
//! works out as it compiles (before fuel counts), and lists repeated a
//! known number of times are measured before that and a template whose
//! values of known size are too big is refused ([`Templates::references`]
//! says so before anything runs). What a template names is
//! checked before anything runs ([`Templates::references`]); a name that
//! is undefined when it renders (a field the step did not write) is an
//! error, not an empty string. A child's answer is data: it is inserted
//! once and never read as a template itself.

use std::borrow::Cow;

pub(super) use minijinja::value::Value as TemplateValue;

mod scan;
use minijinja::value::ValueKind;
use minijinja::{Environment, Error, ErrorKind, UndefinedBehavior};
use scan::too_big;
use serde_json::Value;

/// The most bytes one inserted value may take (after its filters).
pub const MAX_INSERTED_BYTES: usize = 64 * 1024;

/// The most bytes a rendered prompt may take.
pub const MAX_PROMPT_BYTES: usize = 1024 * 1024;

/// The most steps one render (a prompt, or a `for_each` list) may take:
/// one per instruction and one per 64 bytes the template makes or writes
/// (minijinja's fuel). Room for a reduce that loops over a map of 100,000
/// results; a fraction of a second of work, and at most about 256 MB made.
pub const MAX_RENDER_STEPS: u64 = 4_000_000;

/// The names a template may use besides step ids: minijinja's globals.
const GLOBALS: [&str; 3] = ["range", "dict", "namespace"];

/// The table of the steps a template waits for, by id: the way to name an
/// id that is not a plain name (`{{steps["fix-login"].output}}`), and any
/// other (`{{steps.review.output}}`, `{{steps["item"]}}`).
pub(super) const STEPS_TABLE: &str = "steps";

/// How a template names a step through the table, for errors.
const TABLE_FORM: &str = "steps[\"ID\"] (or steps.ID for a plain name)";

/// A name a template reads: a step's id and the fields after it, or
/// `item`/`index` and theirs.
#[derive(Debug, PartialEq)]
pub(super) struct Reference {
    /// As written: `review.output`, `steps["fix-login"].output`.
    pub(super) written: String,
    /// The step's id (or `item`, `index`).
    pub(super) root: String,
    /// The fields after it.
    pub(super) fields: Vec<String>,
    /// Whether it names its step through [`STEPS_TABLE`] (where `item` is
    /// a step's id like any other).
    pub(super) in_table: bool,
}

/// Whether a template can name `id` as it is: a Jinja identifier that is
/// not a keyword and not one of the names a template sets itself.
pub(super) fn is_plain_name(id: &str) -> bool {
    const KEYWORDS: [&str; 14] =
        ["true", "false", "none", "True", "False", "None", "and", "or", "not", "in", "is", "if", "else", "loop"];
    let mut chars = id.chars();
    let starts = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    starts
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !KEYWORDS.contains(&id)
        && !["item", "index", STEPS_TABLE].contains(&id)
}

/// How a template names `id`: plain (`review`) or through the table
/// (`steps["fix-login"]`, the id quoted as a JSON string, which Jinja reads
/// back unchanged).
pub(super) fn named(id: &str) -> String {
    match is_plain_name(id) {
        true => id.to_owned(),
        false => format!("{STEPS_TABLE}[{}]", serde_json::to_string(id).unwrap_or_default()),
    }
}

/// The environment every step's templates render in.
pub(super) struct Templates {
    env: Environment<'static>,
}

impl std::fmt::Debug for Templates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Templates")
    }
}

/// Bytes written up to a bound: a write past it fails, and says so.
struct Bounded {
    bytes: Vec<u8>,
    bound: usize,
    overflowed: bool,
}

impl Bounded {
    fn new(bound: usize) -> Bounded {
        Bounded { bytes: Vec::new(), bound, overflowed: false }
    }

    /// The text written (its last character dropped if the bound cut it).
    fn into_text(self) -> String {
        match String::from_utf8(self.bytes) {
            Ok(text) => text,
            Err(cut) => {
                let valid = cut.utf8_error().valid_up_to();
                let mut bytes = cut.into_bytes();
                bytes.truncate(valid);
                String::from_utf8(bytes).unwrap_or_default()
            }
        }
    }
}

impl std::io::Write for Bounded {
    /// Takes what fits; past the bound, fails.
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let room = self.bound - self.bytes.len();
        if room == 0 && !buf.is_empty() {
            self.overflowed = true;
            return Err(std::io::Error::other("past its bound"));
        }
        let taken = buf.len().min(room);
        self.bytes.extend_from_slice(&buf[..taken]);
        Ok(taken)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A value as it goes into a prompt: text as it is, anything else as JSON;
/// `Err` with its first `bound` bytes when it is longer than that (a big
/// value is never written out whole to be measured).
fn text_of(value: &TemplateValue, bound: usize) -> Result<Cow<'_, str>, String> {
    if let Some(text) = value.as_str() {
        return match text.len() <= bound {
            true => Ok(Cow::Borrowed(text)),
            false => {
                let mut end = bound;
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                Err(text[..end].to_owned())
            }
        };
    }
    let mut json = Bounded::new(bound);
    let written = serde_json::to_writer(&mut json, value);
    match (written, json.overflowed) {
        (_, true) => Err(json.into_text()),
        _ => Ok(Cow::Owned(json.into_text())),
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
        env.set_fuel(Some(MAX_RENDER_STEPS));
        env.set_formatter(|out, _state, value| {
            let text = text_of(value, MAX_INSERTED_BYTES).map_err(|_| {
                // Text's length is known; another value is not written out whole to learn it.
                let size = match value.as_str() {
                    Some(text) => format!("is {} bytes, more than the {MAX_INSERTED_BYTES}", text.len()),
                    None => format!("is more than the {MAX_INSERTED_BYTES} bytes"),
                };
                let why = format!("an inserted value {size} one value may be: cut it with |truncate(N)");
                Error::new(ErrorKind::InvalidOperation, why)
            })?;
            out.write_str(&text).map_err(|_| Error::new(ErrorKind::WriteFailure, "the prompt could not be written"))
        });
        env.add_filter("truncate", |value: TemplateValue, bytes: usize| {
            // Past `bytes` by more than a character: enough to cut with `…`.
            let text = text_of(&value, bytes.saturating_add(8)).unwrap_or_else(Cow::Owned);
            cut(&text, bytes)
        });
        Templates { env }
    }

    /// The names `source` looks up (`review.output`,
    /// `triage.structured.failing`, `item`, `steps["fix-login"].output`),
    /// minijinja's globals left out; or what is wrong with it, said after
    /// its subject ("is not a template: …").
    pub(super) fn references<'a>(&self, source: &'a str) -> Result<Vec<Reference>, String> {
        if let Some(why) = too_big(source, false) {
            return Err(format!("is refused: {why}"));
        }
        let env: &Environment<'a> = &self.env;
        let template = env.template_from_str(source).map_err(|e| format!("is not a template: {}", describe(&e)))?;
        resolve(without_globals(template.undeclared_variables(true)), source, false)
    }

    /// The names a `for_each` expression looks up; or what is wrong with
    /// it, as [`references`](Self::references) says it.
    pub(super) fn expression_references<'a>(&self, expression: &'a str) -> Result<Vec<Reference>, String> {
        let env: &Environment<'a> = &self.env;
        let expression = for_each_expression(expression);
        if let Some(why) = too_big(expression, true) {
            return Err(format!("is refused: {why}"));
        }
        let compiled =
            env.compile_expression(expression).map_err(|e| format!("is not an expression: {}", describe(&e)))?;
        resolve(without_globals(compiled.undeclared_variables(true)), expression, true)
    }

    /// `source` rendered over `context` (an object of the names it uses),
    /// each value and the whole bounded as it is written, and the render
    /// bounded in steps.
    pub(super) fn render(&self, source: &str, context: &TemplateValue) -> Result<String, String> {
        if let Some(why) = too_big(source, false) {
            return Err(why);
        }
        let template = self.env.template_from_str(source).map_err(|e| describe(&e))?;
        let mut prompt = Bounded::new(MAX_PROMPT_BYTES);
        let rendered = template.render_captured_to(context.clone(), &mut prompt).map(drop);
        if prompt.overflowed {
            return Err(format!(
                "the rendered prompt is more than the {MAX_PROMPT_BYTES} bytes a prompt may be (it was stopped \
                 there): cut what it inserts with |truncate(N)"
            ));
        }
        rendered.map_err(|e| describe(&e))?;
        Ok(prompt.into_text())
    }

    /// The elements a `for_each` expression gives over `context`, at most
    /// `max_items` of them (a longer list is refused as it is read, never
    /// copied whole); or why it gave none.
    pub(super) fn list<'a>(
        &self,
        expression: &'a str,
        context: &TemplateValue,
        max_items: usize,
    ) -> Result<Vec<TemplateValue>, String> {
        // Counted past `max_items` to say how long it is, up to here.
        const COUNTED: usize = 1_000_000;
        let expression = for_each_expression(expression);
        if let Some(why) = too_big(expression, true) {
            return Err(why);
        }
        let env: &Environment<'a> = &self.env;
        let compiled = env.compile_expression(expression).map_err(|e| describe(&e))?;
        let value = compiled.eval(context.clone()).map_err(|e| describe(&e))?;
        if !matches!(value.kind(), ValueKind::Seq | ValueKind::Iterable) {
            return Err(format!("for_each gave {}, not a list", kind_of_template(&value)));
        }
        let too_many =
            |length: String| format!("for_each gave {length} elements, more than its max_items of {max_items}");
        if let Some(length) = value.len().filter(|&length| length > max_items) {
            return Err(too_many(length.to_string()));
        }
        let mut elements = value.try_iter().map_err(|e| describe(&e))?;
        let items: Vec<TemplateValue> = elements.by_ref().take(max_items).collect();
        match elements.take(COUNTED).count() {
            0 => Ok(items),
            more if more < COUNTED => Err(too_many((max_items + more).to_string())),
            _ => Err(too_many(format!("more than {}", max_items + COUNTED))),
        }
    }
}

/// A JSON value as a template reads it (converted once: a template value
/// is shared, not copied, by every context that holds it).
pub(super) fn value_of(json: &Value) -> TemplateValue {
    TemplateValue::from(minijinja::value::Serde(json))
}

/// A template value's kind, in words.
fn kind_of_template(value: &TemplateValue) -> &'static str {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => "null",
        ValueKind::Bool => "a boolean",
        ValueKind::Number => "a number",
        ValueKind::String => "text",
        ValueKind::Bytes => "bytes",
        ValueKind::Seq | ValueKind::Iterable => "a list",
        ValueKind::Map => "an object",
        _ => "a value that is no list",
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

/// `names` (dotted paths, as minijinja reports them) as references. A
/// path through the table (`steps.review.output`) names its step; the
/// table read another way (`steps["fix-login"]`, which minijinja reports
/// as `steps` alone) is found in `source`'s tokens, where each use must
/// subscript it with an id in quotes.
fn resolve(names: Vec<String>, source: &str, in_expression: bool) -> Result<Vec<Reference>, String> {
    let mut references = Vec::new();
    let mut subscripted = false;
    for name in names {
        let mut path = name.split('.').map(str::to_owned);
        let root = path.next().unwrap_or_default();
        let (root, in_table) = match root == STEPS_TABLE {
            true => match path.next() {
                Some(id) => (id, true),
                None => {
                    subscripted = true;
                    continue;
                }
            },
            false => (root, false),
        };
        references.push(Reference { root, fields: path.collect(), in_table, written: name });
    }
    if subscripted {
        references.extend(table_subscripts(source, in_expression)?);
    }
    Ok(references)
}

/// Each `steps["ID"]` in `source` (with the `.field`s after it); an error
/// for a use of the table that names no step by a quoted id.
fn table_subscripts(source: &str, in_expression: bool) -> Result<Vec<Reference>, String> {
    use minijinja::machinery::{tokenize, Token};
    let tokens = tokenize(source, in_expression, minijinja::syntax::SyntaxConfig::default())
        .map(|token| token.map(|(token, _)| token))
        .collect::<Result<Vec<Token>, Error>>()
        .map_err(|e| format!("is not a template: {}", describe(&e)))?;
    let refused = |what: &str| {
        format!("reads {STEPS_TABLE} {what}: it is the table of steps by id, where a step is {TABLE_FORM}")
    };
    let mut references = Vec::new();
    for (at, token) in tokens.iter().enumerate() {
        let after_dot = at > 0 && matches!(tokens[at - 1], Token::Dot);
        if !matches!(token, Token::Ident(name) if *name == STEPS_TABLE) || after_dot {
            continue;
        }
        match tokens.get(at + 1) {
            // A dotted path, which minijinja reported; an assignment sets a
            // name of the template's own.
            Some(Token::Dot | Token::Assign) => continue,
            Some(Token::BracketOpen) => {}
            _ => return Err(refused("whole")),
        }
        let mut next = at + 2;
        // Adjacent literals are one string, as in Jinja.
        let mut id = None::<String>;
        loop {
            match tokens.get(next) {
                Some(Token::Str(text)) => id.get_or_insert_with(String::new).push_str(text),
                Some(Token::String(text)) => id.get_or_insert_with(String::new).push_str(text),
                _ => break,
            }
            next += 1;
        }
        let (Some(id), Some(Token::BracketClose)) = (id, tokens.get(next)) else {
            return Err(refused("by something other than an id in quotes"));
        };
        next += 1;
        let mut fields = Vec::new();
        while let (Some(Token::Dot), Some(Token::Ident(field))) = (tokens.get(next), tokens.get(next + 1)) {
            fields.push((*field).to_owned());
            next += 2;
        }
        let quoted = serde_json::to_string(&id).unwrap_or_default();
        let written = std::iter::once(format!("{STEPS_TABLE}[{quoted}]"))
            .chain(fields.iter().cloned())
            .collect::<Vec<_>>()
            .join(".");
        references.push(Reference { written, root: id, fields, in_table: true });
    }
    Ok(references)
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
    let detail = match error.kind() {
        ErrorKind::OutOfFuel => format!(
            "it took more than the {MAX_RENDER_STEPS} steps a template may take (a loop too long, or a value \
             made too big)"
        ),
        _ => error.detail().map(str::to_owned).unwrap_or_else(|| error.kind().to_string()),
    };
    match error.line() {
        Some(line) if line > 1 => format!("{detail} (template line {line})"),
        _ => detail,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A JSON context as a template reads it.
    fn context(json: Value) -> TemplateValue {
        value_of(&json)
    }

    #[test]
    fn a_prompt_inserts_text_as_it_is_and_other_values_as_json() {
        let templates = Templates::new();
        let json_context = json!({"review": {"output": "looks <fine>", "structured": {"n": [1, 2]}}});
        let rendered =
            templates.render("A: {{review.output}} B: {{review.structured.n}}", &context(json_context)).unwrap();
        assert_eq!(rendered, "A: looks <fine> B: [1,2]");
    }

    #[test]
    fn a_value_past_the_bound_is_refused_and_truncate_fits_it() {
        let templates = Templates::new();
        let context = context(json!({"big": {"output": "x".repeat(MAX_INSERTED_BYTES + 1)}}));
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
        let error = templates.render("{{review.outptu}}", &context(json!({"review": {"output": "x"}}))).unwrap_err();
        assert!(error.contains("undefined"), "{error}");
    }

    #[test]
    fn references_name_the_paths_a_template_reads() {
        let templates = Templates::new();
        let names = templates
            .references("{% for o in fix.outputs %}{{ o }}{% endfor %} {{triage.structured.failing[0].name}} {{item}} {{ range(3) }}")
            .unwrap();
        let written = |references: Vec<Reference>| references.into_iter().map(|r| r.written).collect::<Vec<_>>();
        assert_eq!(written(names), ["fix.outputs", "item", "triage.structured.failing"]);
        assert!(templates.references("{{ unclosed").is_err());
        assert_eq!(
            written(templates.expression_references("{{ triage.structured.failing }}").unwrap()),
            ["triage.structured.failing"]
        );
        let table = templates.references("{{ steps[\"fix-\" 'login'].output }} {{ steps.review }}").unwrap();
        assert_eq!(
            table,
            [
                Reference { written: "steps.review".into(), root: "review".into(), fields: vec![], in_table: true },
                Reference {
                    written: "steps[\"fix-login\"].output".into(),
                    root: "fix-login".into(),
                    fields: vec!["output".into()],
                    in_table: true
                },
            ]
        );
    }

    #[test]
    fn for_each_gives_a_list_or_says_what_it_gave() {
        let templates = Templates::new();
        let context = context(json!({"t": {"structured": {"list": ["a", "b"], "one": 3}}}));
        let items = templates.list("{{t.structured.list}}", &context, 2).unwrap();
        assert_eq!(items, [TemplateValue::from("a"), TemplateValue::from("b")]);
        assert_eq!(templates.list("t.structured.one", &context, 2).unwrap_err(), "for_each gave a number, not a list");
        let error = templates.list("t.structured.list", &context, 1).unwrap_err();
        assert_eq!(error, "for_each gave 2 elements, more than its max_items of 1");
        let error = templates.list("range(5)", &context, 3).unwrap_err();
        assert_eq!(error, "for_each gave 5 elements, more than its max_items of 3");
    }

    /// `work` on a thread of its own; `None` when it has not answered
    /// within `limit` (it is left to run: a test that fails ends its process).
    fn within<T: Send + 'static>(limit: std::time::Duration, work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || drop(sender.send(work())));
        receiver.recv_timeout(limit).ok()
    }

    const LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

    #[test]
    fn a_render_of_ten_billion_steps_stops_at_its_bound() {
        let source = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        let rendered = within(LIMIT, || Templates::new().render(source, &context(json!({}))));
        let error = rendered.expect("the render ends well within its limit").unwrap_err();
        assert!(error.contains("more than the") && error.contains("steps a template may take"), "{error}");
    }

    #[test]
    fn a_string_doubled_again_and_again_is_refused_before_it_is_made() {
        for doublings in [30, 45] {
            let source = format!(
                "{{% set ns = namespace(s=\"x\") %}}{{% for i in range({doublings}) %}}{{% set ns.s = ns.s ~ ns.s %}}{{% endfor %}}{{{{ ns.s|length }}}}"
            );
            let rendered = within(LIMIT, move || Templates::new().render(&source, &context(json!({}))));
            let error = rendered.expect("the render ends").unwrap_err();
            assert!(error.contains("steps a template may take"), "{doublings} doublings: {error}");
        }
    }

    #[test]
    fn a_prompt_of_terabytes_stops_at_its_bound_as_it_is_written() {
        let context = context(json!({"big": {"output": "x".repeat(60_000)}}));
        let source = "{% for i in range(100000) %}{% for j in range(100000) %}{{ big.output }}{% endfor %}{% endfor %}";
        let rendered = within(LIMIT, move || Templates::new().render(source, &context));
        let error = rendered.expect("the render ends").unwrap_err();
        assert!(error.contains(&format!("more than the {MAX_PROMPT_BYTES} bytes a prompt may be")), "{error}");
        assert!(error.contains("|truncate(N)"), "{error}");
    }

    #[test]
    fn a_for_each_of_a_hundred_million_is_refused_without_being_made() {
        let listed = within(LIMIT, || {
            Templates::new().list("[0] * 100000000", &context(json!({})), 1000).map(|items| items.len())
        });
        let error = listed.expect("the list is refused at once").unwrap_err();
        assert!(error.contains("steps a template may take") || error.contains("max_items"), "{error}");
    }

    #[test]
    fn a_value_of_constants_made_too_big_is_refused_before_minijinja_folds_it() {
        // minijinja works out constants as it compiles, where no fuel counts:
        // each of these took tens of seconds (and gigabytes) to open.
        let bombs = [
            "{{ [1]*100000000 == [1]*100000000 }}",
            "{{ 2 in [1]*100000000 }}",
            "{{ 2 in [1]*(10**8) }}",
            "{{ ([1]*10000)*10000 == [0] }}",
            "{{ ([1]*100000000)|tojson|length }}",
            "{{ [1]*100000000 ~ '' }}",
            "{% set x = 1 %}{{ [x]*100000000 ~ '' }}",
        ];
        for bomb in bombs {
            let refused = within(std::time::Duration::from_secs(5), move || {
                let templates = Templates::new();
                (templates.references(bomb), templates.render(bomb, &context(json!({}))))
            });
            let (references, rendered) = refused.unwrap_or_else(|| panic!("{bomb} is refused at once"));
            let error = references.unwrap_err();
            assert!(error.contains("steps a template may take"), "{bomb}: {error}");
            let error = rendered.unwrap_err();
            assert!(error.contains("steps a template may take"), "{bomb}: {error}");
        }
        let listed = within(std::time::Duration::from_secs(5), || {
            let templates = Templates::new();
            let expression = "[1]*100000000 == [1]*100000000 and [[1]]";
            (templates.expression_references(expression), templates.list(expression, &context(json!({})), 10))
        });
        let (references, listed) = listed.expect("the for_each is refused at once");
        assert!(references.unwrap_err().contains("steps a template may take"));
        assert!(listed.unwrap_err().contains("steps a template may take"));
        // Small constants fold as before.
        let templates = Templates::new();
        let small = "{{ [0]*10 == [0]*10 }} {{ '-'*5 }} {{ 2 in [1, 2]*3 }} {{ [1, 2]*2 }}";
        assert_eq!(templates.render(small, &context(json!({}))).unwrap(), "true ----- true [1,2,1,2]");
    }

    #[test]
    fn a_child_answer_holding_template_syntax_is_inserted_as_text() {
        let templates = Templates::new();
        let context = context(json!({"a": {"output": "{{ 7 * 6 }}"}}));
        assert_eq!(templates.render("{{a.output}}", &context).unwrap(), "{{ 7 * 6 }}");
    }
}
