//! The [`Limiter`]: one facade over the rules, the lease engine, the store, the fail modes and the queues.
//!
//! `check` borrows its rule from the current snapshot and hands it to the one path of a decision (`decide.rs`):
//! a leased rule's key answered from its local bucket (`lease/engine.rs`), other rules by one store call
//! (`store/guarded.rs`), the rule's `fail_mode` deciding when the store fails (`fallback.rs`). `acquire` waits in a
//! queue (`queue.rs`); `peek` and `reset` look at a key without deciding it. Beside this file: building and
//! reloading (`builder.rs`), a rule resolved once (`handle.rs`), and the limiter's life after building: the
//! sweeper, the fleet's beats, readiness and shutdown (`lifecycle.rs`).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use dashmap::DashMap;

use crate::compiled::Compiled;
use crate::config::RedisConfig;
use crate::decision::{Decision, Permit, Source};
use crate::error::{Error, StoreError};
use crate::lease::engine::Engine;
use crate::queue::Queue;
use crate::rule::{self, FailMode, Quota, Rule};
use crate::store::call::{store_key, Call};

pub(crate) mod builder;
pub(crate) mod handle;
pub(crate) mod lifecycle;
#[cfg(test)]
mod stalled_tests;

/// Rules built in code that are compiled once and kept; beyond this many, each call compiles its rule.
const MAX_ADHOC_RULES: usize = 1024;

/// Rules by name.
type RuleMap = HashMap<String, Arc<Compiled>, foldhash::fast::RandomState>;

/// Counters of one limiter, in calls and tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimiterStats {
    /// Store calls: leases, returns and direct checks (and queue calls), not the beats.
    pub store_calls: u64,
    /// The fleet's beats: one per rule whose fleet this process joined, every second (every 100 ms while cut off
    /// or held).
    pub beats: u64,
    /// Tokens leased from the shared buckets.
    pub leased_tokens: u64,
    /// Leased tokens given back unused.
    pub returned_tokens: u64,
    /// Tokens of paced leases not yet released to this process's callers, now: the store granted them (its
    /// pending line counts them as taken) and they are sold as their chunks come, or given back at shutdown.
    pub pending_tokens: u64,
    /// Tokens the store holds for this process's hot keys under `fail_mode = "local"` (their reserves), now:
    /// sold only while the store fails; out of the shared bucket until their holds end.
    pub reserved_tokens: u64,
    /// Decisions made by `fail_mode` because the store answered with an error.
    pub fail_mode_errors: u64,
    /// Decisions made by `fail_mode` because a store call timed out (a caller's long wait for a lease in flight
    /// is not one: it is refused locally).
    pub fail_mode_timeouts: u64,
    /// Decisions made by `fail_mode` because the circuit breaker was open (the store was not called).
    pub fail_mode_circuit_open: u64,
    /// Refusals answered in process because the store refused the key lately and its `retry_after` had not
    /// passed (no store call).
    pub refusals_answered: u64,
    /// Keys whose last refusal this process remembers now (at most `max_refused_keys`).
    pub refused_keys: usize,
}

#[derive(Debug)]
struct Inner {
    /// This limiter's number, unique for the life of the process (`nearby.rs`).
    id: u64,
    rules: ArcSwap<RuleMap>,
    /// Rules built in code and passed to [`Limiter::check_rule`], compiled once.
    adhoc: DashMap<Rule, Arc<Compiled>, foldhash::fast::RandomState>,
    default_fail_mode: FailMode,
    /// The `[redis]` section the store was built from (`from_config`); a reload may not change it.
    redis: Option<RedisConfig>,
    engine: Arc<Engine>,
    queue: Queue,
}

/// A distributed rate limiter: rules from config or code, decided by a [`crate::Store`] (Redis or in process),
/// with hot keys decided in process from leased tokens. Cheap to clone; clones share everything.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tokenlease::Error> {
/// use std::time::Duration;
/// use tokenlease::{Lease, Limiter, Rule};
///
/// let rule = Rule::token_bucket("sku_buy", 2000, 1000, Duration::from_secs(1))?
///     .with_lease(Lease { min_batch: 10, max_batch: 500, ttl: Duration::from_millis(200), hot_after: None, reserve: None })?;
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

impl Limiter {
    /// Takes `cost` tokens of `key` under `rule`; cost 0 is a peek ([`Limiter::peek`]).
    ///
    /// A leasing rule answers from this process's leased tokens when it has them (tens of nanoseconds), from
    /// its cached "exhausted until" when the shared bucket is empty, and otherwise waits for the key's single
    /// lease in flight. Other rules run one store call. When the store fails, the rule's `fail_mode` decides
    /// (`source == Fallback`).
    ///
    /// # Errors
    /// [`Error::UnknownRule`]; [`Error::InvalidArgument`] for an empty key or a key over `max_key_bytes` bytes;
    /// [`Error::CostAboveCapacity`] when the cost can never be granted; [`Error::ShutDown`] after
    /// [`Limiter::shutdown`].
    pub async fn check(&self, rule: &str, key: &str, cost: u64) -> Result<Decision, Error> {
        let engine = &self.inner.engine;
        // The hot path borrows the rule (from this thread's cache of it, else from the current snapshot) and the
        // key's local bucket: no reference count is touched, so threads deciding on one hot key share no
        // written cache line (the tokens are in per-core shards).
        let answered = crate::nearby::rule(self.inner.id, rule, |compiled| engine.answer_now(compiled, key, cost));
        if let Some(Some(answer)) = answered {
            return Ok(answer.decision());
        }
        let compiled = {
            let rules = self.inner.rules.load();
            let compiled = rules.get(rule).ok_or_else(|| Error::UnknownRule(rule.to_owned()))?;
            if answered.is_none() {
                crate::nearby::keep_rule(self.inner.id, compiled);
            }
            if let Some(decision) = engine.decide_now(compiled, key, cost)? {
                return Ok(decision);
            }
            compiled.clone()
        };
        engine.decide(&compiled, key, cost).await
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
    /// // A community site's comment limit: at most 10 comments in any 30 s.
    /// let comment = Rule::sliding_log("comment", 10, Duration::from_secs(30))?;
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
        let compiled = match self.inner.adhoc.get(rule) {
            Some(c) => c.clone(),
            None => {
                // The name is a public field: it may have been set after the constructor checked it.
                rule::check_name(&rule.name, "name").map_err(rule::invalid)?;
                let adopted_ms = crate::compiled::adopted_now(self.inner.engine.clock.as_ref());
                let c = Arc::new(Compiled::new(rule.clone(), self.inner.default_fail_mode, adopted_ms));
                if self.inner.adhoc.len() < MAX_ADHOC_RULES {
                    self.inner.adhoc.insert(rule.clone(), c.clone());
                }
                c
            }
        };
        let engine = &self.inner.engine;
        if let Some(decision) = engine.decide_now(&compiled, key, cost)? {
            return Ok(decision);
        }
        engine.decide(&compiled, key, cost).await
    }

    /// The convenience API of a blog post on Redis rate limiting: whether `user_id` may do `action_key` once
    /// more, allowing at most `max_count` actions in any `period` (a sliding-window log, exact; no config entry
    /// needed). Keys are `{prefix}:{action_key:user_id}`; refused attempts are not recorded.
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
    /// zero, or `action_key` when it holds a character outside `[A-Za-z0-9_.-]` (it is a rule name: invariant 14);
    /// [`Error::ShutDown`].
    pub async fn is_action_allowed(
        &self,
        user_id: &str,
        action_key: &str,
        period: Duration,
        max_count: u64,
    ) -> Result<bool, Error> {
        if user_id.is_empty() {
            return Err(rule::invalid(("user_id", "must not be empty".into())));
        }
        rule::check_name(action_key, "action_key").map_err(rule::invalid)?;
        let max_count = rule::positive(max_count, "max_count").map_err(rule::invalid)?;
        rule::whole_ms(period, "period").map_err(rule::invalid)?;
        let rule = Rule::sliding_log(action_key, max_count, period)?;
        Ok(self.check_rule(&rule, user_id, 1).await?.allowed)
    }

    /// Waits for a slot of the leaky-bucket rule `rule` for `cost` tokens of `key`: all processes together
    /// leak at the rule's rate (one Redis call per job, `lua/leaky_bucket.lua`), callers of this process are
    /// served first-in first-out. On a token-bucket rule it waits for the tokens instead, Guava-style
    /// ("consume now, pay later", `lua/token_acquire.lua`): a caller not behind a debt takes its tokens at once
    /// and the next caller waits for the debt; the wait is bounded by the time to refill the whole capacity. A
    /// call whose wait would exceed the rule's `max_wait` is refused at once with [`Error::QueueFull`] (its
    /// `retry_after` says when a call would fit): nobody waits only to fail.
    ///
    /// Dropping the future while it waits gives up its place. A slot already reserved in Redis is handed back
    /// (`lua/leaky_return.lua`) when it is still the last one reserved; otherwise Redis keeps it (moving it would
    /// move every caller queued behind it) and this process's next caller of the key takes it over.
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
    /// leaky nor a token bucket, an empty or oversized key, a zero cost; [`Error::CostAboveCapacity`] for a cost
    /// above the rule's rate; [`Error::Store`] when the store fails and the rule's `fail_mode` is `closed`.
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

    /// The configured rule named `rule`, unless the limiter is shut down (the calls that hold the rule past an
    /// await: `acquire`, `peek`, `reset`).
    fn compiled(&self, rule: &str) -> Result<Arc<Compiled>, Error> {
        if self.inner.engine.background.is_closed() {
            return Err(Error::ShutDown);
        }
        let compiled = self.inner.rules.load().get(rule).cloned();
        compiled.ok_or_else(|| Error::UnknownRule(rule.to_owned()))
    }

    async fn acquire_within(&self, rule: &str, key: &str, cost: u64, max: Option<Duration>) -> Result<Permit, Error> {
        let compiled = self.compiled(rule)?;
        if cost == 0 {
            return Err(rule::invalid(("cost", "must be at least 1 token".into())));
        }
        self.inner.engine.validate(&compiled, key, cost)?;
        self.inner.queue.acquire(&compiled, key, cost, max).await
    }

    /// The store key of `key` under `rule`: `{prefix}:{rule:key}`, the hash tag keeping a rule's keys for one
    /// key in one Redis Cluster slot.
    pub fn store_key(&self, rule: &str, key: &str) -> String {
        store_key(&self.inner.engine.key_prefix, rule, key)
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

    /// Store calls made so far by this limiter (leases, returns and direct checks), not counting the fleet's
    /// beats ([`LimiterStats::beats`]).
    pub fn store_calls(&self) -> u64 {
        let engine = &self.inner.engine;
        engine.store.calls().saturating_sub(engine.fallback.fleet.beats())
    }

    /// Store calls since the limiter was built, per script, by the script's name (`token_lease` leases,
    /// `token_return` give-backs, `fleet` beats, `token_bucket`, `fixed_window`... direct checks),
    /// every script listed; the counts sum to [`Limiter::store_calls`] plus [`LimiterStats::beats`].
    pub fn store_calls_by_script(&self) -> Vec<(&'static str, u64)> {
        self.inner.engine.store.calls_by_script()
    }

    /// The live processes of `rule`'s fleet as this limiter last counted them (invariant 17): its roster in the
    /// store, beaten every second by each process that calls the store for the rule; every share of the rule
    /// divides by it. Before the rule's first count (no store call for it yet, or the store never answered) it is
    /// the configured `expected_processes`. Also the gauge `tokenlease_fleet_processes{rule}`.
    pub fn processes(&self, rule: &str) -> u64 {
        self.inner.engine.fallback.processes(rule)
    }

    /// Counters of this limiter since it was built (also exported as metrics).
    pub fn stats(&self) -> LimiterStats {
        let engine = &self.inner.engine;
        let [fail_mode_errors, fail_mode_timeouts, fail_mode_circuit_open] = engine.fallback.decided();
        LimiterStats {
            store_calls: self.store_calls(),
            beats: engine.fallback.fleet.beats(),
            leased_tokens: engine.leased_tokens.load(Ordering::Relaxed),
            returned_tokens: engine.returned_tokens.load(Ordering::Relaxed),
            pending_tokens: (self.inner.rules.load().values())
                .map(|c| c.leases.iter().map(|l| l.value().scheduled()).sum::<u64>())
                .sum(),
            reserved_tokens: engine.reserved_tokens(self.inner.rules.load().values()),
            fail_mode_errors,
            fail_mode_timeouts,
            fail_mode_circuit_open,
            refusals_answered: engine.refusals.answered(),
            refused_keys: engine.refusals.len(),
        }
    }

    /// The store's `source` label.
    pub fn store_source(&self) -> Source {
        self.inner.engine.store.source()
    }

    /// Keys holding leased tokens in this process.
    pub fn local_keys(&self) -> usize {
        self.inner.rules.load().values().map(|c| c.leases.len()).sum()
    }

    /// Whether the store answers now.
    ///
    /// # Errors
    /// The store's error.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.inner.engine.store.ping().await
    }

    /// Whether the circuit breaker in front of the store is open: calls are decided by `fail_mode` without
    /// reaching the store until a probe succeeds.
    pub fn circuit_open(&self) -> bool {
        self.inner.engine.store.circuit_open()
    }

    /// Every compiled rule: configured and built in code.
    fn all_compiled(&self) -> Vec<Arc<Compiled>> {
        let mut all: Vec<_> = self.inner.rules.load().values().cloned().collect();
        all.extend(self.inner.adhoc.iter().map(|e| e.value().clone()));
        all
    }
}

/// Looking at a key without deciding it, and forgetting it.
impl Limiter {
    /// The state of `key` under `rule`, taking nothing (a peek; `check` with cost 0 is the same).
    ///
    /// `remaining` is what the shared state has left (tokens, or the window's room) plus, for a key this
    /// process leases, the tokens it holds (tokens other processes hold are theirs until their leases end);
    /// `allowed` says whether a call of one token would be admitted now, `retry_after` how long until it
    /// would, `reset_after` how long until the key is back to its full allowance. Nothing is recorded or
    /// banned, no decision is counted in the metrics, and a leaky bucket's queue is not joined. The peek is
    /// one store call (with the store's timeout); the fail mode does not answer for it.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tokenlease::Error> {
    /// use std::time::Duration;
    /// use tokenlease::{Limiter, Rule};
    ///
    /// let limiter = Limiter::builder()
    ///     .rule(Rule::fixed_window("post", 3, Duration::from_secs(60))?)
    ///     .build()?;
    /// limiter.check("post", "user:7", 1).await?;
    /// let state = limiter.peek("post", "user:7").await?;
    /// assert_eq!((state.allowed, state.remaining), (true, 2));
    /// assert_eq!(limiter.check("post", "user:7", 0).await?.remaining, 2); // the same peek
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::UnknownRule`]; [`Error::InvalidArgument`] for an empty or oversized key; [`Error::Store`] when
    /// the store fails or times out; [`Error::ShutDown`] after [`Limiter::shutdown`].
    pub async fn peek(&self, rule: &str, key: &str) -> Result<Decision, Error> {
        let compiled = self.compiled(rule)?;
        let engine = &self.inner.engine;
        engine.validate(&compiled, key, 0)?;
        engine.peek(&compiled, key).await
    }

    /// Forgets `key` under `rule`: its shared state (bucket, log, window or queue) and its ban are deleted, so
    /// the key starts afresh (a token bucket full, a window empty), and the tokens this process holds for it
    /// are dropped (not given back: the bucket is full again). Other processes keep the tokens they hold for
    /// the key until their leases end (at most the lease `ttl`): after a reset the key may admit up to that
    /// much more than a full bucket.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tokenlease::Error> {
    /// use std::time::Duration;
    /// use tokenlease::{Limiter, Rule};
    ///
    /// let limiter = Limiter::builder()
    ///     .rule(Rule::fixed_window("post", 1, Duration::from_secs(60))?)
    ///     .build()?;
    /// assert!(limiter.check("post", "user:7", 1).await?.allowed);
    /// assert!(!limiter.check("post", "user:7", 1).await?.allowed);
    /// limiter.reset("post", "user:7").await?; // a moderator lifts the limit
    /// assert!(limiter.check("post", "user:7", 1).await?.allowed);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Limiter::peek`].
    pub async fn reset(&self, rule: &str, key: &str) -> Result<(), Error> {
        let compiled = self.compiled(rule)?;
        self.inner.engine.validate(&compiled, key, 0)?;
        if let Some((_, local)) = compiled.leases.remove(key) {
            // Retired: a lease in flight that lands later goes straight back.
            local.drain();
            compiled.flush(local.unflushed());
        }
        let engine = &self.inner.engine;
        let call = Call::reset(store_key(&engine.key_prefix, &compiled.rule.name, key));
        engine.store.run(&call).await?;
        engine.refusals.forget(compiled.generation, key);
        Ok(())
    }
}
