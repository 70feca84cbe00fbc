//! No undersell in one process (issue "sell"): whatever its lease settings and however long it sat idle, a
//! leased rule admits at an instant at least what the same rule without a lease admits there, less one batch (the
//! tokens a lease may hold back, or give back a moment late). Proptest over random buckets, lease settings and
//! idle gaps, one process on the in-process store, on tokio's paused clock.
//!
//! It fails today, so it is ignored (`cargo test --test undersell -- --ignored` runs it): the cases it shrank to
//! are in `undersell.proptest-regressions` and replay first. It shrinks now to a bucket of 27 refilled 5 a
//! second, batches 4 to 5, TTL 20 ms, hot after 2: 1 and 11 decisions at 0 ms, then 7 at 20 ms admit 1 of the 7
//! where an unleased rule admits 7. Traced: the demand reads 50 a second after the quiet gap, the one process
//! marks the bucket saturated (less than half the burst left), so the lease is paced a token every 20 ms and the
//! other 6 are refused until the next chunk. Issue "sell", item 4: see docs/ARCHITECTURE.md, Known limits.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tokenlease::{Clock, Lease, Limiter, MemoryStore, Rule, TokioClock};

/// A limiter on its own in-process store, on tokio's paused clock.
fn alone(rule: Rule) -> Limiter {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
    Limiter::builder()
        .rule(rule)
        .store(Arc::new(MemoryStore::with_clock(clock.clone())))
        .clock(clock)
        .expected_processes(1)
        .build()
        .expect("limiter")
}

/// `checks` decisions of one token, one after the other; how many were allowed.
async fn admitted(limiter: &Limiter, checks: u32) -> u64 {
    let mut allowed = 0;
    for _ in 0..checks {
        if limiter.check("r", "k", 1).await.expect("check").allowed {
            allowed += 1;
        }
    }
    allowed
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    #[ignore = "fails today: issue 33 item 4, docs/ARCHITECTURE.md Known limits"]
    fn a_leased_rule_admits_what_an_unleased_one_does_less_one_batch(
        (capacity, rate) in (1u64..60, 1u64..60),
        (min_batch, extra, ttl_ms, hot_after) in (1u64..30, 0u64..60, 20u64..2_000, 1u64..5),
        steps in proptest::collection::vec((0u64..3_000, 1u32..25), 1..12),
    ) {
        let min_batch = min_batch.min(capacity);
        let max_batch = (min_batch + extra).min(capacity.max(min_batch));
        let lease = Lease { min_batch, max_batch, ttl: Duration::from_millis(ttl_ms), hot_after: Some(hot_after) };
        let plain = Rule::token_bucket("r", capacity, rate, Duration::from_secs(1)).expect("rule");
        let leased = plain.clone().with_lease(lease).expect("lease");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime");
        let failure = runtime.block_on(async {
            let (plain, leased) = (alone(plain), alone(leased));
            for (i, (gap_ms, checks)) in steps.iter().enumerate() {
                tokio::time::sleep(Duration::from_millis(*gap_ms)).await;
                let (p, l) = (admitted(&plain, *checks).await, admitted(&leased, *checks).await);
                if l + max_batch < p {
                    return Some(format!("step {i} ({gap_ms} ms idle, {checks} checks): leased {l}, unleased {p}"));
                }
            }
            None
        });
        prop_assert!(failure.is_none(), "{}", failure.unwrap_or_default());
    }
}
