//! `tokenlease simulate`, run as a user runs it: P limiters of this crate on virtual time over the in-process
//! store. It asserts what holds on today's engine (the bound in every window, a small cost per token for a few
//! processes) and prints the rest, the figures issue 20's targets are measured by.

use std::process::Command;
use std::time::{Duration, Instant};

/// Runs `tokenlease simulate ARGS --json` with the shipped config and returns its JSON object and how long it took.
fn simulate(args: &[&str]) -> (serde_json::Value, Duration) {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_tokenlease"))
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .arg("simulate")
        .args(args)
        .arg("--json")
        .output()
        .expect("run tokenlease");
    let took = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "exit {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let report = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("not one JSON object ({e}): {stdout}"));
    eprintln!("simulate {args:?}: {took:.1?} real\n{report}");
    (report, took)
}

fn number(report: &serde_json::Value, field: &str) -> f64 {
    report[field]
        .as_f64()
        .unwrap_or_else(|| panic!("`{field}` is not a number: {report}"))
}

#[test]
fn two_hundred_and_fifty_six_processes_keep_to_the_bound_in_every_window() {
    let (report, took) = simulate(&["--processes", "256", "--duration", "10s"]);
    for field in [
        "processes",
        "expected",
        "calls_per_s",
        "calls_per_admitted",
        "steady_calls_per_admitted",
        "admitted",
        "bound",
        "unsold",
        "worst_window_ratio",
    ] {
        assert!(report.get(field).is_some(), "no `{field}`: {report}");
    }
    assert_eq!(report["processes"], 256);
    assert!(report["expected"].is_null(), "left out: {report}");
    assert_eq!(report["errors"], 0, "{report}");
    let (admitted, bound) = (number(&report, "admitted"), number(&report, "bound"));
    assert!(admitted > 0.0, "{report}");
    // sku_buy: capacity 2000 + 1000/s × (10 s + 0.2 s).
    assert_eq!(bound, 12_200.0);
    assert_eq!(number(&report, "unsold"), bound - admitted);
    let worst = number(&report, "worst_window_ratio");
    assert!(worst <= 1.0, "a window admitted {worst} of its bound: {report}");
    // The steady state costs no more per token than the whole sale, whose first second is the costliest.
    assert!(number(&report, "steady_calls_per_admitted") <= number(&report, "calls_per_admitted"));
    // The bucket's turns (invariant 18): nearly all of the bound sold, and from 3 s on one call per turn, not per
    // process (0.061 and 85 % sold when each process estimated its own turns). Each process decides 390 times a
    // second, 70 tokens in a TTL: it leases paced turns of 200 (0.024 calls per token unpaced; 0.0083 paced).
    assert!(admitted >= 0.95 * bound, "{admitted} of {bound} sold: {report}");
    let steady = number(&report, "steady_calls_per_admitted");
    // Never below the lease's floor, 1 / min(2 × max_batch, capacity): 1 / 1000 here. A count that missed calls
    // would go below it.
    let floor = number(&report, "floor_calls_per_admitted");
    assert!((floor - 1.0 / 1000.0).abs() < 1e-12, "{report}");
    assert!(steady >= floor, "{steady} below the floor {floor}: {report}");
    assert!(
        steady <= 0.012,
        "{steady} store calls per admitted token from 3 s on: {report}"
    );
    // Virtual time: 10 s of 256 processes deciding 10^5 times a second take about a second here.
    assert!(took < Duration::from_secs(60), "took {took:?}");
}

/// A thousand processes each deciding a thousand times a second (10^6 a second on the key): each can spend 180
/// tokens within the 200 ms TTL, so from 3 s on the bucket's turns bring that much and the fleet makes under 0.01
/// store calls per admitted token (invariant 18). Their first leases wait half a TTL to measure that demand: sized
/// for a guessed batch, the first turns ran together for the whole sale (0.083 calls per token).
#[test]
fn a_thousand_processes_at_a_million_decisions_a_second_need_under_a_call_per_hundred_tokens() {
    let (report, _) = simulate(&["--processes", "1000", "--demand", "1000000", "--duration", "10s"]);
    let (admitted, bound) = (number(&report, "admitted"), number(&report, "bound"));
    assert!(number(&report, "worst_window_ratio") <= 1.0, "{report}");
    assert!(admitted >= 0.95 * bound, "{admitted} of {bound} sold: {report}");
    let steady = number(&report, "steady_calls_per_admitted");
    assert!(
        steady <= 0.01,
        "{steady} store calls per admitted token from 3 s on: {report}"
    );
}

/// A thousand processes sharing the default 10^5 decisions a second, 100 each: a process spends 18 tokens in a
/// TTL, so unpaced each turn brought that much (0.0999 calls per token from 3 s on). Paced, a turn of 100 is
/// released 10 every 100 ms, within the bound in every window. Since 2026-11-27 a paced grant spans at most the
/// refill of half the burst (1 s; longer spans let the bucket's pending line hold the refill back, and fleets of
/// 64 sold 42 %): that costs calls, 0.0186 per token from 3 s on against 0.0093 with turns of 200 over 2 s, above
/// issue "sell"'s 0.01, which this test held before; it now holds 0.02 and the 10 s sale's 95.9 % (93.5 % before).
#[test]
fn a_thousand_slow_processes_lease_paced_turns_under_two_calls_per_hundred_tokens() {
    let (report, _) = simulate(&["--processes", "1000", "--duration", "10s"]);
    let (admitted, bound) = (number(&report, "admitted"), number(&report, "bound"));
    assert!(number(&report, "worst_window_ratio") <= 1.0, "{report}");
    assert!(admitted >= 0.95 * bound, "{admitted} of {bound} sold: {report}");
    let steady = number(&report, "steady_calls_per_admitted");
    assert!(
        steady <= 0.02,
        "{steady} store calls per admitted token from 3 s on: {report}"
    );
}

/// Issue "sell"'s flat store load: a thousand processes deciding 20 times a second each make at most 1 500 store
/// operations a second, beats included (1 470 on 2026-11-27: 1 000 beats, 247 leases, 200 cold checks, 24
/// give-backs); at 5 a second each, where no key leases and no fleet is joined, one per decision.
#[test]
fn a_thousand_processes_make_a_flat_store_load() {
    let ops = |report: &serde_json::Value, kind: &str| {
        report["ops_per_s"][kind]
            .as_f64()
            .unwrap_or_else(|| panic!("no ops_per_s.{kind}: {report}"))
    };
    let (report, _) = simulate(&["--processes", "1000", "--demand", "20000", "--duration", "10s"]);
    assert!(number(&report, "worst_window_ratio") <= 1.0, "{report}");
    let parts: f64 = ["lease", "give_back", "check", "beat", "other"]
        .iter()
        .map(|k| ops(&report, k))
        .sum();
    assert!((parts - ops(&report, "all")).abs() < 1e-6, "{report}");
    assert!(ops(&report, "all") <= 1500.0, "{report}");
    assert!(ops(&report, "beat") > 0.0, "the beats are counted: {report}");

    let (report, _) = simulate(&["--processes", "1000", "--demand", "5000", "--duration", "10s"]);
    let per_decision = ops(&report, "all") * 10.0 / number(&report, "decisions");
    assert!(per_decision <= 1.0, "{per_decision} operations per decision: {report}");
}

/// `--skew`: a tenth of the processes carry half the demand; the fleet still sells what could sell.
#[test]
fn a_skewed_fleet_sells_what_could_sell() {
    let (report, _) = simulate(&["--processes", "64", "--demand", "1500", "--duration", "10s", "--skew"]);
    assert_eq!(report["skew"], true, "{report}");
    assert!(number(&report, "worst_window_ratio") <= 1.0, "{report}");
    let sold = number(&report, "sold_of_could_pct");
    assert!(sold >= 93.0, "{sold} % of what could sell: {report}");
}

#[test]
fn four_processes_sell_nearly_all_of_the_bound_for_a_few_calls() {
    let (report, _) = simulate(&["--processes", "4", "--duration", "10s"]);
    let (admitted, bound) = (number(&report, "admitted"), number(&report, "bound"));
    assert!(number(&report, "worst_window_ratio") <= 1.0, "{report}");
    assert!(admitted >= 0.9 * bound, "{admitted} of {bound} sold: {report}");
    let per_token = number(&report, "calls_per_admitted");
    assert!(per_token < 0.01, "{per_token} store calls per admitted token: {report}");
    // The real 4-process flash sale on Redis makes 53-56 calls per 10 s sale.
    assert!(number(&report, "store_calls") < 200.0, "{report}");
}

#[test]
fn a_round_trip_and_a_demand_are_taken_as_given() {
    let (report, _) = simulate(&[
        "--processes",
        "16",
        "--expected",
        "16",
        "--rtt",
        "2.5",
        "--demand",
        "20000",
        "--duration",
        "4s",
    ]);
    assert_eq!(report["expected"], 16);
    assert_eq!(
        number(&report, "rtt_ms"),
        3.0,
        "rounded up to whole ms, as tokio's timer counts them"
    );
    assert_eq!(number(&report, "decisions"), 80_000.0, "20 000/s for 4 s: {report}");
    assert_eq!(number(&report, "bound"), 2000.0 + 1000.0 * 4.2);
    assert!(number(&report, "worst_window_ratio") <= 1.0, "{report}");
}

#[test]
fn bad_options_are_refused_with_an_error() {
    for args in [
        &["simulate", "--processes", "0"][..],
        &["simulate", "--processes", "4", "--rtt", "-1"],
        &["simulate", "--processes", "4", "--rule", "like"],
        &["simulate", "--processes", "4", "--demand", "0"],
        &["simulate", "--processes", "4", "--duration", "0s"],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_tokenlease"))
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .args(args)
            .output()
            .expect("run tokenlease");
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(!out.stderr.is_empty(), "{args:?}: no error message");
    }
}

/// Sell-through of a healthy fleet (issue "sell"), 10 s on the shipped rule, demand spread evenly: P processes
/// at `times` the rate sell at least `least` % of what could sell (the bound, or the decisions made where
/// fewer), within every window's bound.
fn sells(processes: u32, times: f64, least: f64) {
    let demand = ((1_000.0 * times) as u64).to_string();
    let (run, _) = simulate(&["--processes", &processes.to_string(), "--demand", &demand]);
    let sold = number(&run, "sold_of_could_pct");
    let worst = number(&run, "worst_window_ratio");
    assert!(
        worst <= 1.0,
        "P = {processes} at {times}x: a window at {worst} of its bound"
    );
    assert!(
        sold >= least,
        "P = {processes} at {times}x sold {sold:.1} % of what could sell, under {least} %"
    ); // Tokens granted to paced leases and not released at the end were taken from the bucket: with what was
       // admitted they fit in what it could give.
    let (admitted, pending) = (number(&run, "admitted"), number(&run, "pending_tokens_at_end"));
    let bound = number(&run, "bound");
    assert!(
        admitted + pending <= bound,
        "P = {processes} at {times}x: {admitted} admitted and {pending} pending over the bound {bound}"
    );
}

/// Where the engine undersold before the paced leases' span was capped (64 processes at 1.5 times the rate sold
/// 42 %, 256 at 3 times 44 %).
#[test]
fn sixty_four_processes_sell_what_the_limit_allows() {
    sells(64, 1.5, 93.0);
    sells(64, 3.0, 93.0);
}

#[test]
fn two_hundred_fifty_six_processes_sell_what_the_limit_allows() {
    sells(256, 3.0, 93.0);
    // 88.5 % until each process's first lease read a half TTL with no decision as a slow demand rather than an
    // unknown one: the 256 first leases took batches of 20 to 40, the whole burst, and gave 72 % of it back.
    sells(256, 1.5, 93.0);
}
