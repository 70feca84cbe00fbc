//! The [`Limiter`]: rules, the store, the lease cache and the fail modes behind one `check`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use dashmap::DashMap;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::algorithm::{Reply, TokenBucket, NEVER};
use crate::breaker::{Admit, Breaker};
use crate::clock::{Clock, MonotonicClock};
use crate::config::{Config, LocalConfig};
use crate::error::{Error, StoreError, StoreErrorKind};
use crate::lease::{Local, LocalBucket, NEVER_NS};
use crate::rule::{Algorithm, FailMode, Lease, Quota, Rule};
use crate::store::{Call, MemoryStore, RedisStore, Script, Store};
use crate::telemetry::{self, RuleMetrics, Source};

/// Rules built in code that are compiled once and kept; beyond this many, each call compiles its rule.
const MAX_ADHOC_RULES: usize = 1024;

/// Renames the argument of an [`Error::InvalidArgument`] to the caller's name for it.
fn rename_argument(e: Error, names: &[(&'static str, &'static str)]) -> Error {
    match e {
        Error::InvalidArgument { name, reason } => {
            let name = names.iter().find(|(from, _)| *from == name).map_or(name, |(_, to)| to);
            Error::InvalidArgument { name, reason }
        }
        other => other,
    }
}

/// Keys longer than this many bytes are refused with [`Error::InvalidArgument`], unless `[local]
/// max_key_bytes` ([`LocalConfig::max_key_bytes`]) says otherwise.
pub const MAX_KEY_LEN: usize = 512;

/// Transient store failures in a row that open the circuit breaker (it then stays open for 500 ms or the
/// timeout, whichever is longer, and lets one probe through).
const BREAKER_FAILURES: u32 = 5;

/// How long a "never" from the shared bucket is cached locally before asking again.
const NEVER_RECHECK: Duration = Duration::from_secs(1);

/// The answer to a check. A refusal is a decision, not an error.
#[must_use = "a decision does nothing unless `allowed` is looked at"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether the call may go ahead (its tokens are spent).
    pub allowed: bool,
    /// Tokens left: in the shared bucket for decisions made by a store; in this process for decisions made
    /// from leased tokens (`source == Local`).
    pub remaining: u64,
    /// Zero when allowed; otherwise how long until the same call would be allowed. [`Duration::MAX`] when it
    /// never can (a stock with rate 0).
    pub retry_after: Duration,
    /// How long until the key is back to its full allowance ([`Duration::MAX`]: never).
    pub reset_after: Duration,
    /// Where the decision was made.
    pub source: Source,
    /// The rule is in shadow mode ([`Rule::shadow`]) and would have refused this call: `allowed` is true anyway
    /// and `retry_after` zero.
    pub shadowed: bool,
}

impl Decision {
    fn from_reply(reply: &Reply, cost: u64, source: Source) -> Self {
        Self {
            allowed: reply.granted >= cost,
            remaining: reply.remaining,
            retry_after: protocol_ms(reply.retry_after_ms),
            reset_after: protocol_ms(reply.reset_after_ms),
            source,
            shadowed: false,
        }
    }
}

/// The protocol's milliseconds (−1 = never) as a duration.
fn protocol_ms(v: i64) -> Duration {
    if v == NEVER {
        Duration::MAX
    } else {
        Duration::from_millis(u64::try_from(v).unwrap_or(0))
    }
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn ms_to_ns(v: i64) -> u64 {
    if v == NEVER {
        NEVER_NS
    } else {
        u64::try_from(v).unwrap_or(0).saturating_mul(1_000_000)
    }
}

/// Permission to run one paced job, from [`Limiter::acquire`]: its slot has come.
#[must_use = "a permit means the job may run now"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permit {
    /// How long the caller waited in the queue.
    pub waited: Duration,
    /// Tokens the job was granted.
    pub cost: u64,
    /// Where the slot was reserved (`redis`, `memory`, or `fallback` when the store failed).
    pub source: Source,
}

/// Counts a caller in its rule's queue depth while it lives.
struct Waiting<'a>(&'a Compiled);

impl<'a> Waiting<'a> {
    fn new(compiled: &'a Compiled) -> Self {
        let n = compiled.waiting.fetch_add(1, Ordering::Relaxed) + 1;
        compiled.metrics.queue_depth.set(n as f64);
        Self(compiled)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let n = self.0.waiting.fetch_sub(1, Ordering::Relaxed) - 1;
        self.0.metrics.queue_depth.set(n as f64);
    }
}

/// A slot reserved in the store whose caller may still give up; dropped unfinished, it hands the slot back.
struct Reserved<'a> {
    limiter: &'a Limiter,
    call: &'a Call,
    source: Source,
    done: bool,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut back = self.call.clone();
        if back.script == Script::TokenAcquire {
            back.script = Script::TokenReturn; // the tokens go back: the debt shrinks for whoever comes next
            back.args.truncate(4); // capacity, rate, per_ms, cost
        } else {
            back.script = Script::LeakyReturn;
            back.args.truncate(3); // rate, per_ms, cost
        }
        let this = self.limiter.clone();
        let fallback = self.source == Source::Fallback;
        if tokio::runtime::Handle::try_current().is_ok() {
            self.limiter.inner.tracker.spawn(async move {
                let result = if fallback {
                    this.inner.fallback.run_sync(&back)
                } else {
                    this.run(&back).await
                };
                if let Err(error) = result {
                    tracing::debug!(%error, "could not hand a queue slot back");
                }
            });
        }
    }
}

/// Counters of one limiter, in calls and tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimiterStats {
    /// Store calls: leases, returns and direct checks.
    pub store_calls: u64,
    /// Tokens leased from the shared buckets.
    pub leased_tokens: u64,
    /// Leased tokens given back unused.
    pub returned_tokens: u64,
}

/// Rules by name.
type RuleMap = HashMap<String, Arc<Compiled>, foldhash::fast::RandomState>;

/// A rule as the limiter runs it.
#[derive(Debug)]
struct Compiled {
    rule: Rule,
    fail_mode: FailMode,
    metrics: RuleMetrics,
    /// Leased tokens per key (rules with a lease only).
    local: DashMap<String, Arc<LocalBucket>, foldhash::fast::RandomState>,
    /// Per key, the order in which this process's callers reserve queue slots (leaky-bucket rules): tokio's
    /// mutex is fair, so waiters are served first-in first-out.
    queues: DashMap<String, Arc<tokio::sync::Mutex<()>>, foldhash::fast::RandomState>,
    /// Callers of this rule waiting in a queue now.
    waiting: std::sync::atomic::AtomicI64,
}

impl Compiled {
    /// Counts a decision and applies shadow mode: a shadow rule's refusal is counted as `shadow_rejected` and
    /// returned as an allowance.
    #[inline]
    fn record(&self, mut decision: Decision) -> Decision {
        if self.rule.shadow && !decision.allowed {
            self.metrics.shadow_rejected(decision.source);
            decision.allowed = true;
            decision.shadowed = true;
            decision.retry_after = Duration::ZERO;
        } else {
            self.metrics.decision(decision.allowed, decision.source);
        }
        decision
    }
}

#[derive(Debug)]
struct Inner {
    rules: ArcSwap<RuleMap>,
    store: Arc<dyn Store>,
    /// State of `fail_mode = "local"` while the store fails.
    fallback: MemoryStore,
    clock: Arc<dyn Clock>,
    key_prefix: String,
    expected_processes: u64,
    /// How long a caller waits for a lease in flight before deciding by `fail_mode`.
    lease_wait: Duration,
    /// The timeout of a lease call itself.
    lease_timeout: Duration,
    /// After a failed store call, decide by `fail_mode` this long before asking again.
    backoff: Duration,
    local_config: LocalConfig,
    store_calls: AtomicU64,
    /// Stops calling a store that keeps failing.
    breaker: Breaker,
    /// Sliding-log members are `{member_prefix}-{n}`: unique across processes and calls.
    member_prefix: String,
    members: AtomicU64,
    /// Rules built in code and passed to [`Limiter::check_rule`], compiled once.
    adhoc: DashMap<Rule, Arc<Compiled>, foldhash::fast::RandomState>,
    default_fail_mode: FailMode,
    /// The `[redis]` section the store was built from (`from_config`); a reload may not change it.
    redis: Option<crate::config::RedisConfig>,
    leased_tokens: AtomicU64,
    returned_tokens: AtomicU64,
    /// Token-bucket keys that `fail_mode = "local"` granted tokens of while the store failed, with their shared
    /// bucket: what they admitted alone is charged to the shared bucket once the store answers for them again
    /// (before their next lease or call), or at shutdown.
    unsettled: DashMap<String, TokenBucket, foldhash::fast::RandomState>,
    closed: AtomicBool,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

/// A distributed rate limiter: rules from config or code, decided by a [`Store`] (Redis or in process), with
/// hot keys decided in process from leased tokens. Cheap to clone; clones share everything.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tokenlease::Error> {
/// use std::time::Duration;
/// use tokenlease::{Lease, Limiter, Rule};
///
/// let rule = Rule::token_bucket("sku_buy", 2000, 1000, Duration::from_secs(1))?
///     .with_lease(Lease { min_batch: 10, max_batch: 500, ttl: Duration::from_millis(200) })?;
/// let limiter = Limiter::builder().rule(rule).build()?; // no store given: the in-process store
/// let decision = limiter.check("sku_buy", "sku:42", 1).await?;
/// assert!(decision.allowed);
/// limiter.shutdown().await; // gives leased tokens back
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

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
    local: LocalConfig,
    redis: Option<crate::config::RedisConfig>,
}

impl LimiterBuilder {
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

    /// What to do when the store fails, for rules that do not say (default `local`).
    pub fn fail_mode(mut self, mode: FailMode) -> Self {
        self.fail_mode = mode;
        self
    }

    /// Prefix of every store key (default `tl`).
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = Some(prefix.into());
        self
    }

    /// Processes sharing the limits (default 4): caps lease batches at `capacity / n` and sets each process's
    /// share under `fail_mode = "local"`.
    pub fn expected_processes(mut self, n: u32) -> Self {
        self.expected_processes = Some(n);
        self
    }

    /// The store's call timeout, which bounds how long a caller waits on a lease (default 50 ms).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Settings of this process: the local lease cache and the longest key accepted.
    pub fn local(mut self, local: LocalConfig) -> Self {
        self.local = local;
        self
    }

    /// Builds the limiter and, inside a tokio runtime, starts its background sweeper (lease expiry, idle
    /// eviction), which stops when the limiter is shut down or dropped.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for duplicate rule names, an empty or braced key prefix, zero expected
    /// processes, or a `max_key_bytes` outside 1 to 1 MiB.
    pub fn build(self) -> Result<Limiter, Error> {
        let clock = self.clock.unwrap_or_else(|| Arc::new(MonotonicClock::new()));
        let store = self
            .store
            .unwrap_or_else(|| Arc::new(MemoryStore::with_clock(clock.clone())));
        let key_prefix = self.key_prefix.unwrap_or_else(|| "tl".into());
        if key_prefix.is_empty() || key_prefix.contains(['{', '}']) {
            return Err(Error::InvalidArgument {
                name: "key_prefix",
                reason: "must be non-empty, without braces".into(),
            });
        }
        let expected_processes = u64::from(self.expected_processes.unwrap_or(4));
        if expected_processes == 0 {
            return Err(Error::InvalidArgument {
                name: "expected_processes",
                reason: "must be at least 1".into(),
            });
        }
        if let Some(reason) = self.local.max_key_bytes_error() {
            return Err(Error::InvalidArgument {
                name: "max_key_bytes",
                reason,
            });
        }
        let timeout = self.timeout.unwrap_or(Duration::from_millis(50));
        let mut rules = RuleMap::default();
        for rule in self.rules {
            if rules.contains_key(&rule.name) {
                return Err(Error::InvalidArgument {
                    name: "rule",
                    reason: format!("duplicate rule name `{}`", rule.name),
                });
            }
            let compiled = compile(rule, self.fail_mode);
            rules.insert(compiled.rule.name.clone(), Arc::new(compiled));
        }
        let inner = Arc::new(Inner {
            rules: ArcSwap::from_pointee(rules),
            store,
            fallback: MemoryStore::with_clock(clock.clone()),
            clock,
            key_prefix,
            expected_processes,
            lease_wait: timeout.saturating_mul(2).saturating_add(Duration::from_millis(5)),
            lease_timeout: timeout.saturating_mul(10).max(Duration::from_millis(100)),
            backoff: Duration::from_millis(100).max(timeout),
            local_config: self.local,
            store_calls: AtomicU64::new(0),
            breaker: Breaker::new(BREAKER_FAILURES, Duration::from_millis(500).max(timeout)),
            member_prefix: format!("{:x}.{:x}", std::process::id(), clock_seed()),
            members: AtomicU64::new(0),
            adhoc: DashMap::default(),
            default_fail_mode: self.fail_mode,
            redis: self.redis,
            leased_tokens: AtomicU64::new(0),
            returned_tokens: AtomicU64::new(0),
            unsettled: DashMap::default(),
            closed: AtomicBool::new(false),
            tracker: TaskTracker::new(),
            cancel: CancellationToken::new(),
        });
        // Registered at 0 now, so a scrape shows it before the first sweep.
        telemetry::local_keys(0);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(sweeper(Arc::downgrade(&inner), inner.cancel.clone()));
        }
        Ok(Limiter { inner })
    }
}

fn compile(rule: Rule, default_mode: FailMode) -> Compiled {
    Compiled {
        fail_mode: rule.fail_mode.unwrap_or(default_mode),
        metrics: RuleMetrics::new(&rule.name),
        local: DashMap::default(),
        queues: DashMap::default(),
        waiting: std::sync::atomic::AtomicI64::new(0),
        rule,
    }
}

fn sweep_interval(inner: &Inner) -> Duration {
    let rules = inner.rules.load();
    let shortest = rules.values().filter_map(|c| c.rule.lease()).map(|l| l.ttl / 4).min();
    shortest
        .unwrap_or(Duration::from_secs(1))
        .clamp(Duration::from_millis(5), Duration::from_secs(1))
}

/// Gives expired leases back and evicts idle keys, every quarter of the shortest lease TTL (5 ms to 1 s), until
/// cancelled or the limiter is gone.
async fn sweeper(inner: Weak<Inner>, cancel: CancellationToken) {
    loop {
        // Recomputed each round: a reload may bring shorter lease TTLs.
        let Some(interval) = inner.upgrade().map(|i| sweep_interval(&i)) else {
            return;
        };
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        let Some(inner) = inner.upgrade() else { return };
        let limiter = Limiter { inner };
        limiter.sweep();
    }
}

impl Limiter {
    /// A builder for limiters made in code.
    pub fn builder() -> LimiterBuilder {
        LimiterBuilder::default()
    }

    /// A limiter from a validated [`Config`]: a [`RedisStore`] when `[redis]` is set (connected lazily, so
    /// Redis may be down at start), the in-process store otherwise.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when called outside a tokio runtime with `[redis]` set, or the Redis URL is
    /// malformed; see also [`LimiterBuilder::build`].
    pub fn from_config(config: Config) -> Result<Self, Error> {
        let mut builder = Self::builder()
            .rules(config.rules)
            .fail_mode(config.fail_mode)
            .local(config.local);
        if let Some(redis) = config.redis {
            if tokio::runtime::Handle::try_current().is_err() {
                return Err(Error::InvalidArgument {
                    name: "runtime",
                    reason: "a Redis store needs a tokio runtime".into(),
                });
            }
            let store = if redis.cluster.is_empty() {
                RedisStore::connect(&redis.url, redis.timeout)?
            } else {
                RedisStore::connect_cluster(&redis.cluster, redis.timeout)?
            };
            builder = builder
                .store(Arc::new(store))
                .key_prefix(redis.key_prefix.clone())
                .expected_processes(redis.expected_processes)
                .timeout(redis.timeout);
            builder.redis = Some(redis);
        }
        builder.build()
    }

    /// Takes `cost` tokens of `key` under `rule`.
    ///
    /// A leasing rule answers from this process's leased tokens when it has them (tens of nanoseconds), from
    /// its cached "exhausted until" when the shared bucket is empty, and otherwise waits for the key's single
    /// lease in flight. Other rules run one store call. When the store fails, the rule's `fail_mode` decides
    /// (`source == Fallback`).
    ///
    /// # Errors
    /// [`Error::UnknownRule`]; [`Error::InvalidArgument`] for an empty key, a key over `max_key_bytes` bytes or
    /// a zero cost; [`Error::CostAboveCapacity`] when the cost can never be granted; [`Error::ShutDown`] after
    /// [`Limiter::shutdown`].
    pub async fn check(&self, rule: &str, key: &str, cost: u64) -> Result<Decision, Error> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::ShutDown);
        }
        // The hot path borrows the rule and the key's local bucket: no reference count is touched, so threads
        // deciding on one hot key share only the bucket's token count and the map shard's read lock.
        let compiled = {
            let rules = self.inner.rules.load();
            let compiled = rules.get(rule).ok_or_else(|| Error::UnknownRule(rule.to_owned()))?;
            self.validate(compiled, key, cost)?;
            if compiled.rule.lease().is_some() {
                if let Some(local) = compiled.local.get(key) {
                    let now = self.inner.clock.now_ns();
                    if !local.has_expired(now) {
                        if let Some(decision) = self.decide_locally(compiled, local.value(), cost, now) {
                            return Ok(compiled.record(decision));
                        }
                    }
                }
            }
            compiled.clone()
        };
        self.decide(&compiled, key, cost).await
    }

    async fn decide(&self, compiled: &Arc<Compiled>, key: &str, cost: u64) -> Result<Decision, Error> {
        let algorithm = compiled.rule.algorithm_for(key);
        let decision = match algorithm {
            Algorithm::TokenBucket {
                bucket,
                lease: Some(lease),
                ..
            } => self.check_leased(compiled, bucket, lease, key, cost).await,
            // A check never waits: a leaky bucket answers whether a slot is free now.
            Algorithm::LeakyBucket { rate, per_ms, .. } => {
                let now_only = Algorithm::LeakyBucket {
                    rate: *rate,
                    per_ms: *per_ms,
                    max_wait_ms: 0,
                };
                self.check_store(compiled, &now_only, key, cost).await?
            }
            _ => self.check_store(compiled, algorithm, key, cost).await?,
        };
        Ok(compiled.record(decision))
    }

    /// Like [`Limiter::check`], for a rule built in code rather than configured (compiled once and cached by
    /// its value; keys are `{prefix}:{rule.name:key}` as for configured rules).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tokenlease::Error> {
    /// use std::time::Duration;
    /// use tokenlease::{Limiter, Rule};
    ///
    /// let limiter = Limiter::builder().build()?;
    /// let comment = Rule::sliding_log("comment", 10, Duration::from_secs(30))?; // seed 003, scenario 1
    /// for _ in 0..10 {
    ///     assert!(limiter.check_rule(&comment, "user:7", 1).await?.allowed);
    /// }
    /// assert!(!limiter.check_rule(&comment, "user:7", 1).await?.allowed);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Limiter::check`], but never [`Error::UnknownRule`].
    pub async fn check_rule(&self, rule: &Rule, key: &str, cost: u64) -> Result<Decision, Error> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::ShutDown);
        }
        let compiled = match self.inner.adhoc.get(rule) {
            Some(c) => c.clone(),
            None => {
                let c = Arc::new(compile(rule.clone(), self.inner.default_fail_mode));
                if self.inner.adhoc.len() < MAX_ADHOC_RULES {
                    self.inner.adhoc.insert(rule.clone(), c.clone());
                }
                c
            }
        };
        self.validate(&compiled, key, cost)?;
        self.decide(&compiled, key, cost).await
    }

    /// The seeds' convenience API (seed 000): whether `user_id` may do `action_key` once more, allowing at most
    /// `max_count` actions in any `period` (a sliding-window log, exact; no config entry needed). Keys are
    /// `{prefix}:{action_key:user_id}`; refused attempts are not recorded.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tokenlease::Error> {
    /// use std::time::Duration;
    /// let limiter = tokenlease::Limiter::builder().build()?;
    /// for _ in 0..5 {
    ///     assert!(limiter.is_action_allowed("laoqian", "reply", Duration::from_secs(60), 5).await?);
    /// }
    /// assert!(!limiter.is_action_allowed("laoqian", "reply", Duration::from_secs(60), 5).await?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming `user_id`, `action_key`, `period` or `max_count` when one is empty or
    /// zero; [`Error::ShutDown`].
    pub async fn is_action_allowed(
        &self,
        user_id: &str,
        action_key: &str,
        period: Duration,
        max_count: u64,
    ) -> Result<bool, Error> {
        for (name, value) in [("user_id", user_id), ("action_key", action_key)] {
            if value.is_empty() {
                return Err(Error::InvalidArgument {
                    name,
                    reason: "must not be empty".into(),
                });
            }
        }
        if action_key.contains(['{', '}']) {
            return Err(Error::InvalidArgument {
                name: "action_key",
                reason: "must not hold `{` or `}`".into(),
            });
        }
        let rule = Rule::sliding_log(action_key, max_count, period)
            .map_err(|e| rename_argument(e, &[("limit", "max_count"), ("window", "period")]))?;
        Ok(self.check_rule(&rule, user_id, 1).await?.allowed)
    }

    /// Waits for a slot of the leaky-bucket rule `rule` for `cost` tokens of `key`: all processes together
    /// leak at the rule's rate (one Redis call per job, `lua/leaky_bucket.lua`), callers of this process are
    /// served first-in first-out. On a token-bucket rule it waits for the tokens instead, Guava-style
    /// ("consume now, pay later", `lua/token_acquire.lua`): a caller not behind a debt takes its tokens at once
    /// and the next caller waits for the debt; the wait is bounded by the time to refill the whole capacity. A call whose wait would exceed the rule's `max_wait` is refused at once with
    /// [`Error::QueueFull`] (its `retry_after` says when a call would fit): nobody waits only to fail.
    ///
    /// Dropping the future while it waits gives up its place. A slot already reserved in Redis is handed back
    /// (`lua/leaky_return.lua`) when it is still the last one reserved; otherwise it leaks unused, since moving
    /// it would move every caller queued behind it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tokenlease::Error> {
    /// use std::time::Duration;
    /// use tokenlease::{Limiter, Rule};
    ///
    /// let reindex = Rule::leaky_bucket("reindex", 50, Duration::from_secs(1), Duration::from_secs(30))?;
    /// let limiter = Limiter::builder().rule(reindex).build()?;
    /// let permit = limiter.acquire("reindex", "tenant:7", 1).await?;
    /// assert!(permit.waited < Duration::from_millis(100));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::QueueFull`]; [`Error::UnknownRule`]; [`Error::InvalidArgument`] for a rule that is neither a
    /// leaky nor a token bucket, an empty or oversized key, a zero cost; [`Error::CostAboveCapacity`] for a cost above the
    /// rule's rate; [`Error::Store`] when the store fails and the rule's `fail_mode` is `closed`.
    pub async fn acquire(&self, rule: &str, key: &str, cost: u64) -> Result<Permit, Error> {
        self.acquire_within(rule, key, cost, None).await
    }

    /// [`Limiter::acquire`] waiting at most `max` (and at most the rule's `max_wait`).
    ///
    /// # Errors
    /// As [`Limiter::acquire`].
    pub async fn acquire_timeout(&self, rule: &str, key: &str, cost: u64, max: Duration) -> Result<Permit, Error> {
        self.acquire_within(rule, key, cost, Some(max)).await
    }

    /// [`Limiter::acquire`] that never waits: a permit when a slot is free now, `None` otherwise (nothing is
    /// reserved then).
    ///
    /// # Errors
    /// As [`Limiter::acquire`], except [`Error::QueueFull`].
    pub async fn try_acquire(&self, rule: &str, key: &str, cost: u64) -> Result<Option<Permit>, Error> {
        match self.acquire_within(rule, key, cost, Some(Duration::ZERO)).await {
            Ok(permit) => Ok(Some(permit)),
            Err(Error::QueueFull { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    async fn acquire_within(&self, rule: &str, key: &str, cost: u64, max: Option<Duration>) -> Result<Permit, Error> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::ShutDown);
        }
        let compiled = self
            .inner
            .rules
            .load()
            .get(rule)
            .cloned()
            .ok_or_else(|| Error::UnknownRule(rule.to_owned()))?;
        self.validate(&compiled, key, cost)?;
        let algorithm = compiled.rule.algorithm_for(key).clone();
        // The rule's bound on the wait: a leaky bucket's max_wait; for a token bucket, the time to refill its
        // whole capacity (a caller never waits behind more than one full burst of debt).
        let rule_max_ms = match &algorithm {
            Algorithm::LeakyBucket { max_wait_ms, .. } => *max_wait_ms,
            Algorithm::TokenBucket { bucket, .. } if bucket.rate > 0 => {
                bucket.capacity.saturating_mul(bucket.per_ms).div_ceil(bucket.rate)
            }
            _ => 0, // refused below: acquire_call has no call for it
        };
        let max_wait_ms = max.map_or(rule_max_ms, |m| {
            u64::try_from(m.as_millis()).unwrap_or(u64::MAX).min(rule_max_ms)
        });
        let store_key = self.store_key(&compiled.rule.name, key);
        let call = self
            .acquire_call(&algorithm, &store_key, cost, max_wait_ms, 1)
            .ok_or_else(|| Error::InvalidArgument {
                name: "rule",
                reason: format!(
                    "acquire needs a leaky_bucket or token_bucket rule; `{rule}` is {}",
                    algorithm.name()
                ),
            })?;
        let started = tokio::time::Instant::now();
        let queue = compiled.queues.entry(key.to_owned()).or_default().clone();
        let waiting = Waiting::new(&compiled);
        // First in, first out: reservations of this process's callers are made in the order they came.
        let turn = queue.lock().await;
        let mut call = call;
        let (reply, source) = match self.run(&call).await {
            Ok(reply) => (reply, self.inner.store.source()),
            Err(error) => match compiled.fail_mode {
                FailMode::Open => (
                    Reply {
                        granted: cost,
                        remaining: 0,
                        retry_after_ms: 0,
                        reset_after_ms: 0,
                    },
                    Source::Fallback,
                ),
                FailMode::Closed => return Err(Error::Store(error)),
                FailMode::Local => {
                    let share = self.inner.expected_processes;
                    // The reservation is made (and handed back, if dropped) in this process's share.
                    call = self
                        .acquire_call(&algorithm, &store_key, cost, max_wait_ms, share)
                        .ok_or(error)?;
                    (self.inner.fallback.run_sync(&call)?, Source::Fallback)
                }
            },
        };
        drop(turn);
        drop(queue);
        compiled.queues.remove_if(key, |_, q| Arc::strong_count(q) == 1);
        if reply.granted < cost {
            return Err(Error::QueueFull {
                rule: rule.to_owned(),
                max_wait: Duration::from_millis(max_wait_ms),
                retry_after: protocol_ms(reply.retry_after_ms),
            });
        }
        let wait = protocol_ms(reply.retry_after_ms);
        if !wait.is_zero() {
            // Dropped while sleeping: hand the slot back if nobody queued behind it.
            let mut reserved = Reserved {
                limiter: self,
                call: &call,
                source,
                done: false,
            };
            tokio::time::sleep(wait).await;
            reserved.done = true;
        }
        drop(waiting);
        let waited = started.elapsed();
        compiled.metrics.queue_wait.record(waited.as_secs_f64());
        compiled.metrics.decision(true, source);
        Ok(Permit { waited, cost, source })
    }

    /// The script call reserving `cost` tokens for an `acquire` (`max_wait_ms` bounding the wait), with the
    /// limits divided by `share` as in [`Limiter::call_for`].
    fn acquire_call(
        &self,
        algorithm: &Algorithm,
        store_key: &str,
        cost: u64,
        max_wait_ms: u64,
        share: u64,
    ) -> Option<Call> {
        Some(match algorithm {
            Algorithm::TokenBucket { bucket, .. } => Call::new(
                Script::TokenAcquire,
                vec![store_key.to_owned()],
                vec![
                    as_arg((bucket.capacity / share).max(1)),
                    as_arg(bucket.rate),
                    as_arg(bucket.per_ms.saturating_mul(share)),
                    as_arg(cost),
                    as_arg(max_wait_ms),
                ],
            ),
            Algorithm::LeakyBucket { rate, per_ms, .. } => {
                let n = self.inner.members.fetch_add(1, Ordering::Relaxed);
                let per = as_arg(per_ms.saturating_mul(share));
                Call::new(
                    Script::LeakyBucket,
                    vec![store_key.to_owned()],
                    vec![as_arg(*rate), per, as_arg(cost), as_arg(max_wait_ms)],
                )
                .with_member(format!("{}-{n}", self.inner.member_prefix))
            }
            _ => return None,
        })
    }

    /// Swaps in the rules of a new configuration without dropping calls in flight (they finish under the rules
    /// they started with). A rule that is unchanged keeps its local leases; a changed rule applies to existing
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
    /// (url, cluster, key prefix, timeout, expected processes) differ: those need a restart. Nothing changes then.
    pub fn reload(&self, config: Config) -> Result<(), Error> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::ShutDown);
        }
        let store_settings = |r: &crate::config::RedisConfig| {
            (
                r.url.clone(),
                r.cluster.clone(),
                r.key_prefix.clone(),
                r.timeout,
                r.expected_processes,
            )
        };
        if self.inner.redis.as_ref().map(store_settings) != config.redis.as_ref().map(store_settings) {
            return Err(Error::InvalidArgument {
                name: "redis",
                reason:
                    "the store's settings (url, cluster, key_prefix, timeout, expected_processes) change only with a restart"
                        .into(),
            });
        }
        let old = self.inner.rules.load_full();
        let mut rules = RuleMap::default();
        for rule in config.rules {
            if rules.contains_key(&rule.name) {
                return Err(Error::InvalidArgument {
                    name: "rule",
                    reason: format!("duplicate rule name `{}`", rule.name),
                });
            }
            let mode = rule.fail_mode.unwrap_or(config.fail_mode);
            let kept = old
                .get(&rule.name)
                .filter(|c| c.rule == rule && c.fail_mode == mode)
                .cloned();
            let compiled = kept.unwrap_or_else(|| Arc::new(compile(rule, config.fail_mode)));
            rules.insert(compiled.rule.name.clone(), compiled);
        }
        self.inner.rules.store(Arc::new(rules));
        let current = self.inner.rules.load();
        for (name, compiled) in old.iter() {
            if !current.get(name).is_some_and(|c| Arc::ptr_eq(c, compiled)) {
                self.retire(compiled);
            }
        }
        tracing::info!(rules = current.len(), "rules reloaded");
        Ok(())
    }

    /// Gives every leased token of a rule that is no longer in force back to the shared bucket.
    fn retire(&self, compiled: &Arc<Compiled>) {
        for entry in compiled.local.iter() {
            self.drain_in_background(compiled, entry.value().clone());
        }
        compiled.local.clear();
    }

    /// Takes every token of a local bucket and gives them back in the background.
    fn drain_in_background(&self, compiled: &Arc<Compiled>, local: Arc<LocalBucket>) {
        let tokens = local.drain();
        if tokens > 0 {
            let (this, compiled) = (self.clone(), compiled.clone());
            self.inner
                .tracker
                .spawn(async move { this.give_back(&compiled, &local, tokens).await });
        }
    }

    /// Every compiled rule: configured and built in code.
    fn all_compiled(&self) -> Vec<Arc<Compiled>> {
        let mut all: Vec<_> = self.inner.rules.load().values().cloned().collect();
        all.extend(self.inner.adhoc.iter().map(|e| e.value().clone()));
        all
    }

    /// Decides from the key's leased tokens or its cached refusal; `None` when a lease (or the fail mode) must.
    #[inline]
    fn decide_locally(
        &self,
        compiled: &Arc<Compiled>,
        local: &Arc<LocalBucket>,
        cost: u64,
        now: u64,
    ) -> Option<Decision> {
        match local.try_take(cost, now) {
            Local::Taken { remaining } => {
                if local.below_watermark(remaining) {
                    self.start_lease(compiled, local, 1);
                }
                Some(Decision {
                    allowed: true,
                    remaining,
                    retry_after: Duration::ZERO,
                    reset_after: Duration::from_nanos(local.reset_after_ns(now)),
                    source: Source::Local,
                    shadowed: false,
                })
            }
            Local::Exhausted { retry_after_ns } => Some(Decision {
                allowed: false,
                remaining: local.available(),
                retry_after: if retry_after_ns == NEVER_NS {
                    Duration::MAX
                } else {
                    Duration::from_nanos(retry_after_ns)
                },
                reset_after: Duration::from_nanos(local.reset_after_ns(now)),
                source: Source::Local,
                shadowed: false,
            }),
            Local::Empty => None,
        }
    }

    fn validate(&self, compiled: &Compiled, key: &str, cost: u64) -> Result<(), Error> {
        if key.is_empty() {
            return Err(Error::InvalidArgument {
                name: "key",
                reason: "must not be empty".into(),
            });
        }
        let max = self.inner.local_config.max_key_bytes;
        if key.len() > max {
            return Err(Error::InvalidArgument {
                name: "key",
                reason: format!("is {} bytes, more than the {max} allowed", key.len()),
            });
        }
        if cost == 0 {
            return Err(Error::InvalidArgument {
                name: "cost",
                reason: "must be at least 1 token".into(),
            });
        }
        let capacity = compiled.rule.algorithm_for(key).capacity();
        if cost > capacity {
            return Err(Error::CostAboveCapacity {
                rule: compiled.rule.name.clone(),
                cost,
                capacity,
            });
        }
        Ok(())
    }

    /// The store key of `key` under `rule`: `{prefix}:{rule:key}`, the hash tag keeping a rule's keys for one
    /// user in one Redis Cluster slot.
    pub fn store_key(&self, rule: &str, key: &str) -> String {
        format!("{}:{{{rule}:{key}}}", self.inner.key_prefix)
    }

    /// Whether `rule` is in shadow mode ([`Rule::shadow`]); false for an unknown rule.
    pub fn is_shadow(&self, rule: &str) -> bool {
        self.inner.rules.load().get(rule).is_some_and(|c| c.rule.shadow)
    }

    /// The quota `rule` gives `key` (its override's when one matches), for the HTTP `RateLimit-Policy` header;
    /// `None` for an unknown rule.
    pub fn quota(&self, rule: &str, key: &str) -> Option<Quota> {
        self.inner
            .rules
            .load()
            .get(rule)
            .map(|c| c.rule.algorithm_for(key).quota())
    }

    /// Store calls made so far by this limiter (leases, returns and direct checks).
    pub fn store_calls(&self) -> u64 {
        self.inner.store_calls.load(Ordering::Relaxed)
    }

    /// Counters of this limiter since it was built (also exported as metrics).
    pub fn stats(&self) -> LimiterStats {
        LimiterStats {
            store_calls: self.inner.store_calls.load(Ordering::Relaxed),
            leased_tokens: self.inner.leased_tokens.load(Ordering::Relaxed),
            returned_tokens: self.inner.returned_tokens.load(Ordering::Relaxed),
        }
    }

    /// The store's `source` label.
    pub fn store_source(&self) -> Source {
        self.inner.store.source()
    }

    /// Keys held in the local lease cache.
    pub fn local_keys(&self) -> usize {
        self.inner.rules.load().values().map(|c| c.local.len()).sum()
    }

    /// Whether the store answers now.
    ///
    /// # Errors
    /// The store's error.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.inner.store.ping().await
    }

    async fn run(&self, call: &Call) -> Result<Reply, StoreError> {
        let breaker = &self.inner.breaker;
        if breaker.admit(self.inner.clock.now_ns()) == Admit::No {
            return Err(StoreError {
                kind: StoreErrorKind::Other,
                script: call.script.name(),
                message: "circuit open: the store failed repeatedly; not called".into(),
                source: None,
            });
        }
        self.inner.store_calls.fetch_add(1, Ordering::Relaxed);
        let result = self.inner.store.run(call).await;
        breaker.record(
            result.as_ref().err().map(StoreError::is_transient),
            self.inner.clock.now_ns(),
        );
        result
    }

    /// Whether the circuit breaker in front of the store is open: calls are decided by `fail_mode` without
    /// reaching the store until a probe succeeds.
    pub fn circuit_open(&self) -> bool {
        self.inner.breaker.is_open()
    }

    async fn check_store(
        &self,
        compiled: &Compiled,
        algorithm: &Algorithm,
        key: &str,
        cost: u64,
    ) -> Result<Decision, Error> {
        let store_key = self.store_key(&compiled.rule.name, key);
        let Some(call) = self.call_for(algorithm, &store_key, cost, 1) else {
            return Err(Error::InvalidArgument {
                name: "rule",
                reason: format!("algorithm {} is not available in this version", algorithm.name()),
            });
        };
        match self.run(&call).await {
            Ok(reply) => {
                self.settle_after_answer(&store_key).await;
                Ok(Decision::from_reply(&reply, cost, self.inner.store.source()))
            }
            Err(e) => Ok(self.fallback(compiled, algorithm, &store_key, cost, &e)),
        }
    }

    /// The script call deciding `cost` tokens of `store_key` under `algorithm`, with the limits divided by
    /// `share` (1 for the shared limits; the expected processes for `fail_mode = "local"`).
    fn call_for(&self, algorithm: &Algorithm, store_key: &str, cost: u64, share: u64) -> Option<Call> {
        let part = |limit: u64| as_arg((limit / share).max(1));
        let keys = || vec![store_key.to_owned(), format!("{store_key}:ban")];
        Some(match algorithm {
            Algorithm::TokenBucket { bucket, ban_ms, .. } => {
                let mut call = token_bucket_call(store_key, &local_share(bucket, share), cost, cost);
                if *ban_ms > 0 {
                    call.keys = keys();
                    call.args.push(as_arg(*ban_ms));
                }
                call
            }
            Algorithm::SlidingLog {
                limit,
                window_ms,
                ban_ms,
            } => {
                let n = self.inner.members.fetch_add(1, Ordering::Relaxed);
                Call::new(
                    Script::SlidingLog,
                    keys(),
                    vec![as_arg(*window_ms), part(*limit), as_arg(cost), as_arg(*ban_ms)],
                )
                .with_member(format!("{}-{n}", self.inner.member_prefix))
            }
            Algorithm::FixedWindow {
                limit,
                window_ms,
                align_ms,
                ban_ms,
            } => Call::new(
                Script::FixedWindow,
                keys(),
                vec![
                    as_arg(*window_ms),
                    part(*limit),
                    as_arg(cost),
                    as_arg(*ban_ms),
                    align_ms.map_or(-1, as_arg),
                ],
            ),
            Algorithm::SlidingWindow {
                limit,
                window_ms,
                sub_buckets,
                ban_ms,
            } => Call::new(
                Script::SlidingWindow,
                keys(),
                vec![
                    as_arg(*window_ms),
                    as_arg(*sub_buckets),
                    part(*limit),
                    as_arg(cost),
                    as_arg(*ban_ms),
                ],
            ),
            Algorithm::LeakyBucket { max_wait_ms, .. } => {
                return self.acquire_call(algorithm, store_key, cost, *max_wait_ms, share);
            }
        })
    }

    /// After the store answered for `store_key`: when `fail_mode = "local"` decided for it alone while the store
    /// failed, charges that to the shared bucket ([`Limiter::settle`]) before the key's next lease or call. The
    /// debit runs as a task of its own, so a caller dropped meanwhile loses nothing; the caller waits for it,
    /// so no second burst is admitted before it lands. Nothing to do (the common case) costs one map lookup.
    async fn settle_after_answer(&self, store_key: &str) {
        if self.inner.unsettled.is_empty() {
            return;
        }
        if let Some((store_key, bucket)) = self.inner.unsettled.remove(store_key) {
            let this = self.clone();
            let _ = self
                .inner
                .tracker
                .spawn(async move { this.settle(store_key, bucket).await })
                .await;
        }
    }

    /// Tokens `fail_mode = "local"` admitted for `store_key` alone that its local share has not refilled yet.
    fn unsettled_tokens(&self, store_key: &str, bucket: &TokenBucket) -> u64 {
        let local = local_share(bucket, self.inner.expected_processes);
        let probe = token_return_call(store_key, &local, 0);
        self.inner
            .fallback
            .run_sync(&probe)
            .map_or(0, |now| local.capacity.saturating_sub(now.remaining))
    }

    /// Charges the shared bucket of `store_key` with the tokens `fail_mode = "local"` admitted for it alone and
    /// that its local share has not refilled yet, so that the return to the shared limits is not a second burst
    /// on top of the local one (a debit of `token_return.lua`; it may put the bucket in debt, so it may come after
    /// the key's first grant). The tokens leave the local ledger (its share is refilled) before the debit is sent,
    /// so a concurrent settle of the same key cannot charge them again; a debit that fails puts them back and the
    /// key is settled after the store's next answer.
    async fn settle(&self, store_key: String, bucket: TokenBucket) {
        let spent = self.unsettled_tokens(&store_key, &bucket);
        if spent == 0 {
            return;
        }
        let local = local_share(&bucket, self.inner.expected_processes);
        let fallback = &self.inner.fallback;
        let _ = fallback.run_sync(&token_return_call(&store_key, &local, as_arg(spent)));
        let mut debit = token_return_call(&store_key, &bucket, -as_arg(spent));
        // As a lease: a debit timed out after Redis applied it would be applied again.
        debit.timeout = Some(self.inner.lease_timeout);
        match self.run(&debit).await {
            Ok(_) => tracing::debug!(key = %store_key, tokens = spent, "charged what fail_mode local admitted"),
            Err(_) => {
                let _ = fallback.run_sync(&token_return_call(&store_key, &local, -as_arg(spent)));
                self.inner.unsettled.insert(store_key, bucket);
            }
        }
    }

    /// Remembers that `fail_mode = "local"` granted tokens of `store_key` alone (token buckets only), at most
    /// `max_local_keys` keys; the sweeper forgets those whose local share has refilled.
    fn owe(&self, algorithm: &Algorithm, store_key: &str) {
        if let Algorithm::TokenBucket { bucket, .. } = algorithm {
            let unsettled = &self.inner.unsettled;
            if !unsettled.contains_key(store_key) && unsettled.len() < self.inner.local_config.max_local_keys {
                unsettled.insert(store_key.to_owned(), *bucket);
            }
        }
    }

    /// Decides by the rule's `fail_mode` after a store failure.
    fn fallback(
        &self,
        compiled: &Compiled,
        algorithm: &Algorithm,
        store_key: &str,
        cost: u64,
        error: &StoreError,
    ) -> Decision {
        tracing::debug!(rule = %compiled.rule.name, %error, "store failed; deciding by fail_mode");
        let decision = |allowed: bool, retry_after: Duration| Decision {
            allowed,
            remaining: 0,
            retry_after,
            reset_after: Duration::ZERO,
            source: Source::Fallback,
            shadowed: false,
        };
        match compiled.fail_mode {
            FailMode::Open => decision(true, Duration::ZERO),
            FailMode::Closed => decision(false, self.inner.backoff),
            FailMode::Local => {
                let share = self.inner.expected_processes;
                let call = self.call_for(algorithm, store_key, cost, share);
                match call.map(|c| self.inner.fallback.run_sync(&c)) {
                    Some(Ok(reply)) if reply.retry_after_ms != NEVER || reply.granted > 0 => {
                        if reply.granted > 0 {
                            self.owe(algorithm, store_key);
                        }
                        Decision::from_reply(&reply, cost, Source::Fallback)
                    }
                    _ => decision(false, self.inner.backoff),
                }
            }
        }
    }

    async fn check_leased(
        &self,
        compiled: &Arc<Compiled>,
        bucket: &TokenBucket,
        lease: &Lease,
        key: &str,
        cost: u64,
    ) -> Decision {
        let local = match compiled.local.get(key) {
            Some(b) => b.clone(),
            None => {
                let now = self.inner.clock.now_ns();
                let store_key = self.store_key(&compiled.rule.name, key);
                compiled
                    .local
                    .entry(key.to_owned())
                    .or_insert_with(|| Arc::new(LocalBucket::new(store_key, *bucket, *lease, now)))
                    .clone()
            }
        };
        let clock = &self.inner.clock;
        let give_up_at = clock.now_ns().saturating_add(ns(self.inner.lease_wait));
        let mut local = local;
        loop {
            if local.is_retired() {
                // Evicted or reloaded under us: go on with the key's current bucket (a new one if none).
                let store_key = local.store_key.clone();
                let now = clock.now_ns();
                local = compiled
                    .local
                    .entry(key.to_owned())
                    .or_insert_with(|| Arc::new(LocalBucket::new(store_key, *bucket, *lease, now)))
                    .clone();
                if local.is_retired() || self.inner.closed.load(Ordering::Acquire) {
                    let error = StoreError::timeout("token_bucket", Duration::ZERO);
                    return self.fallback(compiled, &unleased(bucket), &local.store_key, cost, &error);
                }
            }
            let now = clock.now_ns();
            if local.has_expired(now) {
                self.expire(compiled, &local, now);
            }
            if let Some(decision) = self.decide_locally(compiled, &local, cost, now) {
                return decision;
            }
            if local.is_failing(now) {
                let error = StoreError::timeout("token_bucket", self.inner.lease_wait);
                return self.fallback(compiled, &unleased(bucket), &local.store_key, cost, &error);
            }
            if now >= give_up_at {
                // Leases keep arriving but other callers spend them first: refuse briefly rather than queue.
                return Decision {
                    allowed: false,
                    remaining: 0,
                    retry_after: Duration::from_millis(1),
                    reset_after: Duration::from_nanos(local.reset_after_ns(now)),
                    source: Source::Local,
                    shadowed: false,
                };
            }
            local.mark_starved();
            let notified = local.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if local.available() >= cost {
                continue;
            }
            if !local.lease_in_flight() && !self.start_lease(compiled, &local, cost) {
                if self.inner.closed.load(Ordering::Acquire) {
                    return Decision {
                        allowed: false,
                        remaining: 0,
                        retry_after: Duration::ZERO,
                        reset_after: Duration::ZERO,
                        source: Source::Local,
                        shadowed: false,
                    };
                }
                continue;
            }
            let wait = Duration::from_nanos(give_up_at.saturating_sub(now));
            if tokio::time::timeout(wait, notified).await.is_err() {
                // The store is slow: the next callers decide by fail_mode at once while the lease goes on.
                local.failed(self.inner.backoff, clock.now_ns());
                let error = StoreError::timeout("token_bucket", self.inner.lease_wait);
                return self.fallback(compiled, &unleased(bucket), &local.store_key, cost, &error);
            }
        }
    }

    /// Starts the key's lease in the background unless one is in flight; `false` when one already is, the
    /// bucket is retired or the limiter is shut down.
    fn start_lease(&self, compiled: &Arc<Compiled>, local: &Arc<LocalBucket>, cost: u64) -> bool {
        if self.inner.closed.load(Ordering::Acquire) || !local.claim_lease() {
            return false;
        }
        let this = self.clone();
        let (compiled, local) = (compiled.clone(), local.clone());
        // A spawned task, so that a caller dropping its future never strands tokens granted mid-call.
        self.inner
            .tracker
            .spawn(async move { this.lease(&compiled, &local, cost).await });
        true
    }

    async fn lease(&self, compiled: &Compiled, local: &LocalBucket, cost: u64) {
        /// Releases the key's lease slot however the lease ends (a cancelled task, a panicking store).
        struct Finish<'a>(&'a LocalBucket);
        impl Drop for Finish<'_> {
            fn drop(&mut self) {
                self.0.finish_lease();
            }
        }
        let _finish = Finish(local);
        let (bucket, lease) = (&local.bucket, &local.lease);
        let clock = &self.inner.clock;
        let sent = clock.now_ns();
        // At most half of this process's share of the burst at once, so the others get theirs.
        let fair_share = bucket.capacity / (2 * self.inner.expected_processes);
        let plan = local.plan(lease, fair_share, cost, sent);
        let mut call = token_bucket_call(&local.store_key, bucket, plan.min, plan.max);
        // Callers wait at most `lease_wait`, but the lease itself waits longer for its reply: a lease that
        // timed out after Redis granted it would strand its tokens.
        call.timeout = Some(self.inner.lease_timeout);
        let result = self.run(&call).await;
        let answered = result.is_ok();
        let now = clock.now_ns();
        tracing::trace!(key = %local.store_key, min = plan.min, max = plan.max, sent, now, ?result, "lease");
        let m = &compiled.metrics;
        match result {
            Ok(reply) if reply.granted > 0 => {
                if reply.granted < plan.max {
                    m.lease_partial.increment(1);
                } else {
                    m.lease_granted.increment(1);
                }
                m.leased_tokens.increment(reply.granted);
                self.inner.leased_tokens.fetch_add(reply.granted, Ordering::Relaxed);
                // The deadline counts from when the lease was sent: never later than the grant.
                let deadline = sent.saturating_add(ns(lease.ttl));
                if self.inner.closed.load(Ordering::Acquire) || !local.add(&reply, deadline, plan, bucket, now) {
                    // Shut down, retired, or a reply later than its TTL: the tokens go straight back.
                    self.give_back(compiled, local, reply.granted).await;
                }
            }
            Ok(reply) => {
                m.lease_refused.increment(1);
                local.refused(
                    ms_to_ns(reply.retry_after_ms),
                    ns(NEVER_RECHECK),
                    ms_to_ns(reply.reset_after_ms),
                    now,
                );
            }
            Err(error) => {
                m.lease_error.increment(1);
                tracing::debug!(rule = %compiled.rule.name, %error, "lease failed");
                local.failed(self.inner.backoff, now);
            }
        }
        if answered {
            // Still holding the key's lease slot: its next lease waits for the debit.
            self.settle_after_answer(&local.store_key).await;
        }
    }

    /// Expires the key's overdue tokens and gives them back in the background.
    fn expire(&self, compiled: &Arc<Compiled>, local: &Arc<LocalBucket>, now: u64) {
        let n = local.expire(now);
        if n > 0 {
            let this = self.clone();
            let (compiled, local) = (compiled.clone(), local.clone());
            self.inner
                .tracker
                .spawn(async move { this.give_back(&compiled, &local, n).await });
        }
    }

    /// Gives `n` unused tokens back to the shared bucket (capped at its capacity by the script).
    async fn give_back(&self, compiled: &Compiled, local: &LocalBucket, n: u64) {
        let call = token_return_call(&local.store_key, &local.bucket, as_arg(n));
        match self.run(&call).await {
            Ok(_) => {
                compiled.metrics.returned_tokens.increment(n);
                self.inner.returned_tokens.fetch_add(n, Ordering::Relaxed);
            }
            Err(error) => {
                tracing::debug!(rule = %compiled.rule.name, %error, tokens = n, "return failed; tokens lost")
            }
        }
    }

    /// One pass of the sweeper: expire overdue leases, evict idle keys, update the gauges.
    fn sweep(&self) {
        let now = self.inner.clock.now_ns();
        let idle_ns = ns(self.inner.local_config.idle_ttl);
        let mut keys = 0;
        for compiled in &self.all_compiled() {
            if compiled.rule.lease().is_none() {
                continue;
            }
            let mut outstanding = 0;
            for entry in compiled.local.iter() {
                if entry.has_expired(now) {
                    self.expire(compiled, entry.value(), now);
                }
                outstanding += entry.available();
            }
            compiled.local.retain(|_, b| {
                let idle = now.saturating_sub(b.last_used_ns.load(Ordering::Relaxed)) >= idle_ns;
                !(idle && b.available() == 0 && !b.lease_in_flight())
            });
            let over = compiled
                .local
                .len()
                .saturating_sub(self.inner.local_config.max_local_keys);
            if over > 0 {
                self.evict_idlest(compiled, over);
            }
            keys += compiled.local.len();
            compiled.metrics.outstanding.set(outstanding as f64);
        }
        telemetry::local_keys(keys);
        if !self.inner.unsettled.is_empty() {
            self.inner
                .unsettled
                .retain(|store_key, bucket| self.unsettled_tokens(store_key, bucket) > 0);
        }
    }

    /// Evicts the `n` least recently leased keys of a rule, giving their tokens back.
    fn evict_idlest(&self, compiled: &Arc<Compiled>, n: usize) {
        // A key with a lease in flight stays: the lease would add tokens to a bucket no longer in the map.
        let mut ages: Vec<(u64, String)> = compiled
            .local
            .iter()
            .filter(|e| !e.lease_in_flight())
            .map(|e| (e.last_used_ns.load(Ordering::Relaxed), e.key().clone()))
            .collect();
        ages.sort_unstable();
        for (_, key) in ages.into_iter().take(n) {
            if let Some((_, local)) = compiled.local.remove_if(&key, |_, b| !b.lease_in_flight()) {
                self.drain_in_background(compiled, local);
            }
        }
    }

    /// Stops the limiter: later calls get [`Error::ShutDown`]; leases in flight finish; every leased token not
    /// spent is given back to the shared bucket, and what `fail_mode = "local"` admitted alone and is not charged
    /// yet is charged to it, before this returns.
    pub async fn shutdown(&self) {
        self.inner.closed.store(true, Ordering::Release);
        self.inner.cancel.cancel();
        self.inner.tracker.close();
        self.inner.tracker.wait().await;
        let mut returns = tokio::task::JoinSet::new();
        for compiled in &self.all_compiled() {
            for entry in compiled.local.iter() {
                let tokens = entry.drain();
                if tokens > 0 {
                    let this = self.clone();
                    let compiled = compiled.clone();
                    let local = entry.value().clone();
                    returns.spawn(async move { this.give_back(&compiled, &local, tokens).await });
                }
            }
            compiled.local.clear();
        }
        // What `fail_mode = "local"` admitted alone and is not charged yet is charged now, so a restart right
        // after an outage is no second burst either (a debit that fails now is lost with the process).
        let pending: Vec<String> = self.inner.unsettled.iter().map(|e| e.key().clone()).collect();
        for key in pending {
            if let Some((store_key, bucket)) = self.inner.unsettled.remove(&key) {
                let this = self.clone();
                returns.spawn(async move { this.settle(store_key, bucket).await });
            }
        }
        while returns.join_next().await.is_some() {}
    }
}

/// Nanoseconds of the wall clock: tells apart two limiters of one process id (a restarted process).
fn clock_seed() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// A leased bucket's algorithm without its lease: what the fail mode runs in its stead.
fn unleased(bucket: &TokenBucket) -> Algorithm {
    Algorithm::TokenBucket {
        bucket: *bucket,
        lease: None,
        ban_ms: 0,
    }
}

fn as_arg(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// One process's share of a bucket shared by `share` processes: `capacity / share` tokens, refilled at
/// `rate / share` per period, which is `rate` per `share × per` (exact).
fn local_share(bucket: &TokenBucket, share: u64) -> TokenBucket {
    TokenBucket {
        capacity: (bucket.capacity / share).max(1),
        rate: bucket.rate,
        per_ms: bucket.per_ms.saturating_mul(share),
    }
}

/// `token_return.lua`'s call: `tokens` back to the bucket, or a debit of `-tokens` when negative.
fn token_return_call(store_key: &str, b: &TokenBucket, tokens: i64) -> Call {
    Call::new(
        Script::TokenReturn,
        vec![store_key.to_owned()],
        vec![as_arg(b.capacity), as_arg(b.rate), as_arg(b.per_ms), tokens],
    )
}

fn token_bucket_call(store_key: &str, b: &TokenBucket, min: u64, max: u64) -> Call {
    Call::new(
        Script::TokenBucket,
        vec![store_key.to_owned()],
        vec![
            as_arg(b.capacity),
            as_arg(b.rate),
            as_arg(b.per_ms),
            as_arg(min),
            as_arg(max),
        ],
    )
}
