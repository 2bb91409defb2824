//! The embedded default's behaviour: a deterministic model that uses the
//! tools it is given, so the CLI shows real delegation without a key.
//!
//! For each turn it reads the task (the latest user message) and:
//! - with a `structured_output` tool, captures a value built from the
//!   tool's schema (a node's first `examples` entry where it has one, so
//!   a task can script the list a pipeline maps over);
//! - with a delegating tool (parameters `description` and `prompt`) and a
//!   task listing parts separated by `;`, delegates each part, then
//!   summarises the answers;
//! - with `list_dir` and a task that mentions files or a directory, lists
//!   the working directory first, then answers with what it saw;
//! - with `[tool:NAME {"json": "arguments"}]` in the task (any number of
//!   them), calls each tool named so, then answers with what each returned
//!   — an error's text too (`error: …`), and a structured result as its
//!   JSON — so an MCP server's tools can be shown without a key;
//! - honours `[refuse]`, `[max-tokens]` and `[fail]` in the task, so a batch
//!   can show every stop reason, `[slow]` (a minute-long, cancellable
//!   answer; a task listing parts delegates them first, so its children
//!   are the slow ones) and `[delay:MS]` (the turn's first answer comes after MS
//!   milliseconds, cancellably; at most ten minutes) for cancellation,
//!   crash and fault drills;
//! - otherwise answers `handled: <task>`.

use std::time::Duration;

use serde_json::{json, Map, Value};

use super::scripted::{ScriptedModel, Step};
use super::{Finish, ModelError, ModelReply, ModelRequest};
use crate::agent::session::{SessionEvent, ToolCall};
use crate::agent::tools::ToolSpec;

impl ScriptedModel {
    /// The embedded default for demos and the CLI: a deterministic model
    /// that uses the tools it is given. It captures a value for a
    /// `structured_output` tool, delegates each part of a task listing parts
    /// separated by `;`, lists the directory for a task about files, honours
    /// `[refuse]`, `[max-tokens]`, `[fail]`, `[slow]` and `[delay:MS]`, and
    /// otherwise answers `handled: <task>`. Scripts added later take
    /// precedence.
    pub fn demo() -> Self {
        // `[slow]` holds a turn open for a minute (cancellable): for tests
        // and demos of cancellation and crashes mid-turn. A task that lists
        // parts delegates them at once instead, so `a [slow]; b [slow]`
        // holds its two children (a tree to cancel).
        let slow = Step::respond(|request| match delegation(request) {
            Some(reply) => Ok(reply),
            None => Ok(ModelReply::text("finally done")),
        })
        .after_requested(|request| delegation(request).is_none().then_some(SLOW));
        ScriptedModel::new()
            .script(super::scripted::ScriptMatch::PromptContains("[slow]".to_owned()), vec![slow])
            .fallback(Step::respond(demo_reply).after_requested(requested_delay))
    }
}

/// How long a `[slow]` turn takes to answer.
const SLOW: Duration = Duration::from_secs(60);

/// The calls that delegate each part of a task listing parts, on the
/// turn's first call (no tool result yet), when the agent has a
/// delegating tool.
fn delegation(request: &ModelRequest) -> Option<ModelReply> {
    let turn = current_turn(&request.messages);
    if turn.iter().any(|event| matches!(event, SessionEvent::ToolResult { .. })) {
        return None;
    }
    let task = request.last_user_text().unwrap_or_default();
    let parts: Vec<&str> = task.split(';').map(str::trim).filter(|p| !p.is_empty()).collect();
    let delegate = request.tools.iter().find(|t| is_delegating(t)).filter(|_| parts.len() > 1)?;
    let calls_for_parts = parts
        .iter()
        .map(|part| {
            let description: String = part.split_whitespace().take(4).collect::<Vec<_>>().join(" ");
            (delegate.name.clone(), json!({"description": description, "prompt": part}))
        })
        .collect();
    Some(calls(calls_for_parts))
}

/// The longest `[delay:MS]` honoured: a typo must not hold a run for days.
const MAX_REQUESTED_DELAY: Duration = Duration::from_secs(600);

/// `[delay:MS]` in the task delays the turn's first answer (later calls of
/// the same turn, after tool results, answer at once).
fn requested_delay(request: &ModelRequest) -> Option<Duration> {
    if !current_turn(&request.messages).is_empty() {
        return None;
    }
    let task = request.last_user_text()?;
    let (_, rest) = task.split_once("[delay:")?;
    let (millis, _) = rest.split_once(']')?;
    let millis: u64 = millis.trim().parse().ok()?;
    Some(Duration::from_millis(millis).min(MAX_REQUESTED_DELAY))
}

fn demo_reply(request: &ModelRequest) -> Result<ModelReply, ModelError> {
    let task = request.last_user_text().unwrap_or_default();
    let turn = current_turn(&request.messages);
    let results: Vec<&str> = turn
        .iter()
        .filter_map(|event| match event {
            SessionEvent::ToolResult { content, .. } => Some(content.as_str()),
            _ => None,
        })
        .collect();
    if task.contains("[fail]") {
        return Err(ModelError::Scripted("the demo model was asked to fail".to_owned()));
    }
    if task.contains("[refuse]") {
        return Ok(ModelReply { finish: Finish::Refusal, ..ModelReply::text("I will not do that task.") });
    }
    if task.contains("[max-tokens]") {
        return Ok(ModelReply { finish: Finish::MaxTokens, ..ModelReply::text("This answer was cut off befo") });
    }
    if let Some(capture) = request.tools.iter().find(|t| t.name == "structured_output") {
        if results.is_empty() {
            let value = example_value(&capture.parameters, &task);
            return Ok(calls(vec![("structured_output".to_owned(), value)]));
        }
    }
    let named = named_tool_calls(&task);
    if !named.is_empty() {
        if results.is_empty() {
            return Ok(calls(named));
        }
        return Ok(ModelReply::text(tool_answers(turn)));
    }
    if results.is_empty() {
        if let Some(delegating) = delegation(request) {
            return Ok(delegating);
        }
        let lower = task.to_lowercase();
        let mentions_files = ["file", "director", "folder"].iter().any(|w| lower.contains(w));
        if mentions_files && request.tools.iter().any(|t| t.name == "list_dir") {
            return Ok(calls(vec![("list_dir".to_owned(), json!({}))]));
        }
        return Ok(ModelReply::text(format!("handled: {task}")));
    }
    let summary: Vec<String> = results.iter().map(|r| format!("- {}", one_line(&answer_of(r)))).collect();
    Ok(ModelReply::text(format!("Done: {task}\n{}", summary.join("\n"))))
}

/// The calls `[tool:NAME {json}]` asks for, in order; the arguments
/// default to `{}`, and a marker whose arguments are not JSON is left out.
fn named_tool_calls(task: &str) -> Vec<(String, Value)> {
    let mut named = Vec::new();
    let mut rest = task;
    while let Some(start) = rest.find("[tool:") {
        rest = &rest[start + "[tool:".len()..];
        let name_end = rest.find(|c: char| c.is_whitespace() || c == ']').unwrap_or(rest.len());
        let (name, after) = rest.split_at(name_end);
        let after = after.trim_start();
        let (arguments, after) = if after.starts_with('{') {
            let mut values = serde_json::Deserializer::from_str(after).into_iter::<Value>();
            match values.next() {
                Some(Ok(value)) => {
                    let used = values.byte_offset();
                    (value, &after[used..])
                }
                _ => continue,
            }
        } else {
            (json!({}), after)
        };
        if !name.is_empty() && after.trim_start().starts_with(']') {
            named.push((name.to_owned(), arguments));
        }
    }
    named
}

/// What the turn's tool calls returned, one result after another.
fn tool_answers(turn: &[SessionEvent]) -> String {
    let answers: Vec<String> = turn
        .iter()
        .filter_map(|event| match event {
            SessionEvent::ToolResult { name, content, is_error, .. } => {
                Some(if *is_error { format!("{name} error: {content}") } else { format!("{name}: {content}") })
            }
            _ => None,
        })
        .collect();
    answers.join("\n")
}

/// The events since the latest user message.
fn current_turn(messages: &[SessionEvent]) -> &[SessionEvent] {
    let start = messages.iter().rposition(|e| matches!(e, SessionEvent::User { .. })).map_or(0, |i| i + 1);
    &messages[start..]
}

fn is_delegating(tool: &ToolSpec) -> bool {
    let properties = &tool.parameters["properties"];
    properties.get("prompt").is_some() && properties.get("description").is_some()
}

fn calls(calls: Vec<(String, Value)>) -> ModelReply {
    let tool_calls = calls
        .into_iter()
        .enumerate()
        .map(|(n, (name, arguments))| ToolCall { id: format!("call_{n}"), name, arguments })
        .collect();
    ModelReply { text: String::new(), tool_calls, finish: Finish::ToolCalls, usage: None }
}

/// A subagent tool's result carries the child's answer in `output`.
fn answer_of(result: &str) -> String {
    match serde_json::from_str::<Value>(result) {
        Ok(value) => match value.get("output").and_then(Value::as_str) {
            Some(output) => output.to_owned(),
            None => result.to_owned(),
        },
        Err(_) => result.to_owned(),
    }
}

/// A result on one line: its lines joined, cut at 160 characters.
fn one_line(text: &str) -> String {
    let joined = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(", ");
    match joined.char_indices().nth(160) {
        Some((cut, _)) => format!("{}…", &joined[..cut]),
        None => joined,
    }
}

/// A value satisfying `schema` (the structured-output subset): its first
/// of `examples` where it gives them, else required properties, first
/// enum value, first `oneOf` branch, the task as text.
fn example_value(schema: &Value, task: &str) -> Value {
    if let Some(example) = schema.get("examples").and_then(Value::as_array).and_then(|examples| examples.first()) {
        return example.clone();
    }
    if let Some(value) = schema.get("const") {
        return value.clone();
    }
    if let Some(first) = schema.get("enum").and_then(Value::as_array).and_then(|values| values.first()) {
        return first.clone();
    }
    if let Some(branch) = schema.get("oneOf").and_then(Value::as_array).and_then(|branches| branches.first()) {
        return example_value(branch, task);
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => {
            let mut object = Map::new();
            let properties = schema.get("properties").and_then(Value::as_object);
            for name in schema.get("required").and_then(Value::as_array).into_iter().flatten() {
                let Some(name) = name.as_str() else { continue };
                let property = properties.and_then(|p| p.get(name)).cloned().unwrap_or(Value::Null);
                object.insert(name.to_owned(), example_value(&property, task));
            }
            Value::Object(object)
        }
        Some("array") => json!([example_value(schema.get("items").unwrap_or(&Value::Null), task)]),
        Some("string") => json!(format!("handled: {task}")),
        Some("integer") => json!(1),
        Some("number") => json!(1.5),
        Some("boolean") => json!(true),
        Some("null") => Value::Null,
        _ => json!(format!("handled: {task}")),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Instant;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::agent::Model;
    use crate::seam::ContentBlock;

    fn first_call(task: &str) -> ModelRequest {
        ModelRequest {
            session_id: "s".into(),
            system: Arc::from(""),
            messages: Arc::from(vec![SessionEvent::User { content: vec![ContentBlock::text(task)] }]),
            tools: Arc::from(Vec::new()),
            options: Default::default(),
            chunks: None,
            meter: Default::default(),
        }
    }

    #[tokio::test]
    async fn a_slow_task_listing_parts_delegates_them_at_once_and_one_without_parts_is_slow() {
        let model = ScriptedModel::demo();
        let mut request = first_call("check a [slow]; check b [slow]");
        let subagent = ToolSpec {
            name: "subagent".into(),
            description: "delegate".into(),
            parameters: json!({"properties": {"description": {}, "prompt": {}}}),
        };
        request.tools = Arc::from(vec![subagent]);
        let began = Instant::now();
        let reply = model.complete(request, CancellationToken::new()).await.unwrap();
        assert!(began.elapsed() < Duration::from_secs(30), "delegating is not slow");
        let prompts: Vec<&Value> = reply.tool_calls.iter().map(|call| &call.arguments["prompt"]).collect();
        assert_eq!(prompts, [&json!("check a [slow]"), &json!("check b [slow]")]);
        // Without a delegating tool the same task is slow: no answer soon.
        let mut alone = first_call("check a [slow]; check b [slow]");
        alone.session_id = "alone".into();
        let answered =
            tokio::time::timeout(Duration::from_millis(100), model.complete(alone, CancellationToken::new()));
        assert!(answered.await.is_err(), "a slow task without parts to delegate answers in a minute");
    }

    #[test]
    fn tool_markers_name_calls_with_json_arguments() {
        let task = r#"check [tool:mcp__a__echo {"text": "x]y"}] and [tool:mcp__a__list] and [tool:bad {no]"#;
        let named = named_tool_calls(task);
        assert_eq!(
            named,
            [("mcp__a__echo".to_owned(), json!({"text": "x]y"})), ("mcp__a__list".to_owned(), json!({}))]
        );
        assert!(named_tool_calls("no markers").is_empty());
    }

    #[tokio::test]
    async fn a_tool_task_answers_with_each_result_and_error() {
        let model = ScriptedModel::demo();
        let task = r#"[tool:mcp__a__echo {"text": "hi"}] [tool:mcp__a__fail]"#;
        let first = model.complete(first_call(task), CancellationToken::new()).await.unwrap();
        assert_eq!(first.tool_calls.len(), 2);
        let mut request = first_call(task);
        let mut messages = request.messages.to_vec();
        let result = |name: &str, content: &str, is_error: bool| SessionEvent::ToolResult {
            call_id: name.to_owned(),
            name: name.to_owned(),
            content: content.to_owned(),
            is_error,
        };
        messages.push(result("mcp__a__echo", "hi", false));
        messages.push(result("mcp__a__fail", "it broke", true));
        request.messages = Arc::from(messages);
        let answer = model.complete(request, CancellationToken::new()).await.unwrap();
        assert_eq!(answer.text, "mcp__a__echo: hi\nmcp__a__fail error: it broke");
    }

    #[test]
    fn a_schema_node_with_examples_gives_its_first_and_others_are_built() {
        let schema = json!({"type": "object", "required": ["failing", "n"], "properties": {
            "failing": {"type": "array", "items": {"type": "string"}, "examples": [["a", "b"], ["c"]]},
            "n": {"type": "integer"}}});
        assert_eq!(example_value(&schema, "t"), json!({"failing": ["a", "b"], "n": 1}));
    }

    #[test]
    fn delay_is_read_from_the_task_and_capped() {
        assert_eq!(requested_delay(&first_call("work [delay:250] now")), Some(Duration::from_millis(250)));
        assert_eq!(requested_delay(&first_call("[delay:99999999]")), Some(MAX_REQUESTED_DELAY));
        assert_eq!(requested_delay(&first_call("[delay:soon]")), None);
        assert_eq!(requested_delay(&first_call("no delay")), None);
    }

    #[tokio::test]
    async fn a_delayed_turn_takes_that_long_and_a_cancel_cuts_it_short() {
        let model = ScriptedModel::demo();
        let began = Instant::now();
        let reply = model.complete(first_call("task [delay:150]"), CancellationToken::new()).await.unwrap();
        assert!(began.elapsed() >= Duration::from_millis(150));
        assert_eq!(reply.text, "handled: task [delay:150]");
        let cancel = CancellationToken::new();
        let cancelled = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            cancelled.cancel();
        });
        let began = Instant::now();
        assert!(model.complete(first_call("task [delay:60000]"), cancel).await.is_err());
        assert!(began.elapsed() < Duration::from_secs(5));
    }
}
