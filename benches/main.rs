//! Benchmarks: `cargo bench` (one criterion entry point; each scenario a function).
//!
//! - `local_lease_hit`: a decision answered from leased tokens (DashMap lookup + one compare-and-swap).
//! - `redis_per_call`: the baseline, one EVALSHA round trip per decision (a private `redis-server`).
//! - `lease_refill/batch=N`: decisions on a leased key over Redis where every N decisions need a new lease.
//! - `local_lease_hit_contended`: two threads on one hot key.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tokenlease::{Lease, Limiter, RedisStore, Rule};

#[path = "../tests/common/mod.rs"]
mod common;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A rule that never runs dry during a bench: a huge capacity and rate.
fn hot_rule(batch: u64) -> Rule {
    Rule::token_bucket("hot", 1 << 40, 1 << 30, Duration::from_secs(1))
        .and_then(|r| {
            r.with_lease(Lease {
                min_batch: batch,
                max_batch: batch,
                ttl: Duration::from_secs(10),
                hot_after: None,
            })
        })
        .expect("rule")
}

fn local_lease_hit(c: &mut Criterion) {
    let rt = runtime();
    let limiter = rt
        .block_on(async { Limiter::builder().rule(hot_rule(100_000)).expected_processes(1).build() })
        .expect("limiter");
    let warm = rt
        .block_on(async { limiter.check("hot", "sku:1", 1).await })
        .expect("warm");
    assert!(warm.allowed);
    let mut g = c.benchmark_group("decision");
    g.throughput(Throughput::Elements(1));
    g.bench_function("local_lease_hit", |b| {
        b.to_async(&rt)
            .iter(|| async { limiter.check("hot", "sku:1", 1).await.expect("check") })
    });
    g.finish();
}

fn local_lease_hit_contended(c: &mut Criterion) {
    let rt = runtime();
    let limiter = rt
        .block_on(async { Limiter::builder().rule(hot_rule(100_000)).expected_processes(1).build() })
        .expect("limiter");
    let mut g = c.benchmark_group("decision");
    g.throughput(Throughput::Elements(2));
    g.bench_function("local_lease_hit_2_threads", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let started = Instant::now();
                let tasks: Vec<_> = (0..2)
                    .map(|_| {
                        let l = limiter.clone();
                        tokio::spawn(async move {
                            for _ in 0..iters {
                                let _ = l.check("hot", "sku:1", 1).await;
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    let _ = t.await;
                }
                started.elapsed()
            })
        })
    });
    g.finish();
}

fn redis_paths(c: &mut Criterion) {
    let server = common::RedisServer::start();
    let rt = runtime();
    let url = server.url();
    let build = |rule: Rule| {
        let _runtime = rt.enter();
        let store = RedisStore::connect(&url, Duration::from_secs(1)).expect("store");
        rt.block_on(async {
            Limiter::builder()
                .rule(rule)
                .store(Arc::new(store))
                .timeout(Duration::from_secs(1))
                .expected_processes(1)
                .build()
        })
        .expect("limiter")
    };
    let mut g = c.benchmark_group("decision");
    g.throughput(Throughput::Elements(1));
    let per_call = build(Rule::token_bucket("hot", 1 << 40, 1 << 30, Duration::from_secs(1)).expect("rule"));
    g.bench_function("redis_per_call", |b| {
        b.to_async(&rt)
            .iter(|| async { per_call.check("hot", "sku:1", 1).await.expect("check") })
    });
    for batch in [10_u64, 100, 1000] {
        let leased = build(hot_rule(batch));
        g.bench_with_input(
            BenchmarkId::new("lease_refill", format!("batch={batch}")),
            &batch,
            |b, _| {
                b.to_async(&rt)
                    .iter(|| async { leased.check("hot", "sku:1", 1).await.expect("check") })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, local_lease_hit, local_lease_hit_contended, redis_paths);
criterion_main!(benches);
