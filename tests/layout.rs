//! The layout docs/ARCHITECTURE.md describes, checked: leaves import nothing above them, and no source file
//! grows past 600 lines.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The library's sources (`src/`).
fn src() -> Vec<PathBuf> {
    let mut files = Vec::new();
    sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut files);
    assert!(files.len() > 20, "found {} source files", files.len());
    files
}

/// The library's and the binary's sources (`src/`, `cli/src/`).
fn all_sources() -> Vec<PathBuf> {
    let mut files = src();
    sources(&Path::new(env!("CARGO_MANIFEST_DIR")).join("cli/src"), &mut files);
    files
}

/// The modules of the crate a file uses (`crate::name`), comments and docs included.
fn uses(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).expect("read");
    let mut used: Vec<String> = text
        .match_indices("crate::")
        .map(|(i, _)| {
            text[i + 7..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect();
    used.sort();
    used.dedup();
    used
}

#[test]
fn leaves_import_nothing_above_them() {
    for path in src() {
        let name = path.to_string_lossy().replace('\\', "/");
        let used = uses(&path);
        let forbidden: &[&str] = if name.contains("/src/algorithm/") {
            &["*"]
        } else if name.ends_with("/src/error.rs") || name.ends_with("/src/clock.rs") {
            &["config", "limiter", "rule", "store", "lease"]
        } else if name.ends_with("/src/config.rs") || name.contains("/src/rule/") {
            &["limiter", "store", "lease", "queue", "fallback"]
        } else if name.contains("/src/store/") && !name.contains("/src/store/tests/") {
            &["limiter", "lease", "queue", "fallback", "compiled"]
        } else {
            &[]
        };
        for module in &used {
            assert!(
                !forbidden.contains(&"*") && !forbidden.contains(&module.as_str()),
                "{name} uses crate::{module}"
            );
        }
    }
}

#[test]
fn no_source_file_is_over_600_lines() {
    for path in all_sources() {
        let lines = std::fs::read_to_string(&path).expect("read").lines().count();
        assert!(lines <= 600, "{} has {lines} lines", path.display());
    }
}
