//! Per-user limits of the seed articles with exact `now_ms` sequences, the same table against a real Redis
//! and the in-process store: sliding log, fixed window (rolling and calendar), sliding-window counter, bans.

mod common;

use common::r;
use tokenlease::algorithm::Reply;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokenlease::store::{Call, Script};
use tokenlease::{Limiter, MemoryStore, RedisStore, Rule, Store};

static MEMBER: AtomicU64 = AtomicU64::new(0);

fn keys(name: &str) -> Vec<String> {
    vec![format!("tl:{{w:{name}}}"), format!("tl:{{w:{name}}}:ban")]
}

/// sliding_log.lua: window_ms, limit, cost, member, ban_ms, now_ms.
fn log(name: &str, window_ms: i64, limit: i64, cost: i64, ban_ms: i64, now: u64) -> Call {
    let member = format!("m{}", MEMBER.fetch_add(1, Ordering::Relaxed));
    Call::new(Script::SlidingLog, keys(name), vec![window_ms, limit, cost, ban_ms])
        .with_member(member)
        .at(now)
}

/// fixed_window.lua: window_ms, limit, cost, ban_ms, align_ms, now_ms.
fn fixed(name: &str, window_ms: i64, limit: i64, cost: i64, ban_ms: i64, align_ms: i64, now: u64) -> Call {
    Call::new(
        Script::FixedWindow,
        keys(name),
        vec![window_ms, limit, cost, ban_ms, align_ms],
    )
    .at(now)
}

/// sliding_window.lua: window_ms, sub_buckets, limit, cost, ban_ms, now_ms.
fn counter(name: &str, window_ms: i64, subs: i64, limit: i64, cost: i64, now: u64) -> Call {
    Call::new(Script::SlidingWindow, keys(name), vec![window_ms, subs, limit, cost, 0]).at(now)
}

async fn expect(store: &dyn Store, call: &Call, want: Reply, what: &str) {
    let got = store.run(call).await.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(got, want, "{what}: {call:?}");
}

async fn granted(store: &dyn Store, call: &Call) -> bool {
    store.run(call).await.expect("store").granted > 0
}

const T0: u64 = 1_700_000_000_000; // a real epoch, so calendar windows are real days
const DAY: i64 = 86_400_000;
const UTC8: i64 = 28_800_000;

async fn table(s: &dyn Store, p: &str) {
    let k = |n: &str| format!("{p}-{n}");
    // Seed 000: reply at most 5 times per 60 s. Refused attempts are not recorded: the 6th at 30 s does not
    // push the 1st out later; at 60 s + 1 ms the first grant has left.
    for i in 0..5 {
        expect(
            s,
            &log(&k("reply"), 60_000, 5, 1, 0, T0 + i * 1000),
            r(1, 4 - i, 0, 60_000),
            "reply",
        )
        .await;
    }
    expect(
        s,
        &log(&k("reply"), 60_000, 5, 1, 0, T0 + 30_000),
        r(0, 0, 30_000, 34_000),
        "reply 6th",
    )
    .await;
    expect(
        s,
        &log(&k("reply"), 60_000, 5, 1, 0, T0 + 59_999),
        r(0, 0, 1, 4_001),
        "reply at 59.999",
    )
    .await;
    expect(
        s,
        &log(&k("reply"), 60_000, 5, 1, 0, T0 + 60_000),
        r(1, 0, 0, 60_000),
        "reply at 60",
    )
    .await;
    // cost above the limit can never be granted
    expect(s, &log(&k("big"), 1_000, 3, 4, 0, T0), r(0, 3, -1, 0), "cost > limit").await;
    // cost 3 of 5, then 3 refused until enough of it leaves
    expect(s, &log(&k("cost"), 1_000, 5, 3, 0, T0), r(3, 2, 0, 1_000), "cost 3").await;
    expect(
        s,
        &log(&k("cost"), 1_000, 5, 3, 0, T0 + 10),
        r(0, 2, 990, 990),
        "cost 3 again",
    )
    .await;

    // Seed 003 scenario 2: like 10 per 10 s, then banned for an hour after the breach.
    for i in 0..10 {
        expect(
            s,
            &fixed(&k("like"), 10_000, 10, 1, 3_600_000, -1, T0 + i),
            r(1, 9 - i, 0, 10_000 - i as i64),
            "like",
        )
        .await;
    }
    expect(
        s,
        &fixed(&k("like"), 10_000, 10, 1, 3_600_000, -1, T0 + 100),
        r(0, 0, 3_600_000, 3_600_000),
        "breach",
    )
    .await;
    // The window has long reset, the ban holds.
    expect(
        s,
        &fixed(&k("like"), 10_000, 10, 1, 3_600_000, -1, T0 + 60_000),
        r(0, 10, 3_540_100, 3_540_100),
        "banned",
    )
    .await;
    expect(
        s,
        &fixed(&k("like"), 10_000, 10, 1, 3_600_000, -1, T0 + 3_600_100),
        r(1, 9, 0, 10_000),
        "ban over",
    )
    .await;

    // Seed 003 scenario 3: upload 100 per day, reset at the next midnight in UTC+08:00.
    // T0 = 2023-11-14 22:13:20 UTC = 2023-11-15 06:13:20 at +08:00; the next local midnight is 17 h 46 m 40 s later.
    let to_midnight = 63_999_999 + 1; // ms from T0 to 2023-11-15 16:00:00 UTC
    expect(
        s,
        &fixed(&k("upload"), DAY, 100, 100, 0, UTC8, T0),
        r(100, 0, 0, to_midnight),
        "upload 100",
    )
    .await;
    expect(
        s,
        &fixed(&k("upload"), DAY, 100, 1, 0, UTC8, T0 + 1_000),
        r(0, 0, to_midnight - 1_000, to_midnight - 1_000),
        "101st",
    )
    .await;
    expect(
        s,
        &fixed(&k("upload"), DAY, 100, 1, 0, UTC8, T0 + to_midnight as u64 - 1),
        r(0, 0, 1, 1),
        "before midnight",
    )
    .await;
    expect(
        s,
        &fixed(&k("upload"), DAY, 100, 1, 0, UTC8, T0 + to_midnight as u64),
        r(1, 99, 0, DAY),
        "midnight",
    )
    .await;

    // Seed 003 scenario 1: comment 10 per 30 s, rolling window opened by the first hit.
    expect(
        s,
        &fixed(&k("comment"), 30_000, 10, 4, 0, -1, T0 + 5),
        r(4, 6, 0, 30_000),
        "comment",
    )
    .await;
    expect(
        s,
        &fixed(&k("comment"), 30_000, 10, 7, 0, -1, T0 + 10_005),
        r(0, 6, 20_000, 20_000),
        "comment 7",
    )
    .await;
    expect(
        s,
        &fixed(&k("comment"), 30_000, 10, 7, 0, -1, T0 + 30_005),
        r(7, 3, 0, 30_000),
        "new window",
    )
    .await;

    // Seed 004: 60 s as 6 × 10 s sub-buckets, 6 per window.
    expect(s, &counter(&k("sw"), 60_000, 6, 6, 2, T0), r(2, 4, 0, 60_000), "sw 2").await; // sub-bucket 170000000000
    expect(
        s,
        &counter(&k("sw"), 60_000, 6, 6, 4, T0 + 25_000),
        r(4, 0, 0, 55_000),
        "sw 4",
    )
    .await;
    expect(
        s,
        &counter(&k("sw"), 60_000, 6, 6, 1, T0 + 30_000),
        r(0, 0, 30_000, 50_000),
        "sw full",
    )
    .await;
    // 3 need both older sub-buckets gone: the second (4 tokens at 25 s) leaves at 80 s.
    expect(
        s,
        &counter(&k("sw"), 60_000, 6, 6, 3, T0 + 30_000),
        r(0, 0, 50_000, 50_000),
        "sw 3",
    )
    .await;
    // At 60 s the first sub-bucket (2 tokens) has left.
    expect(
        s,
        &counter(&k("sw"), 60_000, 6, 6, 3, T0 + 60_000),
        r(0, 2, 20_000, 20_000),
        "sw 3 at 60",
    )
    .await;
    expect(
        s,
        &counter(&k("sw"), 60_000, 6, 6, 2, T0 + 60_000),
        r(2, 0, 0, 60_000),
        "sw 2 at 60",
    )
    .await;
    expect(
        s,
        &counter(&k("sw"), 60_000, 6, 6, 7, T0 + 60_000),
        r(0, 0, -1, 60_000),
        "sw cost > limit",
    )
    .await;

    // Sliding log with a ban: 2 per second, banned 5 s after a breach.
    expect(s, &log(&k("ban"), 1_000, 2, 2, 5_000, T0), r(2, 0, 0, 1_000), "log ban").await;
    expect(
        s,
        &log(&k("ban"), 1_000, 2, 1, 5_000, T0 + 1),
        r(0, 0, 5_000, 5_000),
        "log breach",
    )
    .await;
    expect(
        s,
        &log(&k("ban"), 1_000, 2, 1, 5_000, T0 + 2_000),
        r(0, 2, 3_001, 3_001),
        "log banned",
    )
    .await;
    expect(
        s,
        &log(&k("ban"), 1_000, 2, 1, 5_000, T0 + 5_001),
        r(1, 1, 0, 1_000),
        "log ban over",
    )
    .await;
}

#[tokio::test]
async fn seeds_table_on_memory_store() {
    table(&MemoryStore::new(), "mem").await;
}

#[tokio::test]
async fn seeds_table_on_redis() {
    let server = common::RedisServer::start();
    let store = RedisStore::connect(&server.url(), Duration::from_secs(2)).expect("store");
    table(&store, "redis").await;
    // The cold user's log expires after the window (seed 000's clean-up).
    let pttl: i64 = server
        .cmd(&["PTTL", "tl:{w:redis-cost}"])
        .expect("pttl")
        .trim()
        .parse()
        .expect("int");
    assert!((1..=1_000).contains(&pttl), "pttl {pttl}");
}

/// Seed 001: "10 per 5 minutes" with SET + EXPIRE windows lets 20 posts through within a few seconds around
/// a window boundary; the sliding log never admits more than 10 in any 5-minute span.
async fn boundary_burst(s: &dyn Store, p: &str) {
    let five_min = 300_000;
    let (mut fixed_admitted, mut log_admitted) = (0, 0);
    // 10 posts just before the fixed window ends, 10 just after.
    for i in 0..10 {
        fixed_admitted += u32::from(granted(s, &fixed(&format!("{p}-bf"), five_min, 10, 1, 0, -1, T0 + i)).await);
        log_admitted += u32::from(granted(s, &log(&format!("{p}-bl"), five_min, 10, 1, 0, T0 + i)).await);
    }
    for i in 0..10 {
        let late = T0 + 299_990 + i;
        fixed_admitted += u32::from(granted(s, &fixed(&format!("{p}-bf"), five_min, 10, 1, 0, -1, late + 10)).await);
        log_admitted += u32::from(granted(s, &log(&format!("{p}-bl"), five_min, 10, 1, 0, late)).await);
    }
    // All 20 fixed-window grants lie within 300 010 ms: more than the limit in one window-length span.
    assert_eq!(fixed_admitted, 20, "the fixed window's boundary burst");
    assert_eq!(log_admitted, 10, "the sliding log has no boundary burst");
}

#[tokio::test]
async fn fixed_window_boundary_burst_and_its_absence_in_the_log() {
    boundary_burst(&MemoryStore::new(), "mem").await;
    let server = common::RedisServer::start();
    let store = RedisStore::connect(&server.url(), Duration::from_secs(2)).expect("store");
    boundary_burst(&store, "redis").await;
}

/// 1000 calls in one millisecond admit exactly the limit: members stay unique within a millisecond.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_same_millisecond_burst_admits_exactly_the_limit() {
    let server = common::RedisServer::start();
    let redis: Arc<dyn Store> = Arc::new(RedisStore::connect(&server.url(), Duration::from_secs(2)).expect("store"));
    let memory: Arc<dyn Store> = Arc::new(MemoryStore::new());
    for store in [redis, memory] {
        let mut tasks = Vec::new();
        for _ in 0..1000 {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                granted(&*store, &log("burst", 60_000, 100, 1, 0, T0)).await
            }));
        }
        let mut admitted = 0;
        for t in tasks {
            admitted += u32::from(t.await.expect("task"));
        }
        assert_eq!(admitted, 100, "{store:?}");
    }
}

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
        .map(|_| {
            let store = RedisStore::connect(&server.url(), Duration::from_secs(2)).expect("store");
            Limiter::builder()
                .store(Arc::new(store))
                .rules(rules.clone())
                .build()
                .expect("limiter")
        })
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
    assert!(matches!(
        limiter.check("like", "u", 0).await,
        Err(tokenlease::Error::InvalidArgument { name: "cost", .. })
    ));
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

/// The in-process store forgets a key once its state equals a missing key (as Redis's TTLs do): 100 000 cold
/// users leave nothing behind a window later.
#[tokio::test]
async fn the_memory_store_forgets_idle_keys() {
    let store = MemoryStore::new();
    for user in 0..100_000 {
        let c = fixed(&format!("cold:{user}"), 60_000, 10, 1, 0, -1, T0 + user / 100);
        assert!(granted(&store, &c).await);
    }
    assert_eq!(store.len(), 100_000);
    // A window later, the next call purges them all.
    let _ = store
        .run(&fixed("late", 60_000, 10, 1, 0, -1, T0 + 61_001))
        .await
        .expect("store");
    assert_eq!(store.len(), 1);
}
