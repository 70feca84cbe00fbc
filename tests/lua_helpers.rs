//! The helpers every script of `lua/` repeats (`idiv`, `cdiv`, `int` and the preamble that reads `now_ms`) stay
//! textually identical across scripts, and the scripts' headers cite only files of the repository.
//!
//! Redis runs each script on its own, so the helpers cannot be shared: they are copied, and these tests fail when
//! one copy drifts. Reads the scripts from the source tree; needs no Redis.

use std::fs;
use std::path::Path;

/// `floor(a / b)`, exact on integers below 2^53 (the only division of the scripts).
const IDIV: &str = "\
local function idiv(a, b) -- floor(a / b) for integers, b ≥ 1; exact while |a| < 2^53
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
";

const CDIV: &str = "\
local function cdiv(a, b) return idiv(a + b - 1, b) end -- ceil(a / b) for integers, b ≥ 1
";

const INT: &str = "\
local function int(x) return string.format('%.0f', x) end -- an integer as digits, never '1e+15'
";

/// The helpers, in the order a script defines those it uses, first thing after its header.
const HELPERS: [(&str, &str); 3] = [("idiv", IDIV), ("cdiv", CDIV), ("int", INT)];

/// `now_ms` from the optional last argument (its index is the script's `local now_arg = N`), else Redis' TIME.
const TIME_PREAMBLE: &str = "\
local now = tonumber(ARGV[now_arg]) -- now_ms when given, else the Redis server's TIME
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + idiv(tonumber(t[2]), 1000)
end
";

/// Files a header may cite before they exist in this tree: written in another branch.
const WRITTEN_ELSEWHERE: [&str; 1] = ["docs/ARCHITECTURE.md"];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every `lua/*.lua` as (file name, text), sorted by name.
fn scripts() -> Vec<(String, String)> {
    let mut scripts: Vec<(String, String)> = fs::read_dir(root().join("lua"))
        .expect("lua/ is readable")
        .map(|entry| entry.expect("lua/ entry").path())
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
        "expected the 8 scripts of lua/, found {}",
        scripts.len()
    );
    scripts
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

/// `expected` and `found` line by line: `  ` same, `- ` expected, `+ ` found.
fn difference(expected: &str, found: &str) -> String {
    let (expected, found): (Vec<&str>, Vec<&str>) = (expected.lines().collect(), found.lines().collect());
    let mut out = String::new();
    for i in 0..expected.len().max(found.len()) {
        match (expected.get(i), found.get(i)) {
            (Some(e), Some(f)) if e == f => out += &format!("    {e}\n"),
            (e, f) => {
                if let Some(e) = e {
                    out += &format!("  - {e}\n");
                }
                if let Some(f) = f {
                    out += &format!("  + {f}\n");
                }
            }
        }
    }
    out
}

fn check(failures: Vec<String>) {
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn helpers_are_identical_in_every_script() {
    let mut failures = Vec::new();
    for (script, text) in scripts() {
        for (name, canonical) in HELPERS {
            if let Some((line, found)) = definition(&script, &text, name) {
                if found != canonical {
                    failures.push(format!(
                        "lua/{script}:{}: {name} differs from the canonical one in tests/lua_helpers.rs \
                         (- canonical, + {script}):\n{}",
                        line + 1,
                        difference(canonical, &found)
                    ));
                }
            }
        }
    }
    check(failures);
}

#[test]
fn scripts_define_the_helpers_they_call_first_and_in_order() {
    let mut failures = Vec::new();
    for (script, text) in scripts() {
        let lines: Vec<&str> = text.lines().collect();
        let mut defined = String::new();
        for (name, canonical) in HELPERS {
            match definition(&script, &text, name) {
                Some(_) => defined += canonical,
                None if calls(&lines, name) => {
                    failures.push(format!("lua/{script} calls {name} but does not define it"))
                }
                None => {}
            }
        }
        // Right after the header and its blank lines come the helpers, in the order of HELPERS.
        let first = header(&text).len() + lines[header(&text).len()..].iter().take_while(|l| l.is_empty()).count();
        let top = block(&lines[first..(first + defined.lines().count()).min(lines.len())]);
        if top != defined {
            failures.push(format!(
                "lua/{script}:{}: the helpers it defines must come first after the header, in the order idiv, \
                 cdiv, int (- expected, + found):\n{}",
                first + 1,
                difference(&defined, &top)
            ));
        }
    }
    check(failures);
}

#[test]
fn time_preamble_is_identical_in_every_script() {
    let mut failures = Vec::new();
    for (script, text) in scripts() {
        let lines: Vec<&str> = text.lines().collect();
        let Some(start) = lines.iter().position(|l| l.starts_with("local now =")) else {
            // A script that never reads the time (`reset.lua`) takes no `now_ms` and calls no TIME.
            if text.contains("now_ms") || text.contains("TIME") {
                failures.push(format!("lua/{script} has no `local now =` preamble"));
            }
            continue;
        };
        let end = (start..lines.len())
            .find(|&i| lines[i] == "end")
            .unwrap_or(lines.len() - 1);
        let found = block(&lines[start..=end]);
        if found != TIME_PREAMBLE {
            failures.push(format!(
                "lua/{script}:{}: the TIME preamble differs from the canonical one in tests/lua_helpers.rs \
                 (- canonical, + {script}):\n{}",
                start + 1,
                difference(TIME_PREAMBLE, &found)
            ));
        }
        let times = text.matches("redis.call('TIME')").count();
        if times != 1 {
            failures.push(format!("lua/{script} calls TIME {times} times; only the preamble may"));
        }
        // The argument index is the one difference: `local now_arg = N`, before the preamble, N a header's now_ms.
        match lines[..start].iter().find_map(|l| l.strip_prefix("local now_arg = ")) {
            None => failures.push(format!("lua/{script} has no `local now_arg = N` before the preamble")),
            Some(n) => {
                let cited = format!("-- ARGV[{}]", n.trim());
                let in_header = header(&text)
                    .iter()
                    .any(|l| l.starts_with(&cited) && l.contains("now_ms"));
                if !in_header {
                    failures.push(format!(
                        "lua/{script}: now_arg = {n} but the header has no `{cited}  now_ms`"
                    ));
                }
            }
        }
    }
    check(failures);
}

/// The scripts that share the token bucket's hash, and the functions that read, convert and write it.
const TOKEN_SCRIPTS: [&str; 4] = [
    "token_bucket.lua",
    "token_return.lua",
    "token_acquire.lua",
    "token_lease.lua",
];
const TOKEN_STATE: [&str; 5] = ["gcd", "rescale", "load_bucket", "save_bucket", "note_room"];

/// One bucket, one reading of it: a state written by any token script (and one written before the hash recorded
/// its parameters) is refilled, converted after a reload and stored by the same code in each (invariant 11).
#[test]
fn token_scripts_read_convert_and_store_the_bucket_alike() {
    let mut failures = Vec::new();
    let all = scripts();
    let text = |name: &str| {
        all.iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t.as_str())
            .unwrap_or_default()
    };
    for name in TOKEN_STATE {
        let Some((_, canonical)) = definition(TOKEN_SCRIPTS[0], text(TOKEN_SCRIPTS[0]), name) else {
            failures.push(format!("lua/{} does not define {name}", TOKEN_SCRIPTS[0]));
            continue;
        };
        for script in &TOKEN_SCRIPTS[1..] {
            match definition(script, text(script), name) {
                None => failures.push(format!("lua/{script} does not define {name}")),
                Some((line, found)) if found != canonical => failures.push(format!(
                    "lua/{script}:{}: {name} differs from token_bucket.lua's (- token_bucket.lua, + {script}):\n{}",
                    line + 1,
                    difference(&canonical, &found)
                )),
                Some(_) => {}
            }
        }
    }
    for script in TOKEN_SCRIPTS {
        let t = text(script);
        // The bucket's fields are written by save_bucket alone, its notes of room by note_room (and their rooms by
        // token_return.lua's give-back); token_lease.lua also writes the bucket's turn, and token_return.lua its
        // hold.
        let other_writes = (t.lines())
            .filter(|l| {
                let l = code(l);
                l.contains("redis.call('HSET'")
                    && !l.contains("'turn'")
                    && !l.contains("'hold'")
                    && !l.contains("'rooms'")
            })
            .count();
        if other_writes != 1 || !t.contains("save_bucket(KEYS[1]") || !t.contains("load_bucket(KEYS[1]") {
            failures.push(format!(
                "lua/{script} must read the bucket with load_bucket and write it only with save_bucket"
            ));
        }
    }
    check(failures);
}

#[test]
fn no_math_floor_outside_idiv() {
    let mut failures = Vec::new();
    for (script, text) in scripts() {
        let idiv = definition(&script, &text, "idiv").map(|(line, def)| line..line + def.lines().count());
        for (i, line) in text.lines().enumerate() {
            let inside_idiv = idiv.as_ref().is_some_and(|lines| lines.contains(&i));
            if !inside_idiv && code(line).contains("math.floor(") {
                failures.push(format!(
                    "lua/{script}:{}: math.floor outside idiv (use idiv): {line}",
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
                failures.push(format!("lua/{script}: the header does not name {needed}"));
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
                        failures.push(format!("lua/{script}: uses {used}, which its header does not describe"));
                    }
                }
            }
        }
        for path in cited_paths(&joined) {
            if !root().join(&path).exists() && !WRITTEN_ELSEWHERE.contains(&path.as_str()) {
                failures.push(format!("lua/{script}: the header cites {path}, which does not exist"));
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
