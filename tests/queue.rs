//! The queues through the public API: waits under tokio's paused clock, and pacing shared by several limiters
//! on a real Redis. The exact schedules replayed on both stores run inside the crate
//! (`src/store/tests/queue.rs`).

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokenlease::{Error, Limiter, Rule};

#[tokio::test(start_paused = true)]
async fn token_bucket_acquire_consumes_now_and_pays_later() {
    let rule = Rule::token_bucket("api", 3, 5, Duration::from_secs(1)).expect("rule"); // 5 per second, burst 3
    let limiter = common::limiter([rule]).tokio_clock().build();
    let mut waits = Vec::new();
    for _ in 0..7 {
        waits.push(limiter.acquire("api", "k", 1).await.expect("permit").waited.as_millis());
    }
    // A new key starts full: the 3 stored and one more go at once (the last into debt), then every caller
    // pays 0.2 s for the one before it.
    assert_eq!(waits, [0, 0, 0, 0, 200, 200, 200]);
    // After idling, the stored burst is spent before waits start again.
    // virtual time (paused clock): 5 s of idling (the burst refills) pass without a real wait.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut waits = Vec::new();
    for _ in 0..6 {
        waits.push(limiter.acquire("api", "k", 1).await.expect("permit").waited.as_millis());
    }
    assert_eq!(waits, [0, 0, 0, 0, 200, 200]);
    // A large acquire is granted at once when not in debt, and the next caller pays for it.
    // virtual time (paused clock): 5 s of idling (the burst refills) pass without a real wait.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        limiter.acquire("api", "k", 3).await.expect("permit").waited,
        Duration::ZERO
    );
    assert_eq!(
        limiter.acquire("api", "k", 3).await.expect("permit").waited,
        Duration::ZERO
    );
    assert_eq!(
        limiter.acquire("api", "k", 1).await.expect("permit").waited,
        Duration::from_millis(600)
    );
}

/// A queue of `rate` jobs per second on the in-process store and tokio's (paused) clock.
fn jobs(rate: u64, max_wait: Duration) -> Limiter {
    let rule = Rule::leaky_bucket("jobs", rate, Duration::from_secs(1), max_wait).expect("rule");
    common::limiter([rule]).tokio_clock().build()
}

#[tokio::test(start_paused = true)]
async fn grants_are_spaced_exactly_and_served_first_in_first_out() {
    let limiter = jobs(5, Duration::from_secs(10));
    let start = tokio::time::Instant::now();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..6 {
        let (l, order) = (limiter.clone(), order.clone());
        tasks.push(tokio::spawn(async move {
            let permit = l.acquire("jobs", "tenant:7", 1).await.expect("permit");
            order.lock().expect("lock").push((i, start.elapsed(), permit.waited));
        }));
        tokio::task::yield_now().await; // spawn order = arrival order
    }
    for t in tasks {
        t.await.expect("task");
    }
    let order = order.lock().expect("lock").clone();
    let ids: Vec<_> = order.iter().map(|(i, ..)| *i).collect();
    assert_eq!(ids, [0, 1, 2, 3, 4, 5], "first in, first out");
    for (n, (_, at, _)) in order.iter().enumerate() {
        assert_eq!(*at, Duration::from_millis(200 * n as u64), "job {n} at {at:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_wait_beyond_max_wait_is_refused_at_once() {
    let limiter = jobs(2, Duration::from_secs(1)); // 500 ms apart, 1 s of queue
    assert!(
        limiter.try_acquire("jobs", "k", 1).await.expect("try").is_some(),
        "a free slot now"
    );
    assert!(
        limiter.try_acquire("jobs", "k", 1).await.expect("try").is_none(),
        "try never waits"
    );
    let spawn = |l: &Limiter| {
        let l = l.clone();
        tokio::spawn(async move { l.acquire("jobs", "k", 1).await })
    };
    let (p1, p2) = (spawn(&limiter), spawn(&limiter));
    tokio::task::yield_now().await;
    tokio::task::yield_now().await;
    // Slots are reserved up to 1 s ahead: the next would wait 1.5 s: refused at once, retry in 0.5 s.
    let started = tokio::time::Instant::now();
    match limiter.acquire("jobs", "k", 1).await {
        Err(Error::QueueFull {
            retry_after, max_wait, ..
        }) => {
            assert_eq!(
                (retry_after, max_wait),
                (Duration::from_millis(500), Duration::from_secs(1))
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(started.elapsed(), Duration::ZERO, "refused without waiting");
    assert!(
        matches!(limiter.check("jobs", "k", 1).await, Ok(d) if !d.allowed),
        "check never waits"
    );
    assert_eq!(
        p1.await.expect("task").expect("permit").waited,
        Duration::from_millis(500)
    );
    assert_eq!(p2.await.expect("task").expect("permit").waited, Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn a_dropped_acquire_gives_its_place_and_its_slot_back() {
    let limiter = jobs(1, Duration::from_secs(60)); // 1 per second
    assert_eq!(
        limiter.acquire("jobs", "k", 1).await.expect("first").waited,
        Duration::ZERO
    );
    // The second reserves the slot at 1 s and is dropped while waiting for it.
    let waiting = limiter.acquire("jobs", "k", 1);
    assert!(tokio::time::timeout(Duration::from_millis(300), waiting).await.is_err());
    tokio::task::yield_now().await; // the hand-back runs
                                    // The slot at 1 s is free again: the next caller gets it instead of the one at 2 s.
    let third = limiter.acquire("jobs", "k", 1).await.expect("third");
    assert_eq!(third.waited, Duration::from_millis(700));
}

/// Callers queued together who all give up (the sidecar's clients hanging up): the store keeps their slots,
/// since moving one would move everyone behind it, but this process's next callers take them over, earliest
/// first, instead of queueing behind all of them.
#[tokio::test(start_paused = true)]
async fn slots_given_up_while_others_queue_behind_are_taken_over_by_the_next_callers() {
    let limiter = jobs(10, Duration::from_secs(60)); // 100 ms apart
    assert_eq!(
        limiter.acquire("jobs", "k", 1).await.expect("first").waited,
        Duration::ZERO
    );
    // 20 callers reserve the slots at 100 ms .. 2 s, then hang up together.
    let quitters: Vec<_> = (0..20)
        .map(|_| {
            let l = limiter.clone();
            tokio::spawn(async move { l.acquire("jobs", "k", 1).await })
        })
        .collect();
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    for q in &quitters {
        q.abort();
    }
    for _ in 0..50 {
        tokio::task::yield_now().await; // the hand-backs run: only the last slot (2 s) goes back to the store
    }
    // An honest caller waits for the first slot given up (100 ms), not behind the 19 kept (2 s).
    let honest = limiter.acquire("jobs", "k", 1).await.expect("honest");
    assert_eq!(honest.waited, Duration::from_millis(100));
    // And the next ones take the following slots, in order, while they last.
    let next = limiter.acquire("jobs", "k", 1).await.expect("next");
    assert_eq!(next.waited, Duration::from_millis(100), "the slot at 200 ms");
    // No slot is used twice: 18 slots kept and one handed back; 20 callers are paced at 100 ms apart.
    let started = tokio::time::Instant::now();
    for _ in 0..20 {
        let _permit = limiter.acquire("jobs", "k", 1).await.expect("paced");
    }
    assert_eq!(started.elapsed(), Duration::from_millis(2000));
}

#[tokio::test]
async fn acquire_needs_a_queue_or_bucket_rule_and_bad_input_is_an_error() {
    let limiter = Limiter::builder()
        .rule(Rule::token_bucket("tb", 10, 1, Duration::from_secs(1)).expect("rule"))
        .rule(Rule::leaky_bucket("jobs", 10, Duration::from_secs(1), Duration::from_secs(1)).expect("rule"))
        .build()
        .expect("limiter");
    assert!(
        limiter.acquire("tb", "k", 1).await.is_ok(),
        "token buckets acquire too (debt semantics)"
    );
    let window = Limiter::builder()
        .rule(Rule::sliding_log("w", 1, Duration::from_secs(1)).expect("rule"))
        .build();
    let window = window.expect("limiter");
    assert!(matches!(
        window.acquire("w", "k", 1).await,
        Err(Error::InvalidArgument { name: "rule", .. })
    ));
    assert!(matches!(
        limiter.acquire("nope", "k", 1).await,
        Err(Error::UnknownRule(_))
    ));
    assert!(matches!(
        limiter.acquire("jobs", "", 1).await,
        Err(Error::InvalidArgument { name: "key", .. })
    ));
    assert!(matches!(
        limiter.acquire("jobs", "k", 11).await,
        Err(Error::CostAboveCapacity { .. })
    ));
    assert!(matches!(
        Rule::leaky_bucket("x", 0, Duration::from_secs(1), Duration::ZERO),
        Err(Error::InvalidArgument { name: "rate", .. })
    ));
}

/// Three limiters (as three processes would) share one schedule on Redis: 3 × 8 jobs at 20 per second take
/// about 23 × 50 ms in all, not a third of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limiters_pace_together_on_redis() {
    let server = common::RedisServer::start();
    let rule = Rule::leaky_bucket("jobs", 20, Duration::from_secs(1), Duration::from_secs(10)).expect("rule");
    let limiters: Vec<Limiter> = (0..3)
        .map(|_| common::limiter([rule.clone()]).redis(&server).build())
        .collect();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for l in &limiters {
        let l = l.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..8 {
                let _permit = l.acquire("jobs", "tenant:1", 1).await.expect("permit");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    let took = started.elapsed();
    // 24 slots 50 ms apart: the last starts at 1.15 s. Tolerance for a loaded 2-core machine.
    assert!(took >= Duration::from_millis(1_100), "too fast: {took:?}");
    assert!(took <= Duration::from_millis(2_500), "too slow: {took:?}");
}

/// A slot handed back whose answer is lost (the store took it back, the reply never came) is not taken over by
/// this process's next caller: another process may book it, and the queue would release two jobs in its one
/// slot. Issue "escrow", item 3 (a path the seeded search's table named).
#[tokio::test(start_paused = true)]
async fn a_slot_handed_back_without_an_answer_is_not_used_again_here() {
    let clock: Arc<dyn tokenlease::Clock> = Arc::new(tokenlease::TokioClock::new());
    let timeout = Duration::from_millis(50);
    let faults = tokenlease::Faults::new(clock.clone(), Duration::from_millis(1), timeout);
    let process = |i: usize| {
        let rule = Rule::leaky_bucket("jobs", 10, Duration::from_secs(1), Duration::from_secs(60)).expect("rule");
        Limiter::builder()
            .rules([rule])
            .store(faults.link(i))
            .clock(clock.clone())
            .timeout(timeout)
            .build()
            .expect("limiter")
    };
    let (here, there) = (process(0), process(1));
    assert_eq!(
        here.acquire("jobs", "k", 1).await.expect("first").waited,
        Duration::ZERO
    );
    // A caller books the next slot (100 ms after the first) and hangs up while the store loses its replies: the
    // hand-back runs in the store (the slot was the last booked), its answer never comes.
    let quitter = {
        let here = here.clone();
        tokio::spawn(async move { here.acquire("jobs", "k", 1).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    faults.set_store(tokenlease::StoreFault::LosingReplies);
    quitter.abort();
    tokio::time::sleep(Duration::from_millis(60)).await;
    faults.set_store(tokenlease::StoreFault::Healthy);
    // Both processes ask before that slot comes: the other books the slot the store took back (100 ms after the
    // first), this one books a slot of its own behind it, not the one given back.
    let release = |l: Limiter| {
        tokio::spawn(async move {
            let _permit = l.acquire("jobs", "k", 1).await.expect("permit");
            tokio::time::Instant::now()
        })
    };
    let (there_at, here_at) = (release(there.clone()), release(here.clone()));
    let (there_at, here_at) = (there_at.await.expect("there"), here_at.await.expect("here"));
    let apart = there_at.max(here_at) - there_at.min(here_at);
    assert!(
        apart >= Duration::from_millis(100),
        "one slot released twice: {apart:?} apart"
    );
}
