//! Hostile files: what is not a regular file, what is too large, too many
//! tables, names too long, chains of wrappers too deep, values an HTTP
//! request cannot carry. Each is refused when the file is read, with its
//! place and the key or the bound, in bounded time and memory, and never
//! with a panic.

use std::path::Path;
use std::time::{Duration, Instant};

use subagents::config::{Config, MAX_ENTRIES, MAX_FILE_BYTES, MAX_NAME_BYTES, MAX_WRAPS_DEPTH};

use super::{subagents, text};
use crate::common;

/// Generous for a debug build on a busy machine; the faults these cases
/// pin took minutes, or for ever.
const QUICKLY: Duration = Duration::from_secs(20);

/// The file, or its first fault: of the file, or of a provider in this
/// environment (its [`ProviderEntry::problem`](subagents::config::ProviderEntry::problem)).
fn parse(text: &str) -> Result<Config, String> {
    let config = Config::parse(text, "hostile.toml").map_err(|error| error.to_string())?;
    match config.providers().iter().find_map(|entry| entry.problem()) {
        Some(problem) => Err(problem.to_string()),
        None => Ok(config),
    }
}

/// Whether `text` parses, failing the test when that takes longer than
/// [`QUICKLY`].
fn parse_quickly(text: String) -> Result<(), String> {
    let (sent, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let started = Instant::now();
        let parsed = parse(&text).map(drop);
        let _ = sent.send((parsed, started.elapsed()));
    });
    let (parsed, took) = received.recv_timeout(QUICKLY).expect("the file is read quickly");
    assert!(took < QUICKLY, "took {took:?}");
    parsed
}

/// `providers list` of `config`, within [`QUICKLY`]: (exit code, stderr).
fn list(dir: &Path, config: &Path) -> (Option<i32>, String) {
    let mut command = subagents(dir);
    command.args(["providers", "list", "--config"]).arg(config);
    let output = common::output_within(&mut command, QUICKLY, "providers list");
    (output.status.code(), text(&output.stderr))
}

#[test]
fn a_config_that_is_not_a_regular_file_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.toml");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success(), "mkfifo");
    for path in [Path::new("/dev/zero"), Path::new("/dev/urandom"), &fifo, dir.path()] {
        let (code, stderr) = list(dir.path(), path);
        assert_eq!(code, Some(2), "{}: {stderr}", path.display());
        let expected = format!("subagents: {}: cannot read it: ", path.display());
        assert!(stderr.starts_with(&expected) && stderr.contains("not a regular file"), "{stderr}");
    }
    // Named by the variable rather than the flag: the same.
    let mut command = subagents(dir.path());
    command.args(["providers", "list"]).env("SUBAGENTS_CONFIG", "/dev/zero");
    let output = common::output_within(&mut command, QUICKLY, "providers list");
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("/dev/zero: cannot read it: "), "{}", text(&output.stderr));
}

#[test]
fn a_file_larger_than_the_bound_is_refused_before_it_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("large.toml");
    let mut text = "[providers.a]\nkind = \"mock\"\n".to_owned();
    let comment = format!("#{}\n", "x".repeat(1022));
    while (text.len() as u64) <= MAX_FILE_BYTES {
        text.push_str(&comment);
    }
    std::fs::write(&path, &text).unwrap();
    let error = Config::read(&path).unwrap_err().to_string();
    let expected = format!("{}: cannot read it: ", path.display());
    assert!(error.starts_with(&expected) && error.contains("larger than 4 MiB"), "{error}");
    // At the bound, it is read.
    let at_bound = dir.path().join("at-bound.toml");
    std::fs::write(&at_bound, &text[..MAX_FILE_BYTES as usize - 1]).unwrap();
    assert!(Config::read(&at_bound).is_ok());
}

#[test]
fn more_tables_than_the_bound_are_refused_at_the_first_past_it_and_quickly() {
    let providers = |count: usize| {
        let mut text = "[providers]\n".to_owned();
        for n in 0..count {
            text.push_str(&format!("p{n}={{kind=\"mock\"}}\n"));
        }
        text
    };
    parse_quickly(providers(MAX_ENTRIES)).unwrap();
    let error = parse_quickly(providers(MAX_ENTRIES + 1)).unwrap_err();
    let expected = format!("hostile.toml:{}:", MAX_ENTRIES + 2);
    assert!(error.starts_with(&expected) && error.contains("more than 1000 [providers] tables"), "{error}");
    // A generated file of 50,000 is refused as fast (it took 30 s).
    let error = parse_quickly(providers(50_000)).unwrap_err();
    assert!(error.contains("more than 1000 [providers] tables"), "{error}");
    // The subagent tool's list is bounded too: a provider offered once.
    let twice = parse("[providers.a]\nkind = \"mock\"\n[tool]\nproviders = [\"a\", \"a\"]\n").unwrap_err();
    assert!(twice.starts_with("hostile.toml:4:19: [tool] offers \"a\" twice"), "{twice}");
    for (section, table) in
        [("models", "{ api = \"openai-chat\", model = \"m\" }"), ("mcp_servers", "{ command = \"sh\" }")]
    {
        let mut text = format!("[{section}]\n");
        for n in 0..=MAX_ENTRIES {
            text.push_str(&format!("t{n} = {table}\n"));
        }
        let error = parse_quickly(text).unwrap_err();
        assert!(error.contains(&format!("more than 1000 [{section}] tables")), "{error}");
    }
}

#[test]
fn a_chain_of_wrappers_deeper_than_the_bound_is_refused_at_its_place_and_quickly() {
    // `c0` wraps `c1` … wraps `c{depth - 1}`, which wraps the mock.
    let chain = |depth: usize| {
        let mut text = String::new();
        for n in 0..depth {
            let inner = if n + 1 == depth { "inner".to_owned() } else { format!("c{}", n + 1) };
            text.push_str(&format!("[providers.c{n}]\nkind = \"chaos\"\nwraps = \"{inner}\"\n"));
        }
        text + "[providers.inner]\nkind = \"mock\"\n"
    };
    assert!(parse_quickly(chain(MAX_WRAPS_DEPTH)).is_ok());
    let error = parse_quickly(chain(MAX_WRAPS_DEPTH + 1)).unwrap_err();
    assert!(
        error.starts_with("hostile.toml:3:9: provider \"c0\" wraps a chain of more than 16 chaos providers"),
        "{error}"
    );
    let error = parse_quickly(chain(MAX_ENTRIES - 1)).unwrap_err();
    assert!(error.contains("a chain of more than 16 chaos providers"), "{error}");
}

#[test]
fn a_name_longer_than_the_bound_is_refused_at_its_table_and_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("long-name.toml");
    std::fs::write(&path, format!("[providers.{}]\nkind = \"mock\"\n", "n".repeat(1_000_000))).unwrap();
    let (code, stderr) = list(dir.path(), &path);
    assert_eq!(code, Some(2), "{}", &stderr[..stderr.len().min(2_000)]);
    assert!(stderr.starts_with(&format!("subagents: {}:1:1: provider name \"nnn", path.display())), "{stderr:.300}");
    assert!(stderr.contains("is 1000000 bytes: at most 64"), "{stderr:.300}");
    assert!(stderr.len() < 1_000, "the name is cut short in the message: {} bytes", stderr.len());
    let at_bound = "n".repeat(MAX_NAME_BYTES);
    let past = "n".repeat(MAX_NAME_BYTES + 1);
    for (section, table) in [
        ("providers", "kind = \"mock\""),
        ("models", "api = \"openai-chat\"\nmodel = \"m\""),
        ("mcp_servers", "command = \"sh\""),
    ] {
        assert!(parse(&format!("[{section}.{at_bound}]\n{table}\n")).is_ok(), "{section}");
        let error = parse(&format!("[{section}.{past}]\n{table}\n")).unwrap_err();
        assert!(error.starts_with("hostile.toml:1:1: ") && error.contains("at most 64"), "{error}");
    }
    // A name that names nothing is cut short where it is shown.
    let long = "n".repeat(100_000);
    for file in [
        format!("[providers.a]\nkind = \"chaos\"\nwraps = \"{long}\"\n"),
        format!("[providers.a]\nkind = \"mock\"\n[tool]\nproviders = [\"{long}\"]\n"),
        format!("[providers.a]\nkind = \"spawn\"\nmcp_servers = [\"{long}\"]\n"),
    ] {
        let error = parse(&file).unwrap_err();
        assert!(error.contains("\"…, which no [") && error.len() < 300, "{error:.300}");
    }
}

#[test]
fn a_run_dir_root_that_is_not_a_directory_is_refused_when_the_file_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "").unwrap();
    for root in [file.clone(), file.join("below")] {
        let path = dir.path().join("run-dir-root.toml");
        let config = format!(
            "[providers.agent]\nkind = \"acp\"\ncommand = \"sh\"\nargs = [\"{{run_dir}}\"]\nrun_dir_root = \"{}\"\n",
            root.display()
        );
        std::fs::write(&path, &config).unwrap();
        let error = parse(&config).unwrap_err();
        let expected = format!("hostile.toml:5:16: `run_dir_root` {:?}", root.display().to_string());
        assert!(error.starts_with(&expected) && error.contains("is not a directory"), "{error}");
    }
    // One that does not exist yet is made when the first agent starts.
    let fresh = dir.path().join("roots").join("fresh");
    let text = format!(
        "[providers.agent]\nkind = \"acp\"\ncommand = \"sh\"\nargs = [\"{{run_dir}}\"]\nrun_dir_root = \"{}\"\n",
        fresh.display()
    );
    assert!(parse(&text).is_ok());
}

#[test]
fn http_urls_headers_and_keys_are_checked_when_the_file_is_read_with_their_place_and_key() {
    let mut environment = common::env::lock();
    environment.set("SUBAGENTS_TEST_NEWLINE", "a\nb");
    let a2a = |extra: &str| format!("[providers.a]\nkind = \"a2a\"\nurl = \"http://127.0.0.1:9\"\n{extra}");
    let route = |extra: &str| format!("[models.r]\napi = \"openai-chat\"\nmodel = \"m\"\n{extra}");
    let cases = [
        (
            a2a("headers = { \"Bad Name\" = \"x\" }\n"),
            "hostile.toml:4:26: `headers`: header name \"Bad Name\" is not an HTTP token",
        ),
        (
            a2a("headers = { authorization = \"${SUBAGENTS_TEST_NEWLINE}\" }\n"),
            "hostile.toml:4:29: `headers`: the value of header \"authorization\" has a character",
        ),
        (
            "[providers.a]\nkind = \"a2a\"\nurl = \"ftp://x\"\n".to_owned(),
            "hostile.toml:3:7: `url` must start with http:// or https://",
        ),
        (
            "[providers.a]\nkind = \"a2a\"\nurl = \"http://x/${SUBAGENTS_TEST_NEWLINE}\"\n".to_owned(),
            "hostile.toml:3:7: `url` ",
        ),
        (route("base_url = \"http://x/${SUBAGENTS_TEST_NEWLINE}\"\n"), "hostile.toml:4:12: `base_url` "),
    ];
    for (file, expected) in cases {
        let error = parse(&file).map(drop).expect_err(&file);
        assert!(error.starts_with(expected), "{file}\nwanted: {expected}\ngot:    {error}");
        assert!(!error.contains("a\nb"), "the value itself is not shown: {error}");
    }
    // A key unfit for a header is the route's problem, said without the key.
    let config = parse(&route("api_key_env = \"SUBAGENTS_TEST_NEWLINE\"\n")).expect("the file itself is sound");
    let problem = config.route_problem("r").expect("the route cannot be served").to_string();
    let said = "hostile.toml:4:15: route \"r\": `api_key_env`: the value of SUBAGENTS_TEST_NEWLINE has a character";
    assert!(problem.starts_with(said), "{problem}");
    assert!(!problem.contains("a\nb"), "the value itself is not shown: {problem}");
}
