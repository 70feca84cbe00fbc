//! The token scripts and their mirror agree: a pseudo-random sequence of calls gives the same replies and stores
//! the same bucket on a real Redis and on the in-process store.

use super::harness::EveryStore;
use super::token_bucket::{acquire, connect, give, paced, redis_bucket, take};
use crate::algorithm::Reply;
use crate::store::call::Arg;
use crate::store::{Call, Store};

/// Runs `call`'s script on Redis and removes its key's TTL in one transaction (Redis 7 freezes its clock for
/// it, so the key cannot expire in between).
fn run_persisting(con: &mut redis::Connection, call: &Call) -> Reply {
    let mut eval = redis::cmd("EVAL");
    eval.arg(call.script().source()).arg(call.keys().len()).arg(call.keys());
    for arg in call.args() {
        match arg {
            Arg::Int(v) => eval.arg(v),
            Arg::Str(s) => eval.arg(s),
        };
    }
    let (values,): (Vec<i64>,) = redis::pipe()
        .atomic()
        .add_command(eval)
        .cmd("PERSIST")
        .arg(&call.key)
        .ignore()
        .query(con)
        .unwrap_or_else(|e| panic!("{call:?}: {e}"));
    Reply::from_wire(values.try_into().expect("four integers"))
}

/// A pseudo-random sequence of takes, paced leases, acquires, returns and debits on a few keys, each call with parameters drawn
/// afresh (so nearly every call is a reload of its key), gives identical replies and stores identical buckets on
/// both stores. Redis's TTLs run on real time while the calls run on `now_ms`, so the test plays them on `now_ms`
/// instead: it removes each TTL as the call sets it and deletes a key once its bucket would be full again, as the
/// TTL would have.
#[tokio::test]
async fn redis_and_memory_agree_on_a_random_sequence_with_reloads() {
    let stores = EveryStore::start();
    let (server, memory) = (&stores.server, &stores.memory);
    let mut con = connect(server);
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
        (10, 10, 1_000),
    ];
    let mut now = 1_700_000_000_000;
    for i in 0..800 {
        let (cap, rate, per) = params[usize::try_from(next(6)).expect("idx")];
        let key = format!("tl:{{r:{}}}", next(3));
        let params = (cap, rate, per);
        now += next(2_000);
        if redis_bucket(&mut con, &key).is_some_and(|s| s.full_at_ms().is_some_and(|t| t <= now)) {
            redis::cmd("DEL").arg(&key).exec(&mut con).expect("DEL");
        }
        let call = match next(6) {
            // Returns and debits alike: −10 to 9 tokens.
            0 => give(&key, params, i64::try_from(next(20)).expect("n") - 10, now),
            1 => acquire(&key, params, 1 + next(cap), next(5_000), now),
            // Paced leases: pending tokens that cap the refill and the give-backs.
            2 => {
                let min = 1 + next(cap);
                let lease = (min, min + next(cap), next(cap));
                paced(&key, params, lease, (1 + next(5), 1 + next(800)), now)
            }
            _ => {
                let min = 1 + next(cap);
                take(&key, params, min, min + next(5), now)
            }
        };
        let a = run_persisting(&mut con, &call);
        let b = memory.run(&call).await.expect("memory");
        assert_eq!(a, b, "step {i}: {call:?}");
        assert_eq!(
            redis_bucket(&mut con, &key),
            memory.token_bucket(&key),
            "the stored bucket after step {i}: redis (left) and memory (right); {call:?}"
        );
    }
}
