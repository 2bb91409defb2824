//! Worktrees per run (`workspace = "worktree"`) and `subagents merge`, on
//! throwaway repositories: a shell stand-in ACP agent edits files in its
//! working directory (disjoint files, one file two ways, nothing, a crash,
//! a deleted `.git`), `fanout` runs it, and the tests read the branches,
//! the results lines, the merge report, and the user's checkout, which
//! must be byte for byte what it was.

mod links;
mod merge_again;
mod merge_input;
mod private;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::common;

/// git in `dir`, which must succeed; its trimmed stdout. No optional
/// locks: the test's own `status` must not refresh the user's index.
fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_OPTIONAL_LOCKS", "0")
        .output()
        .expect("git is installed (the workspace tests need it: apt-get install git)");
    assert!(output.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).trim_end().to_owned()
}

/// A repository at `<dir>/repo` with two committed files, on `main`.
fn repository(dir: &Path) -> PathBuf {
    let repo = dir.join("repo");
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "--quiet", "--initial-branch=main"]);
    git(&repo, &["config", "user.name", "Test User"]);
    git(&repo, &["config", "user.email", "test@example.invalid"]);
    std::fs::write(repo.join("README.md"), "a project\n").unwrap();
    std::fs::write(repo.join("notes.txt"), "one\ntwo\n").unwrap();
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "--quiet", "-m", "start"]);
    repo
}

/// Everything of the user's checkout a run could change: every file
/// outside `.git` with its bytes, `git status`, `HEAD`, the current
/// branch and the index file.
#[derive(Debug, PartialEq, Eq)]
struct Checkout {
    files: BTreeMap<PathBuf, Vec<u8>>,
    status: String,
    head: String,
    branch: String,
    index: Vec<u8>,
}

fn checkout(repo: &Path) -> Checkout {
    let mut files = BTreeMap::new();
    let mut dirs = vec![repo.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.file_name().is_some_and(|name| name == ".git") {
                continue;
            }
            if entry.file_type().unwrap().is_dir() {
                dirs.push(path);
            } else {
                files.insert(path.strip_prefix(repo).unwrap().to_owned(), std::fs::read(&path).unwrap());
            }
        }
    }
    Checkout {
        files,
        status: git(repo, &["status", "--porcelain", "--untracked-files=all"]),
        head: git(repo, &["rev-parse", "HEAD"]),
        branch: git(repo, &["symbolic-ref", "HEAD"]),
        index: std::fs::read(repo.join(".git/index")).unwrap(),
    }
}

/// The stand-in agent: answers `initialize` and `session/new`, then does
/// what its prompt says in its working directory and ends its turn:
/// `write FILE TEXT`, `where` (its `{worktree}` argument and its working
/// directory into `where.txt`), `unlink-git FILE` (deletes `.git`, then
/// writes), `switch FILE` (checks out a new branch in its worktree, then
/// writes), `crash FILE` (writes half, exits 3), `fill-then-write BALLAST
/// FILE` (fills BALLAST's disk, then writes 64 KiB of noise to FILE), `crash-once FILE` (the
/// first time as `crash`, later as `write FILE done`), `link-away DIR`
/// (puts a link to DIR, given a copy of its `.git`, in place of its
/// worktree), `link-batch DIR` (the same with its batch's directory, DIR
/// given a directory named like its worktree), `link-root DIR` (moves the
/// worktrees' root away and puts a link to DIR in its place), anything
/// else: nothing.
fn stand_in(dir: &Path) -> PathBuf {
    let script = format!(
        r#"#!/bin/sh
where=$1
take() {{
  read -r line || exit 0
  id=$(printf '%s' "$line" | sed -E 's/.*"id":("[^"]*"|[0-9]+).*/\1/')
}}
answer() {{
  printf '{{"jsonrpc":"2.0","id":%s,"result":%s}}\n' "$id" "$1"
}}
take
answer '{{"protocolVersion":1,"agentCapabilities":{{}}}}'
take
answer '{{"sessionId":"s'$$'"}}'
take
task=$(printf '%s' "$line" | sed -E 's/.*"text":"([^"]*)".*/\1/')
set -- $task
case $1 in
  write) printf '%s\n' "$3" > "$2" ;;
  where) {{ printf '%s\n' "$where"; pwd -P; }} > where.txt ;;
  unlink-git) rm -rf .git; printf 'still committed\n' > "$2" ;;
  switch) git checkout --quiet -b elsewhere; printf 'on my branch\n' > "$2" ;;
  crash) printf 'half\n' > "$2"; exit 3 ;;
  fill-then-write) cat /dev/urandom > "$2" 2>/dev/null; head -c 65536 /dev/urandom > "$3" ;;
  crash-once)
    if [ -e '{marker}' ]; then printf 'done\n' > "$2"; else : > '{marker}'; printf 'half\n' > "$2"; exit 3; fi ;;
  link-away) w=$(pwd -P); cp .git "$2/.git"; cd ..; rm -rf "$w"; ln -s "$2" "$w" ;;
  link-batch)
    w=$(pwd -P); b=$(dirname "$w"); mkdir -p "$2/${{w##*/}}"; cp .git "$2/${{w##*/}}/.git"
    cd /; mv "$b" "$b.moved"; ln -s "$2" "$b" ;;
  link-root) r=$(dirname "$(dirname "$(pwd -P)")"); cd /; mv "$r" "$r.moved"; ln -s "$2" "$r" ;;
esac
answer '{{"stopReason":"end_turn"}}'
"#,
        marker = dir.join("crashed-once").display()
    );
    let path = dir.join("agent.sh");
    std::fs::write(&path, script).unwrap();
    path
}

/// A config with one provider, `coder`: the stand-in, a worktree per run
/// under `<dir>/worktrees`, plus `extra` keys.
fn config(dir: &Path, extra: &str) -> PathBuf {
    let path = dir.join("subagents.toml");
    let config = format!(
        r#"[providers.coder]
kind = "acp"
command = "/bin/sh"
args = ["{agent}", "{{worktree}}"]
workspace = "worktree"
worktree_root = "{root}"
dispose_eof_grace = "300ms"
dispose_grace = "300ms"
{extra}
"#,
        agent = stand_in(dir).display(),
        root = dir.join("worktrees").display(),
    );
    std::fs::write(&path, config).unwrap();
    path
}

/// `fanout` of `tasks` (`(id, prompt)`) on `coder`, from `repo`, into
/// `<dir>/results.jsonl`, with `flags`.
fn fanout(dir: &Path, repo: &Path, tasks: &[(&str, &str)], flags: &[&str]) -> Output {
    let lines: String =
        tasks.iter().map(|(id, prompt)| format!("{}\n", serde_json::json!({"id": id, "prompt": prompt}))).collect();
    std::fs::write(dir.join("tasks.jsonl"), lines).unwrap();
    let mut command = subagents(repo);
    command.arg("fanout").arg(dir.join("tasks.jsonl")).args(["--provider", "coder", "--out"]);
    command.arg(dir.join("results.jsonl")).arg("--config").arg(dir.join("subagents.toml"));
    command.arg("--home").arg(dir.join("home")).args(flags);
    common::output_within(&mut command, common::WAIT_LIMIT, "subagents fanout")
}

fn subagents(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_subagents"));
    command.env_remove("SUBAGENTS_HOME").env_remove("SUBAGENTS_CONFIG").env_remove("RUST_LOG").current_dir(dir);
    command
}

/// `subagents merge <dir>/results.jsonl flags…` in `repo`.
fn merge(dir: &Path, repo: &Path, flags: &[&str]) -> Output {
    let mut command = subagents(repo);
    command.arg("merge").arg(dir.join("results.jsonl")).args(flags);
    common::output_within(&mut command, common::WAIT_LIMIT, "subagents merge")
}

/// The results file's lines by task id.
fn results(dir: &Path) -> BTreeMap<String, Value> {
    let text = std::fs::read_to_string(dir.join("results.jsonl")).unwrap();
    text.lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .map(|line| (line["id"].as_str().unwrap().to_owned(), line))
        .collect()
}

/// The results line of task `id`.
fn lines_of(dir: &Path, id: &str) -> Value {
    results(dir).remove(id).unwrap()
}

/// The merge report's outcome of each task.
fn outcomes(report: &Value) -> BTreeMap<String, String> {
    let tasks = report["tasks"].as_array().unwrap();
    tasks
        .iter()
        .map(|task| (task["id"].as_str().unwrap().to_owned(), task["outcome"].as_str().unwrap().to_owned()))
        .collect()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// No worktree but the user's is registered, and none is left on disk.
fn no_worktree_left(dir: &Path, repo: &Path) {
    let listed = git(repo, &["worktree", "list", "--porcelain"]);
    assert_eq!(listed.matches("worktree ").count(), 1, "only the user's checkout: {listed}");
    let root = dir.join("worktrees");
    let left: Vec<PathBuf> = std::fs::read_dir(&root)
        .map(|entries| entries.flatten().map(|entry| entry.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "worktree directories left: {left:?}");
}

#[test]
fn each_run_works_on_its_own_branch_and_merge_reports_what_merged_and_what_conflicted() {
    let dir = tempfile::tempdir().unwrap();
    let dir = &dir.path().canonicalize().unwrap();
    let repo = repository(dir);
    config(dir, "");
    let before = checkout(&repo);
    let base = before.head.clone();
    let tasks = [
        ("a", "write a.txt alpha"),
        ("b", "write b.txt beta"),
        ("c", "write shared.txt from-c"),
        ("d", "write shared.txt from-d"),
        ("e", "nothing"),
        ("f", "crash partial.txt"),
        ("g", "where"),
    ];
    let output = fanout(dir, &repo, &tasks, &[]);
    // A failed run is a result, not a failed batch.
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let lines = results(dir);
    for (id, _) in tasks {
        let workspace = &lines[id]["workspace"];
        assert_eq!(workspace["branch"], format!("subagents/results/{id}"), "{}", lines[id]);
        assert_eq!(workspace["base"], base.as_str());
        assert!(workspace.get("worktree").is_none() && workspace.get("error").is_none(), "{workspace}");
    }
    // What each run left is a commit on its branch, named after its task.
    assert_eq!(git(&repo, &["show", "subagents/results/a:a.txt"]), "alpha");
    assert_eq!(git(&repo, &["show", "subagents/results/d:shared.txt"]), "from-d");
    let a = &lines["a"]["workspace"];
    assert_eq!(a["commit"], git(&repo, &["rev-parse", "subagents/results/a"]).as_str());
    assert_eq!(
        (&a["files_changed"], &a["insertions"], &a["deletions"]),
        (&Value::from(1), &Value::from(1), &Value::from(0))
    );
    assert_eq!(
        git(&repo, &["log", "-1", "--format=%an|%s", "subagents/results/a"]),
        "subagents task a|subagents: the work of task a"
    );
    // Nothing to commit: said so, the branch still at its base.
    assert_eq!(lines["e"]["workspace"]["commit"], Value::Null);
    assert_eq!(lines["e"]["workspace"]["files_changed"], 0);
    assert_eq!(git(&repo, &["rev-parse", "subagents/results/e"]), base);
    // A crash keeps its branch, with what it had written.
    assert_eq!(lines["f"]["stop_reason"], "error");
    assert_eq!(git(&repo, &["show", "subagents/results/f:partial.txt"]), "half");
    // `{worktree}` was the child's working directory.
    let whereabouts = git(&repo, &["show", "subagents/results/g:where.txt"]);
    let (argument, cwd) = whereabouts.split_once('\n').unwrap();
    assert_eq!(argument, cwd, "the {{worktree}} argument is the working directory");
    assert!(Path::new(cwd).starts_with(dir.join("worktrees")), "{cwd}");
    assert_eq!(checkout(&repo), before, "the user's checkout is untouched");
    no_worktree_left(dir, &repo);

    // The merge: in task order, in a scratch worktree; d conflicts with c.
    let output = merge(dir, &repo, &["--json"]);
    assert_eq!(output.status.code(), Some(1), "a merge conflicted: {}", text(&output.stderr));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let expected = [
        ("a", "merged"),
        ("b", "merged"),
        ("c", "merged"),
        ("d", "conflict"),
        ("e", "empty"),
        ("f", "failed-run"),
        ("g", "merged"),
    ];
    assert_eq!(
        outcomes(&report),
        expected.iter().map(|(id, outcome)| ((*id).to_owned(), (*outcome).to_owned())).collect()
    );
    let conflict = report["tasks"].as_array().unwrap().iter().find(|task| task["id"] == "d").unwrap();
    assert_eq!(conflict["files"], serde_json::json!(["shared.txt"]));
    assert!(conflict["hunks"].as_str().unwrap().contains("from-d"), "{conflict}");
    assert_eq!(
        (&report["result_branch"], &report["moved"]),
        (&Value::from("subagents/results.merged"), &Value::from(false))
    );
    let merged = "subagents/results.merged";
    assert_eq!(git(&repo, &["show", &format!("{merged}:shared.txt")]), "from-c");
    assert_eq!(git(&repo, &["show", &format!("{merged}:b.txt")]), "beta");
    assert_eq!(checkout(&repo), before, "merging never touches the user's checkout");
    no_worktree_left(dir, &repo);

    let output = merge(dir, &repo, &["--only", "a,zz"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("no task with a branch has id zz"), "{}", text(&output.stderr));

    // Again, as a table: it picks up where it stopped.
    let output = merge(dir, &repo, &[]);
    assert_eq!(output.status.code(), Some(1));
    let table = text(&output.stdout);
    assert!(
        table.lines().any(|line| line.starts_with("d ") && line.contains("conflict") && line.contains("shared.txt")),
        "{table}"
    );
    assert!(table.lines().any(|line| line.starts_with("a ") && line.contains("already-merged")), "{table}");
    assert!(table.contains("main not moved"), "{table}");

    // d's branch fixed (it agrees with c now): merged into a branch no
    // worktree has, which moves, as every merge it includes succeeded.
    let fix = dir.join("fix");
    git(&repo, &["worktree", "add", "--quiet", &fix.to_string_lossy(), "subagents/results/d"]);
    std::fs::write(fix.join("shared.txt"), "from-c\n").unwrap();
    git(&fix, &["commit", "--quiet", "-am", "agree with c"]);
    git(&repo, &["worktree", "remove", &fix.to_string_lossy()]);
    git(&repo, &["branch", "integration", &base]);
    let output = merge(dir, &repo, &["--json", "--into", "integration"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stdout));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(outcomes(&report)["d"], "merged");
    assert_eq!(outcomes(&report)["a"], "already-merged");
    assert_eq!(report["moved"], true);
    assert_eq!(git(&repo, &["rev-parse", "integration"]), report["commit"].as_str().unwrap());
    assert_eq!(checkout(&repo), before);
    no_worktree_left(dir, &repo);
}

#[test]
fn twenty_runs_at_once_each_get_their_branch_and_leave_no_worktree() {
    let dir = tempfile::tempdir().unwrap();
    let dir = &dir.path().canonicalize().unwrap();
    let repo = repository(dir);
    config(dir, "");
    let before = checkout(&repo);
    let ids: Vec<String> = (0..20).map(|n| format!("t{n}")).collect();
    let prompts: Vec<String> = (0..20).map(|n| format!("write file{n}.txt value{n}")).collect();
    let tasks: Vec<(&str, &str)> =
        ids.iter().zip(&prompts).map(|(id, prompt)| (id.as_str(), prompt.as_str())).collect();
    let output = fanout(dir, &repo, &tasks, &["--concurrency", "20"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let lines = results(dir);
    for n in 0..20 {
        assert_eq!(lines[&format!("t{n}")]["stop_reason"], "completed", "{}", lines[&format!("t{n}")]);
        let branch = format!("subagents/results/t{n}");
        assert_eq!(git(&repo, &["show", &format!("{branch}:file{n}.txt")]), format!("value{n}"));
        let changed = git(&repo, &["diff", "--name-only", &before.head, &branch]);
        assert_eq!(changed, format!("file{n}.txt"), "only its own file on its branch");
    }
    assert_eq!(checkout(&repo), before);
    no_worktree_left(dir, &repo);
    // Squashed into a branch no worktree has: one plain commit per task.
    git(&repo, &["branch", "integration", &before.head]);
    let output = merge(dir, &repo, &["--squash", "--json", "--into", "integration"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stdout));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(outcomes(&report).values().all(|outcome| outcome == "merged"), "{report}");
    let range = format!("{}..integration", before.head);
    assert_eq!(git(&repo, &["rev-list", "--count", &range]), "20");
    assert_eq!(git(&repo, &["rev-list", "--count", "--merges", &range]), "0");
    assert_eq!(git(&repo, &["show", "integration:file19.txt"]), "value19");
    assert_eq!(checkout(&repo), before);
    no_worktree_left(dir, &repo);
}

#[test]
fn odd_task_ids_become_valid_branches_and_two_that_collide_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let dir = &dir.path().canonicalize().unwrap();
    let repo = repository(dir);
    config(dir, "");
    let before = checkout(&repo);
    let tasks = [("fix login", "write one.txt 1"), ("fix-login", "write two.txt 2"), ("..odd/ü", "write three.txt 3")];
    let output = fanout(dir, &repo, &tasks, &["--concurrency", "1"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let lines = results(dir);
    assert_eq!(lines["fix login"]["workspace"]["branch"], "subagents/results/fix-login");
    let refused = lines["fix-login"].to_string();
    assert!(refused.contains("both make branch") && refused.contains("fix login"), "{refused}");
    assert_eq!(lines["..odd/ü"]["workspace"]["branch"], "subagents/results/__odd--");
    assert_eq!(git(&repo, &["show", "subagents/results/__odd--:three.txt"]), "3");
    assert_eq!(checkout(&repo), before);
    no_worktree_left(dir, &repo);
}

#[test]
fn a_child_that_deletes_its_git_file_or_switches_branch_still_has_its_work_committed_on_its_own_branch() {
    let dir = tempfile::tempdir().unwrap();
    let dir = &dir.path().canonicalize().unwrap();
    let repo = repository(dir);
    config(dir, "");
    let before = checkout(&repo);
    let tasks = [("rogue", "unlink-git kept.txt"), ("switcher", "switch mine.txt")];
    let output = fanout(dir, &repo, &tasks, &[]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(git(&repo, &["show", "subagents/results/rogue:kept.txt"]), "still committed");
    // A child that checked out another branch in its worktree: its work is
    // still committed on its own branch, not on the one it switched to.
    assert_eq!(git(&repo, &["show", "subagents/results/switcher:mine.txt"]), "on my branch");
    assert_eq!(git(&repo, &["rev-parse", "elsewhere"]), before.head);
    assert_eq!(git(&repo, &["rev-parse", "main"]), before.head, "nothing landed on the user's branch");
    assert_eq!(checkout(&repo), before);
    no_worktree_left(dir, &repo);
}

#[test]
fn a_batch_run_again_is_refused_its_branches_and_a_resume_takes_each_up_once() {
    let dir = tempfile::tempdir().unwrap();
    let dir = &dir.path().canonicalize().unwrap();
    let repo = repository(dir);
    config(dir, "");
    let before = checkout(&repo);
    let tasks = [("x", "crash-once x.txt"), ("y", "write y.txt why")];
    let output = fanout(dir, &repo, &tasks, &[]);
    assert_eq!(lines_of(dir, "x")["stop_reason"], "error", "{}", text(&output.stderr));
    assert_eq!(git(&repo, &["show", "subagents/results/x:x.txt"]), "half");
    // The failed run is run again on the branch it left: one branch, two commits.
    let output = fanout(dir, &repo, &tasks, &["--resume", "--rerun-failed"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(git(&repo, &["show", "subagents/results/x:x.txt"]), "done");
    assert_eq!(git(&repo, &["rev-list", "--count", &format!("{}..subagents/results/x", before.head)]), "2");
    assert_eq!(git(&repo, &["branch", "--list", "subagents/results/x*"]).lines().count(), 1);
    // The same batch afresh finds its branches taken.
    fanout(dir, &repo, &tasks, &[]);
    let refused = results(dir)["y"].to_string();
    assert!(refused.contains("exists already"), "{refused}");
    assert_eq!(checkout(&repo), before);
    no_worktree_left(dir, &repo);
}

#[test]
fn a_provider_outside_a_repository_or_on_a_dirty_checkout_is_refused_before_any_run() {
    let dir = tempfile::tempdir().unwrap();
    let dir = &dir.path().canonicalize().unwrap();
    let plain = dir.join("plain");
    std::fs::create_dir(&plain).unwrap();
    config(dir, "");
    let output = fanout(dir, &plain, &[("a", "write a.txt 1")], &[]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("not a git repository"), "{}", text(&output.stderr));
    assert_eq!(std::fs::read_dir(&plain).unwrap().count(), 0, "nothing written there");

    let repo = repository(dir);
    std::fs::write(repo.join("notes.txt"), "changed, not committed\n").unwrap();
    let before = checkout(&repo);
    let output = fanout(dir, &repo, &[("a", "write a.txt 1")], &[]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    let said = text(&output.stderr);
    assert!(said.contains("uncommitted changes") && said.contains("notes.txt"), "{said}");
    assert_eq!(checkout(&repo), before, "the dirty checkout is left as it was");
    // A named base is a commit, chosen knowingly: the runs go ahead from it.
    config(dir, "base = \"main\"");
    let output = fanout(dir, &repo, &[("a", "write a.txt 1")], &[]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(git(&repo, &["show", "subagents/results/a:notes.txt"]), "one\ntwo");
    assert_eq!(checkout(&repo), before);
    no_worktree_left(dir, &repo);
}

#[test]
fn a_process_child_runs_in_its_worktree_with_it_in_its_environment_and_its_work_is_committed() {
    use subagents::providers::{ProcessConfig, ProcessProvider};
    use subagents::seam::BatchTask;
    use subagents::workspace::{WorkspaceConfig, Workspaces};

    let dir = tempfile::tempdir().unwrap();
    let dir = &dir.path().canonicalize().unwrap();
    let repo = repository(dir);
    // The child is `/bin/sh serve --home …` in its working directory: the
    // repository carries the stand-in, so every worktree has it.
    let serve = r#"id_of() { printf '%s' "$1" | sed -E 's/.*"id":("[^"]*"|[0-9]+).*/\1/'; }
read -r line
printf '%s\n' '{"jsonrpc":"2.0","id":1,"result":{"protocol_version":1,"session_id":"sh"}}'
read -r line
{ printf '%s\n' "$WHERE"; pwd -P; } > where.txt
printf '{"jsonrpc":"2.0","id":%s,"result":{"reason":"completed"}}\n' "$(id_of "$line")"
read -r line
printf '{"jsonrpc":"2.0","id":%s,"result":{"runs":[]}}\n' "$(id_of "$line")"
"#;
    std::fs::write(repo.join("serve"), serve).unwrap();
    git(&repo, &["add", "serve"]);
    git(&repo, &["commit", "--quiet", "-m", "the stand-in child"]);
    let before = checkout(&repo);
    let runtime = common::runtime_at(&dir.join("home"));
    let mut config = ProcessConfig::new("coder", dir.join("children"));
    config.bin = PathBuf::from("/bin/sh");
    config.env = vec![("WHERE".to_owned(), "{worktree}".to_owned())];
    let mut workspace = WorkspaceConfig::new(&repo);
    workspace.root = Some(dir.join("worktrees"));
    config.workspace = Some(runtime.block_on(Workspaces::open(workspace)).unwrap());
    let subagents = runtime.subagents();
    subagents.register_provider(ProcessProvider::new(config).unwrap()).unwrap().keep();
    let mut request = common::request_in("go", dir);
    request.task = Some(BatchTask { batch: "lib".to_owned(), id: "p1".to_owned(), resumed: false });
    let result = common::lifecycle(&runtime, &subagents, "coder", request);
    assert_eq!(result.stop_reason, subagents::StopReason::Completed, "{result:?}");
    let workspace = result.workspace.expect("the result names its branch");
    assert_eq!((workspace.branch.as_str(), workspace.files_changed), ("subagents/lib/p1", 1));
    assert_eq!(workspace.commit.as_deref(), Some(git(&repo, &["rev-parse", "subagents/lib/p1"]).as_str()));
    let whereabouts = git(&repo, &["show", "subagents/lib/p1:where.txt"]);
    let (variable, cwd) = whereabouts.split_once('\n').unwrap();
    assert_eq!(variable, cwd, "{{worktree}} in env is the working directory");
    assert!(Path::new(cwd).starts_with(dir.join("worktrees")), "{cwd}");
    assert_eq!(checkout(&repo), before);
    no_worktree_left(dir, &repo);
}

#[test]
fn worktree_keys_are_refused_where_they_cannot_apply_naming_the_key() {
    let error = |extra: &str| {
        let file = format!("[providers.coder]\nkind = \"acp\"\ncommand = \"sh\"\n{extra}\n");
        subagents::config::Config::parse(&file, "wrong.toml").map(drop).expect_err(&file).to_string()
    };
    let said = error("base = \"main\"");
    assert!(said.contains("`base` applies to a worktree per run: add workspace = \"worktree\""), "{said}");
    let said = error("workspace = \"worktree\"\nreuse = \"pooled\"");
    assert!(said.contains("needs reuse = \"per-run\""), "{said}");
    let said = error("workspace = \"worktree\"\nbranch = \"agents/{batch}\"");
    assert!(said.contains("`branch` must name `{task}`"), "{said}");
    let said = error("workspace = \"copy\"");
    assert!(said.starts_with("wrong.toml:4:13:") && said.contains("`copy`") && said.contains("`worktree`"), "{said}");
}

#[test]
fn a_repository_on_a_full_disk_refuses_the_run_or_keeps_its_worktree_saying_why() {
    let disk = common::small_disk::SmallDisk::mount(4 * 1024 * 1024);
    let repo = repository(disk.path());
    let dir = tempfile::tempdir().unwrap();
    let dir = &dir.path().canonicalize().unwrap();
    config(dir, "");
    let before = checkout(&repo);
    // No room for a worktree's administration: the run is refused, and no
    // branch is left to be found taken later.
    disk.fill();
    let output = fanout(dir, &repo, &[("a", "write a.txt 1")], &[]);
    let line = lines_of(dir, "a").to_string();
    // git's own words name the file it could not write.
    let refused = line.contains("worktree could not be made") && line.contains("couldn't write");
    assert!(refused && line.contains(&*repo.to_string_lossy()), "{line} {}", text(&output.stderr));
    assert_eq!(git(&repo, &["branch", "--list", "subagents/*"]), "");
    disk.free();
    // Room again; then a child fills the disk before its work is committed.
    let ballast = disk.join("ballast-of-the-child");
    let fill = format!("fill-then-write {} big.bin", ballast.display());
    let output = fanout(dir, &repo, &[("a", "write a.txt 1"), ("big", &fill)], &["--concurrency", "1"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    let lines = results(dir);
    assert_eq!(git(&repo, &["show", "subagents/results/a:a.txt"]), "1");
    let big = &lines["big"]["workspace"];
    assert!(big["error"].as_str().is_some_and(|error| error.contains("No space left on device")), "{big}");
    assert_eq!(big["commit"], Value::Null);
    let kept = PathBuf::from(big["worktree"].as_str().unwrap());
    assert_eq!(std::fs::metadata(kept.join("big.bin")).unwrap().len(), 65536, "the work is kept where it was made");
    std::fs::remove_file(&ballast).unwrap();
    assert_eq!(checkout(&repo), before);
}

#[test]
fn a_resume_after_a_crash_takes_up_the_branch_and_worktree_the_crash_left() {
    let dir = tempfile::tempdir().unwrap();
    let dir = &dir.path().canonicalize().unwrap();
    let repo = repository(dir);
    config(dir, "");
    let before = checkout(&repo);
    let output = fanout(dir, &repo, &[("a", "write a.txt 1")], &[]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    // What a batch killed mid-run leaves: b's branch, checked out in its
    // worktree with the child's half-done work, and no result line for b.
    let left = dir.join("worktrees/results/b");
    git(&repo, &["worktree", "add", "--quiet", "-b", "subagents/results/b", &left.to_string_lossy(), &before.head]);
    std::fs::write(left.join("half.txt"), "begun\n").unwrap();
    let output = fanout(dir, &repo, &[("a", "write a.txt 1"), ("b", "write b.txt 2")], &["--resume"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output.stderr));
    assert_eq!(lines_of(dir, "b")["workspace"]["files_changed"], 2, "the crash's work and the resumed run's");
    assert_eq!(git(&repo, &["show", "subagents/results/b:half.txt"]), "begun");
    assert_eq!(git(&repo, &["show", "subagents/results/b:b.txt"]), "2");
    assert_eq!(git(&repo, &["branch", "--list", "subagents/results/b*"]).lines().count(), 1, "never a second branch");
    assert_eq!(checkout(&repo), before);
    no_worktree_left(dir, &repo);
}
