//! The main job, end to end: a short multi-process `tokenlease flash-sale` against a real Redis.

mod common;

use std::process::Command;

/// The runs are multi-process and timed: one at a time, so that they do not starve each other of the two cores.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn run(args: &[&str]) -> serde_json::Value {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let out = Command::new(env!("CARGO_BIN_EXE_tokenlease"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
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
    let report = run(&[
        "--processes",
        "3",
        "--tasks",
        "4",
        "--duration",
        "3s",
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
    for field in [
        "span_s",
        "capacity",
        "rate_per_s",
        "lease_ttl_s",
        "attempts",
        "rejected",
        "decisions_per_s",
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
