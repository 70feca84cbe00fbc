//! A rule as the limiter runs it: the rule, its fail mode, its metric handles, the keys it leases into this
//! process and the order of its queues' callers. Built once per rule (and again on a reload that changes it).

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use dashmap::DashMap;

use crate::clock::Clock;
use crate::decision::Decision;
use crate::lease::bucket::LocalBucket;
use crate::lease::heat::Heat;
use crate::lease::shards::Counts;
use crate::rule::{Algorithm, FailMode, Rule};
use crate::telemetry::{RuleMetrics, Series};

/// A map keyed by strings with a fast hasher.
pub(crate) type KeyMap<V> = DashMap<String, V, foldhash::fast::RandomState>;

/// One key's queue in this process: the order in which its callers reserve slots (tokio's mutex is fair, so
/// they are served first-in first-out), and the reserved slots that callers gave up while someone was queued
/// behind them (the store keeps those: moving them would move everyone behind), which later callers of this
/// process take over instead of reserving new ones behind.
#[derive(Debug, Default)]
pub(crate) struct Line {
    pub(crate) turn: tokio::sync::Mutex<()>,
    pub(crate) abandoned: std::sync::Mutex<Vec<Abandoned>>,
}

/// A reserved slot whose caller gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Abandoned {
    /// When the slot comes.
    pub(crate) at: tokio::time::Instant,
    /// Its tokens.
    pub(crate) cost: u64,
    /// Where it was reserved: the store (a slot `open` grants while the store fails comes at once: never waited
    /// for, never given up).
    pub(crate) source: crate::decision::Source,
}

impl Line {
    /// The slots given up, with the passed ones dropped.
    pub(crate) fn abandoned(&self) -> std::sync::MutexGuard<'_, Vec<Abandoned>> {
        let mut slots = self.abandoned.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = tokio::time::Instant::now();
        slots.retain(|s| s.at > now);
        slots
    }

    /// Takes over the earliest slot given up for `cost` tokens that comes within `max_wait`.
    pub(crate) fn take_over(&self, cost: u64, max_wait: Duration) -> Option<Abandoned> {
        let mut slots = self.abandoned();
        let latest = tokio::time::Instant::now() + max_wait;
        let (i, _) = slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.cost == cost && s.at <= latest)
            .min_by_key(|(_, s)| s.at)?;
        Some(slots.swap_remove(i))
    }

    /// Offers a slot given up to the next callers.
    pub(crate) fn abandon(&self, slot: Abandoned) {
        self.abandoned().push(slot);
    }

    /// Whether nobody waits and no slot given up is still ahead: the line may be forgotten.
    pub(crate) fn is_idle(&self) -> bool {
        self.abandoned().is_empty()
    }
}

/// The series `rule` can produce (a rule without a lease has no lease series).
fn series(rule: &Rule) -> Series {
    let algorithms = || std::iter::once(&rule.algorithm).chain(rule.overrides.iter().map(|o| &o.algorithm));
    Series {
        leases: algorithms().any(|a| matches!(a, Algorithm::TokenBucket { lease: Some(_), .. })),
        queue: algorithms().any(|a| matches!(a, Algorithm::TokenBucket { .. } | Algorithm::LeakyBucket { .. })),
        shadow: rule.shadow,
    }
}

/// The next [`Compiled::generation`]: 0 is never handed out.
static NEXT_GENERATION: AtomicU64 = AtomicU64::new(1);

/// The last [`Compiled::adopted_ms`] handed out in this process.
static LAST_ADOPTED_MS: AtomicU64 = AtomicU64::new(0);

/// An instant to adopt parameters at: `clock`'s [`Clock::wall_ms`], after every instant this process handed out
/// before (so a reload after the system clock stepped back still supersedes what it replaces, here and in the
/// store).
pub(crate) fn adopted_now(clock: &dyn Clock) -> u64 {
    let wall = clock.wall_ms();
    let last = LAST_ADOPTED_MS.fetch_max(wall, Ordering::Relaxed);
    if wall > last {
        return wall;
    }
    LAST_ADOPTED_MS.fetch_add(1, Ordering::Relaxed) + 1
}

/// A rule as the limiter runs it.
#[derive(Debug)]
pub(crate) struct Compiled {
    /// Unique for the life of the process, never reused (unlike the compiled rule's address, which a rule
    /// compiled after this one was dropped may get): what caches outside the limiter key this rule by
    /// (`nearby.rs`, invariant 20).
    pub(crate) generation: u64,
    /// When this process adopted the rule's parameters (ms since the Unix epoch, [`adopted_now`]): its start, or
    /// the reload that changed the rule. Sent with every token-bucket call; the bucket's hash keeps the latest it
    /// saw, and a call adopted earlier reads the bucket in the hash's parameters rather than overwrite them
    /// (invariant 11).
    pub(crate) adopted_ms: u64,
    pub(crate) rule: Rule,
    pub(crate) fail_mode: FailMode,
    pub(crate) metrics: RuleMetrics,
    /// Leased tokens per hot key (rules with a lease only).
    pub(crate) leases: KeyMap<Arc<LocalBucket>>,
    /// Recent decisions of the keys that do not lease, to find the hot ones (made on the first).
    pub(crate) heat: OnceLock<Heat>,
    /// The hasher of keys for [`Compiled::heat`].
    hasher: foldhash::fast::RandomState,
    /// The smallest capacity of the rule and its overrides: a cost up to it needs no per-key check.
    pub(crate) min_capacity: u64,
    /// Replaced by a reload or gone with its limiter: a handle on it resolves its rule again.
    pub(crate) retired: AtomicBool,
    /// The rule (or one of its overrides) leases.
    pub(crate) leased: bool,
    /// Per key, this process's queue of `acquire` callers.
    pub(crate) queues: KeyMap<Arc<Line>>,
    /// Callers of this rule waiting in a queue now.
    pub(crate) waiting: AtomicI64,
}

impl Drop for Compiled {
    /// The rule's limiter (or the reload that replaced it) let it go: its buckets are retired, so that a thread's
    /// cache that still holds one (`nearby.rs`) never answers from it. Their tokens are lost with the rule
    /// (a limiter dropped without [`crate::Limiter::shutdown`] gives nothing back).
    fn drop(&mut self) {
        for entry in self.leases.iter() {
            entry.value().retire();
        }
    }
}

impl Compiled {
    /// Compiles `rule`, adopted at `adopted_ms` ([`adopted_now`]); its own fail mode wins over `default_mode`.
    /// Registers its metric handles.
    pub(crate) fn new(rule: Rule, default_mode: FailMode, adopted_ms: u64) -> Self {
        let capacities = std::iter::once(&rule.algorithm)
            .chain(rule.overrides.iter().map(|o| &o.algorithm))
            .map(Algorithm::capacity);
        let fail_mode = rule.fail_mode.unwrap_or(default_mode);
        let series = series(&rule);
        Self {
            generation: NEXT_GENERATION.fetch_add(1, Ordering::Relaxed),
            adopted_ms,
            leased: series.leases,
            min_capacity: capacities.min().unwrap_or(0),
            heat: OnceLock::new(),
            hasher: foldhash::fast::RandomState::default(),
            retired: AtomicBool::new(false),
            fail_mode,
            metrics: RuleMetrics::new(&rule.name, series),
            leases: KeyMap::default(),
            queues: KeyMap::default(),
            waiting: AtomicI64::new(0),
            rule,
        }
    }

    /// The hash of a key for [`Compiled::heat`].
    pub(crate) fn hash(&self, key: &str) -> u64 {
        self.hasher.hash_one(key)
    }

    /// Whether a reload replaced this rule (or its limiter shut down).
    #[inline]
    pub(crate) fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// Applies shadow mode to a decision its key's shards counted already (`lease/shards.rs`).
    #[inline]
    pub(crate) fn shadowed(&self, mut decision: Decision) -> Decision {
        if self.rule.shadow && !decision.allowed {
            decision.allowed = true;
            decision.shadowed = true;
            decision.retry_after = Duration::ZERO;
        }
        decision
    }

    /// Adds the decisions a key's shards counted to the metrics (a shadow rule's refusals as `shadow_rejected`).
    pub(crate) fn flush(&self, counts: Counts) {
        self.metrics
            .local_decisions(counts.allowed, counts.refused, self.rule.shadow);
    }

    /// Counts a decision and applies shadow mode: a shadow rule's refusal is counted as `shadow_rejected` and
    /// returned as an allowance.
    #[inline]
    pub(crate) fn record(&self, decision: Decision) -> Decision {
        if self.rule.shadow && !decision.allowed {
            self.metrics.shadow_rejected(decision.source);
        } else {
            self.metrics.decision(decision.allowed, decision.source);
        }
        self.shadowed(decision)
    }
}
