//! `tokenlease simulate --seed`, `--seeds` and `--scenario`, run as a user runs them: fleets of this crate's
//! limiters on virtual time, with the faults a seed draws, every window checked. What still goes over the bound
//! (or sells too little once the faults heal) on today's engine is listed in docs/ARCHITECTURE.md, Known limits,
//! and these tests hold the runs to that list exactly: a seed that starts failing fails the test, and so does one
//! that stops failing (the list is then updated, and the fix named in the commit).

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Instant;

/// Runs `tokenlease simulate ARGS --json` and returns its JSON lines.
fn simulate(args: &[&str]) -> Vec<serde_json::Value> {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_tokenlease"))
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .arg("simulate")
        .args(args)
        .arg("--json")
        .output()
        .expect("run tokenlease");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.code().is_some_and(|c| c == 0 || c == 1),
        "exit {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("simulate {args:?}: {:.1?} real", started.elapsed());
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// A run's name in the lists: `local 20`, `closed cut-off`.
fn name(run: &serde_json::Value) -> String {
    let what = run["scenario"]
        .as_str()
        .map_or_else(|| run["seed"].to_string(), str::to_owned);
    format!("{} {what}", run["fail_mode"].as_str().unwrap_or("?"))
}

/// The list named `list` in docs/ARCHITECTURE.md's Known limits: a ```text block after a line holding
/// `<!-- list -->`, each entry `mode what figure`, several to a line, separated by `;`.
fn known(list: &str) -> BTreeMap<String, f64> {
    known_in("docs/ARCHITECTURE.md", list)
}

/// The list named `list` in `file` (from the repository's root), as [`known`] reads it.
fn known_in(file: &str, list: &str) -> BTreeMap<String, f64> {
    let path = format!("{}/../{file}", env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{file}: {e}"));
    let marker = format!("<!-- {list} -->");
    let block = doc
        .split(&marker)
        .nth(1)
        .and_then(|rest| rest.split("```text").nth(1))
        .and_then(|b| b.split("```").next())
        .unwrap_or_else(|| panic!("no list {marker} in {file}"));
    block
        .split([';', '\n'])
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|entry| {
            let parts: Vec<&str> = entry.split_whitespace().collect();
            assert_eq!(parts.len(), 3, "`mode what figure`: {entry}");
            let figure = parts[2].parse().unwrap_or_else(|_| panic!("a number: {entry}"));
            (format!("{} {}", parts[0], parts[1]), figure)
        })
        .collect()
}

/// Asserts that `found` is `expected` (names and, to 0.001, figures), printing both lists in the doc's form.
fn assert_same(what: &str, found: &BTreeMap<String, f64>, expected: &BTreeMap<String, f64>) {
    let render = |m: &BTreeMap<String, f64>| {
        m.iter()
            .map(|(k, v)| format!("{k} {v:.3}"))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let same = found.len() == expected.len()
        && found
            .iter()
            .zip(expected)
            .all(|((a, x), (b, y))| a == b && (x - y).abs() < 0.001);
    assert!(
        same,
        "{what} differ from docs/ARCHITECTURE.md's list.\nfound ({}):\n{}\nlisted ({}):\n{}",
        found.len(),
        render(found),
        expected.len(),
        render(expected)
    );
}

#[test]
fn one_seed_replays_byte_for_byte() {
    let first = simulate(&["--seed", "20"]);
    let again = simulate(&["--seed", "20"]);
    assert_eq!(first.len(), 2, "closed and local: {first:?}");
    assert_eq!(first, again, "the same seed, the same run");
    // `local` sells only what the store granted before a fault, as `closed` does: the same run. `open`, which
    // allows every call the store fails, is another.
    assert_eq!(
        first[0]["fingerprint"], first[1]["fingerprint"],
        "local decides as closed"
    );
    let open = simulate(&["--seed", "20", "--mode", "open"]);
    assert_ne!(first[0]["fingerprint"], open[0]["fingerprint"], "open is another run");
    assert!(first[0]["decisions"].as_u64().is_some_and(|d| d > 0), "{first:?}");
}

#[test]
fn a_thousand_seeds_per_fail_mode_fail_only_as_known() {
    let runs = simulate(&["--seeds", "0..1000", "--min-sell", "0.5"]);
    let summary = runs.last().expect("a summary");
    assert_eq!(summary["runs"], 2000, "{summary}");
    let failing: Vec<&serde_json::Value> = runs.iter().filter(|r| r.get("seed").is_some()).collect();
    let over: BTreeMap<String, f64> = failing
        .iter()
        .filter(|r| r["over"] == true)
        .map(|r| (name(r), r["worst_ratio"].as_f64().unwrap_or(0.0)))
        .collect();
    let under: BTreeMap<String, f64> = failing
        .iter()
        .filter(|r| r["over"] == false)
        .map(|r| (name(r), r["sell_through"].as_f64().unwrap_or(0.0)))
        .collect();
    eprintln!("{}", summary["summary"]);
    assert!(over.values().all(|&r| r > 1.0), "{over:?}");
    assert!(under.values().all(|&s| s < 0.5), "{under:?}");
    assert_same("the seeds over the bound", &over, &known("seeds-over-the-bound"));
    assert_same(
        "the seeds that sold under half once healed",
        &under,
        &known("seeds-under-sold"),
    );
}

#[test]
fn healthy_fleets_never_go_over_and_sell_in_60_s_as_known() {
    // No faults, so the fail mode changes nothing: one mode is enough.
    let runs = simulate(&[
        "--seeds",
        "0..300",
        "--healthy",
        "--duration",
        "60s",
        "--min-sell",
        "0.95",
        "--mode",
        "closed",
    ]);
    let summary = runs.last().expect("a summary");
    assert_eq!(summary["runs"], 300, "{summary}");
    eprintln!("{}", summary["summary"]);
    let failing: Vec<&serde_json::Value> = runs.iter().filter(|r| r.get("seed").is_some()).collect();
    assert!(
        failing.iter().all(|r| r["over"] == false),
        "a healthy fleet over the bound: {failing:?}"
    );
    assert!(failing.iter().all(|r| r["faults"] == 0), "{failing:?}");
    let under: BTreeMap<String, f64> = failing
        .iter()
        .map(|r| (name(r), r["sell_through"].as_f64().unwrap_or(0.0)))
        .collect();
    assert!(under.values().all(|&s| s < 0.95), "{under:?}");
    assert_same(
        "the healthy seeds that sold under 95 % in 60 s",
        &under,
        &known("healthy-under-sold"),
    );
}

/// Healthy fleets beyond the first 300 seeds that once sold under 95 % in 60 s, each for a cause since fixed
/// (docs/BENCHMARKS.md, "The seeded search, as it went"): 506, a bucket of 13 shared by 64 processes deciding
/// twice a second each, whose turns leased `min_batch` (9) to a process spending one token a TTL (81.6 %); 357
/// (a bucket of 30 over 16, 85.7 %) and 915 (115 over 48, 90.1 %) had the same cause; 746 (24 processes, a
/// tenth carrying half the demand, 90.8 %) sold so until a steep fall was told on the newest samples. About
/// 8 s each.
#[test]
fn healthy_seeds_once_under_sold_sell_95_percent() {
    for seed in ["506", "357", "915", "746"] {
        let runs = simulate(&["--seed", seed, "--healthy", "--duration", "60s", "--mode", "closed"]);
        let run = runs.last().expect("a run");
        assert_eq!(run["over"], false, "{run}");
        let sold = run["sell_through"].as_f64().unwrap_or(0.0);
        assert!(sold >= 0.95, "seed {seed} sold {sold:.3} of what could sell");
    }
}

/// What the 100 000-seed search under `local` found over the bound beyond the first thousand (all with a
/// rate-lowering reload; docs/BENCHMARKS.md, "The 100 000-seed search under `local`"): each seed replays as
/// listed, so a change that heals one, or makes one worse, is seen here.
#[test]
fn the_seeds_the_long_search_found_over_replay_as_known() {
    let listed = known_in("docs/BENCHMARKS.md", "seeds-over-in-100k");
    assert_eq!(listed.len(), 16, "{listed:?}");
    let mut found = BTreeMap::new();
    for entry in listed.keys() {
        let (mode, seed) = entry.split_once(' ').expect("`mode seed`");
        for run in simulate(&["--seed", seed, "--mode", mode]) {
            if run["over"] == true {
                found.insert(name(&run), run["worst_ratio"].as_f64().unwrap_or(0.0));
            }
        }
    }
    assert_same("the long search's seeds over the bound", &found, &listed);
}

#[test]
fn the_paths_reviews_found_go_over_as_known() {
    let runs = simulate(&["--scenario", "all"]);
    assert_eq!(runs.len(), 34, "17 scenarios x 2 modes");
    let over: BTreeMap<String, f64> = runs
        .iter()
        .filter(|r| r["over"] == true)
        .map(|r| (name(r), r["worst_ratio"].as_f64().unwrap_or(0.0)))
        .collect();
    assert_same(
        "the named scenarios over the bound",
        &over,
        &known("scenarios-over-the-bound"),
    );
}

/// Seed 9771 goes over (a key idle across a rate-lowering reload until its hash expired, Known limits): its
/// clock step can go and its store hanging across the reload cannot: it is printed reduced to 2 of 3 faults.
#[test]
fn a_failing_seed_is_printed_reduced_with_the_command_that_replays_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_tokenlease"))
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .args(["simulate", "--seeds", "9771..9772", "--mode", "closed"])
        .output()
        .expect("run tokenlease");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("OVER THE BOUND (reduced to 2 of 3 faults)"), "{stdout}");
    assert!(
        stdout.contains("replay: tokenlease simulate --seed 9771 --mode closed"),
        "{stdout}"
    );
    assert!(
        stdout.contains("1 runs (1 seeds x closed): 1 over the bound"),
        "{stdout}"
    );
}
