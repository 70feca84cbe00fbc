//! Hot reload: new rules swap in atomically; unchanged rules keep their leases; changed limits apply to existing
//! keys; removed rules answer UnknownRule; a bad reload changes nothing.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokenlease::{Config, Error, FakeClock, Limiter, Rule};

const BEFORE: &str = r#"
[[rule]]
name = "post"
algorithm = "fixed_window"
limit = 2
window = "1h"

[[rule]]
name = "sku"
algorithm = "token_bucket"
capacity = 100
rate = 1
per = "1h"
lease = { min_batch = 10, max_batch = 10, ttl = "1h", hot_after = 1 }

[[rule]]
name = "gone"
algorithm = "sliding_log"
limit = 1
window = "1s"
"#;

async fn allowed(l: &Limiter, rule: &str, key: &str, n: usize) -> usize {
    let mut a = 0;
    for _ in 0..n {
        a += usize::from(l.check(rule, key, 1).await.expect("check").allowed);
    }
    a
}

/// Paused time: the wait for the give-back (a background task) takes no real time. The limiter's own clock is
/// the real one (`from_config` takes none), which no step here depends on: the windows and the TTL are 1 h.
#[tokio::test(start_paused = true)]
async fn reload_swaps_rules_and_keeps_what_did_not_change() {
    let limiter = Limiter::from_config(Config::from_toml(BEFORE).expect("config")).expect("limiter");
    assert_eq!(allowed(&limiter, "post", "u1", 5).await, 2);
    assert_eq!(allowed(&limiter, "sku", "s1", 1).await, 1); // leases a batch of 10
    assert_eq!(limiter.local_keys(), 1);

    // post: 2 → 5 per hour; sku unchanged; gone removed; new added.
    let after = BEFORE.replace("limit = 2", "limit = 5").replace(
        "[[rule]]\nname = \"gone\"\nalgorithm = \"sliding_log\"\nlimit = 1\nwindow = \"1s\"\n",
        "[[rule]]\nname = \"new\"\nalgorithm = \"sliding_log\"\nlimit = 1\nwindow = \"1s\"\n",
    );
    limiter
        .reload(Config::from_toml(&after).expect("config"))
        .expect("reload");
    // The existing key keeps its count (2 used) under the new limit: 3 more.
    assert_eq!(allowed(&limiter, "post", "u1", 5).await, 3);
    assert_eq!(
        limiter.local_keys(),
        1,
        "the unchanged leased rule kept its local bucket"
    );
    assert_eq!(limiter.stats().returned_tokens, 0);
    assert!(matches!(
        limiter.check("gone", "u1", 1).await,
        Err(Error::UnknownRule(_))
    ));
    assert_eq!(allowed(&limiter, "new", "u1", 2).await, 1);

    // Changing the leased rule gives its leased tokens back (9 unused of the batch).
    let changed = after.replace("capacity = 100", "capacity = 200");
    limiter
        .reload(Config::from_toml(&changed).expect("config"))
        .expect("reload");
    assert_eq!(limiter.local_keys(), 0);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while limiter.stats().returned_tokens < 9 && tokio::time::Instant::now() < deadline {
        // virtual time (paused clock): waits for the background give-back, taking no real time.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(limiter.stats().returned_tokens, 9);
    limiter.shutdown().await;
}

#[tokio::test]
async fn a_bad_reload_changes_nothing() {
    let limiter = Limiter::from_config(Config::from_toml(BEFORE).expect("config")).expect("limiter");
    // A file that does not parse never reaches the limiter.
    assert!(Config::from_toml(&BEFORE.replace("limit = 2", "limit = 0")).is_err());
    // Duplicate names, or a store change, are refused.
    let mut dup = Config::from_toml(BEFORE).expect("config");
    dup.rules.push(dup.rules[0].clone());
    assert!(matches!(
        limiter.reload(dup),
        Err(Error::InvalidArgument { name: "rule", .. })
    ));
    let with_redis = format!("[redis]\nurl = \"redis://127.0.0.1:1\"\n{BEFORE}");
    let err = limiter.reload(Config::from_toml(&with_redis).expect("config"));
    assert!(matches!(err, Err(Error::InvalidArgument { name: "redis", .. })));
    // The old rules are still in force.
    assert_eq!(allowed(&limiter, "post", "u", 3).await, 2);
    assert_eq!(allowed(&limiter, "gone", "u", 2).await, 1);
}

/// Calls in flight during reloads never fail: 4 tasks check a rule present in every version while it is
/// reloaded with changing limits, at least 200 times and until every task has made calls during the reloads
/// (on a loaded machine a task may start late).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloads_do_not_disturb_calls_in_flight() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let limiter = Limiter::from_config(Config::from_toml(BEFORE).expect("config")).expect("limiter");
    let stop = Arc::new(AtomicBool::new(false));
    let calls: Arc<[AtomicU64; 4]> = Arc::new(Default::default());
    let tasks: Vec<_> = (0..4)
        .map(|t| {
            let (l, stop, calls) = (limiter.clone(), stop.clone(), calls.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let _decision = l.check("sku", &format!("s{t}"), 1).await.expect("every call answers");
                    calls[t].fetch_add(1, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut reloads = 0;
    let mut calls_at_start = None;
    loop {
        let text = BEFORE.replace("limit = 2", &format!("limit = {}", 2 + reloads % 3));
        limiter
            .reload(Config::from_toml(&text).expect("config"))
            .expect("reload");
        reloads += 1;
        let now: Vec<u64> = calls.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let start = calls_at_start.get_or_insert_with(|| now.clone());
        if reloads >= 200 && now.iter().zip(start.iter()).all(|(n, s)| n > s) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "tasks made no calls during 30 s of reloads: {now:?}"
        );
        tokio::task::yield_now().await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("no call failed or panicked");
    }
    limiter.shutdown().await;
}

/// A token bucket of 10 at `{rate}` per `{per}` without a lease: every check is a store call.
const SALE: &str = r#"
[[rule]]
name = "sale"
algorithm = "token_bucket"
capacity = 10
rate = {rate}
per = "{per}"
"#;

fn sale(rate: u64, per: &str) -> Config {
    let text = SALE.replace("{rate}", &rate.to_string()).replace("{per}", per);
    Config::from_toml(&text).expect("config")
}

/// Issue 11's peer case through the public API (invariant 11): a bucket of 10 at 1/s drained at 0, reloaded to
/// 10/s at 900 ms (a refused check is the first call to see it), then ten checks at 1 s. The 900 ms before the
/// reload refill at 1/s (0.9 token) and the 100 ms after it at 10/s (1 token): one check passes. Ten did when the
/// whole second was refilled at the new rate.
#[tokio::test]
async fn a_reload_raising_the_rate_does_not_admit_a_burst() {
    let clock = FakeClock::default();
    let limiter = common::limiter(sale(1, "1s").rules)
        .clock(Arc::new(clock.clone()))
        .build();
    assert_eq!(allowed(&limiter, "sale", "k", 11).await, 10);
    clock.advance(Duration::from_millis(900));
    limiter.reload(sale(10, "1s")).expect("reload");
    let d = limiter.check("sale", "k", 1).await.expect("check");
    assert_eq!((d.allowed, d.retry_after), (false, Duration::from_millis(10)));
    clock.advance(Duration::from_millis(100));
    assert_eq!(allowed(&limiter, "sale", "k", 10).await, 1);
    limiter.shutdown().await;
}

/// The same on a real Redis, on its clock: 10 per hour drained, reloaded to 10 per second a second later. The
/// second before the reload refills at 10 per hour (0.003 token), so the checks after it admit only what 10 per
/// second refills while they run: one per 100 ms they took. Refilled at the new rate, that second was 10 tokens.
#[tokio::test]
async fn a_reload_raising_the_rate_on_redis_does_not_admit_a_burst() {
    let server = common::RedisServer::start();
    let limiter = common::limiter(sale(10, "1h").rules).redis(&server).build();
    assert_eq!(allowed(&limiter, "sale", "k", 11).await, 10);
    // real time: a second must pass on redis-server's clock (the scripts refill from its TIME).
    tokio::time::sleep(Duration::from_secs(1)).await;
    limiter.reload(sale(10, "1s")).expect("reload");
    let start = Instant::now();
    let admitted = allowed(&limiter, "sale", "k", 10).await;
    let refilled = usize::try_from(start.elapsed().as_millis() / 100).unwrap_or(usize::MAX);
    assert!(
        admitted <= 1 + refilled,
        "{admitted} of 10 checks admitted within {:?} of a reload",
        start.elapsed()
    );
    limiter.shutdown().await;
}

/// A rate-lowering reload is not undone by a process that has not reloaded yet (invariant 11), on a real
/// redis-server: two limiters drain a bucket of 10 at 10/s, the first reloads to 1/s and checks once, and for
/// two seconds the second limiter, still at 10/s, is decided with the hash's 1/s: about one check of ten passes
/// each second (ten did in the second second when its calls wrote their 10/s back).
#[tokio::test]
async fn a_process_that_has_not_reloaded_keeps_a_lowered_rate_on_redis() {
    let server = common::RedisServer::start();
    let reloaded = common::limiter(sale(10, "1s").rules).redis(&server).build();
    let behind = common::limiter(sale(10, "1s").rules).redis(&server).build();
    assert_eq!(allowed(&reloaded, "sale", "k", 10).await, 10);
    reloaded.reload(sale(1, "1s")).expect("reload");
    assert_eq!(allowed(&reloaded, "sale", "k", 1).await, 0, "drained");
    let start = Instant::now();
    // real time: two seconds on redis-server's clock (the scripts refill from its TIME), ten checks after each.
    let mut admitted = 0;
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        admitted += allowed(&behind, "sale", "k", 10).await;
    }
    let at_the_lowered_rate = usize::try_from(start.elapsed().as_millis() / 1_000).unwrap_or(usize::MAX) + 1;
    assert!(
        admitted <= at_the_lowered_rate,
        "{admitted} of 20 checks admitted {:?} after a reload to 1/s",
        start.elapsed()
    );
    reloaded.shutdown().await;
    behind.shutdown().await;
}

/// Two limiters on one thread, each with a rule named "post" of its own limit: a decision by name is the named
/// rule of the limiter asked, whatever rule of that name the thread decided last (`src/nearby.rs`).
#[tokio::test(flavor = "current_thread")]
async fn two_limiters_with_a_rule_of_one_name_decide_each_by_its_own() {
    let post = |limit| Rule::fixed_window("post", limit, Duration::from_secs(60)).expect("rule");
    let one = Limiter::builder().rule(post(1)).build().expect("limiter");
    let five = Limiter::builder().rule(post(5)).build().expect("limiter");
    let mut allowed = (0, 0);
    for _ in 0..5 {
        allowed.0 += u32::from(one.check("post", "u", 1).await.expect("check").allowed);
        allowed.1 += u32::from(five.check("post", "u", 1).await.expect("check").allowed);
    }
    assert_eq!(allowed, (1, 5));
    drop(one);
    // A limiter built after one was dropped is not answered from the dropped one's rule.
    let two = Limiter::builder().rule(post(2)).build().expect("limiter");
    let mut allowed = 0;
    for _ in 0..5 {
        allowed += u32::from(two.check("post", "u", 1).await.expect("check").allowed);
    }
    assert_eq!(allowed, 2);
}
