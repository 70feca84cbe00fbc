//! Peeks (cost 0) and resets replayed with exact `now_ms` sequences on both stores, one algorithm at a time:
//! a peek answers as a call of one token would, and takes, records, reserves and bans nothing (the call after
//! it is answered as if it had not happened); a reset forgets the key and its ban.

use super::harness::{r, step, EveryStore, Step};
use crate::algorithm::{LeakyBucket, TokenBucket};
use crate::store::Call;

const T: u64 = 1_700_000_000_000; // a multiple of the sub-buckets' 10 s
const BAN: u64 = 60_000;

fn table(p: &str) -> Vec<Step> {
    let k = |n: &str| format!("tl:{{peek:{p}-{n}}}");
    let at = |call: Call, now: u64| call.at(now);
    // A token bucket of 5, 1 a second, that bans for a minute after a refusal.
    let b = TokenBucket {
        capacity: 5,
        rate: 1,
        per_ms: 1_000,
    };
    let tb = |cost: u64, now: u64| at(Call::take_or_ban(k("bucket"), b, cost, BAN), now);
    // At most 3 in any 60 s (log, window, counter of 6 sub-buckets), each banning for 10 s after a refusal.
    let log = |cost: u64, now: u64| {
        at(
            Call::sliding_log(k("log"), (60_000, 3), cost, 10_000, format!("m{now}")),
            now,
        )
    };
    let fixed = |cost: u64, now: u64| at(Call::fixed_window(k("fixed"), (60_000, 3), cost, 10_000, None), now);
    let counter = |cost: u64, now: u64| at(Call::sliding_window(k("counter"), (60_000, 3), 6, cost, 10_000), now);
    // A queue of 1 a second.
    let q = LeakyBucket { rate: 1, per_ms: 1_000 };
    let queue = |cost: u64, wait: u64, now: u64| at(Call::reserve(k("queue"), q, cost, wait, format!("j{now}")), now);
    let reset = |name: &str, now: u64| at(Call::reset(k(name)), now);
    vec![
        // Token bucket.
        step("bucket: peek a new key", tb(0, T), r(0, 5, 0, 0)),
        step("bucket: take all", tb(5, T), r(5, 0, 0, 5_000)),
        step(
            "bucket: peek empty: 1 s to a token, no ban",
            tb(0, T),
            r(0, 0, 1_000, 5_000),
        ),
        step("bucket: not banned by the peek", tb(1, T + 1_000), r(1, 0, 0, 5_000)),
        step(
            "bucket: refused, banned",
            tb(1, T + 1_000),
            r(0, 0, BAN as i64, BAN as i64),
        ),
        step("bucket: peek banned", tb(0, T + 2_000), r(0, 1, 59_000, 59_000)),
        step(
            "bucket: peek again, the ban not extended",
            tb(0, T + 2_000),
            r(0, 1, 59_000, 59_000),
        ),
        step("bucket: reset", reset("bucket", T + 2_000), r(0, 0, 0, 0)),
        step("bucket: full and unbanned", tb(0, T + 2_000), r(0, 5, 0, 0)),
        // Sliding log.
        step("log: peek a new key", log(0, T), r(0, 3, 0, 0)),
        step("log: take 1", log(1, T), r(1, 2, 0, 60_000)),
        step("log: peek", log(0, T + 1_000), r(0, 2, 0, 59_000)),
        step("log: take 2", log(2, T + 2_000), r(2, 0, 0, 60_000)),
        step("log: peek full", log(0, T + 3_000), r(0, 0, 57_000, 59_000)),
        step(
            "log: peek full again, no ban",
            log(0, T + 3_000),
            r(0, 0, 57_000, 59_000),
        ),
        step("log: reset", reset("log", T + 3_000), r(0, 0, 0, 0)),
        step(
            "log: a full window after the reset",
            log(3, T + 3_000),
            r(3, 0, 0, 60_000),
        ),
        // Fixed window (rolling): a peek opens no window.
        step("fixed: peek a new key", fixed(0, T), r(0, 3, 0, 0)),
        step(
            "fixed: the first hit opens the window",
            fixed(1, T + 1_000),
            r(1, 2, 0, 60_000),
        ),
        step("fixed: peek", fixed(0, T + 2_000), r(0, 2, 0, 59_000)),
        step("fixed: take 2", fixed(2, T + 2_000), r(2, 0, 0, 59_000)),
        step("fixed: peek full", fixed(0, T + 3_000), r(0, 0, 58_000, 58_000)),
        step(
            "fixed: peek full again, no ban",
            fixed(0, T + 3_000),
            r(0, 0, 58_000, 58_000),
        ),
        step("fixed: reset", reset("fixed", T + 3_000), r(0, 0, 0, 0)),
        step("fixed: empty after the reset", fixed(0, T + 3_000), r(0, 3, 0, 0)),
        // Sliding-window counter.
        step("counter: peek a new key", counter(0, T), r(0, 3, 0, 0)),
        step("counter: take 1", counter(1, T), r(1, 2, 0, 60_000)),
        step("counter: peek", counter(0, T + 1_000), r(0, 2, 0, 59_000)),
        step("counter: take 2", counter(2, T + 1_000), r(2, 0, 0, 59_000)),
        step("counter: peek full", counter(0, T + 2_000), r(0, 0, 58_000, 58_000)),
        step(
            "counter: peek full again, no ban",
            counter(0, T + 2_000),
            r(0, 0, 58_000, 58_000),
        ),
        step("counter: reset", reset("counter", T + 2_000), r(0, 0, 0, 0)),
        step("counter: empty after the reset", counter(0, T + 2_000), r(0, 3, 0, 0)),
        // Leaky bucket: a peek reserves no slot.
        step("queue: peek a new key", queue(0, 0, T), r(0, 1, 0, 0)),
        step("queue: reserve the free slot", queue(1, 0, T), r(1, 0, 0, 1_000)),
        step(
            "queue: peek: the next slot in 800 ms",
            queue(0, 0, T + 200),
            r(0, 0, 800, 800),
        ),
        step(
            "queue: peek waiting up to 5 s: 5 slots",
            queue(0, 5_000, T + 200),
            r(0, 5, 0, 800),
        ),
        step(
            "queue: the next slot is still free at 1 s",
            queue(1, 0, T + 1_000),
            r(1, 0, 0, 1_000),
        ),
        step("queue: reset", reset("queue", T + 1_000), r(0, 0, 0, 0)),
        step("queue: free after the reset", queue(0, 0, T + 1_000), r(0, 1, 0, 0)),
    ]
}

#[tokio::test]
async fn peeks_take_nothing_and_resets_forget_on_every_store() {
    EveryStore::start().replay(table).await;
}
