//! The limiter records the metrics of the README's metrics table (with a local debugging recorder: no global state).

mod common;

use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::{CompositeKey, MetricKind};
use tokenlease::{Lease, Rule};

/// What a snapshot holds (taking one resets the recorder's counters, so take it once).
type Metrics = Vec<(
    CompositeKey,
    Option<metrics::Unit>,
    Option<metrics::SharedString>,
    DebugValue,
)>;

fn counter(snap: &Metrics, name: &str, labels: &[(&str, &str)]) -> u64 {
    snap.iter()
        .filter(|(k, ..)| k.kind() == MetricKind::Counter && k.key().name() == name)
        .filter(|(k, ..)| {
            labels
                .iter()
                .all(|(n, v)| k.key().labels().any(|l| l.key() == *n && l.value() == *v))
        })
        .map(|(.., v)| match v {
            DebugValue::Counter(c) => *c,
            _ => 0,
        })
        .sum()
}

fn histogram_samples(snap: &Metrics, name: &str, script: &str) -> usize {
    snap.iter()
        .filter(|(k, ..)| k.key().name() == name && k.key().labels().any(|l| l.value() == script))
        .map(|(.., v)| match v {
            DebugValue::Histogram(h) => h.len(),
            _ => 0,
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_leases_and_redis_latency_are_recorded() {
    let server = common::RedisServer::start();
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let limiter = metrics::with_local_recorder(&recorder, || {
        let leased = Rule::token_bucket("sku", 10, 1, Duration::from_secs(3600))
            .and_then(|r| {
                r.with_lease(Lease {
                    min_batch: 5,
                    max_batch: 5,
                    ttl: Duration::from_secs(60),
                    hot_after: Some(1),
                    reserve: None,
                })
            })
            .expect("rule");
        let direct = Rule::token_bucket("post", 2, 1, Duration::from_secs(3600)).expect("rule");
        common::limiter([leased, direct])
            .redis(&server)
            .expected_processes(1)
            .build()
    });

    let mut allowed = 0;
    for _ in 0..30 {
        allowed += u64::from(limiter.check("sku", "a", 1).await.expect("check").allowed);
    }
    for _ in 0..5 {
        let _ = limiter.check("post", "u1", 1).await.expect("check");
    }
    assert_eq!(allowed, 10);
    // Decisions made from leased tokens are counted per core and reach the metrics at the sweeper's next pass
    // (within a second) or, as here, at shutdown.
    limiter.shutdown().await;
    let snap = snap.snapshot().into_vec();
    let d = |rule, outcome, source| {
        counter(
            &snap,
            "tokenlease_decisions_total",
            &[("rule", rule), ("outcome", outcome), ("source", source)],
        )
    };
    assert_eq!(d("sku", "allowed", "local"), 10);
    assert_eq!(d("sku", "rejected", "local"), 20);
    assert_eq!(d("post", "allowed", "redis"), 2);
    assert_eq!(d("post", "rejected", "redis"), 1);
    // The next two refusals are answered in process until Redis's retry_after (no call).
    assert_eq!(d("post", "rejected", "local"), 2);
    assert_eq!(
        counter(&snap, "tokenlease_refusals_cached_total", &[("rule", "post")]),
        2
    );
    assert_eq!(
        counter(
            &snap,
            "tokenlease_leases_total",
            &[("rule", "sku"), ("result", "granted")]
        ),
        2
    );
    // The second grant left the shared bucket empty: the process waits for its turn (an hour's refill away)
    // refusing locally, without asking again.
    assert_eq!(
        counter(
            &snap,
            "tokenlease_leases_total",
            &[("rule", "sku"), ("result", "refused")]
        ),
        0
    );
    assert_eq!(counter(&snap, "tokenlease_leased_tokens_total", &[("rule", "sku")]), 10);
    // Three direct checks of `post` (of five), two leases of `sku` (the lease script hands out turns).
    assert_eq!(
        histogram_samples(&snap, "tokenlease_redis_duration_seconds", "token_bucket"),
        3
    );
    assert_eq!(
        histogram_samples(&snap, "tokenlease_redis_duration_seconds", "token_lease"),
        2
    );
    // No label carries a key.
    for (key, ..) in &snap {
        assert!(
            key.key().labels().all(|l| l.value() != "a" && l.value() != "u1"),
            "{key:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_errors_are_counted_by_kind() {
    let mut server = common::RedisServer::start();
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let limiter = metrics::with_local_recorder(&recorder, || {
        let rule = Rule::token_bucket("post", 2, 1, Duration::from_secs(3600)).expect("rule");
        common::limiter([rule])
            .redis(&server)
            .timeout(Duration::from_millis(200))
            .build()
    });
    server.stop();
    let d = limiter.check("post", "u", 1).await.expect("a decision");
    assert_eq!(d.source, tokenlease::Source::Fallback);
    // Its fail mode (`closed`, the default) refuses.
    assert!(!d.allowed, "{d:?}");
    let snap = snap.snapshot().into_vec();
    let errors = |script| counter(&snap, "tokenlease_redis_errors_total", &[("script", script)]);
    // The key's script failed, and that was counted with its script's name; a rule that does not lease has no
    // fleet, so no beat was sent.
    assert_eq!(errors("token_bucket"), 1, "{snap:#?}");
    assert_eq!(errors("fleet"), 0, "{snap:#?}");
    assert_eq!(
        counter(&snap, "tokenlease_decisions_total", &[("source", "fallback")]),
        1
    );
    // The connection was refused: a store error, not a timeout.
    let why = |reason| {
        counter(
            &snap,
            "tokenlease_fail_mode_decisions_total",
            &[("rule", "post"), ("reason", reason)],
        )
    };
    assert_eq!(
        (why("error"), why("timeout"), why("circuit_open")),
        (1, 0, 0),
        "{snap:#?}"
    );
}

#[tokio::test(start_paused = true)]
async fn queue_depth_and_wait_are_recorded() {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let limiter = metrics::with_local_recorder(&recorder, || {
        let rule = Rule::leaky_bucket("jobs", 10, Duration::from_secs(1), Duration::from_secs(5)).expect("rule");
        common::limiter([rule]).tokio_clock().build()
    });
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let l = limiter.clone();
            tokio::spawn(async move { l.acquire("jobs", "k", 1).await.expect("permit").waited })
        })
        .collect();
    tokio::task::yield_now().await;
    // A snapshot drains the histograms: keep both.
    let mut seen = snap.snapshot().into_vec();
    let depth = seen.iter().find_map(|(k, .., v)| match v {
        DebugValue::Gauge(g) if k.key().name() == "tokenlease_queue_depth" => Some(g.into_inner()),
        _ => None,
    });
    assert_eq!(depth, Some(2.0), "two callers are waiting for their slots");
    for t in tasks {
        let _ = t.await.expect("task");
    }
    seen.extend(snap.snapshot().into_vec());
    let waits: Vec<f64> = seen
        .iter()
        .filter(|(k, ..)| k.key().name() == "tokenlease_queue_wait_seconds")
        .flat_map(|(.., v)| match v {
            DebugValue::Histogram(h) => h.iter().map(|x| x.into_inner()).collect::<Vec<_>>(),
            _ => Vec::new(),
        })
        .collect();
    let mut waits = waits;
    waits.sort_by(f64::total_cmp);
    assert_eq!(waits, [0.0, 0.1, 0.2]);

    // A full queue is a refusal, counted as a rejected decision.
    let limiter = metrics::with_local_recorder(&recorder, || {
        let rule = Rule::leaky_bucket("short", 1, Duration::from_secs(1), Duration::from_millis(1)).expect("rule");
        common::limiter([rule]).tokio_clock().build()
    });
    let _first = limiter.acquire("short", "k", 1).await.expect("a free slot");
    assert!(limiter.try_acquire("short", "k", 1).await.expect("try").is_none());
    let snap = snap.snapshot().into_vec();
    let rejected = counter(
        &snap,
        "tokenlease_decisions_total",
        &[("rule", "short"), ("outcome", "rejected")],
    );
    assert_eq!(rejected, 1, "{snap:#?}");
}

/// Only the series a rule can produce are registered (and so exported): a rule without a lease has no lease
/// series, a window no queue series, a rule not in shadow mode no `shadow_rejected`.
#[test]
fn a_rule_registers_only_the_series_it_can_produce() {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _limiter = metrics::with_local_recorder(&recorder, || {
        let lease = Lease {
            min_batch: 1,
            max_batch: 10,
            ttl: Duration::from_secs(1),
            hot_after: Some(1),
            reserve: None,
        };
        let leased = Rule::token_bucket("leased", 100, 10, Duration::from_secs(1))
            .and_then(|r| r.with_lease(lease))
            .expect("rule");
        let window = Rule::fixed_window("window", 10, Duration::from_secs(10)).expect("rule");
        common::limiter([leased, window]).build()
    });
    let snap = snap.snapshot().into_vec();
    let series = |name: &str, rule: &str| {
        snap.iter()
            .filter(|(k, ..)| {
                k.key().name() == name && k.key().labels().any(|l| l.key() == "rule" && l.value() == rule)
            })
            .count()
    };
    for name in [
        "tokenlease_leases_total",
        "tokenlease_leased_tokens_total",
        "tokenlease_outstanding_tokens",
        "tokenlease_queue_depth",
    ] {
        assert!(series(name, "leased") > 0, "{name} of the leased rule");
        assert_eq!(series(name, "window"), 0, "{name} of a window rule");
    }
    assert!(series("tokenlease_decisions_total", "window") > 0);
    let shadow = snap.iter().filter(|(k, ..)| {
        k.key().name() == "tokenlease_decisions_total" && k.key().labels().any(|l| l.value() == "shadow_rejected")
    });
    assert_eq!(shadow.count(), 0, "no rule is in shadow mode");
}
