//! Tests of `bucket.rs`: expiry, the cached refusal and the size of a lease.

use super::*;

fn lease() -> Lease {
    Lease {
        min_batch: 10,
        max_batch: 100,
        ttl: Duration::from_millis(200),
        hot_after: None,
    }
}

/// A key's bucket of 1000 tokens refilled at 1 per second, leased 10 to 100 at a time for 200 ms.
fn local_bucket() -> LocalBucket {
    let bucket = TokenBucket {
        capacity: 1000,
        rate: 1,
        per_ms: 1000,
    };
    LocalBucket::new("k", "k".into(), bucket, lease(), 1, 0)
}

#[test]
fn expiry_gives_back_only_what_older_batches_left() {
    let b = local_bucket();
    let plan = b.plan(1000, 1, 0);
    let grant = |tokens| Reply {
        granted: tokens,
        remaining: 990,
        retry_after_ms: 0,
        reset_after_ms: 0,
    };
    assert!(b.add(&grant(10), 200, plan, 0));
    assert!(matches!(b.try_take(4, 10), Take::Taken { .. }));
    assert_eq!(b.available(), 6);
    assert!(b.add(&grant(10), 300, plan, 100));
    assert!(
        !b.add(&grant(10), 150, plan, 150),
        "a reply after its deadline is not added"
    );
    // 16 left: 6 of the first batch, 10 of the second. At 200 the first batch's 6 expire.
    assert_eq!(b.expire(199), 0);
    assert_eq!(b.expire(200), 6);
    assert_eq!(b.available(), 10);
    assert!(matches!(b.try_take(3, 201), Take::Taken { .. }));
    assert_eq!(b.available(), 7);
    assert_eq!(b.expire(300), 7);
    assert_eq!(b.available(), 0);
    assert!(!b.has_expired(10_000), "nothing left to expire");
    assert!(b.add(&grant(5), 20_000, plan, 10_000));
    assert_eq!(b.drain(), 5);
    assert!(!b.claim_lease(), "a retired bucket starts no lease");
    assert!(
        !b.add(&grant(10), 90_000, plan, 10_001),
        "nor takes a grant: it goes back"
    );
}

#[test]
fn a_refusal_is_cached_until_retry_after() {
    let b = local_bucket();
    b.refused(Duration::from_nanos(50), Duration::ZERO, Duration::ZERO, 100);
    assert_eq!(b.try_take(1, 120), Take::Exhausted { retry_ns: 30 });
    assert_eq!(b.try_take(1, 150), Take::Empty);
}

#[test]
fn a_lease_is_never_more_than_the_demand_spends_within_its_ttl() {
    let (rate, ms) = (1000, 1_000_000);
    let bucket = TokenBucket {
        capacity: 2000,
        rate,
        per_ms: 1000,
    };
    let b = LocalBucket::new(
        "k",
        "k".into(),
        bucket,
        Lease {
            max_batch: 500,
            ..lease()
        },
        4,
        0,
    );
    for i in 1..=20 {
        // 100 decisions a second, all refused while the bucket is saturated, and starved.
        (0..20).for_each(|_| b.tokens.refused());
        b.mark_starved();
        let now = i * 200 * ms;
        let plan = b.plan(500, 1, now);
        // 100/s × 0.9 × 200 ms = 18: what the demand spends before the lease's deadline.
        assert!(plan.max <= 18 && plan.batch <= 18, "{plan:?}");
        let short = Reply {
            granted: 5,
            remaining: 0,
            retry_after_ms: 0,
            reset_after_ms: 2000,
        };
        assert!(b.add(&short, now + 200 * ms, plan, now + ms));
        assert_eq!(b.expire(now + 200 * ms), 5);
    }
}
