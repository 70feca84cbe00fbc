//! `simulate --seed S` and `--seeds A..B`: each seed a schedule of processes, demand and faults
//! (`scenario.rs`) run on the real engine (`fleet.rs`) and checked on every window (`check.rs`). A failing seed
//! prints its schedule, its worst window, and the command that replays it, reduced to the fewest faults that
//! still fail.

use std::hash::{Hash as _, Hasher as _};
use std::ops::Range;
use std::process::ExitCode;

use tokenlease::FailMode;

use super::check::{self, Find, Verdict};
use super::fleet;
use super::scenario::{Overrides, Scenario, MODES};

/// One seed's run under one fail mode.
#[derive(Debug, Clone)]
pub(super) struct Run {
    pub(super) scenario: Scenario,
    pub(super) verdict: Verdict,
    /// A hash of the admitted timeline: the same seed gives the same one.
    pub(super) fingerprint: u64,
    pub(super) decisions: u64,
    pub(super) store_calls: u64,
    /// Tokens admitted in each second of the run.
    pub(super) by_second: Vec<u64>,
}

/// Runs `scenario` and checks it.
pub(super) fn run_one(scenario: &Scenario, find: Find) -> Result<Run, String> {
    let outcome = fleet::run(scenario)?;
    let verdict = check::check(scenario, &outcome, find);
    let mut hasher = std::hash::DefaultHasher::new();
    outcome.admitted_ms.hash(&mut hasher);
    outcome.decisions.hash(&mut hasher);
    outcome.store_calls.hash(&mut hasher);
    Ok(Run {
        scenario: scenario.clone(),
        verdict,
        fingerprint: hasher.finish(),
        decisions: outcome.decisions,
        store_calls: outcome.store_calls,
        by_second: outcome.admitted_ms.chunks(1000).map(|c| c.iter().sum()).collect(),
    })
}

/// The fail modes to run: the one asked for, or both that promise the bound.
pub(super) fn modes(mode: Option<FailMode>) -> Vec<FailMode> {
    mode.map_or_else(|| MODES.to_vec(), |m| vec![m])
}

/// Parses `A..B` (or one seed `S`, as `S..S+1`).
pub(super) fn parse_range(text: &str) -> Result<Range<u64>, String> {
    let bad = || format!("--seeds {text}: a range A..B of seeds (B excluded), or one seed");
    match text.split_once("..") {
        Some((a, b)) => {
            let (a, b) = (
                a.trim().parse().map_err(|_| bad())?,
                b.trim().parse().map_err(|_| bad())?,
            );
            if a < b {
                Ok(a..b)
            } else {
                Err(bad())
            }
        }
        None => {
            let s: u64 = text.trim().parse().map_err(|_| bad())?;
            Ok(s..s.saturating_add(1))
        }
    }
}

/// The fewest faults of a failing scenario that still fail (one at a time taken out while it still fails).
pub(super) fn reduce(run: &Run) -> Result<Run, String> {
    let mut best = run.clone();
    let mut i = 0;
    while i < best.scenario.faults.len() {
        let fewer = best.scenario.with_faults(|j| j != i);
        let tried = run_one(&fewer, Find::Always)?;
        if tried.verdict.over {
            best = tried;
        } else {
            i += 1;
        }
    }
    Ok(best)
}

/// The command that replays a run.
pub(super) fn replay(scenario: &Scenario) -> String {
    if let Some(name) = scenario.name {
        return format!(
            "tokenlease simulate --scenario {name} --mode {}",
            scenario.mode.as_str()
        );
    }
    format!(
        "tokenlease simulate --seed {} --mode {}{}",
        scenario.seed,
        scenario.mode.as_str(),
        scenario.overrides
    )
}

/// Runs each scenario, printing it in full with its worst window; exits 1 when one went over its bound.
pub(super) fn run_each(scenarios: Vec<Scenario>, json: bool) -> Result<ExitCode, String> {
    let mut exit = ExitCode::SUCCESS;
    for scenario in &scenarios {
        let run = run_one(scenario, Find::Always)?;
        print(&run, json);
        if run.verdict.over {
            exit = ExitCode::FAILURE;
        }
    }
    Ok(exit)
}

/// Prints one run in full.
pub(super) fn print(run: &Run, json: bool) {
    let v = &run.verdict;
    if json {
        let value = serde_json::json!({
            "scenario": run.scenario.name,
            "seed": run.scenario.seed,
            "fail_mode": run.scenario.mode.as_str(),
            "over": v.over,
            "worst_ratio": v.worst.ratio,
            "worst_from_s": v.worst.start.as_secs_f64(),
            "worst_length_s": v.worst.window.as_secs_f64(),
            "worst_admitted": v.worst.admitted,
            "worst_bound": v.worst.limit,
            "sell_through": v.sell,
            "faults": run.scenario.faults.len(),
            "decisions": run.decisions,
            "store_calls": run.store_calls,
            "fingerprint": format!("{:016x}", run.fingerprint),
        });
        println!("{value}");
        return;
    }
    print!("{}", run.scenario);
    println!(
        "  worst window: {:.3} of its bound ({} admitted, bound {:.1}) over {:.2} s from {:.2} s{}",
        v.worst.ratio,
        v.worst.admitted,
        v.worst.limit,
        v.worst.window.as_secs_f64(),
        v.worst.start.as_secs_f64(),
        if v.over { ": OVER THE BOUND" } else { "" }
    );
    match v.sell {
        Some(s) => println!("  sold after healing: {:.1} % of what could sell", s * 100.0),
        None => println!("  sold after healing: no healthy tail of 3 s to judge"),
    }
    let seconds: Vec<String> = run.by_second.iter().map(u64::to_string).collect();
    println!("  admitted each second: {}", seconds.join(" "));
    println!(
        "  {} decisions, {} store calls, timeline {:016x}",
        run.decisions, run.store_calls, run.fingerprint
    );
    println!("  replay: {}", replay(&run.scenario));
}

/// Runs every seed of `seeds` under each of `modes`; prints the failing ones (reduced) and
/// a summary; exits 1 when a window went over its bound or a healed fleet sold under `min_sell`.
pub(super) fn run_range(
    seeds: Range<u64>,
    modes: &[FailMode],
    overrides: &Overrides,
    (min_sell, json): (f64, bool),
) -> Result<ExitCode, String> {
    // One after another on this thread: a key's shards give each thread a home of its own, assigned in the
    // order threads first decide, so seeds spread over threads would not replay byte for byte (run ranges in
    // several shells to use more cores).
    let mut runs = Vec::new();
    for seed in seeds {
        for mode in modes {
            runs.push(
                run_one(&Scenario::draw(seed, *mode, overrides), Find::Failing { min_sell })
                    .map_err(|e| format!("seed {seed}: {e}"))?,
            );
        }
    }
    runs.sort_by_key(|r| (r.scenario.seed, r.scenario.mode.as_str()));
    let over: Vec<&Run> = runs.iter().filter(|r| r.verdict.over).collect();
    let slow: Vec<&Run> = runs
        .iter()
        .filter(|r| !r.verdict.over && r.verdict.sell.is_some_and(|s| s < min_sell))
        .collect();
    for run in &over {
        if json {
            // One line a failing run as drawn (a test compares them with the known list); reduce by hand.
            print(run, true);
        } else {
            let reduced = reduce(run)?;
            println!(
                "OVER THE BOUND (reduced to {} of {} faults):",
                reduced.scenario.faults.len(),
                run.scenario.faults.len()
            );
            print(&reduced, false);
        }
    }
    for run in &slow {
        if !json {
            println!("SOLD UNDER {:.0} % AFTER HEALING:", min_sell * 100.0);
        }
        print(run, json);
    }
    let mut sold: Vec<(f64, u64, &str)> = runs
        .iter()
        .filter_map(|r| r.verdict.sell.map(|s| (s, r.scenario.seed, r.scenario.mode.as_str())))
        .collect();
    sold.sort_by(|a, b| a.0.total_cmp(&b.0));
    let judged = sold.len();
    let lowest: Vec<String> = sold
        .iter()
        .take(5)
        .map(|(s, seed, mode)| format!("{:.1} % (seed {seed} {mode})", s * 100.0))
        .collect();
    let summary = format!(
        "{} runs ({} seeds x {}): {} over the bound, {} of {} healed fleets sold under {:.0} % (lowest: {})",
        runs.len(),
        runs.len() / modes.len().max(1),
        modes.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(", "),
        over.len(),
        slow.len(),
        judged,
        min_sell * 100.0,
        lowest.join(", ")
    );
    if json {
        println!(
            "{}",
            serde_json::json!({ "summary": summary, "runs": runs.len(), "over": over.len(), "under_sold": slow.len() })
        );
    } else {
        println!("{summary}");
    }
    Ok(if over.is_empty() && slow.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
