//! The lease cache against a real Redis: the shared limit holds across limiters, unused tokens go back,
//! refusals are served locally.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokenlease::{FakeClock, Lease, Rule, Source};

/// `rule` on `server` with 1 s timeouts, as one of 2 processes.
fn on_redis(server: &common::RedisServer, rule: Rule) -> common::TestLimiter {
    common::limiter([rule])
        .redis(server)
        .timeout(Duration::from_secs(1))
        .expected_processes(2)
}

/// Tokens in the Redis bucket now, from its hash (a missing key is a full bucket).
fn redis_tokens(server: &common::RedisServer, key: &str, capacity: u64, per_ms: u64) -> u64 {
    let out = server.cmd(&["HGET", key, "level"]).unwrap_or_default();
    match out.trim().parse::<u64>() {
        Ok(level) => level / per_ms,
        Err(_) => capacity,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_limiters_by_eight_tasks_never_admit_more_than_the_bound() {
    let server = common::RedisServer::start();
    let (capacity, rate_per_s, ttl) = (200_u64, 400_u64, Duration::from_millis(100));
    let rule = || {
        Rule::token_bucket("hot", capacity, rate_per_s, Duration::from_secs(1))
            .and_then(|r| {
                r.with_lease(Lease {
                    min_batch: 5,
                    max_batch: 50,
                    ttl,
                    hot_after: Some(1),
                    reserve: None,
                })
            })
            .expect("rule")
    };
    let limiters = [on_redis(&server, rule()).build(), on_redis(&server, rule()).build()];
    let admitted = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let run_for = Duration::from_millis(1500);
    let mut tasks = Vec::new();
    for limiter in &limiters {
        for _ in 0..8 {
            let (limiter, admitted) = (limiter.clone(), admitted.clone());
            tasks.push(tokio::spawn(async move {
                while started.elapsed() < run_for {
                    let d = limiter.check("hot", "sku:1", 1).await.expect("check");
                    if d.allowed {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                    tokio::task::yield_now().await;
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("task");
    }
    let span = started.elapsed().as_secs_f64();
    let admitted = admitted.load(Ordering::Relaxed) as f64;
    let bound = capacity as f64 + rate_per_s as f64 * (span + ttl.as_secs_f64());
    assert!(admitted <= bound, "admitted {admitted} > bound {bound:.0}");
    // Saturated for the whole run: nearly every token is admitted (loose: a loaded 2-core machine).
    assert!(
        admitted >= 0.7 * bound,
        "admitted {admitted} < 70 % of bound {bound:.0}"
    );
    for l in &limiters {
        l.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unused_tokens_go_back_on_lease_expiry() {
    let server = common::RedisServer::start();
    let clock = FakeClock::default();
    // 1 token per hour: the shared bucket does not refill during the test.
    let rule = Rule::token_bucket("exp", 100, 1, Duration::from_secs(3600))
        .and_then(|r| {
            r.with_lease(Lease {
                min_batch: 20,
                max_batch: 20,
                ttl: Duration::from_millis(100),
                hot_after: Some(1),
                reserve: None,
            })
        })
        .expect("rule");
    let limiter = on_redis(&server, rule).clock(Arc::new(clock.clone())).build();
    let key = limiter.store_key("exp", "k");
    let d = limiter.check("exp", "k", 1).await.expect("check");
    assert!(d.allowed);
    assert_eq!(
        redis_tokens(&server, &key, 100, 3_600_000),
        80,
        "one batch of 20 leased"
    );
    assert_eq!(d.source, Source::Local);
    // Before the TTL nothing goes back.
    // real time: the sweeper gives back to redis-server, whose answers a paused clock would not wait for (it
    // jumps to the call timeouts); the fake clock alone says when the lease is due.
    clock.advance(Duration::from_millis(99));
    tokio::time::sleep(Duration::from_millis(100)).await; // real time: the sweeper's pass against redis-server
    assert_eq!(redis_tokens(&server, &key, 100, 3_600_000), 80);
    // After it, the sweeper gives the 19 unused tokens back.
    clock.advance(Duration::from_millis(2));
    // real time: waits for the give-back to reach redis-server.
    let deadline = Instant::now() + Duration::from_secs(5);
    while redis_tokens(&server, &key, 100, 3_600_000) != 99 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await; // real time: the give-back reaching redis-server
    }
    assert_eq!(redis_tokens(&server, &key, 100, 3_600_000), 99);
    assert_eq!(limiter.stats().returned_tokens, 19);
    limiter.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_gives_every_leased_token_back() {
    let server = common::RedisServer::start();
    let rule = Rule::token_bucket("sd", 100, 1, Duration::from_secs(3600))
        .and_then(|r| {
            r.with_lease(Lease {
                min_batch: 30,
                max_batch: 60,
                ttl: Duration::from_secs(60),
                hot_after: Some(1),
                reserve: None,
            })
        })
        .expect("rule");
    let limiter = on_redis(&server, rule).build();
    for key in ["a", "b", "c"] {
        for _ in 0..5 {
            assert!(limiter.check("sd", key, 1).await.expect("check").allowed);
        }
    }
    // Alone in its fleet (the roster counts one process, whatever `expected_processes` says), a process's share is
    // the whole bucket: batches of the max batch, 60.
    assert_eq!(limiter.processes("sd"), 1);
    for key in ["a", "b", "c"] {
        assert_eq!(redis_tokens(&server, &limiter.store_key("sd", key), 100, 3_600_000), 40);
    }
    limiter.shutdown().await;
    for key in ["a", "b", "c"] {
        assert_eq!(
            redis_tokens(&server, &limiter.store_key("sd", key), 100, 3_600_000),
            95,
            "key {key}"
        );
    }
    assert!(matches!(
        limiter.check("sd", "a", 1).await,
        Err(tokenlease::Error::ShutDown)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_hot_key_is_refused_locally() {
    let server = common::RedisServer::start();
    // 10 tokens, then 1 per 10 minutes.
    let rule = Rule::token_bucket("ref", 10, 1, Duration::from_secs(600))
        .and_then(|r| {
            r.with_lease(Lease {
                min_batch: 5,
                max_batch: 10,
                ttl: Duration::from_secs(60),
                hot_after: Some(1),
                reserve: None,
            })
        })
        .expect("rule");
    let limiter = on_redis(&server, rule).build();
    let mut admitted = 0;
    for _ in 0..20 {
        admitted += u64::from(limiter.check("ref", "sku", 1).await.expect("check").allowed);
    }
    assert_eq!(admitted, 10, "the whole capacity, not more");
    let before = server.script_calls();
    let mut refused = 0;
    for _ in 0..10_000 {
        let d = limiter.check("ref", "sku", 1).await.expect("check");
        assert!(!d.allowed);
        assert!(
            d.retry_after > Duration::from_secs(500),
            "retry_after {:?}",
            d.retry_after
        );
        refused += u64::from(d.source == Source::Local);
    }
    let calls = server.script_calls() - before;
    assert!(calls <= 3, "Redis saw {calls} script calls for 10 000 refusals");
    assert_eq!(refused, 10_000);
    limiter.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_costs_redis_a_call_per_batch() {
    let server = common::RedisServer::start();
    let rule = Rule::token_bucket("batch", 100_000, 100_000, Duration::from_secs(1))
        .and_then(|r| {
            r.with_lease(Lease {
                min_batch: 100,
                max_batch: 1000,
                ttl: Duration::from_secs(5),
                hot_after: Some(1),
                reserve: None,
            })
        })
        .expect("rule");
    let limiter = on_redis(&server, rule).build();
    let before = server.script_calls();
    for _ in 0..20_000 {
        assert!(limiter.check("batch", "sku", 1).await.expect("check").allowed);
    }
    let calls = server.script_calls() - before;
    assert!(calls <= 60, "{calls} Redis calls for 20 000 admissions");
    limiter.shutdown().await;
}

/// The local cache keeps at most `max_local_keys`: the idlest keys are evicted and their tokens given back.
/// Paused time: the sweeper (every second here) evicts; waiting for it takes no real time.
#[tokio::test(start_paused = true)]
async fn the_local_cache_is_bounded_and_evicted_tokens_go_back() {
    let rule = Rule::token_bucket("many", 100, 1, Duration::from_secs(3600))
        .and_then(|r| {
            r.with_lease(Lease {
                min_batch: 10,
                max_batch: 10,
                ttl: Duration::from_secs(60),
                hot_after: Some(1),
                reserve: None,
            })
        })
        .expect("rule");
    let local = tokenlease::ProcessConfig {
        max_local_keys: 10,
        idle_ttl: Duration::from_secs(600),
        ..Default::default()
    };
    let limiter = common::limiter([rule])
        .tokio_clock()
        .process(local)
        .expected_processes(1)
        .build();
    for user in 0..50 {
        assert!(
            limiter
                .check("many", &format!("user:{user}"), 1)
                .await
                .expect("check")
                .allowed
        );
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while limiter.local_keys() > 10 && tokio::time::Instant::now() < deadline {
        // virtual time (paused clock): waits for the sweeper's eviction, taking no real time.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(limiter.local_keys() <= 10, "{} local keys", limiter.local_keys());
    // Each evicted key had 9 unused tokens of its batch of 10.
    while limiter.stats().returned_tokens < 40 * 9 && tokio::time::Instant::now() < deadline {
        // virtual time (paused clock): waits for the evicted keys' give-backs, taking no real time.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(limiter.stats().returned_tokens, 40 * 9);
    limiter.shutdown().await;
    assert_eq!(limiter.stats().returned_tokens, 50 * 9);
}
