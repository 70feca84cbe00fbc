//! Benchmarks: `cargo bench` (one criterion entry point; each scenario a function).
//!
//! - `redis_per_call`: the baseline, one EVALSHA round trip per decision (a private `redis-server`).
//! - `lease_refill/batch=N`: decisions on a leased key over Redis where every N decisions need a new lease.
//!
//! A decision answered from leased tokens, on one thread and on two, is in `benches/peers.rs`, beside governor.

use std::sync::Arc;
use std::time::Duration;

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
                reserve: None,
            })
        })
        .expect("rule")
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

criterion_group!(benches, redis_paths);
criterion_main!(benches);
