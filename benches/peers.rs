//! Peers side by side in one run: `cargo bench --bench peers` (about 25 s; no Redis needed).
//!
//! Four ways to decide one hot key, each measured the same way:
//!
//! - `tokenlease_by_name`: the same decision by the rule's name, `limiter.check("hot", "sku:1", 1)`, as most
//!   callers make it.
//! - `tokenlease`: a leased hot-key decision, `limiter.rule("hot")?.check("sku:1", 1)` on the in-process store. The
//!   rule's capacity, rate and lease batch are so large (a batch of 2^36 tokens for an hour) that every measured
//!   decision is served from leased tokens; each sample checks that the store was not called meanwhile. The loop
//!   runs inside one `block_on` of a current-thread tokio runtime, so no runtime work is paid per decision. No
//!   metrics recorder is installed (the `metrics` calls go to its no-op recorder, as in a library without one).
//! - `governor`: governor's keyed GCRA check, `DefaultKeyedRateLimiter<String>::check_key` (its default DashMap
//!   store, default hasher and quanta clock), with a quota that never refuses (burst 2^32 - 1, 1 cell per ns).
//! - `floor`: what a decision cannot go below: one `DashMap<String, AtomicU64>` lookup (foldhash, as the crate's
//!   key maps) and one atomic `fetch_sub`.
//!
//! Every decision must be allowed; a sample with a refusal panics.
//!
//! **What the figures mean.** `one_thread/*`: the bench thread makes `iters` decisions; the figure is the wall
//! time per decision. `two_threads_one_key/*`: two std threads, released together by a barrier, each make
//! `iters` decisions on the same key of the same limiter; the figure is the wall time divided by the `2 × iters`
//! decisions, i.e. the pair's wall-clock time per decision (the inverse of their combined throughput). Two
//! threads that do not share a cache line halve the one-thread figure; two that serialise on one keep it or
//! make it worse. Issue 12's targets: tokenlease ≤ 1.0× governor's time per decision on one thread, and on two
//! threads ≤ 0.5× governor's. The machine's other load shows most in the two-thread figures.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use dashmap::DashMap;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tokenlease::{Lease, Limiter, Rule, Source};

/// The rule and the one hot key every peer decides.
const RULE: &str = "hot";
const KEY: &str = "sku:1";

/// One peer: `run` makes `iters` decisions on [`KEY`] and returns how many were refused.
trait Peer: Sync {
    fn run(&self, iters: u64) -> u64;
}

/// tokenlease's leased hot-key decision, on the in-process store.
struct Tokenlease {
    runtime: tokio::runtime::Runtime,
    limiter: Limiter,
    /// The rule resolved once (`limiter.rule(RULE)`), as a caller deciding often keeps it.
    rule: tokenlease::RuleHandle,
    /// Decide by the rule's name (`limiter.check(RULE, ..)`), as most callers do, instead of by the handle.
    by_name: bool,
}

impl Tokenlease {
    fn new(by_name: bool) -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let rule = Rule::token_bucket(RULE, 1 << 40, 1 << 30, Duration::from_secs(1))
            .and_then(|r| {
                r.with_lease(Lease {
                    min_batch: 1 << 36,
                    max_batch: 1 << 36,
                    ttl: Duration::from_secs(3600),
                    hot_after: Some(1),
                    reserve: None,
                })
            })
            .expect("rule");
        let limiter = runtime
            .block_on(async { Limiter::builder().rule(rule).expected_processes(1).build() })
            .expect("limiter");
        let rule = limiter.rule(RULE).expect("a configured rule");
        let peer = Self {
            runtime,
            limiter,
            rule,
            by_name,
        };
        // The first decision leases a batch; the next must come from it.
        for _ in 0..2 {
            let d = peer
                .runtime
                .block_on(peer.limiter.check(RULE, KEY, 1))
                .expect("warm-up");
            assert!(d.allowed, "warm-up refused");
        }
        let d = peer
            .runtime
            .block_on(peer.limiter.check(RULE, KEY, 1))
            .expect("warm-up");
        assert_eq!(d.source, Source::Local, "not served from leased tokens");
        peer
    }

    /// The measured call, on the rule's handle or by its name.
    #[inline(always)]
    async fn decide(&self) -> bool {
        let decision = if self.by_name {
            self.limiter.check(RULE, KEY, 1).await
        } else {
            self.rule.check(KEY, 1).await
        };
        matches!(decision, Ok(d) if d.allowed)
    }
}

impl Peer for Tokenlease {
    fn run(&self, iters: u64) -> u64 {
        let calls = self.limiter.store_calls();
        let refused = self.runtime.block_on(async {
            let mut refused = 0;
            for _ in 0..iters {
                refused += u64::from(!black_box(self.decide().await));
            }
            refused
        });
        assert_eq!(
            self.limiter.store_calls(),
            calls,
            "a measured decision called the store"
        );
        refused
    }
}

/// governor's keyed check.
struct Governor {
    limiter: DefaultKeyedRateLimiter<String>,
    key: String,
}

impl Governor {
    fn new() -> Self {
        let quota = Quota::with_period(Duration::from_nanos(1))
            .expect("quota")
            .allow_burst(NonZeroU32::MAX);
        Self {
            limiter: RateLimiter::keyed(quota),
            key: KEY.to_owned(),
        }
    }
}

impl Peer for Governor {
    fn run(&self, iters: u64) -> u64 {
        let mut refused = 0;
        for _ in 0..iters {
            refused += u64::from(black_box(self.limiter.check_key(black_box(&self.key))).is_err());
        }
        refused
    }
}

/// The floor: one map lookup and one atomic.
struct Floor {
    map: DashMap<String, AtomicU64, foldhash::fast::RandomState>,
}

impl Floor {
    fn new() -> Self {
        let map = DashMap::default();
        map.insert(KEY.to_owned(), AtomicU64::new(u64::MAX));
        Self { map }
    }
}

impl Peer for Floor {
    fn run(&self, iters: u64) -> u64 {
        let mut refused = 0;
        for _ in 0..iters {
            let allowed = self
                .map
                .get(black_box(KEY))
                .is_some_and(|tokens| tokens.fetch_sub(1, Ordering::Relaxed) > 0);
            refused += u64::from(!black_box(allowed));
        }
        refused
    }
}

/// Wall time per decision of `threads` threads each making `iters` decisions, scaled to `iters` decisions
/// (criterion divides by `iters`): the wall time divided by the number of threads.
fn timed(peer: &dyn Peer, threads: u32, iters: u64) -> Duration {
    if threads == 1 {
        let started = Instant::now();
        let refused = peer.run(iters);
        let wall = started.elapsed();
        assert_eq!(refused, 0, "a decision was refused");
        return wall;
    }
    let barrier = Barrier::new(threads as usize + 1);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    peer.run(iters)
                })
            })
            .collect();
        barrier.wait();
        let started = Instant::now();
        let refused: u64 = workers.into_iter().map(|w| w.join().expect("bench thread")).sum();
        let wall = started.elapsed();
        assert_eq!(refused, 0, "a decision was refused");
        wall / threads
    })
}

fn peers(c: &mut Criterion) {
    let tokenlease = Tokenlease::new(false);
    let by_name = Tokenlease::new(true);
    let governor = Governor::new();
    let floor = Floor::new();
    let all: [(&str, &dyn Peer); 4] = [
        ("tokenlease", &tokenlease),
        ("tokenlease_by_name", &by_name),
        ("governor", &governor),
        ("floor", &floor),
    ];
    for (group, threads) in [("one_thread", 1), ("two_threads_one_key", 2)] {
        let mut g = c.benchmark_group(group);
        g.throughput(Throughput::Elements(1));
        for (name, peer) in all {
            g.bench_function(name, |b| b.iter_custom(|iters| timed(peer, threads, iters)));
        }
        g.finish();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .without_plots()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_millis(2500));
    targets = peers
}
criterion_main!(benches);
