//! Redis stopped: each fail_mode does what it says, within the timeout, and the limiter recovers by itself.

mod common;

use std::time::{Duration, Instant};

use tokenlease::{FailMode, Lease, Limiter, Rule, Source};

const TIMEOUT: Duration = Duration::from_millis(100);

/// The rules of these tests, one per fail mode.
fn rules() -> [Rule; 5] {
    let rule = |name: &str, mode: FailMode| {
        Rule::token_bucket(name, 8, 1, Duration::from_secs(3600))
            .expect("rule")
            .with_fail_mode(mode)
    };
    // 100 tokens, leased 1 to 10 at a time.
    let leased = |name: &str, mode: FailMode| {
        let lease = Lease {
            min_batch: 1,
            max_batch: 10,
            ttl: Duration::from_secs(60),
            hot_after: Some(1),
        };
        Rule::token_bucket(name, 100, 1, Duration::from_secs(3600))
            .and_then(|r| r.with_lease(lease))
            .expect("rule")
            .with_fail_mode(mode)
    };
    [
        rule("open", FailMode::Open),
        rule("closed", FailMode::Closed),
        rule("local", FailMode::Local),
        leased("leased_closed", FailMode::Closed),
        leased("leased_local", FailMode::Local),
    ]
}

/// [`rules`] on `server`, calls timing out after [`TIMEOUT`], as one of 4 processes.
fn on_redis(server: &common::RedisServer) -> Limiter {
    common::limiter(rules())
        .redis(server)
        .timeout(TIMEOUT)
        .expected_processes(4)
        .build()
}

/// [`on_redis`] and three more processes that joined every rule's fleet (a call each on a key of their own): the
/// rules' rosters count four, so the local shares are quarters. Keep the three alive while the test runs.
async fn one_of_four(server: &common::RedisServer) -> (Limiter, Vec<Limiter>) {
    let others: Vec<Limiter> = (0..3).map(|_| on_redis(server)).collect();
    for other in &others {
        for rule in rules() {
            let _ = timed(other, &rule.name, "joins").await;
        }
    }
    let l = on_redis(server);
    for rule in rules() {
        let _ = timed(&l, &rule.name, "joins").await;
        assert_eq!(l.processes(&rule.name), 4, "{}", rule.name);
    }
    (l, others)
}

/// Runs a check and asserts it answered within a bound that holds on a loaded machine.
async fn timed(l: &Limiter, rule: &str, key: &str) -> tokenlease::Decision {
    let started = Instant::now();
    let d = l
        .check(rule, key, 1)
        .await
        .expect("a store failure is a decision, not an error");
    let took = started.elapsed();
    assert!(took < TIMEOUT * 5, "{rule}: {took:?}");
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_fail_mode_does_what_it_says_and_recovers() {
    let mut server = common::RedisServer::start();
    let (l, _others) = one_of_four(&server).await;
    for rule in ["open", "closed", "local"] {
        let d = timed(&l, rule, "before").await;
        assert!(d.allowed && d.source == Source::Redis, "{rule}: {d:?}");
    }
    // The local share starts from this process's part of the last level Redis reported for the key.
    let d = timed(&l, "local", "u").await;
    assert!(d.allowed && d.remaining == 7, "{d:?}");
    assert_eq!(timed(&l, "leased_closed", "k").await.source, Source::Local);

    server.stop();
    for _ in 0..20 {
        let d = timed(&l, "open", "u").await;
        assert!(d.allowed && d.source == Source::Fallback, "open: {d:?}");
        let d = timed(&l, "closed", "u").await;
        assert!(!d.allowed && d.source == Source::Fallback, "closed: {d:?}");
    }
    // local: this process alone enforces its share of the 7 tokens Redis last reported, 7 / 4 expected
    // processes = 1.75 tokens: 1 whole token (the refill, 1 per hour, adds nothing meanwhile).
    let mut allowed = 0;
    for _ in 0..20 {
        let d = timed(&l, "local", "u").await;
        assert_eq!(d.source, Source::Fallback);
        allowed += u32::from(d.allowed);
    }
    assert_eq!(allowed, 1, "a quarter of the 7 tokens left");
    // A key Redis never reported to this process starts empty: what the others took is unknown.
    let d = timed(&l, "local", "never-seen").await;
    assert!(!d.allowed && d.source == Source::Fallback, "{d:?}");
    // A leased key spends what it already holds, then refuses (closed) once a lease fails.
    let mut leased_allowed = 0;
    for _ in 0..50 {
        leased_allowed += u32::from(timed(&l, "leased_closed", "k").await.allowed);
    }
    assert!(leased_allowed < 10, "only the tokens already leased: {leased_allowed}");
    // A stopped server refuses connections: store errors (or a reconnection that outlasts the timeout), then
    // the open breaker; every decision made by fail_mode is counted with its reason.
    let stats = l.stats();
    let counted = stats.fail_mode_errors + stats.fail_mode_timeouts + stats.fail_mode_circuit_open;
    assert!(
        stats.fail_mode_errors > 0 && stats.fail_mode_circuit_open > 0,
        "{stats:?}"
    );
    assert!(counted >= 61 + (50 - u64::from(leased_allowed)), "{stats:?}");

    server.restart();
    // Recovers by itself: the connection manager reconnects; the fallback back-off is 100 ms.
    // real time: waits for the restarted redis-server (here and below).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut sources = Vec::new();
    while Instant::now() < deadline {
        let d = timed(&l, "closed", "after").await;
        sources.push(d.source);
        if d.source == Source::Redis {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await; // real time: the restarted redis-server
    }
    assert_eq!(sources.last(), Some(&Source::Redis), "never recovered: {sources:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let d = timed(&l, "leased_closed", "k2").await;
        if d.allowed {
            assert_eq!(d.source, Source::Local);
            break;
        }
        assert!(Instant::now() < deadline, "the leased rule never recovered");
        tokio::time::sleep(Duration::from_millis(50)).await; // real time: the restarted redis-server
    }
    l.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_builds_while_redis_is_down() {
    let mut server = common::RedisServer::start();
    server.stop();
    let l = on_redis(&server);
    let d = timed(&l, "closed", "x").await;
    assert!(!d.allowed && d.source == Source::Fallback);
    server.restart();
    // real time: waits for the restarted redis-server.
    let deadline = Instant::now() + Duration::from_secs(10);
    while timed(&l, "closed", "x").await.source != Source::Redis {
        assert!(Instant::now() < deadline, "never connected");
        tokio::time::sleep(Duration::from_millis(50)).await; // real time: the restarted redis-server
    }
}

/// Checks `rule` on `key` until the key's hold after its charge is over (a decision by Redis, or allowed);
/// whether that decision allowed.
async fn past_the_hold(l: &Limiter, rule: &str, key: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let d = timed(l, rule, key).await;
        if d.allowed || (d.source == Source::Redis && !held_by_redis(&d)) {
            return d.allowed;
        }
        assert!(Instant::now() < deadline, "{rule}: still held after 10 s: {d:?}");
        // real time: the hold (here, then in Redis) is the limiter's recovery spread.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The recovery spread at [`TIMEOUT`]: the breaker's 500 ms open period and a 100 ms back-off. A charge holds
/// the bucket in Redis this long.
const SPREAD: Duration = Duration::from_millis(600);

/// Whether `d` is the refusal of a bucket held after a charge, for the rest of the spread: by Redis, or by this
/// process remembering Redis's refusal until its retry_after (the rules' own refusals wait for a refill of an
/// hour).
fn held_by_redis(d: &tokenlease::Decision) -> bool {
    !d.allowed && matches!(d.source, Source::Redis | Source::Local) && d.retry_after <= SPREAD
}

/// Allowed decisions of `rule` on `key` until `calls` calls were made by `source` (the refusals of a bucket held
/// after a charge are waited out, not counted).
async fn admitted_by(l: &Limiter, rule: &str, key: &str, source: Source, calls: usize) -> u32 {
    let mut allowed = 0;
    let mut made = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while made < calls {
        let d = timed(l, rule, key).await;
        if held_by_redis(&d) {
            assert!(Instant::now() < deadline, "{rule}: held for 10 s");
            // real time: the bucket's hold runs out in Redis.
            tokio::time::sleep(Duration::from_millis(20)).await;
        } else if d.source == source || (source == Source::Redis && d.source == Source::Local) {
            made += 1;
            allowed += u32::from(d.allowed);
        } else {
            assert!(
                Instant::now() < deadline,
                "{rule}: no decision by {source:?} within 10 s"
            );
            // real time: waits for redis-server to stop or come back.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    allowed
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_mode_returns_to_the_shared_limits_without_a_burst() {
    let mut server = common::RedisServer::start();
    let (l, _others) = one_of_four(&server).await;
    // Redis reports the keys' levels: 8 − 1 = 7 left, and 100 − the first lease.
    assert_eq!(admitted_by(&l, "local", "k", Source::Redis, 1).await, 1);
    // The tokens leased for "k" alone (joining leased a batch of another key).
    let before = l.stats().leased_tokens;
    assert_eq!(admitted_by(&l, "leased_local", "k", Source::Redis, 1).await, 1);
    let leased = l.stats().leased_tokens - before;
    assert!((1..=10).contains(&leased), "{leased}");
    server.stop();
    // Alone, the process admits its share of what Redis last reported: 7 / 4 processes = 1.75, so 1; and a
    // quarter of what the lease left for the leased rule (after spending the leased tokens, source Local).
    assert_eq!(admitted_by(&l, "local", "k", Source::Fallback, 10).await, 1);
    let share = u32::try_from((100 - leased) / 4).expect("small");
    assert_eq!(admitted_by(&l, "leased_local", "k", Source::Fallback, 40).await, share);

    // Redis is back, without the keys (no persistence: its buckets are full, as they would be after a long
    // partition). What the process admitted alone is charged before anything else is decided, so the shared
    // limit is not a second burst: 8 − 1 and 100 − the share more, not another 8 and 100. The refill (1 per
    // hour) adds nothing in between.
    server.restart();
    // Each key is charged first, then held while other processes would come back and charge theirs.
    let first = past_the_hold(&l, "local", "k").await;
    assert_eq!(
        u32::from(first) + admitted_by(&l, "local", "k", Source::Redis, 11).await,
        7
    );
    // Leased: under a batch (10) may stay in Redis, since a saturated key waits for a whole batch.
    let first = past_the_hold(&l, "leased_local", "k").await;
    let after = u32::from(first) + admitted_by(&l, "leased_local", "k", Source::Redis, 119).await;
    assert!(
        (90 - share..=100 - share).contains(&after),
        "admitted {after} after the outage"
    );
    l.shutdown().await;
}

/// A process that stops right after an outage charges what it admitted alone on its way out: the next process
/// does not get a second burst.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_charges_what_local_mode_admitted_alone() {
    let mut server = common::RedisServer::start();
    let (l, _others) = one_of_four(&server).await;
    assert_eq!(admitted_by(&l, "local", "k", Source::Redis, 1).await, 1);
    server.stop();
    assert_eq!(admitted_by(&l, "local", "k", Source::Fallback, 10).await, 1);
    server.restart();
    // Redis answers again, but no call told this limiter: its breaker is still open. The shutdown charges
    // past it.
    assert!(l.circuit_open());
    l.shutdown().await;

    let next = on_redis(&server);
    assert_eq!(
        admitted_by(&next, "local", "k", Source::Redis, 12).await,
        7,
        "8 (Redis lost the key) − the 1 admitted alone"
    );
    next.shutdown().await;
}

/// After an outage the processes come back one by one (each breaker half-opens on its own clock). The first one
/// back charges what it sold alone, then holds the key for a while, so that it does not sell what the others
/// sold alone before their charges land: a stock of 20, each of two processes having sold its share alone,
/// sells what is left after both charges, not the first process's part again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_process_back_holds_the_key_until_the_others_have_charged() {
    let mut server = common::RedisServer::start();
    let rule = || {
        Rule::token_bucket("stock", 20, 1, Duration::from_secs(3600))
            .expect("rule")
            .with_fail_mode(FailMode::Local)
    };
    let process = || {
        common::limiter([rule()])
            .redis(&server)
            .timeout(TIMEOUT)
            .expected_processes(2)
            .build()
    };
    let (a, b) = (process(), process());
    // Redis reports 19 left to a, 18 to b: shares of 9 each, once both count the fleet of two.
    assert_eq!(admitted_by(&a, "stock", "k", Source::Redis, 1).await, 1);
    assert_eq!(admitted_by(&b, "stock", "k", Source::Redis, 1).await, 1);
    let deadline = Instant::now() + Duration::from_secs(5);
    while a.processes("stock") != 2 || b.processes("stock") != 2 {
        assert!(Instant::now() < deadline, "the fleet of two is never counted");
        // real time: a counts b at its next beat, within a second.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.stop();
    assert_eq!(admitted_by(&a, "stock", "k", Source::Fallback, 15).await, 9);
    assert_eq!(admitted_by(&b, "stock", "k", Source::Fallback, 15).await, 9);
    // Redis is back without the key (full again: one capacity is lost with it, as documented).
    server.restart();
    // b is first: it charges its 9, then holds the key; its next calls are refused locally, and so a's.
    let mut held = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while held < 5 {
        let d = timed(&b, "stock", "k").await;
        assert!(!d.allowed, "b sold before a charged: {d:?}");
        held += u32::from(d.source == Source::Local);
        assert!(Instant::now() < deadline, "b never charged");
        // real time: b reconnects to the restarted redis-server and charges its debt there.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // a charges its 9 too; once both holds are over, 20 − 9 − 9 = 2 are left to sell, in all.
    let mut sold = 0;
    let deadline = Instant::now() + Duration::from_secs(6);
    while Instant::now() < deadline {
        for p in [&a, &b] {
            sold += u32::from(timed(p, "stock", "k").await.allowed);
        }
        // real time: a's charge reaches redis-server and both holds run out while the two call it.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(sold, 2, "what is left after both charges");
    a.shutdown().await;
    b.shutdown().await;
}

/// A charge holds the bucket itself, in Redis, for the recovery spread: every process's takes are refused until
/// the others that sold alone could have charged too, even a process that owed nothing and does not honour the
/// fleet's hold (here one whose rule fails `closed`: it is no member; after a blip shorter than the fleet's
/// `silent_ms` there is no fleet hold at all). Before, such a process leased at once what the others had sold
/// alone and not charged yet (invariant 19).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_holds_the_bucket_for_every_process_until_the_others_could_charge() {
    let mut server = common::RedisServer::start();
    let stock = |mode: FailMode| {
        Rule::token_bucket("stock", 20, 1, Duration::from_secs(3600))
            .expect("rule")
            .with_fail_mode(mode)
    };
    let seller = common::limiter([stock(FailMode::Local)])
        .redis(&server)
        .timeout(TIMEOUT)
        .build();
    let other = common::limiter([stock(FailMode::Closed)])
        .redis(&server)
        .timeout(TIMEOUT)
        .build();
    assert_eq!(admitted_by(&seller, "stock", "k", Source::Redis, 1).await, 1);
    server.stop();
    let mut alone = u64::from(admitted_by(&seller, "stock", "k", Source::Fallback, 5).await);
    assert!(alone > 0, "the seller sold alone");
    // Redis is back without the key (full again); the seller's next calls charge what it sold alone.
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let d = timed(&seller, "stock", "k").await;
        if d.source == Source::Local {
            break; // charged: held locally
        }
        // Its breaker still open, it sells alone on.
        alone += u64::from(d.allowed && d.source == Source::Fallback);
        assert!(Instant::now() < deadline, "the seller never charged: {d:?}");
        // real time: the seller reconnects to the restarted redis-server and charges there.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let charged = Instant::now();
    let d = timed(&other, "stock", "k").await;
    assert!(held_by_redis(&d), "refused by the held bucket: {d:?}");
    let mut sold = 0;
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let d = timed(&other, "stock", "k").await;
        if d.allowed {
            assert!(
                charged.elapsed() >= SPREAD - Duration::from_millis(100),
                "sold within the hold"
            );
            sold += 1;
        }
        // real time: the hold runs out in Redis.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The hold the refusal met may be the fleet's, set when the seller saw the outage end, with the seller's
    // charge landing a moment later (1 run in 3 to 5 on a 2-core machine): the refusal then reads the bucket
    // before the charge (19 left), after it otherwise (Redis lost the key: full again, less what was sold alone).
    assert!(d.remaining >= 20 - alone, "{d:?}, {alone} sold alone");
    assert_eq!(
        sold,
        20 - alone,
        "once the hold is over, what is left after the charge, none of what was sold alone"
    );
    seller.shutdown().await;
    other.shutdown().await;
}
