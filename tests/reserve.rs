//! `fail_mode = "local"`'s reserve: while the store fails, a hot key sells the tokens the store held for it,
//! paced over the reserve's length, and nothing more; under `closed` it sells only what it had leased.

use std::sync::Arc;
use std::time::Duration;

use tokenlease::{FailMode, Faults, Lease, Limiter, Rule, StoreFault, TokioClock};

/// Tokens the rule's bucket holds and refills a second.
const CAPACITY: u64 = 200;
const RATE: u64 = 100;
/// The largest batch a lease brings.
const MAX_BATCH: u64 = 20;

/// Tokens admitted in each 10 ms of 6 s: one process deciding 200 times a second (twice the rate) on one key,
/// the store refusing every call from 3 s on; and the tokens the store held for it just before.
async fn admitted(mode: FailMode, reserve: Option<Duration>) -> (Vec<u64>, u64) {
    let clock = Arc::new(TokioClock::new());
    let faults = Faults::new(clock.clone(), Duration::from_millis(1), Duration::from_millis(50));
    let lease = Lease {
        min_batch: 1,
        max_batch: MAX_BATCH,
        ttl: Duration::from_millis(200),
        hot_after: Some(1),
        reserve,
    };
    let rule = Rule::token_bucket("r", CAPACITY, RATE, Duration::from_secs(1))
        .and_then(|r| r.with_lease(lease))
        .expect("rule")
        .with_fail_mode(mode);
    let limiter = Limiter::builder()
        .rule(rule)
        .store(faults.link(0))
        .clock(clock)
        .timeout(Duration::from_millis(50))
        .member("p0")
        .build()
        .expect("limiter");
    let rule = limiter.rule("r").expect("rule");
    let (mut admitted, mut reserved) = (vec![0; 600], 0);
    for tick in 0..1_200 {
        if tick == 600 {
            reserved = limiter.stats().reserved_tokens;
            faults.set_store(StoreFault::Refusing);
        }
        let decision = rule.check("k", 1).await.expect("a decision");
        admitted[tick / 2] += u64::from(decision.allowed);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (admitted, reserved)
}

/// Every window of `admitted` (10 ms each) within `capacity + rate × (W + ttl)`.
fn assert_within_the_bound(admitted: &[u64]) {
    for from in 0..admitted.len() {
        let mut sum = 0;
        for (to, tokens) in admitted.iter().enumerate().skip(from) {
            sum += tokens;
            let window_ms = (to - from + 1) as u64 * 10;
            let bound = CAPACITY * 1_000 + RATE * (window_ms + 200);
            assert!(
                sum * 1_000 <= bound,
                "{sum} admitted in {window_ms} ms from {} ms",
                from * 10
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_local_key_sells_its_reserve_through_an_outage_paced_and_then_refuses() {
    let (local, reserved) = admitted(FailMode::Local, Some(Duration::from_secs(1))).await;
    let (closed, none_held) = admitted(FailMode::Closed, Some(Duration::from_secs(1))).await;
    assert_eq!(
        (reserved, none_held),
        (100, 0),
        "tokens held before the outage, local and closed"
    );
    for run in [&local, &closed] {
        assert_within_the_bound(run);
    }
    let outage = |run: &[u64], from_ms: usize, to_ms: usize| -> u64 { run[from_ms / 10..to_ms / 10].iter().sum() };
    // Closed: what the key had leased before, at most a batch.
    assert!(outage(&closed, 3_000, 6_000) <= MAX_BATCH, "{:?}", &closed[300..]);
    // Local: the reserve too, a process's share of the rate for a second (100 tokens, half the burst at most),
    // released over that second, then nothing.
    let sold = outage(&local, 3_000, 6_000);
    assert!((90..=100 + MAX_BATCH).contains(&sold), "{sold} sold in the outage");
    assert!(
        outage(&local, 3_000, 3_500) <= 50 + MAX_BATCH,
        "not paced: {:?}",
        &local[300..400]
    );
    assert_eq!(outage(&local, 4_100, 6_000), 0, "sold after the reserve ran out");
    // Zero: no reserve.
    let (none, _) = admitted(FailMode::Local, Some(Duration::ZERO)).await;
    assert!(outage(&none, 3_000, 6_000) <= MAX_BATCH);
}
