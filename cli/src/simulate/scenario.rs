//! One seed, one schedule: the fleet, the rule, the demand over time and the faults of a `simulate --seed` run,
//! all drawn from the seed alone, so that the same seed replays the same run (FoundationDB's simulator and
//! TigerBeetle's VOPR work this way).

use std::fmt;
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{RngExt as _, SeedableRng as _};
use tokenlease::{Algorithm, FailMode, Lease, Rule};

/// The fail modes that promise the bound, which the seeds search.
pub(super) const MODES: [FailMode; 2] = [FailMode::Closed, FailMode::Local];

/// The limit the run enforces: its rule and what it promises.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Limit {
    /// A token bucket, leased (`ttl` above zero) or not: at most `capacity + rate × (W + ttl)` in any window W.
    TokenBucket {
        capacity: u64,
        /// Tokens a `per`.
        rate: u64,
        per: Duration,
        lease: Option<Lease>,
    },
    /// A sliding log: at most `limit` in any `window`.
    SlidingLog { limit: u64, window: Duration },
    /// A sliding-window counter: at most `limit` in any `sub_buckets` consecutive sub-buckets.
    SlidingWindow {
        limit: u64,
        window: Duration,
        sub_buckets: u64,
    },
    /// A rolling fixed window: at most `limit` in a window, so at most `limit × (⌈L / window⌉ + 1)` in any L.
    FixedWindow { limit: u64, window: Duration },
    /// A leaky-bucket queue (`acquire`): at most `rate × W + 1` releases in any window W, a job of one token.
    LeakyQueue {
        rate: u64,
        per: Duration,
        max_wait: Duration,
    },
}

impl Limit {
    /// The rule, named `r`.
    pub(super) fn rule(&self, mode: FailMode) -> Result<Rule, String> {
        let rule = match self {
            Self::TokenBucket {
                capacity,
                rate,
                per,
                lease,
            } => {
                let rule = Rule::token_bucket("r", *capacity, *rate, *per);
                match lease {
                    Some(lease) => rule.and_then(|r| r.with_lease(*lease)),
                    None => rule,
                }
            }
            Self::SlidingLog { limit, window } => Rule::sliding_log("r", *limit, *window),
            Self::SlidingWindow {
                limit,
                window,
                sub_buckets,
            } => Rule::sliding_window("r", *limit, *window, *sub_buckets),
            Self::FixedWindow { limit, window } => Rule::fixed_window("r", *limit, *window),
            Self::LeakyQueue { rate, per, max_wait } => Rule::leaky_bucket("r", *rate, *per, *max_wait),
        };
        rule.map(|r| r.with_fail_mode(mode)).map_err(|e| e.to_string())
    }

    /// Tokens a second the limit lets through in the long run.
    pub(super) fn rate_per_s(&self) -> f64 {
        match self {
            Self::TokenBucket { rate, per, .. } | Self::LeakyQueue { rate, per, .. } => {
                *rate as f64 / per.as_secs_f64()
            }
            Self::SlidingLog { limit, window }
            | Self::SlidingWindow { limit, window, .. }
            | Self::FixedWindow { limit, window } => *limit as f64 / window.as_secs_f64(),
        }
    }

    /// The limit of a configured rule (a user's own, `--rule`); a calendar window is run as a rolling one and a
    /// ban is left out. `None` for a kind of rule this version of the crate added and the seeds do not know.
    pub(super) fn of(rule: &Rule) -> Option<Self> {
        let window = |ms: u64| Duration::from_millis(ms);
        Some(match &rule.algorithm {
            Algorithm::TokenBucket { bucket, lease, .. } => Self::TokenBucket {
                capacity: bucket.capacity,
                rate: bucket.rate,
                per: window(bucket.per_ms),
                lease: *lease,
            },
            Algorithm::SlidingLog { limit, window_ms, .. } => Self::SlidingLog {
                limit: *limit,
                window: window(*window_ms),
            },
            Algorithm::SlidingWindow {
                limit,
                window_ms,
                sub_buckets,
                ..
            } => Self::SlidingWindow {
                limit: *limit,
                window: window(*window_ms),
                sub_buckets: *sub_buckets,
            },
            Algorithm::FixedWindow { limit, window_ms, .. } => Self::FixedWindow {
                limit: *limit,
                window: window(*window_ms),
            },
            Algorithm::LeakyBucket {
                rate,
                per_ms,
                max_wait_ms,
            } => Self::LeakyQueue {
                rate: *rate,
                per: window(*per_ms),
                max_wait: window(*max_wait_ms),
            },
            _ => return None,
        })
    }

    /// The same limit with its rate multiplied by `factor` (a reload), at least 1 a second.
    pub(super) fn scaled(&self, factor: f64) -> Self {
        let mut limit = self.clone();
        if let Self::TokenBucket { rate, .. } = &mut limit {
            *rate = ((*rate as f64 * factor).round() as u64).max(1);
        }
        limit
    }
}

/// A user's own rule in place of the one a seed draws (`--rule`), and the options that name it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Own {
    pub(super) limit: Limit,
    /// ` --config C --rule R`, for the replay command.
    pub(super) args: String,
}

/// What the command line puts in place of a seed's own draws.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Overrides {
    /// A user's own rule (`--rule`).
    pub(super) own: Option<Own>,
    /// A healthy run (`--healthy`): no faults, and this length in ms (`--duration`) in place of the drawn one.
    /// The fleet, rule, demand steps and joiners are still the seed's: the liveness search without faults.
    pub(super) healthy_ms: Option<u64>,
}

impl Overrides {
    /// The options that replay these overrides, each with a leading space.
    fn args(&self) -> String {
        let own = self.own.as_ref().map_or("", |o| o.args.as_str());
        let healthy = self.healthy_ms.map_or_else(String::new, |ms| {
            let length = humantime::format_duration(Duration::from_millis(ms));
            format!(" --healthy --duration {length}")
        });
        format!("{own}{healthy}")
    }
}

/// What goes wrong, and to whom.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Fault {
    /// The store refuses every call (down).
    StoreRefusing,
    /// The store answers nothing and applies nothing (a black hole).
    StoreHanging,
    /// The store is stopped (`SIGSTOP`): calls queue and run at the thaw.
    StoreFrozen,
    /// The store applies calls and loses their replies.
    StoreLosingReplies,
    /// One process's link carries nothing.
    Partitioned(usize),
    /// One process cannot connect.
    Refused(usize),
    /// One process's round trip grows by this many ms.
    Slow(usize, u64),
    /// One process is stopped (`SIGSTOP`).
    Paused(usize),
    /// One process is killed (`kill -9`) at the start; the end means nothing.
    Killed(usize),
    /// The store's clock steps ahead by this many ms at the start.
    ClockStep(u64),
    /// A replica's copy is taken at the start and the store fails over to it at the end.
    Rollback,
    /// Every process reloads the rule with its rate times this factor at the start.
    Reload(f64),
}

/// A fault from `from` to `until` (ms since the start).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Event {
    pub(super) from_ms: u64,
    pub(super) until_ms: u64,
    pub(super) fault: Fault,
}

/// One run: everything a seed decides.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Scenario {
    /// The named scenario this is (`--scenario`), or `None` for a seed's.
    pub(super) name: Option<&'static str>,
    pub(super) seed: u64,
    pub(super) mode: FailMode,
    pub(super) limit: Limit,
    /// Processes at the start.
    pub(super) processes: usize,
    /// Processes started later: (when, in ms since the start, how many).
    pub(super) joiners: Vec<(u64, usize)>,
    /// `expected_processes` given to every limiter.
    pub(super) expected: u32,
    /// Demand on the key across the fleet: (from, in ms since the start, decisions a second), in order.
    pub(super) demand: Vec<(u64, u64)>,
    /// From a ms on, only the first `n` processes decide (none listed: all of them), in order.
    pub(super) deciders: Vec<(u64, usize)>,
    /// Whether a tenth of the processes (at least one) carries half the demand.
    pub(super) skewed: bool,
    /// The store's round trip, in ms.
    pub(super) rtt_ms: u64,
    pub(super) duration_ms: u64,
    pub(super) faults: Vec<Event>,
    /// The options beyond `--seed` and `--mode` that replay the run (empty: none), from its [`Overrides`].
    pub(super) overrides: String,
}

impl Scenario {
    /// The run of `seed` under `mode` (the seed draws everything else but what `overrides` gives).
    pub(super) fn draw(seed: u64, mode: FailMode, overrides: &Overrides) -> Self {
        let mut rng = SmallRng::seed_from_u64(seed);
        let drawn = draw_limit(&mut rng);
        let limit = overrides.own.as_ref().map_or(drawn, |o| o.limit.clone());
        let processes = [1, 2, 3, 4, 4, 6, 8, 8, 12, 16, 24, 32, 48, 64][rng.random_range(0..14usize)];
        let drawn_ms = rng.random_range(6..=14u64) * 1000;
        // At least 3 s, so that a joiner's time can be drawn.
        let duration_ms = overrides.healthy_ms.map_or(drawn_ms, |ms| ms.max(3000));
        let token_bucket = matches!(limit, Limit::TokenBucket { .. });
        // Window rules are checked to the millisecond on the times their callers learn the answer: the store
        // answers them at once, so that is when it counted them.
        let timed = matches!(limit, Limit::TokenBucket { .. } | Limit::LeakyQueue { .. });
        let rtt_ms = if timed { rng.random_range(0..=3u64) } else { 0 };
        let mut demand = Vec::new();
        let mut at = 0;
        while at < duration_ms {
            let factor = [0.3, 0.8, 1.1, 1.5, 3.0, 10.0][rng.random_range(0..6usize)];
            let per_s = ((limit.rate_per_s() * factor).round() as u64).max(1);
            demand.push((at, per_s));
            at += rng.random_range(1..=5u64) * 1000;
        }
        let mut joiners = Vec::new();
        if rng.random_bool(0.3) {
            joiners.push((
                rng.random_range(500..duration_ms - 2000),
                rng.random_range(1..=processes.max(2)),
            ));
        }
        let total = processes + joiners.iter().map(|(_, n)| n).sum::<usize>();
        let expected = if rng.random_bool(0.7) {
            u32::try_from(processes).unwrap_or(u32::MAX)
        } else {
            rng.random_range(1..=8u32)
        };
        let count = if overrides.healthy_ms.is_some() {
            0
        } else {
            rng.random_range(0..=4usize)
        };
        let faults = (0..count)
            .map(|_| draw_event(&mut rng, total, duration_ms, token_bucket))
            .collect();
        Self {
            name: None,
            seed,
            mode,
            limit,
            processes,
            joiners,
            expected,
            demand,
            deciders: Vec::new(),
            skewed: rng.random_bool(0.3),
            rtt_ms,
            duration_ms,
            faults,
            overrides: overrides.args(),
        }
    }

    /// When the last fault heals (ms since the start; 0 without faults).
    pub(super) fn healed_ms(&self) -> u64 {
        self.faults
            .iter()
            .map(|e| match e.fault {
                Fault::Killed(_) | Fault::ClockStep(_) | Fault::Reload(_) => e.from_ms,
                _ => e.until_ms,
            })
            .chain(self.joiners.iter().map(|(at, _)| *at))
            .max()
            .unwrap_or(0)
    }

    /// The demand at `at_ms`, decisions a second across the fleet.
    pub(super) fn demand_at(&self, at_ms: u64) -> u64 {
        in_force(&self.demand, at_ms).copied().unwrap_or(0)
    }

    /// The first ms after `at_ms` at which the demand or the deciders change (`None`: never again).
    pub(super) fn next_change_after(&self, at_ms: u64) -> Option<u64> {
        let demand = self.demand.iter().map(|(from, _)| *from);
        let deciders = self.deciders.iter().map(|(from, _)| *from);
        demand.chain(deciders).filter(|from| *from > at_ms).min()
    }

    /// How many of the first processes decide at `at_ms` (`None`: all).
    pub(super) fn deciders_at(&self, at_ms: u64) -> Option<usize> {
        in_force(&self.deciders, at_ms).copied()
    }

    /// This scenario with only the faults kept by `keep` (for reducing a failing seed).
    pub(super) fn with_faults(&self, keep: impl Fn(usize) -> bool) -> Self {
        let mut reduced = self.clone();
        reduced.faults = self
            .faults
            .iter()
            .enumerate()
            .filter(|(i, _)| keep(*i))
            .map(|(_, e)| *e)
            .collect();
        reduced
    }
}

/// The value in force at `at_ms` of steps `(from_ms, value)` listed in time order: the last that began by then.
pub(super) fn in_force<T>(steps: &[(u64, T)], at_ms: u64) -> Option<&T> {
    steps
        .iter()
        .take_while(|(from, _)| *from <= at_ms)
        .last()
        .map(|(_, v)| v)
}

fn draw_limit(rng: &mut SmallRng) -> Limit {
    let window = Duration::from_secs(rng.random_range(1..=4u64));
    let limit = rng.random_range(5..=200u64);
    match rng.random_range(0..11u32) {
        0..=3 => {
            let capacity = rng.random_range(10..=2000u64);
            let min_batch = rng.random_range(1..=10u64).min(capacity);
            let max_batch = rng.random_range(min_batch..=capacity.min(500));
            Limit::TokenBucket {
                capacity,
                rate: rng.random_range(10..=1000u64),
                per: Duration::from_secs(1),
                lease: Some(Lease {
                    min_batch,
                    max_batch,
                    ttl: Duration::from_millis(rng.random_range(1..=5u64) * 100),
                    hot_after: rng.random_bool(0.2).then_some(1),
                    reserve: None,
                }),
            }
        }
        4 | 5 => Limit::TokenBucket {
            capacity: rng.random_range(1..=500u64),
            rate: rng.random_range(5..=500u64),
            per: Duration::from_secs(1),
            lease: None,
        },
        6 => Limit::SlidingLog { limit, window },
        7 | 8 => Limit::SlidingWindow {
            limit,
            window,
            sub_buckets: [1, 2, 4, 5, 10][rng.random_range(0..5usize)],
        },
        9 => Limit::FixedWindow { limit, window },
        _ => Limit::LeakyQueue {
            rate: rng.random_range(5..=200u64),
            per: Duration::from_secs(1),
            max_wait: Duration::from_millis(rng.random_range(1..=20u64) * 100),
        },
    }
}

fn draw_event(rng: &mut SmallRng, processes: usize, duration_ms: u64, token_bucket: bool) -> Event {
    let from_ms = rng.random_range(300..duration_ms.saturating_sub(2000).max(301));
    let length = [100, 300, 800, 1500, 3000, 5000][rng.random_range(0..6usize)];
    let until_ms = (from_ms + length).min(duration_ms);
    let p = rng.random_range(0..processes.max(1));
    let kinds = if token_bucket { 12 } else { 10 };
    let fault = match rng.random_range(0..kinds) {
        0 => Fault::StoreRefusing,
        1 => Fault::StoreHanging,
        2 => Fault::StoreFrozen,
        3 => Fault::StoreLosingReplies,
        4 => Fault::Partitioned(p),
        5 => Fault::Refused(p),
        6 => Fault::Paused(p),
        7 => Fault::Killed(p),
        8 => Fault::ClockStep(length),
        9 => Fault::Rollback,
        10 => Fault::Slow(p, [20, 60, 300][rng.random_range(0..3usize)]),
        _ => Fault::Reload([0.1, 0.5, 2.0][rng.random_range(0..3usize)]),
    };
    Event {
        from_ms,
        until_ms,
        fault,
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name {
            Some(name) => write!(f, "scenario {name}")?,
            None => write!(f, "seed {}", self.seed)?,
        }
        writeln!(
            f,
            " fail_mode {} | {} processes (expected_processes {}){} | rtt {} ms | {} s",
            self.mode.as_str(),
            self.processes,
            self.expected,
            if self.skewed {
                ", a tenth carry half the demand"
            } else {
                ""
            },
            self.rtt_ms,
            self.duration_ms / 1000
        )?;
        writeln!(f, "  rule: {:?}", self.limit)?;
        let demand: Vec<String> = self
            .demand
            .iter()
            .map(|(at, d)| format!("{:.1}s {d}/s", *at as f64 / 1000.0))
            .collect();
        writeln!(f, "  demand: {}", demand.join(", "))?;
        for (at, n) in &self.deciders {
            writeln!(
                f,
                "  {:.1}s on: only the first {n} processes decide",
                *at as f64 / 1000.0
            )?;
        }
        for (at, n) in &self.joiners {
            writeln!(f, "  {:.1}s: {n} processes start", *at as f64 / 1000.0)?;
        }
        for e in &self.faults {
            writeln!(
                f,
                "  {:.1}s-{:.1}s: {:?}",
                e.from_ms as f64 / 1000.0,
                e.until_ms as f64 / 1000.0,
                e.fault
            )?;
        }
        Ok(())
    }
}
