//! Redis memory per key and Redis calls per decision for each algorithm, at "1,000,000 per 60 s" under load
//! (the seeds' stated weakness of the sliding log). `cargo bench --bench memory` prints a table.
//!
//! Each algorithm gets one key driven by 1,000,000 decisions through the public API (64 calls in flight, real
//! time: every decision lands within the 60 s window on this machine), then `MEMORY USAGE key SAMPLES 0` (exact
//! for a ZSET's every member).

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokenlease::{FailMode, Limiter, RedisStore, Rule};

const DECISIONS: u64 = 1_000_000;
const WINDOW: Duration = Duration::from_secs(60);

/// The rules measured, each at 1,000,000 per 60 s.
fn rules() -> Vec<(Rule, &'static str)> {
    let rule = |r: Result<Rule, tokenlease::Error>| r.expect("rule").with_fail_mode(FailMode::Closed);
    vec![
        (
            rule(Rule::token_bucket("token_bucket", DECISIONS, DECISIONS, WINDOW)),
            "token_bucket",
        ),
        (
            rule(Rule::fixed_window("fixed_window", DECISIONS, WINDOW)),
            "fixed_window",
        ),
        (
            rule(Rule::sliding_window("sliding_window", DECISIONS, WINDOW, 6)),
            "sliding_window (6 sub-buckets)",
        ),
        (rule(Rule::sliding_log("sliding_log", DECISIONS, WINDOW)), "sliding_log"),
    ]
}

fn main() {
    let server = common::RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let limiter = {
        let _g = rt.enter();
        let store = RedisStore::connect(&server.url(), Duration::from_secs(5)).expect("store");
        Limiter::builder()
            .store(Arc::new(store))
            .timeout(Duration::from_secs(5))
            .build()
            .expect("limiter")
    };
    println!("| algorithm | key | granted of {DECISIONS} | Redis bytes for the key | decisions/s (64 in flight) |");
    println!("| --- | --- | --- | --- | --- |");
    for (rule, name) in rules() {
        let key = limiter.store_key(&rule.name, "sku");
        let rule = Arc::new(rule);
        let next = Arc::new(AtomicU64::new(0));
        let granted = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        rt.block_on(async {
            let mut tasks = Vec::new();
            for _ in 0..64 {
                let (limiter, next, granted, rule) = (limiter.clone(), next.clone(), granted.clone(), rule.clone());
                tasks.push(tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= DECISIONS {
                            break;
                        }
                        let decision = limiter.check_rule(&rule, "sku", 1).await.expect("check");
                        granted.fetch_add(u64::from(decision.allowed), Ordering::Relaxed);
                    }
                }));
            }
            for t in tasks {
                t.await.expect("task");
            }
        });
        let rate = DECISIONS as f64 / started.elapsed().as_secs_f64();
        let bytes = server
            .cmd(&["MEMORY", "USAGE", &key, "SAMPLES", "0"])
            .unwrap_or_default();
        let bytes = bytes.trim();
        println!(
            "| {name} | `{key}` | {} | {bytes} | {rate:.0} |",
            granted.load(Ordering::Relaxed)
        );
    }
}
