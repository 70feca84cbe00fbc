//! Resident memory of one process that sees 1,000,000 distinct cold keys on a leased rule (each key leases once,
//! spends one token and is never seen again): the local cache is bounded by `[process] max_local_keys`, so memory
//! stays flat, and the evicted keys' unspent tokens go back to Redis. `cargo bench --bench cold_keys` prints a
//! table: resident memory (VmRSS from /proc/self/status) and local keys as the keys go by, for the default bound
//! of 100,000 keys and for 10,000, with batches of 5 tokens and with adaptive batches of 1 to 100.

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokenlease::ProcessConfig;
use tokenlease::{Lease, Limiter, RedisStore, Rule};

const KEYS: u64 = 1_000_000;
const IN_FLIGHT: u64 = 64;

/// Resident memory of this process, in MiB.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// Each bound runs in a process of its own (this binary with the bound as argument), so that one run's heap,
/// which the allocator keeps, does not count in the next one's resident memory.
fn main() {
    let args: Vec<u64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let [bound, min_batch, max_batch] = args[..] else {
        println!(
            "| max_local_keys | lease batch | keys seen | local keys | resident MiB | keys/s | leased tokens | returned tokens |"
        );
        println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
        for run in [["100000", "5", "5"], ["10000", "5", "5"], ["10000", "1", "100"]] {
            let exe = std::env::current_exe().expect("this binary");
            let status = std::process::Command::new(exe).args(run).status().expect("run");
            assert!(status.success(), "the run {run:?} failed");
        }
        return;
    };
    run(usize::try_from(bound).expect("bound"), min_batch, max_batch);
}

/// One run: `max_local_keys`, and leases of `min_batch..=max_batch` tokens.
fn run(max_local_keys: usize, min_batch: u64, max_batch: u64) {
    let server = common::RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    {
        let limiter = {
            let _g = rt.enter();
            let store = RedisStore::connect(&server.url(), Duration::from_secs(5)).expect("store");
            // A per-item limit: 100 per second each, leased min_batch..=max_batch at a time.
            let rule = Rule::token_bucket("item", 100, 100, Duration::from_secs(1))
                .and_then(|r| {
                    r.with_lease(Lease {
                        min_batch,
                        max_batch,
                        ttl: Duration::from_secs(30),
                        hot_after: None,
                        reserve: None,
                    })
                })
                .expect("rule");
            let local = ProcessConfig {
                max_local_keys,
                ..Default::default()
            };
            Limiter::builder()
                .store(Arc::new(store))
                .timeout(Duration::from_secs(1))
                .expected_processes(1)
                .process(local)
                .rule(rule)
                .build()
                .expect("limiter")
        };
        let next = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        let report = |seen: u64, limiter: &Limiter| {
            let stats = limiter.stats();
            println!(
                "| {max_local_keys} | {min_batch}..{max_batch} | {seen} | {} | {:.1} | {:.0} | {} | {} |",
                limiter.local_keys(),
                rss_mib(),
                seen as f64 / started.elapsed().as_secs_f64(),
                stats.leased_tokens,
                stats.returned_tokens
            );
        };
        report(0, &limiter);
        rt.block_on(async {
            let mut tasks = Vec::new();
            for _ in 0..IN_FLIGHT {
                let (limiter, next) = (limiter.clone(), next.clone());
                tasks.push(tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= KEYS {
                            break;
                        }
                        let d = limiter.check("item", &format!("item:{i}"), 1).await.expect("check");
                        assert!(d.allowed, "a cold key always has tokens");
                    }
                }));
            }
            let mut last = 0;
            while next.load(Ordering::Relaxed) < KEYS {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let seen = next.load(Ordering::Relaxed).min(KEYS);
                if seen / 250_000 > last / 250_000 {
                    report(seen, &limiter);
                }
                last = seen;
            }
            for t in tasks {
                t.await.expect("task");
            }
            // Let the sweeper evict down to the bound.
            tokio::time::sleep(Duration::from_secs(2)).await;
            report(KEYS, &limiter);
            limiter.shutdown().await;
        });
        report(KEYS, &limiter);
    }
}
