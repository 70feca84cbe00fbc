//! Refusals are cheap (invariant 4): after the store refuses a key, the process refuses it locally until the
//! refusal's retry_after, for every algorithm, and asks the store again from then on. On the in-process store
//! and a fake clock, so that "until" is exact.

mod common;

use std::sync::Arc;
use std::time::Duration;

use tokenlease::{FakeClock, Lease, Limiter, ProcessConfig, Rule, Source};

const HOUR: Duration = Duration::from_secs(3600);

/// One rule of each algorithm (and a ban, a calendar window, a leased rule's cold key), each admitting 5 at once.
fn rules() -> Vec<Rule> {
    let cold = Lease {
        min_batch: 2,
        max_batch: 4,
        ttl: Duration::from_millis(200),
        hot_after: Some(1000),
        reserve: None,
    };
    vec![
        Rule::token_bucket("bucket", 5, 1, Duration::from_secs(10)).expect("rule"),
        Rule::token_bucket("leased", 5, 1, Duration::from_secs(10))
            .and_then(|r| r.with_lease(cold))
            .expect("rule"),
        Rule::fixed_window("login", 5, Duration::from_secs(60)).expect("rule"),
        Rule::calendar_window("upload", 5, Duration::from_secs(86_400), "+08:00").expect("rule"),
        Rule::sliding_log("post", 5, Duration::from_secs(60)).expect("rule"),
        Rule::sliding_window("like", 5, Duration::from_secs(60), 6).expect("rule"),
        Rule::fixed_window("ban", 5, Duration::from_secs(10))
            .and_then(|r| r.with_ban(HOUR))
            .expect("rule"),
        Rule::leaky_bucket("reindex", 5, Duration::from_secs(1), Duration::from_secs(1)).expect("rule"),
    ]
}

fn limiter(clock: &FakeClock, process: ProcessConfig) -> Limiter {
    common::limiter(rules())
        .clock(Arc::new(clock.clone()))
        .process(process)
        .build()
}

/// `n` checks of `key` now: (allowed, store calls made, the last decision).
async fn hammer(l: &Limiter, rule: &str, key: &str, n: usize) -> (usize, u64, tokenlease::Decision) {
    let calls = l.stats().store_calls;
    let mut allowed = 0;
    let mut last = None;
    for _ in 0..n {
        let d = l.check(rule, key, 1).await.expect("check");
        allowed += usize::from(d.allowed);
        last = Some(d);
    }
    let last = last.expect("n > 0");
    (allowed, l.stats().store_calls - calls, last)
}

#[tokio::test]
async fn a_hammered_key_costs_one_store_call_per_retry_after_for_every_algorithm() {
    let clock = FakeClock::default();
    let l = limiter(&clock, ProcessConfig::default());
    for rule in rules() {
        let name = rule.name.as_str();
        let answered = l.stats().refusals_answered;
        let (allowed, calls, last) = hammer(&l, name, "k", 200).await;
        let admits = if name == "reindex" { 1 } else { 5 };
        assert_eq!(allowed, admits, "{name}");
        assert_eq!(
            calls,
            admits as u64 + 1,
            "{name}: the admitted calls and one refusal reach the store"
        );
        assert_eq!(l.stats().refusals_answered - answered, 199 - admits as u64, "{name}");
        assert!(!last.allowed && last.source == Source::Local, "{name}: {last:?}");
        // At most the ban (an hour) or the daily window's rest (a day, by the wall clock).
        let most = if name == "upload" { 24 * HOUR } else { HOUR };
        assert!(
            !last.retry_after.is_zero() && last.retry_after <= most,
            "{name}: {last:?}"
        );
    }
    assert_eq!(l.stats().refused_keys, rules().len());
}

#[tokio::test]
async fn at_the_retry_after_the_store_decides_again_and_grants() {
    for rule in rules() {
        let name = rule.name.as_str();
        let clock = FakeClock::default();
        clock.advance(Duration::from_secs(1));
        let l = limiter(&clock, ProcessConfig::default());
        let (_, _, refused) = hammer(&l, name, "k", 7).await;
        assert!(!refused.allowed, "{name}");
        // Just before: still refused here, without a store call.
        clock.advance(refused.retry_after - Duration::from_millis(1));
        let calls = l.stats().store_calls;
        let d = l.check(name, "k", 1).await.expect("check");
        assert!(!d.allowed && d.source == Source::Local, "{name}: {d:?}");
        assert_eq!(d.retry_after, Duration::from_millis(1), "{name}");
        assert_eq!(l.stats().store_calls, calls, "{name}");
        // At the retry_after the store grants: the process never refused what the store would grant.
        clock.advance(Duration::from_millis(1));
        let d = l.check(name, "k", 1).await.expect("check");
        assert!(d.allowed && d.source == Source::Memory, "{name}: {d:?}");
        assert_eq!(l.stats().store_calls, calls + 1, "{name}");
    }
}

#[tokio::test]
async fn a_smaller_cost_a_reset_and_a_reload_ask_the_store_again() {
    let clock = FakeClock::default();
    let l = limiter(&clock, ProcessConfig::default());
    assert!(l.check("bucket", "k", 4).await.expect("check").allowed);
    let d = l.check("bucket", "k", 3).await.expect("check");
    assert!(
        !d.allowed && d.source == Source::Memory,
        "1 left: 3 refused by the store"
    );
    let d = l.check("bucket", "k", 1).await.expect("check");
    assert!(
        d.allowed && d.source == Source::Memory,
        "a smaller cost is the store's to decide: {d:?}"
    );

    let (_, _, refused) = hammer(&l, "login", "k", 7).await;
    assert_eq!(refused.source, Source::Local);
    l.reset("login", "k").await.expect("reset");
    let d = l.check("login", "k", 1).await.expect("check");
    assert!(
        d.allowed && d.source == Source::Memory,
        "reset forgets the refusal: {d:?}"
    );

    let (_, _, refused) = hammer(&l, "post", "k", 7).await;
    assert_eq!(refused.source, Source::Local);
    let mut config = tokenlease::Config::from_toml("").expect("an empty config");
    config.rules = rules()
        .into_iter()
        .map(|r| match r.name.as_str() {
            "post" => Rule::sliding_log("post", 10, Duration::from_secs(60)).expect("rule"),
            _ => r,
        })
        .collect();
    l.reload(config).expect("reload");
    let d = l.check("post", "k", 1).await.expect("check");
    assert!(
        d.allowed && d.source == Source::Memory,
        "a reloaded rule asks the store: {d:?}"
    );
}

#[tokio::test]
async fn max_refused_keys_bounds_the_keys_held_and_zero_holds_none() {
    let clock = FakeClock::default();
    let few = ProcessConfig {
        max_refused_keys: 50,
        ..ProcessConfig::default()
    };
    let l = limiter(&clock, few);
    for i in 0..500 {
        let (allowed, ..) = hammer(&l, "login", &format!("user:{i}"), 6).await;
        assert_eq!(allowed, 5);
    }
    let held = l.stats().refused_keys;
    assert!((1..=50).contains(&held), "held {held}");

    let none = ProcessConfig {
        max_refused_keys: 0,
        ..ProcessConfig::default()
    };
    let l = limiter(&clock, none);
    let (allowed, calls, last) = hammer(&l, "login", "k", 20).await;
    assert_eq!((allowed, calls, last.source), (5, 20, Source::Memory));
    assert_eq!(l.stats().refused_keys, 0);
}
