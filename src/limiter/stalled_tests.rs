//! A process stopped past its leases' TTL and resumed before its ticker thread ran again: the hot path's reading
//! of the clock stood still, and leased tokens must not be spent past their deadline on it (invariant 1).

use std::sync::Arc;
use std::time::Duration;

use crate::{Config, FakeClock, Limiter};

const SALE: &str = r#"
[[rule]]
name = "sale"
algorithm = "token_bucket"
capacity = 100
rate = 1
per = "1h"
lease = { min_batch = 10, max_batch = 10, ttl = "200ms", hot_after = 1 }
"#;

#[tokio::test]
async fn leased_tokens_past_their_ttl_are_not_spent_on_a_reading_that_stood_still() {
    let clock = FakeClock::starting_at(Duration::from_secs(1));
    let config = Config::from_toml(SALE).expect("config");
    let limiter = Limiter::builder()
        .rules(config.rules)
        .clock(Arc::new(clock.clone()))
        .stalled_clock()
        .build()
        .expect("limiter");
    let compiled = limiter.inner.rules.load().get("sale").cloned().expect("rule");
    let held = || compiled.leases.get("k").map_or(0, |local| local.available());
    for _ in 0..20 {
        if held() > 1 {
            break;
        }
        assert!(limiter.check("sale", "k", 1).await.expect("check").allowed);
        tokio::task::yield_now().await;
    }
    assert!(held() > 1, "the key leased a batch");
    let engine = &limiter.inner.engine;
    let fresh = engine.decide_now(&compiled, "k", 1).expect("valid");
    assert!(
        fresh.is_some_and(|d| d.allowed),
        "within the TTL the hot path spends the batch"
    );
    // Stopped for a second: the clock moved, the hot path's reading did not.
    clock.advance(Duration::from_secs(1));
    let held_before = held();
    let stale = engine.decide_now(&compiled, "k", 1).expect("valid");
    assert!(
        stale.is_none_or(|d| !d.allowed),
        "a token of a batch 800 ms past its TTL was spent: {stale:?}"
    );
    assert_eq!(
        held(),
        held_before,
        "the token taken and found expired is put back for the expiry"
    );
    limiter.shutdown().await;
}
