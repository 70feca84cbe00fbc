//! Redis Sentinel and failover (invariant 9): a real master, a replica and `redis-sentinel` on loopback ports;
//! a run of checks through a leased rule and a direct one while the master is killed (kill -9): decisions come
//! back from the new master by themselves, and what asynchronous replication lost is measured. And a master
//! demoted to a replica behind a plain URL (`REPLICAOF`): `READONLY` is a transient error, the connection is
//! made again, and the limiter recovers by itself once the server is a master again.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::sentinel::RedisSentinel;
use common::{wait_for, RedisServer};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::MetricKind;
use tokenlease::{Config, Decision, Limiter, Rule, Source};
use tokio::task::JoinSet;

const MASTER: &str = "mymaster";
/// Capacity of both rules, in tokens, more than a run can spend. Their rate is one token an hour, so over a
/// run of seconds the bound `capacity + rate × (W + lease_ttl)` is the capacity: any token admitted beyond it
/// was granted twice.
const CAPACITY: u64 = 100_000_000;
const MAX_BATCH: u64 = 100;

fn config(sentinel: &RedisSentinel) -> Config {
    let toml = format!(
        r#"
[redis]
sentinel = {{ master_name = "{MASTER}", nodes = ["{url}"] }}
timeout = "200ms"
fail_mode = "closed"
expected_processes = 1

[[rule]]
name = "sku"
algorithm = "token_bucket"
capacity = {CAPACITY}
rate = 1
per = "1h"
lease = {{ min_batch = 10, max_batch = {MAX_BATCH}, ttl = "60s" }}

[[rule]]
name = "post"
algorithm = "token_bucket"
capacity = {CAPACITY}
rate = 1
per = "1h"
"#,
        url = sentinel.url()
    );
    Config::from_toml(&toml).expect("sentinel config")
}

/// Milliseconds since `start`.
fn ms_since(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// What the load of one rule saw.
#[derive(Default)]
struct Seen {
    admitted: AtomicU64,
    /// When (ms since the start) a decision last came from the store: a direct rule's `redis` decision.
    last_store_ms: AtomicU64,
}

/// Checks `rule` on one key from `tasks` tasks, as fast as they can, until `stop`; `tasks` ends with them.
fn load(
    limiter: &Limiter,
    rule: &'static str,
    tasks: &mut JoinSet<()>,
    start: Instant,
    stop: &Arc<AtomicBool>,
) -> Arc<Seen> {
    let seen = Arc::new(Seen::default());
    for _ in 0..2 {
        let (limiter, seen, stop) = (limiter.clone(), seen.clone(), stop.clone());
        tasks.spawn(async move {
            while !stop.load(Ordering::Acquire) {
                let d = limiter.check(rule, "flash", 1).await.expect("check");
                seen.admitted.fetch_add(u64::from(d.allowed), Ordering::Relaxed);
                if d.source == Source::Redis {
                    seen.last_store_ms.fetch_max(ms_since(start), Ordering::Relaxed);
                }
                tokio::task::yield_now().await;
            }
        });
    }
    seen
}

/// Takes what is left in `rule`'s bucket, through the same rule without a lease (the same Redis key), with
/// costs halving from 2^26 to 1; returns the tokens admitted.
async fn drain(limiter: &Limiter, rule: &str) -> u64 {
    let unleased = Rule::token_bucket(rule, CAPACITY, 1, Duration::from_secs(3600)).expect("rule");
    let mut admitted = 0;
    let mut cost = 1 << 26;
    let deadline = Instant::now() + Duration::from_secs(10);
    while cost > 0 {
        let d: Decision = limiter.check_rule(&unleased, "flash", cost).await.expect("check");
        if d.source == Source::Fallback {
            // Not connected to the master yet (fail_mode closed: nothing was admitted).
            assert!(Instant::now() < deadline, "{rule}: the store did not answer");
            tokio::time::sleep(Duration::from_millis(20)).await; // real time: connecting through redis-sentinel
        } else if d.allowed {
            admitted += cost;
        } else {
            cost /= 2;
        }
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_is_followed_by_itself() {
    let mut master = RedisServer::start();
    let replica = RedisServer::replica_of(&master);
    let sentinel = RedisSentinel::start(&master, MASTER, 1);
    let limiter = Limiter::from_config(config(&sentinel)).expect("limiter");
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = JoinSet::new();
    let leased = load(&limiter, "sku", &mut tasks, start, &stop);
    let direct = load(&limiter, "post", &mut tasks, start, &stop);

    // real time: the load runs on the master, then the master dies.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        leased.admitted.load(Ordering::Relaxed) > 0 && direct.last_store_ms.load(Ordering::Relaxed) > 0,
        "no decision from the master before the kill"
    );
    master.stop(); // kill -9
    let killed_ms = ms_since(start);
    let promoted = wait_for(Duration::from_secs(20), || {
        (replica.role() == "master").then(|| ms_since(start))
    });
    let promoted_ms = promoted.expect("the sentinel promoted the replica");
    let leased_at_promotion = limiter.stats().leased_tokens;
    let named = wait_for(Duration::from_secs(10), || {
        (sentinel.master_port(MASTER) == Some(replica.port)).then(|| ms_since(start))
    });
    let named_ms = named.expect("the sentinel names the promoted replica");

    // Decisions come back from the new master: a direct check answered by it, a lease granted by it.
    let back = wait_for(Duration::from_secs(5), || {
        let direct_back = direct.last_store_ms.load(Ordering::Relaxed) > promoted_ms;
        let leased_back = limiter.stats().leased_tokens > leased_at_promotion;
        (direct_back && leased_back).then(|| ms_since(start))
    });
    let back_ms = back.unwrap_or_else(|| panic!("no decision from the new master within 5 s of its promotion"));
    // real time: the load runs on the promoted redis-server a while longer.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Release);
    while let Some(ended) = tasks.join_next().await {
        ended.expect("no check failed or panicked");
    }
    let during = (
        leased.admitted.load(Ordering::Relaxed),
        direct.admitted.load(Ordering::Relaxed),
    );

    // What asynchronous replication lost: tokens the old master granted that the replica never saw are granted
    // again by the new master. Everything left is drained; the bound is the capacity.
    // Leased tokens left unspent go back first (shutdown), then a limiter of its own drains each bucket.
    limiter.shutdown().await;
    let drainer = Limiter::from_config(config(&sentinel)).expect("limiter");
    let admitted = [
        ("leased", during.0 + drain(&drainer, "sku").await),
        ("direct", during.1 + drain(&drainer, "post").await),
    ];
    eprintln!(
        "sentinel failover: killed at {killed_ms} ms, replica promoted at {promoted_ms} ms (+{} ms), named by the \
         sentinel by {named_ms} ms, decisions back from it at {back_ms} ms (+{} ms after the promotion)",
        promoted_ms - killed_ms,
        back_ms.saturating_sub(promoted_ms)
    );
    eprintln!(
        "sentinel failover: {} tokens admitted by the leased rule and {} by the direct one in {} ms of load",
        during.0,
        during.1,
        back_ms + 500
    );
    for (rule, admitted) in admitted {
        let over = i128::from(admitted) - i128::from(CAPACITY);
        eprintln!("sentinel failover: {rule} rule admitted {admitted} of a bound of {CAPACITY} ({over:+} tokens)");
        // A lease or a call the old master granted in its last moments, not replicated yet: at most a few.
        assert!(
            admitted <= CAPACITY + 2 * MAX_BATCH,
            "{rule}: {admitted} admitted, bound {CAPACITY}"
        );
    }
}

fn counter(snapshot: &[(metrics_util::CompositeKey, DebugValue)], name: &str, kind: &str) -> u64 {
    snapshot
        .iter()
        .filter(|(k, _)| k.kind() == MetricKind::Counter && k.key().name() == name)
        .filter(|(k, _)| k.key().labels().any(|l| l.key() == "kind" && l.value() == kind))
        .map(|(_, v)| match v {
            DebugValue::Counter(c) => *c,
            _ => 0,
        })
        .sum()
}

/// The ids of the server's client connections, but the one asking (`CLIENT LIST` through `redis-cli`) and its
/// link to its master (`flags=M`) when it is a replica.
fn client_ids(server: &RedisServer) -> Vec<String> {
    let list = server.cmd(&["CLIENT", "LIST"]).unwrap_or_default();
    list.lines()
        .filter(|l| !l.contains("cmd=client|list") && !l.contains(" flags=M "))
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")).map(str::to_owned))
        .collect()
}

/// A master demoted to a replica behind a plain URL: every call meets `READONLY` (a transient error of kind
/// `readonly`, decided by fail_mode), readiness says why, the connection is made again, and once the server is
/// a master again (`REPLICAOF NO ONE`) decisions come from it again, with no restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_demoted_by_replicaof_is_left_and_found_again() {
    let server = RedisServer::start();
    let other = RedisServer::start();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let limiter = metrics::with_local_recorder(&recorder, || {
        let rule = Rule::token_bucket("post", 1_000_000, 1, Duration::from_secs(3600)).expect("rule");
        common::limiter([rule])
            .redis(&server)
            .timeout(Duration::from_millis(500))
            .build()
    });
    let check = async || limiter.check("post", "user:1", 1).await.expect("check");
    assert_eq!(check().await.source, Source::Redis);
    assert!(limiter.readiness().await.ready);

    let port = other.port.to_string();
    server.cmd(&["REPLICAOF", "127.0.0.1", &port]).expect("REPLICAOF");
    let refused = check().await;
    let connections = client_ids(&server);
    assert_eq!(refused.source, Source::Fallback, "a replica decided");
    let readiness = limiter.readiness().await;
    assert!(!readiness.ready, "ready on a replica");
    let reason = readiness.reason.unwrap_or_default();
    assert!(
        reason.contains("(readonly)") && reason.contains("read only replica"),
        "{reason}"
    );
    let snapshot: Vec<_> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v)| (k, v))
        .collect();
    assert!(counter(&snapshot, "tokenlease_redis_errors_total", "readonly") >= 1);
    // real time: the connection is made again (at most every 100 ms) while READONLY lasts.
    let started = Instant::now();
    while client_ids(&server).iter().all(|id| connections.contains(id)) {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the connection was not made again after READONLY"
        );
        assert_eq!(check().await.source, Source::Fallback, "a replica decided");
        tokio::time::sleep(Duration::from_millis(20)).await; // real time: the reconnect to the replica
    }

    server.cmd(&["REPLICAOF", "NO", "ONE"]).expect("REPLICAOF NO ONE");
    let started = Instant::now();
    loop {
        if check().await.source == Source::Redis && limiter.readiness().await.ready {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "not back within 5 s of REPLICAOF NO ONE"
        );
        tokio::time::sleep(Duration::from_millis(20)).await; // real time: the server is a master again
    }
    limiter.shutdown().await;
}
