//! The fleet sees itself (invariant 17), on a real redis-server: every process counts the live processes from a
//! leased rule's roster in Redis whatever `expected_processes` says (the count divides a hot key's fair share of
//! the burst), and the rules beat side by side.

mod common;

use std::sync::Arc;
use std::time::Duration;

use tokenlease::{Clock, Lease, Limiter, MemoryStore, Rule, TokioClock};

const TIMEOUT: Duration = Duration::from_millis(50);

/// 40 tokens refilled at 20 a second.
const CAPACITY: u64 = 40;
const RATE: u64 = 20;

/// `name`'s rule, leased from its first decision: a leased rule joins its fleet at its first lease.
fn leased(name: &str) -> Rule {
    let lease = Lease {
        min_batch: 1,
        max_batch: 5,
        ttl: Duration::from_millis(200),
        hot_after: Some(1),
        reserve: None,
    };
    Rule::token_bucket(name, CAPACITY, RATE, Duration::from_secs(1))
        .and_then(|r| r.with_lease(lease))
        .expect("rule")
}

/// A process on `url`, told (wrongly) that the fleet has `expected` processes.
fn process(url: &str, expected: u32) -> Limiter {
    common::limiter([leased("sale")])
        .redis_url(url)
        .timeout(TIMEOUT)
        .expected_processes(expected)
        .build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_process_counts_the_live_fleet_whatever_the_setting_says() {
    let server = common::RedisServer::start();
    let mut fleet: Vec<Limiter> = (0..6).map(|_| process(&server.url(), 4)).collect();
    assert_eq!(fleet[0].processes("sale"), 4, "before the first count: the setting");
    for l in &fleet {
        assert!(l.check("sale", "k", 1).await.expect("decision").allowed);
    }
    common::until_all_count(&fleet, "sale", 6, Duration::from_secs(5)).await;
    // Two leave: the others count four once they have missed three beats.
    for l in fleet.drain(4..) {
        l.shutdown().await;
    }
    common::until_all_count(&fleet, "sale", 4, Duration::from_secs(8)).await;
    for l in &fleet {
        l.shutdown().await;
    }
}

/// A store that hangs delays no rule's beat behind the others': the rules beat side by side. Five leased rules on
/// an in-process store that answers every call after 900 ms (within a beat's timeout, 1 s at the 50 ms call
/// timeout), on tokio's paused clock: a pass of beats takes 0.9 s, then the wait of a second. One rule after
/// another a pass took 4.5 s, and a rule's beats came 5.5 s apart, longer than the fleet's live window (3 s):
/// the others would have counted this process gone.
#[tokio::test(start_paused = true)]
async fn a_hanging_store_delays_no_rules_beat_behind_the_others() {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
    let store = Arc::new(MemoryStore::with_clock(clock.clone()).with_latency(Duration::from_millis(900)));
    let rules: Vec<Rule> = (0..5).map(|i| leased(&format!("r{i}"))).collect();
    let limiter = Limiter::builder()
        .rules(rules)
        .store(store)
        .clock(clock)
        .timeout(TIMEOUT)
        .build()
        .expect("limiter");
    for i in 0..5 {
        // Joins the rule's fleet: its first lease, sent in the background, waits for its first beat (the
        // caller is refused, as the lease outlasts its wait).
        let _ = limiter.check(&format!("r{i}"), "k", 1).await.expect("decision");
    }
    let before = limiter.stats().beats;
    tokio::time::sleep(Duration::from_secs(19)).await;
    let beats = limiter.stats().beats - before;
    // About ten passes of five beats in 19 s; one rule after another, about three and a half.
    assert!(beats >= 40, "{beats} beats of five rules in 19 s");
    limiter.shutdown().await;
}
