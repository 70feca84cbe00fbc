//! `tokenlease flash-sale`: P worker processes × T tasks call `check` on one hot key as fast as they can.
//!
//! The coordinator picks a store (the configured Redis if it answers, else a private `redis-server` on a free
//! loopback port, else the in-process store in one process), re-spawns itself as workers that start together,
//! merges their counts and latency histograms, and checks invariant 1: admitted ≤ capacity + rate × (span + ttl).

use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use hdrhistogram::serialization::{Deserializer, Serializer, V2Serializer};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use tokenlease::{Algorithm, Config, Limiter, Rule};

/// Options of `flash-sale`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Worker processes.
    #[arg(long, default_value_t = 4)]
    processes: u32,
    /// Tokio tasks per process, each calling `check` in a tight loop.
    #[arg(long, default_value_t = 32)]
    tasks: u32,
    /// How long to run (humantime: 10s, 1m).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Cold per-user keys checked beside the hot key (0: none).
    #[arg(long, default_value_t = 0)]
    users: u32,
    /// The rule (default: the first token_bucket rule with a lease).
    #[arg(long)]
    rule: Option<String>,
    /// Config file.
    #[arg(long, default_value = "config.toml")]
    config: PathBuf,
    /// Redis URL (overrides the config); `memory` forces the in-process store.
    #[arg(long)]
    redis: Option<String>,
    /// One store call per decision (the baseline): the rule's lease is removed.
    #[arg(long)]
    no_lease: bool,
    /// Print one JSON object on the last line.
    #[arg(long)]
    json: bool,
}

/// The rule's limits as the report states them, and the most it may admit on one key over a span.
struct Limits {
    /// Tokens: a bucket's capacity, a window's limit.
    capacity: u64,
    /// Tokens per second over the long run.
    rate_per_s: f64,
    lease_ttl_s: f64,
    /// `None` for a token bucket; the window in seconds and the extra windows a span may touch otherwise.
    window: Option<(f64, f64)>,
}

impl Limits {
    fn of(algorithm: &Algorithm, no_lease: bool) -> Option<Self> {
        let window = |limit: u64, window_ms: u64, extra: f64| Limits {
            capacity: limit,
            rate_per_s: limit as f64 * 1000.0 / window_ms as f64,
            lease_ttl_s: 0.0,
            window: Some((window_ms as f64 / 1000.0, extra)),
        };
        Some(match algorithm {
            Algorithm::TokenBucket { bucket, lease, .. } => Limits {
                capacity: bucket.capacity,
                rate_per_s: bucket.rate as f64 * 1000.0 / bucket.per_ms as f64,
                lease_ttl_s: if no_lease {
                    0.0
                } else {
                    lease.map_or(0.0, |l| l.ttl.as_secs_f64())
                },
                window: None,
            },
            // Any window-long span holds at most `limit`.
            Algorithm::SlidingLog { limit, window_ms, .. } => window(*limit, *window_ms, 0.0),
            // A span crosses one window boundary more than it holds windows.
            Algorithm::FixedWindow { limit, window_ms, .. } => window(*limit, *window_ms, 1.0),
            // The counter forgets a sub-bucket early: one more window's worth at worst.
            Algorithm::SlidingWindow { limit, window_ms, .. } => window(*limit, *window_ms, 1.0),
            _ => return None,
        })
    }

    /// Invariant 1 for a token bucket: capacity + rate × (span + lease ttl); for a window rule:
    /// limit × (⌈span / window⌉ + extra).
    fn bound(&self, span_s: f64) -> f64 {
        match self.window {
            None => self.capacity as f64 + self.rate_per_s * (span_s + self.lease_ttl_s),
            Some((w, extra)) => self.capacity as f64 * ((span_s / w).ceil().max(1.0) + extra),
        }
    }
}

/// What a worker is told to do.
#[derive(Debug, Serialize, Deserialize)]
struct Spec {
    /// 0 for the first worker, which serves `[metrics] listen` when the config sets it.
    index: u32,
    config: PathBuf,
    redis: Option<String>,
    rule: String,
    key: String,
    tasks: u32,
    users: u32,
    duration_ms: u64,
    start_at_ms: u64,
    no_lease: bool,
}

/// What a worker reports.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Report {
    attempts: u64,
    admitted: u64,
    rejected: u64,
    errors: u64,
    /// Decisions made by the rule's fail_mode because the store failed or timed out.
    fallback: u64,
    user_attempts: u64,
    user_admitted: u64,
    redis_calls: u64,
    leased_tokens: u64,
    returned_tokens: u64,
    first_us: u64,
    last_us: u64,
    histogram: String,
}

fn epoch_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(0))
}

fn load_config(path: &PathBuf, redis: Option<&str>) -> Result<Config, String> {
    let mut config = if path.exists() {
        Config::from_path(path).map_err(|e| e.to_string())?
    } else {
        Config::from_toml(include_str!("../../../config.toml")).map_err(|e| e.to_string())?
    };
    match (redis, config.redis.as_mut()) {
        (Some("memory"), _) => config.redis = None,
        (Some(url), Some(r)) => r.url = url.to_owned(),
        (Some(url), None) => {
            let toml = format!("[redis]\nurl = \"{url}\"\n");
            config.redis = Config::from_toml(&toml).map_err(|e| e.to_string())?.redis;
        }
        (None, _) => {}
    }
    Ok(config)
}

fn pick_rule(config: &Config, name: Option<&str>) -> Result<Rule, String> {
    match name {
        Some(n) => config
            .rule(n)
            .cloned()
            .ok_or_else(|| format!("no rule `{n}` in the config")),
        None => config
            .rules
            .iter()
            .find(|r| matches!(r.algorithm, Algorithm::TokenBucket { .. }) && r.lease().is_some())
            .cloned()
            .ok_or_else(|| "the config has no token_bucket rule with a lease; name one with --rule".into()),
    }
}

/// A private `redis-server` on a free loopback port, stopped on drop.
struct PrivateRedis {
    child: std::process::Child,
    url: String,
    _dir: PathBuf,
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self._dir);
    }
}

fn free_port() -> Result<u16, String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    listener.local_addr().map(|a| a.port()).map_err(|e| e.to_string())
}

fn start_private_redis(rt: &tokio::runtime::Runtime) -> Option<PrivateRedis> {
    let port = free_port().ok()?;
    let dir = std::env::temp_dir().join(format!("tokenlease-flash-{}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let child = std::process::Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let server = PrivateRedis {
        child,
        url: format!("redis://127.0.0.1:{port}"),
        _dir: dir,
    };
    for _ in 0..100 {
        if rt.block_on(reachable(&server.url)) {
            return Some(server);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

async fn reachable(url: &str) -> bool {
    let Ok(store) = tokenlease::RedisStore::connect(url, Duration::from_millis(300)) else {
        return false;
    };
    use tokenlease::Store as _;
    store.ping().await.is_ok()
}

/// The coordinator.
pub fn run(args: Args) -> Result<ExitCode, String> {
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let config = load_config(&args.config, args.redis.as_deref())?;
    let rule = pick_rule(&config, args.rule.as_deref())?;
    let limits = Limits::of(&rule.algorithm, args.no_lease).ok_or_else(|| {
        format!(
            "rule `{}` is {}: flash-sale runs token_bucket and window rules",
            rule.name,
            rule.algorithm.name()
        )
    })?;
    let lease_ttl_s = limits.lease_ttl_s;
    if args.processes == 0 || args.tasks == 0 {
        return Err("--processes and --tasks must be at least 1".into());
    }

    // Pick the store.
    let mut private = None;
    let mut processes = args.processes;
    // The simulation runs on one server; a cluster's nodes are not used (a private server is started instead).
    let configured = config
        .redis
        .as_ref()
        .map(|r| r.url.clone())
        .filter(|url| !url.is_empty());
    let force_memory = args.redis.as_deref() == Some("memory");
    let (store_desc, url) = match configured {
        _ if force_memory => {
            processes = 1;
            ("in-process (memory)".to_owned(), None)
        }
        Some(url) if rt.block_on(reachable(&url)) => (format!("redis {url}"), Some(url)),
        other => {
            if let Some(url) = &other {
                eprintln!("redis at {url} does not answer");
            }
            match start_private_redis(&rt) {
                Some(server) => {
                    let url = server.url.clone();
                    eprintln!("started a private redis-server at {url}");
                    private = Some(server);
                    (format!("private redis-server {url}"), Some(url))
                }
                None => {
                    eprintln!("no redis-server found: using the in-process store in one process");
                    processes = 1;
                    ("in-process (memory)".to_owned(), None)
                }
            }
        }
    };

    let run_id = epoch_us();
    let start_at_ms = epoch_us() / 1000 + 1500;
    let spec = |index: u32| Spec {
        index,
        config: args.config.clone(),
        redis: Some(url.clone().unwrap_or_else(|| "memory".into())),
        rule: rule.name.clone(),
        key: format!("flash:{run_id}"),
        tasks: args.tasks,
        users: args.users,
        duration_ms: u64::try_from(args.duration.as_millis()).unwrap_or(u64::MAX),
        start_at_ms,
        no_lease: args.no_lease,
    };

    let progress = indicatif::ProgressBar::new(args.duration.as_secs().max(1));
    progress.set_draw_target(indicatif::ProgressDrawTarget::stderr());
    progress.set_style(
        indicatif::ProgressStyle::with_template("{spinner} flash sale {elapsed}/{len}s [{bar:30}] {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    progress.set_message(format!("{processes} processes × {} tasks on {store_desc}", args.tasks));

    let reports: Vec<Report> = if url.is_none() {
        let ticker = spawn_ticker(&rt, progress.clone(), start_at_ms);
        let report = rt.block_on(run_worker(spec(0)))?;
        ticker.abort();
        vec![report]
    } else {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut children = Vec::new();
        for i in 0..processes {
            let json = serde_json::to_string(&spec(i)).map_err(|e| e.to_string())?;
            let child = std::process::Command::new(&exe)
                .args(["flash-sale-worker", "--spec", &json])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| format!("cannot start a worker: {e}"))?;
            children.push(child);
        }
        let ticker = spawn_ticker(&rt, progress.clone(), start_at_ms);
        let mut reports = Vec::new();
        for child in children {
            let out = child.wait_with_output().map_err(|e| e.to_string())?;
            let text = String::from_utf8_lossy(&out.stdout);
            let line = text.lines().last().unwrap_or_default();
            if !out.status.success() {
                return Err(format!("a worker failed ({}): {line}", out.status));
            }
            reports.push(serde_json::from_str(line).map_err(|e| format!("bad worker report `{line}`: {e}"))?);
        }
        ticker.abort();
        reports
    };
    progress.finish_and_clear();
    drop(private);

    // Merge.
    let mut hist = new_histogram()?;
    let mut total = Report {
        first_us: u64::MAX,
        ..Report::default()
    };
    for r in &reports {
        total.attempts += r.attempts;
        total.admitted += r.admitted;
        total.rejected += r.rejected;
        total.errors += r.errors;
        total.fallback += r.fallback;
        total.user_attempts += r.user_attempts;
        total.user_admitted += r.user_admitted;
        total.redis_calls += r.redis_calls;
        total.leased_tokens += r.leased_tokens;
        total.returned_tokens += r.returned_tokens;
        if r.attempts > 0 {
            total.first_us = total.first_us.min(r.first_us);
            total.last_us = total.last_us.max(r.last_us);
        }
        hist.add(decode_histogram(&r.histogram)?).map_err(|e| e.to_string())?;
    }
    let span_s = total.last_us.saturating_sub(total.first_us.min(total.last_us)) as f64 / 1e6;
    let (rate_per_s, bound) = (limits.rate_per_s, limits.bound(span_s));
    let decisions_per_s = if span_s > 0.0 {
        (total.attempts + total.user_attempts) as f64 / span_s
    } else {
        0.0
    };
    let q = |p: f64| hist.value_at_quantile(p) as f64 / 1000.0;
    let within = total.admitted as f64 <= bound;

    println!(
        "flash sale on rule `{}` ({}), store: {store_desc}",
        rule.name,
        if rule.lease().is_some() && !args.no_lease {
            "leased"
        } else {
            "one store call per decision"
        }
    );
    println!("  processes × tasks     {processes} × {}", args.tasks);
    println!("  span                  {span_s:.3} s");
    println!(
        "  capacity, rate        {} tokens, {rate_per_s} /s (lease ttl {lease_ttl_s} s)",
        limits.capacity
    );
    println!("  attempts              {}", total.attempts);
    println!(
        "  admitted              {} ({:.1} % of the bound {bound:.0})",
        total.admitted,
        100.0 * total.admitted as f64 / bound
    );
    println!("  rejected              {}", total.rejected);
    if total.fallback > 0 {
        println!(
            "  decided by fail_mode  {} (the store failed or timed out)",
            total.fallback
        );
    }
    if total.errors > 0 {
        println!("  errors                {}", total.errors);
    }
    if args.users > 0 {
        println!(
            "  user keys             {} attempts, {} admitted over {} users",
            total.user_attempts, total.user_admitted, args.users
        );
    }
    println!(
        "  redis calls           {} ({:.4} per admitted)",
        total.redis_calls,
        total.redis_calls as f64 / total.admitted.max(1) as f64
    );
    println!("  decisions/s           {decisions_per_s:.0}");
    println!(
        "  latency p50/p99/p999  {:.2} / {:.2} / {:.2} µs",
        q(0.5),
        q(0.99),
        q(0.999)
    );
    println!(
        "  invariant             {}",
        if within {
            "admitted ≤ bound: ok"
        } else {
            "ADMITTED MORE THAN THE BOUND"
        }
    );
    if args.json {
        let json = serde_json::json!({
            "store": store_desc,
            "rule": rule.name,
            "lease": !args.no_lease,
            "processes": processes,
            "tasks": args.tasks,
            "span_s": span_s,
            "capacity": limits.capacity,
            "rate_per_s": rate_per_s,
            "lease_ttl_s": lease_ttl_s,
            "attempts": total.attempts,
            "admitted": total.admitted,
            "rejected": total.rejected,
            "errors": total.errors,
            "fallback": total.fallback,
            "user_attempts": total.user_attempts,
            "user_admitted": total.user_admitted,
            "bound": bound,
            "redis_calls": total.redis_calls,
            "leased_tokens": total.leased_tokens,
            "returned_tokens": total.returned_tokens,
            "decisions_per_s": decisions_per_s,
            "latency_us": { "p50": q(0.5), "p99": q(0.99), "p999": q(0.999) },
        });
        println!("{json}");
    }
    Ok(if within { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn spawn_ticker(
    rt: &tokio::runtime::Runtime,
    progress: indicatif::ProgressBar,
    start_at_ms: u64,
) -> tokio::task::JoinHandle<()> {
    rt.spawn(async move {
        loop {
            let now_ms = epoch_us() / 1000;
            progress.set_position(now_ms.saturating_sub(start_at_ms) / 1000);
            progress.tick();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

fn new_histogram() -> Result<Histogram<u64>, String> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).map_err(|e| e.to_string())
}

fn decode_histogram(b64: &str) -> Result<Histogram<u64>, String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| e.to_string())?;
    Deserializer::new()
        .deserialize(&mut bytes.as_slice())
        .map_err(|e| e.to_string())
}

/// A worker process.
pub fn worker(spec: &str) -> Result<ExitCode, String> {
    let spec: Spec = serde_json::from_str(spec).map_err(|e| format!("bad --spec: {e}"))?;
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    let report = rt.block_on(run_worker(spec))?;
    println!("{}", serde_json::to_string(&report).map_err(|e| e.to_string())?);
    Ok(ExitCode::SUCCESS)
}

async fn run_worker(spec: Spec) -> Result<Report, String> {
    let mut config = load_config(&spec.config, spec.redis.as_deref())?;
    if spec.no_lease {
        for rule in &mut config.rules {
            if let Algorithm::TokenBucket { lease, .. } = &mut rule.algorithm {
                *lease = None;
            }
        }
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
    let deadline = Instant::now() + Duration::from_millis(spec.duration_ms);
    let spec = Arc::new(spec);
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..spec.tasks {
        let (limiter, spec) = (limiter.clone(), spec.clone());
        tasks.spawn(async move { run_task(&limiter, &spec, t, deadline).await });
    }
    let mut report = Report {
        first_us: u64::MAX,
        ..Report::default()
    };
    let mut hist = new_histogram()?;
    while let Some(joined) = tasks.join_next().await {
        let (r, h) = joined.map_err(|e| e.to_string())??;
        report.attempts += r.attempts;
        report.admitted += r.admitted;
        report.rejected += r.rejected;
        report.errors += r.errors;
        report.fallback += r.fallback;
        report.user_attempts += r.user_attempts;
        report.user_admitted += r.user_admitted;
        report.first_us = report.first_us.min(r.first_us);
        report.last_us = report.last_us.max(r.last_us);
        hist.add(h).map_err(|e| e.to_string())?;
    }
    limiter.shutdown().await;
    let stats = limiter.stats();
    report.redis_calls = stats.store_calls;
    report.leased_tokens = stats.leased_tokens;
    report.returned_tokens = stats.returned_tokens;
    let mut bytes = Vec::new();
    V2Serializer::new()
        .serialize(&hist, &mut bytes)
        .map_err(|e| e.to_string())?;
    report.histogram = base64::engine::general_purpose::STANDARD.encode(bytes);
    Ok(report)
}

async fn run_task(
    limiter: &Limiter,
    spec: &Spec,
    task: u32,
    deadline: Instant,
) -> Result<(Report, Histogram<u64>), String> {
    let mut r = Report {
        first_us: epoch_us(),
        ..Report::default()
    };
    let mut hist = new_histogram()?;
    let mut i: u64 = 0;
    loop {
        let started = Instant::now();
        if started >= deadline {
            break;
        }
        i += 1;
        if spec.users > 0 && i.is_multiple_of(8) {
            let user = (i / 8 + u64::from(task) * 7919) % u64::from(spec.users);
            r.user_attempts += 1;
            if let Ok(d) = limiter.check(&spec.rule, &format!("user:{user}"), 1).await {
                r.user_admitted += u64::from(d.allowed);
            }
            continue;
        }
        r.attempts += 1;
        match limiter.check(&spec.rule, &spec.key, 1).await {
            Ok(d) => {
                r.admitted += u64::from(d.allowed);
                r.rejected += u64::from(!d.allowed);
                r.fallback += u64::from(d.source == tokenlease::Source::Fallback);
            }
            Err(_) => r.errors += 1,
        }
        let took = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        hist.saturating_record(took.max(1));
        if i.is_multiple_of(64) {
            tokio::task::yield_now().await;
        }
    }
    r.last_us = epoch_us();
    Ok((r, hist))
}
