//! The docs cannot lie: every shell command and configuration file of the
//! README and the guide (`docs/`) is run or loaded here, the configuration
//! reference's tables of keys are held to the loader, and every relative
//! link and `#anchor` must lead somewhere.
//!
//! - A ```` ```sh ```` (or `bash`, `console`) block runs with `bash` in a
//!   fresh directory that holds `examples/`, with the built binary on `PATH`
//!   as `subagents` (a leading `cargo run --release --` stands for it), on the
//!   scripted model, and must exit 0.
//! - A block whose info string says `no-run` (it needs a key, a real agent
//!   or a server that keeps running) is only checked: each `subagents`
//!   command in it must name a subcommand and flags its `--help` lists.
//! - A ```` ```toml ```` block is loaded by the binary (`providers list
//!   --config`), with stand-ins on `PATH` for the agents and servers the docs
//!   name and stand-in values for the variables they read; `toml,no-run`
//!   marks one that is not a configuration file; a ```` ```json ```` block
//!   must parse.
//! - Every subcommand `--help` lists has a chapter or section, and every
//!   flag it lists is mentioned somewhere in the README or the guide.
//!
//! The Rust examples are compiled and run as doc tests (`src/lib.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use subagents::config::Config;

use super::{run, text};

/// The agents and servers the docs' configuration files start, by the
/// names they give: each a script on `PATH` that exits at once, since a
/// file is loaded, never served, here.
const STAND_IN_COMMANDS: &[&str] = &["codex-acp", "claude-agent-acp", "gemini", "opencode", "mcp-files"];

/// The variables the docs' configuration files read (`${VAR}`), each given
/// a stand-in value.
const STAND_IN_VARIABLES: &[&str] = &[
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "GEMINI_API_KEY",
    "A2A_TOKEN",
    "FILES_TOKEN",
    "TICKETS_TOKEN",
];

fn project() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every markdown file under docs/ (not the built book).
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, into: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path.file_name().is_some_and(|name| name != "book") {
                    walk(&path, into);
                }
            } else if path.extension().is_some_and(|extension| extension == "md") {
                into.push(path);
            }
        }
    }
    let mut files = vec![project().join("README.md")];
    walk(&project().join("docs"), &mut files);
    files.sort();
    files
}

/// The project-relative name of `path`, for messages.
fn shown(path: &Path) -> String {
    path.strip_prefix(project()).unwrap_or(path).display().to_string()
}

/// One fenced code block.
#[derive(Debug)]
struct Block {
    /// Where it is: `FILE:LINE` of its opening fence.
    place: String,
    /// The info string's first word (`sh`, `toml`, …).
    language: String,
    /// Whether the info string says `no-run`.
    no_run: bool,
    /// Its lines, without the fence's indentation.
    body: String,
}

/// Every ```` ``` ```` block of `text`, indented ones (in a list) included.
fn blocks(file: &Path, text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<(Block, usize)> = None;
    for (number, line) in text.lines().enumerate() {
        let indent = line.len() - line.trim_start().len();
        let trimmed = line.trim_start();
        match open.take() {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    let mut words = info.split([',', ' ']).filter(|word| !word.is_empty());
                    let language = words.next().unwrap_or("").to_owned();
                    let no_run = words.any(|word| word == "no-run" || word == "no_run");
                    let place = format!("{}:{}", shown(file), number + 1);
                    open = Some((Block { place, language, no_run, body: String::new() }, indent));
                }
            }
            Some((block, _)) if trimmed.starts_with("```") => blocks.push(block),
            Some((mut block, fence_indent)) => {
                let unindented = if line.len() >= fence_indent && line[..fence_indent].trim().is_empty() {
                    &line[fence_indent..]
                } else {
                    trimmed
                };
                block.body.push_str(unindented);
                block.body.push('\n');
                open = Some((block, fence_indent));
            }
        }
    }
    assert!(open.is_none(), "{}: a code block is never closed", shown(file));
    blocks
}

fn all_blocks() -> Vec<Block> {
    markdown_files().iter().flat_map(|file| blocks(file, &std::fs::read_to_string(file).unwrap())).collect()
}

fn is_shell(block: &Block) -> bool {
    matches!(block.language.as_str(), "sh" | "bash" | "console" | "shell")
}

/// A scratch directory with the stand-ins and the binary on `PATH`, and
/// `examples/` beside the commands, as in a checkout.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Scratch {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_subagents"), bin.join("subagents")).unwrap();
        for name in STAND_IN_COMMANDS {
            let script = bin.join(name);
            std::fs::write(&script, "#!/bin/sh\nexit 1\n").unwrap();
            std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        }
        let work = dir.path().join("work");
        std::fs::create_dir(&work).unwrap();
        std::os::unix::fs::symlink(project().join("examples"), work.join("examples")).unwrap();
        Scratch { dir }
    }

    fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// A command run in the work directory with a clean environment: the
    /// binary and the stand-ins first on `PATH`, a home of its own, the
    /// stand-in variables, no key or config of the person running the tests.
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        let path = format!("{}:{}", self.dir.path().join("bin").display(), std::env::var("PATH").unwrap_or_default());
        command
            .env_clear()
            .current_dir(self.work())
            .env("PATH", path)
            .env("HOME", self.dir.path())
            .env("LANG", "C.UTF-8");
        for name in STAND_IN_VARIABLES {
            command.env(name, format!("stand-in-{}", name.to_lowercase()));
        }
        command
    }
}

/// Runs a shell block as the docs show it.
fn run_shell(block: &Block) {
    let script = block
        .body
        .lines()
        .map(|line| line.replacen("cargo run --release -- ", "subagents ", 1))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        !script.lines().any(|line| line.trim_start().starts_with("cargo ")),
        "{}: a runnable block runs cargo; mark it ```sh,no-run",
        block.place
    );
    let scratch = Scratch::new();
    let output = run(scratch.command("bash").args(["-euo", "pipefail", "-c", &script]));
    assert!(
        output.status.success(),
        "{}: the block failed ({}):\n{script}\nstdout:\n{}\nstderr:\n{}",
        block.place,
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    );
}

/// `subagents [SUBCOMMAND…] --help`, asked once per subcommand.
fn help(subcommand: &[&str]) -> String {
    static SEEN: Mutex<BTreeMap<String, String>> = Mutex::new(BTreeMap::new());
    let key = subcommand.join(" ");
    if let Some(known) = SEEN.lock().unwrap().get(&key) {
        return known.clone();
    }
    let output = run(Command::new(env!("CARGO_BIN_EXE_subagents")).args(subcommand).arg("--help"));
    assert!(output.status.success(), "`subagents {key} --help` failed: {}", text(&output.stderr));
    let help = text(&output.stdout);
    SEEN.lock().unwrap().insert(key, help.clone());
    help
}

/// The subcommands a `--help` lists under `Commands:`.
fn subcommands(help: &str) -> BTreeSet<String> {
    help.lines()
        .skip_while(|line| !line.starts_with("Commands:"))
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// A placeholder the docs put where a word goes (`COMMAND`, `…`).
fn is_placeholder(word: &str) -> bool {
    word == "…" || word.chars().all(|c| c.is_ascii_uppercase() || c == '_')
}

/// Checks each `subagents` command of a block that is not run: the
/// subcommand exists and `--help` lists every flag given to it.
fn check_commands(block: &Block) {
    let text = block.body.replace("\\\n", " ");
    let mut lines: Vec<String> = Vec::new();
    for line in text.lines() {
        // An indented line continues the command above it (a synopsis).
        match lines.last_mut() {
            Some(previous) if line.starts_with(' ') && !line.trim().is_empty() => previous.push_str(line),
            _ => lines.push(line.to_owned()),
        }
    }
    for line in &lines {
        let line = line.split(" # ").next().unwrap_or("");
        let words: Vec<&str> = line.split_whitespace().collect();
        for (at, word) in words.iter().enumerate() {
            let starts_command = at == 0
                || ["&&", "||", ";", "&", "--", "|"].contains(&words[at - 1])
                || (words[at - 1].contains('=') && !words[at - 1].starts_with('-'));
            if *word == "subagents" && starts_command {
                check_command(block, &words[at + 1..]);
            }
        }
    }
}

fn check_command(block: &Block, words: &[&str]) {
    let words: Vec<&str> = words.iter().copied().take_while(|word| !["&&", "||", ";", "&"].contains(word)).collect();
    let top = help(&[]);
    let mut at = 0;
    // Flags before the subcommand are the top level's (`--otlp URL`).
    while at < words.len() && words[at].starts_with("--") {
        let flag = words[at].split('=').next().unwrap();
        assert!(top.contains(flag), "{}: `subagents` has no flag {flag}", block.place);
        at += if words[at].contains('=') { 1 } else { 2 };
    }
    let Some(subcommand) = words.get(at).copied() else { return };
    let mut helps = vec![top.clone()];
    if is_placeholder(subcommand) {
        // `subagents COMMAND … --flag`: some subcommand takes the flag.
        helps.extend(doors().iter().map(|name| help(&[name])));
    } else {
        assert!(
            subcommands(&top).contains(subcommand),
            "{}: `subagents {subcommand}` is not a subcommand",
            block.place
        );
        let sub_help = help(&[subcommand]);
        for nested in subcommands(&sub_help) {
            if words.contains(&nested.as_str()) {
                helps.push(help(&[subcommand, &nested]));
            }
        }
        helps.push(sub_help);
    }
    for word in &words[at..] {
        let flag = word.trim_matches(|c| c == '[' || c == ']').split('=').next().unwrap();
        if flag.starts_with("--") && flag.len() > 2 {
            assert!(
                helps.iter().any(|help| help.split([' ', ',', '\n']).any(|token| token == flag)),
                "{}: `subagents {subcommand}` has no flag {flag}",
                block.place
            );
        }
    }
}

#[test]
fn every_shell_block_of_the_readme_and_the_guide_runs_or_names_real_flags() {
    let blocks: Vec<Block> = all_blocks().into_iter().filter(is_shell).collect();
    assert!(blocks.iter().any(|block| !block.no_run), "no runnable shell block found: is the extractor broken?");
    let readme_main_job = "cargo run --release -- fanout examples/tasks.jsonl";
    assert!(
        blocks
            .iter()
            .any(|block| block.place.starts_with("README.md") && !block.no_run && block.body.contains(readme_main_job)),
        "the README runs `{readme_main_job}` as written"
    );
    for block in &blocks {
        if block.no_run {
            check_commands(block);
        } else {
            run_shell(block);
        }
    }
}

#[test]
fn every_toml_block_of_the_readme_and_the_guide_loads() {
    let scratch = Scratch::new();
    let mut files: Vec<(String, PathBuf)> = Vec::new();
    for (index, block) in all_blocks().iter().filter(|block| block.language == "toml" && !block.no_run).enumerate() {
        let file = scratch.work().join(format!("block-{index}.toml"));
        std::fs::write(&file, &block.body).unwrap();
        files.push((block.place.clone(), file));
    }
    assert!(files.len() >= 5, "only {} toml blocks found: is the extractor broken?", files.len());
    // The files the README and the guide send people to.
    for entry in std::fs::read_dir(project().join("examples/agents")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|extension| extension == "toml") {
            files.push((shown(&path), path));
        }
    }
    for (place, file) in files {
        let output =
            run(scratch.command(env!("CARGO_BIN_EXE_subagents")).args(["providers", "list", "--config"]).arg(&file));
        assert!(output.status.success(), "{place}: the configuration does not load: {}", text(&output.stderr));
    }
}

/// The configuration reference's keys, by kind: the first column of each
/// table under a `### `-heading naming kinds, in the section `## Keys of
/// each kind` of docs/src/configuration.md.
fn documented_keys() -> BTreeMap<String, BTreeSet<String>> {
    let reference = std::fs::read_to_string(project().join("docs/src/configuration.md")).unwrap();
    let section = reference.split("\n## Keys of each kind").nth(1).expect("the reference has `## Keys of each kind`");
    let section = section.split("\n## ").next().unwrap();
    let mut keys: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut kinds: Vec<String> = Vec::new();
    for line in section.lines() {
        if let Some(heading) = line.strip_prefix("### ") {
            kinds = heading.split('`').skip(1).step_by(2).map(str::to_owned).collect();
        } else if let Some(row) = line.strip_prefix("| `") {
            let key = row.split('`').next().unwrap().to_owned();
            for kind in &kinds {
                keys.entry(kind.clone()).or_default().insert(key.clone());
            }
        }
    }
    keys
}

/// A line setting `key` to a value it takes, on a provider of `kind`.
fn sample(kind: &str, key: &str) -> String {
    // The worktree keys apply only with a worktree per run.
    if ["acp", "process"].contains(&kind)
        && ["repo", "base", "branch", "worktree_root", "keep_worktrees"].contains(&key)
    {
        let value = match key {
            "base" => "\"main\"",
            "branch" => "\"agents/{task}\"",
            "keep_worktrees" => "true",
            _ => "\"/tmp\"",
        };
        return format!("workspace = \"worktree\"\n{key} = {value}");
    }
    // Elsewhere a sample value, refused for the key itself.
    if ["repo", "base", "worktree_root"].contains(&key) {
        return format!("{key} = \"/tmp\"");
    }
    if key == "branch" {
        return "branch = \"agents/{task}\"".to_owned();
    }
    let value = match (kind, key) {
        (_, "workspace") => "\"worktree\"",
        ("remote", "pool") => "\"default\"",
        ("acp", "pool") => return "reuse = \"pooled\"\npool = { size = 1 }".to_owned(),
        (_, "pool") => "{ size = 1 }",
        (_, "model") => "\"scripted\"",
        (_, "tools") => "[\"read_file\"]",
        (_, "approve") => "[\"subagent\"]",
        (_, "max_depth" | "max_steps" | "max_tokens" | "structured_nudge_retries" | "seed") => "2",
        (_, "persona") => "\"terse\"",
        (_, "budget") => "{ runs = 5 }",
        (_, "mcp_servers" | "args" | "patches" | "faults") => "[]",
        (_, "reply") => "\"ok\"",
        (_, "echo_prompt" | "keep_run_dirs" | "keep_worktrees") => "true",
        (_, "stop_reason") => "\"completed\"",
        (_, "command") => "\"sh\"",
        // `keep_run_dirs`, `template_dir` and `run_dir_root` need a `{run_dir}`.
        ("acp", "env") => "{ WORK = \"{run_dir}\" }",
        (_, "env") => "{ GREETING = \"hello\" }",
        (_, "inherit_env") => "[\"LANG\"]",
        (_, "cwd" | "template_dir" | "run_dir_root") => "\"/tmp\"",
        (_, "permission") => "\"allow\"",
        (_, "permission_rules") => "[{ kind = \"read\", permission = \"allow\" }]",
        (_, "reuse") => "\"per_run\"",
        (_, "bin") => "\"/bin/sh\"",
        // Any file: it is read only by the child, when it starts.
        (_, "config") => "\"/bin/sh\"",
        (_, "profile") => "\"default\"",
        (_, "home") => "\"/tmp/subagents-docs-check\"",
        (_, "nats") => "\"nats://127.0.0.1:4222\"",
        (_, "url") => "\"http://127.0.0.1:9\"",
        (_, "headers") => "{ X-Team = \"docs\" }",
        (_, "skill") => "\"review\"",
        (_, "wraps") => "\"inner\"",
        // Every other key of the reference is a duration.
        (_, "delay") => "\"10ms\"",
        _ if ["timeout", "grace", "patience", "_wait", "_ttl"].iter().any(|end| key.ends_with(end)) => "\"1s\"",
        _ => panic!("the reference lists `{key}` for `{kind}`: give it a sample value here"),
    };
    format!("{key} = {value}")
}

/// What a provider of `kind` must have to load at all.
fn baseline(kind: &str) -> &'static [&'static str] {
    match kind {
        "acp" => &["command", "env"],
        "remote" => &["nats"],
        "a2a" => &["url"],
        "chaos" => &["wraps"],
        _ => &[],
    }
}

/// A file with one provider of `kind`: its baseline keys and `key`.
fn provider_file(kind: &str, key: Option<&str>) -> String {
    let mut file = format!("[providers.inner]\nkind = \"mock\"\n\n[providers.checked]\nkind = \"{kind}\"\n");
    for needed in baseline(kind).iter().copied().chain(key.filter(|key| !baseline(kind).contains(key))) {
        file.push_str(&sample(kind, needed));
        file.push('\n');
    }
    file
}

#[test]
fn the_configuration_reference_lists_exactly_the_keys_each_kind_takes() {
    let documented = documented_keys();
    let kinds = ["spawn", "fork", "mock", "acp", "process", "remote", "a2a", "chaos"];
    assert_eq!(
        documented.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        kinds.into_iter().collect(),
        "the kinds the reference covers"
    );
    let every_key: BTreeSet<&str> = documented.values().flatten().map(String::as_str).collect();
    for kind in kinds {
        Config::parse(&provider_file(kind, None), "baseline.toml")
            .unwrap_or_else(|error| panic!("a `{kind}` provider with only its needed keys does not load: {error}"));
        for &key in &every_key {
            let file = provider_file(kind, Some(key));
            let loaded = Config::parse(&file, "reference.toml");
            if documented[kind].contains(key) {
                loaded.unwrap_or_else(|error| {
                    panic!("the reference lists `{key}` for `{kind}`, but it does not load: {error}\n{file}")
                });
            } else {
                let error = loaded.err().unwrap_or_else(|| {
                    panic!("`{key}` loads on a `{kind}` provider: list it under `{kind}` in docs/src/configuration.md")
                });
                assert!(
                    error.message().contains(key),
                    "`{key}` on a `{kind}` provider is refused for another reason: {error}"
                );
            }
        }
    }
    // A key the loader takes that the reference does not list at all.
    let error = Config::parse("[providers.checked]\nkind = \"mock\"\nno_such_key = 1\n", "unknown.toml").unwrap_err();
    assert!(error.message().contains("no_such_key"), "an unknown key is refused by name: {error}");
    // Each kind's keys as its home reads them, against the reference.
    for kind in subagents::config::Kind::all() {
        let loaded: BTreeSet<&str> = kind.keys().into_iter().collect();
        let listed: BTreeSet<&str> =
            documented[kind.name()].iter().map(String::as_str).filter(|key| *key != "kind").collect();
        assert_eq!(loaded, listed, "the `{}` kind's keys against docs/src/configuration.md", kind.name());
    }
}

/// GitHub's and mdBook's anchor of a heading: lower case, letters, digits,
/// `-` and `_` kept, spaces made `-`, the rest dropped.
fn anchor(heading: &str) -> String {
    let mut plain = String::new();
    let mut rest = heading;
    // A link's text stays, its target goes.
    while let Some(open) = rest.find("](") {
        plain.push_str(&rest[..open]);
        rest = rest[open..].split_once(')').map_or("", |(_, after)| after);
    }
    plain.push_str(rest);
    plain
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The text of a markdown file with its `{{#include}}`s (mdBook) read in.
fn expanded(file: &Path) -> String {
    let text = std::fs::read_to_string(file).unwrap_or_else(|error| panic!("{}: {error}", shown(file)));
    text.lines()
        .map(|line| match line.trim().strip_prefix("{{#include ").and_then(|rest| rest.strip_suffix("}}")) {
            Some(included) => expanded(&file.parent().unwrap().join(included.trim())),
            None => line.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The anchors of a file's headings (outside code blocks).
fn anchors(file: &Path) -> BTreeSet<String> {
    let mut in_code = false;
    let mut anchors = BTreeSet::new();
    for line in expanded(file).lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            anchors.insert(anchor(line.trim_start_matches('#')));
        }
    }
    anchors
}

/// The targets of a file's links (`[text](target)` and `[label]: target`),
/// outside code blocks and code spans, each with its line.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut in_code = false;
    let mut links = Vec::new();
    for (number, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join("");
        let mut rest = prose.as_str();
        while let Some(open) = rest.find("](") {
            let after = &rest[open + 2..];
            let target = after.split(')').next().unwrap_or("");
            links.push((number + 1, target.split_whitespace().next().unwrap_or("").to_owned()));
            rest = after;
        }
        if let Some((_, target)) = prose.trim_start().strip_prefix('[').and_then(|rest| rest.split_once("]: ")) {
            links.push((number + 1, target.trim().to_owned()));
        }
    }
    links
}

#[test]
fn every_relative_link_and_anchor_of_the_readme_and_the_guide_leads_somewhere() {
    let mut checked = 0;
    for file in markdown_files() {
        for (line, target) in links(&std::fs::read_to_string(&file).unwrap()) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = target.split_once('#').unwrap_or((&target, ""));
            let linked = if path.is_empty() { file.clone() } else { file.parent().unwrap().join(path) };
            let place = format!("{}:{line}", shown(&file));
            assert!(linked.exists(), "{place}: {target} leads to no file");
            if !fragment.is_empty() {
                assert!(
                    anchors(&linked).contains(fragment),
                    "{place}: {target}: no heading of {} has the anchor #{fragment}",
                    shown(&linked)
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 50, "only {checked} links found: is the extractor broken?");
}

#[test]
fn the_link_checker_finds_links_and_anchors_as_github_makes_them() {
    assert_eq!(
        anchor(" §7.1 Child environment and the dispose ladder (acp and process)"),
        "71-child-environment-and-the-dispose-ladder-acp-and-process"
    );
    assert_eq!(anchor(" `spawn`, `fork`"), "spawn-fork");
    assert_eq!(
        anchor(" Rate limits are shared per route, per process"),
        "rate-limits-are-shared-per-route-per-process"
    );
    let found = links("see [a](a.md#x) and `[not](code.md)`\n```\n[no](in-block.md)\n```\n[label]: b.md\n");
    assert_eq!(found, vec![(1, "a.md#x".to_owned()), (5, "b.md".to_owned())]);
}

/// The subcommands a person runs (`help` aside).
fn doors() -> Vec<String> {
    subcommands(&help(&[])).into_iter().filter(|name| name != "help").collect()
}

#[test]
fn every_subcommand_has_its_place_in_the_guide_and_every_flag_is_documented() {
    let summary = std::fs::read_to_string(project().join("docs/src/SUMMARY.md")).unwrap();
    let command_line = std::fs::read_to_string(project().join("docs/src/command-line.md")).unwrap();
    let places: Vec<String> = summary
        .lines()
        .filter_map(|line| {
            line.split_once('[').and_then(|(_, rest)| rest.split_once(']')).map(|(title, _)| title.to_owned())
        })
        .chain(command_line.lines().filter_map(|line| line.strip_prefix("## ")).map(str::to_lowercase))
        .collect();
    let guide: String = markdown_files().iter().map(|file| std::fs::read_to_string(file).unwrap()).collect();
    let doors = doors();
    assert!(doors.len() >= 8, "`subagents --help` lists {doors:?}");
    for door in &doors {
        assert!(
            places.iter().any(|place| place.split_whitespace().next() == Some(door.as_str())),
            "`subagents {door}` has no chapter in docs/src/SUMMARY.md and no section in command-line.md"
        );
        let sub_help = help(&[door]);
        let flags = sub_help.split([' ', ',', '\n', '[', ']']).filter_map(|token| {
            let name: String =
                token.strip_prefix("--")?.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '-').collect();
            (!name.is_empty()).then(|| format!("--{name}"))
        });
        for flag in flags {
            let flag = flag.as_str();
            let documented = guide
                .match_indices(flag)
                .any(|(at, _)| !guide[at + flag.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-'));
            assert!(
                documented || flag == "--help",
                "`subagents {door} {flag}` is in --help but nowhere in the README or the guide"
            );
        }
    }
}

#[test]
fn every_json_block_of_the_readme_and_the_guide_is_json() {
    let blocks: Vec<Block> = all_blocks().into_iter().filter(|block| block.language == "json").collect();
    assert!(!blocks.is_empty(), "no json block found: is the extractor broken?");
    for block in blocks {
        if let Err(error) = serde_json::from_str::<serde_json::Value>(&block.body) {
            panic!("{}: not JSON: {error}", block.place);
        }
    }
}

/// The keys of each table under `## Other tables` of the reference, by the
/// table's name as a file spells it (`models.NAME`, `tool`).
fn documented_tables() -> BTreeMap<String, BTreeSet<String>> {
    let reference = std::fs::read_to_string(project().join("docs/src/configuration.md")).unwrap();
    let section = reference.split("\n## Other tables").nth(1).expect("the reference has `## Other tables`");
    let section = section.split("\n## ").next().unwrap();
    let mut tables: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut table = String::new();
    for line in section.lines() {
        if let Some(heading) = line.strip_prefix("### `[").and_then(|rest| rest.split_once("]`")) {
            table = heading.0.to_owned();
        } else if let Some(row) = line.strip_prefix("| `") {
            tables.entry(table.clone()).or_default().insert(row.split('`').next().unwrap().to_owned());
        }
    }
    tables
}

#[test]
fn the_configuration_reference_lists_exactly_the_keys_of_the_other_tables() {
    let tables = documented_tables();
    assert_eq!(
        tables.keys().map(String::as_str).collect::<Vec<_>>(),
        ["approvals", "mcp_servers.NAME", "models.NAME", "tool"]
    );
    for (table, documented) in tables {
        let header = table.replace("NAME", "checked");
        let error = Config::parse(&format!("[{header}]\nno_such_key = 1\n"), "table.toml").unwrap_err();
        let accepted: BTreeSet<String> = error
            .message()
            .split_once(" takes ")
            .unwrap_or_else(|| panic!("[{header}]: an unknown key's error names the accepted ones: {error}"))
            .1
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect();
        assert_eq!(
            documented, accepted,
            "[{table}]: the keys docs/src/configuration.md lists (left) and the loader takes (right)"
        );
    }
}
