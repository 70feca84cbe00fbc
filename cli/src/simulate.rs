//! `tokenlease simulate`: P limiters of this crate in one process, on virtual (paused) time, sharing one in-process
//! store that answers each call after a round trip. It is the real engine (leases, turns, give-backs) and the
//! real store math, so its figures are those the engine gives: what a user runs to size a sale before it starts.
//!
//! Demand: `--demand` decisions per second across the fleet on one key, spread evenly over the processes, each
//! process deciding at its own steady pace (one decision per tick, or a few per millisecond above 1000/s). A
//! decision that waits (for a lease) is left to finish on its own task, so a waiting caller never holds back the
//! process's other callers. Every allowed decision is put in a timeline at its virtual time (`timeline.rs`);
//! the store calls of every limiter are summed once a virtual second; `report.rs` turns both into the figures.

mod check;
mod fleet;
mod named;
mod report;
mod scenario;
mod seeds;
mod timeline;

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokenlease::{Algorithm, Clock, Decision, Error, FailMode, Limiter, MemoryStore, Rule, RuleHandle, TokioClock};

use report::{Figures, Setup};
use tokenlease_timeline::Timeline;

/// Options of `simulate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Processes: limiters of this crate sharing the store, as processes share a Redis.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    processes: u32,
    /// Runs the fleet, rule, demand and faults that this seed draws (`--rule` with `--config`: that rule
    /// instead; the other options but `--mode`, `--healthy` with `--duration`, `--min-sell` and `--json` are not
    /// used), checks every window and the sell-through after healing, and prints the schedule and the command
    /// that replays it. The same seed gives the same run.
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// Runs a named scenario: one of the paths over the bound that reviews found (`all`: every one; the list
    /// is in docs/ARCHITECTURE.md, Known limits), checked as a seed's run.
    #[arg(long, conflicts_with_all = ["seed", "seeds"])]
    scenario: Option<String>,
    /// Runs every seed of a range `A..B` (B excluded) on every core, and prints the failing ones reduced to the
    /// fewest faults that still fail; exits 1 when one failed.
    #[arg(long)]
    seeds: Option<String>,
    /// With `--seed`/`--seeds`: the fail mode (`closed` or `local`; default: each seed under both).
    #[arg(long, value_parser = parse_mode)]
    mode: Option<FailMode>,
    /// With `--seed`/`--seeds`: each seed's fleet, rule, demand and joiners without faults, for `--duration`
    /// (the liveness search of a healthy fleet: with `--min-sell`, none may sell less).
    #[arg(long)]
    healthy: bool,
    /// With `--seeds`: the least share of what could sell that a fleet must sell once its faults healed.
    #[arg(long, default_value_t = 0.0)]
    min_sell: f64,
    /// `expected_processes` given to every limiter (left out: the limiter's default, as with no setting).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    expected: Option<u32>,
    /// The round trip to the store, in milliseconds, rounded up to whole ones (tokio's timer counts whole ms).
    #[arg(long, default_value_t = 1.0)]
    rtt: f64,
    /// How long the sale lasts, in virtual time (humantime: 10s, 1m).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Decisions per second on the key, across the whole fleet, spread evenly over the processes (the default
    /// saturates the shipped rule 100 times over).
    #[arg(long, default_value_t = 100_000)]
    demand: u64,
    /// Skewed demand: a tenth of the processes (at least one) carry half of `--demand`, the others the other half.
    #[arg(long)]
    skew: bool,
    /// The rule (default: the first token_bucket rule with a lease).
    #[arg(long)]
    rule: Option<String>,
    /// Config file (missing: the shipped config.toml); its `[redis]` section is not used.
    #[arg(long, default_value = "config.toml")]
    config: PathBuf,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

impl Args {
    /// Whether the run is a schedule of faults (`--seed`, `--seeds`, `--scenario`).
    pub fn is_seeded(&self) -> bool {
        self.seed.is_some() || self.seeds.is_some() || self.scenario.is_some()
    }
}

/// The key every process decides: one hot SKU.
const KEY: &str = "sku:sale";

/// Runs the simulation and prints its figures; exits 1 when a window admitted more than its bound.
pub fn run(args: Args) -> Result<ExitCode, String> {
    let overrides = scenario::Overrides {
        own: own_rule(&args)?,
        healthy_ms: args
            .healthy
            .then(|| u64::try_from(args.duration.as_millis()).unwrap_or(u64::MAX)),
    };
    let modes = seeds::modes(args.mode);
    if let Some(seed) = args.seed {
        let drawn = modes.iter().map(|m| scenario::Scenario::draw(seed, *m, &overrides));
        return seeds::run_each(drawn.collect(), args.json);
    }
    if let Some(name) = &args.scenario {
        let names: Vec<&str> = if name == "all" {
            named::NAMES.iter().map(|(n, _)| *n).collect()
        } else {
            vec![name.as_str()]
        };
        let mut scenarios = Vec::new();
        for name in names {
            for mode in &modes {
                scenarios.push(named::scenario(name, *mode)?);
            }
        }
        return seeds::run_each(scenarios, args.json);
    }
    if let Some(range) = &args.seeds {
        return seeds::run_range(
            seeds::parse_range(range)?,
            &modes,
            &overrides,
            (args.min_sell, args.json),
        );
    }
    let config = crate::flash_sale::load_config(&args.config, Some("memory"))?;
    let rule = crate::flash_sale::pick_rule(&config, args.rule.as_deref())?;
    if args.demand == 0 || args.duration.is_zero() {
        return Err("--demand must be at least 1 decision per second, and --duration above 0".into());
    }
    // Whole milliseconds: a shorter wait would last one anyway on tokio's clock.
    let rtt = Duration::try_from_secs_f64(args.rtt.ceil() / 1000.0)
        .map_err(|_| format!("--rtt {}: a round trip in milliseconds, 0 or more", args.rtt))?;
    let setup = setup(&args, &rule, rtt)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let real = std::time::Instant::now();
    let mut figures = runtime.block_on(simulate(&args, rule, rtt, &setup))?;
    figures.real_s = real.elapsed().as_secs_f64();
    if args.json {
        println!("{}", report::json(&setup, &figures));
    } else {
        report::print(&setup, &figures);
    }
    Ok(if figures.worst.ratio <= 1.0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// With `--seed`/`--seeds`, the rule named by `--rule` (in `--config`) in place of the seeds' own.
fn own_rule(args: &Args) -> Result<Option<scenario::Own>, String> {
    let Some(name) = args.rule.as_deref() else {
        return Ok(None);
    };
    if !args.is_seeded() || args.scenario.is_some() {
        return Ok(None);
    }
    let config = crate::flash_sale::load_config(&args.config, Some("memory"))?;
    let rule = config
        .rule(name)
        .ok_or_else(|| format!("no rule `{name}` in {}", args.config.display()))?;
    let limit = scenario::Limit::of(rule)
        .ok_or_else(|| format!("rule `{name}` is a leaky-bucket queue: the seeds do not run queues yet"))?;
    Ok(Some(scenario::Own {
        limit,
        args: format!(" --config {} --rule {name}", args.config.display()),
    }))
}

fn parse_mode(text: &str) -> Result<FailMode, String> {
    match text {
        "closed" => Ok(FailMode::Closed),
        "local" => Ok(FailMode::Local),
        "open" => Ok(FailMode::Open),
        _ => Err(format!("`{text}`: closed, local or open")),
    }
}

/// The run's parameters as the report states them, from the options and the rule.
fn setup(args: &Args, rule: &Rule, rtt: Duration) -> Result<Setup, String> {
    let Algorithm::TokenBucket { bucket, lease, .. } = &rule.algorithm else {
        return Err(format!(
            "rule `{}` is {}: simulate runs token_bucket rules",
            rule.name,
            rule.algorithm.name()
        ));
    };
    Ok(Setup {
        processes: args.processes,
        expected: args.expected,
        rtt_ms: rtt.as_secs_f64() * 1000.0,
        duration: args.duration,
        demand_per_s: args.demand,
        skew: args.skew,
        rule: rule.name.clone(),
        capacity: bucket.capacity,
        rate_per_s: bucket.rate as f64 * 1000.0 / bucket.per_ms as f64,
        lease: lease.map(|l| (l.min_batch, l.max_batch)),
        ttl: lease.map_or(Duration::ZERO, |l| l.ttl),
    })
}

/// Counts shared by the processes' tasks.
#[derive(Debug, Default)]
struct Counts {
    decisions: AtomicU64,
    errors: AtomicU64,
}

/// The sale itself, inside the paused runtime.
async fn simulate(args: &Args, rule: Rule, rtt: Duration, setup: &Setup) -> Result<Figures, String> {
    let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
    let store = Arc::new(MemoryStore::with_clock(clock.clone()).with_latency(rtt));
    let mut limiters = Vec::new();
    let mut handles = Vec::new();
    for _ in 0..args.processes {
        let mut builder = Limiter::builder()
            .rule(rule.clone())
            .store(store.clone())
            .clock(clock.clone());
        if let Some(n) = args.expected {
            builder = builder.expected_processes(n);
        }
        let limiter = builder.build().map_err(|e| e.to_string())?;
        handles.push(limiter.rule(&rule.name).map_err(|e| e.to_string())?);
        limiters.push(limiter);
    }

    let start = tokio::time::Instant::now();
    let timeline = Arc::new(timeline::for_sale(args.duration));
    let counts = Arc::new(Counts::default());
    let mut drivers = tokio::task::JoinSet::new();
    for (i, handle) in handles.into_iter().enumerate() {
        let pace = Pace::new(per_process(args, i));
        let phase = pace.tick.mul_f64(i as f64 / f64::from(args.processes));
        let driver = Driver {
            handle,
            start,
            end: start + args.duration,
            timeline: timeline.clone(),
            counts: counts.clone(),
        };
        drivers.spawn(driver.run(pace, phase));
    }

    // The fleet's counters at every virtual second, from 0 to the end of the sale.
    let mut fleet_at = vec![Fleet::of(&limiters)];
    let seconds = (1..).map(Duration::from_secs).take_while(|s| *s < args.duration);
    for at in seconds.chain([args.duration]) {
        tokio::time::sleep_until(start + at).await;
        fleet_at.push(Fleet::of(&limiters));
    }
    while drivers.join_next().await.is_some() {}
    let at_end = Fleet::of(&limiters);
    let counted = limiters.first().map_or(0, |l| l.processes(&setup.rule));
    for limiter in &limiters {
        limiter.shutdown().await;
    }
    let admitted = timeline::admitted(&timeline, args.duration);
    Ok(Figures {
        decisions: counts.decisions.load(Ordering::Relaxed),
        errors: counts.errors.load(Ordering::Relaxed),
        admitted: admitted.iter().sum(),
        calls_at: fleet_at.iter().map(|f| f.calls).collect(),
        ops_at: fleet_at.iter().map(|f| f.ops).collect(),
        leased_by_second: Fleet::per_second(&fleet_at, |f| f.leased),
        returned_by_second: Fleet::per_second(&fleet_at, |f| f.returned),
        admitted_by_second: timeline::per_second(&admitted),
        worst: timeline::worst_window(&admitted, (setup.capacity, setup.rate_per_s, setup.ttl)),
        leased: at_end.leased,
        returned: at_end.returned,
        pending: at_end.pending,
        reserved: at_end.reserved,
        fail_mode: at_end.fail_mode,
        beats: fleet_at.last().map_or(0, |f| f.beats) - fleet_at.first().map_or(0, |f| f.beats),
        counted,
        real_s: 0.0,
    })
}

/// The fleet's counters summed over its limiters ([`Limiter::stats`]).
#[derive(Debug, Clone, Copy, Default)]
struct Fleet {
    /// Store calls: leases, give-backs and the decisions of keys not hot yet.
    calls: u64,
    /// Tokens leased from the store, and given back unused.
    leased: u64,
    returned: u64,
    /// Tokens of paced leases not yet released, and held in reserves (`local`), at the sample.
    pending: u64,
    reserved: u64,
    /// Decisions made by `fail_mode`.
    fail_mode: u64,
    /// The fleet's beats (not in `calls`).
    beats: u64,
    /// Store operations (beats included) by [`Kind`].
    ops: [u64; Kind::ALL.len()],
}

/// A kind of store operation, as `simulate` counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A lease (`token_lease`).
    Lease,
    /// A give-back of unused tokens (`token_return`).
    GiveBack,
    /// A decision of a key that does not lease (`token_bucket`).
    Check,
    /// A beat of the fleet's roster (`fleet`).
    Beat,
    /// Anything else (a queue's or a window's charge, a reset...).
    Other,
}

impl Kind {
    pub(crate) const ALL: [Kind; 5] = [Self::Lease, Self::GiveBack, Self::Check, Self::Beat, Self::Other];

    /// The kind of a call of the script named `script`.
    fn of(script: &str) -> Self {
        match script {
            "token_lease" => Self::Lease,
            "token_return" => Self::GiveBack,
            "token_bucket" => Self::Check,
            "fleet" => Self::Beat,
            _ => Self::Other,
        }
    }

    /// The name in the report.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Lease => "lease",
            Self::GiveBack => "give_back",
            Self::Check => "check",
            Self::Beat => "beat",
            Self::Other => "other",
        }
    }
}

impl Fleet {
    fn of(limiters: &[Limiter]) -> Self {
        let mut fleet = Self::default();
        for limiter in limiters {
            let s = limiter.stats();
            fleet.calls += s.store_calls;
            fleet.leased += s.leased_tokens;
            fleet.returned += s.returned_tokens;
            fleet.pending += s.pending_tokens;
            fleet.reserved += s.reserved_tokens;
            fleet.fail_mode += s.fail_mode_errors + s.fail_mode_timeouts + s.fail_mode_circuit_open;
            fleet.beats += s.beats;
            for (script, n) in limiter.store_calls_by_script() {
                fleet.ops[Kind::of(script) as usize] += n;
            }
        }
        fleet
    }

    /// How much a counter grew in each second of the samples.
    fn per_second(samples: &[Fleet], counter: impl Fn(&Fleet) -> u64) -> Vec<u64> {
        samples.windows(2).map(|w| counter(&w[1]) - counter(&w[0])).collect()
    }
}

/// The decisions per second process `i` makes: `--demand` over the processes, or with `--skew` half of it over
/// the first tenth of them (at least one) and half over the rest.
fn per_process(args: &Args, i: usize) -> f64 {
    let demand = args.demand as f64;
    match skewed_half(i, args.processes as usize, args.skew) {
        Some(sharing) => demand / 2.0 / sharing as f64,
        None => demand / f64::from(args.processes),
    }
}

/// A skewed demand's split, the same for `simulate --skew` and the seeds' skewed fleets: the first tenth of
/// `processes` (at least one) carry half of it, the others the other half. `Some(n)`: process `i` shares its
/// half with `n − 1` others; `None`: the demand is spread evenly (not skewed, or a single process).
fn skewed_half(i: usize, processes: usize, skewed: bool) -> Option<usize> {
    let heavy = (processes / 10).max(1);
    if !skewed || heavy >= processes {
        return None;
    }
    Some(if i < heavy { heavy } else { processes - heavy })
}

/// How a process spreads its share of the demand: a tick every `tick` (at least 1 ms, more when the process
/// decides under 1000 times a second), `per_tick` decisions each, the fraction carried over.
#[derive(Debug, Clone, Copy)]
struct Pace {
    tick: Duration,
    per_tick: f64,
}

impl Pace {
    fn new(per_process: f64) -> Self {
        let tick = Duration::try_from_secs_f64((1.0 / per_process).max(0.001)).unwrap_or(Duration::from_secs(1));
        Self {
            tick,
            per_tick: per_process * tick.as_secs_f64(),
        }
    }
}

/// One process's callers.
struct Driver {
    handle: RuleHandle,
    start: tokio::time::Instant,
    end: tokio::time::Instant,
    timeline: Arc<Timeline>,
    counts: Arc<Counts>,
}

impl Driver {
    /// Decides at the pace until the end of the sale; then waits for its decisions still waiting.
    async fn run(self, pace: Pace, phase: Duration) {
        let mut ticks = tokio::time::interval_at(self.start + phase, pace.tick);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut owed = 0.0;
        let mut waiting = Vec::new();
        loop {
            let now = ticks.tick().await;
            if now >= self.end {
                break;
            }
            owed += pace.per_tick;
            // (A tick rounded to the nanosecond may owe 0.999999... of a decision: it is one.)
            while owed > 1.0 - 1e-9 {
                owed -= 1.0;
                let handle = self.handle.clone();
                let mut check: Pin<Box<dyn Future<Output = _> + Send>> =
                    Box::pin(async move { handle.check(KEY, 1).await });
                // Most decisions are answered at once; one that waits finishes on a task of its own.
                match std::future::poll_fn(|cx| Poll::Ready(check.as_mut().poll(cx))).await {
                    Poll::Ready(result) => self.record(result),
                    Poll::Pending => {
                        let (timeline, counts, start) = (self.timeline.clone(), self.counts.clone(), self.start);
                        waiting.push(tokio::spawn(async move {
                            let result = check.await;
                            record(&timeline, &counts, start, result);
                        }));
                    }
                }
            }
            waiting.retain(|task: &tokio::task::JoinHandle<()>| !task.is_finished());
        }
        for task in waiting {
            let _ = task.await;
        }
    }

    fn record(&self, result: Result<Decision, Error>) {
        record(&self.timeline, &self.counts, self.start, result);
    }
}

/// Counts a decision, and puts it in the timeline at its virtual time if it was allowed.
fn record(timeline: &Timeline, counts: &Counts, start: tokio::time::Instant, result: Result<Decision, Error>) {
    counts.decisions.fetch_add(1, Ordering::Relaxed);
    match result {
        Ok(d) if d.allowed => timeline.record_at(start.elapsed(), 1),
        Ok(_) => {}
        Err(_) => {
            counts.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}
