//! The queues' scripts replayed with exact `now_ms` sequences on both stores: the leaky bucket's shared
//! schedule (GCRA) and the token bucket's "consume now, pay later" debt (Guava's SmoothBursty).

use super::harness::{r, step, EveryStore, Step};
use crate::algorithm::{LeakyBucket, TokenBucket};
use crate::store::Call;

fn reserve(key: &str, rate: u64, per_ms: u64, cost: u64, max_wait_ms: u64, member: &str, now: u64) -> Call {
    Call::reserve(key, LeakyBucket { rate, per_ms }, cost, max_wait_ms, member).at(now)
}

fn give_back(key: &str, rate: u64, per_ms: u64, cost: u64, member: &str, now: u64) -> Call {
    Call::release(key, LeakyBucket { rate, per_ms }, cost, member).at(now)
}

fn leaky_table(p: &str) -> Vec<Step> {
    let k = |n: &str| format!("tl:{{q:{p}-{n}}}");
    let t0 = 1_700_000_000_000;
    // 10 per second (100 ms apart), at most 250 ms of wait.
    let steps = [
        (reserve(&k("a"), 10, 1000, 1, 250, "a1", t0), r(1, 2, 0, 100)),
        (reserve(&k("a"), 10, 1000, 1, 250, "a2", t0), r(1, 1, 100, 200)),
        (reserve(&k("a"), 10, 1000, 1, 250, "a3", t0), r(1, 0, 200, 300)),
        (reserve(&k("a"), 10, 1000, 1, 250, "a4", t0), r(0, 0, 50, 300)),
        (reserve(&k("a"), 10, 1000, 1, 250, "a5", t0 + 50), r(1, 0, 250, 350)),
        // 5000 per second: 0.2 ms apart, kept exactly (waits round up to whole ms). A first reservation of 100 ms
        // of slots keeps the key in Redis that long in real time while the replay's clock stands still.
        // remaining: slots starting within 110 ms (at 0.2, 0.4, ... 110.0 ms after the TAT).
        (reserve(&k("fast"), 5000, 1000, 500, 110, "f0", t0), r(500, 51, 0, 100)),
        (reserve(&k("fast"), 5000, 1000, 1, 110, "f1", t0), r(1, 50, 100, 101)),
        (reserve(&k("fast"), 5000, 1000, 1, 110, "f2", t0), r(1, 49, 101, 101)),
        (reserve(&k("fast"), 5000, 1000, 3, 110, "f3", t0), r(3, 46, 101, 101)),
        (reserve(&k("fast"), 5000, 1000, 5, 110, "f4", t0), r(5, 41, 101, 102)),
        // The TAT was exactly t0 + 102 ms: at that millisecond the queue is empty again.
        (reserve(&k("fast"), 5000, 1000, 1, 110, "f5", t0 + 102), r(1, 550, 0, 1)),
        // Handing back: only the last reservation can be.
        (reserve(&k("b"), 10, 1000, 1, 1000, "b1", t0), r(1, 10, 0, 100)),
        (reserve(&k("b"), 10, 1000, 1, 1000, "b2", t0), r(1, 9, 100, 200)),
        (give_back(&k("b"), 10, 1000, 1, "b1", t0 + 10), r(0, 0, 0, 190)),
        (give_back(&k("b"), 10, 1000, 1, "b2", t0 + 10), r(1, 0, 0, 90)),
        (reserve(&k("b"), 10, 1000, 1, 1000, "b3", t0 + 10), r(1, 9, 90, 190)),
        // try: no wait allowed
        (reserve(&k("c"), 10, 1000, 1, 0, "c1", t0), r(1, 0, 0, 100)),
        (reserve(&k("c"), 10, 1000, 1, 0, "c2", t0 + 40), r(0, 0, 60, 60)),
        (reserve(&k("c"), 10, 1000, 1, 0, "c3", t0 + 100), r(1, 0, 0, 100)),
    ];
    steps.into_iter().map(|(call, reply)| step("", call, reply)).collect()
}

/// token_acquire.lua: capacity, rate, per_ms, cost, max_wait_ms, now_ms.
fn acquire_call(key: &str, (capacity, rate, per_ms): (u64, u64, u64), cost: u64, max_wait_ms: u64, now: u64) -> Call {
    Call::acquire(key, TokenBucket { capacity, rate, per_ms }, cost, max_wait_ms).at(now)
}

/// Guava's "consume now, pay later" replayed: 5 per second, a burst of 10.
fn debt_table(p: &str) -> Vec<Step> {
    let k = format!("tl:{{debt:{p}}}");
    let b = (10, 5, 1000);
    let t0 = 1_700_000_000_000;
    let steps = [
        // A full bucket, not in debt: 10 at once, then 10 more at once, into debt (2 s of it).
        (acquire_call(&k, b, 10, 5_000, t0), r(10, 0, 0, 2_000)),
        (acquire_call(&k, b, 10, 5_000, t0), r(10, 0, 0, 4_000)),
        // The next caller pays: it waits the 2 s of debt, and takes its token.
        (acquire_call(&k, b, 1, 5_000, t0), r(1, 0, 2_000, 4_200)),
        // A wait over max_wait is refused with the time until it would fit.
        (acquire_call(&k, b, 1, 1_000, t0), r(0, 0, 1_200, 4_200)),
        // 2.2 s later the debt is repaid: no wait again.
        (acquire_call(&k, b, 1, 0, t0 + 2_200), r(1, 0, 0, 2_200)),
        // check-style callers are refused while the bucket is in debt, with the time until a token is there.
        (
            Call::take(
                &k,
                TokenBucket {
                    capacity: 10,
                    rate: 5,
                    per_ms: 1000,
                },
                1,
                1,
            )
            .at(t0 + 2_200),
            r(0, 0, 400, 2_200),
        ),
        // cost above the capacity can never be granted
        (acquire_call(&k, b, 11, 60_000, t0 + 2_200), r(0, 0, -1, 2_200)),
    ];
    steps.into_iter().map(|(call, reply)| step("", call, reply)).collect()
}

#[tokio::test]
async fn debt_table_on_every_store() {
    EveryStore::start().replay(debt_table).await;
}

#[tokio::test]
async fn leaky_table_on_every_store() {
    EveryStore::start().replay(leaky_table).await;
}
