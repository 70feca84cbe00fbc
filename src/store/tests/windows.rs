//! Per-user limits replayed with exact `now_ms` sequences, the same table against a real Redis and the
//! in-process store: sliding log, fixed window (rolling and calendar), sliding-window counter, bans. The
//! cases follow the blog posts the project started from: at most 5 replies a minute, a "like" limit that bans
//! after a breach, an upload quota reset at local midnight, and 60 s counted as 6 sub-buckets of 10 s.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::harness::{r, step, EveryStore, Step};
use crate::rule::Calendar;
use crate::store::{Call, MemoryStore, RedisStore, Store};

static MEMBER: AtomicU64 = AtomicU64::new(0);

fn key(name: &str) -> String {
    format!("tl:{{w:{name}}}")
}

/// sliding_log.lua: window_ms, limit, cost, member, ban_ms, now_ms.
fn log(name: &str, window_ms: u64, limit: u64, cost: u64, ban_ms: u64, now: u64) -> Call {
    let member = format!("m{}", MEMBER.fetch_add(1, Ordering::Relaxed));
    Call::sliding_log(key(name), (window_ms, limit), cost, ban_ms, member).at(now)
}

/// fixed_window.lua: window_ms, limit, cost, ban_ms, align_ms (−1: rolling), now_ms.
fn fixed(name: &str, window_ms: u64, limit: u64, cost: u64, ban_ms: u64, align_ms: i64, now: u64) -> Call {
    let calendar = u64::try_from(align_ms)
        .ok()
        .map(|align_ms| Calendar::Offset { align_ms });
    Call::fixed_window(key(name), (window_ms, limit), cost, ban_ms, calendar).at(now)
}

/// sliding_window.lua: window_ms, sub_buckets, limit, cost, ban_ms, now_ms.
fn counter(name: &str, window_ms: u64, subs: u64, limit: u64, cost: u64, now: u64) -> Call {
    Call::sliding_window(key(name), (window_ms, limit), subs, cost, 0).at(now)
}

async fn granted(store: &dyn Store, call: &Call) -> bool {
    store.run(call).await.expect("store").granted > 0
}

const T0: u64 = 1_700_000_000_000; // a real epoch, so calendar windows are real days
const DAY: u64 = 86_400_000;
const UTC8: i64 = 28_800_000;

fn table(p: &str) -> Vec<Step> {
    let mut steps = Vec::new();
    let k = |n: &str| format!("{p}-{n}");
    // Seed 000: reply at most 5 times per 60 s. Refused attempts are not recorded: the 6th at 30 s does not
    // push the 1st out later; at 60 s + 1 ms the first grant has left.
    for i in 0..5 {
        steps.push(step(
            "reply",
            log(&k("reply"), 60_000, 5, 1, 0, T0 + i * 1000),
            r(1, 4 - i, 0, 60_000),
        ));
    }
    steps.push(step(
        "reply 6th",
        log(&k("reply"), 60_000, 5, 1, 0, T0 + 30_000),
        r(0, 0, 30_000, 34_000),
    ));
    steps.push(step(
        "reply at 59.999",
        log(&k("reply"), 60_000, 5, 1, 0, T0 + 59_999),
        r(0, 0, 1, 4_001),
    ));
    steps.push(step(
        "reply at 60",
        log(&k("reply"), 60_000, 5, 1, 0, T0 + 60_000),
        r(1, 0, 0, 60_000),
    ));
    // cost above the limit can never be granted
    steps.push(step("cost > limit", log(&k("big"), 1_000, 3, 4, 0, T0), r(0, 3, -1, 0)));
    // cost 3 of 5, then 3 refused until enough of it leaves
    steps.push(step("cost 3", log(&k("cost"), 1_000, 5, 3, 0, T0), r(3, 2, 0, 1_000)));
    steps.push(step(
        "cost 3 again",
        log(&k("cost"), 1_000, 5, 3, 0, T0 + 10),
        r(0, 2, 990, 990),
    ));

    // Seed 003 scenario 2: like 10 per 10 s, then banned for an hour after the breach.
    for i in 0..10 {
        steps.push(step(
            "like",
            fixed(&k("like"), 10_000, 10, 1, 3_600_000, -1, T0 + i),
            r(1, 9 - i, 0, 10_000 - i as i64),
        ));
    }
    steps.push(step(
        "breach",
        fixed(&k("like"), 10_000, 10, 1, 3_600_000, -1, T0 + 100),
        r(0, 0, 3_600_000, 3_600_000),
    ));
    // The window has long reset, the ban holds.
    steps.push(step(
        "banned",
        fixed(&k("like"), 10_000, 10, 1, 3_600_000, -1, T0 + 60_000),
        r(0, 10, 3_540_100, 3_540_100),
    ));
    steps.push(step(
        "ban over",
        fixed(&k("like"), 10_000, 10, 1, 3_600_000, -1, T0 + 3_600_100),
        r(1, 9, 0, 10_000),
    ));

    // Seed 003 scenario 3: upload 100 per day, reset at the next midnight in UTC+08:00.
    // T0 = 2023-11-14 22:13:20 UTC = 2023-11-15 06:13:20 at +08:00; the next local midnight is 17 h 46 m 40 s later.
    let to_midnight = 63_999_999 + 1; // ms from T0 to 2023-11-15 16:00:00 UTC
    steps.push(step(
        "upload 100",
        fixed(&k("upload"), DAY, 100, 100, 0, UTC8, T0),
        r(100, 0, 0, to_midnight),
    ));
    steps.push(step(
        "101st",
        fixed(&k("upload"), DAY, 100, 1, 0, UTC8, T0 + 1_000),
        r(0, 0, to_midnight - 1_000, to_midnight - 1_000),
    ));
    steps.push(step(
        "before midnight",
        fixed(&k("upload"), DAY, 100, 1, 0, UTC8, T0 + to_midnight as u64 - 1),
        r(0, 0, 1, 1),
    ));
    steps.push(step(
        "midnight",
        fixed(&k("upload"), DAY, 100, 1, 0, UTC8, T0 + to_midnight as u64),
        r(1, 99, 0, DAY as i64),
    ));

    // Seed 003 scenario 1: comment 10 per 30 s, rolling window opened by the first hit.
    steps.push(step(
        "comment",
        fixed(&k("comment"), 30_000, 10, 4, 0, -1, T0 + 5),
        r(4, 6, 0, 30_000),
    ));
    steps.push(step(
        "comment 7",
        fixed(&k("comment"), 30_000, 10, 7, 0, -1, T0 + 10_005),
        r(0, 6, 20_000, 20_000),
    ));
    steps.push(step(
        "new window",
        fixed(&k("comment"), 30_000, 10, 7, 0, -1, T0 + 30_005),
        r(7, 3, 0, 30_000),
    ));

    // Seed 004: 60 s as 6 × 10 s sub-buckets, 6 per window.
    steps.push(step("sw 2", counter(&k("sw"), 60_000, 6, 6, 2, T0), r(2, 4, 0, 60_000))); // sub-bucket 170000000000
    steps.push(step(
        "sw 4",
        counter(&k("sw"), 60_000, 6, 6, 4, T0 + 25_000),
        r(4, 0, 0, 55_000),
    ));
    steps.push(step(
        "sw full",
        counter(&k("sw"), 60_000, 6, 6, 1, T0 + 30_000),
        r(0, 0, 30_000, 50_000),
    ));
    // 3 need both older sub-buckets gone: the second (4 tokens at 25 s) leaves at 80 s.
    steps.push(step(
        "sw 3",
        counter(&k("sw"), 60_000, 6, 6, 3, T0 + 30_000),
        r(0, 0, 50_000, 50_000),
    ));
    // At 60 s the first sub-bucket (2 tokens) has left.
    steps.push(step(
        "sw 3 at 60",
        counter(&k("sw"), 60_000, 6, 6, 3, T0 + 60_000),
        r(0, 2, 20_000, 20_000),
    ));
    steps.push(step(
        "sw 2 at 60",
        counter(&k("sw"), 60_000, 6, 6, 2, T0 + 60_000),
        r(2, 0, 0, 60_000),
    ));
    steps.push(step(
        "sw cost > limit",
        counter(&k("sw"), 60_000, 6, 6, 7, T0 + 60_000),
        r(0, 0, -1, 60_000),
    ));

    // Sliding log with a ban: 2 per second, banned 5 s after a breach.
    steps.push(step(
        "log ban",
        log(&k("ban"), 1_000, 2, 2, 5_000, T0),
        r(2, 0, 0, 1_000),
    ));
    steps.push(step(
        "log breach",
        log(&k("ban"), 1_000, 2, 1, 5_000, T0 + 1),
        r(0, 0, 5_000, 5_000),
    ));
    steps.push(step(
        "log banned",
        log(&k("ban"), 1_000, 2, 1, 5_000, T0 + 2_000),
        r(0, 2, 3_001, 3_001),
    ));
    steps.push(step(
        "log ban over",
        log(&k("ban"), 1_000, 2, 1, 5_000, T0 + 5_001),
        r(1, 1, 0, 1_000),
    ));
    steps
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
    let stores = EveryStore::start();
    for (name, store) in stores.each() {
        boundary_burst(store, name).await;
    }
}

/// 1000 calls in one millisecond admit exactly the limit: members stay unique within a millisecond.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_same_millisecond_burst_admits_exactly_the_limit() {
    let stores = EveryStore::start();
    let redis = RedisStore::connect(&stores.server.url(), Duration::from_secs(2)).expect("store");
    let memory = MemoryStore::new();
    let each: [Arc<dyn Store>; 2] = [Arc::new(redis), Arc::new(memory)];
    for store in each {
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

#[tokio::test]
async fn seeds_table_on_every_store() {
    let stores = EveryStore::start();
    stores.replay(table).await;
    // The cold user's log expires after the window (seed 000's clean-up).
    let pttl: i64 = stores
        .server
        .cmd(&["PTTL", "tl:{w:redis-cost}"])
        .expect("pttl")
        .trim()
        .parse()
        .expect("int");
    assert!((1..=1_000).contains(&pttl), "pttl {pttl}");
}
