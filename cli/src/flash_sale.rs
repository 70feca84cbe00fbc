//! `tokenlease flash-sale`: P worker processes × T tasks call `check` on one hot key as fast as they can, or with
//! `--keys N --zipf S` on N SKUs drawn Zipf-distributed.
//!
//! The coordinator picks a store (the configured Redis if it answers, else a private `redis-server` on a free
//! loopback port, else the in-process store in one process), re-spawns itself as workers that start together,
//! merges their counts and latency histograms, and checks invariant 1 on every key: admitted ≤ capacity + rate ×
//! (span + ttl).

mod keys;
mod limits;
mod private_redis;
mod report;
mod summary;
mod worker;

use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokenlease::{redact_url, Algorithm, Config, Rule};

use limits::Limits;
use private_redis::{reachable, start_private_redis};
use report::Report;
pub use worker::worker;
use worker::{run_worker, Spec};

/// Options of `flash-sale`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Worker processes.
    #[arg(long, default_value_t = 4)]
    processes: u32,
    /// Tokio tasks per process, each calling `check` in a tight loop (or once per `--every`).
    #[arg(long, default_value_t = 32)]
    tasks: u32,
    /// Paces each task to one decision per this interval (humantime: 10ms), as a client fleet's requests arrive,
    /// instead of a tight loop. A decision that takes longer delays the next; missed ticks are not made up.
    #[arg(long, value_parser = parse_every)]
    every: Option<Duration>,
    /// How long to run (humantime: 10s, 1m).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Cold per-user keys checked beside the hot key (0: none).
    #[arg(long, default_value_t = 0)]
    users: u32,
    /// SKUs: each decision's key is drawn from this many (`sku:{run}:{i}`, at most 10^6) instead of one hot key.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=i64::from(keys::MAX_KEYS)))]
    keys: Option<u32>,
    /// The Zipf exponent of the SKU draw (with --keys): 0 is uniform, 1.1 a few hot SKUs and a long cold tail.
    #[arg(long, default_value_t = 0.0, requires = "keys")]
    zipf: f64,
    /// The rule (default: the first token_bucket rule with a lease).
    #[arg(long)]
    rule: Option<String>,
    /// Config file.
    #[arg(long, default_value = "config.toml")]
    config: PathBuf,
    /// Redis URL (overrides the config); `memory` forces the in-process store.
    #[arg(long)]
    redis: Option<String>,
    /// One store call per decision (the baseline): the rule's lease is removed and no refusal is remembered.
    #[arg(long)]
    no_lease: bool,
    /// Keys whose store refusal each process remembers until its retry_after (overrides `[process]
    /// max_refused_keys`; 0: every refusal is a store call).
    #[arg(long)]
    max_refused_keys: Option<usize>,
    /// Print one JSON object on the last line.
    #[arg(long)]
    json: bool,
}

/// `--every`: a humantime duration of at least a microsecond.
fn parse_every(text: &str) -> Result<Duration, String> {
    let every = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if every < Duration::from_micros(1) {
        return Err("--every must be at least 1us".into());
    }
    Ok(every)
}

fn epoch_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(0))
}

/// The config at `path` (the shipped config.toml when there is none), with `redis` (a URL, or `memory`) in place of
/// its `[redis]` section when given.
pub(crate) fn load_config(path: &PathBuf, redis: Option<&str>) -> Result<Config, String> {
    let mut config = if path.exists() {
        Config::from_path(path).map_err(|e| e.to_string())?
    } else {
        Config::from_toml(include_str!("../../config.toml")).map_err(|e| e.to_string())?
    };
    match (redis, config.redis.as_mut()) {
        (Some("memory"), _) => config.redis = None,
        (Some(url), Some(r)) => {
            r.url = url.to_owned();
            r.cluster.clear();
            r.sentinel = None;
        }
        (Some(url), None) => {
            let toml = format!("[redis]\nurl = \"{url}\"\n");
            config.redis = Config::from_toml(&toml).map_err(|e| e.to_string())?.redis;
        }
        (None, _) => {}
    }
    Ok(config)
}

/// The rule named `name`, or the config's first token_bucket rule with a lease.
pub(crate) fn pick_rule(config: &Config, name: Option<&str>) -> Result<Rule, String> {
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
    if args.processes == 0 || args.tasks == 0 {
        return Err("--processes and --tasks must be at least 1".into());
    }
    if !(args.zipf.is_finite() && args.zipf >= 0.0) {
        return Err(format!("--zipf {}: the exponent must be a number ≥ 0", args.zipf));
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
        Some(url) if rt.block_on(reachable(&url)) => (format!("redis {}", redact_url(&url)), Some(url)),
        other => {
            if let Some(url) = &other {
                eprintln!("redis at {} does not answer", redact_url(url));
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

    // `[redis] require_noeviction` is checked once here, rather than by every worker.
    if let (Some(url), Some(true)) = (&url, config.redis.as_ref().map(|r| r.require_noeviction)) {
        let config = load_config(&args.config, Some(url))?;
        rt.block_on(async { tokenlease::Limiter::from_config(config).map(drop) })
            .map_err(|e| e.to_string())?;
    }

    let run_id = epoch_us();
    let start_at_ms = epoch_us() / 1000 + 1500;
    let spec = |index: u32| Spec {
        index,
        config: args.config.clone(),
        redis: Some(url.clone().unwrap_or_else(|| "memory".into())),
        rule: rule.name.clone(),
        key: format!("flash:{run_id}"),
        run_id,
        keys: args.keys,
        zipf: args.zipf,
        tasks: args.tasks,
        every_us: args.every.map(|e| u64::try_from(e.as_micros()).unwrap_or(u64::MAX)),
        users: args.users,
        duration_ms: u64::try_from(args.duration.as_millis()).unwrap_or(u64::MAX),
        start_at_ms,
        no_lease: args.no_lease,
        max_refused_keys: if args.no_lease { Some(0) } else { args.max_refused_keys },
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

    let (total, hist) = report::merge(&reports)?;
    let bound = limits.bound(total.span_s());
    let keys = match args.keys {
        Some(n) => {
            let counts = reports.iter().filter_map(|r| r.keys.as_ref());
            Some(keys::figures(n, counts, bound)?)
        }
        None => None,
    };
    let run = summary::Run {
        args: &args,
        rule: &rule,
        limits: &limits,
        store_desc: &store_desc,
        processes,
        keys: keys.as_ref(),
    };
    let within = summary::print(&run, &total, &hist);
    Ok(if within { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Moves the progress bar to the seconds elapsed since the workers' start, every 200 ms, until aborted.
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
