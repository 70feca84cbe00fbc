//! `MemoryStore::with_latency`: every call takes the round trip on tokio's clock (paused here, so no test waits
//! for real), and runs halfway through it.

use std::sync::Arc;
use std::time::Duration;

use crate::algorithm::TokenBucket;
use crate::clock::{Clock, TokioClock};
use crate::store::{Call, MemoryStore, Store};

/// 10 tokens, refilled at 1 per ms.
const BUCKET: TokenBucket = TokenBucket {
    capacity: 10,
    rate: 1,
    per_ms: 1,
};

#[tokio::test(start_paused = true)]
async fn a_call_takes_the_round_trip_and_runs_halfway_through_it() {
    let rtt = Duration::from_millis(4);
    let store = MemoryStore::with_clock(Arc::new(TokioClock::new())).with_latency(rtt);
    assert_eq!(store.latency(), rtt);
    let start = tokio::time::Instant::now();
    let reply = store.run(&Call::take("k", BUCKET, 10, 10)).await.expect("take");
    assert_eq!(reply.granted, 10);
    assert_eq!(start.elapsed(), rtt, "one call, one round trip");

    // The bucket was emptied 2 ms after the first call started; the next call reads it 2 ms after it starts,
    // 4 ms after it was emptied: 4 tokens have come back, at 1 per ms.
    let start = tokio::time::Instant::now();
    let reply = store.run(&Call::take("k", BUCKET, 1, 10)).await.expect("take");
    assert_eq!(start.elapsed(), rtt);
    assert_eq!(
        reply.granted, 4,
        "the call ran halfway through its round trip: {reply:?}"
    );

    let start = tokio::time::Instant::now();
    store.ping().await.expect("ping");
    assert_eq!(start.elapsed(), rtt, "a ping is a round trip too");
}

#[tokio::test(start_paused = true)]
async fn a_round_trip_under_two_milliseconds_runs_the_call_as_it_is_sent() {
    // Tokio's timer counts whole ms: two half-ms waits would take 2 ms. The call runs at once and the reply waits.
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
    for (rtt, takes) in [(1_000, 1), (1_500, 2), (500, 1), (3_000, 3)] {
        let store = MemoryStore::with_clock(clock.clone()).with_latency(Duration::from_micros(rtt));
        let start = tokio::time::Instant::now();
        let reply = store.run(&Call::take("k", BUCKET, 1, 10)).await.expect("take");
        assert_eq!(reply.granted, 10);
        assert_eq!(start.elapsed(), Duration::from_millis(takes), "rtt {rtt} µs");
    }
}

#[tokio::test(start_paused = true)]
async fn without_a_latency_a_call_answers_at_once() {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
    let store = MemoryStore::with_clock(clock);
    assert_eq!(store.latency(), Duration::ZERO);
    let start = tokio::time::Instant::now();
    let reply = store.run(&Call::take("k", BUCKET, 1, 10)).await.expect("take");
    assert_eq!(reply.granted, 10);
    assert_eq!(start.elapsed(), Duration::ZERO);
}
