//! Building a [`Limiter`]: in code with [`LimiterBuilder`], or from a validated [`Config`]; and rebuilding its
//! rules on a hot reload ([`Limiter::reload`]): a new configuration's rules are compiled, checked, and swapped in
//! whole (arc-swap), so calls in flight finish under the rules they started with and a bad reload changes nothing.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use dashmap::DashMap;

use super::{lifecycle, Inner, Limiter, RuleMap};
use crate::background::Background;
use crate::clock::{Clock, MonotonicClock, Recent};
use crate::compiled::Compiled;
use crate::config::{self, Config, ProcessConfig, RedisConfig};
use crate::error::Error;
use crate::fallback::Fallback;
use crate::fleet::Fleet;
use crate::lease::engine::Engine;
use crate::queue::Queue;
use crate::refusals::Refusals;
use crate::rule::{self, FailMode, Rule};
use crate::store::call::Members;
use crate::store::guarded::Guarded;
use crate::store::{eviction, MemoryStore, RedisStore, Store};
use crate::telemetry;
use crate::timings::Timings;

/// Builds a [`Limiter`] in code.
#[derive(Debug, Default)]
pub struct LimiterBuilder {
    rules: Vec<Rule>,
    store: Option<Arc<dyn Store>>,
    clock: Option<Arc<dyn Clock>>,
    fail_mode: FailMode,
    key_prefix: Option<String>,
    expected_processes: Option<u32>,
    timeout: Option<Duration>,
    process: ProcessConfig,
    redis: Option<RedisConfig>,
    member: Option<String>,
    /// The hot path's clock reading stands still (tests of a stopped process).
    #[cfg(test)]
    stalled: bool,
}

impl LimiterBuilder {
    /// The hot path's reading of the clock stands still from the build on, as a ticker thread's does in a
    /// process stopped and resumed before the thread runs again (tests).
    #[cfg(test)]
    pub(crate) fn stalled_clock(mut self) -> Self {
        self.stalled = true;
        self
    }

    /// Adds a rule.
    pub fn rule(mut self, rule: Rule) -> Self {
        self.rules.push(rule);
        self
    }

    /// Adds rules.
    pub fn rules(mut self, rules: impl IntoIterator<Item = Rule>) -> Self {
        self.rules.extend(rules);
        self
    }

    /// The store (default: a [`MemoryStore`] on the builder's clock).
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// The clock of lease deadlines and local refusals (default: the monotonic clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// What to do when the store fails, for rules that do not say (default `closed`: refuse what the store did
    /// not grant before the fault).
    pub fn fail_mode(mut self, mode: FailMode) -> Self {
        self.fail_mode = mode;
        self
    }

    /// Prefix of every store key (default `tl`).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = Some(prefix.into());
        self
    }

    /// Processes assumed to share a leased rule (default 4) until its roster in the store first answers; from
    /// then on the live count kept there ([`Limiter::processes`]). The count divides a hot key's fair share of
    /// the burst (the most a lease takes while the shared bucket is not saturated) and, under `fail_mode =
    /// "local"`, its reserve; in a large fleet a key's first lease on a spent bucket waits to measure its demand.
    pub fn expected_processes(mut self, processes: u32) -> Self {
        self.expected_processes = Some(processes);
        self
    }

    /// The store's call timeout, which bounds how long a caller waits on a lease (default 50 ms).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// This limiter's name in its rules' rosters in the store, and the prefix of the members it writes to
    /// sliding logs and queues (`{name}-{n}`). Every limiter sharing a store needs its own name. Default: the
    /// process id, the wall clock's nanoseconds at build and a count of the process's limiters, unique without
    /// being asked; a simulation names its processes so that one seed gives one run (`tokenlease simulate
    /// --seed`).
    pub fn member(mut self, name: impl Into<String>) -> Self {
        self.member = Some(name.into());
        self
    }

    /// Settings of this process (`[process]` in config.toml): the longest key accepted, and how many keys hold
    /// leased tokens and for how long when idle.
    pub fn process(mut self, process: ProcessConfig) -> Self {
        self.process = process;
        self
    }

    /// Builds the limiter and, inside a tokio runtime, starts its background sweeper (lease expiry, idle
    /// eviction) and the fleet's beats, which stop when the limiter is shut down or dropped. Built outside a
    /// runtime, neither runs: a rule's first beat (sent by its first call) is then its only one, and if it fails
    /// the rule's `local` keys are decided by the fail mode, which sells nothing alone for a process the fleet
    /// does not count.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for duplicate rule names, an empty or braced key prefix, zero expected
    /// processes, or process settings out of range (`max_key_bytes` outside 1 to 1 MiB, zero `max_local_keys`
    /// or `idle_ttl`).
    pub fn build(self) -> Result<Limiter, Error> {
        // The default clock is read every millisecond by a thread for the hot path; a given one (a fake clock in
        // tests) is read on every decision.
        let ticking = self.clock.is_none();
        let clock = self.clock.unwrap_or_else(|| Arc::new(MonotonicClock::new()));
        let store = self
            .store
            .unwrap_or_else(|| Arc::new(MemoryStore::with_clock(clock.clone())));
        let key_prefix = self.key_prefix.unwrap_or_else(|| config::DEFAULT_KEY_PREFIX.into());
        config::check_key_prefix(&key_prefix).map_err(rule::invalid)?;
        let processes = self.expected_processes.unwrap_or(config::DEFAULT_EXPECTED_PROCESSES);
        config::check_expected_processes(processes).map_err(rule::invalid)?;
        self.process.validate().map_err(rule::invalid)?;
        let timeout = self.timeout.unwrap_or(config::DEFAULT_TIMEOUT);
        let rules = compile_all(self.rules, self.fail_mode, crate::compiled::adopted_now(clock.as_ref()))?;

        let background = Arc::new(Background::default());
        let store = Arc::new(Guarded::new(store, clock.clone(), Timings::from_call(timeout)));
        let members = Arc::new(self.member.map_or_else(Members::new, Members::named));
        let fleet = Fleet::new(
            (members.name().to_owned(), key_prefix.clone()),
            u64::from(processes),
            store.clone(),
            clock.clone(),
        );
        let fallback = Fallback::new(store.timings.backoff, background.clone(), Arc::new(fleet));
        let fallback = Arc::new(fallback);
        let refusals = Arc::new(Refusals::new(self.process.max_refused_keys));
        let queue = Queue {
            refusals: refusals.clone(),
            store: store.clone(),
            fallback: fallback.clone(),
            members: members.clone(),
            background: background.clone(),
            key_prefix: key_prefix.clone(),
        };
        let recent = if ticking {
            Recent::ticking(clock.clone())
        } else {
            Recent::exact(clock.clone())
        };
        #[cfg(test)]
        let recent = if self.stalled {
            Recent::stalled(clock.clone())
        } else {
            recent
        };
        // A limiter's hold numbers start at its clock's wall ms × 1000 (under 2^53 until the year 2255, exact in
        // the scripts), so a process restarted under the same member name numbers after its predecessor.
        let hold_seq = AtomicU64::new(clock.wall_ms().saturating_mul(1_000).max(1));
        let engine = Arc::new(Engine {
            store,
            fallback,
            background,
            recent,
            clock,
            key_prefix,
            process: self.process,
            leased_tokens: AtomicU64::new(0),
            returned_tokens: AtomicU64::new(0),
            members,
            refusals,
            hold_seq,
        });
        let inner = Arc::new(Inner {
            id: crate::nearby::next_limiter(),
            rules: ArcSwap::from_pointee(rules),
            adhoc: DashMap::default(),
            default_fail_mode: self.fail_mode,
            redis: self.redis,
            engine,
            queue,
        });
        // Registered at 0 now, so a scrape shows it before the first sweep.
        telemetry::local_keys(0);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(lifecycle::sweeper(Arc::downgrade(&inner)));
            handle.spawn(lifecycle::beats(Arc::downgrade(&inner)));
        }
        Ok(Limiter { inner })
    }
}

/// Compiles rules by name.
///
/// # Errors
/// As [`compile_keeping`].
pub(super) fn compile_all(rules: Vec<Rule>, default_mode: FailMode, adopted_ms: u64) -> Result<RuleMap, Error> {
    compile_keeping(rules, default_mode, &RuleMap::default(), adopted_ms)
}

/// Compiles rules by name, keeping the compiled rule of `old` (and its leases) for a rule that did not change.
///
/// # Errors
/// [`Error::InvalidArgument`] naming `rule` for a duplicate name, or `name` for a name outside `[A-Za-z0-9_.-]`
/// (checked again here: [`Rule::name`] is a public field, set after the constructor checked it).
pub(super) fn compile_keeping(
    rules: Vec<Rule>,
    default_mode: FailMode,
    old: &RuleMap,
    adopted_ms: u64,
) -> Result<RuleMap, Error> {
    let mut map = RuleMap::default();
    for rule in rules {
        rule::check_name(&rule.name, "name").map_err(rule::invalid)?;
        if map.contains_key(&rule.name) {
            return Err(rule::invalid(("rule", format!("duplicate rule name `{}`", rule.name))));
        }
        let mode = rule.fail_mode.unwrap_or(default_mode);
        let kept = old
            .get(&rule.name)
            .filter(|c| c.rule == rule && c.fail_mode == mode)
            .cloned();
        let compiled = kept.unwrap_or_else(|| Arc::new(Compiled::new(rule, default_mode, adopted_ms)));
        map.insert(compiled.rule.name.clone(), compiled);
    }
    Ok(map)
}

impl Limiter {
    /// Swaps in the rules of a new configuration without dropping calls in flight (they finish under the rules
    /// they started with). A rule that is unchanged keeps its leased tokens; a changed rule applies to existing
    /// keys from the next call (the shared state in the store is kept: a new capacity or rate takes effect on
    /// it at once); a removed rule's callers get [`Error::UnknownRule`]; leased tokens of changed and removed
    /// rules go back to the shared bucket. `[redis] fail_mode` applies to the reloaded rules; rules passed to
    /// [`Limiter::check_rule`] keep the limiter's first fail mode.
    ///
    /// A config that does not parse never gets here ([`Config::from_path`] refuses it with its error), so the
    /// rules in force stay as they are.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `rule` for duplicate rule names, or `redis` when the store's settings
    /// (all of `[redis]` but `fail_mode`) differ: those need a restart. Nothing changes then.
    /// [`Error::ShutDown`] after [`Limiter::shutdown`].
    pub fn reload(&self, config: Config) -> Result<(), Error> {
        let engine = &self.inner.engine;
        if engine.background.is_closed() {
            return Err(Error::ShutDown);
        }
        let same_store = match (&self.inner.redis, &config.redis) {
            (Some(old), Some(new)) => old.same_store(new),
            (old, new) => old.is_none() && new.is_none(),
        };
        if !same_store {
            let why = "the store's settings (url, cluster, sentinel, key_prefix, timeout, expected_processes, \
                       require_noeviction) change only with a restart";
            return Err(rule::invalid(("redis", why.into())));
        }
        let old = self.inner.rules.load_full();
        let adopted_ms = crate::compiled::adopted_now(engine.clock.as_ref());
        let rules = compile_keeping(config.rules, config.fail_mode, &old, adopted_ms)?;
        self.inner.rules.store(Arc::new(rules));
        let current = self.inner.rules.load();
        for (name, compiled) in old.iter() {
            if !current.get(name).is_some_and(|c| Arc::ptr_eq(c, compiled)) {
                engine.retire(compiled);
            }
        }
        tracing::info!(rules = current.len(), "rules reloaded");
        Ok(())
    }
}

impl Limiter {
    /// A builder for limiters made in code.
    pub fn builder() -> LimiterBuilder {
        LimiterBuilder::default()
    }

    /// A limiter from a validated [`Config`]: a [`RedisStore`] when `[redis]` is set (one server, a Cluster or
    /// the master Sentinel names; connected lazily, so Redis may be down at start), the in-process store
    /// otherwise. The store reads each server's `maxmemory-policy` when it connects and warns about one that may
    /// evict limiter keys; with `[redis] require_noeviction = true` it is read here, before anything starts.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when called outside a tokio runtime with `[redis]` set, the Redis URL is
    /// malformed, or a `[redis] tls_*` file can no longer be read or parsed; with `require_noeviction`, [`Error::EvictionPolicy`] naming a server whose `maxmemory-policy`
    /// may evict limiter keys, or [`Error::Store`] when a server cannot be reached to read it (a server that
    /// refuses `CONFIG` only gives a warning); see also [`LimiterBuilder::build`].
    pub fn from_config(config: Config) -> Result<Self, Error> {
        let mut builder = Self::builder()
            .rules(config.rules)
            .fail_mode(config.fail_mode)
            .process(config.process);
        if let Some(redis) = config.redis {
            if tokio::runtime::Handle::try_current().is_err() {
                return Err(rule::invalid(("runtime", "a Redis store needs a tokio runtime".into())));
            }
            if redis.require_noeviction {
                eviction::require_noeviction(&redis)?;
            }
            let store = RedisStore::from_redis_config(&redis)?;
            builder = builder
                .store(Arc::new(store))
                .key_prefix(redis.key_prefix.clone())
                .expected_processes(redis.expected_processes)
                .timeout(redis.timeout);
            builder.redis = Some(redis);
        }
        builder.build()
    }
}
