//! A worker process (`tokenlease flash-sale-worker --spec <json>`): its tasks call `check` on the hot key (or on
//! SKUs drawn from `--keys`), and cold user keys beside it, until the deadline; it prints its report as JSON on its
//! last line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tokenlease::{Algorithm, Limiter};

use super::keys::{SkuDraw, Tally};
use super::report::{encode_histogram, new_histogram, Report};
use super::{epoch_us, load_config};

/// What a worker is told to do.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Spec {
    /// 0 for the first worker, which serves `[metrics] listen` when the config sets it.
    pub(super) index: u32,
    pub(super) config: PathBuf,
    pub(super) redis: Option<String>,
    pub(super) rule: String,
    /// The hot key, when `keys` is `None`.
    pub(super) key: String,
    /// Names the SKUs `sku:{run_id}:{i}` and seeds their draws.
    pub(super) run_id: u64,
    /// With `--keys`: the number of SKUs each decision's key is drawn from.
    pub(super) keys: Option<u32>,
    /// The Zipf exponent of the draw (0: uniform).
    pub(super) zipf: f64,
    pub(super) tasks: u32,
    /// With `--every`: each task's interval between decisions, in µs (`None`: a tight loop).
    #[serde(default)]
    pub(super) every_us: Option<u64>,
    pub(super) users: u32,
    pub(super) duration_ms: u64,
    pub(super) start_at_ms: u64,
    pub(super) no_lease: bool,
    /// Overrides `[process] max_refused_keys`.
    pub(super) max_refused_keys: Option<usize>,
}

/// A worker process.
pub fn worker(spec: &str) -> Result<ExitCode, String> {
    let spec: Spec = serde_json::from_str(spec).map_err(|e| format!("bad --spec: {e}"))?;
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let report = rt.block_on(run_worker(spec))?;
    println!("{}", serde_json::to_string(&report).map_err(|e| e.to_string())?);
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn run_worker(spec: Spec) -> Result<Report, String> {
    let mut config = load_config(&spec.config, spec.redis.as_deref())?;
    if spec.no_lease {
        for rule in &mut config.rules {
            if let Algorithm::TokenBucket { lease, .. } = &mut rule.algorithm {
                *lease = None;
            }
        }
    }
    if let Some(n) = spec.max_refused_keys {
        config.process.max_refused_keys = n;
    }
    if let (0, Some(metrics)) = (spec.index, &config.metrics) {
        // A busy port must not stop the run: say so and go on without an exporter.
        if let Err(e) = crate::install_exporter(metrics.listen) {
            eprintln!("{e}");
        }
    }
    let limiter = Limiter::from_config(config).map_err(|e| e.to_string())?;
    let wait_ms = spec.start_at_ms.saturating_sub(epoch_us() / 1000);
    tokio::time::sleep(Duration::from_millis(wait_ms)).await;
    let tally = spec.keys.map(|n| Arc::new(Tally::new(n)));
    let mut draws = Vec::new();
    for t in 0..spec.tasks {
        draws.push(match spec.keys {
            Some(n) => {
                // A seed per run, process and task.
                let seed = spec.run_id ^ (u64::from(spec.index) << 32 | u64::from(t));
                Some(SkuDraw::new(spec.run_id, n, spec.zipf, seed)?)
            }
            None => None,
        });
    }
    let deadline = Instant::now() + Duration::from_millis(spec.duration_ms);
    let spec = Arc::new(spec);
    let mut tasks = tokio::task::JoinSet::new();
    for (t, draw) in (0..spec.tasks).zip(draws) {
        let (limiter, spec) = (limiter.clone(), spec.clone());
        let skus = draw.zip(tally.clone());
        tasks.spawn(async move { run_task(&limiter, &spec, t, skus, deadline).await });
    }
    let mut report = Report {
        first_us: u64::MAX,
        ..Report::default()
    };
    let mut hist = new_histogram()?;
    while let Some(joined) = tasks.join_next().await {
        let (r, h) = joined.map_err(|e| e.to_string())??;
        report.add_decisions(&r);
        report.first_us = report.first_us.min(r.first_us);
        report.last_us = report.last_us.max(r.last_us);
        hist.add(h).map_err(|e| e.to_string())?;
    }
    // Read before the shutdown gives them back.
    let before = limiter.stats();
    limiter.shutdown().await;
    let stats = limiter.stats();
    report.pending_tokens = before.pending_tokens;
    report.reserved_tokens = before.reserved_tokens;
    report.redis_calls = stats.store_calls;
    report.leased_tokens = stats.leased_tokens;
    report.returned_tokens = stats.returned_tokens;
    report.refusals_answered = stats.refusals_answered;
    report.peak_rss_kib = peak_rss_kib();
    report.fail_mode_errors = stats.fail_mode_errors;
    report.fail_mode_timeouts = stats.fail_mode_timeouts;
    report.fail_mode_circuit_open = stats.fail_mode_circuit_open;
    report.histogram = encode_histogram(&hist)?;
    report.keys = tally.map(|t| t.counts());
    Ok(report)
}

/// This process's peak resident memory in KiB, from `/proc/self/status` (0 where there is none).
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

async fn run_task(
    limiter: &Limiter,
    spec: &Spec,
    task: u32,
    mut skus: Option<(SkuDraw, Arc<Tally>)>,
    deadline: Instant,
) -> Result<(Report, Histogram<u64>), String> {
    let mut r = Report {
        first_us: epoch_us(),
        ..Report::default()
    };
    let mut hist = new_histogram()?;
    let mut pace = spec.every_us.map(|us| {
        // Tasks start spread over the interval (a golden-ratio stride by process and task), not all on one tick.
        let seat = u64::from(spec.index) * u64::from(spec.tasks) + u64::from(task);
        let offset_us = (seat.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % us;
        let first = tokio::time::Instant::now() + Duration::from_micros(offset_us);
        let mut pace = tokio::time::interval_at(first, Duration::from_micros(us));
        pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        pace
    });
    let mut i: u64 = 0;
    loop {
        i += 1;
        if let Some(pace) = &mut pace {
            pace.tick().await;
        }
        let user_turn = spec.users > 0 && i.is_multiple_of(8);
        // With `--keys`, the SKU is drawn before the clock starts: the latency is the decision's alone.
        let (sku, key) = match &mut skus {
            Some((draw, _)) if !user_turn => {
                let (index, key) = draw.next();
                (Some(index), key)
            }
            _ => (None, spec.key.as_str()),
        };
        let started = Instant::now();
        if started >= deadline {
            break;
        }
        if user_turn {
            let user = (i / 8 + u64::from(task) * 7919) % u64::from(spec.users);
            r.user_attempts += 1;
            if let Ok(d) = limiter.check(&spec.rule, &format!("user:{user}"), 1).await {
                r.user_admitted += u64::from(d.allowed);
            }
            continue;
        }
        r.attempts += 1;
        match limiter.check(&spec.rule, key, 1).await {
            Ok(d) => {
                r.admitted += u64::from(d.allowed);
                r.rejected += u64::from(!d.allowed);
                match d.source {
                    tokenlease::Source::Local => r.by_lease += 1,
                    tokenlease::Source::Fallback => r.fallback += 1,
                    _ => r.by_store += 1,
                }
                if let (Some(index), Some((_, tally))) = (sku, &skus) {
                    tally.record(index, d.allowed, d.source == tokenlease::Source::Local);
                }
            }
            Err(_) => r.errors += 1,
        }
        let took = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        hist.saturating_record(took.max(1));
        if pace.is_none() && i.is_multiple_of(64) {
            tokio::task::yield_now().await;
        }
    }
    r.last_us = epoch_us();
    Ok((r, hist))
}
