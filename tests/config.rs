//! The configuration file at the binary's doors: providers of several kinds
//! side by side (a pooled `acp` provider running our own `subagents acp`
//! beside a `spawn` one), task lines and the subagent tool choosing among
//! them by name, `providers list|check`, and bad files refused with their
//! place before anything starts; model routes in `routes.rs`, hostile files
//! (devices, sizes, counts, depths) in `hostile.rs`.

#[path = "config/errors.rs"]
mod errors;
#[path = "config/hostile.rs"]
mod hostile;
#[path = "config/routes.rs"]
mod routes;

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn subagents(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_subagents"));
    command.env_remove("SUBAGENTS_HOME").env_remove("SUBAGENTS_CONFIG").env_remove("RUST_LOG").current_dir(dir);
    command
}

fn run(command: &mut Command) -> Output {
    common::output_within(command, common::WAIT_LIMIT, "the subagents binary")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A config with `cheap` (spawn), `echo` (mock), `flaky` (chaos around
/// `echo`, every run failing) and `agent` (pooled acp: this binary).
fn write_config(dir: &Path) -> PathBuf {
    let path = dir.join("subagents.toml");
    let config = format!(
        r#"# providers side by side
[providers.cheap]
kind = "spawn"

[providers.echo]
kind = "mock"
reply = "echo: "
echo_prompt = true

[providers.flaky]
kind = "chaos"
wraps = "echo"
seed = 7
faults = [{{ stage = "run", fault = "error", probability = 1.0 }}]

[providers.agent]
kind = "acp"
command = "{bin}"
args = ["acp", "--home", "{home}"]
reuse = "pooled"
pool = {{ size = 1 }}

[tool]
providers = ["agent", "cheap"]
"#,
        bin = env!("CARGO_BIN_EXE_subagents"),
        home = dir.join("acp-home").display(),
    );
    std::fs::write(&path, config).unwrap();
    path
}

/// `fanout` of `tasks` (written to `tasks.jsonl`) on `provider` of
/// `config`, its home under `dir`.
fn fanout_on(dir: &Path, tasks: &str, provider: &str, config: &Path) -> Command {
    let path = dir.join("tasks.jsonl");
    std::fs::write(&path, tasks).unwrap();
    fanout(dir, &path, &["--provider", provider], config)
}

/// `fanout` of the task file `tasks` with `flags`, on `config`, its home
/// under `dir`.
fn fanout(dir: &Path, tasks: &Path, flags: &[&str], config: &Path) -> Command {
    let mut command = subagents(dir);
    command.arg("fanout").arg(tasks).args(flags).arg("--config").arg(config).arg("--home").arg(dir.join("home"));
    command
}

fn result_lines(stdout: &[u8]) -> Vec<Value> {
    text(stdout).lines().map(|line| serde_json::from_str(line).expect("whole JSON lines")).collect()
}

#[test]
fn fanout_runs_each_task_on_the_provider_its_line_names() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let tasks = dir.path().join("tasks.jsonl");
    let lines = [
        r#"{"prompt": "plain", "label": "default"}"#,
        r#"{"prompt": "in process", "provider": "cheap"}"#,
        r#"{"prompt": "scripted", "provider": "echo"}"#,
        r#"{"prompt": "doomed", "provider": "flaky"}"#,
        r#"{"prompt": "over acp", "provider": "agent"}"#,
        r#"{"prompt": "again over acp", "provider": "agent"}"#,
    ];
    std::fs::write(&tasks, lines.join("\n")).unwrap();
    let output = run(&mut fanout(dir.path(), &tasks, &[], &config));
    assert!(output.status.success(), "{}", text(&output.stderr));
    let mut results = result_lines(&output.stdout);
    results.sort_by_key(|result| result["line"].as_u64());
    let child = |n: usize| results[n]["child_id"].as_str().unwrap_or_default().to_owned();
    // Without --provider a line runs on the first provider [tool] offers.
    assert!(child(0).starts_with("acp:agent:"), "{results:?}");
    assert_eq!(results[0]["output"], "handled: plain");
    assert!(!child(1).contains(':'), "a spawn child's id is its session id: {}", child(1));
    assert_eq!(results[1]["output"], "handled: in process");
    assert_eq!(results[2]["output"], "echo: scripted");
    assert_eq!(results[3]["stop_reason"], "error", "the chaos wrapper failed it: {:?}", results[3]);
    for n in [4, 5] {
        assert!(child(n).starts_with("acp:agent:"), "{results:?}");
        assert_eq!(results[n]["stop_reason"], "completed", "{:?}", results[n]);
    }
    assert_eq!(results[4]["output"], "handled: over acp");
}

#[test]
fn fanout_provider_flag_picks_a_configured_provider_for_lines_that_name_none() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let tasks = "{\"prompt\": \"one\"}\n{\"prompt\": \"two\", \"provider\": \"cheap\"}\n";
    let output = run(&mut fanout_on(dir.path(), tasks, "echo", &config));
    assert!(output.status.success(), "{}", text(&output.stderr));
    let outputs: Vec<String> =
        result_lines(&output.stdout).iter().map(|r| r["output"].as_str().unwrap().to_owned()).collect();
    assert!(outputs.contains(&"echo: one".to_owned()) && outputs.contains(&"handled: two".to_owned()), "{outputs:?}");
}

#[test]
fn run_offers_the_tool_s_providers_and_a_file_in_the_working_directory_is_found() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path());
    // No --config: ./subagents.toml is read. Its [tool] offers `agent`
    // first, so the parent's `subagent` tool delegates over ACP.
    let output = run(subagents(dir.path()).args(["run", "check a; check b", "--home"]).arg(dir.path().join("home")));
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}\n{}", text(&output.stderr));
    assert!(stdout.contains("- handled: check a") && stdout.contains("- handled: check b"), "{stdout}");
    let tree: Vec<&str> = stdout.lines().filter(|line| line.contains("─ agent ")).collect();
    assert_eq!(tree.len(), 2, "both children ran on the acp provider: {stdout}");
    // --provider narrows the tool to one configured provider.
    let output = run(subagents(dir.path())
        .args(["run", "check c; check d", "--provider", "cheap", "--home"])
        .arg(dir.path().join("home")));
    let stdout = text(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert_eq!(stdout.lines().filter(|line| line.contains("─ cheap ")).count(), 2, "{stdout}");
}

#[test]
fn the_config_environment_variable_names_the_file_when_no_flag_does() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let elsewhere = tempfile::tempdir().unwrap();
    let output =
        run(subagents(elsewhere.path()).args(["providers", "list", "--json"]).env("SUBAGENTS_CONFIG", &config));
    assert!(output.status.success(), "{}", text(&output.stderr));
    let listed: Value = serde_json::from_slice(&output.stdout).unwrap();
    let names: Vec<&str> = listed.as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["cheap", "echo", "flaky", "agent"]);
    // Without any file the built-in providers are listed.
    let output = run(subagents(elsewhere.path()).args(["providers", "list"]));
    let table = text(&output.stdout);
    assert!(output.status.success());
    for name in ["spawn", "fork", "mock"] {
        assert!(table.lines().any(|line| line.starts_with(name) && line.ends_with("built-in")), "{table}");
    }
}

#[test]
fn providers_list_tells_kind_and_place_and_check_probes_each_provider() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path());
    let output = run(subagents(dir.path()).args(["providers", "list", "--config"]).arg(&config));
    let table = text(&output.stdout);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let agent = table.lines().find(|line| line.starts_with("agent")).expect("the acp provider is listed");
    assert!(agent.contains(" acp ") && agent.ends_with(&format!("{}:16", config.display())), "{table}");
    let output = run(subagents(dir.path())
        .args(["providers", "check", "--json", "--config"])
        .arg(&config)
        .arg("--home")
        .arg(dir.path().join("home")));
    assert!(output.status.success(), "{}", text(&output.stderr));
    let checked: Value = serde_json::from_slice(&output.stdout).unwrap();
    let capabilities = |name: &str| {
        checked.as_array().unwrap().iter().find(|p| p["name"] == name).unwrap()["capabilities"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    // Our ACP agent answers initialize with a system prompt capability;
    // every ACP agent is handed the MCP servers a request picks.
    assert_eq!(capabilities("agent"), "persona, mcp_servers");
    assert!(capabilities("flaky").contains("output_schema"), "chaos advertises what it wraps");
    assert!(checked.as_array().unwrap().iter().all(|p| p["ok"] == true), "{checked}");
    // A provider that cannot be built fails the check (exit 1), and the
    // others are still checked: an ACP agent that never answers, a process
    // child whose binary does not speak the protocol, a real one.
    let broken = dir.path().join("broken.toml");
    std::fs::write(
        &broken,
        format!(
            "[providers.dead]\nkind = \"acp\"\ncommand = \"/bin/false\"\n\n[providers.mute]\nkind = \"process\"\nbin = \"/bin/true\"\n\n[providers.child]\nkind = \"process\"\nbin = \"{bin}\"\n",
            bin = env!("CARGO_BIN_EXE_subagents")
        ),
    )
    .unwrap();
    let check = |args: &[&str]| {
        run(subagents(dir.path())
            .args(["providers", "check"])
            .args(args)
            .arg("--config")
            .arg(&broken)
            .arg("--home")
            .arg(dir.path().join("home")))
    };
    let output = check(&[]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    let table = text(&output.stdout);
    let row = |name: &str| table.lines().find(|line| line.starts_with(name)).unwrap_or_default().to_owned();
    assert!(table.lines().next().unwrap().ends_with("STATUS"), "{table}");
    assert!(row("dead").contains("failed: provider \"dead\""), "{table}");
    assert!(
        row("mute").contains("failed: provider \"mute\": its child's initialize failed (child-crashed)"),
        "{table}"
    );
    assert!(row("child").ends_with(" ok"), "{table}");
    // One provider alone, for a script.
    let output = check(&["child", "--json"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let checked: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(checked.as_array().map(Vec::len), Some(1), "{checked}");
    assert_eq!(checked[0]["ok"], true);
    let output = check(&["mute", "--json"]);
    assert_eq!(output.status.code(), Some(1));
    let checked: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(checked[0]["error"].as_str().unwrap().contains("initialize failed"), "{checked}");
    assert_eq!(check(&["nope"]).status.code(), Some(2));
}

#[test]
fn a_bad_file_is_refused_with_its_file_line_and_column_before_anything_starts() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("[providers.a]\nkind = \"spwan\"\n", ":2:8: unknown kind \"spwan\" (did you mean \"spawn\"?): spawn, fork,"),
        ("[providers.a]\nkind = \"spawn\"\nbogus = 1\n", ":3:1: `bogus` is not a key of a spawn provider: a spawn"),
        (
            "[providers.a]\nkind = \"spawn\"\ncommand = \"sh\"\n",
            ":3:11: `command` is a key of an acp provider or [mcp_servers.NAME], not of a spawn provider: a spawn \
             provider takes `kind`, `model`,",
        ),
        ("[providers.a]\nkind = \"spawn\"\nmax_depth = \"three\"\n", ":3:13: invalid type: string \"three\""),
        ("[providers.a]\nkind = \"chaos\"\nwraps = \"a\"\n", ":3:9: provider \"a\" wraps itself"),
        (
            "[providers.a]\nkind = \"chaos\"\nwraps = \"b\"\n",
            ":3:9: provider \"a\" wraps \"b\", which no [providers] table defines",
        ),
        (
            "[providers.a]\nkind = \"chaos\"\nwraps = \"b\"\n[providers.b]\nkind = \"chaos\"\nwraps = \"a\"\n",
            ":3:9: provider \"a\" wraps a chain of chaos providers that loops back to \"a\"",
        ),
        (
            "[providers.a]\nkind = \"acp\"\ncommand = \"no-such-agent-here\"\n",
            ":3:11: command \"no-such-agent-here\" is not a file and not on PATH",
        ),
        (
            "[providers.a]\nkind = \"acp\"\ncommand = \"sh\"\nenv = { KEY = \"${SUBAGENTS_TEST_UNSET}\" }\n",
            ":4:15: ${SUBAGENTS_TEST_UNSET} is not set in the environment",
        ),
        ("[providers.a]\nkind = \"mock\"\ndelay = \"5\"\n", ":3:9: `delay`: \"5\" needs a unit"),
        (
            "[providers.a]\nkind = \"acp\"\ncommand = \"sh\"\npool = { size = 2 }\n",
            ":4:8: `pool` applies only with reuse = \"pooled\"",
        ),
        ("[tool]\nproviders = [\"zz\"]\n", ":2:14: [tool] offers \"zz\", which no [providers] table defines"),
        (
            "[providers.a]\nkind = \"acp\"\ncommand = \"sh\"\nkeep_run_dirs = true\n",
            ":4:17: `keep_run_dirs` applies to the directory `{run_dir}` names, and no `args` or `env` value of \"a\" names it",
        ),
        (
            "[providers.a]\nkind = \"acp\"\ncommand = \"sh\"\nargs = [\"{run_dir}\"]\ntemplate_dir = \"/no/such/template\"\n",
            ":5:16: template_dir \"/no/such/template\" is not a directory",
        ),
    ];
    let home = dir.path().join("home");
    for (n, (file, expected)) in cases.iter().enumerate() {
        let path = dir.path().join(format!("bad{n}.toml"));
        std::fs::write(&path, file).unwrap();
        let tasks = dir.path().join("tasks.jsonl");
        std::fs::write(&tasks, "{\"prompt\": \"x\"}\n").unwrap();
        let output =
            run(subagents(dir.path()).arg("fanout").arg(&tasks).arg("--config").arg(&path).arg("--home").arg(&home));
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{file}: {stderr}");
        let place = format!("subagents: {}{expected}", path.display());
        assert!(stderr.starts_with(&place), "{file}\nwanted: {place}\ngot:    {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
        assert!(output.stdout.is_empty(), "no result line");
    }
    assert!(!home.exists(), "nothing started, so no home was created");
}

#[test]
fn the_example_configs_for_real_agents_are_valid_files() {
    // Stand-ins on PATH for the four agents' commands: only the file is
    // checked here, nothing is started.
    let bin = tempfile::tempdir().unwrap();
    for name in ["codex-acp", "claude-agent-acp", "gemini", "opencode"] {
        let path = bin.path().join(name);
        std::fs::write(&path, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/agents");
    let mut checked = 0;
    for entry in std::fs::read_dir(&examples).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|ext| ext != "toml") {
            continue; // codex-home: a template directory
        }
        let output = run(subagents(bin.path())
            .args(["providers", "list", "--config"])
            .arg(&path)
            .env("PATH", bin.path())
            .env("HOME", bin.path())
            .env("OPENAI_API_KEY", "k")
            .env("ANTHROPIC_API_KEY", "k")
            .env("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
            .env("GEMINI_API_KEY", "k"));
        assert!(output.status.success(), "{}: {}", path.display(), text(&output.stderr));
        assert!(text(&output.stdout).contains(" acp "), "{}", text(&output.stdout));
        checked += 1;
    }
    assert_eq!(checked, 4);
}

/// A wrapper agent that records the directory it was given (what the
/// template put there, and its mode) in the file its second argument
/// names, then serves as this binary's `subagents acp` with
/// its sessions inside that directory.
fn recording_agent(dir: &Path) -> PathBuf {
    let script = dir.join("agent.sh");
    let body = format!(
        "#!/bin/sh\necho \"$1 $(cat \"$1/marker\") $(stat -c %a \"$1\")\" >> '{dir}/'\"$2\"\nexec '{bin}' acp --home \"$1/home\"\n",
        dir = dir.display(),
        bin = env!("CARGO_BIN_EXE_subagents"),
    );
    std::fs::write(&script, body).unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    script
}

#[test]
fn each_acp_process_gets_a_private_run_dir_from_the_template_removed_unless_kept() {
    let dir = tempfile::tempdir().unwrap();
    let (template, root) = (dir.path().join("template"), dir.path().join("runs"));
    std::fs::create_dir(&template).unwrap();
    std::fs::write(template.join("marker"), "templated").unwrap();
    let script = recording_agent(dir.path());
    let config = dir.path().join("dirs.toml");
    let table = |name: &str, extra: &str| {
        format!(
            "[providers.{name}]\nkind = \"acp\"\ncommand = \"{script}\"\nargs = [\"{{run_dir}}\", \"{name}.log\"]\ntemplate_dir = \"{template}\"\nrun_dir_root = \"{root}\"\n{extra}\n",
            script = script.display(),
            template = template.display(),
            root = root.display(),
        )
    };
    let file = [
        table("isolated", ""),
        table("kept", "keep_run_dirs = true"),
        table("pooled", "reuse = \"pooled\"\npool = { size = 1 }"),
    ]
    .concat();
    std::fs::write(&config, file).unwrap();
    let fanout = |provider: &str| {
        let tasks = dir.path().join("tasks.jsonl");
        std::fs::write(&tasks, "{\"prompt\": \"a\"}\n{\"prompt\": \"b\"}\n{\"prompt\": \"c\"}\n").unwrap();
        let log = dir.path().join(format!("{provider}.log"));
        std::fs::remove_file(&log).ok(); // earlier fanouts' probes
        let output = run(&mut fanout(dir.path(), &tasks, &["--concurrency", "1", "--provider", provider], &config));
        assert!(output.status.success(), "{provider}: {}", text(&output.stderr));
        let results = result_lines(&output.stdout);
        assert_eq!(results.len(), 3);
        assert!(results.iter().all(|r| r["stop_reason"] == "completed"), "{results:?}");
        let lines = std::fs::read_to_string(&log).unwrap();
        let dirs: Vec<PathBuf> = lines
            .lines()
            .map(|line| {
                let mut words = line.split(' ');
                let path = PathBuf::from(words.next().unwrap());
                assert_eq!(words.collect::<Vec<_>>(), ["templated", "700"], "{line}");
                assert!(path.starts_with(&root), "{path:?} under {root:?}");
                path
            })
            .collect();
        let mut distinct = dirs.clone();
        distinct.dedup();
        (distinct.len(), distinct.iter().filter(|path| path.exists()).count())
    };
    // Each fanout probes every provider of the file once. The probe and
    // each run: a process and a directory each, all removed once reaped.
    assert_eq!(fanout("isolated"), (4, 0));
    // The same, the runs' directories kept (never a probe's).
    assert_eq!(fanout("kept"), (4, 3));
    // The probe, then the pool: the first run's own process and the one
    // warmed beside it serve all three runs, a directory each for life.
    let (processes, left) = fanout("pooled");
    assert!(processes <= 3 && left == 0, "{processes} processes for three pooled runs, {left} directories left");
}

#[test]
fn acp_serves_sessions_whose_subagent_tool_offers_the_file_s_providers() {
    let dir = tempfile::tempdir().unwrap();
    let inner = dir.path().join("inner.toml");
    std::fs::write(
        &inner,
        "[providers.echo]\nkind = \"mock\"\nreply = \"echo: \"\necho_prompt = true\n\n[tool]\nproviders = [\"echo\"]\n",
    )
    .unwrap();
    // Our own `subagents acp`, configured by the inner file, as an ACP child.
    let outer = dir.path().join("outer.toml");
    std::fs::write(
        &outer,
        format!(
            "[providers.outer]\nkind = \"acp\"\ncommand = \"{bin}\"\nargs = [\"acp\", \"--config\", \"{inner}\", \"--home\", \"{home}\"]\n",
            bin = env!("CARGO_BIN_EXE_subagents"),
            inner = inner.display(),
            home = dir.path().join("acp-home").display(),
        ),
    )
    .unwrap();
    let tasks = "{\"prompt\": \"check the parser; check the docs\"}\n";
    let output = run(&mut fanout_on(dir.path(), tasks, "outer", &outer));
    assert!(output.status.success(), "{}", text(&output.stderr));
    let results = result_lines(&output.stdout);
    let answer = results[0]["output"].as_str().unwrap_or_default();
    // The ACP agent's session delegated each part to the inner file's mock.
    assert!(answer.contains("echo: check the parser") && answer.contains("echo: check the docs"), "{results:?}");

    // A provider the file does not define, or --provider without a file.
    let refused = run(subagents(dir.path()).args(["acp", "--provider", "nope", "--config"]).arg(&inner));
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains("unknown provider \"nope\""), "{}", text(&refused.stderr));
    let refused = run(subagents(dir.path()).args(["acp", "--provider", "codex"]));
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused.stderr));
}

#[test]
fn a_spawn_provider_s_persona_and_budget_apply_to_runs_whose_requests_name_none() {
    use std::sync::Arc;
    use std::time::Duration;
    use subagents::agent::{ScriptedModel, Step};
    use subagents::config::{Config, Configured};
    use subagents::tool::TaskService;
    use subagents::{Budget, CancellationToken, Parent, Runtime, StartRequest, StopReason};

    let home = tempfile::tempdir().unwrap();
    let runtime = Runtime::builder().workers(1).home(home.path()).build().unwrap();
    let subagents = runtime.subagents();
    // Every answer takes 300 ms: past the provider's 100 ms deadline.
    let model = ScriptedModel::new().recording().fallback(Step::text("done").after(Duration::from_millis(300)));
    let file = "[providers.terse]\nkind = \"spawn\"\npersona = \"You answer in one word.\"\nbudget = { deadline = \"100ms\", runs = 5 }\n";
    let configured = Configured::new(Config::parse(file, "terse.toml").unwrap(), None).unwrap();
    configured.register_blocking(&subagents, &TaskService::new(), home.path(), Arc::new(model.clone())).unwrap();
    let cwd = home.path().to_path_buf();
    let request = move || StartRequest::new("go", Parent::root(&cwd), CancellationToken::new());
    let (defaulted, own) = runtime.block_on(async move {
        let run = subagents.start("terse", request()).await.unwrap();
        let defaulted = run.result().await.unwrap();
        run.dispose().await.unwrap();
        // A request's own persona and budget win over the provider's.
        let own = request().with_persona("You are thorough.").with_budget(Budget::new().with_runs(5));
        let run = subagents.start("terse", own).await.unwrap();
        let own = run.result().await.unwrap();
        run.dispose().await.unwrap();
        (defaulted, own)
    });
    assert_eq!(defaulted.stop_reason, StopReason::Aborted, "the provider's deadline ended it: {defaulted:?}");
    assert_eq!(own.stop_reason, StopReason::Completed, "{own:?}");
    let systems: Vec<String> = model.requests().iter().map(|request| request.system.to_string()).collect();
    assert!(systems[0].contains("You answer in one word."), "{systems:?}");
    assert!(systems[1].contains("You are thorough.") && !systems[1].contains("one word"), "{systems:?}");
    runtime.shutdown_blocking();

    let zero = "[providers.a]\nkind = \"spawn\"\nbudget = { runs = 0 }\n";
    let error = Config::parse(zero, "zero.toml").unwrap_err().to_string();
    assert!(error.starts_with("zero.toml:3:10: a `budget` limit of 0"), "{error}");
    let unknown = "[providers.a]\nkind = \"mock\"\npersona = \"x\"\n";
    let error = Config::parse(unknown, "mock.toml").unwrap_err().to_string();
    assert!(
        error.contains("`persona` is a key of a spawn provider or a fork provider, not of a mock provider"),
        "{error}"
    );
}

#[test]
fn a_process_provider_s_patches_are_read_beside_the_file_and_checked() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("terse.json"), r#"{"persona": "Answer tersely.", "max_steps": 4}"#).unwrap();
    std::fs::write(dir.path().join("bad.json"), r#"{"colour": "blue"}"#).unwrap();
    let file = |patch: &str| {
        let path = dir.path().join(format!("{patch}.toml"));
        let text = format!("[providers.child]\nkind = \"process\"\npatches = [\"{patch}\"]\n");
        std::fs::write(&path, text).unwrap();
        path
    };
    let check = |config: &Path| {
        run(subagents(dir.path())
            .args(["providers", "check", "--json", "--config"])
            .arg(config)
            .arg("--home")
            .arg(dir.path().join("home")))
    };
    let output = check(&file("terse.json"));
    assert!(output.status.success(), "{}{}", text(&output.stdout), text(&output.stderr));
    let output = check(&file("bad.json"));
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    assert!(text(&output.stdout).contains("patch key \\\"colour\\\" is unknown"), "{}", text(&output.stdout));
    // A patch that is not there is the provider's fault, not the file's:
    // `check` names it, at its place, as that provider's failure.
    let output = check(&file("absent.json"));
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    assert!(text(&output.stdout).contains(":3:12: patch "), "{}", text(&output.stdout));
}

#[test]
fn sessions_tree_reaches_a_process_child_in_its_own_home_and_the_runs_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("process.toml");
    std::fs::write(&config, "[providers.isolated]\nkind = \"process\"\n").unwrap();
    let home = dir.path().join("home");
    let tasks = "{\"prompt\": \"check the parser; check the docs\"}\n";
    let output = run(&mut fanout_on(dir.path(), tasks, "isolated", &config));
    assert!(output.status.success(), "{}", text(&output.stderr));
    let results = result_lines(&output.stdout);
    let child = results[0]["child_id"].as_str().unwrap();
    let session = child.strip_prefix("process:isolated:").unwrap_or_else(|| panic!("{child}"));
    // The child's session is in its own home, `<home>/children/isolated`.
    let child_store = subagents::agent::SessionStore::new(home.join("children/isolated"));
    assert!(child_store.read(session).is_ok(), "the child's session is stored in its own home");
    let output = run(subagents(dir.path()).args(["sessions", "tree", session, "--json", "--home"]).arg(&home));
    assert!(output.status.success(), "{}", text(&output.stderr));
    let tree: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(tree["id"], session, "{tree}");
    assert_eq!(tree["children"].as_array().map(Vec::len), Some(2), "the two runs it started: {tree}");
    // `show` finds it there too, by the run's child id.
    let output = run(subagents(dir.path()).args(["sessions", "show", child, "--home"]).arg(&home));
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(text(&output.stdout).contains("user: check the parser; check the docs"), "{}", text(&output.stdout));
}

#[test]
fn a_process_provider_s_model_reaches_its_children_as_their_route() {
    let dir = tempfile::tempdir().unwrap();
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let config = dir.path().join("process.toml");
    std::fs::write(&config, "[providers.isolated]\nkind = \"process\"\nmodel = \"anthropic:claude-test\"\n").unwrap();
    let output = run(fanout_on(dir.path(), "{\"prompt\": \"hello\"}\n", "isolated", &config)
        .env("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{closed_port}"))
        .env("ANTHROPIC_API_KEY", "k"));
    let results = result_lines(&output.stdout);
    // The child spoke Anthropic's API to the (closed) endpoint it was
    // handed, not the scripted model.
    assert_eq!(results[0]["stop_reason"], "error", "{results:?}");
    let reason = results[0]["diagnostic"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("could not be reached"), "{results:?}");
}
