//! The chaos suite for window rules under `fail_mode = "local"` (invariant 16): four limiters (four
//! "processes", `expected_processes = 4`) hammer one key of a calendar fixed window and one key of a sliding
//! log, both 100 per 2 s, on a real `redis-server`, while a fault is injected mid-run: a kill -9 for 3 s with
//! `--appendonly yes --appendfsync always` (Redis keeps what it had), or a SIGSTOP for 2 s. Each run asserts that
//! no window ever held more than its limit, no panic, and that every limiter decides from Redis again by itself.
//!
//! Admissions are recorded with the wall-clock span of their call, `[sent, answered]`: the decision (by Redis's
//! `TIME` or the process's clock, which agree on a loopback server) lies in it. The fixed window is checked per
//! calendar window, a call straddling two windows counted in whichever keeps the count lower (as long as there is
//! room); the log in every span of its length, counting the calls that surely lie in it. The worst ratio of each
//! run is printed (`cargo test --release --test chaos_windows -- --nocapture`).
//!
//! The runs take the machine's two cores in turn (one at a time), so that one run's load is not another's fault.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::RedisServer;
use tokenlease::{FailMode, Limiter, Rule, Source};

/// Both rules: 100 per 2 s.
const LIMIT: u64 = 100;
const WINDOW: Duration = Duration::from_secs(2);
const PROCESSES: u32 = 4;
/// Tasks per limiter and rule.
const TASKS: usize = 2;
/// The shipped `[redis] timeout`.
const TIMEOUT: Duration = Duration::from_millis(50);
/// When the fault starts, and how long the run goes on after it is healed.
const BEFORE: Duration = Duration::from_millis(2500);
const AFTER: Duration = Duration::from_millis(4000);

/// One run at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn rules() -> [Rule; 2] {
    [
        // Calendar windows of 2 s from the Unix epoch (UTC), so the test can cut them as Redis does.
        Rule::calendar_window("fixed", LIMIT, WINDOW, "+00:00")
            .expect("rule")
            .with_fail_mode(FailMode::Local),
        Rule::sliding_log("log", LIMIT, WINDOW)
            .expect("rule")
            .with_fail_mode(FailMode::Local),
    ]
}

/// Milliseconds since the Unix epoch on the wall clock (Redis's `TIME` on this machine).
fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Admissions as `(sent, answered)` in wall-clock ms.
#[derive(Debug, Default)]
struct Admissions(Mutex<Vec<(i64, i64)>>);

impl Admissions {
    fn record(&self, sent: i64, answered: i64) {
        self.0.lock().expect("lock").push((sent, answered));
    }

    fn spans(&self) -> Vec<(i64, i64)> {
        let mut v = self.0.lock().expect("lock").clone();
        v.sort_unstable();
        v
    }

    /// The most admitted in one calendar window of `w` ms: a call straddling a boundary goes to the earlier
    /// window while it has room, else to the later one (the assignment that keeps every window lowest).
    fn worst_calendar_window(&self, w: i64) -> (u64, i64) {
        let mut inside = std::collections::BTreeMap::<i64, u64>::new();
        let mut straddling = std::collections::BTreeMap::<i64, u64>::new();
        for (sent, answered) in self.spans() {
            let (a, b) = (sent.div_euclid(w), answered.div_euclid(w));
            if b == a + 1 {
                *straddling.entry(a).or_default() += 1;
            } else {
                // Inside one window (a call longer than a window, counted at its end, cannot happen here).
                *inside.entry(b).or_default() += 1;
            }
        }
        let (Some(first), Some(last)) = (
            inside.keys().chain(straddling.keys()).copied().min(),
            inside.keys().copied().chain(straddling.keys().map(|k| k + 1)).max(),
        ) else {
            return (0, 0);
        };
        let (mut worst, mut worst_at, mut carried) = (0, 0, 0);
        for k in first..=last {
            let mut count = inside.get(&k).copied().unwrap_or(0) + carried;
            let next = straddling.get(&k).copied().unwrap_or(0);
            let room = LIMIT.saturating_sub(count);
            count += next.min(room);
            carried = next - next.min(room);
            if count > worst {
                (worst, worst_at) = (count, k * w);
            }
        }
        (worst, worst_at)
    }

    /// The most admitted within any span of `w` ms, counting the calls whose whole `[sent, answered]` lies in
    /// `[start, start + w)` (their decisions surely do), for every start.
    fn worst_span(&self, w: i64) -> (u64, i64) {
        let spans = self.spans();
        let mut worst = (0, 0);
        for (i, &(start, _)) in spans.iter().enumerate() {
            let n = spans[i..]
                .iter()
                .take_while(|(sent, _)| *sent < start + w)
                .filter(|(_, answered)| *answered < start + w)
                .count() as u64;
            if n > worst.0 {
                worst = (n, start);
            }
        }
        worst
    }
}

/// What a run saw.
struct Run {
    fixed: Arc<Admissions>,
    log: Arc<Admissions>,
    by_fail_mode: u64,
}

/// Runs both rules on `url` for [`BEFORE`], then `fault` (which injects the fault, waits, heals it), then
/// [`AFTER`]; then checks that every limiter decides from Redis again within 5 s.
async fn run<F>(url: &str, fault: F) -> Run
where
    F: FnOnce() + Send + 'static,
{
    let limiters: Vec<Limiter> = (0..PROCESSES)
        .map(|_| {
            common::limiter(rules())
                .redis_url(url)
                .timeout(TIMEOUT)
                .expected_processes(PROCESSES)
                .build()
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let (fixed, log) = (Arc::new(Admissions::default()), Arc::new(Admissions::default()));
    let by_fail_mode = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for limiter in &limiters {
        for (rule, admissions) in [("fixed", &fixed), ("log", &log)] {
            for _ in 0..TASKS {
                let (limiter, stop, admissions) = (limiter.clone(), stop.clone(), admissions.clone());
                let by_fail_mode = by_fail_mode.clone();
                tasks.spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let sent = wall_ms();
                        let d = limiter.check(rule, "user:7", 1).await.expect("a decision");
                        if d.allowed {
                            admissions.record(sent, wall_ms());
                        }
                        if d.source == Source::Fallback {
                            by_fail_mode.fetch_add(1, Ordering::Relaxed);
                        }
                        // real time: a steady load, about a call per millisecond per task.
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                });
            }
        }
    }
    // real time: the fault is done to a real process.
    tokio::time::sleep(BEFORE).await;
    tokio::task::spawn_blocking(fault).await.expect("the fault ran");
    // real time: the run goes on against the healed redis-server.
    tokio::time::sleep(AFTER).await;
    stop.store(true, Ordering::Relaxed);
    while let Some(joined) = tasks.join_next().await {
        joined.expect("no panic");
    }
    for limiter in &limiters {
        recovers(limiter).await;
        limiter.shutdown().await;
    }
    Run {
        fixed,
        log,
        by_fail_mode: by_fail_mode.load(Ordering::Relaxed),
    }
}

/// The limiter decides both rules from Redis again within 5 s.
async fn recovers(limiter: &Limiter) {
    let deadline = Instant::now() + Duration::from_secs(5);
    for rule in ["fixed", "log"] {
        loop {
            let d = limiter.check(rule, "recovery", 1).await.expect("a decision");
            if d.source == Source::Redis {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{rule}: still not deciding from Redis 5 s after the fault ({d:?})"
            );
            // real time: waits for the healed server.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Prints the worst window of each rule and asserts that none held more than the limit. (Before 2026-11-28 each
/// process sold a share of the window it last saw alone, and processes that saw it a few ms apart held up to
/// 102 of 100 together: the runs were asserted within the limit plus one per process.)
fn assert_within(name: &str, run: &Run) {
    let w = i64::try_from(WINDOW.as_millis()).expect("ms");
    let (fixed, fixed_at) = run.fixed.worst_calendar_window(w);
    let (log, log_at) = run.log.worst_span(w);
    let total = |a: &Admissions| a.spans().len();
    eprintln!(
        "{name}: fixed window worst {fixed} of {LIMIT} ({:.2}x, the window from {fixed_at} ms), sliding log worst \
         {log} of {LIMIT} ({:.2}x, the span from {log_at} ms); {} and {} admitted, {} decisions by fail_mode",
        fixed as f64 / LIMIT as f64,
        log as f64 / LIMIT as f64,
        total(&run.fixed),
        total(&run.log),
        run.by_fail_mode
    );
    assert!(run.by_fail_mode > 0, "{name}: the fault was decided by fail_mode");
    assert!(fixed <= LIMIT, "{name}: a fixed window held {fixed} > {LIMIT}");
    assert!(log <= LIMIT, "{name}: the log held {log} > {LIMIT} in {WINDOW:?}");
    // The run did admit: at least the limit in most windows of the healthy stretches.
    let healthy = (BEFORE + AFTER).as_secs_f64() / WINDOW.as_secs_f64();
    for (rule, n) in [("fixed", total(&run.fixed)), ("log", total(&run.log))] {
        assert!(
            n as f64 >= (healthy - 2.0) * LIMIT as f64,
            "{name}: {rule} admitted too little: {n}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_kill_9_with_appendfsync_always_down_3_s() {
    let _serial = SERIAL.lock().await;
    let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let url = server.url();
    let (tx, rx) = std::sync::mpsc::channel();
    let run = run(&url, move || {
        server.stop();
        // real time: Redis is down this long.
        std::thread::sleep(Duration::from_secs(3));
        server.restart();
        let _ = tx.send(server);
    })
    .await;
    let _server = rx.recv().expect("the server");
    assert_within("windows, kill -9, AOF always, 3 s", &run);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_sigstop_2_s() {
    let _serial = SERIAL.lock().await;
    let server = Arc::new(RedisServer::start());
    let frozen = server.clone();
    let run = run(&server.url(), move || {
        frozen.freeze();
        // real time: Redis is frozen this long.
        std::thread::sleep(Duration::from_secs(2));
        frozen.thaw();
    })
    .await;
    assert_within("windows, SIGSTOP 2 s", &run);
}
