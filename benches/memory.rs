//! Redis memory per key and Redis calls per decision for each algorithm, at "1,000,000 per 60 s" under load
//! (the seeds' stated weakness of the sliding log). `cargo bench --bench memory` prints a table.
//!
//! Each algorithm gets one key driven by 1,000,000 decisions spread over a simulated 59 s (`now_ms` steps of
//! 0.059 ms, 64 calls in flight), then `MEMORY USAGE key SAMPLES 0` (exact for a ZSET's every member).

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokenlease::store::{Call, Script};
use tokenlease::{RedisStore, Store};

const DECISIONS: u64 = 1_000_000;
const WINDOW_MS: i64 = 60_000;
const T0: u64 = 1_700_000_000_000;

fn call(script: Script, key: &str, i: u64) -> Call {
    let keys = vec![key.to_owned(), format!("{key}:ban")];
    let limit = i64::try_from(DECISIONS).unwrap_or(i64::MAX);
    let c = match script {
        Script::TokenBucket => Call::new(script, vec![key.to_owned()], vec![limit, limit, WINDOW_MS, 1, 1]),
        Script::SlidingLog => Call::new(script, keys, vec![WINDOW_MS, limit, 1, 0]).with_member(format!("m{i}")),
        Script::FixedWindow => Call::new(script, keys, vec![WINDOW_MS, limit, 1, 0, -1]),
        Script::SlidingWindow => Call::new(script, keys, vec![WINDOW_MS, 6, limit, 1, 0]),
        _ => Call::new(script, keys, vec![]),
    };
    // Spread over 59 s, so that every key is still alive (mid-window) when it is measured.
    c.at(T0 + i * 59 / 1000)
}

fn main() {
    let server = common::RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let store = {
        let _g = rt.enter();
        Arc::new(RedisStore::connect(&server.url(), Duration::from_secs(5)).expect("store"))
    };
    println!("| algorithm | key | granted of {DECISIONS} | Redis bytes for the key | decisions/s (64 in flight) |");
    println!("| --- | --- | --- | --- | --- |");
    for (script, name) in [
        (Script::TokenBucket, "token_bucket"),
        (Script::FixedWindow, "fixed_window"),
        (Script::SlidingWindow, "sliding_window (6 sub-buckets)"),
        (Script::SlidingLog, "sliding_log"),
    ] {
        let key = format!("tl:{{mem:{}}}", script.name());
        let next = Arc::new(AtomicU64::new(0));
        let granted = Arc::new(AtomicU64::new(0));
        let started = Instant::now();
        rt.block_on(async {
            let mut tasks = Vec::new();
            for _ in 0..64 {
                let (store, next, granted, key) = (store.clone(), next.clone(), granted.clone(), key.clone());
                tasks.push(tokio::spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= DECISIONS {
                            break;
                        }
                        let reply = store.run(&call(script, &key, i)).await.expect("script");
                        granted.fetch_add(reply.granted, Ordering::Relaxed);
                    }
                }));
            }
            for t in tasks {
                t.await.expect("task");
            }
        });
        let rate = DECISIONS as f64 / started.elapsed().as_secs_f64();
        let bytes = server
            .cmd(&["MEMORY", "USAGE", &key, "SAMPLES", "0"])
            .unwrap_or_default();
        let bytes = bytes.trim();
        println!(
            "| {name} | `{key}` | {} | {bytes} | {rate:.0} |",
            granted.load(Ordering::Relaxed)
        );
    }
}
