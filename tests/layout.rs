//! The suite's layout holds: cargo builds only the `[[test]]` roots
//! (`autotests = false`), so a test file no root names would never be
//! built, its tests silently skipped.

use std::path::Path;

/// The `name`s of the `[[test]]` targets in the manifest.
fn test_targets(manifest: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut in_test = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_test = line == "[[test]]";
        } else if let Some(name) = line.strip_prefix("name = \"").filter(|_| in_test) {
            names.push(name.trim_end_matches('"').to_owned());
        }
    }
    names
}

#[test]
fn every_test_file_is_a_target_or_a_module_of_one() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let targets = test_targets(&std::fs::read_to_string(root.join("Cargo.toml")).unwrap());
    assert!(targets.iter().any(|name| name == "suite_core"), "{targets:?}");
    let declared: String = targets
        .iter()
        .filter_map(|name| std::fs::read_to_string(root.join("tests").join(format!("{name}.rs"))).ok())
        .collect();
    let mut unbuilt = Vec::new();
    for entry in std::fs::read_dir(root.join("tests")).unwrap().flatten() {
        let path = entry.path();
        let Some(stem) = path.file_stem().and_then(|stem| stem.to_str()) else { continue };
        if path.extension().is_some_and(|ext| ext == "rs")
            && !targets.iter().any(|name| name == stem)
            && !declared.lines().any(|line| line.trim() == format!("mod {stem};"))
        {
            unbuilt.push(stem.to_owned());
        }
    }
    assert!(unbuilt.is_empty(), "tests/*.rs files no [[test]] root names as a module: {unbuilt:?}");
}

/// A source file's module path from the crate root: `src/agent/turn.rs`
/// is `agent::turn`, `src/lib.rs` (or a binary's `main.rs`) the root.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).unwrap().with_extension("");
    let mut path: Vec<String> = relative.iter().map(|part| part.to_string_lossy().into_owned()).collect();
    if path.last().is_some_and(|last| last == "mod" || last == "lib" || last == "main") {
        path.pop();
    }
    path
}

/// The file a module path names: its longest prefix that is a file.
fn file_of(src: &Path, path: &[String]) -> Option<std::path::PathBuf> {
    (1..=path.len()).rev().find_map(|len| {
        let joined: std::path::PathBuf = path[..len].iter().collect();
        [src.join(&joined).with_extension("rs"), src.join(&joined).join("mod.rs")]
            .into_iter()
            .find(|file| file.is_file())
    })
}

/// Every `crate::…`, `super::…` and `self::…` path in `text` (comments
/// left out), and each `use CHILD::…` of a module this file declares, as
/// module paths from the crate root.
fn paths_used(text: &str, module: &[String]) -> Vec<Vec<String>> {
    let code: String =
        text.lines().filter(|line| !line.trim_start().starts_with("//")).map(|line| format!("{line}\n")).collect();
    let children: Vec<&str> = code
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            let rest =
                line.strip_prefix("pub(crate) mod ").or(line.strip_prefix("pub mod ")).or(line.strip_prefix("mod "))?;
            rest.strip_suffix(';')
        })
        .collect();
    let mut paths = Vec::new();
    let bytes = code.as_bytes();
    let ident = |i: usize| bytes.get(i).is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_');
    let mut at = 0;
    while at < code.len() {
        let starts_word = at == 0 || !ident(at - 1) && bytes[at - 1] != b':';
        let word_end = (at..code.len()).find(|&i| !ident(i)).unwrap_or(code.len());
        if !starts_word || word_end == at {
            at += 1;
            continue;
        }
        let word = &code[at..word_end];
        let mut base: Option<Vec<String>> = match word {
            "crate" => Some(Vec::new()),
            "super" => Some(module[..module.len().saturating_sub(1)].to_vec()),
            "self" => Some(module.to_vec()),
            child if children.contains(&child) && code[..at].trim_end().ends_with("use") => {
                let mut path = module.to_vec();
                path.push(child.to_owned());
                Some(path)
            }
            _ => None,
        };
        let mut end = word_end;
        if let Some(path) = base.as_mut() {
            while code[end..].starts_with("::") {
                let segment_end = (end + 2..code.len()).find(|&i| !ident(i)).unwrap_or(code.len());
                if segment_end == end + 2 {
                    break;
                }
                match &code[end + 2..segment_end] {
                    "super" => drop(path.pop()),
                    segment => path.push(segment.to_owned()),
                }
                end = segment_end;
            }
            paths.push(path.clone());
        }
        at = end.max(at + 1);
    }
    paths
}

/// The first circle of `edges`, if there is one.
fn circle<N: Clone + Ord>(edges: &std::collections::BTreeMap<N, std::collections::BTreeSet<N>>) -> Option<Vec<N>> {
    fn visit<N: Clone + Ord>(
        node: &N,
        edges: &std::collections::BTreeMap<N, std::collections::BTreeSet<N>>,
        done: &mut std::collections::BTreeSet<N>,
        trail: &mut Vec<N>,
    ) -> Option<Vec<N>> {
        if let Some(start) = trail.iter().position(|seen| seen == node) {
            return Some(trail[start..].to_vec());
        }
        if done.contains(node) {
            return None;
        }
        trail.push(node.clone());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, edges, done, trail) {
                return Some(found);
            }
        }
        trail.pop();
        done.insert(node.clone());
        None
    }
    let mut done = std::collections::BTreeSet::new();
    edges.keys().find_map(|node| visit(node, edges, &mut done, &mut Vec::new()))
}

/// Each file's arrows in the crate rooted at `src` (the library's `src`,
/// or a binary's folder under `src/bin`, which is a crate of its own): to
/// the files whose items it names, its own ancestors left out (a child may
/// always use what its parent declares), and the same arrows between the
/// crate's top-level modules.
fn import_arrows(
    src: &Path,
) -> (
    std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
    std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) {
    let src = src.to_path_buf();
    let mut files = Vec::new();
    let mut dirs = vec![src.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() && path != src.join("bin") {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    let name = |file: &Path| file.strip_prefix(&src).unwrap().display().to_string();
    let mut by_file = std::collections::BTreeMap::<String, std::collections::BTreeSet<String>>::new();
    let mut by_room = std::collections::BTreeMap::<String, std::collections::BTreeSet<String>>::new();
    for file in &files {
        let module = module_of(&src, file);
        let ancestors: Vec<std::path::PathBuf> =
            (0..=module.len()).filter_map(|len| file_of(&src, &module[..len])).collect();
        for path in paths_used(&std::fs::read_to_string(file).unwrap(), &module) {
            let Some(target) = file_of(&src, &path) else { continue };
            if ancestors.contains(&target) || target.ends_with("lib.rs") || target.ends_with("main.rs") {
                continue;
            }
            by_file.entry(name(file)).or_default().insert(name(&target));
            let (from, to) = (module.first(), path.first());
            if let (Some(from), Some(to)) = (from, to) {
                if from != to {
                    by_room.entry(from.clone()).or_default().insert(to.clone());
                }
            }
        }
    }
    (by_file, by_room)
}

#[test]
fn no_import_circle_runs_through_the_library_between_files_or_between_top_level_modules() {
    let (by_file, by_room) = import_arrows(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    assert!(
        by_file.get("tool/subagent.rs").is_some_and(|to| to.contains("actors.rs")),
        "the reader sees arrows: {by_file:?}"
    );
    assert_eq!(circle(&by_file), None, "files that import each other in a circle");
    assert_eq!(circle(&by_room), None, "top-level modules that import each other in a circle");
}

#[test]
fn no_import_circle_runs_through_the_command_line_binary() {
    let (by_file, by_room) = import_arrows(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src/bin/subagents"));
    assert!(
        by_file.get("commands/fanout.rs").is_some_and(|to| to.contains("commands/ui.rs")),
        "the reader sees arrows: {by_file:?}"
    );
    assert_eq!(circle(&by_file), None, "files that import each other in a circle");
    assert_eq!(circle(&by_room), None, "top-level modules that import each other in a circle");
}

#[test]
fn the_circle_finder_finds_a_circle_and_passes_a_line() {
    let edges = |pairs: &[(&str, &str)]| {
        let mut edges = std::collections::BTreeMap::<String, std::collections::BTreeSet<String>>::new();
        for (from, to) in pairs {
            edges.entry((*from).to_owned()).or_default().insert((*to).to_owned());
        }
        edges
    };
    assert_eq!(circle(&edges(&[("a", "b"), ("b", "c"), ("a", "c")])), None);
    let found = circle(&edges(&[("a", "b"), ("b", "c"), ("c", "a")])).unwrap();
    assert_eq!(found.len(), 3, "{found:?}");
    let module = vec!["config".to_owned(), "build".to_owned()];
    let used = paths_used("use super::values::{expand};\nuse crate::agent::Model;\n// crate::x\n", &module);
    assert_eq!(used, [vec!["config".to_owned(), "values".to_owned()], vec!["agent".to_owned(), "Model".to_owned()]]);
}

/// Whether each module on `path` below the root is declared `pub mod` by
/// its parent: a path a user of the crate could name too.
fn public_all_the_way(src: &Path, path: &[String]) -> bool {
    let Some(file) = file_of(src, path) else { return true };
    let depth = module_of(src, &file).len();
    (1..=depth).all(|len| {
        let parent = file_of(src, &path[..len - 1]).unwrap_or_else(|| src.join("lib.rs"));
        let text = std::fs::read_to_string(parent).unwrap();
        text.lines().any(|line| line.trim() == format!("pub mod {};", path[len - 1]))
    })
}

#[test]
fn the_doors_of_serve_reach_providers_only_through_what_the_crate_makes_public() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![src.join("serve.rs")];
    let mut dirs = vec![src.join("serve")];
    while let Some(dir) = dirs.pop() {
        for path in std::fs::read_dir(&dir).unwrap().flatten().map(|entry| entry.path()) {
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                files.push(path);
            }
        }
    }
    let mut private = Vec::new();
    for file in &files {
        let module = module_of(&src, file);
        for path in paths_used(&std::fs::read_to_string(file).unwrap(), &module) {
            if path.first().is_some_and(|room| room == "providers") && !public_all_the_way(&src, &path) {
                private.push(format!("{}: {}", file.strip_prefix(&src).unwrap().display(), path.join("::")));
            }
        }
    }
    assert!(private.is_empty(), "serve/ reaches into crate-private modules of providers: {private:#?}");
    // The check sees such a path: the modules the wire types left.
    assert!(!public_all_the_way(&src, &["providers".into(), "a2a".into(), "client".into()]));
    assert!(public_all_the_way(&src, &["providers".into(), "process".into(), "ConfigError".into()]));
}
