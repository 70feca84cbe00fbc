//! Peeks (cost 0) and resets through the limiter, on a real Redis: a peek of a leased key counts the tokens
//! this process holds and takes nothing; a reset drops them and forgets the shared bucket and the ban.

mod common;

use std::time::Duration;

use tokenlease::{Error, Lease, Rule};

#[tokio::test]
async fn a_peek_takes_nothing_and_a_reset_starts_a_leased_key_afresh() {
    let server = common::RedisServer::start();
    // 100 tokens, 1 an hour: refills too slowly to blur the counts.
    let rule = Rule::token_bucket("sku", 100, 1, Duration::from_secs(3600))
        .and_then(|r| {
            r.with_lease(Lease {
                min_batch: 10,
                max_batch: 20,
                ttl: Duration::from_secs(30),
                hot_after: Some(1),
                reserve: None,
            })
        })
        .expect("rule");
    let limiter = common::limiter([rule]).redis(&server).build();
    let peek = limiter.peek("sku", "s1").await.expect("peek");
    assert_eq!((peek.allowed, peek.remaining), (true, 100), "a new key: full");
    for _ in 0..3 {
        // The first leases a batch; the others are decided from it (and cache the bucket on this thread).
        assert!(limiter.check("sku", "s1", 1).await.expect("check").allowed);
    }
    let held = 100 - redis_tokens(&server, &limiter.store_key("sku", "s1"));
    assert!(held >= 10, "the first check leased a batch ({held} tokens left Redis)");
    let calls = limiter.store_calls();
    for _ in 0..3 {
        let peek = limiter.check("sku", "s1", 0).await.expect("peek");
        // Redis's tokens plus the batch this process holds, less the three spent.
        assert_eq!((peek.allowed, peek.remaining), (true, 97));
    }
    assert_eq!(limiter.store_calls(), calls + 3, "a peek is one store call");
    assert_eq!(
        redis_tokens(&server, &limiter.store_key("sku", "s1")),
        100 - held,
        "peeks took nothing"
    );

    limiter.reset("sku", "s1").await.expect("reset");
    let exists = server
        .cmd(&["EXISTS", &limiter.store_key("sku", "s1")])
        .unwrap_or_default();
    assert_eq!(exists.trim(), "0", "the bucket is gone from Redis");
    assert_eq!(
        limiter.peek("sku", "s1").await.expect("peek").remaining,
        100,
        "the held batch was dropped"
    );
    for _ in 0..100 {
        assert!(limiter.check("sku", "s1", 1).await.expect("check").allowed);
    }
    assert!(
        !limiter.check("sku", "s1", 1).await.expect("check").allowed,
        "100 after the reset, no more"
    );
    let peek = limiter.peek("sku", "s1").await.expect("peek");
    assert_eq!((peek.allowed, peek.remaining), (false, 0));
    let hour = Duration::from_secs(3600);
    assert!(
        peek.retry_after <= hour && peek.retry_after > hour - Duration::from_secs(60),
        "{peek:?}"
    );
    limiter.shutdown().await;
}

#[tokio::test]
async fn a_reset_lifts_a_ban_and_acquire_refuses_cost_zero() {
    let server = common::RedisServer::start();
    let like = Rule::sliding_log("like", 2, Duration::from_secs(60))
        .and_then(|r| r.with_ban(Duration::from_secs(3600)))
        .expect("rule");
    let queue = Rule::leaky_bucket("jobs", 5, Duration::from_secs(1), Duration::from_secs(10)).expect("rule");
    let limiter = common::limiter([like, queue]).redis(&server).build();
    for _ in 0..2 {
        assert!(limiter.check("like", "u1", 1).await.expect("check").allowed);
    }
    assert!(
        !limiter.check("like", "u1", 1).await.expect("check").allowed,
        "the third bans for an hour"
    );
    let peek = limiter.peek("like", "u1").await.expect("peek");
    assert!(
        !peek.allowed && peek.retry_after > Duration::from_secs(3590),
        "banned: {peek:?}"
    );
    limiter.reset("like", "u1").await.expect("reset");
    let peek = limiter.peek("like", "u1").await.expect("peek");
    assert_eq!(
        (peek.allowed, peek.remaining),
        (true, 2),
        "the log and the ban are gone"
    );
    assert!(limiter.check("like", "u1", 1).await.expect("check").allowed);

    assert!(matches!(
        limiter.acquire("jobs", "j", 0).await,
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        limiter.peek("jobs", "").await,
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(limiter.reset("nope", "j").await, Err(Error::UnknownRule(_))));
    limiter.shutdown().await;
}

/// Tokens in the Redis bucket now, from its hash (a missing key is a full bucket of 100).
fn redis_tokens(server: &common::RedisServer, key: &str) -> u64 {
    let out = server.cmd(&["HGET", key, "level"]).unwrap_or_default();
    out.trim().parse::<u64>().map_or(100, |level| level / 3_600_000)
}
