//! Errors that say what to do: a key in the wrong table names where it
//! belongs and only its own table's keys; a bad value never shows the
//! parser's internals; a provider the environment cannot serve blocks
//! only the commands that use it; and `providers list` prints each kind's
//! capabilities as its provider advertises them once built.

use std::path::Path;

use serde_json::Value;
use subagents::config::Config;

use super::{run, subagents, text};

fn parse_error(file: &str) -> String {
    Config::parse(file, "wrong.toml").map(drop).expect_err(file).to_string()
}

#[test]
fn a_key_in_the_wrong_table_says_where_it_belongs_and_lists_only_its_kinds_keys() {
    let error = parse_error("[providers.cheap]\nkind = \"spawn\"\nrpm = 60\n");
    assert!(
        error.starts_with("wrong.toml:3:7: `rpm` is a key of [models.NAME], not of a spawn provider: a spawn provider takes `kind`, `model`,"),
        "{error}"
    );
    // Only the spawn kind's keys: none of another kind's, nothing of serde's.
    for foreign in ["reply", "command", "nats", "url", "wraps", "expected one of", "unknown field"] {
        assert!(!error.contains(foreign), "{foreign}: {error}");
    }
    let error = parse_error("[providers.cheap]\nkind = \"spawn\"\nmodle = \"scripted\"\n");
    assert!(
        error.starts_with("wrong.toml:3:1: `modle` is not a key of a spawn provider (did you mean `model`?)"),
        "{error}"
    );
    let error = parse_error("[models.fast]\napi = \"openai-chat\"\nmodel = \"m\"\nkind = \"spawn\"\n");
    assert!(error.starts_with("wrong.toml:4:8: `kind` is a key of a spawn provider,"), "{error}");
    assert!(error.contains(", not of a model route: a model route takes `api`,"), "{error}");
    let error = parse_error("[tool]\nproviders = []\nrpm = 1\n");
    assert!(error.starts_with("wrong.toml:3:7: `rpm` is a key of [models.NAME], not of [tool]"), "{error}");
    let error = parse_error("[providers.a]\nkind = \"chaos\"\nwraps = \"b\"\nfaults = [{ stage = \"run\", fault = \"error\", chance = 0.5 }]\n[providers.b]\nkind = \"mock\"\n");
    assert!(
        error.contains("`chance` is not a key of a fault: a fault takes `stage`, `fault` and `probability`"),
        "{error}"
    );
}

#[test]
fn a_bad_pool_or_budget_value_is_named_in_words_not_the_parsers() {
    let acp =
        |pool: &str| format!("[providers.a]\nkind = \"acp\"\ncommand = \"sh\"\nreuse = \"pooled\"\npool = {pool}\n");
    let cases = [
        (acp("\"gpu\""), "wrong.toml:5:8: an acp provider's `pool` is a table, such as { size = 2 }"),
        (acp("{ sise = 2 }"), "wrong.toml:5:10: `sise` is not a key of an acp `pool` (did you mean `size`?)"),
        (
            "[providers.r]\nkind = \"remote\"\nnats = \"nats://127.0.0.1:1\"\npool = { size = 2 }\n".to_owned(),
            "wrong.toml:4:8: a remote provider's `pool` is a worker pool's name, such as \"default\"",
        ),
        (
            "[providers.a]\nkind = \"spawn\"\nbudget = 5\n".to_owned(),
            "wrong.toml:3:10: invalid type: integer `5`, expected a table such as { runs = 50, deadline = \"10m\" }",
        ),
    ];
    for (file, expected) in cases {
        let error = parse_error(&file);
        assert!(error.starts_with(expected), "{file}\nwanted: {expected}\ngot:    {error}");
        for internal in ["untagged", "variant", "PoolValue", "PoolTable", "BudgetTable", "struct"] {
            assert!(!error.contains(internal), "{internal}: {error}");
        }
    }
}

/// `cheap` works; `codex` names a program that is not on PATH and a
/// variable that is not set; the tool offers both.
fn write_half_broken(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("half.toml");
    let text = "[providers.cheap]\nkind = \"spawn\"\n\n[providers.codex]\nkind = \"acp\"\ncommand = \"no-such-codex-acp\"\n\
                env = { OPENAI_API_KEY = \"${SUBAGENTS_TEST_NEVER_SET}\" }\n\n[tool]\nproviders = [\"cheap\", \"codex\"]\n";
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn a_provider_the_environment_cannot_serve_blocks_only_the_commands_that_use_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_half_broken(dir.path());
    let home = dir.path().join("home");
    // `list` shows it broken, with why and where, and succeeds.
    let output = run(subagents(dir.path()).args(["providers", "list", "--json", "--config"]).arg(&config));
    assert!(output.status.success(), "{}", text(&output.stderr));
    let listed: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(listed[0]["name"], "cheap");
    assert!(listed[0].get("error").is_none(), "{listed}");
    let error = listed[1]["error"].as_str().unwrap();
    assert!(error.ends_with("half.toml:6:11: command \"no-such-codex-acp\" is not a file and not on PATH"), "{error}");
    assert_eq!(listed[1]["ok"], false);
    let output = run(subagents(dir.path()).args(["providers", "list", "--config"]).arg(&config));
    assert!(output.status.success());
    assert!(text(&output.stdout).contains("failed: "), "{}", text(&output.stdout));
    // `run` on the working provider runs, saying what it left out.
    let output = run(subagents(dir.path())
        .args(["run", "check a", "--provider", "cheap", "--config"])
        .arg(&config)
        .arg("--home")
        .arg(&home));
    assert!(output.status.success(), "{}{}", text(&output.stdout), text(&output.stderr));
    assert!(text(&output.stderr).contains("left out"), "{}", text(&output.stderr));
    // The one that uses it is refused before anything starts, at its place.
    let refused_home = dir.path().join("refused");
    for command in [vec!["run", "check a"], vec!["fanout", "-"]] {
        let output = run(subagents(dir.path())
            .args(&command)
            .args(["--provider", "codex", "--config"])
            .arg(&config)
            .arg("--home")
            .arg(&refused_home));
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{command:?}: {stderr}");
        assert!(
            stderr.contains("half.toml:6:11: command \"no-such-codex-acp\" is not a file and not on PATH"),
            "{stderr}"
        );
        assert!(!refused_home.exists(), "nothing started");
    }
}

#[test]
fn providers_list_prints_each_kinds_capabilities_as_the_built_provider_advertises_them() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("kinds.toml");
    std::fs::write(
        &config,
        "[providers.s]\nkind = \"spawn\"\n[providers.f]\nkind = \"fork\"\n[providers.m]\nkind = \"mock\"\n\
         [providers.p]\nkind = \"process\"\n[providers.c]\nkind = \"chaos\"\nwraps = \"m\"\n\
         [providers.a]\nkind = \"a2a\"\nurl = \"http://127.0.0.1:9\"\n",
    )
    .unwrap();
    let json = |args: &[&str]| -> Value {
        let mut command = subagents(dir.path());
        command.args(["providers"]).args(args).args(["--json", "--config"]).arg(&config);
        if args[0] == "check" {
            command.arg("--home").arg(dir.path().join("home"));
        }
        let output = run(&mut command);
        serde_json::from_slice(&output.stdout).unwrap_or_else(|_| panic!("{}", text(&output.stderr)))
    };
    let listed = json(&["list"]);
    let process = listed.as_array().unwrap().iter().find(|row| row["name"] == "p").unwrap();
    assert!(process["capabilities"].as_str().unwrap().contains("mcp_servers"), "{listed}");
    for name in ["s", "f", "m", "p"] {
        let checked = json(&["check", name]);
        assert_eq!(checked[0]["ok"], true, "{checked}");
        let row = listed.as_array().unwrap().iter().find(|row| row["name"] == name).unwrap();
        assert_eq!(row["capabilities"], checked[0]["capabilities"], "{name}: list and the built provider agree");
    }
    let a2a = listed.as_array().unwrap().iter().find(|row| row["name"] == "a").unwrap();
    assert_eq!(a2a["capabilities"], "output_schema", "{listed}");
}

#[test]
fn an_mcp_server_the_environment_cannot_serve_is_a_problem_of_the_providers_mounting_it_only() {
    let text = "[mcp_servers.files]\ncommand = \"no-such-mcp-server\"\n\n[mcp_servers.web]\nurl = \"https://x/mcp\"\n\
                headers = { Authorization = \"Bearer ${SUBAGENTS_TEST_NEVER_SET}\" }\n\n\
                [providers.plain]\nkind = \"spawn\"\nmcp_servers = []\n\n\
                [providers.files]\nkind = \"spawn\"\nmcp_servers = [\"files\"]\n\n\
                [providers.web]\nkind = \"spawn\"\nmcp_servers = [\"web\"]\n";
    let config = Config::parse(text, "servers.toml").expect("the file itself is sound");
    assert!(config.provider("plain").unwrap().problem().is_none());
    let files = config.provider("files").unwrap().problem().expect("its server's program is missing").to_string();
    assert_eq!(files, "servers.toml:2:11: command \"no-such-mcp-server\" is not a file and not on PATH");
    let web = config.provider("web").unwrap().problem().expect("its server's variable is unset").to_string();
    assert_eq!(web, "servers.toml:6:29: ${SUBAGENTS_TEST_NEVER_SET} is not set in the environment");
    assert!(config.check_used(&["plain"]).is_ok());
    assert_eq!(config.check_used(&["files"]).unwrap_err().to_string(), files);
}
