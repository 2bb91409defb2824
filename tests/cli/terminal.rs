//! The commands on a terminal, as a person sees them: `run`'s live tree,
//! `fanout`'s bar, and what a Ctrl-C leaves on the screen.

use std::collections::HashMap;

use serde_json::Value;

use super::{run, subagents, text, write_file};
use crate::approvals::{asking, chosen};
use crate::common::pty::{on_a_terminal, on_a_terminal_typing};

#[test]
fn run_on_a_terminal_draws_the_parent_over_its_children_with_their_times_and_ctrl_c_leaves_no_stale_row() {
    let home = tempfile::tempdir().unwrap();
    let mut command = subagents();
    command.args(["run", "check a [slow]; check b [slow]; check c", "--home"]).arg(home.path());
    let screen = on_a_terminal(&command, Some("[check b [slow]] running"));
    assert_eq!(screen.code, Some(130), "{}", screen.raw);
    // While it ran: the parent on top, the children below it as a tree,
    // each with its time so far.
    assert!(screen.raw.contains("parent (scripted) running "), "{:?}", screen.raw);
    assert!(screen.raw.contains("├─ spawn [check a [slow]] running "), "{:?}", screen.raw);
    assert!(screen.raw.contains("└─ spawn [check c] completed "), "{:?}", screen.raw);
    // At the end: the Ctrl-C message above the final tree, and no row of
    // the live tree left behind.
    let text = screen.text();
    let said = text.find("interrupted: cancelling every run").expect("the Ctrl-C message stays");
    let tree = text.find("\"check a [slow]\": aborted, ").expect("the final tree names how each child ended");
    assert!(said < tree, "{text}");
    assert!(!text.contains(" running "), "a live row was left on the screen:\n{text}");
    assert!(!text.contains("^C"), "the terminal echoed ^C into the tree:\n{text}");
}

#[test]
fn fanout_on_a_terminal_names_failures_above_a_bar_with_an_eta_and_ctrl_c_then_resume_runs_the_rest_once() {
    let dir = tempfile::tempdir().unwrap();
    let lines: Vec<String> = (1..=30)
        .map(|n| match n % 7 {
            0 => format!("{{\"id\": \"t{n}\", \"prompt\": \"task {n} [fail]\"}}"),
            _ => format!("{{\"id\": \"t{n}\", \"prompt\": \"task {n} [delay:400]\"}}"),
        })
        .collect();
    let tasks = write_file(dir.path(), "tasks.jsonl", lines.join("\n") + "\n");
    let out = dir.path().join("out.jsonl");
    let fanout = || {
        let mut command = subagents();
        command.arg("fanout").arg(&tasks).args(["--concurrency", "3", "--out"]).arg(&out);
        command.arg("--home").arg(dir.path().join("home"));
        command
    };
    let screen = on_a_terminal(&fanout(), Some("3 failed"));
    assert_eq!(screen.code, Some(130), "{}", screen.raw);
    assert!(screen.raw.contains(" failed · ") && screen.raw.contains(" elapsed · ETA "), "{:?}", screen.raw);
    let shown = screen.text();
    for line in [7, 14, 21] {
        assert!(shown.contains(&format!("line {line}: ")), "failure {line} is named on the screen:\n{shown}");
    }
    assert!(shown.contains("the scripted model failed"), "with its reason:\n{shown}");
    assert!(!shown.contains("tasks done"), "the bar was cleared, not left behind:\n{shown}");
    // The command may wrap on the screen; unwrapped, it is one line.
    let unwrapped = shown.replace('\n', "");
    let resume = unwrapped.split_once("to finish the batch: ").map(|(_, command)| command.trim_end());
    assert!(resume.is_some_and(|command| command.ends_with(" --resume")), "the resume command:\n{shown}");

    let output = run(fanout().arg("--resume"));
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let mut settled: HashMap<String, usize> = HashMap::new();
    for line in std::fs::read_to_string(&out).unwrap().lines() {
        let record: Value = serde_json::from_str(line).unwrap();
        if record["interrupted"] != true {
            *settled.entry(record["id"].as_str().unwrap().to_owned()).or_default() += 1;
        }
    }
    assert_eq!(settled.len(), 30, "{settled:?}");
    assert!(settled.values().all(|&times| times == 1), "each task settled exactly once: {settled:?}");
}

#[test]
fn run_on_a_terminal_asks_the_person_about_a_childs_request_and_off_one_its_policy_rejects_it() {
    let dir = tempfile::tempdir().unwrap();
    let asker = asking(dir.path(), "asker", &[("execute", "cargo test"), ("execute", "cargo test")]);
    let config = write_file(
        dir.path(),
        "subagents.toml",
        format!(
            "[providers.asker]\nkind = \"acp\"\ncommand = \"/bin/sh\"\nargs = [{script:?}]\npermission = \"ask\"\n",
            script = asker.args[0]
        ),
    );
    let prompt = r#"[tool:subagent {"description": "run tests", "prompt": "run the tests"}]"#;
    let mut command = subagents();
    command.args(["run", prompt, "--provider", "asker", "--config"]).arg(&config);
    command.arg("--home").arg(dir.path().join("home"));
    // The person answers "allow always": the same call again is not asked.
    let screen = on_a_terminal_typing(&command, None, &[("› ", "a\n")]);
    assert_eq!(screen.code, Some(0), "{}", screen.raw);
    let shown = screen.text();
    assert!(
        shown.contains("asker (run tests) at depth 1 [asker (run tests)] asks to run: cargo test (execute)"),
        "{shown}"
    );
    assert!(
        shown.contains("[y] allow once  [a] allow always (only this same call again"),
        "says what always covers: {shown}"
    );
    assert!(shown.contains("for the rest of this run)  [n] reject  › a"), "{shown}");
    assert_eq!(shown.matches("asks to run").count(), 1, "asked once:\n{shown}");
    assert_eq!(chosen(dir.path(), "asker"), ["always", "yes"]);
    // Off a terminal nobody is asked: `ask` is a reject.
    let output = run(&mut command);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert!(!text(&output.stderr).contains("asks to run"), "{}", text(&output.stderr));
    assert_eq!(chosen(dir.path(), "asker"), ["always", "yes", "no", "no"]);
}
