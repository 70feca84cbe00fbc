//! Unit tests of `bucket.rs`: the local bucket's hot path, leases, turns and expiry.
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
    LocalBucket::new("k", "k".into(), bucket, lease(), 0)
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
fn a_first_lease_on_a_spent_bucket_waits_half_a_ttl_in_a_large_fleet_only() {
    let bucket = TokenBucket {
        capacity: 2_000,
        rate: 1_000,
        per_ms: 1_000,
    };
    let lease = Lease {
        min_batch: 10,
        max_batch: 500,
        ttl: Duration::from_millis(200),
        hot_after: None,
    };
    let made = 1_000_000_000;
    let fresh = || LocalBucket::new("k", "tl:{r:k}".into(), bucket, lease, made);
    // Not made hot by the fleet's spending: leases at once, however large the fleet.
    assert_eq!(fresh().first_lease_wait(1_000, made), None);
    // Four processes: their first turns (6 ms apart) go round within the 100 ms wait.
    assert_eq!(fresh().measuring().first_lease_wait(4, made), None);
    // A thousand: the first lease waits until half a TTL after the bucket was made, refusing meanwhile.
    let spent = fresh().measuring();
    let until = made + 100_000_000;
    assert_eq!(spent.first_lease_wait(1_000, made + 1), Some(until));
    assert!(matches!(spent.try_take(1, made + 2), Take::Exhausted { .. }));
    // Once only: the lease after the wait goes.
    assert_eq!(spent.first_lease_wait(1_000, until), None);
}
