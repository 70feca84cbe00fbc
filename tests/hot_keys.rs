//! Only hot keys lease: a key is decided by one store call until it proves hot, leases while it is, and gives
//! its tokens back when it cools; on a saturated key the processes take turns. Paused time on the in-process
//! store: the sweeper, the lease deadlines and the store's refill move together and no test waits for real.

mod common;

use std::sync::Arc;
use std::time::Duration;

use tokenlease::{Clock, Lease, Limiter, MemoryStore, Rule, Source, TokioClock};

/// `capacity` tokens refilled at `rate` per second, leased 20 to 100 at a time for 200 ms; a key leases from
/// its 5th decision (a quarter of 20, by default).
fn rule(capacity: u64, rate: u64) -> Rule {
    Rule::token_bucket("sku", capacity, rate, Duration::from_secs(1))
        .and_then(|r| {
            r.with_lease(Lease {
                min_batch: 20,
                max_batch: 100,
                ttl: Duration::from_millis(200),
                hot_after: None,
                reserve: None,
            })
        })
        .expect("rule")
}

/// Limiters sharing one in-process store on tokio's (paused) clock, as processes share a Redis.
fn processes(n: u32, rule: &Rule) -> Vec<Limiter> {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
    let store = Arc::new(MemoryStore::with_clock(clock.clone()));
    (0..n)
        .map(|_| {
            Limiter::builder()
                .rule(rule.clone())
                .store(store.clone())
                .clock(clock.clone())
                .expected_processes(n)
                .build()
                .expect("limiter")
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_key_leases_once_hot_and_gives_its_tokens_back_when_it_cools() {
    let limiter = processes(1, &rule(1000, 100)).remove(0);
    for n in 1..=4 {
        let d = limiter.check("sku", "hot", 1).await.expect("check");
        assert_eq!(
            (d.allowed, d.source),
            (true, Source::Memory),
            "decision {n}: one store call"
        );
    }
    assert_eq!(limiter.local_keys(), 0);
    assert_eq!(limiter.stats().leased_tokens, 0);
    // The 5th decision proves it hot: it leases, and the next ones are decided in process.
    for _ in 0..10 {
        let d = limiter.check("sku", "hot", 1).await.expect("check");
        assert_eq!((d.allowed, d.source), (true, Source::Local));
    }
    let leased = limiter.stats().leased_tokens;
    assert!(leased >= 10, "{leased}");
    assert_eq!(limiter.local_keys(), 1);

    // A key decided once a second never leases.
    for _ in 0..5 {
        let d = limiter.check("sku", "cold", 1).await.expect("check");
        assert_eq!(d.source, Source::Memory);
        // virtual time (paused clock): a second between decisions, and the hot key's lease runs out meanwhile.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    // Meanwhile the hot key cooled: its bucket is gone and what it did not spend went back.
    assert_eq!(limiter.local_keys(), 0, "the cooled key stopped leasing");
    assert_eq!(limiter.stats().returned_tokens, leased - 10);
    limiter.shutdown().await;
}

/// Admitted tokens of `limiters` deciding `key` as fast as `tasks` tasks each can (one decision per ms per
/// task) for `span`; and the store calls they made.
async fn hammer(limiters: &[Limiter], tasks: u32, key: &str, span: Duration) -> (u64, u64) {
    let calls_before: u64 = limiters.iter().map(Limiter::store_calls).sum();
    let end = tokio::time::Instant::now() + span;
    let mut set = tokio::task::JoinSet::new();
    for limiter in limiters {
        for _ in 0..tasks {
            let (limiter, key) = (limiter.clone(), key.to_owned());
            set.spawn(async move {
                let mut admitted = 0;
                while tokio::time::Instant::now() < end {
                    let d = limiter.check("sku", &key, 1).await.expect("check");
                    admitted += u64::from(d.allowed);
                    // virtual time (paused clock): a decision per ms per task, without taking real time.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                admitted
            });
        }
    }
    let mut admitted = 0;
    while let Some(n) = set.join_next().await {
        admitted += n.expect("task");
    }
    let calls = limiters.iter().map(Limiter::store_calls).sum::<u64>() - calls_before;
    (admitted, calls)
}

#[tokio::test(start_paused = true)]
async fn a_key_that_turns_hot_under_saturation_still_reaches_its_bound() {
    // 4 processes × 8 tasks decide 32 000 times a second on a key refilled at 500 per second.
    let (capacity, rate) = (1000, 500);
    let limiters = processes(4, &rule(capacity, rate));
    let span = Duration::from_secs(5);
    let (admitted, calls) = hammer(&limiters, 8, "sale", span).await;
    // admitted ≤ capacity + rate × (W + lease TTL), and at least 95 % of it.
    let bound = capacity + rate * (span.as_millis() as u64 + 200) / 1000;
    assert!(admitted <= bound, "{admitted} admitted over the bound {bound}");
    assert!(
        admitted * 100 >= bound * 95,
        "{admitted} admitted: under 95 % of {bound}"
    );
    // The processes took turns rather than all asking whenever a batch could be there: about one call per
    // turn (three fifths of a 100-token batch), not one per process per batch.
    let per_token = calls as f64 / admitted as f64;
    assert!(per_token < 0.03, "{calls} store calls for {admitted} tokens");
    for l in &limiters {
        l.shutdown().await;
    }
}

/// Limiters built and dropped one after the other on one thread (invariant 20): each new limiter's first
/// decisions on a key come from its own store, never from a bucket a dropped limiter left in the thread's cache,
/// whose compiled rule a new one may reuse the address of. Both ways: a dead limiter's spent bucket must not
/// refuse a fresh store's tokens, and its unspent one must not admit tokens the new store never granted.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_dropped_limiters_bucket_never_answers_for_a_new_one() {
    let lease = Lease {
        min_batch: 1,
        max_batch: 3,
        ttl: Duration::from_secs(10),
        hot_after: Some(1),
        reserve: None,
    };
    let rule = || {
        Rule::token_bucket("r", 3, 1, Duration::from_secs(1))
            .and_then(|r| r.with_lease(lease))
            .expect("rule")
    };
    let build = |store: Arc<MemoryStore>| {
        Limiter::builder()
            .rule(rule())
            .store(store)
            .clock(Arc::new(TokioClock::new()))
            .build()
            .expect("limiter")
    };
    for round in 0..50 {
        // A fresh store: the first three calls are admitted, the fourth refused.
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
        let limiter = build(Arc::new(MemoryStore::with_clock(clock.clone())));
        let mut allowed = Vec::new();
        for _ in 0..4 {
            allowed.push(limiter.check("r", "sku:1", 1).await.expect("decision").allowed);
        }
        assert_eq!(
            allowed,
            [true, true, true, false],
            "round {round}: a fresh limiter on a fresh store"
        );
        drop(limiter);

        // A store whose bucket is empty (taken by acquire, which does not lease): the first decision leases
        // nothing and must be refused, whatever a dropped limiter's bucket held.
        let store = Arc::new(MemoryStore::with_clock(clock.clone()));
        let leaving = build(store.clone());
        for _ in 0..2 {
            // The second is answered through the thread's cache, which keeps the bucket.
            assert!(
                leaving.check("r", "sku:1", 1).await.expect("decision").allowed,
                "round {round}"
            );
        }
        drop(leaving); // its bucket of sku:1, with a leased token left, stays in this thread's cache
        let limiter = build(store);
        let _permit = limiter.acquire("r", "sku:1", 2).await.expect("the store's last tokens");
        let d = limiter.check("r", "sku:1", 1).await.expect("decision");
        assert!(
            !d.allowed,
            "round {round}: admitted a token the store never granted this limiter: {d:?}"
        );
        drop(limiter);
    }
}

/// One process, a leased bucket of 5 refilled 5 a second (batches 1 to 5, TTL 1 s, hot from the first
/// decision): 8 decisions at t = 0 admit the 5 the bucket holds; 2 s later it is full again, and 8 more admit
/// 5 again. A full bucket sells what it holds whatever the lease settings (issue "sell": it admitted 1 of 5, the
/// rest refused for 500 ms).
#[tokio::test(start_paused = true)]
async fn a_full_bucket_sells_what_it_holds_after_an_idle_gap() {
    let rule = Rule::token_bucket("sku", 5, 5, Duration::from_secs(1))
        .and_then(|r| {
            r.with_lease(Lease {
                min_batch: 1,
                max_batch: 5,
                ttl: Duration::from_secs(1),
                hot_after: Some(1),
                reserve: None,
            })
        })
        .expect("rule");
    let limiter = processes(1, &rule).remove(0);
    for round in 0..2 {
        // One after the other, then at once (callers waiting on one lease).
        let mut admitted = 0;
        for _ in 0..8 {
            if limiter.check("sku", "k", 1).await.expect("check").allowed {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 5, "round {round}, one after the other: a full bucket of 5");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let checks: Vec<_> = (0..8)
            .map(|_| {
                let limiter = limiter.clone();
                tokio::spawn(async move { limiter.check("sku", "k", 1).await })
            })
            .collect();
        let mut admitted = 0;
        for check in checks {
            if check.await.expect("task").expect("check").allowed {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 5, "round {round}, at once: a full bucket of 5");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
