//! The fleet sees itself (invariants 17 and 19), on a real redis-server: every process counts the live
//! processes from the rule's roster in Redis whatever `expected_processes` says, and after an outage a process
//! that just started does not sell ahead of what the others sold alone.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::timeline::Timeline;
use tokenlease::{FailMode, Limiter, Rule, Source};

const TIMEOUT: Duration = Duration::from_millis(50);

/// 40 tokens refilled at 20 a second, `local`: each process sells its share alone while Redis is away.
const CAPACITY: u64 = 40;
const RATE: u64 = 20;

fn sale() -> Rule {
    Rule::token_bucket("sale", CAPACITY, RATE, Duration::from_secs(1))
        .expect("rule")
        .with_fail_mode(FailMode::Local)
}

/// A process on `url`, told (wrongly) that the fleet has `expected` processes.
fn process(url: &str, expected: u32) -> Limiter {
    common::limiter([sale()])
        .redis_url(url)
        .timeout(TIMEOUT)
        .expected_processes(expected)
        .build()
}

/// Waits (real time, the beats run on their own) until every limiter counts `n`, or panics after `limit`.
async fn until_all_count(limiters: &[Limiter], n: u64, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let counts: Vec<u64> = limiters.iter().map(|l| l.processes("sale")).collect();
        if counts.iter().all(|c| *c == n) {
            return;
        }
        assert!(Instant::now() < deadline, "never all {n}: {counts:?}");
        // real time: the beats run every second.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_process_counts_the_live_fleet_whatever_the_setting_says() {
    let server = common::RedisServer::start();
    let mut fleet: Vec<Limiter> = (0..6).map(|_| process(&server.url(), 4)).collect();
    assert_eq!(fleet[0].processes("sale"), 4, "before the first count: the setting");
    for l in &fleet {
        assert!(l.check("sale", "k", 1).await.expect("decision").allowed);
    }
    until_all_count(&fleet, 6, Duration::from_secs(5)).await;
    // Two leave: the others count four once they have missed three beats.
    for l in fleet.drain(4..) {
        l.shutdown().await;
    }
    until_all_count(&fleet, 4, Duration::from_secs(8)).await;
    for l in &fleet {
        l.shutdown().await;
    }
}

/// Four processes sell a quiet key alone through a 3 s freeze of Redis, then stop calling it; a fifth process
/// starts as Redis comes back and calls the key at once, before any of them. The fleet's hold keeps it from
/// selling the refilled bucket again before the others' debts are charged: the bound holds in every window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_starts_after_an_outage_does_not_sell_ahead_of_the_fleets_debts() {
    let server = common::RedisServer::start();
    let timeline = Arc::new(Timeline::new(Duration::from_secs(20)));
    let sellers: Vec<Limiter> = (0..4).map(|_| process(&server.url(), 4)).collect();
    let selling = Arc::new(AtomicBool::new(true));
    let alone = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for l in &sellers {
        let (l, timeline, selling, alone) = (l.clone(), timeline.clone(), selling.clone(), alone.clone());
        tasks.push(tokio::spawn(async move {
            while selling.load(Ordering::Relaxed) {
                if let Ok(d) = l.check("sale", "k", 1).await {
                    if d.allowed {
                        timeline.record(1);
                        if d.source == Source::Fallback {
                            alone.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                // real time: a steady demand, a call every 5 ms per process.
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    // real time: the fleet counts itself and drains the bucket.
    tokio::time::sleep(Duration::from_secs(2)).await;
    until_all_count(&sellers, 4, Duration::from_secs(5)).await;
    server.freeze();
    // real time: the outage; the sellers sell their shares alone for 2 s, then the key goes quiet.
    tokio::time::sleep(Duration::from_secs(2)).await;
    selling.store(false, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("seller");
    }
    assert!(alone.load(Ordering::Relaxed) > 0, "the sellers sold alone");
    // real time: the rest of the 3 s outage.
    tokio::time::sleep(Duration::from_secs(1)).await;
    server.thaw();
    let newcomer = process(&server.url(), 4);
    let deadline = Instant::now() + Duration::from_secs(6);
    let mut by_redis = 0;
    while Instant::now() < deadline {
        if let Ok(d) = newcomer.check("sale", "k", 1).await {
            if d.allowed {
                timeline.record(1);
                by_redis += u64::from(d.source == Source::Redis);
            }
        }
        // real time: the newcomer's demand, a call every 2 ms.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(by_redis > 0, "the newcomer sells once the fleet has charged");
    // Every window from 0.2 s to the whole run: capacity + rate × W (no lease: no TTL term), W taken from the times
    // the answers arrived: an answer arrives within the call's timeout of Redis's grant, so grants recorded W
    // apart were at least W − timeout apart.
    let worst = timeline.worst(Duration::from_millis(200), |w| {
        CAPACITY as f64 + RATE as f64 * (w + TIMEOUT).as_secs_f64()
    });
    eprintln!("worst window: {worst:?}");
    assert!(worst.ratio <= 1.0, "over the bound in a window: {worst:?}");
    for l in sellers.iter().chain([&newcomer]) {
        l.shutdown().await;
    }
}
