//! Redis stopped: each fail_mode does what it says, within the timeout, and the limiter recovers by itself.

mod common;

use std::time::{Duration, Instant};

use tokenlease::{FailMode, Lease, Limiter, Rule, Source};

const TIMEOUT: Duration = Duration::from_millis(100);

/// The rules of these tests, one per fail mode.
fn rules() -> [Rule; 5] {
    let rule = |name: &str, mode: FailMode| {
        Rule::token_bucket(name, 8, 1, Duration::from_secs(3600))
            .expect("rule")
            .with_fail_mode(mode)
    };
    // 100 tokens, leased 1 to 10 at a time.
    let leased = |name: &str, mode: FailMode| {
        let lease = Lease {
            min_batch: 1,
            max_batch: 10,
            ttl: Duration::from_secs(60),
            hot_after: Some(1),
            reserve: None,
        };
        Rule::token_bucket(name, 100, 1, Duration::from_secs(3600))
            .and_then(|r| r.with_lease(lease))
            .expect("rule")
            .with_fail_mode(mode)
    };
    [
        rule("open", FailMode::Open),
        rule("closed", FailMode::Closed),
        rule("local", FailMode::Local),
        leased("leased_closed", FailMode::Closed),
        leased("leased_local", FailMode::Local),
    ]
}

/// [`rules`] on `server`, calls timing out after [`TIMEOUT`], as one of 4 processes.
fn on_redis(server: &common::RedisServer) -> Limiter {
    common::limiter(rules())
        .redis(server)
        .timeout(TIMEOUT)
        .expected_processes(4)
        .build()
}

/// Runs a check and asserts it answered within a bound that holds on a loaded machine.
async fn timed(l: &Limiter, rule: &str, key: &str) -> tokenlease::Decision {
    let started = Instant::now();
    let d = l
        .check(rule, key, 1)
        .await
        .expect("a store failure is a decision, not an error");
    let took = started.elapsed();
    assert!(took < TIMEOUT * 5, "{rule}: {took:?}");
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_fail_mode_does_what_it_says_and_recovers() {
    let mut server = common::RedisServer::start();
    let l = on_redis(&server);
    for rule in ["open", "closed", "local"] {
        let d = timed(&l, rule, "before").await;
        assert!(d.allowed && d.source == Source::Redis, "{rule}: {d:?}");
    }
    // The leased keys lease a batch (1 to 10 tokens) and spend it in process.
    for rule in ["leased_closed", "leased_local"] {
        assert_eq!(timed(&l, rule, "k").await.source, Source::Local, "{rule}");
    }
    let leased = l.stats().leased_tokens;
    assert!(leased >= 2, "{leased}");

    server.stop();
    for _ in 0..20 {
        let d = timed(&l, "open", "u").await;
        assert!(d.allowed && d.source == Source::Fallback, "open: {d:?}");
        // local sells nothing the store did not grant before: a key without a lease refuses as closed does.
        for rule in ["closed", "local"] {
            let d = timed(&l, rule, "u").await;
            assert!(!d.allowed && d.source == Source::Fallback, "{rule}: {d:?}");
        }
    }
    // A leased key spends what it already holds, then refuses, in both modes: nothing is sold on credit.
    let mut leased_allowed = 0;
    for _ in 0..25 {
        for rule in ["leased_closed", "leased_local"] {
            let d = timed(&l, rule, "k").await;
            assert!(!d.allowed || d.source == Source::Local, "{rule}: {d:?}");
            leased_allowed += u64::from(d.allowed);
        }
    }
    // A lease sent before the stop may have landed since: read what was leased once nothing more can be.
    let leased = l.stats().leased_tokens;
    assert!(
        leased_allowed + 2 <= leased,
        "only the tokens already leased: {leased_allowed} of {leased}"
    );
    // A stopped server refuses connections: store errors (or a reconnection that outlasts the timeout), then
    // the open breaker; every decision made by fail_mode is counted with its reason.
    let stats = l.stats();
    let counted = stats.fail_mode_errors + stats.fail_mode_timeouts + stats.fail_mode_circuit_open;
    assert!(
        stats.fail_mode_errors > 0 && stats.fail_mode_circuit_open > 0,
        "{stats:?}"
    );
    assert!(counted >= 60 + (50 - leased_allowed), "{stats:?}");

    server.restart();
    // Recovers by itself: the connection manager reconnects; the fallback back-off is 100 ms.
    // real time: waits for the restarted redis-server (here and below).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut sources = Vec::new();
    while Instant::now() < deadline {
        let d = timed(&l, "closed", "after").await;
        sources.push(d.source);
        if d.source == Source::Redis {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await; // real time: the restarted redis-server
    }
    assert_eq!(sources.last(), Some(&Source::Redis), "never recovered: {sources:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let d = timed(&l, "leased_closed", "k2").await;
        if d.allowed {
            assert_eq!(d.source, Source::Local);
            break;
        }
        assert!(Instant::now() < deadline, "the leased rule never recovered");
        tokio::time::sleep(Duration::from_millis(50)).await; // real time: the restarted redis-server
    }
    l.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_builds_while_redis_is_down() {
    let mut server = common::RedisServer::start();
    server.stop();
    let l = on_redis(&server);
    let d = timed(&l, "closed", "x").await;
    assert!(!d.allowed && d.source == Source::Fallback);
    server.restart();
    // real time: waits for the restarted redis-server.
    let deadline = Instant::now() + Duration::from_secs(10);
    while timed(&l, "closed", "x").await.source != Source::Redis {
        assert!(Instant::now() < deadline, "never connected");
        tokio::time::sleep(Duration::from_millis(50)).await; // real time: the restarted redis-server
    }
}
