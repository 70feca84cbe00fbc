//! Decision latency with network latency added between the limiter and Redis, leased and not.
//! `cargo bench --bench latency` prints a Markdown table (about a minute).
//!
//! A `redis-server` on loopback, with a delaying TCP proxy in front of it (`tests/common/proxy.rs`, each direction
//! delayed by half the added round trip). For an added round trip of 0 (through the proxy, no delay), 1, 5 and
//! 20 ms, one key of `sku_buy` (capacity 2000, 1000 per 1 s) is checked through `Limiter::check`:
//!
//! - **leased**: lease `{ min_batch 10, max_batch 500, ttl 200 ms }`, `expected_processes(1)`;
//! - **no lease**: the same bucket, one `token_bucket.lua` call per decision (the baseline);
//!
//! under two demands, each for `CASE` (3 s) on a 2-worker multi-thread runtime:
//!
//! - **8 tasks, closed loop**: `TASKS` tasks check back to back (each yields every 64 decisions). Leased, that is
//!   millions per second, far above the rate: almost every decision is a local refusal. Without a lease it is at
//!   most 8 calls per round trip, so from 5 ms on it stays under the rate and everything is allowed.
//! - **800/s**: open loop, below the rate: every 10 ms 8 checks start, each in its own task, so all should pass.
//!
//! The limiter's timeout is 200 ms (callers wait on a lease up to 2 × 200 + 5 ms; a lease call may take 2 s), so
//! 20 ms of added latency never times out: a decision made by `fail_mode` (`source == Fallback`) would show in the
//! last column, and one longer than the timeout is reported on stderr. Latency is `check`'s own duration; "took
//! ≥ 1 ms" is the share of decisions that waited on Redis; "Redis calls" are the server's EVALSHA + EVAL calls
//! (`INFO commandstats`) during the case, divided by its decisions. Each case has a fresh limiter and a fresh key
//! (a full bucket); its connection is warmed up by 40 PINGs first, whose median is the "PING p50" column (the
//! round trip as actually added: the proxy's own overhead and sleep overshoot included).
//!
//! Calls that overlap on the store's one multiplexed connection pay up to two round trips: redis-rs leaves
//! `TCP_NODELAY` off by default, so a request written while another is unanswered waits (Nagle) for the ACK that
//! comes back with that reply. The proxy does not cause this; it makes it visible, as a real network would.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use tokenlease::{Decision, Lease, Limiter, RedisStore, Rule, Source};

use common::proxy::DelayProxy;

const ADDED_RTT_MS: [u64; 4] = [0, 1, 5, 20];
const TASKS: usize = 8;
const CASE: Duration = Duration::from_secs(3);
const TIMEOUT: Duration = Duration::from_millis(200);
/// Open-loop demand: `PACED_BATCH` checks every `PACED_EVERY` (800 per second, below the rule's 1000).
const PACED_BATCH: usize = 8;
const PACED_EVERY: Duration = Duration::from_millis(10);
const PINGS: usize = 40;
const RULE: &str = "sku_buy";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Demand {
    Saturated,
    Paced,
}

impl Demand {
    fn name(self) -> String {
        match self {
            Self::Saturated => format!("{TASKS} tasks, closed loop"),
            Self::Paced => format!("{}/s", PACED_BATCH as u128 * 1000 / PACED_EVERY.as_millis()),
        }
    }
}

/// What one case measured.
struct Outcome {
    decisions: u64,
    allowed: u64,
    fallback: u64,
    errors: u64,
    /// Nanoseconds per decision: all of them, and the allowed ones.
    all: Histogram<u64>,
    granted: Histogram<u64>,
    elapsed: Duration,
}

impl Outcome {
    fn new() -> Self {
        Self {
            decisions: 0,
            allowed: 0,
            fallback: 0,
            errors: 0,
            all: histogram(),
            granted: histogram(),
            elapsed: Duration::ZERO,
        }
    }

    fn record(&mut self, result: Result<Decision, tokenlease::Error>, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX).max(1);
        match result {
            Ok(d) => {
                self.decisions += 1;
                self.all.saturating_record(ns);
                if d.allowed {
                    self.allowed += 1;
                    self.granted.saturating_record(ns);
                }
                self.fallback += u64::from(d.source == Source::Fallback);
            }
            Err(_) => self.errors += 1,
        }
    }

    fn merge(&mut self, other: &Self) {
        self.decisions += other.decisions;
        self.allowed += other.allowed;
        self.fallback += other.fallback;
        self.errors += other.errors;
        self.all.add(&other.all).expect("same bounds");
        self.granted.add(&other.granted).expect("same bounds");
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds")
}

/// A ratio with enough digits to tell 0.00001 from 0.
fn ratio(x: f64) -> String {
    if x == 0.0 || x >= 0.01 {
        format!("{x:.4}")
    } else {
        format!("{x:.1e}")
    }
}

fn us(ns: u64) -> String {
    let us = ns as f64 / 1000.0;
    if us < 10.0 {
        format!("{us:.2}")
    } else {
        format!("{us:.0}")
    }
}

fn rule(leased: bool) -> Rule {
    let rule = Rule::token_bucket(RULE, 2000, 1000, Duration::from_secs(1)).expect("rule");
    if leased {
        rule.with_lease(Lease {
            min_batch: 10,
            max_batch: 500,
            ttl: Duration::from_millis(200),
            hot_after: None,
            reserve: None,
        })
        .expect("lease")
    } else {
        rule
    }
}

async fn saturate(limiter: &Limiter, key: &str) -> Outcome {
    let deadline = Instant::now() + CASE;
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let (limiter, key) = (limiter.clone(), key.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut out = Outcome::new();
            let mut i: u64 = 0;
            loop {
                let started = Instant::now();
                if started >= deadline {
                    return out;
                }
                let result = limiter.check(RULE, &key, 1).await;
                out.record(result, started.elapsed());
                i += 1;
                // Local decisions never wait: let the lease replies and the other tasks in.
                if i.is_multiple_of(64) {
                    tokio::task::yield_now().await;
                }
            }
        }));
    }
    let mut total = Outcome::new();
    for t in tasks {
        total.merge(&t.await.expect("task"));
    }
    total
}

async fn paced(limiter: &Limiter, key: &str) -> Outcome {
    let deadline = Instant::now() + CASE;
    let mut ticks = tokio::time::interval(PACED_EVERY);
    let mut checks = Vec::new();
    while Instant::now() < deadline {
        ticks.tick().await;
        for _ in 0..PACED_BATCH {
            let (limiter, key) = (limiter.clone(), key.to_owned());
            checks.push(tokio::spawn(async move {
                let started = Instant::now();
                let result = limiter.check(RULE, &key, 1).await;
                (result, started.elapsed())
            }));
        }
    }
    let mut total = Outcome::new();
    for c in checks {
        let (result, took) = c.await.expect("check task");
        total.record(result, took);
    }
    total
}

/// Median of `PINGS` sequential PINGs through the limiter's store (the connection is made by the first).
async fn ping_rtt(limiter: &Limiter) -> Duration {
    let mut rtts = Vec::with_capacity(PINGS);
    for _ in 0..PINGS {
        let started = Instant::now();
        limiter.ping().await.expect("PING through the proxy");
        rtts.push(started.elapsed());
    }
    rtts.sort();
    rtts[PINGS / 2]
}

fn main() {
    let server = common::RedisServer::start();
    let proxy = DelayProxy::start(server.port, Duration::ZERO);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");

    let direct = {
        let _g = rt.enter();
        let store = RedisStore::connect(&server.url(), TIMEOUT).expect("store");
        Limiter::builder().store(Arc::new(store)).build().expect("limiter")
    };
    let direct = rt.block_on(ping_rtt(&direct));
    println!(
        "PING p50 without the proxy: {} µs\n",
        us(u64::try_from(direct.as_nanos()).unwrap_or(0))
    );
    println!(
        "| added RTT (PING p50) | demand | mode | decisions/s | allowed | p50 µs | p99 µs | p999 µs | max µs \
         | allowed: p50 / p99 µs | took ≥ 1 ms | Redis calls / decision | fallback |"
    );
    println!("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for rtt_ms in ADDED_RTT_MS {
        proxy.set_delay(Duration::from_millis(rtt_ms) / 2);
        for demand in [Demand::Saturated, Demand::Paced] {
            for leased in [true, false] {
                let mode = if leased { "leased" } else { "no lease" };
                let demand_name = demand.name();
                // A fresh key per case: a full bucket, no lease left over.
                let key = format!("sku:{rtt_ms}ms:{}:{}", demand as u8, u8::from(leased));
                let limiter = {
                    let _g = rt.enter();
                    let store = RedisStore::connect(&proxy.url(), TIMEOUT).expect("store");
                    Limiter::builder()
                        .store(Arc::new(store))
                        .timeout(TIMEOUT)
                        .expected_processes(1)
                        .rule(rule(leased))
                        .build()
                        .expect("limiter")
                };
                let ping = rt.block_on(ping_rtt(&limiter));
                let calls_before = server.script_calls();
                let started = Instant::now();
                let mut out = rt.block_on(async {
                    match demand {
                        Demand::Saturated => saturate(&limiter, &key).await,
                        Demand::Paced => paced(&limiter, &key).await,
                    }
                });
                out.elapsed = started.elapsed();
                let calls = server.script_calls() - calls_before;
                rt.block_on(limiter.shutdown());

                let n = out.decisions.max(1);
                let (all, granted) = (&out.all, &out.granted);
                let slow = all.len() - all.count_between(1, 999_999);
                println!(
                    "| {rtt_ms} ms ({:.2} ms) | {demand_name} | {mode} | {:.0} | {} of {} | {} | {} | {} | {} | {} / {} \
                     | {:.2} % | {} | {} |",
                    ping.as_secs_f64() * 1e3,
                    out.decisions as f64 / out.elapsed.as_secs_f64(),
                    out.allowed,
                    out.decisions,
                    us(all.value_at_quantile(0.5)),
                    us(all.value_at_quantile(0.99)),
                    us(all.value_at_quantile(0.999)),
                    us(all.max()),
                    us(granted.value_at_quantile(0.5)),
                    us(granted.value_at_quantile(0.99)),
                    100.0 * slow as f64 / n as f64,
                    ratio(calls as f64 / n as f64),
                    out.fallback,
                );
                if out.errors > 0 {
                    eprintln!("  {} errors in this case", out.errors);
                }
                if all.max() > u64::try_from(TIMEOUT.as_nanos()).unwrap_or(u64::MAX) {
                    eprintln!(
                        "  a decision took longer than the {TIMEOUT:?} timeout: {} µs",
                        us(all.max())
                    );
                }
            }
        }
    }
}
