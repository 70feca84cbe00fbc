//! The decision: the one path every check takes. [`Limiter::check`](crate::Limiter::check),
//! [`Limiter::check_rule`](crate::Limiter::check_rule) and [`RuleHandle::check`](crate::RuleHandle::check) (and
//! the sidecar's routes, which call them) find their rule and hand it here, as tokio's `Semaphore` is a thin layer
//! over its batch semaphore.
//!
//! [`Engine::decide_now`] is the part decided without waiting: the key and cost checked against the rule, then
//! the key's leased tokens when it has them (tens of nanoseconds, this thread's cache of the key's bucket first).
//! [`Engine::decide`] is the rest: a peek for a cost of 0, a hot key's lease or its fail mode (`lease/engine.rs`),
//! or one store call, decided by the rule's `fail_mode` when the store fails (`fallback.rs`). A key the store
//! refused lately is refused in process until the refusal's `retry_after` (`refusals.rs`).

use std::sync::Arc;
use std::time::Duration;

use crate::compiled::Compiled;
use crate::decision::{Decision, Source};
use crate::error::{Error, FailReason};
use crate::lease::bucket::LocalBucket;
use crate::lease::engine::{Answer, Engine};
use crate::nearby;
use crate::rule::{self, Algorithm};
use crate::store::call::{store_key, Call};

impl Engine {
    /// Decides `cost` tokens of `key` under `compiled` now when that needs no wait: checks the call (see
    /// [`Engine::validate`]), then answers from the key's leased tokens when it has them. `Ok(None)`: the call
    /// is valid and [`Engine::decide`] decides it.
    ///
    /// # Errors
    /// [`Error::ShutDown`] after shutdown; as [`Engine::validate`].
    #[inline(always)]
    pub(crate) fn decide_now(
        self: &Arc<Self>,
        compiled: &Arc<Compiled>,
        key: &str,
        cost: u64,
    ) -> Result<Option<Decision>, Error> {
        if self.background.is_closed() {
            return Err(Error::ShutDown);
        }
        self.validate(compiled, key, cost)?;
        if let Some(decision) = self.answer_hot(compiled, key, cost) {
            return Ok(Some(decision));
        }
        Ok(self.answer_refused(compiled, key, cost))
    }

    /// The hot path of [`Engine::decide_now`] in plain integers: the answer of `key`'s leased tokens (a shadow
    /// rule's refusal turned into an allowance, as [`Compiled::shadowed`]), `None` when anything else decides
    /// the call, an invalid one or a shut-down limiter's included ([`Engine::decide_now`] says which). Plain
    /// integers, because a `Decision` returned through a closure is copied in 16-byte moves that stall on the
    /// field-by-field stores that wrote it (`nearby.rs`).
    #[inline(always)]
    pub(crate) fn answer_now(self: &Arc<Self>, compiled: &Arc<Compiled>, key: &str, cost: u64) -> Option<Answer> {
        if !compiled.leased || cost == 0 || self.background.is_closed() || self.validate(compiled, key, cost).is_err() {
            return None;
        }
        let now = self.recent.now_ns();
        let answer = nearby::bucket(compiled.generation, key, |local| {
            self.answer_live(compiled, local, cost, now)
        })??;
        Some(if compiled.rule.shadow {
            answer.shadowed()
        } else {
            answer
        })
    }

    /// The refusal this process remembers for `key` (invariant 4, `refusals.rs`): the store refused it lately
    /// and its `retry_after` has not passed. A key with a local bucket is left to it.
    #[inline]
    fn answer_refused(&self, compiled: &Compiled, key: &str, cost: u64) -> Option<Decision> {
        if cost == 0 || (compiled.leased && compiled.leases.contains_key(key)) {
            return None;
        }
        let refused = self
            .refusals
            .answer(compiled.generation, key, cost, self.recent.now_ns())?;
        compiled.metrics.refusals_cached.increment(1);
        Some(compiled.record(refused))
    }

    /// The answer of `local`'s leased tokens at `now` (ns), `None` when its batch expired or its tokens ran out.
    #[inline(always)]
    fn answer_live(
        self: &Arc<Self>,
        compiled: &Arc<Compiled>,
        local: &Arc<LocalBucket>,
        cost: u64,
        now: u64,
    ) -> Option<Answer> {
        if local.has_expired(now) {
            return None;
        }
        self.answer_locally(compiled, local, cost, now)
    }

    /// The hot path of a valid check: the key's leased tokens or its cached refusal, `None` when the key has no
    /// local bucket, its batch expired, or its tokens ran out.
    #[inline(always)]
    fn answer_hot(self: &Arc<Self>, compiled: &Arc<Compiled>, key: &str, cost: u64) -> Option<Decision> {
        if !compiled.leased || cost == 0 {
            return None;
        }
        let now = self.recent.now_ns();
        let decide = |local: &Arc<LocalBucket>| self.answer_live(compiled, local, cost, now);
        // This thread's cache first: the map's shard lock is a line every deciding thread writes.
        let rule = compiled.generation;
        let answer = match nearby::bucket(rule, key, decide) {
            Some(answer) => answer,
            None => match compiled.leases.get(key) {
                Some(local) => {
                    nearby::keep_bucket(rule, local.value());
                    decide(local.value())
                }
                None => None,
            },
        };
        answer.map(|a| compiled.shadowed(a.decision()))
    }

    /// Decides a valid call that [`Engine::decide_now`] did not: a peek for a cost of 0; for a leased rule's hot
    /// key, its leased tokens after the key's lease in flight, or its fail mode; otherwise one store call. A cold
    /// key of a leased rule that finds the shared bucket spent by the fleet is hot from then on.
    ///
    /// # Errors
    /// As [`Engine::peek`] for a cost of 0; otherwise none (a failing store is the fail mode's to decide).
    pub(crate) async fn decide(
        self: &Arc<Self>,
        compiled: &Arc<Compiled>,
        key: &str,
        cost: u64,
    ) -> Result<Decision, Error> {
        if cost == 0 {
            return self.peek(compiled, key).await;
        }
        let algorithm = compiled.rule.algorithm_for(key);
        let decision = match algorithm {
            Algorithm::TokenBucket {
                bucket,
                lease: Some(lease),
                ..
            } => match self.check_hot(compiled, bucket, lease, key, cost).await {
                // A hot key: decided from its leased tokens (and counted by its shards), or by the fail mode.
                Some((decision, true)) => return Ok(compiled.shadowed(decision)),
                Some((decision, false)) => decision,
                // A cold one: one store call, as without a lease (`Call::check` ignores the lease and any ban);
                // hot at once if the fleet spends its bucket.
                None => {
                    let decision = self.check_store(compiled, algorithm, key, cost).await;
                    if decision.source != Source::Fallback {
                        self.heat_up(compiled, (bucket, lease), key, cost, decision.remaining);
                    }
                    decision
                }
            },
            algorithm => self.check_store(compiled, algorithm, key, cost).await,
        };
        Ok(compiled.record(decision))
    }

    /// One store call deciding `cost` tokens of `key` (a leaky bucket answers whether a slot is free now: a
    /// check never waits); the rule's fail mode decides when the store fails.
    async fn check_store(&self, compiled: &Compiled, algorithm: &Algorithm, key: &str, cost: u64) -> Decision {
        let store_key = store_key(&self.key_prefix, &compiled.rule.name, key);
        let call = Call::check(algorithm, &store_key, cost, &self.members).adopted(compiled.adopted_ms);
        let sent_ns = self.clock.now_ns();
        match self.store.run(&call).await {
            Ok(reply) => {
                let decision = Decision::from_reply(&reply, cost, self.store.source());
                if !decision.allowed {
                    let rule = compiled.generation;
                    self.refusals.remember(rule, key, cost, &decision, sent_ns);
                }
                decision
            }
            Err(error) => {
                tracing::debug!(rule = %compiled.rule.name, %error, "store failed; deciding by fail_mode");
                self.fallback.decide(compiled, FailReason::of(&error))
            }
        }
    }

    /// What a call of `key` would get now, taking nothing: the store's answer for the key (a leased rule's
    /// shared bucket), plus the tokens this process holds for it.
    ///
    /// # Errors
    /// [`Error::Store`] when the store fails or times out (a peek has no fail mode).
    pub(crate) async fn peek(&self, compiled: &Compiled, key: &str) -> Result<Decision, Error> {
        // A leased rule's shared bucket answers as an unleased one would (its call takes no lease).
        let algorithm = compiled.rule.algorithm_for(key);
        let key_in_store = store_key(&self.key_prefix, &compiled.rule.name, key);
        let call = Call::check(algorithm, &key_in_store, 0, &self.members).adopted(compiled.adopted_ms);
        let reply = self.store.run(&call).await?;
        let mut decision = Decision::from_peek(&reply, self.store.source());
        let held = compiled.leases.get(key).map_or(0, |local| local.available());
        if held > 0 {
            decision.remaining = decision.remaining.saturating_add(held);
            decision.allowed = true;
            decision.retry_after = Duration::ZERO;
        }
        Ok(decision)
    }

    /// Checks a call's key and cost against the process settings and the rule: three comparisons when nothing
    /// is wrong.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty key or a key over `max_key_bytes` bytes;
    /// [`Error::CostAboveCapacity`] when the cost can never be granted (an override's capacity included).
    #[inline(always)]
    pub(crate) fn validate(&self, compiled: &Compiled, key: &str, cost: u64) -> Result<(), Error> {
        let fine =
            !key.is_empty() && key.len() <= self.process.max_key_bytes && (1..=compiled.min_capacity).contains(&cost);
        if fine {
            return Ok(());
        }
        self.invalid(compiled, key, cost)
    }

    /// What is wrong with a call's key or cost, if anything (the per-key capacity of an override included).
    #[cold]
    #[inline(never)]
    fn invalid(&self, compiled: &Compiled, key: &str, cost: u64) -> Result<(), Error> {
        if key.is_empty() {
            return Err(rule::invalid(("key", "must not be empty".into())));
        }
        let max = self.process.max_key_bytes;
        if key.len() > max {
            let reason = format!("is {} bytes, more than the {max} allowed", key.len());
            return Err(rule::invalid(("key", reason)));
        }
        if cost <= compiled.min_capacity {
            return Ok(());
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
}
