//! Per-user limits through the public API: exact under concurrency on Redis, the `is_action_allowed` API,
//! bad rules, overrides. The exact `now_ms` tables of these algorithms run inside the crate, on both stores
//! (`src/store/tests/windows.rs`).

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokenlease::{Limiter, Rule};

/// 16 tasks over 2 limiters on one user key admit exactly the limit per window, on Redis (real time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_tasks_over_two_limiters_admit_exactly_the_limit() {
    let server = common::RedisServer::start();
    let rules = [
        Rule::sliding_log("post", 25, Duration::from_secs(600)).expect("rule"),
        Rule::fixed_window("like", 25, Duration::from_secs(600)).expect("rule"),
        Rule::sliding_window("upload", 25, Duration::from_secs(600), 10).expect("rule"),
    ];
    let limiters: Vec<Limiter> = (0..2)
        .map(|_| common::limiter(rules.clone()).redis(&server).build())
        .collect();
    for rule in ["post", "like", "upload"] {
        let admitted = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for i in 0..16 {
            let (l, admitted) = (limiters[i % 2].clone(), admitted.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..10 {
                    if l.check(rule, "user:1", 1).await.expect("check").allowed {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        for t in tasks {
            t.await.expect("task");
        }
        assert_eq!(admitted.load(Ordering::Relaxed), 25, "rule {rule}");
    }
}

#[tokio::test]
async fn is_action_allowed_is_the_seeds_api() {
    let limiter = Limiter::builder().build().expect("limiter");
    for _ in 0..5 {
        assert!(limiter
            .is_action_allowed("laoqian", "reply", Duration::from_secs(60), 5)
            .await
            .expect("ok"));
    }
    assert!(!limiter
        .is_action_allowed("laoqian", "reply", Duration::from_secs(60), 5)
        .await
        .expect("ok"));
    // Another user, another action: their own logs.
    assert!(limiter
        .is_action_allowed("xiaoming", "reply", Duration::from_secs(60), 5)
        .await
        .expect("ok"));
    assert!(limiter
        .is_action_allowed("laoqian", "publish", Duration::from_secs(300), 10)
        .await
        .expect("ok"));
    // Bad arguments name themselves.
    let err = |r: Result<bool, tokenlease::Error>| match r {
        Err(tokenlease::Error::InvalidArgument { name, .. }) => name,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        err(limiter.is_action_allowed("", "reply", Duration::from_secs(1), 1).await),
        "user_id"
    );
    assert_eq!(
        err(limiter.is_action_allowed("u", "", Duration::from_secs(1), 1).await),
        "action_key"
    );
    assert_eq!(
        err(limiter.is_action_allowed("u", "reply", Duration::ZERO, 1).await),
        "period"
    );
    assert_eq!(
        err(limiter.is_action_allowed("u", "reply", Duration::from_secs(1), 0).await),
        "max_count"
    );
}

#[tokio::test]
async fn costs_above_the_limit_and_bad_rules_are_errors() {
    let limiter = Limiter::builder()
        .rule(
            Rule::fixed_window("like", 10, Duration::from_secs(10))
                .and_then(|r| r.with_ban(Duration::from_secs(3600)))
                .expect("rule"),
        )
        .build()
        .expect("limiter");
    assert!(matches!(
        limiter.check("like", "u", 11).await,
        Err(tokenlease::Error::CostAboveCapacity {
            cost: 11,
            capacity: 10,
            ..
        })
    ));
    // Cost 0 is a peek, not an error.
    let peek = limiter.check("like", "u", 0).await.expect("peek");
    assert_eq!((peek.allowed, peek.remaining), (true, 10));
    assert!(matches!(
        limiter.check("like", "", 1).await,
        Err(tokenlease::Error::InvalidArgument { name: "key", .. })
    ));
    assert!(matches!(
        Rule::fixed_window("x", 0, Duration::from_secs(1)),
        Err(tokenlease::Error::InvalidArgument { name: "limit", .. })
    ));
    assert!(matches!(
        Rule::sliding_log("x", 1, Duration::ZERO),
        Err(tokenlease::Error::InvalidArgument { name: "window", .. })
    ));
    assert!(matches!(
        Rule::sliding_log("", 1, Duration::from_secs(1)),
        Err(tokenlease::Error::InvalidArgument { name: "name", .. })
    ));
    assert!(matches!(
        Rule::sliding_window("x", 1, Duration::from_secs(60), 7),
        Err(tokenlease::Error::InvalidArgument {
            name: "sub_buckets",
            ..
        })
    ));
    assert!(matches!(
        Rule::calendar_window("x", 1, Duration::from_secs(86_400), "8"),
        Err(tokenlease::Error::InvalidArgument { name: "utc_offset", .. })
    ));
    assert!(matches!(
        Rule::calendar_window_in_zone("x", 1, Duration::from_secs(86_400), "Europe/Atlantis"),
        Err(tokenlease::Error::InvalidArgument { name: "timezone", .. })
    ));
    // The ban works through the limiter too.
    for _ in 0..10 {
        assert!(limiter.check("like", "u", 1).await.expect("check").allowed);
    }
    let d = limiter.check("like", "u", 1).await.expect("check");
    assert!(!d.allowed && d.retry_after > Duration::from_secs(3500), "{d:?}");
}

#[tokio::test]
async fn a_vip_override_applies_to_matching_keys_only() {
    let base = Rule::fixed_window("post", 2, Duration::from_secs(60)).expect("rule");
    let rule = base
        .with_override(
            "vip:*",
            Rule::fixed_window("post", 5, Duration::from_secs(60)).expect("rule"),
        )
        .expect("override");
    let limiter = Limiter::builder().rule(rule).build().expect("limiter");
    let admitted = |key: &'static str| {
        let limiter = limiter.clone();
        async move {
            let mut n = 0;
            for _ in 0..10 {
                n += u32::from(limiter.check("post", key, 1).await.expect("check").allowed);
            }
            n
        }
    };
    assert_eq!(admitted("user:1").await, 2);
    assert_eq!(admitted("vip:1").await, 5);
    // The cost bound follows the override too.
    assert!(limiter.check("post", "vip:2", 5).await.is_ok());
    assert!(limiter.check("post", "user:2", 5).await.is_err());
}

/// A daily quota in an IANA zone through the limiter, on Redis (the server's clock) and in process (the wall
/// clock): the refusal's `retry_after` and `reset_after` are the time to the zone's next local midnight. The
/// exact `now_ms` cases around daylight-saving changes run inside the crate (`src/store/tests/zones.rs`).
#[tokio::test]
async fn a_zoned_daily_quota_resets_at_the_zones_midnight() {
    let server = common::RedisServer::start();
    let rule =
        Rule::calendar_window_in_zone("daily", 2, Duration::from_secs(86_400), "Pacific/Auckland").expect("rule");
    let limiters = [
        common::limiter([rule.clone()]).redis(&server).build(),
        common::limiter([rule]).build(),
    ];
    for limiter in limiters {
        for _ in 0..2 {
            assert!(limiter.check("daily", "u", 1).await.expect("check").allowed);
        }
        let d = limiter.check("daily", "u", 1).await.expect("check");
        let now = jiff::Timestamp::now().in_tz("Pacific/Auckland").expect("zone");
        let midnight = now.tomorrow().and_then(|t| t.start_of_day()).expect("midnight");
        let until = Duration::try_from(now.duration_until(&midnight)).expect("positive");
        assert!(!d.allowed);
        // 10 s of slack for a slow machine, no more.
        for got in [d.retry_after, d.reset_after] {
            assert!(
                got.abs_diff(until) < Duration::from_secs(10),
                "{got:?} vs {until:?}: {d:?}"
            );
        }
    }
}
