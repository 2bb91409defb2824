//! The pipeline check: refusals named by line, references resolved to
//! the steps they name (plainly or through the table of steps), and the
//! ids a map gives its elements.

use super::*;

fn check(text: &str) -> Result<Pipeline, PipelineError> {
    let lines = super::super::tasks::TaskLines::new(text.as_bytes(), 1 << 20).map(Result::unwrap).collect();
    Pipeline::check(lines)
}

#[test]
fn an_after_naming_no_line_is_refused_with_its_line_and_the_nearest_id() {
    let error =
        check("{\"id\": \"review\", \"prompt\": \"a\"}\n{\"after\": [\"reveiw\"], \"prompt\": \"b\"}\n").unwrap_err();
    assert_eq!(error.to_string(), "line 2: after names \"reveiw\", which is no line's id (did you mean \"review\"?)");
}

#[test]
fn a_circle_is_refused_naming_its_lines_in_waiting_order() {
    let error = check(
        "{\"id\": \"a\", \"after\": [\"c\"], \"prompt\": \"a\"}\n{\"id\": \"free\", \"prompt\": \"f\"}\n\
         {\"id\": \"b\", \"after\": [\"a\"], \"prompt\": \"b\"}\n{\"id\": \"c\", \"prompt\": \"{{b.output}}\", \"after\": [\"free\"]}\n",
    )
    .unwrap_err();
    let PipelineError::Cycle { lines, ids } = &error else { panic!("{error}") };
    assert_eq!(ids.len(), 3, "{error}");
    let mut sorted = lines.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, [1, 3, 4], "{error}");
    // Each id waits for the one before it, the first for the last.
    let at = |id: &str| ids.iter().position(|x| x == id).unwrap();
    assert_eq!((at("a") + ids.len() - 1) % 3, at("c"), "{error}");
    assert!(error.to_string().starts_with("lines "), "{error}");
}

#[test]
fn a_malformed_line_and_an_id_a_map_gives_its_runs_are_refused() {
    let error = check("{\"id\": \"a\", \"prompt\": \"x\"}\n{\"prompt\": 3}\n{\"after\": [\"a\"], \"prompt\": \"y\"}\n")
        .unwrap_err();
    assert!(error.to_string().starts_with("line 2: not a task (invalid type"), "{error}");
    let error =
        check("{\"id\": \"fix\", \"for_each\": \"[1]\", \"prompt\": \"x\"}\n{\"id\": \"fix[0]\", \"prompt\": \"y\"}\n")
            .unwrap_err();
    assert_eq!(error.to_string(), "line 2: its id \"fix[0]\" is one line 1's for_each gives its runs");
}

#[test]
fn a_long_circle_is_refused_naming_its_first_steps_and_how_many_there_are() {
    let steps = 100_000;
    let text: String = (0..steps)
        .map(|n| format!("{{\"id\": \"step{n}\", \"after\": [\"step{}\"], \"prompt\": \"p\"}}\n", (n + 1) % steps))
        .collect();
    let error = check(&text).unwrap_err();
    let PipelineError::Cycle { lines, ids } = &error else { panic!("{error}") };
    assert_eq!((lines.len(), ids.len()), (steps, steps), "the error keeps the whole circle for an embedder");
    let said = error.to_string();
    assert!(said.len() < 1000, "one short line, not {} bytes: {}", said.len(), &said[..1000]);
    assert!(said.contains("100000 steps wait for each other in a circle"), "{said}");
    assert!(said.contains(&ids[0]) && said.contains(&ids[1]), "the first steps are named: {said}");
}

#[test]
fn a_step_waiting_for_itself_is_a_circle_of_one() {
    let error = check("{\"id\": \"a\", \"after\": [\"a\"], \"prompt\": \"a\"}\n").unwrap_err();
    assert!(matches!(&error, PipelineError::Cycle { lines, .. } if lines == &[1]), "{error}");
}

#[test]
fn two_lines_with_one_id_are_refused_naming_both() {
    let error = check("{\"id\": \"a\", \"prompt\": \"x\"}\n{\"id\": \"a\", \"after\": [], \"for_each\": \"[1]\", \"prompt\": \"y\"}\n")
        .unwrap_err();
    assert_eq!(error.to_string(), "lines 1 and 2 both have the id \"a\": a pipeline's ids name one line each");
}

#[test]
fn references_are_checked_against_ids_fields_and_output_schemas() {
    let schema = r#"{"type": "object", "properties": {"failing": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"}}}}}}"#;
    let triage = format!("{{\"id\": \"triage\", \"prompt\": \"t\", \"output_schema\": {schema}}}\n");
    let step = |prompt: &str| format!("{triage}{{\"id\": \"s\", \"after\": [\"triage\"], \"prompt\": \"{prompt}\"}}\n");
    assert!(check(&step("{{triage.structured.failing[0].name}} {{triage.output}}")).is_ok());
    let error = check(&step("{{triage.structured.flaky}}")).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("line 2: {{triage.structured.flaky}}: \"flaky\" is not in triage's output_schema"),
        "{error}"
    );
    let error = check(&step("{{triage.outputs}}")).unwrap_err();
    assert!(error.to_string().contains("triage is a step: its results are output, structured"), "{error}");
    let error = check(&step("{{trage.output}}")).unwrap_err();
    assert_eq!(
        error.to_string(),
        "line 2: {{trage.output}} names \"trage\", which is no line's id (did you mean \"triage\"?)"
    );
    let error = check(&step("{{item}}")).unwrap_err();
    assert!(error.to_string().contains("set only in a for_each line"), "{error}");
    let error = check(&step("{{ triage.output ")).unwrap_err();
    assert!(error.to_string().starts_with("line 2: its prompt is not a template"), "{error}");
}

#[test]
fn a_template_reference_is_a_dependency_and_a_flat_line_is_not_a_template() {
    let pipeline = check(
        "{\"id\": \"a\", \"prompt\": \"{{ literal }}\"}\n{\"id\": \"m\", \"for_each\": \"{{a.structured}}\", \"prompt\": \"{{item}}\"}\n{\"id\": \"r\", \"after\": [\"a\"], \"prompt\": \"{{m.outputs}}\"}\n",
    );
    let error = pipeline.unwrap_err();
    assert!(error.to_string().contains("a has no output_schema"), "{error}");
    let pipeline = check(
        "{\"id\": \"a\", \"prompt\": \"{{ literal }}\"}\n{\"id\": \"m\", \"for_each\": \"{{a.output}}\", \"prompt\": \"{{item}}\"}\n{\"id\": \"r\", \"after\": [\"a\"], \"prompt\": \"{{m.outputs}}\"}\n",
    )
    .unwrap();
    assert_eq!(pipeline.steps[1].waits_for, [0]);
    assert_eq!(pipeline.steps[2].waits_for, [0, 1]);
}

/// A tasks file of `lines`, each a JSON object.
fn file_of(lines: &[Value]) -> String {
    lines.iter().map(|line| format!("{line}\n")).collect()
}

#[test]
fn every_id_is_named_in_the_steps_table_and_what_it_names_is_waited_for() {
    let ids = ["fix-login", "item", "index", "steps", "a \"quoted\" \\ id}}", "L3-0123456789ab", "plain"];
    let mut lines: Vec<Value> = ids.iter().map(|id| json!({"id": id, "prompt": "p"})).collect();
    let named: Vec<String> =
        ids.iter().map(|id| format!("{{{{steps[{}].output}}}}", serde_json::to_string(id).unwrap())).collect();
    let prompt = format!("{} {{{{steps.plain.completed}}}} {{{{ steps['item'] }}}}", named.join(" "));
    lines.push(json!({"id": "report", "after": [], "prompt": prompt}));
    let pipeline = check(&file_of(&lines)).unwrap();
    assert_eq!(pipeline.steps[ids.len()].waits_for, (0..ids.len()).collect::<Vec<_>>());

    let schema = json!({"type": "object", "properties": {"failing": {"type": "array"}}});
    let triage = json!({"id": "tri-age", "prompt": "t", "output_schema": schema});
    let map = json!({"id": "fix", "for_each": "{{ steps[\"tri-age\"].structured.failing }}", "prompt": "{{item}}"});
    let pipeline = check(&file_of(&[triage.clone(), map])).unwrap();
    assert_eq!(pipeline.steps[1].waits_for, [0]);
    let wrong = json!({"id": "fix", "for_each": "{{ steps[\"tri-age\"].structured.flaky }}", "prompt": "{{item}}"});
    let error = check(&file_of(&[triage, wrong])).unwrap_err();
    assert!(error.to_string().contains("\"flaky\" is not in tri-age's output_schema"), "{error}");
}

#[test]
fn an_id_that_is_not_a_plain_name_written_plain_is_refused_saying_how_to_name_it() {
    let fix = json!({"id": "fix-login", "prompt": "a"});
    let step = |prompt: &str| file_of(&[fix.clone(), json!({"id": "report", "after": [], "prompt": prompt})]);
    let error = check(&step("{{fix-login.output}}")).unwrap_err().to_string();
    assert!(error.contains("names \"fix\", which is no line's id"), "{error}");
    assert!(error.contains("{{steps[\"fix-login\"].output}}"), "the error says how: {error}");
    let error = check(&step("{{steps[\"fix-logn\"].output}}")).unwrap_err().to_string();
    assert!(error.contains("did you mean {{steps[\"fix-login\"]}}"), "{error}");
    let error = check(&step("{{steps[\"fix-login\"].outputs}}")).unwrap_err().to_string();
    assert!(error.starts_with("line 2: {{steps[\"fix-login\"].outputs}}: fix-login is a step"), "{error}");
    for bare in
        ["{{steps}}", "{% for s in steps %}{{s}}{% endfor %}", "{{steps[name]}}", "{{ (steps)[\"fix-login\"] }}"]
    {
        let error = check(&step(bare)).unwrap_err().to_string();
        assert!(error.contains("steps[\"ID\"]"), "{bare}: {error}");
    }
}

#[test]
fn element_ids_come_from_the_index_or_a_plain_bounded_key() {
    let lines = |text: &str| check(text).unwrap();
    let ids = |step: &Step, items: &[Value]| {
        let items: Vec<TemplateValue> = items.iter().map(value_of).collect();
        element_ids(&step.id, step.task.key.as_deref(), &items)
    };
    let by_index = lines("{\"id\": \"fix\", \"for_each\": \"[1, 2]\", \"prompt\": \"p\"}\n");
    assert_eq!(ids(&by_index.steps[0], &[json!(1), json!(2)]).unwrap(), ["fix[0]", "fix[1]"]);
    let by_key = lines("{\"id\": \"fix\", \"for_each\": \"[]\", \"key\": \"name\", \"prompt\": \"p\"}\n");
    let items = [json!({"name": "parser"}), json!({"name": "a b\u{1b}[2J"})];
    assert_eq!(ids(&by_key.steps[0], &items).unwrap(), ["fix[parser]", "fix[a_b__2J]"]);
    let error = ids(&by_key.steps[0], &[json!({"name": "x"}), json!({"name": "x"})]).unwrap_err();
    assert!(error.contains("keys must differ"), "{error}");
}
