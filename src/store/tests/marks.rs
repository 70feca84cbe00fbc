//! How long a give-back's mark is kept (`token_return.lua`'s `mark_ms`): as long as the caller says, 10 s when it
//! says 0, on both stores. A retry inside the mark adds nothing; the mark must outlive every retry of its call
//! (`Timings::mark`).

use std::time::Duration;

use super::harness::EveryStore;
use super::token_bucket::{bucket, connect, take};
use crate::store::{Call, Store};

const PARAMS: (u64, u64, u64) = (10, 1, 1_000);

/// token_return.lua with a give-back's mark `{bucket}:return:{id}` kept 10 s: ARGV capacity, rate, per_ms,
/// tokens, mark_ms.
pub(super) fn give_once(key: &str, params: (u64, u64, u64), tokens: u64, id: &str, now: u64) -> Call {
    marked(key, params, tokens, (id, Duration::from_secs(10)), now)
}

/// A give-back of `tokens` marked `id`, kept `mark`, at `now`.
fn marked(key: &str, params: (u64, u64, u64), tokens: u64, (id, mark): (&str, Duration), now: u64) -> Call {
    Call::give_back(key, bucket(params), tokens).once(id, mark).at(now)
}

#[tokio::test]
async fn redis_keeps_a_give_backs_mark_as_long_as_the_caller_says() {
    let stores = EveryStore::start();
    let mut con = connect(&stores.server);
    for (id, mark, pttl) in [("long", 30_000, 30_000), ("default", 0, 10_000)] {
        let key = format!("tl:{{marks:{id}}}");
        stores.redis.run(&take(&key, PARAMS, 5, 5, 0)).await.expect("take");
        let call = marked(&key, PARAMS, 3, (id, Duration::from_millis(mark)), 0);
        // `once` sends at least 1 ms; a caller of another language may send 0 for the default.
        let mut eval = redis::cmd("EVAL");
        eval.arg(call.script().source()).arg(2).arg(call.keys());
        eval.arg(PARAMS.0)
            .arg(PARAMS.1)
            .arg(PARAMS.2)
            .arg(3)
            .arg(mark)
            .arg(-1)
            .arg(0);
        let reply: Vec<i64> = eval.query(&mut con).expect("EVAL");
        assert_eq!(reply[0], 3, "{id}: the give-back added its tokens");
        let left: i64 = redis::cmd("PTTL").arg(&call.keys()[1]).query(&mut con).expect("PTTL");
        assert!(
            (pttl - 1_000..=pttl).contains(&left),
            "{id}: the mark lives {left} ms, not {pttl}"
        );
    }
}

#[tokio::test]
async fn the_in_process_store_forgets_a_mark_when_the_caller_said() {
    let stores = EveryStore::start();
    let memory: &dyn Store = &stores.memory;
    let slow = (100, 1, 1_000);
    for (id, mark, remaining) in [("long", 30_000, 68), ("short", 10_000, 71)] {
        let key = format!("tl:{{marks:{id}}}");
        memory.run(&take(&key, slow, 50, 50, 0)).await.expect("take");
        let mark = Duration::from_millis(mark);
        let first = memory
            .run(&marked(&key, slow, 3, (id, mark), 0))
            .await
            .expect("give-back");
        assert_eq!((first.granted, first.remaining), (3, 53));
        // Sent again 15 s later, when the refill has brought the 53 to 68: inside a 30 s mark it was
        // applied already (the reply repeats the 3 it added then); after a 10 s one it adds them again.
        let retry = memory
            .run(&marked(&key, slow, 3, (id, mark), 15_000))
            .await
            .expect("retry");
        assert_eq!(
            (retry.granted, retry.remaining),
            (3, remaining),
            "{id}: a retry 15 s later"
        );
    }
}
