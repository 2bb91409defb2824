//! Pipelines: task lines that wait for others and use their results.
//!
//! A task line is a *step* when it says `after` (the ids it waits for) or
//! `for_each` (a list of an earlier result to map over). A file with any
//! step is read whole and its graph checked before anything runs: an
//! `after` or a template naming an id no line has, two lines with one id,
//! steps that wait for each other in a circle, a field outside the earlier
//! step's output schema — each refuses the batch naming its lines
//! ([`PipelineError`]). A file without steps runs as a flat batch, streamed
//! as before, at no extra cost.
//!
//! ```text
//! {"id": "triage", "prompt": "List the failing tests.", "output_schema": {…"failing": […]…}}
//! {"id": "fix", "for_each": "{{triage.structured.failing}}", "prompt": "Fix {{item.name}}."}
//! {"id": "report", "after": ["fix"], "prompt": "Write the report:\n{{fix.outputs}}"}
//! ```
//!
//! # Running
//!
//! A step starts when every step it waits for has settled — those in its
//! `after` and those its templates name. Its prompt is then rendered over
//! their results (minijinja, Jinja's syntax):
//!
//! ```text
//! {{review.output}}                     a step's answer (text)
//! {{triage.structured.failing[0].name}} a field of its structured output
//! {{review.completed}} {{review.stop_reason}} {{review.error}} {{review.skipped}}
//! {{fix.outputs}} {{fix.results}}       a map's answers (whole results), in element order
//! {{item}} {{index}}                    in a for_each step: its element
//! {{steps["fix-login"].output}}         a step whose id is not a plain name
//! {{review.output|truncate(2000)}}      at most 2000 bytes of it
//! ```
//!
//! Text goes in as it is, any other value as JSON; each inserted value is
//! at most [`MAX_INSERTED_BYTES`](super::MAX_INSERTED_BYTES), the prompt
//! [`MAX_PROMPT_BYTES`](super::MAX_PROMPT_BYTES) and a render
//! [`MAX_RENDER_STEPS`](super::MAX_RENDER_STEPS). Independent steps run
//! side by side up to the batch's concurrency, and the batch's budget,
//! retries and timeouts apply to each run as to any task.
//!
//! A `for_each` step runs once per element of its list (`{{item}}`,
//! `{{index}}`), each run with its own id: `fix[0]`, `fix[1]`, … or, with
//! `"key": "name"`, the element's `name` (`fix[parser]`). A list longer than
//! its `max_items` ([`DEFAULT_MAX_ITEMS`]), or not a list, fails the step.
//! The map has settled when every element's run has; a step after it sees
//! `{{fix.outputs}}` and `{{fix.results}}` in element order.
//!
//! # Failures
//!
//! A step whose dependency did not complete does not run: its result line
//! says `"skipped": "after fix[3]: error: …"`. With `"on_failure":
//! "continue"` it runs anyway, the failures visible to its template
//! (`{{review.completed}}`, `{{review.error}}`). A template that cannot
//! render (an inserted value past its bound, a field the result lacks)
//! fails its step with the reason, before any run.
//!
//! # Durable
//!
//! With `--out`, every step's result line (a map's: one per element)
//! carries `inputs_hash`, the hash of the prompt it ran. A resumed
//! pipeline reuses each settled result whose line and inputs are
//! unchanged, so a map over a reused result expands to the same runs and
//! a reduce over reused results sees the same prompt; it runs only what
//! did not settle. A line changed with `--rerun-changed` runs again, and
//! the steps after it see new inputs and run again too. A step is written
//! once, when it settles, so a batch killed at any moment and resumed
//! runs each step to one result.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::tasks::{task_id, Line, Task};
use super::template::{is_plain_name, named, value_of, Reference, TemplateValue, Templates, STEPS_TABLE};
use super::MAX_CONCURRENCY;

/// The most elements a `for_each` runs unless its line says `max_items`.
pub const DEFAULT_MAX_ITEMS: usize = 1000;

/// The longest error text of a dependency quoted in a skip reason.
const QUOTED_ERROR_BYTES: usize = 200;

/// The longest key a `for_each` element's run id carries.
const MAX_KEY_BYTES: usize = 64;

/// Why a pipeline was refused before any run (line numbers from 1).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PipelineError {
    /// Two lines give one id.
    #[error("lines {first} and {line} both have the id {id:?}: a pipeline's ids name one line each")]
    Duplicate {
        /// The id.
        id: String,
        /// The first line with it.
        first: usize,
        /// The later line.
        line: usize,
    },
    /// An `after` or a template names an id no line has.
    #[error("line {line}: {what} names {name:?}, which is no line's id{}", hint.as_ref().map(|hint| format!(" ({hint})")).unwrap_or_default())]
    UnknownId {
        /// The line.
        line: usize,
        /// Where it was named (`after`, `{{review.output}}`).
        what: String,
        /// The name.
        name: String,
        /// What to write instead, when an id is near it: `did you mean
        /// "review"?`, or how a template names an id that is not a plain
        /// name (`{{steps["fix-login"]}}`).
        hint: Option<String>,
    },
    /// Steps that wait for each other, in the order they wait.
    #[error("{}", circle_in_words(lines, ids))]
    Cycle {
        /// The lines of the circle (every one: the message names the first
        /// [`CIRCLE_SHOWN`] and counts the rest).
        lines: Vec<usize>,
        /// Their ids.
        ids: Vec<String>,
    },
    /// A template names what the step it reads cannot give.
    #[error("line {line}: {{{{{reference}}}}}: {why}")]
    Reference {
        /// The line.
        line: usize,
        /// The name as written (`review.outputs`).
        reference: String,
        /// What is wrong with it.
        why: String,
    },
    /// A line's pipeline fields cannot be used as written.
    #[error("line {line}: {why}")]
    Line {
        /// The line.
        line: usize,
        /// What is wrong, and how to put it right.
        why: String,
    },
}

/// The most steps of a circle its refusal names; the rest are counted.
pub const CIRCLE_SHOWN: usize = 8;

/// The longest id a circle's refusal quotes whole.
const CIRCLE_ID_BYTES: usize = 64;

/// A circle in one line of bounded length: its first lines and ids in
/// waiting order, and how many more when it is longer.
fn circle_in_words(lines: &[usize], ids: &[String]) -> String {
    let shown = lines.len().min(CIRCLE_SHOWN);
    let numbers: Vec<String> = lines[..shown].iter().map(usize::to_string).collect();
    let names: Vec<String> =
        ids.iter().take(CIRCLE_SHOWN).map(|id| super::template::cut(id, CIRCLE_ID_BYTES)).collect();
    if lines.len() <= CIRCLE_SHOWN {
        return format!(
            "lines {} wait for each other in a circle ({}): no step of it could start",
            numbers.join(", "),
            names.join(" → ")
        );
    }
    format!(
        "lines {} and {} more: {} steps wait for each other in a circle ({} → …): no step of it could start",
        numbers.join(", "),
        lines.len() - shown,
        lines.len(),
        names.join(" → ")
    )
}

/// One step of a checked pipeline.
#[derive(Debug)]
pub(super) struct Step {
    pub(super) line: usize,
    pub(super) task: Box<Task>,
    pub(super) id: String,
    pub(super) hash: u64,
    /// The steps it waits for (indices), each once.
    pub(super) waits_for: Vec<usize>,
    /// The steps that wait for it.
    pub(super) dependents: Vec<usize>,
}

impl Step {
    pub(super) fn is_map(&self) -> bool {
        self.task.for_each.is_some()
    }
}

/// A tasks file read whole and checked as a graph; see the [module](self).
#[derive(Debug)]
pub(super) struct Pipeline {
    pub(super) steps: Vec<Step>,
    pub(super) templates: Templates,
    /// Each step's index, by id.
    index_of: HashMap<String, usize>,
}

impl Pipeline {
    /// Whether a later step reads the result of `id` (a step's id, or one
    /// of its map's elements', `fix[0]`).
    pub(super) fn is_read_by_others(&self, id: &str) -> bool {
        let at = self.index_of.get(id).or_else(|| id.split_once('[').and_then(|(map, _)| self.index_of.get(map)));
        at.is_some_and(|&at| !self.steps[at].dependents.is_empty())
    }
}

/// The result fields a template may read of a step, and of a map.
const STEP_FIELDS: [&str; 6] = ["output", "structured", "stop_reason", "completed", "error", "skipped"];
const MAP_FIELDS: [&str; 3] = ["outputs", "results", "completed"];

impl Pipeline {
    /// Checks `lines` (every line of the file) as a pipeline.
    pub(super) fn check(lines: Vec<Line>) -> Result<Pipeline, PipelineError> {
        let templates = Templates::new();
        let mut steps = Vec::new();
        let mut index_of: HashMap<String, usize> = HashMap::new();
        for line in lines {
            match line {
                Line::Task { number, task, hash } => {
                    let id = task_id(&task, number, hash);
                    if let Some(&first) = index_of.get(&id) {
                        let first = steps.get(first).map_or(0, |step: &Step| step.line);
                        return Err(PipelineError::Duplicate { id, first, line: number });
                    }
                    index_of.insert(id.clone(), steps.len());
                    steps.push(Step { line: number, task, id, hash, waits_for: Vec::new(), dependents: Vec::new() });
                }
                Line::Skipped { number, why } => {
                    // A step may name it: a pipeline is whole or refused.
                    let why = format!("not a task ({why}); a pipeline is checked whole: mend or remove the line");
                    return Err(PipelineError::Line { line: number, why });
                }
            }
        }
        let ids: Vec<&str> = steps.iter().map(|step| step.id.as_str()).collect();
        let unknown = |line: usize, what: String, name: &str| PipelineError::UnknownId {
            line,
            what,
            name: name.to_owned(),
            hint: crate::actors::nearest(name, ids.iter().copied()).map(|near| format!("did you mean {near:?}?")),
        };
        let unknown_in_template = |line: usize, reference: &Reference| PipelineError::UnknownId {
            line,
            what: format!("{{{{{}}}}}", reference.written),
            name: reference.root.clone(),
            hint: template_hint(reference, &steps, &index_of),
        };
        let mut waits: Vec<Vec<usize>> = Vec::with_capacity(steps.len());
        for step in &steps {
            let (line, task) = (step.line, &step.task);
            if !step.is_map() && (task.max_items.is_some() || task.key.is_some()) {
                return Err(PipelineError::Line { line, why: "max_items and key belong to a for_each line".into() });
            }
            if task.max_items.is_some_and(|max| max == 0 || max > MAX_CONCURRENCY) {
                let why = format!("max_items must be 1 to {MAX_CONCURRENCY}");
                return Err(PipelineError::Line { line, why });
            }
            let mut waits_for = Vec::new();
            for name in task.after.iter().flatten() {
                let &at = index_of.get(name).ok_or_else(|| unknown(line, "after".into(), name))?;
                waits_for.push(at);
            }
            let mut references = Vec::new();
            if step.task.is_step() {
                let in_prompt = templates
                    .references(&task.prompt)
                    .map_err(|why| PipelineError::Line { line, why: format!("its prompt {why}") })?;
                references.extend(in_prompt);
            }
            if let Some(for_each) = &task.for_each {
                let in_list = templates
                    .expression_references(for_each)
                    .map_err(|why| PipelineError::Line { line, why: format!("its for_each {why}") })?;
                if let Some(item) = in_list.iter().find(|name| is_item(name)) {
                    let why = format!("for_each names {{{{{}}}}}, which is set only in its runs' prompts", item.root);
                    return Err(PipelineError::Line { line, why });
                }
                references.extend(in_list);
            }
            for reference in references {
                if is_item(&reference) {
                    if !step.is_map() {
                        let mut why = format!("{{{{{}}}}} is set only in a for_each line", reference.root);
                        if index_of.contains_key(&reference.root) {
                            why += &format!(
                                "; the line with the id {:?} is {{{{{}}}}}",
                                reference.root,
                                named(&reference.root)
                            );
                        }
                        return Err(PipelineError::Reference { line, reference: reference.written, why });
                    }
                    continue;
                }
                let &at = index_of.get(&reference.root).ok_or_else(|| unknown_in_template(line, &reference))?;
                let field: Vec<&str> = reference.fields.iter().map(String::as_str).collect();
                check_field(&steps[at], &field).map_err(|why| PipelineError::Reference {
                    line,
                    reference: reference.written.clone(),
                    why,
                })?;
                waits_for.push(at);
            }
            waits_for.sort_unstable();
            waits_for.dedup();
            waits.push(waits_for);
        }
        for (index, waits_for) in waits.into_iter().enumerate() {
            for &at in &waits_for {
                steps[at].dependents.push(index);
            }
            steps[index].waits_for = waits_for;
        }
        if let Some(circle) = find_cycle(&steps) {
            let lines = circle.iter().map(|&at| steps[at].line).collect();
            let ids = circle.iter().map(|&at| steps[at].id.clone()).collect();
            return Err(PipelineError::Cycle { lines, ids });
        }
        // An element's id is its map's: no line may take one.
        for step in &steps {
            let Some((map, _)) = step.id.split_once('[') else { continue };
            if let Some(&at) = index_of.get(map).filter(|&&at| steps[at].is_map()) {
                let why = format!("its id {:?} is one line {}'s for_each gives its runs", step.id, steps[at].line);
                return Err(PipelineError::Line { line: step.line, why });
            }
        }
        Ok(Pipeline { steps, templates, index_of })
    }
}

/// Whether `reference` reads a `for_each` run's own `item` or `index`
/// (through the table, those are steps' ids like any other).
fn is_item(reference: &Reference) -> bool {
    !reference.in_table && (reference.root == "item" || reference.root == "index")
}

/// What to write instead of a template's name for no line's id: the id
/// it was likely meant to be, as a template names it. `{{fix-login.output}}`
/// is read as `fix` minus `login.output`: an id that holds `fix` as a word
/// is the likely one, and the table names it.
fn template_hint(reference: &Reference, steps: &[Step], index_of: &HashMap<String, usize>) -> Option<String> {
    let name = reference.root.as_str();
    let as_words = (!reference.in_table)
        .then(|| {
            steps.iter().find(|step| {
                !is_plain_name(&step.id)
                    && step.id.split(|c: char| !c.is_ascii_alphanumeric() && c != '_').any(|word| word == name)
            })
        })
        .flatten();
    if let Some(step) = as_words {
        let field = if step.is_map() { "outputs" } else { "output" };
        return Some(format!(
            "a template reads {:?} as an expression, not an id: an id that is not a plain name is named \
             {{{{{}.{field}}}}}",
            step.id,
            named(&step.id)
        ));
    }
    // `steps.output` meant for the line whose id is `steps`.
    let dotted = reference.written.starts_with(&format!("{STEPS_TABLE}."));
    let table_line = (dotted && index_of.contains_key(STEPS_TABLE))
        .then(|| format!("; the line with the id {STEPS_TABLE:?} is {{{{{}}}}}", named(STEPS_TABLE)));
    let near = crate::actors::nearest(name, steps.iter().map(|step| step.id.as_str()));
    match (near, table_line) {
        (Some(near), table_line) => {
            let near = match is_plain_name(near) {
                true => format!("{near:?}"),
                false => format!("{{{{{}}}}}", named(near)),
            };
            Some(format!("did you mean {near}?{}", table_line.unwrap_or_default()))
        }
        (None, Some(table_line)) => Some(table_line.trim_start_matches("; ").to_owned()),
        (None, None) => None,
    }
}

/// Whether `field` (the path after a step's id) is one its result has:
/// a step's fields or a map's, and within `structured` the properties
/// its output schema declares.
fn check_field(step: &Step, field: &[&str]) -> Result<(), String> {
    let Some((&first, rest)) = field.split_first() else { return Ok(()) };
    let (fields, kind) = match step.is_map() {
        true => (&MAP_FIELDS[..], "a for_each step"),
        false => (&STEP_FIELDS[..], "a step"),
    };
    if !fields.contains(&first) {
        return Err(format!("{} is {kind}: its results are {}", step.id, fields.join(", ")));
    }
    if first != "structured" {
        return Ok(());
    }
    let Some(mut schema) = step.task.output_schema.as_ref() else {
        return Err(format!("{} has no output_schema, so no structured result", step.id));
    };
    for name in rest {
        let Some(properties) = schema.get("properties").and_then(Value::as_object) else { return Ok(()) };
        schema = properties.get(*name).ok_or_else(|| {
            let declared: Vec<&str> = properties.keys().map(String::as_str).collect();
            format!("{name:?} is not in {}'s output_schema (it declares {})", step.id, declared.join(", "))
        })?;
    }
    Ok(())
}

/// A circle of steps that wait for each other, in waiting order, if any.
fn find_cycle(steps: &[Step]) -> Option<Vec<usize>> {
    // Kahn's order: what it cannot reach waits, directly or not, on a circle.
    let mut pending: Vec<usize> = steps.iter().map(|step| step.waits_for.len()).collect();
    let mut ready: Vec<usize> = (0..steps.len()).filter(|&at| pending[at] == 0).collect();
    while let Some(at) = ready.pop() {
        for &dependent in &steps[at].dependents {
            pending[dependent] -= 1;
            if pending[dependent] == 0 {
                ready.push(dependent);
            }
        }
    }
    let start = (0..steps.len()).find(|&at| pending[at] > 0)?;
    // Walk back along unsettled waits until a step repeats: that is the circle.
    let (mut seen, mut walk, mut at) = (HashMap::new(), Vec::new(), start);
    while !seen.contains_key(&at) {
        seen.insert(at, walk.len());
        walk.push(at);
        at = *steps[at].waits_for.iter().find(|&&before| pending[before] > 0)?;
    }
    let mut circle = walk.split_off(seen[&at]);
    circle.reverse(); // each waits for the one before it
    circle.rotate_right(1);
    Some(circle)
}

/// What a settled step (or map element) gives the steps after it.
#[derive(Clone, Debug)]
pub(super) struct Outcome {
    pub(super) completed: bool,
    /// Why it did not complete, for a skip reason: `"error: …"`.
    why: Option<String>,
    /// Its id (a map element's own).
    pub(super) id: String,
    /// What its dependents' templates read (made once, then shared by
    /// every context that holds it).
    pub(super) view: TemplateValue,
}

impl Outcome {
    /// The outcome of a result line.
    pub(super) fn of(record: &Value) -> Outcome {
        let stop_reason = record.get("stop_reason").cloned().unwrap_or(Value::Null);
        let completed = stop_reason == "completed";
        let error = record
            .get("error")
            .or_else(|| record["diagnostic"].get("reason"))
            .and_then(Value::as_str)
            .map(|text| super::template::cut(text, QUOTED_ERROR_BYTES));
        let skipped = record.get("skipped").and_then(Value::as_str);
        let why = (!completed).then(|| match (skipped, stop_reason.as_str(), &error) {
            (Some(skipped), _, _) => format!("skipped ({})", super::template::cut(skipped, QUOTED_ERROR_BYTES)),
            (None, Some(reason), Some(error)) => format!("{reason}: {error}"),
            (None, Some(reason), None) => reason.to_owned(),
            (None, None, Some(error)) => format!("error: {error}"),
            (None, None, None) => "error".to_owned(),
        });
        let view = value_of(&json!({
            "output": record.get("output").cloned().unwrap_or_else(|| json!("")),
            "structured": record.get("structured").cloned().unwrap_or(Value::Null),
            "stop_reason": stop_reason,
            "completed": completed,
            "error": error,
            "skipped": skipped,
        }));
        Outcome { completed, why, id: record["id"].as_str().unwrap_or_default().to_owned(), view }
    }

    /// The outcome of a map from its elements'.
    pub(super) fn of_map(id: &str, elements: &[Outcome]) -> Outcome {
        let failed = elements.iter().find(|element| !element.completed);
        let output = |element: &Outcome| element.view.get_attr("output").unwrap_or_default();
        let view = minijinja::context! {
            outputs => elements.iter().map(output).collect::<Vec<_>>(),
            results => elements.iter().map(|element| element.view.clone()).collect::<Vec<_>>(),
            completed => failed.is_none(),
        };
        Outcome {
            completed: failed.is_none(),
            why: failed.map(|element| format!("{}: {}", element.id, element.why.as_deref().unwrap_or("error"))),
            id: id.to_owned(),
            view,
        }
    }

    /// Why a step after this one is skipped.
    pub(super) fn skip_reason(&self) -> String {
        match &self.why {
            // A map names its failed element itself.
            Some(why) if why.starts_with(&format!("{}[", self.id)) => format!("after {why}"),
            Some(why) => format!("after {}: {why}", self.id),
            None => format!("after {}", self.id),
        }
    }
}

/// Each element's run id: `ID[index]`, or `ID[key]` with the step's
/// `key` (the element's field, made a plain name and bounded; two
/// elements with one key fail the step).
pub(super) fn element_ids(id: &str, key: Option<&str>, items: &[TemplateValue]) -> Result<Vec<String>, String> {
    let Some(key) = key else {
        return Ok((0..items.len()).map(|index| format!("{id}[{index}]")).collect());
    };
    let mut seen = HashMap::new();
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            let field = serde_json::to_value(item.get_attr(key).unwrap_or_default()).unwrap_or_default();
            let name = match &field {
                Value::String(text) => text.clone(),
                Value::Number(number) => number.to_string(),
                other => {
                    return Err(format!(
                        "element {index}'s {key:?} is {}, not text or a number",
                        super::template::kind_of(other)
                    ))
                }
            };
            let plain: String =
                name.chars().map(|c| if c.is_alphanumeric() || "._:/-".contains(c) { c } else { '_' }).collect();
            let plain = super::template::cut(&plain, MAX_KEY_BYTES);
            if let Some(first) = seen.insert(plain.clone(), index) {
                return Err(format!("elements {first} and {index} have one {key:?} ({plain}): keys must differ"));
            }
            Ok(format!("{id}[{plain}]"))
        })
        .collect()
}

#[cfg(test)]
mod tests;
