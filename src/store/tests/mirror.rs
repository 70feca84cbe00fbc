//! The token scripts and their mirror agree: a pseudo-random sequence of calls gives the same replies and stores
//! the same bucket on a real Redis and on the in-process store.

use super::harness::EveryStore;
use super::token_bucket::{acquire, bucket, connect, give, paced, redis_bucket, take};
use crate::algorithm::room::Lent;
use crate::algorithm::{HoldAsk, Reply};
use crate::store::call::Op;
use crate::store::script::Arg;
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
            Arg::Lent(lent) => eval.arg(Lent::encode(lent)),
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
    let stamp = values.get(4).copied().unwrap_or(0);
    Reply {
        held: values.get(5).and_then(|h| u64::try_from(*h).ok()).unwrap_or(0),
        ..Reply::from_wire(values[..4].try_into().expect("four integers"), stamp)
    }
}

/// A pseudo-random sequence of takes, paced leases, leases that hold, acquires and returns on a few keys, each call with parameters drawn
/// afresh (so nearly every call is a reload of its key) and adopted at one of four instants, gives identical replies and stores identical buckets on
/// both stores. Redis's TTLs run on real time while the calls run on `now_ms`, so the test plays them on `now_ms`
/// instead: it removes each TTL as the call sets it and deletes a key once its bucket would be full again, as the
/// TTL would have.
#[tokio::test]
async fn redis_and_memory_agree_on_a_random_sequence_with_reloads() {
    play(0x9e37_79b9_7f4a_7c15, true, 2_000).await;
}

/// The same with each key's parameters fixed and calls closer together, so that the notes of room live long
/// enough for give-backs that send a lease's stamp to be capped by them.
#[tokio::test]
async fn redis_and_memory_agree_on_what_give_backs_add_since_their_lease() {
    play(0x2545_f491_4f6c_dd1d, false, 300).await;
}

async fn play(mut seed: u64, reloads: bool, gap_ms: u64) {
    let stores = EveryStore::start();
    let (server, memory) = (&stores.server, &stores.memory);
    let mut con = connect(server);
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
    // The stamps of the last leases granted, newest first.
    let mut stamps: Vec<u64> = Vec::new();
    let mut capped = 0;
    let mut older = 0;
    // Replies that held tokens, and calls that found a hold ended (the level refilled up to its end).
    let (mut holding, mut ended) = (0, 0);
    for i in 0..1_000 {
        let k = next(3);
        let (cap, rate, per) = params[usize::try_from(if reloads { next(6) } else { 3 * k % 6 + 1 }).expect("idx")];
        let key = format!("tl:{{r:{k}}}");
        let params = (cap, rate, per);
        now += next(gap_ms);
        if redis_bucket(&mut con, &key).is_some_and(|s| s.full_at_ms().is_some_and(|t| t <= now)) {
            redis::cmd("DEL").arg(&key).exec(&mut con).expect("DEL");
        }
        let call = match next(9) {
            // Leases that hold tokens for an outage, for one of three holders, some of them retries of calls
            // the record has seen a later one of; some paced.
            7 | 8 => {
                let i = u64::try_from(i).expect("step");
                let ask = HoldAsk {
                    holder: format!("p{}", next(3)),
                    seq: if next(5) == 0 {
                        i.saturating_sub(next(30))
                    } else {
                        i + 1
                    },
                    held: next(cap + 5),
                    want: next(cap),
                    hold_ms: next(3 * gap_ms),
                };
                let min = 1 + next(cap);
                let pace = (1 + next(5) * next(2), 1 + next(800));
                paced(&key, params, (min, min + next(cap), next(cap)), pace, now).holding(ask)
            }
            // Give-backs without a stamp: 0 to 9 tokens.
            0 => give(&key, params, next(10), now),
            // A give-back of the tokens of one to three leases, each capped by the room since its stamp (one
            // of the last leases', or one from before the notes).
            6 => {
                let lent = (0..1 + next(3))
                    .map(|_| Lent {
                        stamp: stamps.get(usize::try_from(next(4)).expect("idx")).copied().unwrap_or(1),
                        tokens: next(cap),
                    })
                    .collect();
                Call::give_back(&key, bucket(params), 0)
                    .once(format!("m.{i}"), std::time::Duration::from_secs(10))
                    .since(lent)
                    .at(now)
            }
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
        // With reloads, each call adopted its parameters at one of four instants: a call adopted before the
        // hash's is decided with the hash's parameters.
        let call = call.adopted(if reloads { next(4) * 1_000 } else { 0 });
        let before = redis_bucket(&mut con, &key);
        older += usize::from(before.as_ref().is_some_and(|s| s.adopted_ms > call.adopted_ms));
        ended += usize::from(before.is_some_and(|s| s.holds.records.iter().any(|h| h.until_ms <= now)));
        let a = run_persisting(&mut con, &call);
        let b = memory.run(&call).await.expect("memory");
        assert_eq!(a, b, "step {i}: {call:?}");
        holding += usize::from(a.held > 0);
        if a.stamp > 0 {
            stamps.insert(0, a.stamp);
            stamps.truncate(4);
        }
        let named = matches!(&call.op, Op::TokenReturn { lent, .. } if !lent.is_empty());
        if let (Op::TokenReturn { tokens, .. }, Some(s), true) = (&call.op, redis_bucket(&mut con, &key), named) {
            // Fewer accepted than given, and the level still below its top: the notes capped it.
            let top = (i128::from(s.bucket.capacity) - i128::from(s.paced.at(now))) * i128::from(s.bucket.per_ms);
            capped += usize::from(a.granted < *tokens && i128::from(s.level) < top);
        }
        assert_eq!(
            redis_bucket(&mut con, &key),
            memory.token_bucket(&key),
            "the stored bucket after step {i}: redis (left) and memory (right); {call:?}"
        );
    }
    assert!(
        holding >= 30 && ended >= 30,
        "{holding} replies held tokens, {ended} calls found a hold ended"
    );
    if !reloads {
        assert!(capped >= 10, "only {capped} give-backs were capped by their notes");
    } else {
        assert!(
            older >= 50,
            "only {older} calls were adopted before the hash's parameters"
        );
    }
}
