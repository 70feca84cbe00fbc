//! No debt vanishes and none is charged twice (invariant 12, issue 19 item 4), on a real redis-server: what
//! `fail_mode = "local"` admitted alone is charged once even when the debit's answer is lost after Redis applied it,
//! and what shutdown finally gives up is logged and counted in `tokenlease_debt_dropped_tokens_total`.

mod common;

use std::time::{Duration, Instant};

use common::proxy::DelayProxy;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;
use tokenlease::{FailMode, Limiter, Rule, Source};

/// The call timeout: a debit's own timeout is ten of them, 1 s.
const TIMEOUT: Duration = Duration::from_millis(100);
/// 100 tokens refilled at 1 per hour: nothing refills during a test.
const CAPACITY: u64 = 100;
const PER_MS: u64 = 3_600_000;

fn rule() -> Rule {
    Rule::token_bucket("stock", CAPACITY, 1, Duration::from_millis(PER_MS))
        .expect("rule")
        .with_fail_mode(FailMode::Local)
}

/// 100 posts per hour, a fixed window: what it admits alone is written back to the window.
fn posts() -> Rule {
    Rule::fixed_window("posts", 100, Duration::from_secs(3600))
        .expect("rule")
        .with_fail_mode(FailMode::Local)
}

/// A single process on `url`: its local share is the whole of what Redis last reported.
fn process(url: &str) -> Limiter {
    common::limiter([rule(), posts()])
        .redis_url(url)
        .timeout(TIMEOUT)
        .expected_processes(1)
        .build()
}

/// Whole tokens in the Redis bucket of `k` now (a missing key is a full bucket).
fn tokens_in_redis(server: &common::RedisServer) -> u64 {
    let level = server.cmd(&["HGET", "tl:{stock:k}", "level"]).unwrap_or_default();
    level
        .trim()
        .parse::<i64>()
        .map_or(CAPACITY, |l| u64::try_from(l.max(0)).unwrap_or(0) / PER_MS)
}

/// Debit marks held by Redis.
fn marks(server: &common::RedisServer) -> usize {
    let keys = server.cmd(&["KEYS", "tl:{stock:k}:debit:*"]).unwrap_or_default();
    keys.lines().filter(|l| !l.trim().is_empty()).count()
}

/// Tallies of a stretch of decisions: allowed by Redis, allowed alone (fail_mode), all.
#[derive(Debug, Default)]
struct Tally {
    by_redis: u64,
    alone: u64,
    calls: u64,
}

impl Tally {
    async fn check(&mut self, l: &Limiter) -> tokenlease::Decision {
        let d = l.check("stock", "k", 1).await.expect("a decision");
        self.calls += 1;
        if d.allowed {
            match d.source {
                Source::Fallback => self.alone += 1,
                _ => self.by_redis += 1,
            }
        }
        d
    }
}

/// A debit whose answer comes back after the debit's own timeout (a link that turns slow, 600 ms each way, when the
/// debit waits 1 s) was applied by Redis all the same; the limiter sends it again, same id, once the link is fast,
/// and Redis does not apply it twice: the bucket ends charged exactly what was sold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debit_applied_after_its_timeout_is_charged_once() {
    let mut server = common::RedisServer::start();
    let proxy = DelayProxy::start(server.port, Duration::ZERO);
    let l = process(&proxy.url());
    let mut tally = Tally::default();
    // Redis reports 99 left: the local share is 99.
    assert!(tally.check(&l).await.allowed);
    assert_eq!(tally.by_redis, 1);

    server.stop();
    let deadline = Instant::now() + Duration::from_secs(10);
    while tally.alone < 10 {
        let _ = tally.check(&l).await;
        assert!(Instant::now() < deadline, "never sold alone: {tally:?}");
        // real time: waits for the breaker while redis-server is down.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Back without the key (full). The limiter reconnects and the fleet's beats charge the debt without a
    // caller asking (one debit, or two when the first was sent while the outage lasted).
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokens_in_redis(&server) > CAPACITY - tally.alone || !l.readiness().await.ready {
        assert!(Instant::now() < deadline, "the debt was never charged: {tally:?}");
        // real time: the breaker half-opens on its own clock.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        tokens_in_redis(&server),
        CAPACITY - tally.alone,
        "the debt, charged once"
    );
    let (first_alone, first_marks) = (tally.alone, marks(&server));

    // The link turns slow: a call reaches Redis after 600 ms and its answer comes back after 1.2 s, past the
    // 100 ms timeout of every call but a debit's (1 s). The connection stays up, so no handshake is needed:
    // the process sells alone again, and the debit of that, sent as a breaker probe, is applied by Redis while
    // its answer is lost.
    proxy.set_delay(Duration::from_millis(600));
    let deadline = Instant::now() + Duration::from_secs(20);
    while marks(&server) == first_marks {
        let _ = tally.check(&l).await;
        assert!(
            Instant::now() < deadline,
            "the second debit never reached Redis: {tally:?}"
        );
        // real time: the breaker half-opens on its own clock, and a call takes 600 ms to arrive.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(tally.alone > first_alone, "sold alone behind the slow link: {tally:?}");
    proxy.set_delay(Duration::ZERO);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let d = tally.check(&l).await;
        if d.source == Source::Redis {
            break;
        }
        assert!(Instant::now() < deadline, "never decided by Redis again: {tally:?}");
        // real time: the breaker and the hold after the charge.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    l.shutdown().await;
    let sold_since = tally.by_redis - 1;
    assert_eq!(
        tokens_in_redis(&server),
        CAPACITY - tally.alone - sold_since,
        "the bucket is charged once with what was sold alone ({tally:?}, {} marks)",
        marks(&server)
    );
}

/// A process that shuts down while Redis is still away keeps trying for shutdown's patience (5 s), then gives the
/// debt up (a token bucket's debit, a window's write-back): counted per rule in
/// `tokenlease_debt_dropped_tokens_total`, so an operator sees how far over the limit the fleet may have gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debt_given_up_at_shutdown_is_counted_per_rule() {
    let mut server = common::RedisServer::start();
    let recorder = DebuggingRecorder::new();
    let snapshot = recorder.snapshotter();
    let l = metrics::with_local_recorder(&recorder, || process(&server.url()));
    let mut tally = Tally::default();
    assert!(tally.check(&l).await.allowed);
    // The window's store answer: 99 left this hour, all of it this process's share.
    assert!(l.check("posts", "u", 1).await.expect("a decision").allowed);
    server.stop();
    let deadline = Instant::now() + Duration::from_secs(10);
    while tally.alone < 7 {
        let _ = tally.check(&l).await;
        assert!(Instant::now() < deadline, "never sold alone: {tally:?}");
        // real time: waits for the breaker while redis-server is down.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut posted = 0;
    for _ in 0..5 {
        let d = l.check("posts", "u", 1).await.expect("a decision");
        assert_eq!(d.source, Source::Fallback, "{d:?}");
        posted += u64::from(d.allowed);
    }
    assert_eq!(posted, 5, "the window's share admits alone");
    let started = Instant::now();
    l.shutdown().await;
    let waited = started.elapsed();
    assert!(waited >= Duration::from_secs(5), "gave up after {waited:?}");
    let metrics = snapshot.snapshot().into_vec();
    let dropped = |rule: &str| -> u64 {
        metrics
            .iter()
            .filter(|(k, ..)| {
                k.kind() == MetricKind::Counter && k.key().name() == "tokenlease_debt_dropped_tokens_total"
            })
            .filter(|(k, ..)| k.key().labels().any(|l| l.key() == "rule" && l.value() == rule))
            .map(|(.., v)| match v {
                DebugValue::Counter(c) => *c,
                _ => 0,
            })
            .sum()
    };
    assert_eq!(dropped("stock"), tally.alone, "{tally:?}");
    assert_eq!(dropped("posts"), posted);
}
