//! docs/contract.md §7.8 `process`: real child processes — our own binary (`subagents
//! serve`) and small shell children for the dispose ladder and hostile
//! output. After every test no child process is left.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{lifecycle, no_children_left, no_process_mentions, request_in, runtime_at as runtime};
use subagents::providers::{ProcessConfig, ProcessProvider};
use subagents::seam::{AgentOptions, Category};
use subagents::{CancellationToken, Parent, StartRequest, StopReason};

fn config(name: &str, home: &Path) -> ProcessConfig {
    let mut config = ProcessConfig::new(name, home.join("children"));
    config.bin = PathBuf::from(env!("CARGO_BIN_EXE_subagents"));
    config
}

/// Makes `config` run a shell child: `script` becomes `<dir>/<name>/serve`,
/// run as `/bin/sh serve --home …` from that directory. (Running the shell
/// rather than exec'ing a freshly written script avoids ETXTBSY when another
/// test forks while the file is open.)
fn shell_child(config: &mut ProcessConfig, dir: &Path, name: &str, script: &str) {
    let cwd = dir.join(name);
    std::fs::create_dir_all(&cwd).unwrap();
    std::fs::write(cwd.join("serve"), format!("{script}\n")).unwrap();
    config.bin = PathBuf::from("/bin/sh");
    config.cwd = Some(cwd);
}

/// Answers `initialize` (always request id 1), then runs `then`.
fn handshake_then(then: &str) -> String {
    format!(
        "read line\nprintf '%s\\n' '{{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{{\"protocol_version\":1,\"session_id\":\"sh\"}}}}'\n{then}"
    )
}

#[test]
fn our_own_binary_serves_a_run_and_its_in_process_grandchildren() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let subagents = runtime.subagents();
    subagents.register_provider(ProcessProvider::new(config("process", home.path())).unwrap()).unwrap().keep();
    let info = subagents.provider("process").unwrap();
    assert!(info.capabilities.agent_options && !info.capabilities.persona && !info.capabilities.output_schema);
    let plain = lifecycle(&runtime, &subagents, "process", request_in("summarise the log", home.path()));
    assert_eq!((plain.stop_reason, plain.text()), (StopReason::Completed, "handled: summarise the log".to_owned()));
    // What the child's turn spent crossed the wire with its end.
    assert!(plain.usage.input_tokens > 0 && plain.usage.model_calls >= 1, "{:?}", plain.usage);
    let nested = lifecycle(&runtime, &subagents, "process", request_in("check a; check b", home.path()));
    assert_eq!(nested.stop_reason, StopReason::Completed);
    assert!(
        nested.text().contains("- handled: check a") && nested.text().contains("- handled: check b"),
        "{}",
        nested.text()
    );
    // The child kept its own sessions in its own home: the child agent and
    // its two in-process grandchildren.
    let sessions = subagents::agent::SessionStore::new(home.path().join("children")).ids().unwrap().len();
    assert_eq!(sessions, 4);
    no_children_left(&runtime);
    no_process_mentions(home.path());
}

#[test]
fn start_time_features_other_than_the_route_are_refused_and_a_bad_route_is_reaped() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let subagents = runtime.subagents();
    subagents.register_provider(ProcessProvider::new(config("process", home.path())).unwrap()).unwrap().keep();
    let cwd = home.path().to_path_buf();
    let (persona, route, bad_cwd, cancelled) = runtime.block_on({
        let subagents = subagents.clone();
        async move {
            let persona = subagents.start("process", request_in("x", &cwd).with_persona("terse")).await.unwrap_err();
            let unknown = AgentOptions { provider: Some("nowhere".into()), ..Default::default() };
            let route =
                subagents.start("process", request_in("x", &cwd).with_agent_options(unknown)).await.unwrap_err();
            let bad_cwd = subagents.start("process", request_in("x", Path::new("relative/dir"))).await.unwrap_err();
            let signal = CancellationToken::new();
            signal.cancel();
            let cancelled =
                subagents.start("process", StartRequest::new("x", Parent::root(&cwd), signal)).await.unwrap_err();
            (persona, route, bad_cwd, cancelled)
        }
    });
    assert_eq!(persona.code(), "UNSUPPORTED_CAPABILITY");
    assert_eq!(route.code(), "STARTUP_FAILED");
    // Our words stay fixed; the child's own account is the detail.
    let subagents::StartError::StartupFailed { diagnostic, .. } = &route else { panic!("{route:?}") };
    assert_eq!((diagnostic.category, diagnostic.reason.as_deref()), (Category::ChildError, None));
    let detail = diagnostic.detail.as_deref().unwrap_or_default();
    assert!(detail.contains("-32602") && detail.contains("unknown model provider \"nowhere\""), "{route}");
    assert_eq!(bad_cwd.code(), "INVALID_REQUEST");
    assert_eq!(cancelled.code(), "ABORTED");
    no_children_left(&runtime);
    no_process_mentions(home.path());
}

#[test]
fn patches_are_checked_at_construction_and_applied_in_order() {
    let home = tempfile::tempdir().unwrap();
    let bad = home.path().join("bad.json");
    std::fs::write(&bad, r#"{"colour": "blue"}"#).unwrap();
    let mut refused = config("process", home.path());
    refused.patches = vec![bad];
    assert!(ProcessProvider::new(refused).unwrap_err().to_string().contains("colour"));

    // Two patches: the second takes the tools away again.
    let first = home.path().join("first.json");
    let second = home.path().join("second.json");
    std::fs::write(&first, r#"{"tools": ["list_dir"]}"#).unwrap();
    std::fs::write(&second, r#"{"tools": []}"#).unwrap();
    let mut patched = config("patched", home.path());
    patched.patches = vec![first, second];
    let runtime = runtime(home.path());
    let subagents = runtime.subagents();
    subagents.register_provider(ProcessProvider::new(patched).unwrap()).unwrap().keep();
    subagents.register_provider(ProcessProvider::new(config("plain", home.path())).unwrap()).unwrap().keep();
    let prompt = "list the files here";
    let patched = lifecycle(&runtime, &subagents, "patched", request_in(prompt, home.path()));
    let plain = lifecycle(&runtime, &subagents, "plain", request_in(prompt, home.path()));
    assert_eq!(patched.text(), format!("handled: {prompt}"), "no list_dir after the second patch");
    assert!(plain.text().starts_with("Done:"), "the default profile lists the directory: {}", plain.text());
    no_children_left(&runtime);
    no_process_mentions(home.path());
}

/// The dispose ladder, one tier per child: EOF, SIGTERM, SIGKILL.
#[test]
fn the_dispose_ladder_stops_each_kind_of_child_at_its_tier() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let subagents = runtime.subagents();
    let tiers = [
        ("exits-on-eof", handshake_then("cat > /dev/null"), Duration::ZERO),
        ("ignores-eof", handshake_then("cat > /dev/null\nsleep 1000"), Duration::from_millis(300)),
        (
            "traps-sigterm",
            handshake_then("trap '' TERM\ncat > /dev/null\nwhile true; do sleep 0.05; done"),
            Duration::from_millis(600),
        ),
    ];
    for (name, script, at_least) in tiers {
        let mut config = config(name, home.path());
        shell_child(&mut config, home.path(), name, &script);
        config.shutdown_timeout = Duration::from_millis(50);
        config.dispose_eof_grace = Duration::from_millis(300);
        config.dispose_grace = Duration::from_millis(300);
        subagents.register_provider(ProcessProvider::new(config).unwrap()).unwrap().keep();
        let began = Instant::now();
        let disposed = runtime.block_on({
            let subagents = subagents.clone();
            let cwd = home.path().to_path_buf();
            async move {
                let run = subagents.start(name, request_in("wait", &cwd)).await.unwrap();
                run.cancel();
                let result = run.result().await.unwrap();
                assert_eq!(result.stop_reason, StopReason::Aborted, "a child that ignores cancel still settles");
                run.dispose().await
            }
        });
        let took = began.elapsed();
        assert!(disposed.is_ok(), "{name}: {disposed:?}");
        assert!(took >= at_least, "{name} stopped at an earlier tier: {took:?}");
        assert!(took < at_least + Duration::from_secs(5), "{name} took {took:?}");
        no_children_left(&runtime);
        no_process_mentions(home.path());
    }
}

#[test]
fn a_child_that_dies_before_the_handshake_is_a_startup_failure() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let subagents = runtime.subagents();
    let mut config = config("dies", home.path());
    shell_child(&mut config, home.path(), "dies", "exit 3");
    subagents.register_provider(ProcessProvider::new(config).unwrap()).unwrap().keep();
    let cwd = home.path().to_path_buf();
    let error = runtime.block_on(async move { subagents.start("dies", request_in("x", &cwd)).await.unwrap_err() });
    assert_eq!(error.code(), "STARTUP_FAILED");
    assert!(error.to_string().contains("child-crashed"), "{error}");
    no_children_left(&runtime);
    no_process_mentions(home.path());
}

fn resident_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn hostile_output_is_a_clear_error_with_bounded_memory() {
    let home = tempfile::tempdir().unwrap();
    let runtime = runtime(home.path());
    let subagents = runtime.subagents();
    let children = [
        ("garbage", handshake_then("read line\necho 'this is not json'\ncat > /dev/null"), Category::Protocol),
        (
            "truncated",
            handshake_then("read line\nprintf '%s' '{\"jsonrpc\":\"2.0\",\"id\":2,\"res'"),
            Category::Protocol,
        ),
        (
            "huge-line",
            handshake_then("read line\nhead -c 100000000 /dev/zero | tr '\\0' 'a'\ncat > /dev/null"),
            Category::Protocol,
        ),
        (
            "endless-stream",
            handshake_then(&format!(
                "read line\nwhile true; do printf '%s\\n' '{{\"jsonrpc\":\"2.0\",\"method\":\"event\",\"params\":{{\"type\":\"text_delta\",\"text\":\"{}\"}}}}'; done",
                "x".repeat(4096)
            )),
            Category::Protocol,
        ),
        (
            "stray-reply",
            handshake_then(
                "read line\nprintf '%s\\n' '{\"jsonrpc\":\"2.0\",\"id\":99,\"result\":{}}'\ncat > /dev/null",
            ),
            Category::Protocol,
        ),
    ];
    let before = resident_kib();
    for (name, script, category) in children {
        let mut config = config(name, home.path());
        shell_child(&mut config, home.path(), name, &script);
        config.shutdown_timeout = Duration::from_millis(50);
        config.dispose_eof_grace = Duration::from_millis(200);
        config.dispose_grace = Duration::from_millis(200);
        subagents.register_provider(ProcessProvider::new(config).unwrap()).unwrap().keep();
        let began = Instant::now();
        let result = lifecycle(&runtime, &subagents, name, request_in("go", home.path()));
        assert!(began.elapsed() < Duration::from_secs(20), "{name} hung");
        assert_eq!(result.stop_reason, StopReason::Error, "{name}");
        assert_eq!(result.diagnostic.unwrap().category, category, "{name}");
        no_children_left(&runtime);
        no_process_mentions(home.path());
    }
    let grown = resident_kib().saturating_sub(before);
    assert!(grown < 64 * 1024, "a 100 MB line must not be buffered whole: grew {grown} KiB");
}

#[test]
fn a_child_gets_the_allowlist_inherit_env_and_explicit_env_and_no_credential() {
    let home = tempfile::tempdir().unwrap();
    let report = home.path().join("env.txt");
    // Credentials whose names a word scrub misses, and ones it catches.
    let mut environment = common::env::lock();
    for name in [
        "SUBAGENTS_TEST_API_KEY",
        "Db_Password",
        "DATABASE_URL",
        "PGPASS",
        "DB_PASS",
        "MYSQL_PWD",
        "GH_PAT",
        "SENTRY_DSN",
        "SLACK_WEBHOOK_URL",
        "SUBAGENTS_TEST_SECRET_LISTED",
    ] {
        environment.set(name, "do-not-leak");
    }
    environment.set("SUBAGENTS_TEST_PLAIN", "fine");
    environment.set("SUBAGENTS_TEST_NOT_LISTED", "do-not-leak");
    environment.set("LC_SUBAGENTS_TEST", "locale");
    let mut config = config("env", home.path());
    shell_child(&mut config, home.path(), "env", &handshake_then("env > \"$REPORT\"\ncat > /dev/null"));
    config.env = vec![("REPORT".into(), report.display().to_string()), ("EXPLICIT_TOKEN".into(), "given".into())];
    config.inherit_env = vec!["SUBAGENTS_TEST_PLAIN".into(), "SUBAGENTS_TEST_SECRET*".into()];
    config.shutdown_timeout = Duration::from_millis(50);
    config.dispose_eof_grace = Duration::from_millis(200);
    let runtime = runtime(home.path());
    let subagents = runtime.subagents();
    subagents.register_provider(ProcessProvider::new(config).unwrap()).unwrap().keep();
    let cwd = home.path().to_path_buf();
    runtime.block_on(async move {
        let run = subagents.start("env", request_in("x", &cwd)).await.unwrap();
        run.cancel();
        run.dispose().await.unwrap();
    });
    let env = std::fs::read_to_string(&report).unwrap();
    assert!(!env.contains("do-not-leak"), "{env}");
    assert!(env.contains("SUBAGENTS_TEST_PLAIN=fine"), "inherit_env names are inherited");
    assert!(env.contains("LC_SUBAGENTS_TEST=locale"), "LC_* is on the allowlist");
    assert!(env.contains("EXPLICIT_TOKEN=given"), "explicit entries are the child's to have");
    assert!(env.contains("PATH="));
    no_children_left(&runtime);
    no_process_mentions(home.path());
}

/// The conformance kit (`subagents::testing`) over the process provider
/// serving our own binary: every rule kept, and no child process left.
#[test]
fn the_process_provider_passes_the_conformance_kit() {
    use subagents::testing::conformance;
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().to_path_buf();
    let kit = conformance(move || ProcessProvider::new(config("process", &dir)).unwrap());
    crate::common::passes_the_kit_with_a_slow_prompt(kit, home.path());
}
