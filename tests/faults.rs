//! Redis faults against real redis-server processes: scripts flushed, data flushed, the server frozen.

mod common;

use std::time::{Duration, Instant};

use tokenlease::{FailMode, Lease, Limiter, Rule, Source};

const TIMEOUT: Duration = Duration::from_millis(100);

/// A closed token bucket and an open sliding log of 3 each on `server`, calls timing out after [`TIMEOUT`].
fn on_redis(server: &common::RedisServer) -> Limiter {
    let rules = [
        Rule::token_bucket("tb", 3, 1, Duration::from_secs(3600))
            .expect("rule")
            .with_fail_mode(FailMode::Closed),
        Rule::sliding_log("log", 3, Duration::from_secs(3600))
            .expect("rule")
            .with_fail_mode(FailMode::Open),
    ];
    common::limiter(rules).redis(server).timeout(TIMEOUT).build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_is_reloaded_transparently() {
    let server = common::RedisServer::start();
    let l = on_redis(&server);
    assert_eq!(l.check("tb", "k", 1).await.expect("check").source, Source::Redis);
    assert!(server.cmd(&["SCRIPT", "FLUSH"]).expect("flush").contains("OK"));
    for rule in ["tb", "log"] {
        let d = l.check(rule, "k", 1).await.expect("check");
        assert!(
            d.allowed && d.source == Source::Redis,
            "{rule}: {d:?} (NOSCRIPT must load the script again)"
        );
    }
}

/// FLUSHALL (or a restart that loses every key) resets every limit: buckets restart full, logs empty. A process
/// that saw a key refused keeps refusing it until the refusal's retry_after (it may sell less, never more), unless
/// it is told with `reset`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_restarts_buckets_full() {
    let server = common::RedisServer::start();
    let l = on_redis(&server);
    for rule in ["tb", "log"] {
        for _ in 0..3 {
            assert!(l.check(rule, "k", 1).await.expect("check").allowed);
        }
        assert!(
            !l.check(rule, "k", 1).await.expect("check").allowed,
            "{rule} is used up"
        );
    }
    assert!(server.cmd(&["FLUSHALL"]).expect("flushall").contains("OK"));
    let other = on_redis(&server);
    for rule in ["tb", "log"] {
        let d = other.check(rule, "k", 1).await.expect("check");
        assert!(d.allowed && d.source == Source::Redis, "{rule} starts over: {d:?}");
        let d = l.check(rule, "k", 1).await.expect("check");
        assert!(
            !d.allowed && d.source == Source::Local,
            "{rule}: the refusal is remembered: {d:?}"
        );
        l.reset(rule, "k").await.expect("reset");
        let d = l.check(rule, "k", 1).await.expect("check");
        assert!(
            d.allowed && d.source == Source::Redis,
            "{rule}: reset forgets it: {d:?}"
        );
    }
}

/// A frozen Redis (SIGSTOP): every call answers within its timeout by fail_mode, none hangs; the circuit breaker
/// opens after 5 failures and stops calling; after SIGCONT it half-opens, probes, closes, and the limiter answers
/// from Redis again by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_redis_costs_callers_no_more_than_the_timeout() {
    let server = common::RedisServer::start();
    let l = on_redis(&server);
    assert!(l.check("tb", "k", 1).await.expect("check").allowed);
    server.freeze();
    for _ in 0..5 {
        for (rule, allowed) in [("tb", false), ("log", true)] {
            let started = Instant::now();
            let d = l.check(rule, "k", 1).await.expect("a decision, not an error");
            let took = started.elapsed();
            assert_eq!((d.allowed, d.source), (allowed, Source::Fallback), "{rule}");
            // The timeout plus scheduling slack on a loaded 2-core machine.
            assert!(took < TIMEOUT * 4, "{rule} took {took:?}");
        }
    }
    // After 5 failures in a row the circuit breaker opened: callers are answered at once and the frozen
    // server is not called at all.
    assert!(l.circuit_open());
    let calls = l.store_calls();
    let started = Instant::now();
    for _ in 0..1000 {
        let d = l.check("tb", "other", 1).await.expect("decision");
        assert_eq!((d.allowed, d.source), (false, Source::Fallback));
    }
    assert_eq!(l.store_calls(), calls, "an open breaker sends nothing");
    let stats = l.stats();
    // 5 calls timed out, then the breaker opened for the other 5 of the loop and the 1000.
    assert_eq!(stats.fail_mode_timeouts, 5, "{stats:?}");
    assert_eq!(stats.fail_mode_circuit_open, 1005, "{stats:?}");
    assert_eq!(stats.fail_mode_errors, 0, "{stats:?}");
    assert!(
        started.elapsed() < TIMEOUT,
        "1000 calls answered in {:?}",
        started.elapsed()
    );
    server.thaw();
    // It half-opens after 500 ms, one probe succeeds, and it closes.
    // real time: waits for the thawed redis-server.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let d = l.check("tb", "k", 1).await.expect("check");
        if d.source == Source::Redis {
            assert!(!l.circuit_open());
            break;
        }
        assert!(Instant::now() < deadline, "never recovered after SIGCONT");
        // real time: the thawed redis-server and the breaker's 500 ms before it half-opens.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Invariant 13: a lease slower than callers wait (a 60 ms round trip through a delaying proxy, callers waiting
/// 2 × 20 ms + 5 ms, the lease itself 200 ms) is not a failed store. The callers that give up are refused
/// locally with a short retry_after, nothing is decided by fail_mode, and the lease's tokens serve the next
/// callers. A direct call slower than its own timeout is a store timeout, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_lease_is_not_a_failed_store() {
    let server = common::RedisServer::start();
    let proxy = common::proxy::DelayProxy::start(server.port, Duration::ZERO);
    let lease = Lease {
        min_batch: 10,
        max_batch: 10,
        ttl: Duration::from_secs(60),
        hot_after: Some(1),
        reserve: None,
    };
    let rules = [
        Rule::token_bucket("leased", 100, 1, Duration::from_secs(3600))
            .and_then(|r| r.with_lease(lease))
            .expect("rule")
            .with_fail_mode(FailMode::Open),
        Rule::token_bucket("direct", 100, 1, Duration::from_secs(3600))
            .expect("rule")
            .with_fail_mode(FailMode::Open),
    ];
    let l = common::limiter(rules)
        .redis_url(&proxy.url())
        .timeout(Duration::from_millis(20))
        .build();
    // Connected, and the scripts loaded, before the network slows down.
    for rule in ["leased", "direct"] {
        let d = l.check(rule, "warm", 1).await.expect("check");
        assert!(d.allowed && d.source != Source::Fallback, "{rule}: {d:?}");
    }
    proxy.set_delay(Duration::from_millis(30));
    let d = l.check("leased", "k", 1).await.expect("check");
    assert_eq!(
        (d.allowed, d.source),
        (false, Source::Local),
        "gave up on the slow lease: {d:?}"
    );
    assert!(d.retry_after <= Duration::from_millis(1), "{d:?}");
    // The lease goes on and lands: its tokens serve the next callers, locally.
    // real time: waits for the delaying proxy.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let d = l.check("leased", "k", 1).await.expect("check");
        assert_ne!(d.source, Source::Fallback, "{d:?}");
        if d.allowed {
            assert_eq!(d.source, Source::Local);
            break;
        }
        assert!(Instant::now() < deadline, "the slow lease never landed");
    }
    assert_eq!(
        l.stats().fail_mode_timeouts + l.stats().fail_mode_errors,
        0,
        "{:?}",
        l.stats()
    );

    let d = l.check("direct", "k", 1).await.expect("check");
    assert_eq!((d.allowed, d.source), (true, Source::Fallback), "{d:?}");
    assert_eq!(l.stats().fail_mode_timeouts, 1, "{:?}", l.stats());
    l.shutdown().await;
}
