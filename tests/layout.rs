//! The layout docs/ARCHITECTURE.md describes, checked: every arrow between the library's files (a `use` or a
//! path naming an item of another file) goes down the layer order listed under "Dependency direction", no files
//! import each other around a loop, no source file grows past 600 lines, and ARCHITECTURE past 400.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

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
    sources(&root().join("src"), &mut files);
    assert!(files.len() > 20, "found {} source files", files.len());
    files
}

/// The library's and the binary's sources (`src/`, `cli/src/`).
fn all_sources() -> Vec<PathBuf> {
    let mut files = src();
    sources(&root().join("cli/src"), &mut files);
    files
}

/// A file's module path: `src/lease/bucket.rs` is `lease::bucket`, `src/store/mod.rs` is `store`, `src/lib.rs`
/// is the root (empty).
fn module_of(relative: &str) -> Vec<String> {
    let stem = relative.strip_suffix(".rs").expect(".rs");
    let mut path: Vec<String> = stem.split('/').map(str::to_owned).collect();
    if path.last().is_some_and(|last| last == "mod" || last == "lib") {
        path.pop();
    }
    path
}

/// The code of a file without its comments (docs included: an intra-doc link is not an import), its string
/// literals' contents, or its unit tests (everything from the first `#[cfg(test)]` on).
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or_default();
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '/' if chars.peek() == Some(&'/') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        out.push('\n');
                        break;
                    }
                }
            }
            '"' => {
                let mut escaped = false;
                for c in chars.by_ref() {
                    if !escaped && c == '"' {
                        break;
                    }
                    escaped = !escaped && c == '\\';
                }
                out.push_str("\"\"");
            }
            _ => out.push(c),
        }
    }
    out
}

/// The paths of a `use` tree (`a::{b, c::{d as e}}` is `a::b` and `a::c::d`), `self` folded into its parent.
fn expand(tree: &str) -> Vec<Vec<String>> {
    fn go(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
        let tree = tree.trim();
        if tree.is_empty() {
            return;
        }
        if let Some(open) = tree.find('{') {
            let head: Vec<String> = tree[..open]
                .split("::")
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            let inner = &tree[open + 1..tree.rfind('}').expect("closing brace")];
            let mut depth = 0;
            let mut start = 0;
            let full: Vec<String> = prefix.iter().cloned().chain(head).collect();
            for (i, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        go(&full, &inner[start..i], out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            go(&full, &inner[start..], out);
            return;
        }
        let tree = tree.split(" as ").next().unwrap_or_default();
        let mut path: Vec<String> = prefix.to_vec();
        for segment in tree.split("::").map(str::trim).filter(|s| !s.is_empty()) {
            if segment != "self" || path.is_empty() {
                path.push(segment.to_owned());
            }
        }
        out.push(path);
    }
    let mut out = Vec::new();
    go(&[], tree, &mut out);
    out
}

/// One file: its module path, its `use` paths and the `crate::`/`super::`/`self::` paths in its code, and the
/// child modules it declares.
struct File {
    module: Vec<String>,
    is_module_root: bool,
    uses: Vec<(Vec<String>, bool)>,
    paths: Vec<Vec<String>>,
    children: BTreeSet<String>,
}

fn parse(relative: &str, text: &str) -> File {
    let code = code(text);
    let is_module_root = relative.ends_with("mod.rs") || relative == "lib.rs";
    let mut uses = Vec::new();
    let mut rest = String::new();
    let mut children = BTreeSet::new();
    for statement in code.split_inclusive(';') {
        let trimmed = statement.trim_start();
        let (public, body) = match trimmed.find("use ") {
            Some(at) if trimmed[..at].trim().is_empty() => (false, &trimmed[at + 4..]),
            Some(at) if trimmed[..at].trim().starts_with("pub") && !trimmed[..at].contains('{') => {
                (true, &trimmed[at + 4..])
            }
            _ => {
                // `mod name;` declares a child; `#[cfg(..)] mod name;` too.
                let words: Vec<&str> = trimmed.split_whitespace().collect();
                if let Some(i) = words.iter().position(|w| *w == "mod") {
                    if let Some(name) = words.get(i + 1).and_then(|n| n.strip_suffix(';')) {
                        children.insert(name.to_owned());
                    }
                }
                rest.push_str(statement);
                continue;
            }
        };
        for path in expand(body.trim_end_matches(';')) {
            uses.push((path, public));
        }
    }
    let mut paths = Vec::new();
    let bytes = rest.as_bytes();
    for start in ["crate::", "super::", "self::"] {
        for (at, _) in rest.match_indices(start) {
            if at > 0 && (bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_' || bytes[at - 1] == b':') {
                continue;
            }
            let path: Vec<String> = rest[at..]
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .next()
                .unwrap_or_default()
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            paths.push(path);
        }
    }
    File {
        module: module_of(relative),
        is_module_root,
        uses,
        paths,
        children,
    }
}

/// `path` as seen from `file`, made absolute (from the crate root); `None` for another crate's path.
fn absolute(file: &File, path: &[String]) -> Option<Vec<String>> {
    let first = path.first()?;
    // The module a `super` or `self` is relative to: a module root's own, another file's parent's.
    let mut base = file.module.clone();
    let rest = match first.as_str() {
        "crate" => {
            base.clear();
            &path[1..]
        }
        "self" => &path[1..],
        "super" => {
            let mut rest = path;
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
            rest
        }
        child if file.children.contains(child) => path,
        _ => return None,
    };
    Some(base.into_iter().chain(rest.iter().cloned()).collect())
}

/// The library, parsed: its files by path (relative to `src/`), which file is each module, and the re-exports
/// (`pub use`, any visibility) of each module by the name they export.
struct Crate {
    files: BTreeMap<String, File>,
    modules: BTreeMap<Vec<String>, String>,
    exports: BTreeMap<(Vec<String>, String), Vec<String>>,
}

impl Crate {
    fn load() -> Self {
        let dir = root().join("src");
        let mut files = BTreeMap::new();
        for path in src() {
            let relative = path
                .strip_prefix(&dir)
                .expect("under src")
                .to_string_lossy()
                .replace('\\', "/");
            // Test modules and their files are not the layout.
            if relative.starts_with("store/tests/") || relative.ends_with("tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("read");
            files.insert(relative.clone(), parse(&relative, &text));
        }
        let modules = files.iter().map(|(name, f)| (f.module.clone(), name.clone())).collect();
        let mut exports = BTreeMap::new();
        for file in files.values() {
            for (path, public) in &file.uses {
                if let (true, Some(target), Some(name)) = (*public, absolute(file, path), path.last()) {
                    exports.insert((file.module.clone(), name.clone()), target);
                }
            }
        }
        Self {
            files,
            modules,
            exports,
        }
    }

    /// The file that defines what `path` (absolute) names: the deepest module file on the path, followed
    /// through re-exports (at most 16 of them).
    fn file_of(&self, path: &[String]) -> Option<String> {
        let mut path = path.to_vec();
        for _ in 0..16 {
            let depth = (0..=path.len())
                .rev()
                .find(|&n| self.modules.contains_key(&path[..n]))?;
            let module = &path[..depth];
            match path
                .get(depth)
                .and_then(|name| self.exports.get(&(module.to_vec(), name.clone())))
            {
                Some(target) if *target != path => {
                    let mut next = target.clone();
                    next.extend(path[depth + 1..].iter().cloned());
                    path = next;
                }
                _ => return self.modules.get(module).cloned(),
            }
        }
        None
    }

    /// Every arrow: (from, to, the path that makes it), between two different files.
    fn arrows(&self) -> BTreeSet<(String, String, String)> {
        let mut arrows = BTreeSet::new();
        for (name, file) in &self.files {
            let named = file.uses.iter().map(|(p, _)| p).chain(&file.paths);
            for path in named {
                let Some(target) = absolute(file, path).and_then(|p| self.file_of(&p)) else {
                    continue;
                };
                if &target != name && target != "lib.rs" {
                    arrows.insert((name.clone(), target, path.join("::")));
                }
            }
        }
        arrows
    }
}

/// The layers of docs/ARCHITECTURE.md's "Dependency direction" block: module paths separated by `→` (down to
/// up), those of one layer by commas.
fn layers() -> Vec<Vec<Vec<String>>> {
    let doc = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let section = doc.split("## Dependency direction").nth(1).expect("the section");
    let block = section
        .split("```text")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("its text block");
    block
        .split('→')
        .map(|layer| {
            layer
                .split(',')
                .map(|m| m.trim().split("::").map(str::to_owned).collect::<Vec<_>>())
                .filter(|m| m.iter().all(|s| !s.is_empty()))
                .collect::<Vec<_>>()
        })
        .filter(|layer| !layer.is_empty())
        .collect()
}

/// The layer of a module: the one listing the longest prefix of its path.
fn layer_of(layers: &[Vec<Vec<String>>], module: &[String]) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for (i, layer) in layers.iter().enumerate() {
        for listed in layer {
            if module.starts_with(listed) && best.is_none_or(|(len, _)| listed.len() > len) {
                best = Some((listed.len(), i));
            }
        }
    }
    best.map(|(_, i)| i)
}

#[test]
fn every_arrow_goes_down_the_listed_layers() {
    let krate = Crate::load();
    let layers = layers();
    assert!(layers.len() >= 10, "the listed order: {layers:?}");
    let mut wrong = Vec::new();
    for (name, file) in &krate.files {
        // The crate root and the declaration-only module roots (`lease/mod.rs`) sit outside the layers.
        let listed = layer_of(&layers, &file.module);
        if listed.is_none() && !file.module.is_empty() && !(file.is_module_root && file.uses.is_empty()) {
            wrong.push(format!("{name} is in no listed layer"));
        }
    }
    for (from, to, path) in krate.arrows() {
        let (Some(a), Some(b)) = (
            layer_of(&layers, &krate.files[&from].module),
            layer_of(&layers, &krate.files[&to].module),
        ) else {
            continue;
        };
        if b > a {
            wrong.push(format!("{from} (layer {a}) uses {path} of {to} (layer {b})"));
        }
    }
    assert!(
        wrong.is_empty(),
        "arrows against docs/ARCHITECTURE.md's order:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn no_files_import_each_other_around_a_loop() {
    let krate = Crate::load();
    let arrows = krate.arrows();
    let mut next: BTreeMap<&str, Vec<(&str, &str)>> = BTreeMap::new();
    for (from, to, path) in &arrows {
        next.entry(from).or_default().push((to, path));
    }
    // A depth-first search from every file, reporting the first loop found with the paths that make it.
    fn visit<'a>(
        at: &'a str,
        next: &BTreeMap<&'a str, Vec<(&'a str, &'a str)>>,
        stack: &mut Vec<(&'a str, &'a str)>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<String> {
        if let Some(i) = stack.iter().position(|(file, _)| *file == at) {
            let loop_: Vec<String> = stack[i..].iter().map(|(f, p)| format!("{f} --{p}-->")).collect();
            return Some(format!("{} {at}", loop_.join(" ")));
        }
        if !done.insert(at) {
            return None;
        }
        for (to, path) in next.get(at).into_iter().flatten() {
            stack.push((at, path));
            if let Some(found) = visit(to, next, stack, done) {
                return Some(found);
            }
            stack.pop();
        }
        None
    }
    let mut done = BTreeSet::new();
    let loops: Vec<String> = (krate.files.keys())
        .filter_map(|file| visit(file, &next, &mut Vec::new(), &mut done))
        .collect();
    assert!(loops.is_empty(), "files importing each other:\n{}", loops.join("\n"));
}

#[test]
fn the_checks_see_arrows_and_loops() {
    // What the two tests rest on, on a made-up pair: braces, `self`, `as`, `super` and child paths are read.
    let a = parse(
        "x/mod.rs",
        "mod y;\nuse crate::b::{self, c::{D as E}};\npub use y::Z;\nfn f() { crate::q::r(); }\n",
    );
    assert_eq!(
        a.uses.iter().map(|(p, _)| p.join("::")).collect::<Vec<_>>(),
        ["crate::b", "crate::b::c::D", "y::Z"]
    );
    assert_eq!(a.paths, [vec!["crate".to_owned(), "q".to_owned(), "r".to_owned()]]);
    assert_eq!(
        absolute(&a, &["y".into(), "Z".into()]),
        Some(vec!["x".into(), "y".into(), "Z".into()])
    );
    let child = parse(
        "x/y.rs",
        "use super::W; // crate::not::this\nconst S: &str = \"crate::nor::this\";\n",
    );
    assert_eq!(absolute(&child, &child.uses[0].0), Some(vec!["x".into(), "W".into()]));
    assert!(child.paths.is_empty(), "{:?}", child.paths);
    // The real crate: the lease engine uses the fallback, the in-process store's buckets the `MemoryStore` of
    // their module root and the hash's fields, the Redis connections and the eviction watch the store's target;
    // re-exports are followed to the defining file (`crate::Error` is `error.rs`).
    let arrows = Crate::load().arrows();
    let has = |from: &str, to: &str| arrows.iter().any(|(f, t, _)| f == from && t == to);
    assert!(has("lease/engine.rs", "fallback.rs") && has("store/memory/bucket.rs", "store/memory.rs"));
    assert!(has("store/memory/bucket.rs", "store/memory/hash.rs"));
    assert!(has("rule/mod.rs", "error.rs"));
    assert!(has("store/connect.rs", "store/target.rs") && has("store/eviction.rs", "store/target.rs"));
}

#[test]
fn no_source_file_is_over_600_lines() {
    for path in all_sources() {
        let lines = std::fs::read_to_string(&path).expect("read").lines().count();
        assert!(lines <= 600, "{} has {lines} lines", path.display());
    }
}

#[test]
fn the_architecture_reads_in_an_hour() {
    // An introduction, not a log: history goes to docs/BENCHMARKS.md and CHANGELOG.md.
    let doc = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let lines = doc.lines().count();
    assert!(lines <= 400, "docs/ARCHITECTURE.md has {lines} lines, at most 400");
}
