//! The hot path's races under the loom model checker: [`Shards`]' takers, steals and gathers against each other,
//! [`Shards::total`] and [`Shards::remove`] against a steal, and [`LocalBucket::expire`] against
//! [`LocalBucket::try_take`]. Loom runs each model in every interleaving of its threads (up to
//! `LOOM_MAX_PREEMPTIONS` preemptions, 3 unless set), with the shards' atomics and home shards its own
//! (`shards.rs` under `--cfg tokenlease_loom`, two shards a key). Built and run only under that cfg, as
//! scripts/test.sh does:
//!
//! ```text
//! CARGO_TARGET_DIR=target/loom CARGO_PROFILE_DEV_DEBUG=0 RUSTFLAGS="--cfg tokenlease_loom" \
//!     cargo test -p tokenlease --lib lease::loom_tests
//! ```
//!
//! Each model was seen failing on a race put back: the steal's compare-and-swap on its victim made a load and
//! a store (the takers' model), [`Shards::total`] summing once whatever the moves (the total's and the expiry's),
//! the steal's `Moving` guard dropped before the move (those two and the removal's), [`Shards::remove`] making
//! one pass (the removal's, which the code did before this model found it).

use std::time::Duration;

use loom::sync::Arc;
use loom::thread;

use super::bucket::{LocalBucket, Take};
use super::shards::{set_home, Shards};
use crate::algorithm::{Reply, TokenBucket};
use crate::rule::Lease;

const MS: u64 = 1_000_000;

/// Checks `model` in every interleaving loom explores.
fn check(model: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(3);
    }
    builder.check(model);
}

/// A model thread at home on shard `home` that takes each of `costs` from `s`; returns the tokens and the
/// decisions it took.
fn taker(s: &Arc<Shards>, home: usize, costs: &'static [u64]) -> thread::JoinHandle<(u64, u64)> {
    let s = s.clone();
    thread::spawn(move || {
        set_home(home);
        let taken = costs.iter().filter(|&&cost| s.take(cost).is_some());
        taken.fold((0, 0), |(tokens, takes), cost| (tokens + cost, takes + 1))
    })
}

#[test]
fn takers_stealing_and_gathering_spend_exactly_what_was_added() {
    check(|| {
        // Shard 0 holds 2, shard 1 holds 1. The taker at home on 1 needs 2: it steals shard 0's 2, or gathers
        // one from each, or gives back what it gathered when the other taker (at home on 0, two decisions of 1)
        // left too few; that one steals for its second decision when its shard ran dry.
        let s = Arc::new(Shards::holding(&[2, 1]));
        let a = taker(&s, 0, &[1, 1]);
        let b = taker(&s, 1, &[2]);
        let (a, b) = (a.join().unwrap(), b.join().unwrap());
        let left = s.total();
        assert_eq!(
            a.0 + b.0 + left,
            3,
            "taken {a:?} and {b:?}, {left} left: a token made or lost"
        );
        assert_eq!(s.counts().allowed, a.1 + b.1, "every decision counted once");
    });
}

#[test]
fn a_total_counts_the_tokens_a_steal_is_moving() {
    check(|| {
        // Shard 0 is dry: the taker at home on it steals half of shard 1's 4, spends 1 and moves 1 home.
        let s = Arc::new(Shards::holding(&[0, 4]));
        let t = taker(&s, 0, &[1]);
        let total = s.total();
        assert_eq!(t.join().unwrap(), (1, 1));
        assert!(
            (3..=4).contains(&total),
            "total {total} while 4 were added and 1 taken: it missed tokens a steal was moving"
        );
    });
}

#[test]
fn a_remove_racing_a_steal_removes_all_it_was_asked_for() {
    check(|| {
        // Shard 0 is dry: the taker at home on it steals half of shard 1's 6, spends 1 and moves 2 home, while
        // 5 are removed: the 5 other tokens are there all along, in a shard or moving.
        let s = Arc::new(Shards::holding(&[0, 6]));
        let t = taker(&s, 0, &[1]);
        let removed = s.remove(5);
        assert_eq!(t.join().unwrap(), (1, 1));
        let left = s.total();
        assert_eq!(
            removed + 1 + left,
            6,
            "removed {removed}, 1 taken, {left} left: a token made or lost"
        );
        assert_eq!(
            removed, 5,
            "removed {removed} of 5 while 5 were there besides the 1 taken: it missed tokens a steal was moving"
        );
    });
}

/// A key's bucket of 1000 tokens refilled at 1 per second, leased for 200 ms.
fn bucket() -> LocalBucket {
    let bucket = TokenBucket {
        capacity: 1000,
        rate: 1,
        per_ms: 1000,
    };
    let lease = Lease {
        min_batch: 1,
        max_batch: 100,
        ttl: Duration::from_millis(200),
        hot_after: None,
        reserve: None,
    };
    LocalBucket::new("k", "k".into(), bucket, lease, 0)
}

fn grant(tokens: u64) -> Reply {
    Reply {
        granted: tokens,
        remaining: 990,
        retry_after_ms: 0,
        reset_after_ms: 0,
        stamp: 0,
        held: 0,
    }
}

#[test]
fn an_expiry_racing_a_stealing_taker_keeps_no_token_of_an_expired_batch() {
    check(|| {
        let b = Arc::new(bucket());
        set_home(0);
        let plan = b.plan(1000, 1, 0);
        // Batch A: 6 tokens leased at 0 (spent by 200 ms); batch B: 2 leased at 100 ms (by 300 ms). Each is
        // spread over the two shards: 4 and 4.
        assert!(b.add(&grant(6), 0, plan, 0));
        assert!(b.add(&grant(2), 100 * MS, plan, 100 * MS));
        // 4 spent from shard 0, A's (first in, first out): A has 2 left and B 2, all in shard 1.
        assert!(matches!(b.try_take(4, 150 * MS), Take::Taken { .. }));
        // At 200 ms A expires while a taker at home on the dry shard 0 steals 2 of shard 1, spends 1 (one of A's)
        // and moves 1 home.
        let t = {
            let b = b.clone();
            thread::spawn(move || {
                set_home(0);
                b.try_take(1, 200 * MS)
            })
        };
        let expired = b.expire(200 * MS, 4).tokens();
        let taken = match t.join().unwrap() {
            Take::Taken { .. } => 1,
            _ => 0,
        };
        let left = b.available();
        assert_eq!(4 + taken + expired + left, 8, "a token made or lost");
        assert!(
            left <= 2,
            "{left} left after A's deadline (expired {expired}, taken {taken}), B brought 2: a token of A outlived it"
        );
    });
}
