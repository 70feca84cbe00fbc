//! The main job, end to end: a short multi-process `tokenlease flash-sale` against a real Redis.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::process::Command;

/// The runs are multi-process and timed: one at a time, so that they do not starve each other of the two cores.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run(args: &[&str]) -> serde_json::Value {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let out = Command::new(env!("CARGO_BIN_EXE_tokenlease"))
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .arg("flash-sale")
        .args(args)
        .output()
        .expect("run tokenlease");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "exit {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let last = stdout.lines().last().expect("output");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("last line is not JSON ({e}): {last}"))
}

#[test]
fn three_processes_admit_at_most_the_bound_and_nearly_all_of_it() {
    let server = common::RedisServer::start();
    let url = server.url();
    // 5 s: what accumulates in Redis after the processes' last turns (a batch of 500 at most, now and then) is
    // then under a tenth of the bound.
    let report = run(&[
        "--processes",
        "3",
        "--tasks",
        "4",
        "--duration",
        "5s",
        "--json",
        "--redis",
        &url,
    ]);
    let admitted = report["admitted"].as_f64().expect("admitted");
    let bound = report["bound"].as_f64().expect("bound");
    assert_eq!(report["processes"], 3);
    assert!(report["store"].as_str().expect("store").contains(&url), "{report}");
    assert!(admitted <= bound, "admitted {admitted} > bound {bound}: {report}");
    assert!(
        admitted >= 0.9 * bound,
        "admitted {admitted} < 90 % of bound {bound}: {report}"
    );
    let calls = report["redis_calls"].as_f64().expect("calls");
    assert!(calls / admitted < 0.05, "{calls} Redis calls for {admitted} admitted");
    // The decisions split by who made them, adding up to the attempts; leases make nearly all.
    let by = |k: &str| report[k].as_u64().expect(k);
    assert_eq!(
        by("by_lease") + by("by_store") + by("fallback"),
        by("attempts"),
        "{report}"
    );
    assert!(by("by_lease") > by("attempts") / 2, "{report}");
    // One hot key is a sale of one key, within its bound, leased.
    assert_eq!(
        (by("keys"), by("hot_keys"), by("over_bound_keys")),
        (1, 1, 0),
        "{report}"
    );
    for field in [
        "span_s",
        "capacity",
        "rate_per_s",
        "lease_ttl_s",
        "attempts",
        "rejected",
        "decisions_per_s",
        "redis_calls_per_decision",
    ] {
        assert!(report[field].is_number(), "{field} missing: {report}");
    }
    for q in ["p50", "p99", "p999"] {
        assert!(report["latency_us"][q].as_f64().expect(q) > 0.0);
    }
}

#[test]
fn the_no_lease_baseline_makes_one_redis_call_per_decision() {
    let server = common::RedisServer::start();
    let url = server.url();
    let report = run(&[
        "--processes",
        "2",
        "--tasks",
        "2",
        "--duration",
        "1s",
        "--json",
        "--no-lease",
        "--redis",
        &url,
    ]);
    let attempts = report["attempts"].as_u64().expect("attempts");
    let calls = report["redis_calls"].as_u64().expect("calls");
    assert_eq!(calls, attempts, "{report}");
    // Every decision is the store's: none from leases, none by fail_mode on a healthy Redis.
    assert_eq!(report["by_store"].as_u64(), Some(attempts), "{report}");
    assert_eq!(
        (report["by_lease"].as_u64(), report["fallback"].as_u64()),
        (Some(0), Some(0)),
        "{report}"
    );
    assert!(report["admitted"].as_f64().expect("a") <= report["bound"].as_f64().expect("b"));
    assert_eq!(report["lease_ttl_s"], 0.0);
}

#[test]
fn without_redis_it_runs_on_the_in_process_store() {
    let report = run(&[
        "--processes",
        "3",
        "--tasks",
        "2",
        "--duration",
        "1s",
        "--json",
        "--redis",
        "memory",
    ]);
    assert_eq!(
        report["processes"], 1,
        "the in-process store runs in one process: {report}"
    );
    assert!(report["store"].as_str().expect("store").contains("in-process"));
    assert!(report["admitted"].as_f64().expect("a") <= report["bound"].as_f64().expect("b"));
}

#[test]
fn per_user_window_rules_run_too() {
    let server = common::RedisServer::start();
    let url = server.url();
    // `like`: 10 per 10 s with a ban of an hour (the shipped config); 50 users beside the hot key.
    let report = run(&[
        "--rule",
        "like",
        "--users",
        "50",
        "--processes",
        "2",
        "--tasks",
        "2",
        "--duration",
        "1s",
        "--json",
        "--redis",
        &url,
    ]);
    // Decisions by fail_mode (hot key and users; a window rule's local share is not charged back) may admit
    // beyond the limit; every other decision is Redis's.
    let fail_mode: u64 = ["error", "timeout", "circuit_open"]
        .iter()
        .map(|r| report["fail_mode"][r].as_u64().expect("fail_mode counts"))
        .sum();
    let admitted = report["admitted"].as_u64().expect("admitted");
    assert!(admitted <= 10 + fail_mode, "{report}");
    assert!(admitted >= 10, "{report}");
    let users = report["user_admitted"].as_u64().expect("user_admitted");
    assert!(users <= 50 * 10 + fail_mode, "{report}");
    assert!(users > 0, "{report}");
    assert_eq!(report["capacity"], 10);
}

/// The decisions the limiter made (fail_mode answers left out), as `redis_calls_per_decision` divides by.
fn made(report: &serde_json::Value) -> u64 {
    let fail_mode: u64 = ["error", "timeout", "circuit_open"]
        .iter()
        .map(|r| report["fail_mode"][r].as_u64().expect("fail_mode counts"))
        .sum();
    report["attempts"].as_u64().expect("attempts") - fail_mode
}

/// A 2 s sale by 2 processes × 4 tasks over `keys` SKUs drawn with Zipf exponent `zipf`, on a server of its own.
fn sale_of_skus(keys: &str, zipf: &str) -> serde_json::Value {
    let server = common::RedisServer::start();
    let url = server.url();
    let args = [
        "--keys",
        keys,
        "--zipf",
        zipf,
        "--processes",
        "2",
        "--tasks",
        "4",
        "--duration",
        "2s",
    ];
    run(&[&args[..], &["--json", "--redis", &url]].concat())
}

#[test]
fn zipf_skus_each_admit_at_most_their_own_bound() {
    let report = sale_of_skus("1000", "1.1");
    let by = |k: &str| report[k].as_u64().unwrap_or_else(|| panic!("{k} missing: {report}"));
    assert_eq!(by("keys"), 1000, "{report}");
    assert_eq!(by("over_bound_keys"), 0, "{report}");
    assert!((1..=1000).contains(&by("hot_keys")), "{report}");
    assert_eq!(
        by("by_lease") + by("by_store") + by("fallback"),
        by("attempts"),
        "{report}"
    );
    // The SKUs are Redis keys of their own: the hottest is saturated, far from the total admitted.
    let bound = report["bound"].as_f64().expect("bound");
    let hottest = by("max_key_admitted");
    assert!(hottest as f64 <= bound && hottest < by("admitted"), "{report}");
    let per_decision = report["redis_calls_per_decision"].as_f64().expect("per decision");
    let expected = by("redis_calls") as f64 / made(&report) as f64;
    assert!((per_decision - expected).abs() < 1e-9, "{report}");
    assert_eq!(report["zipf"], 1.1);
}

#[test]
fn uniform_skus_are_each_leased_and_saturated() {
    let report = sale_of_skus("20", "0");
    let by = |k: &str| report[k].as_u64().unwrap_or_else(|| panic!("{k} missing: {report}"));
    assert_eq!((by("keys"), by("over_bound_keys")), (20, 0), "{report}");
    // Twenty SKUs share tens of thousands of decisions a second: every one is hot and leases.
    assert_eq!(by("hot_keys"), 20, "{report}");
    // Uniform: every SKU is saturated, so together they admit nearly 20 bounds (each one at most one).
    let bound = report["bound"].as_f64().expect("bound");
    let admitted = by("admitted") as f64;
    assert!(admitted <= 20.0 * bound, "{report}");
    assert!(admitted >= 0.8 * 20.0 * bound, "{report}");
}

#[test]
fn zipf_needs_keys() {
    let out = Command::new(env!("CARGO_BIN_EXE_tokenlease"))
        .args(["flash-sale", "--zipf", "1.1", "--redis", "memory"])
        .output()
        .expect("run tokenlease");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--keys"));
    let out = Command::new(env!("CARGO_BIN_EXE_tokenlease"))
        .args(["flash-sale", "--keys", "0", "--redis", "memory"])
        .output()
        .expect("run tokenlease");
    assert!(!out.status.success(), "--keys 0 is refused");
}

#[test]
fn every_paces_each_task_to_one_decision_per_interval() {
    let report = run(&[
        "--processes",
        "1",
        "--tasks",
        "4",
        "--every",
        "20ms",
        "--duration",
        "1s",
        "--json",
        "--redis",
        "memory",
    ]);
    let attempts = report["attempts"].as_u64().expect("attempts");
    // Four tasks, a tick each 20 ms over 1 s (and the first at the start): at most 4 × 51. A tight loop makes
    // millions; a paced one that ran at all makes at least a few per task.
    assert!((20..=204).contains(&attempts), "{report}");
    assert_eq!(report["every_us"], 20_000);
}

#[test]
fn every_below_a_microsecond_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_tokenlease"))
        .args(["flash-sale", "--every", "0s", "--redis", "memory"])
        .output()
        .expect("run tokenlease");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--every"));
}
