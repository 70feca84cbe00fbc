//! The token-bucket scripts replayed with exact `now_ms` sequences, the same table against a real Redis and
//! against the in-process store (which runs the pure algorithm the scripts mirror).

use super::harness::{r, step, EveryStore, Step};
use crate::algorithm::{Reply, TokenBucket};
use crate::store::{Call, Store};

fn bucket((capacity, rate, per_ms): (u64, u64, u64)) -> TokenBucket {
    TokenBucket { capacity, rate, per_ms }
}

fn take(key: &str, params: (u64, u64, u64), min: u64, max: u64, now: u64) -> Call {
    Call::take(key, bucket(params), min, max).at(now)
}

/// token_bucket.lua with a ban key: ARGV capacity, rate, per_ms, min, max, ban_ms, now_ms.
fn take_banned(key: &str, params: (u64, u64, u64), cost: u64, ban_ms: u64, now: u64) -> Call {
    Call::take_or_ban(key, bucket(params), cost, ban_ms).at(now)
}

fn give(key: &str, params: (u64, u64, u64), tokens: i64, now: u64) -> Call {
    Call::give_back(key, bucket(params), tokens).at(now)
}

fn acquire(key: &str, params: (u64, u64, u64), cost: u64, max_wait_ms: u64, now: u64) -> Call {
    Call::acquire(key, bucket(params), cost, max_wait_ms).at(now)
}

/// Each case: a name and a sequence of (call, expected reply).
fn cases(p: &str) -> Vec<(&'static str, Vec<(Call, Reply)>)> {
    let k = |name: &str| format!("{p}:{{t:{name}}}");
    let nine_per_minute = (9, 9, 60_000);
    let ten_per_10s = (10, 1, 1_000);
    vec![
        (
            "a token due at a millisecond is granted at it: 9 per minute gives 3 at exactly 20 s",
            vec![
                (take(&k("a"), nine_per_minute, 9, 9, 0), r(9, 0, 0, 60_000)),
                (take(&k("a"), nine_per_minute, 3, 3, 19_999), r(0, 2, 1, 40_001)),
                (take(&k("a"), nine_per_minute, 3, 3, 20_000), r(3, 0, 0, 60_000)),
            ],
        ),
        (
            "refill is capped at the capacity",
            vec![
                (take(&k("b"), (5, 1, 1_000), 1, 1, 0), r(1, 4, 0, 1_000)),
                (take(&k("b"), (5, 1, 1_000), 1, 1, 100_000), r(1, 4, 0, 1_000)),
            ],
        ),
        (
            "partial grants between min and max, then a refusal with retry_after",
            vec![
                (take(&k("c"), ten_per_10s, 1, 10, 0), r(10, 0, 0, 10_000)),
                (take(&k("c"), ten_per_10s, 2, 5, 3_000), r(3, 0, 0, 10_000)),
                (take(&k("c"), ten_per_10s, 2, 5, 4_000), r(0, 1, 1_000, 9_000)),
                (take(&k("c"), ten_per_10s, 2, 5, 4_999), r(0, 1, 1, 8_001)),
                (take(&k("c"), ten_per_10s, 2, 5, 5_000), r(2, 0, 0, 10_000)),
            ],
        ),
        (
            "min above the capacity can never be granted",
            vec![(take(&k("d"), ten_per_10s, 11, 11, 0), r(0, 10, -1, 0))],
        ),
        (
            "a return is capped at the capacity; a full bucket equals a missing key",
            vec![
                (take(&k("e"), ten_per_10s, 6, 6, 0), r(6, 4, 0, 6_000)),
                (give(&k("e"), ten_per_10s, 4, 0), r(4, 8, 0, 2_000)),
                (give(&k("e"), ten_per_10s, 5, 0), r(2, 10, 0, 0)),
                (take(&k("e"), ten_per_10s, 10, 10, 0), r(10, 0, 0, 10_000)),
                (give(&k("never-taken"), ten_per_10s, 5, 0), r(0, 10, 0, 0)),
            ],
        ),
        (
            "fractional rates: 2 tokens per 3 s",
            vec![
                (take(&k("f"), (2, 2, 3_000), 2, 2, 0), r(2, 0, 0, 3_000)),
                (take(&k("f"), (2, 2, 3_000), 1, 1, 1_499), r(0, 0, 1, 1_501)),
                (take(&k("f"), (2, 2, 3_000), 1, 1, 1_500), r(1, 0, 0, 3_000)),
                (take(&k("f"), (2, 2, 3_000), 1, 1, 4_500), r(1, 1, 0, 1_500)),
            ],
        ),
        (
            "rate 0 is a stock that never refills",
            vec![
                (take(&k("g"), (3, 0, 1_000), 2, 2, 0), r(2, 1, 0, -1)),
                (take(&k("g"), (3, 0, 1_000), 2, 2, 1_000_000_000), r(0, 1, -1, -1)),
                (take(&k("g"), (3, 0, 1_000), 1, 1, 1_000_000_001), r(1, 0, 0, -1)),
            ],
        ),
        (
            "a token bucket bans after a refusal, whatever the refill says",
            vec![
                (take_banned(&k("j"), ten_per_10s, 10, 60_000, 0), r(10, 0, 0, 10_000)),
                (
                    take_banned(&k("j"), ten_per_10s, 1, 60_000, 500),
                    r(0, 0, 60_000, 60_000),
                ),
                (
                    take_banned(&k("j"), ten_per_10s, 1, 60_000, 20_000),
                    r(0, 10, 40_500, 40_500),
                ),
                (take_banned(&k("j"), ten_per_10s, 1, 60_000, 60_500), r(1, 9, 0, 1_000)),
                (take_banned(&k("stock"), (3, 0, 1_000), 3, 1_000, 0), r(3, 0, 0, -1)),
                (take_banned(&k("stock"), (3, 0, 1_000), 1, 1_000, 1), r(0, 0, 1_000, -1)),
                (take_banned(&k("stock"), (3, 0, 1_000), 1, 1_000, 2), r(0, 0, 999, -1)),
            ],
        ),
        (
            "a rule reloaded with another period rescales the stored level",
            vec![
                (take(&k("per"), (10, 10, 1_000), 5, 5, 0), r(5, 5, 0, 500)),
                (take(&k("per"), (10, 10, 60_000), 1, 1, 0), r(1, 4, 0, 36_000)),
            ],
        ),
        (
            "a token bucket in debt reports no tokens left, never a negative count",
            vec![
                (acquire(&k("debt"), ten_per_10s, 10, 60_000, 0), r(10, 0, 0, 10_000)),
                (acquire(&k("debt"), ten_per_10s, 5, 60_000, 0), r(5, 0, 0, 15_000)),
                (take(&k("debt"), (10, 1, 1_000), 1, 1, 0), r(0, 0, 6_000, 15_000)),
                (give(&k("debt"), (10, 1, 1_000), 2, 0), r(2, 0, 0, 13_000)),
            ],
        ),
        (
            "a debit (fail_mode local's admissions) takes from a full bucket, into debt, not below −capacity",
            vec![
                (give(&k("d"), ten_per_10s, -4, 0), r(0, 6, 0, 4_000)),
                (take(&k("d"), ten_per_10s, 6, 6, 0), r(6, 0, 0, 10_000)),
                (give(&k("d"), ten_per_10s, -10, 0), r(0, 0, 0, 20_000)),
                (give(&k("d"), ten_per_10s, -5, 0), r(0, 0, 0, 20_000)),
                (take(&k("d"), ten_per_10s, 1, 1, 10_000), r(0, 0, 1_000, 10_000)),
                (take(&k("d"), ten_per_10s, 1, 1, 11_000), r(1, 0, 0, 10_000)),
            ],
        ),
        (
            "a debit never lifts a debt deeper than the capacity (an acquire's)",
            vec![
                (acquire(&k("deep"), ten_per_10s, 10, 60_000, 0), r(10, 0, 0, 10_000)),
                (acquire(&k("deep"), ten_per_10s, 5, 60_000, 0), r(5, 0, 0, 15_000)),
                (acquire(&k("deep"), ten_per_10s, 10, 60_000, 0), r(10, 0, 5_000, 25_000)),
                (give(&k("deep"), ten_per_10s, -3, 0), r(0, 0, 0, 25_000)),
            ],
        ),
        (
            "a clock that steps back does not refill",
            vec![
                (take(&k("h"), ten_per_10s, 10, 10, 50_000), r(10, 0, 0, 10_000)),
                (take(&k("h"), ten_per_10s, 1, 1, 40_000), r(0, 0, 1_000, 10_000)),
                (take(&k("h"), ten_per_10s, 1, 1, 51_000), r(1, 0, 0, 10_000)),
            ],
        ),
        (
            "a month per period with a large capacity stays exact",
            vec![
                (
                    take(&k("i"), (1_000_000, 1_000_000, 2_592_000_000), 999_999, 999_999, 0),
                    r(999_999, 1, 0, 2_591_997_408),
                ),
                (
                    take(&k("i"), (1_000_000, 1_000_000, 2_592_000_000), 2, 2, 2_592),
                    r(2, 0, 0, 2_592_000_000),
                ),
            ],
        ),
    ]
}

/// The cases as one table of steps.
fn table(p: &str) -> Vec<Step> {
    let mut steps = Vec::new();
    for (name, case) in cases(p) {
        steps.extend(case.into_iter().map(|(call, reply)| step(name, call, reply)));
    }
    steps
}

#[tokio::test]
async fn token_bucket_table_on_every_store() {
    EveryStore::start().replay(table).await;
}

#[tokio::test]
async fn redis_keys_expire_when_full_again_and_a_stock_keeps_its_key() {
    let stores = EveryStore::start();
    let (server, store) = (&stores.server, &stores.redis);
    // Real time: 1 token per 10 s; one taken, the key lives until it would be full again (10 s).
    let call = Call::take("tl:{x:ttl}", bucket((5, 1, 10_000)), 1, 1);
    assert_eq!(store.run(&call).await.expect("take").granted, 1);
    let pttl: i64 = server
        .cmd(&["PTTL", "tl:{x:ttl}"])
        .expect("pttl")
        .trim()
        .parse()
        .expect("int");
    assert!((9_000..=10_000).contains(&pttl), "pttl {pttl}");
    // Rate 0: expiring would refill the stock, so the key never expires.
    let stock = Call::take("tl:{x:stock}", bucket((5, 0, 1_000)), 1, 1);
    assert_eq!(store.run(&stock).await.expect("take").granted, 1);
    assert_eq!(server.cmd(&["PTTL", "tl:{x:stock}"]).expect("pttl").trim(), "-1");
}

/// A pseudo-random sequence of takes and returns gives identical replies on both stores.
#[tokio::test]
async fn redis_and_memory_agree_on_a_random_sequence() {
    let stores = EveryStore::start();
    let (redis, memory) = (&stores.redis, &stores.memory);
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let params = [
        (7, 3, 1_000),
        (100, 1, 60_000),
        (1, 1, 1),
        (50, 0, 1_000),
        (1000, 997, 3_001),
    ];
    let mut now = 1_700_000_000_000;
    for i in 0..600 {
        let (cap, rate, per) = params[usize::try_from(next(5)).expect("idx")];
        let key = format!("tl:{{r:{cap}:{rate}:{per}}}");
        let params = (cap, rate, per);
        now += next(2_000);
        let call = if next(4) == 0 {
            // Returns and debits alike: −10 to 9 tokens.
            give(&key, params, i64::try_from(next(20)).expect("n") - 10, now)
        } else {
            let min = 1 + next(cap);
            take(&key, params, min, min + next(5), now)
        };
        let a = redis.run(&call).await.expect("redis");
        let b = memory.run(&call).await.expect("memory");
        assert_eq!(a, b, "step {i}: {call:?}");
    }
}

#[tokio::test]
async fn bad_arguments_are_errors_on_both_stores() {
    let stores = EveryStore::start();
    for (name, store) in stores.each() {
        for (params, min, max) in [
            ((0, 1, 1000), 1, 1),
            ((5, 1, 0), 1, 1),
            ((5, 1, 1000), 0, 1),
            ((5, 1, 1000), 3, 2),
        ] {
            let call = take("tl:{bad}", params, min, max, 0);
            assert!(store.run(&call).await.is_err(), "{params:?} {min} {max} on {name}");
        }
    }
}
