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
