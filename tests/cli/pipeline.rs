//! Pipelines through `fanout`: steps that wait for others (`after`), maps
//! (`for_each`) and reduces over their results, on the embedded scripted
//! model; a graph refused before anything runs; dependency failures
//! skipped or continued; bounded inserted values; and SIGKILL-and-resume
//! drills in which each step settles once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use super::{json_lines, run, subagents, text, write_file};

/// `fanout TASKS --out OUT` (with `--resume` when `OUT` exists), its home
/// in `dir`.
fn fanout(dir: &Path, tasks: &Path, out: &Path, extra: &[&str]) -> std::process::Command {
    let mut command = subagents();
    command.arg("fanout").arg(tasks).arg("--out").arg(out).args(extra).arg("--home").arg(dir.join("home"));
    command
}

/// The result lines of `out` by id (the last of an id wins), and how many
/// lines each id has.
fn results(out: &Path) -> (HashMap<String, Value>, HashMap<String, usize>) {
    let (mut by_id, mut lines) = (HashMap::new(), HashMap::new());
    for record in json_lines(&std::fs::read(out).unwrap_or_default()) {
        let id = record["id"].as_str().unwrap().to_owned();
        *lines.entry(id.clone()).or_insert(0) += 1;
        by_id.insert(id, record);
    }
    (by_id, lines)
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/pipeline.jsonl")
}

#[test]
fn a_map_reduce_over_the_scripted_model_maps_the_triaged_list_and_the_reduce_cites_each_output() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.jsonl");
    let output = run(&mut fanout(dir.path(), &example(), &out, &[]));
    assert!(output.status.success(), "{}", text(&output.stderr));
    let (by_id, lines) = results(&out);
    assert!(lines.values().all(|&n| n == 1), "{lines:?}");
    let failing = by_id["triage"]["structured"]["failing"].as_array().unwrap().clone();
    assert_eq!(failing.len(), 3, "the triage's list: {failing:?}");
    let mut cited = Vec::new();
    for (index, test) in failing.iter().enumerate() {
        let id = format!("fix[{}]", test["name"].as_str().unwrap());
        let fix = &by_id[&id];
        assert_eq!(fix["stop_reason"], "completed", "{fix}");
        assert_eq!((fix["map"].as_str(), fix["index"].as_u64()), (Some("fix"), Some(index as u64)));
        let answer = fix["output"].as_str().unwrap();
        assert!(answer.contains(test["name"].as_str().unwrap()) && answer.contains(test["module"].as_str().unwrap()));
        cited.push(answer.to_owned());
    }
    let report = by_id["report"]["output"].as_str().unwrap();
    let mut at = 0;
    for answer in &cited {
        // Each map output, in element order.
        let found = report[at..].find(answer.as_str()).unwrap_or_else(|| panic!("{answer:?} not in {report:?}"));
        at += found + answer.len();
    }
    assert_eq!(by_id.len(), 5, "triage, three fixes, report: {:?}", by_id.keys());
    let stderr = text(&output.stderr);
    assert!(stderr.contains("pipeline: 3 steps (1 for_each), 3 settled, 0 waiting"), "{stderr}");
}

#[test]
fn a_failed_dependency_skips_its_dependents_with_the_reason_and_on_failure_continue_runs_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = write_file(
        dir.path(),
        "tasks.jsonl",
        concat!(
            "{\"id\": \"review\", \"prompt\": \"review the parser [fail]\"}\n",
            "{\"id\": \"summary\", \"after\": [\"review\"], \"prompt\": \"sum up {{review.output}}\"}\n",
            "{\"id\": \"notes\", \"after\": [\"summary\"], \"prompt\": \"notes\"}\n",
            "{\"id\": \"triage\", \"after\": [\"review\"], \"on_failure\": \"continue\", \"prompt\": \"completed={{review.completed}} error={{review.error}}\"}\n",
        ),
    );
    let out = dir.path().join("out.jsonl");
    let output = run(&mut fanout(dir.path(), &tasks, &out, &[]));
    // A failed run is data, as in a flat batch: only --strict fails the batch.
    assert!(output.status.success(), "{}", text(&output.stderr));
    let (by_id, _) = results(&out);
    assert_eq!(by_id["review"]["stop_reason"], "error");
    assert_eq!(by_id["summary"]["skipped"], "after review: error: the scripted model failed");
    assert!(by_id["summary"].get("run_id").is_none(), "a skipped step never ran");
    assert_eq!(by_id["notes"]["skipped"], "after summary: skipped (after review: error: the scripted model failed)");
    assert_eq!(by_id["triage"]["stop_reason"], "completed");
    assert_eq!(by_id["triage"]["output"], "handled: completed=false error=the scripted model failed");
    let stderr = text(&output.stderr);
    assert!(stderr.contains("line 2: task: skipped: after review: error"), "{stderr}");
    let strict = run(&mut fanout(dir.path(), &tasks, &dir.path().join("strict.jsonl"), &["--strict"]));
    assert_eq!(strict.status.code(), Some(1), "{}", text(&strict.stderr));
}

#[test]
fn a_circle_an_unknown_id_a_duplicate_and_a_field_outside_the_schema_are_refused_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let out = write_file(dir.path(), "out.jsonl", "{\"id\": \"kept\"}\n");
    let refused = |name: &str, lines: &str, says: &str| {
        let tasks = write_file(dir.path(), name, lines);
        let output = run(&mut fanout(dir.path(), &tasks, &out, &[]));
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{name}: {stderr}");
        assert!(stderr.contains(says), "{name}: {stderr}");
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "{\"id\": \"kept\"}\n", "{name}: nothing truncated");
    };
    refused(
        "circle.jsonl",
        "{\"id\": \"free\", \"prompt\": \"f\"}\n{\"id\": \"a\", \"after\": [\"b\"], \"prompt\": \"a\"}\n{\"id\": \"b\", \"prompt\": \"{{a.output}}\", \"after\": [\"free\"]}\n",
        "circle.jsonl: lines 2, 3 wait for each other in a circle",
    );
    refused(
        "unknown.jsonl",
        "{\"id\": \"review\", \"prompt\": \"r\"}\n{\"after\": [\"reviews\"], \"prompt\": \"s\"}\n",
        "unknown.jsonl: line 2: after names \"reviews\", which is no line's id (did you mean \"review\"?)",
    );
    refused(
        "reference.jsonl",
        "{\"id\": \"review\", \"prompt\": \"r\"}\n\n{\"id\": \"s\", \"after\": [\"review\"], \"prompt\": \"{{reveiw.output}}\"}\n",
        "reference.jsonl: line 3: {{reveiw.output}} names \"reveiw\", which is no line's id",
    );
    refused(
        "duplicate.jsonl",
        "{\"id\": \"a\", \"prompt\": \"x\"}\n{\"id\": \"b\", \"after\": [\"a\"], \"prompt\": \"y\"}\n{\"id\": \"a\", \"prompt\": \"z\"}\n",
        "duplicate.jsonl: lines 1 and 3 both have the id \"a\"",
    );
    refused(
        "schema.jsonl",
        "{\"id\": \"t\", \"prompt\": \"t\", \"output_schema\": {\"type\": \"object\", \"properties\": {\"failing\": {\"type\": \"array\"}}}}\n{\"id\": \"m\", \"for_each\": \"{{t.structured.flaky}}\", \"prompt\": \"{{item}}\"}\n",
        "schema.jsonl: line 2: {{t.structured.flaky}}: \"flaky\" is not in t's output_schema (it declares failing)",
    );
    // Constants minijinja would work out as it compiles, unbounded (it
    // took minutes): refused at once, whatever the steps answer.
    let started = std::time::Instant::now();
    refused(
        "constants.jsonl",
        "{\"id\": \"s\", \"prompt\": \"seed\"}\n{\"id\": \"bomb\", \"after\": [\"s\"], \"prompt\": \"{{ [1]*100000000 == [1]*100000000 }}\"}\n",
        "constants.jsonl: line 2: its prompt is refused: it would take more than the 4000000 steps a template may take",
    );
    assert!(started.elapsed() < Duration::from_secs(10), "refused in {:?}", started.elapsed());
}

#[test]
fn an_oversized_inserted_value_fails_its_step_with_the_way_out_and_truncate_fits_it() {
    let dir = tempfile::tempdir().unwrap();
    let big = "x".repeat(subagents::batch::MAX_INSERTED_BYTES);
    let tasks = write_file(
        dir.path(),
        "tasks.jsonl",
        format!(
            "{{\"id\": \"big\", \"prompt\": \"{big}\"}}\n{{\"id\": \"whole\", \"after\": [\"big\"], \"prompt\": \"all of {{{{big.output}}}}\"}}\n{{\"id\": \"cut\", \"after\": [\"big\"], \"prompt\": \"some of {{{{big.output|truncate(40)}}}}\"}}\n"
        ),
    );
    let out = dir.path().join("out.jsonl");
    let output = run(&mut fanout(dir.path(), &tasks, &out, &[]));
    assert!(output.status.success(), "{}", text(&output.stderr));
    let (by_id, _) = results(&out);
    let error = by_id["whole"]["error"].as_str().unwrap();
    assert!(
        error.contains(
            "an inserted value is 65545 bytes, more than the 65536 one value may be: cut it with |truncate(N)"
        ),
        "{error}"
    );
    assert!(by_id["whole"].get("run_id").is_none(), "refused before any run");
    assert_eq!(by_id["cut"]["stop_reason"], "completed");
    let cut = by_id["cut"]["output"].as_str().unwrap();
    assert_eq!(cut, format!("handled: some of handled: {}…", "x".repeat(40 - "handled: ".len() - "…".len())));
}

#[test]
fn a_map_past_its_max_items_fails_and_what_waits_for_it_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = write_file(
        dir.path(),
        "tasks.jsonl",
        concat!(
            "{\"id\": \"fix\", \"for_each\": \"range(5)\", \"max_items\": 3, \"prompt\": \"fix {{item}}\"}\n",
            "{\"id\": \"report\", \"prompt\": \"{{fix.outputs}}\", \"after\": [\"fix\"]}\n",
            "{\"id\": \"each\", \"for_each\": \"[\\\"a\\\", \\\"b\\\"]\", \"prompt\": \"do {{item}} as {{index}}\"}\n",
        ),
    );
    let out = dir.path().join("out.jsonl");
    let output = run(&mut fanout(dir.path(), &tasks, &out, &[]));
    assert!(output.status.success(), "{}", text(&output.stderr));
    let (by_id, _) = results(&out);
    assert_eq!(by_id["fix"]["error"], "for_each gave 5 elements, more than its max_items of 3");
    assert_eq!(by_id["report"]["skipped"], "after fix: error: for_each gave 5 elements, more than its max_items of 3");
    assert_eq!(by_id["each[0]"]["output"], "handled: do a as 0");
    assert_eq!(by_id["each[1]"]["output"], "handled: do b as 1");
}

#[test]
fn a_step_line_read_from_a_pipe_is_skipped_saying_a_pipeline_needs_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = subagents()
        .args(["fanout", "-", "--home"])
        .arg(dir.path().join("home"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = b"{\"id\": \"a\", \"prompt\": \"x\"}\n{\"after\": [\"a\"], \"prompt\": \"y\"}\n";
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), lines).unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(1), "a line that did not run: {}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("2: skipped: after and for_each need a tasks file that is a regular file"), "{stderr}");
}

/// Whole lines in the results file so far.
fn lines_in(out: &Path) -> usize {
    std::fs::read(out).map_or(0, |bytes| bytes.iter().filter(|&&b| b == b'\n').count())
}

#[test]
fn a_pipeline_killed_again_and_again_and_resumed_settles_each_step_once_and_the_reduce_sees_every_map_output() {
    const WIDTH: usize = 40;
    let dir = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..WIDTH).map(|i| format!("\"t{i}\"")).collect();
    let tasks = write_file(
        dir.path(),
        "tasks.jsonl",
        format!(
            concat!(
                "{{\"id\": \"triage\", \"prompt\": \"list [delay:50]\", \"output_schema\": {{\"type\": \"object\", \"properties\": ",
                "{{\"failing\": {{\"type\": \"array\", \"items\": {{\"type\": \"string\"}}, \"examples\": [[{names}]]}}}}, \"required\": [\"failing\"]}}}}\n",
                "{{\"id\": \"fix\", \"for_each\": \"{{{{triage.structured.failing}}}}\", \"key\": \"\", \"prompt\": \"fix {{{{item}}}} [delay:30]\"}}\n",
                "{{\"id\": \"report\", \"after\": [\"fix\"], \"prompt\": \"report{{% for o in fix.outputs %}} | {{{{o}}}}{{% endfor %}} [delay:30]\"}}\n",
            ),
            names = names.join(", ")
        )
        .replace(", \"key\": \"\"", ""),
    );
    let out = dir.path().join("out.jsonl");
    let mut seed = u64::from(std::process::id());
    let mut killed_mid_pipeline = 0;
    for round in 0..6 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let target = lines_in(&out) + 1 + (seed >> 33) as usize % 8;
        let mut command = fanout(dir.path(), &tasks, &out, &["--concurrency", "4"]);
        if out.exists() {
            command.arg("--resume");
        }
        let mut child =
            command.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while lines_in(&out) < target && std::time::Instant::now() < deadline {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let _ = child.kill(); // SIGKILL
        let _ = child.wait();
        let (by_id, lines) = results(&out);
        assert!(lines.values().all(|&n| n == 1), "round {round}: a step written twice: {lines:?}");
        killed_mid_pipeline += usize::from(!by_id.is_empty() && !by_id.contains_key("report"));
    }
    assert!(killed_mid_pipeline > 0, "no kill landed mid-pipeline: the drill proved nothing");
    let mut resume = fanout(dir.path(), &tasks, &out, &["--concurrency", "4", "--resume"]);
    let output = run(&mut resume);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let (by_id, lines) = results(&out);
    assert_eq!(by_id.len(), WIDTH + 2, "triage, every fix, the report: {:?}", lines.keys());
    assert!(lines.values().all(|&n| n == 1), "{lines:?}");
    // The reduce saw every map output as the file holds it, in element order.
    let outputs: Vec<String> =
        (0..WIDTH).map(|i| by_id[&format!("fix[{i}]")]["output"].as_str().unwrap().to_owned()).collect();
    for (i, output) in outputs.iter().enumerate() {
        assert_eq!(output, &format!("handled: fix t{i} [delay:30]"));
    }
    let expected =
        format!("handled: report{} [delay:30]", outputs.iter().map(|o| format!(" | {o}")).collect::<String>());
    assert_eq!(by_id["report"]["output"], expected.as_str());
    // A finished pipeline resumed runs nothing.
    let again = run(&mut resume);
    assert!(again.status.success(), "{}", text(&again.stderr));
    let stderr = text(&again.stderr);
    let done = stderr.lines().find(|line| line.contains("(done before, skipped)")).unwrap_or_default();
    assert!(done.trim_end().ends_with(&format!(" {}", WIDTH + 2)), "{stderr}");
    assert_eq!(results(&out).1.values().sum::<usize>(), WIDTH + 2);
}

#[test]
fn a_changed_line_rerun_with_rerun_changed_invalidates_the_steps_after_it_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let lines = |review: &str| {
        format!(
            "{{\"id\": \"review\", \"prompt\": \"{review}\"}}\n{{\"id\": \"summary\", \"after\": [], \"prompt\": \"sum up {{{{review.output}}}}\"}}\n{{\"id\": \"other\", \"prompt\": \"unrelated\"}}\n"
        )
    };
    let tasks = write_file(dir.path(), "tasks.jsonl", lines("review the parser"));
    let out = dir.path().join("out.jsonl");
    assert!(run(&mut fanout(dir.path(), &tasks, &out, &[])).status.success());
    write_file(dir.path(), "tasks.jsonl", lines("review the lexer"));
    let refused = run(&mut fanout(dir.path(), &tasks, &out, &["--resume"]));
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains(":1: task \"review\" changed"), "{}", text(&refused.stderr));
    let output = run(&mut fanout(dir.path(), &tasks, &out, &["--resume", "--rerun-changed"]));
    assert!(output.status.success(), "{}", text(&output.stderr));
    let (by_id, lines) = results(&out);
    assert_eq!(by_id["summary"]["output"], "handled: sum up handled: review the lexer");
    assert_eq!((lines["review"], lines["summary"], lines["other"]), (2, 2, 1), "{lines:?}");
}

#[test]
fn an_interrupted_pipeline_names_the_steps_still_waiting_and_a_resume_finishes_them() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = write_file(
        dir.path(),
        "tasks.jsonl",
        "{\"id\": \"slow\", \"prompt\": \"think [slow]\"}\n{\"id\": \"after_slow\", \"after\": [\"slow\"], \"prompt\": \"then\"}\n",
    );
    let out = dir.path().join("out.jsonl");
    let child = fanout(dir.path(), &tasks, &out, &[])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: signalling our own child, which has not been reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let output = child.wait_with_output().unwrap();
    let stderr = text(&output.stderr);
    assert!(stderr.contains("pipeline: 2 steps (0 for_each), 0 settled, 2 waiting"), "{stderr}");
    assert!(stderr.contains("line 2: \"after_slow\" waits for \"slow\""), "{stderr}");
    // The slow step answers at once when it is no longer slow.
    write_file(
        dir.path(),
        "tasks.jsonl",
        "{\"id\": \"slow\", \"prompt\": \"think\"}\n{\"id\": \"after_slow\", \"after\": [\"slow\"], \"prompt\": \"then\"}\n",
    );
    let output = run(&mut fanout(dir.path(), &tasks, &out, &["--resume"]));
    assert!(output.status.success(), "{}", text(&output.stderr));
    let (by_id, _) = results(&out);
    assert_eq!(by_id["after_slow"]["output"], "handled: then");
}

#[test]
fn an_interrupt_during_a_long_render_ends_the_process_at_once_without_waiting_for_it() {
    let dir = tempfile::tempdir().unwrap();
    // A list of 30 million made as it renders (its size is not known before):
    // written out as JSON it takes seconds, bounded only after.
    let tasks = write_file(
        dir.path(),
        "tasks.jsonl",
        "{\"id\": \"s\", \"prompt\": \"seed\"}\n{\"id\": \"slow\", \"after\": [\"s\"], \"prompt\": \"{{ ((s.output[:1]|list) * 30000000)|tojson|length }}\"}\n",
    );
    let out = dir.path().join("out.jsonl");
    let mut child = fanout(dir.path(), &tasks, &out, &[])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while !results(&out).0.contains_key("s") {
        assert!(started.elapsed() < Duration::from_secs(30), "the seed settles");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: signalling our own child, which has not been reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let signalled = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() && signalled.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let waited = signalled.elapsed();
    let _ = child.kill();
    let output = child.wait_with_output().unwrap();
    assert!(waited < Duration::from_secs(3), "the process ended {waited:?} after the interrupt");
    let stderr = text(&output.stderr);
    assert!(stderr.contains("1 settled, 1 waiting"), "{stderr}");
}

#[test]
fn rerun_failed_runs_a_failed_step_again_and_in_turn_the_step_skipped_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = write_file(
        dir.path(),
        "tasks.jsonl",
        "{\"id\": \"a\", \"prompt\": \"x [fail]\"}\n{\"id\": \"b\", \"after\": [\"a\"], \"prompt\": \"y\"}\n{\"id\": \"c\", \"prompt\": \"z\"}\n",
    );
    let out = dir.path().join("out.jsonl");
    assert!(run(&mut fanout(dir.path(), &tasks, &out, &[])).status.success());
    let plain = run(&mut fanout(dir.path(), &tasks, &out, &["--resume"]));
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    assert_eq!(results(&out).1.values().sum::<usize>(), 3, "a plain resume keeps the failure and the skip");
    let again = run(&mut fanout(dir.path(), &tasks, &out, &["--resume", "--rerun-failed"]));
    assert!(again.status.success(), "{}", text(&again.stderr));
    let (by_id, lines) = results(&out);
    assert_eq!((lines["a"], lines["b"], lines["c"]), (2, 2, 1), "{lines:?}");
    assert_eq!(by_id["b"]["skipped"], "after a: error: the scripted model failed");
}

#[test]
fn a_step_added_to_a_finished_flat_batch_runs_alone_on_resume_over_the_flat_results() {
    let dir = tempfile::tempdir().unwrap();
    let flat = "{\"id\": \"one\", \"prompt\": \"first\"}\n{\"id\": \"two\", \"prompt\": \"second\"}\n";
    let tasks = write_file(dir.path(), "tasks.jsonl", flat);
    let out = dir.path().join("out.jsonl");
    assert!(run(&mut fanout(dir.path(), &tasks, &out, &[])).status.success());
    write_file(
        dir.path(),
        "tasks.jsonl",
        format!("{flat}{{\"id\": \"both\", \"prompt\": \"{{{{one.output}}}} + {{{{two.output}}}}\", \"after\": []}}\n"),
    );
    let output = run(&mut fanout(dir.path(), &tasks, &out, &["--resume"]));
    assert!(output.status.success(), "{}", text(&output.stderr));
    let (by_id, lines) = results(&out);
    assert_eq!((lines["one"], lines["two"], lines["both"]), (1, 1, 1), "{lines:?}");
    assert_eq!(by_id["both"]["output"], "handled: handled: first + handled: second");
}
