//! The chaos suite: a flash sale on one hot key of a real `redis-server`, by four limiters (four "processes",
//! `expected_processes = 4`, `fail_mode = "local"`), with one fault injected mid-run. Each run asserts the bound
//! of invariant 1 over the whole sale, `admitted ≤ capacity + rate × (span + lease_ttl)` (plus one capacity where
//! Redis lost the key's state: it comes back full), and the same bound in every window of the sale, of every
//! length from 0.2 s to the whole run, at every start (invariant 16: each admission is recorded in a
//! [`Timeline`]); no panic; and that the limiter decides from the store again by itself once the fault is healed.
//!
//! The runs take the machine's two cores in turn (one at a time), so that one run's load is not another's fault.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::proxy::DelayProxy;
use common::RedisServer;
use tokenlease::{FailMode, Lease, Limiter, Rule, Source};
use tokenlease_timeline::{Timeline, Worst};

/// The hot key's bucket: 1000 tokens (a burst of 5 s: what Redis refills during an outage is what an undue
/// second burst would be), 200 per second, leased 5 to 50 at a time for 200 ms.
const CAPACITY: u64 = 1000;
const RATE_PER_S: u64 = 200;
const TTL: Duration = Duration::from_millis(200);
const PROCESSES: u32 = 4;
const TASKS: usize = 4;
/// The shipped `[redis] timeout`.
const TIMEOUT: Duration = Duration::from_millis(50);
/// When the fault starts, and how long the sale goes on after it is healed.
const BEFORE: Duration = Duration::from_millis(1500);
const AFTER: Duration = Duration::from_millis(2000);
/// The shortest window checked (invariant 16).
const MIN_WINDOW: Duration = Duration::from_millis(200);
/// Longer than any sale: `BEFORE`, the longest fault (5 s) and `AFTER`.
const SPAN: Duration = Duration::from_secs(20);

/// One run at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn rule() -> Rule {
    let lease = Lease {
        min_batch: 5,
        max_batch: 50,
        ttl: TTL,
        hot_after: None,
        reserve: None,
    };
    Rule::token_bucket("sku_buy", CAPACITY, RATE_PER_S, Duration::from_secs(1))
        .and_then(|r| r.with_lease(lease))
        .expect("rule")
        .with_fail_mode(FailMode::Local)
}

/// What a sale did.
struct Sale {
    admitted: u64,
    decisions: u64,
    by_fail_mode: u64,
    /// Admitted by fail_mode (each process alone, from its local share).
    alone: u64,
    span: Duration,
    /// The limit of invariant 1 over the span.
    bound: f64,
    /// When the fault started and when it was healed, from the timeline's start.
    fault: (Duration, Duration),
    /// Every admission, in 10 ms buckets.
    timeline: Arc<Timeline>,
}

impl std::fmt::Debug for Sale {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sale")
            .field("admitted", &self.admitted)
            .field("decisions", &self.decisions)
            .field("by_fail_mode", &self.by_fail_mode)
            .field("alone", &self.alone)
            .field("span", &self.span)
            .field("bound", &self.bound)
            .field("fault", &self.fault)
            .finish_non_exhaustive()
    }
}

impl Sale {
    /// The window of at least [`MIN_WINDOW`] furthest over (or closest to) the bound of invariant 1 for its
    /// length, plus `lost` capacities for state Redis lost.
    fn worst(&self, lost: u64) -> Worst {
        let burst = ((1 + lost) * CAPACITY) as f64;
        self.timeline
            .worst(MIN_WINDOW, |w| burst + RATE_PER_S as f64 * (w + TTL).as_secs_f64())
    }
}

/// Runs a sale on `url` for [`BEFORE`], then `fault` (which injects the fault, waits, heals it), then [`AFTER`];
/// then checks that every limiter decides from the store again within 5 s.
async fn sale<F>(url: &str, fault: F) -> Sale
where
    F: FnOnce() + Send + 'static,
{
    let limiters: Vec<Limiter> = (0..PROCESSES)
        .map(|_| {
            common::limiter([rule()])
                .redis_url(url)
                .timeout(TIMEOUT)
                .expected_processes(PROCESSES)
                .build()
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let (admitted, decisions, by_fail_mode, alone) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let timeline = Arc::new(Timeline::new(SPAN));
    let started = timeline.started();
    let mut tasks = tokio::task::JoinSet::new();
    for limiter in &limiters {
        for _ in 0..TASKS {
            let (limiter, stop, timeline) = (limiter.clone(), stop.clone(), timeline.clone());
            let (admitted, decisions) = (admitted.clone(), decisions.clone());
            let (by_fail_mode, alone) = (by_fail_mode.clone(), alone.clone());
            tasks.spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let d = limiter.check("sku_buy", "sku:42", 1).await.expect("a decision");
                    if d.allowed {
                        timeline.record(1);
                    }
                    admitted.fetch_add(u64::from(d.allowed), Ordering::Relaxed);
                    decisions.fetch_add(1, Ordering::Relaxed);
                    let by_fail_mode_now = d.source == Source::Fallback;
                    by_fail_mode.fetch_add(u64::from(by_fail_mode_now), Ordering::Relaxed);
                    alone.fetch_add(u64::from(by_fail_mode_now && d.allowed), Ordering::Relaxed);
                    i += 1;
                    if i.is_multiple_of(64) {
                        tokio::task::yield_now().await;
                    }
                }
            });
        }
    }
    // real time: the fault is done to a real process.
    tokio::time::sleep(BEFORE).await;
    let fault_started = started.elapsed();
    tokio::task::spawn_blocking(fault).await.expect("the fault ran");
    let fault = (fault_started, started.elapsed());
    // real time: the sale goes on against the healed redis-server.
    tokio::time::sleep(AFTER).await;
    stop.store(true, Ordering::Relaxed);
    while let Some(joined) = tasks.join_next().await {
        joined.expect("no panic");
    }
    let span = started.elapsed();
    for limiter in &limiters {
        recovers(limiter).await;
        limiter.shutdown().await;
    }
    let secs = (span + TTL).as_secs_f64();
    Sale {
        admitted: admitted.load(Ordering::Relaxed),
        decisions: decisions.load(Ordering::Relaxed),
        by_fail_mode: by_fail_mode.load(Ordering::Relaxed),
        alone: alone.load(Ordering::Relaxed),
        span,
        bound: CAPACITY as f64 + RATE_PER_S as f64 * secs,
        fault,
        timeline,
    }
}

/// The limiter decides from the store again (a lease: source Local or Redis) within 5 s.
async fn recovers(limiter: &Limiter) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let d = limiter.check("sku_buy", "recovery", 1).await.expect("a decision");
        if d.source != Source::Fallback {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "still deciding by fail_mode 5 s after the fault"
        );
        // real time: waits for the healed server.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asserts the bound (plus `lost` capacities for state Redis lost) over the whole sale and in every window of
/// it, and that the sale did run.
fn assert_within(name: &str, sale: &Sale, lost: u64) {
    let limit = sale.bound + (lost * CAPACITY) as f64;
    eprintln!(
        "{name}: admitted {} of bound {:.0} ({:.1} %), limit {limit:.0}; {} decisions, {} by fail_mode ({} admitted \
         alone), span {:?}",
        sale.admitted,
        sale.bound,
        100.0 * sale.admitted as f64 / sale.bound,
        sale.decisions,
        sale.by_fail_mode,
        sale.alone,
        sale.span
    );
    let worst = sale.worst(lost);
    let (from, to) = sale.fault;
    eprintln!(
        "{name}: {worst}; fault from {:.2} s to {:.2} s",
        from.as_secs_f64(),
        to.as_secs_f64()
    );
    assert!(sale.admitted as f64 <= limit, "{name}: {sale:?} over {limit}");
    assert_eq!(
        sale.timeline.total(),
        sale.admitted,
        "{name}: every admission is on the timeline"
    );
    assert!(worst.ratio <= 1.0, "{name}: {worst}, over the bound; {sale:?}");
    // The sale ran and sold: at least half of what the healthy stretches alone allow.
    let healthy = RATE_PER_S as f64 * (BEFORE + AFTER).as_secs_f64();
    assert!(
        sale.admitted as f64 >= healthy / 2.0,
        "{name}: {sale:?} sold too little"
    );
}

/// A sale through a kill -9 of a Redis that keeps every write (AOF `always`), down for `down`.
async fn kill_9_keeping_the_data(down: Duration) -> Sale {
    let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let url = server.url();
    let (tx, rx) = std::sync::mpsc::channel();
    let sale = sale(&url, move || {
        server.stop();
        // real time: Redis is down this long.
        std::thread::sleep(down);
        server.restart();
        let _ = tx.send(server);
    })
    .await;
    let _server = rx.recv().expect("the server");
    assert!(sale.by_fail_mode > 0, "the outage was decided by fail_mode: {sale:?}");
    sale
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_with_appendfsync_always_down_5_s() {
    let _serial = SERIAL.lock().await;
    let sale = kill_9_keeping_the_data(Duration::from_secs(5)).await;
    assert_within("kill -9, AOF always, 5 s", &sale, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_with_appendfsync_always_down_3_s() {
    let _serial = SERIAL.lock().await;
    let sale = kill_9_keeping_the_data(Duration::from_secs(3)).await;
    assert_within("kill -9, AOF always, 3 s", &sale, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_without_persistence_loses_one_capacity_at_most() {
    let _serial = SERIAL.lock().await;
    let mut server = RedisServer::start();
    let url = server.url();
    let (tx, rx) = std::sync::mpsc::channel();
    let sale = sale(&url, move || {
        server.stop();
        // real time: Redis is down this long.
        std::thread::sleep(Duration::from_secs(2));
        server.restart();
        let _ = tx.send(server);
    })
    .await;
    let _server = rx.recv().expect("the server");
    assert_within("kill -9, no persistence, 2 s", &sale, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstop_2_s() {
    let _serial = SERIAL.lock().await;
    let server = Arc::new(RedisServer::start());
    let frozen = server.clone();
    let sale = sale(&server.url(), move || {
        frozen.freeze();
        // real time: Redis is frozen (SIGSTOP) this long.
        std::thread::sleep(Duration::from_secs(2));
        frozen.thaw();
    })
    .await;
    assert!(sale.by_fail_mode > 0, "{sale:?}");
    assert_within("SIGSTOP 2 s", &sale, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_pause_2_s() {
    let _serial = SERIAL.lock().await;
    let server = Arc::new(RedisServer::start());
    let paused = server.clone();
    let sale = sale(&server.url(), move || {
        paused.cmd(&["CLIENT", "PAUSE", "2000", "ALL"]).expect("CLIENT PAUSE");
        // real time: redis-server's CLIENT PAUSE lasts this long.
        std::thread::sleep(Duration::from_secs(2));
    })
    .await;
    assert_within("CLIENT PAUSE 2 s", &sale, 0);
}

/// A network that adds `one_way` each way for 2 s (the shipped 50 ms timeout covers a 40 ms round trip).
async fn slow_network(one_way: Duration) -> Sale {
    let server = RedisServer::start();
    let proxy = Arc::new(DelayProxy::start(server.port, Duration::ZERO));
    let slowed = proxy.clone();
    sale(&proxy.url(), move || {
        slowed.set_delay(one_way);
        // real time: the delaying proxy slows the network this long.
        std::thread::sleep(Duration::from_secs(2));
        slowed.set_delay(Duration::ZERO);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_adding_5_ms_each_way() {
    let _serial = SERIAL.lock().await;
    let sale = slow_network(Duration::from_millis(5)).await;
    assert_within("proxy +5 ms each way", &sale, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_adding_20_ms_each_way() {
    let _serial = SERIAL.lock().await;
    let sale = slow_network(Duration::from_millis(20)).await;
    assert_within("proxy +20 ms each way", &sale, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_loses_one_capacity_at_most() {
    let _serial = SERIAL.lock().await;
    let server = Arc::new(RedisServer::start());
    let flushed = server.clone();
    let sale = sale(&server.url(), move || {
        flushed.cmd(&["FLUSHALL"]).expect("FLUSHALL");
    })
    .await;
    assert_within("FLUSHALL", &sale, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush() {
    let _serial = SERIAL.lock().await;
    let server = Arc::new(RedisServer::start());
    let flushed = server.clone();
    let sale = sale(&server.url(), move || {
        flushed.cmd(&["SCRIPT", "FLUSH"]).expect("SCRIPT FLUSH");
    })
    .await;
    assert_within("SCRIPT FLUSH", &sale, 0);
}

/// Out of memory under `noeviction` (the advised policy): writes fail with OOM for 2 s; nothing is evicted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_under_noeviction() {
    let _serial = SERIAL.lock().await;
    let server = Arc::new(RedisServer::start_with(&["--maxmemory-policy", "noeviction"]));
    let full = server.clone();
    let sale = sale(&server.url(), move || {
        full.cmd(&["CONFIG", "SET", "maxmemory", "1"]).expect("CONFIG SET");
        // real time: redis-server refuses writes (OOM) this long.
        std::thread::sleep(Duration::from_secs(2));
        full.cmd(&["CONFIG", "SET", "maxmemory", "0"]).expect("CONFIG SET");
    })
    .await;
    assert!(sale.by_fail_mode > 0, "{sale:?}");
    assert_within("OOM under noeviction 2 s", &sale, 0);
}
