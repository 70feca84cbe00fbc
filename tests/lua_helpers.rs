//! The scripts' own parts, `lua/src/`, share their helpers from one source: `lua/lib/common.lua` (the integer
//! helpers, the ARGV reader, the clock, bans and a window's gate) goes in front of every script and
//! `lua/lib/bucket.lua` (the token bucket's hash) in front of every token script (`src/store/script.rs`, which also
//! writes the assembled `lua/NAME.lua`). These tests fail when a script defines again what a library holds, calls a
//! library it is not assembled with, reads the clock another way, or cites a file that does not exist. Reads the
//! scripts from the source tree; needs no Redis.

use std::fs;
use std::path::Path;

/// A library of `lua/lib/`: its file, the functions it defines, and which scripts it is put in front of.
type Lib = (&'static str, &'static [&'static str], fn(&str) -> bool);

/// The libraries of `lua/lib/`.
const LIBS: [Lib; 2] = [
    (
        "common.lua",
        &[
            "idiv",
            "cdiv",
            "int",
            "numbers",
            "now_of",
            "ban_left",
            "ban",
            "refused",
            "window_gate",
            "refuse_window",
        ],
        |_| true,
    ),
    (
        "bucket.lua",
        &[
            "gcd",
            "rescale",
            "load_bucket",
            "open_bucket",
            "refill_ms",
            "whole_tokens",
            "room_of",
            "take",
            "save_bucket",
            "note_room",
        ],
        |script| script.starts_with("token_"),
    ),
];

/// Files a header may cite before they exist in this tree: written in another branch.
const WRITTEN_ELSEWHERE: [&str; 1] = ["docs/ARCHITECTURE.md"];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every `lua/src/*.lua` (a script's own part) as (file name, text), sorted by name.
fn scripts() -> Vec<(String, String)> {
    let mut scripts: Vec<(String, String)> = fs::read_dir(root().join("lua/src"))
        .expect("lua/src/ is readable")
        .map(|entry| entry.expect("lua/src/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "lua"))
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
            (name, text)
        })
        .collect();
    scripts.sort();
    assert!(
        scripts.len() >= 8,
        "expected the 8 scripts of lua/src/, found {}",
        scripts.len()
    );
    scripts
}

/// Every `lua/lib/*.lua` as (file name, text).
fn libs() -> Vec<(String, String)> {
    LIBS.iter()
        .map(|(name, ..)| {
            let text =
                fs::read_to_string(root().join("lua/lib").join(name)).unwrap_or_else(|e| panic!("lib/{name}: {e}"));
            ((*name).to_owned(), text)
        })
        .collect()
}

/// A line without its comment (`--` outside a string literal).
fn code(line: &str) -> &str {
    let mut quote = None;
    let bytes = line.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        match quote {
            Some(q) if b == q => quote = None,
            Some(_) => {}
            None if b == b'\'' || b == b'"' => quote = Some(b),
            None if b == b'-' && bytes.get(i + 1) == Some(&b'-') => return &line[..i],
            None => {}
        }
    }
    line
}

/// The header: the comment lines the script opens with.
fn header(text: &str) -> Vec<&str> {
    text.lines().take_while(|line| line.starts_with("--")).collect()
}

/// The lines of `local function name(` up to its closing `end` (the same line for a one-line function), with the
/// index of its first line; `None` when the script does not define it. Panics on two definitions.
fn definition(script: &str, text: &str, name: &str) -> Option<(usize, String)> {
    let opening = format!("local function {name}(");
    let lines: Vec<&str> = text.lines().collect();
    let starts: Vec<usize> = (0..lines.len()).filter(|&i| lines[i].starts_with(&opening)).collect();
    assert!(starts.len() <= 1, "{script} defines {name} {} times", starts.len());
    let start = *starts.first()?;
    let end = if code(lines[start]).trim_end().ends_with(" end") {
        start
    } else {
        (start..lines.len())
            .find(|&i| lines[i] == "end")
            .unwrap_or_else(|| panic!("{script}: {name} has no closing `end` line"))
    };
    Some((start, block(&lines[start..=end])))
}

fn block(lines: &[&str]) -> String {
    lines.iter().map(|line| format!("{line}\n")).collect()
}

/// Whether the code of `lines` calls `name(` (not `x.name(` nor `other_name(`).
fn calls(lines: &[&str], name: &str) -> bool {
    let pattern = format!("{name}(");
    lines.iter().any(|line| {
        let line = code(line);
        line.match_indices(&pattern).any(|(i, _)| {
            let before = line[..i].chars().next_back();
            let is_call = !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.');
            is_call && !line[..i].ends_with("local function ")
        })
    })
}

fn check(failures: Vec<String>) {
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn each_helper_is_defined_once_in_its_library() {
    let mut failures = Vec::new();
    let libs = libs();
    for ((lib, names, _), (_, text)) in LIBS.iter().zip(&libs) {
        for name in *names {
            if definition(lib, text, name).is_none() {
                failures.push(format!("lua/lib/{lib} does not define {name}"));
            }
        }
    }
    for (script, text) in scripts() {
        for (lib, names, _) in LIBS {
            for name in names {
                if let Some((line, _)) = definition(&script, &text, name) {
                    failures.push(format!(
                        "lua/src/{script}:{}: defines {name} again; lua/lib/{lib} holds it",
                        line + 1
                    ));
                }
            }
        }
    }
    check(failures);
}

#[test]
fn a_script_calls_only_the_libraries_it_is_put_behind() {
    let mut failures = Vec::new();
    for (script, text) in scripts() {
        let lines: Vec<&str> = text.lines().collect();
        for (lib, names, put_in_front) in LIBS {
            for name in names.iter().filter(|name| calls(&lines, name)) {
                if !put_in_front(&script) {
                    failures.push(format!(
                        "lua/src/{script} calls {name} of lua/lib/{lib}, which src/store/script.rs does not put in \
                         front of it"
                    ));
                }
            }
        }
    }
    check(failures);
}

#[test]
fn the_clock_is_read_in_one_place() {
    let mut failures = Vec::new();
    let libs = libs();
    let times: usize = libs.iter().map(|(_, t)| t.matches("redis.call('TIME')").count()).sum();
    let in_now_of = definition("common.lua", &libs[0].1, "now_of").is_some_and(|(_, d)| d.contains("'TIME'"));
    if times != 1 || !in_now_of {
        failures.push(format!("lua/lib/ calls TIME {times} times; only now_of may, once"));
    }
    for (script, text) in scripts() {
        let lines: Vec<&str> = text.lines().collect();
        if text.contains("redis.call('TIME')") {
            failures.push(format!(
                "lua/src/{script} calls TIME; now_of (lua/lib/common.lua) reads the clock"
            ));
        }
        // A token script reads it through open_bucket (lua/lib/bucket.lua), with the same argument.
        let through_bucket = "  open_bucket(KEYS[1], capacity, rate, per, now_arg)";
        let Some(start) = (lines.iter()).position(|l| l.starts_with("local now =") || *l == through_bucket) else {
            // A script that never reads the time (`reset.lua`) takes no `now_ms`.
            if text.contains("now_ms") || calls(&lines, "now_of") {
                failures.push(format!("lua/src/{script} has no `local now = now_of(now_arg)`"));
            }
            continue;
        };
        if lines[start] != "local now = now_of(now_arg)" && lines[start] != through_bucket {
            failures.push(format!(
                "lua/src/{script}:{}: the clock is read as `local now = now_of(now_arg)` or by open_bucket",
                start + 1
            ));
        }
        // The argument index is the one difference: `local now_arg = N`, before it, N a header's now_ms.
        match lines[..start].iter().find_map(|l| l.strip_prefix("local now_arg = ")) {
            None => failures.push(format!(
                "lua/src/{script} has no `local now_arg = N` before reading the clock"
            )),
            Some(n) => {
                let cited = format!("-- ARGV[{}]", n.trim());
                let in_header = header(&text)
                    .iter()
                    .any(|l| l.starts_with(&cited) && l.contains("now_ms"));
                if !in_header {
                    failures.push(format!(
                        "lua/src/{script}: now_arg = {n} but the header has no `{cited}  now_ms`"
                    ));
                }
            }
        }
    }
    check(failures);
}

/// The scripts that share the token bucket's hash.
const TOKEN_SCRIPTS: [&str; 4] = [
    "token_bucket.lua",
    "token_return.lua",
    "token_acquire.lua",
    "token_lease.lua",
];

/// One bucket, one reading of it: every token script reads the bucket with `open_bucket` (which calls
/// `load_bucket`) and writes it with `save_bucket` of `lua/lib/bucket.lua` alone (invariant 11).
#[test]
fn token_scripts_read_convert_and_store_the_bucket_alike() {
    let mut failures = Vec::new();
    let all = scripts();
    for script in TOKEN_SCRIPTS {
        let Some((_, t)) = all.iter().find(|(n, _)| n == script) else {
            failures.push(format!("lua/src/{script} is missing"));
            continue;
        };
        // The bucket's fields are written by save_bucket alone, its notes of room by note_room (and their rooms by
        // token_return.lua's give-back); token_lease.lua also writes the bucket's turn.
        let other_writes = (t.lines())
            .filter(|l| {
                let l = code(l);
                l.contains("redis.call('HSET'") && !l.contains("'turn'") && !l.contains("'rooms'")
            })
            .count();
        if other_writes != 0 || !t.contains("save_bucket(KEYS[1]") || !t.contains("open_bucket(KEYS[1]") {
            failures.push(format!(
                "lua/src/{script} must read the bucket with open_bucket and write it only with save_bucket"
            ));
        }
    }
    check(failures);
}

#[test]
fn no_math_floor_outside_idiv() {
    let mut failures = Vec::new();
    for (script, text) in scripts().into_iter().chain(libs()) {
        let idiv = definition(&script, &text, "idiv").map(|(line, def)| line..line + def.lines().count());
        for (i, line) in text.lines().enumerate() {
            let inside_idiv = idiv.as_ref().is_some_and(|lines| lines.contains(&i));
            if !inside_idiv && code(line).contains("math.floor(") {
                failures.push(format!(
                    "lua/src/{script}:{}: math.floor outside idiv (use idiv): {line}",
                    i + 1
                ));
            }
        }
    }
    check(failures);
}

#[test]
fn headers_name_keys_argv_reply_and_cite_files_that_exist() {
    let mut failures = Vec::new();
    for (script, text) in scripts() {
        let head = header(&text);
        let joined = head.join("\n");
        for needed in ["KEYS[1]", "ARGV[1]", "Reply"] {
            if !joined.contains(needed) {
                failures.push(format!("lua/src/{script}: the header does not name {needed}"));
            }
        }
        // Every KEYS[n] and ARGV[n] the code uses is described in the header.
        for line in text.lines().skip(head.len()) {
            for table in ["KEYS[", "ARGV["] {
                for (i, _) in code(line).match_indices(table) {
                    let rest = &code(line)[i + table.len()..];
                    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
                    let used = format!("{table}{digits}]");
                    if !digits.is_empty() && !joined.contains(&used) {
                        failures.push(format!(
                            "lua/src/{script}: uses {used}, which its header does not describe"
                        ));
                    }
                }
            }
        }
        for path in cited_paths(&joined) {
            if !root().join(&path).exists() && !WRITTEN_ELSEWHERE.contains(&path.as_str()) {
                failures.push(format!(
                    "lua/src/{script}: the header cites {path}, which does not exist"
                ));
            }
        }
    }
    for (lib, text) in libs() {
        for path in cited_paths(&text) {
            if !root().join(&path).exists() {
                failures.push(format!("lua/lib/{lib} cites {path}, which does not exist"));
            }
        }
    }
    check(failures);
}

/// Repository paths a header cites: `src/…`, `lua/…`, `docs/…`, `tests/…` paths ending in .rs, .lua or .md; a
/// bare `name.lua` is `lua/name.lua`, a bare `NAME.md` is at the root.
fn cited_paths(header: &str) -> Vec<String> {
    let is_path_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/');
    let mut paths = Vec::new();
    for word in header.split(|c: char| !is_path_char(c)) {
        let word = word.trim_end_matches('.');
        if !(word.ends_with(".rs") || word.ends_with(".lua") || word.ends_with(".md")) {
            continue;
        }
        let path = match word.split_once('/') {
            Some(("lib", _)) => format!("lua/{word}"),
            Some(_) => word.to_owned(),
            None if word.ends_with(".lua") => format!("lua/{word}"),
            None if word.ends_with(".md") => word.to_owned(),
            None => continue,
        };
        paths.push(path);
    }
    paths
}

#[test]
fn the_checks_see_what_they_check() {
    // Guards the extraction itself, so that a broken parser cannot pass every script vacuously.
    let text = "-- h\n\nlocal function idiv(a, b)\n  x\nend\nlocal function int(x) return 1 end -- c\n\
                local y = idiv(1, 2) -- cdiv(3)\nlocal z = math.floor(1)\n";
    assert_eq!(
        definition("t", text, "idiv"),
        Some((2, "local function idiv(a, b)\n  x\nend\n".into()))
    );
    assert_eq!(definition("t", text, "int").map(|(line, _)| line), Some(5));
    assert_eq!(definition("t", text, "cdiv"), None);
    let lines: Vec<&str> = text.lines().collect();
    assert!(calls(&lines, "idiv"));
    assert!(!calls(&lines, "cdiv"), "a call in a comment is no call");
    assert!(!calls(&lines[..6], "idiv"), "a definition is no call");
    assert!(!calls(&["local f = math.floor(2)"], "floor"));
    assert_eq!(code("a('--', \"--\") -- c"), "a('--', \"--\") ");
    assert_eq!(
        cited_paths("-- Mirrors src/algorithm/window.rs. Same as token_bucket.lua; see README.md, docs/X.md"),
        [
            "src/algorithm/window.rs",
            "lua/token_bucket.lua",
            "README.md",
            "docs/X.md"
        ]
    );
}
