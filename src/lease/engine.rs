//! The lease engine: finds a leased rule's hot keys (`heat.rs`), decides a hot key from its local bucket, leases
//! a batch (one lease in flight per key per process) when the tokens run low or out, expires tokens past their
//! deadline and gives them back, and sweeps cooled and idle keys out of the map. A key that is not hot is
//! decided by one store call (the limiter's), as if the rule had no lease.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::bucket::{LocalBucket, Take, Unspent};
use super::heat::FEWEST_TELLING;
use super::reserve::{locked, Asked, Reserve};
use super::wait::Slot;
use crate::algorithm::TokenBucket;
use crate::background::Background;
use crate::clock::{duration, nanos, Clock, Recent};
use crate::compiled::Compiled;
use crate::config::ProcessConfig;
use crate::decision::{Decision, Source};
use crate::error::FailReason;
use crate::fallback::Fallback;
use crate::refusals::Refusals;
use crate::rule::{FailMode, Lease};
use crate::store::call::{store_key, Call, Members};
use crate::store::guarded::Guarded;
use crate::telemetry;
use crate::timings::Timings;

/// What leasing needs: the store, the fail modes, the clock, and the counters of leased and returned tokens.
#[derive(Debug)]
pub(crate) struct Engine {
    pub(crate) store: Arc<Guarded>,
    pub(crate) fallback: Arc<Fallback>,
    pub(crate) background: Arc<Background>,
    pub(crate) clock: Arc<dyn Clock>,
    /// The hot path's clock: a reading no earlier than now, refreshed every millisecond.
    pub(crate) recent: Recent,
    pub(crate) key_prefix: String,
    pub(crate) process: ProcessConfig,
    pub(crate) leased_tokens: AtomicU64,
    pub(crate) returned_tokens: AtomicU64,
    /// Unique members of direct sliding-log and leaky-bucket calls.
    pub(crate) members: Arc<Members>,
    /// The keys the store refused lately, refused locally until their `retry_after` (invariant 4).
    pub(crate) refusals: Arc<Refusals>,
    /// The next number of a lease that asks to hold tokens (a hold's `seq`): from the clock's wall ms × 1000 at the
    /// limiter's build, so a process restarted under the same member name numbers after its predecessor.
    pub(crate) hold_seq: AtomicU64,
}

/// A decision made from leased tokens, in plain integers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Answer {
    allowed: bool,
    remaining: u64,
    /// ns; [`crate::clock::NEVER_NS`]: never.
    retry_ns: u64,
    reset_ns: u64,
    /// A shadow rule's refusal, allowed ([`Compiled::shadowed`]).
    shadowed: bool,
}

impl Answer {
    /// A shadow rule's answer: a refusal becomes an allowance, `shadowed` ([`Compiled::shadowed`]).
    #[must_use]
    pub(crate) fn shadowed(self) -> Self {
        if self.allowed {
            return self;
        }
        Self {
            allowed: true,
            retry_ns: 0,
            shadowed: true,
            ..self
        }
    }

    /// The decision (`source = local`).
    #[inline(always)]
    pub(crate) fn decision(self) -> Decision {
        let retry_after = duration(self.retry_ns);
        Decision {
            allowed: self.allowed,
            remaining: self.remaining,
            retry_after,
            reset_after: Duration::from_nanos(self.reset_ns),
            source: Source::Local,
            shadowed: self.shadowed,
        }
    }
}

/// A caller refused briefly, locally: the lease it waited for is slow, or its bucket went away under it.
fn refused_briefly(local: &LocalBucket, now: u64) -> Decision {
    let mut refused = Decision::bare(false, Timings::SLOW_LEASE_RETRY, Source::Local);
    refused.reset_after = Duration::from_nanos(local.reset_after_ns(now));
    refused
}

/// The length of `local`'s reserve in ns: `None` where it keeps none (a rule not under `fail_mode = "local"`, a
/// stock, a reserve of zero).
fn reserve_length(compiled: &Compiled, local: &LocalBucket) -> Option<u64> {
    let reserve = local.lease.reserve.unwrap_or(Lease::DEFAULT_RESERVE);
    (compiled.fail_mode == FailMode::Local && local.bucket.rate > 0 && !reserve.is_zero()).then(|| nanos(reserve))
}

/// The heat at which a key starts leasing: its `hot_after`, by default a quarter of its smallest batch of
/// decisions and at least [`FEWEST_TELLING`] (3, the sketch's noise), counted by [`Heat`](super::heat::Heat)
/// over the recent lease TTLs (each TTL's count halved at the next). A key decided steadily `r` times per TTL
/// reaches about `2r` there, so a key leases from about an eighth of a batch per TTL: a lease and a give-back
/// then cost fewer calls than one per decision, and the batch adapts to the demand.
fn hot_at(lease: &Lease) -> u64 {
    lease.hot_after.unwrap_or((lease.min_batch / 4).max(FEWEST_TELLING))
}

impl Engine {
    /// The hot path: decides from the key's leased tokens or its cached refusal; `None` when a lease (or the
    /// fail mode) must. The caller has checked that the key's bucket holds no expired tokens at `now`, which an
    /// admission confirms ([`crate::clock::Recent::confirmed_ns`]). The answer is in
    /// plain integers (what the hot path moves between its layers; [`Answer::decision`] builds the `Decision`
    /// once, at the end).
    #[inline(always)]
    pub(crate) fn answer_locally(
        self: &Arc<Self>,
        compiled: &Arc<Compiled>,
        local: &Arc<LocalBucket>,
        cost: u64,
        now: u64,
    ) -> Option<Answer> {
        let reset_ns = local.reset_after_ns(now);
        match local.try_take(cost, now) {
            Take::Taken { remaining } => {
                // An admission spends leased tokens: a ticker's reading may stand still (the process was stopped
                // and resumed before the thread ran again), so their deadline is confirmed against the kernel's
                // coarse clock. Only admissions pay for it: a refusal cannot sell what the store did not grant.
                if local.has_expired(self.recent.confirmed_ns(now)) {
                    local.untake(cost);
                    return None;
                }
                if local.below_watermark(remaining, now) {
                    self.start_lease(compiled, local, 1);
                }
                Some(Answer {
                    allowed: true,
                    remaining,
                    retry_ns: 0,
                    reset_ns,
                    shadowed: false,
                })
            }
            Take::Exhausted { retry_ns } => Some(Answer {
                allowed: false,
                remaining: 0,
                retry_ns,
                reset_ns,
                shadowed: false,
            }),
            Take::Empty => None,
        }
    }

    /// Called after a cold decision of a leased rule's `key` that left the shared bucket `remaining` tokens: a
    /// bucket at least a batch below full beyond this decision's `cost` is spent by other processes (the fleet
    /// leases it), so a key one decision short of `hot_after` is hot at once (the warm-up of a fleet of a
    /// thousand would otherwise cost three calls per process). A key further from it stays cold: a process that
    /// decides it less than about once per TTL would lease a few tokens, give most back and cool, a cold call, a
    /// lease and a give-back for each few decisions (a fleet of 256 at 1.1 times the rate sold 64 % so).
    pub(crate) fn heat_up(
        &self,
        compiled: &Compiled,
        (bucket, lease): (&TokenBucket, &Lease),
        key: &str,
        cost: u64,
        remaining: u64,
    ) {
        let drained = remaining.saturating_add(cost).saturating_add(lease.min_batch) <= bucket.capacity;
        let Some(heat) = compiled.heat.get().filter(|_| drained) else {
            return;
        };
        let hash = compiled.hash(key);
        let estimate = heat.estimate(hash) + 1;
        if estimate < hot_at(lease) {
            return;
        }
        let demand = heat.per_s(estimate);
        heat.raise(hash, hot_at(lease));
        // Hot now, on a bucket the fleet spends: its first lease may wait to measure the demand
        // ([`LocalBucket::first_lease_wait`]).
        self.insert_local(compiled, (bucket, lease), key, |made| made.seeded(demand).measuring());
    }

    /// `key`'s local bucket: the one in the map, else a new one, made by `made` from an empty bucket.
    fn insert_local(
        &self,
        compiled: &Compiled,
        (bucket, lease): (&TokenBucket, &Lease),
        key: &str,
        made: impl FnOnce(LocalBucket) -> LocalBucket,
    ) -> Arc<LocalBucket> {
        let now = self.clock.now_ns();
        let store_key = store_key(&self.key_prefix, &compiled.rule.name, key);
        (compiled.leases.entry(key.to_owned()))
            .or_insert_with(|| Arc::new(made(LocalBucket::new(key, store_key, *bucket, *lease, now))))
            .clone()
    }

    /// The key's local bucket: the one in the map, else a new one when the key is hot (see [`hot_at`]), else
    /// `None`: the key is decided by one store call.
    fn local_bucket(
        &self,
        compiled: &Compiled,
        bucket: &TokenBucket,
        lease: &Lease,
        key: &str,
    ) -> Option<Arc<LocalBucket>> {
        if let Some(b) = compiled.leases.get(key) {
            return Some(b.clone());
        }
        let now = self.clock.now_ns();
        let period = compiled.rule.lease().unwrap_or(lease).ttl;
        let heat = compiled.heat.get_or_init(|| super::heat::Heat::new(nanos(period), now));
        let estimate = heat.observe(compiled.hash(key), now);
        if estimate < hot_at(lease) {
            return None;
        }
        let demand = heat.per_s(estimate);
        Some(self.insert_local(compiled, (bucket, lease), key, |made| made.seeded(demand)))
    }

    /// Decides `cost` tokens of a leased rule's hot `key`: from the local bucket, or after the key's lease in
    /// flight (started here when none is), or by the fail mode when the lease fails. A caller waits at most the
    /// lease wait; when leases keep arriving but other callers spend them first, it is refused briefly, locally.
    /// Returns the decision and whether the key's shards counted it already (else the caller records it);
    /// `None` when the key is not hot: decide it by one store call.
    pub(crate) async fn check_hot(
        self: &Arc<Self>,
        compiled: &Arc<Compiled>,
        bucket: &TokenBucket,
        lease: &Lease,
        key: &str,
        cost: u64,
    ) -> Option<(Decision, bool)> {
        let mut local = self.local_bucket(compiled, bucket, lease, key)?;
        let clock = &self.clock;
        let give_up_at = clock.now_ns().saturating_add(nanos(self.store.timings.lease_wait));
        loop {
            if local.is_retired() {
                // Evicted, cooled or reloaded under us: go on with the key's current bucket, if it has one.
                if self.background.is_closed() {
                    return Some((refused_briefly(&local, clock.now_ns()), false));
                }
                local = match compiled.leases.get(key) {
                    Some(b) if !b.is_retired() => b.clone(),
                    _ => return None,
                };
            }
            let now = clock.now_ns();
            if local.has_expired(now) {
                self.expire(compiled, &local, now);
            }
            if let Some(decision) = self.answer_locally(compiled, &local, cost, now).map(Answer::decision) {
                return Some((decision, true));
            }
            if local.release_early(cost, now, self.fallback.processes(&compiled.rule.name)) {
                continue;
            }
            if let Some(reason) = local.failing(now) {
                // The key's last lease failed: under `local` its reserve sells what it has released, then its
                // fail mode decides.
                if self.draw_reserve(compiled, &local, cost, now) {
                    return Some((self.fallback.sold_from_reserve(compiled, reason), false));
                }
                return Some((self.fallback.decide(compiled, reason), false));
            }
            if now >= give_up_at {
                // Leases keep arriving but other callers spend them first: refuse briefly rather than queue.
                return Some((refused_briefly(&local, now), false));
            }
            local.mark_starved();
            let notified = local.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if local.available() >= cost {
                continue;
            }
            if !local.lease_in_flight() && !self.start_lease(compiled, &local, cost) {
                if self.background.is_closed() {
                    return Some((Decision::bare(false, Duration::ZERO, Source::Local), false));
                }
                continue;
            }
            let wait = Duration::from_nanos(give_up_at.saturating_sub(now));
            if tokio::time::timeout(wait, notified).await.is_err() {
                // The lease is slow, not failed (invariant 13): refuse this caller briefly, locally; the key
                // goes to fail_mode only if the lease itself fails or times out.
                return Some((refused_briefly(&local, clock.now_ns()), false));
            }
        }
    }

    /// Starts the key's lease in the background unless one is in flight; `false` when one already is, the
    /// bucket is retired or the limiter is shut down.
    pub(crate) fn start_lease(self: &Arc<Self>, compiled: &Arc<Compiled>, local: &Arc<LocalBucket>, cost: u64) -> bool {
        if self.background.is_closed() {
            return false;
        }
        let Some(from) = local.claim_lease() else {
            return false;
        };
        let this = self.clone();
        let (compiled, local) = (compiled.clone(), local.clone());
        // A spawned task, so that a caller dropping its future never strands tokens granted mid-call.
        self.background
            .spawn(async move { this.lease(&compiled, &local, (cost, from)).await });
        true
    }

    /// The lease of `cost` (or more) tokens whose slot was claimed `from` ([`LocalBucket::claim_lease`]).
    async fn lease(&self, compiled: &Compiled, local: &LocalBucket, (cost, from): (u64, Slot)) {
        /// Releases the key's lease slot however the lease ends (a cancelled task, a panicking store).
        struct Finish<'a>(&'a LocalBucket);
        impl Drop for Finish<'_> {
            fn drop(&mut self) {
                self.0.finish_lease();
            }
        }
        let _finish = Finish(local);
        let bucket = &local.bucket;
        let clock = &self.clock;
        // The fleet's count divides the fair share (invariant 17): a rule's first lease waits for it. Not
        // answered: the fair share divides by `expected_processes`.
        let _ = self.fallback.fleet.join(&compiled.rule.name).await;
        if local
            .first_lease_wait(from, self.fallback.processes(&compiled.rule.name), clock.now_ns())
            .is_some()
        {
            return;
        }
        let sent = clock.now_ns();
        let processes = self.fallback.processes(&compiled.rule.name);
        // At most this process's share of the burst at once, so the others get theirs.
        let fair_share = bucket.capacity / processes;
        let plan = local.plan(fair_share, cost, sent);
        let hold = self.hold_ask(compiled, local, (processes, plan.batch), sent);
        // Callers wait at most the lease wait, but the lease itself waits longer for its reply: a lease that
        // timed out after Redis granted it would strand its tokens.
        let mut call = Call::lease(&local.store_key, *bucket, (plan.min, plan.max), plan.per_turn)
            .paced(plan.pace)
            .adopted(compiled.adopted_ms)
            .with_timeout(self.store.timings.lease);
        if let Some(asked) = &hold {
            call = call.holding(asked.ask.clone());
        }
        let result = self.store.run(&call).await;
        let now = clock.now_ns();
        if let (Some(asked), Ok(reply)) = (&hold, &result) {
            locked(&local.reserve).answered(asked, reply.held, now);
        }
        tracing::trace!(key = %local.store_key, min = plan.min, max = plan.max, sent, now, ?result, ?plan.pace, plan.per_turn, "lease");
        let m = &compiled.metrics;
        match result {
            Ok(reply) if reply.granted > 0 => {
                if reply.granted < plan.max {
                    m.lease_partial.increment(1);
                } else {
                    m.lease_granted.increment(1);
                }
                m.leased_tokens.increment(reply.granted);
                self.leased_tokens.fetch_add(reply.granted, Ordering::Relaxed);
                // The deadlines count from when the lease was sent: never later than the grant.
                if self.background.is_closed() || !local.add(&reply, sent, plan, now) {
                    // Shut down, retired, or a reply later than its TTL: the tokens go straight back.
                    let unspent = Unspent::default().and(reply.granted, reply.stamp);
                    self.give_back(compiled, local, unspent).await;
                }
            }
            Ok(reply) => {
                m.lease_refused.increment(1);
                local.refused_by_store(&reply, now);
            }
            Err(error) => {
                m.lease_error.increment(1);
                tracing::debug!(rule = %compiled.rule.name, %error, "lease failed");
                local.failed(FailReason::of(&error), self.store.timings.backoff, now);
            }
        }
    }

    /// The ask of a lease of `local` sent at `sent_ns` to hold its reserve, in a fleet of `processes`, for leases
    /// of `batch` tokens; `None` when it has none to ask for or keep (see `reserve_length`).
    fn hold_ask(
        &self,
        compiled: &Compiled,
        local: &LocalBucket,
        (processes, batch): (u64, u64),
        sent_ns: u64,
    ) -> Option<Asked> {
        let reserve = reserve_length(compiled, local)?;
        let mut held = locked(&local.reserve);
        let ((most, spent), holding) = (local.reserve_want(processes, reserve), held.tokens(sent_ns));
        // The demand only slows the hold's growth, by a batch a lease at most (a fleet's first leases, before it
        // knows its size, would each hold the share of a fleet of one); the hold shrinks only to the share of a
        // larger fleet. Following the demand down, it would give back and take again at each wobble, and drop
        // its reserve in an outage, whose decisions the demand does not count.
        let want = if holding > most {
            most
        } else {
            spent.max(holding).min(holding.saturating_add(batch))
        };
        if want == 0 && *held == Reserve::Empty {
            return None;
        }
        let seq = self.hold_seq.fetch_add(1, Ordering::Relaxed);
        let hold_ns = reserve.saturating_add(nanos(Timings::HOLD_MARGIN));
        Some(held.ask((self.members.name(), seq), want, hold_ns, sent_ns))
    }

    /// Tokens held for the hot keys of `rules` now (their reserves, `fail_mode = "local"`).
    pub(crate) fn reserved_tokens<'a>(&self, rules: impl IntoIterator<Item = &'a Arc<Compiled>>) -> u64 {
        let now = self.clock.now_ns();
        let held = |c: &Arc<Compiled>| {
            c.leases
                .iter()
                .map(|l| locked(&l.value().reserve).tokens(now))
                .sum::<u64>()
        };
        rules.into_iter().map(held).sum()
    }

    /// Draws `cost` tokens of `local`'s reserve at `now` (`fail_mode = "local"`), the hold's end confirmed
    /// against the coarse clock as leased tokens' deadlines are; whether it did.
    fn draw_reserve(&self, compiled: &Compiled, local: &LocalBucket, cost: u64, now: u64) -> bool {
        let Some(reserve) = reserve_length(compiled, local) else {
            return false;
        };
        locked(&local.reserve).draw(cost, reserve, self.recent.confirmed_ns(now))
    }

    /// Expires the key's overdue tokens and gives them back in the background.
    fn expire(self: &Arc<Self>, compiled: &Arc<Compiled>, local: &Arc<LocalBucket>, now: u64) {
        let unspent = local.expire(now, self.fallback.processes(&compiled.rule.name));
        if unspent.tokens() > 0 {
            let this = self.clone();
            let (compiled, local) = (compiled.clone(), local.clone());
            self.background
                .spawn(async move { this.give_back(&compiled, &local, unspent).await });
        }
    }

    /// Gives `n` unused tokens back to the shared bucket, tokens of the lease stamped `since` or later: the script
    /// adds at most the room the bucket had since that lease (so what the refill replaced counts once), capped
    /// at its top.
    pub(crate) async fn give_back(&self, compiled: &Compiled, local: &LocalBucket, unspent: Unspent) {
        let n = unspent.tokens();
        // Once: a Cluster client retries a call whose connection dropped after the script ran.
        let call = Call::give_back(&local.store_key, local.bucket, n)
            .once(self.members.next(), self.store.timings.mark)
            .since(unspent.lent)
            .adopted(compiled.adopted_ms);
        match self.store.run(&call).await {
            Ok(reply) => {
                tracing::trace!(key = %local.store_key, n, ?call.op, ?reply, "give-back");
                compiled.metrics.returned_tokens.increment(n);
                self.returned_tokens.fetch_add(n, Ordering::Relaxed);
            }
            Err(error) => {
                tracing::debug!(rule = %compiled.rule.name, %error, tokens = n, "return failed; tokens lost")
            }
        }
    }

    /// Takes every token of a local bucket and gives them back in the background.
    fn drain_in_background(self: &Arc<Self>, compiled: &Arc<Compiled>, local: Arc<LocalBucket>) {
        let unspent = local.drain();
        compiled.flush(local.unflushed());
        if unspent.tokens() > 0 {
            let (this, compiled) = (self.clone(), compiled.clone());
            self.background
                .spawn(async move { this.give_back(&compiled, &local, unspent).await });
        }
    }

    /// Gives every leased token of a rule that is no longer in force back to the shared bucket.
    pub(crate) fn retire(self: &Arc<Self>, compiled: &Arc<Compiled>) {
        compiled.retired.store(true, Ordering::Release);
        for entry in compiled.leases.iter() {
            self.drain_in_background(compiled, entry.value().clone());
        }
        compiled.leases.clear();
    }

    /// One pass of the sweeper over these rules: add the hot path's decisions to the metrics, expire overdue
    /// leases, stop leasing keys that cooled down and evict idle ones (giving their tokens back), update the
    /// gauges.
    pub(crate) fn sweep(self: &Arc<Self>, rules: &[Arc<Compiled>]) {
        let now = self.clock.now_ns();
        let idle_ns = nanos(self.process.idle_ttl);
        let mut keys = 0;
        for compiled in rules {
            if !compiled.leased {
                continue;
            }
            let mut outstanding = 0;
            let mut cooled = Vec::new();
            for entry in compiled.leases.iter() {
                let local = entry.value();
                compiled.flush(local.unflushed());
                if local.has_expired(now) {
                    self.expire(compiled, local, now);
                }
                local.sample(now);
                outstanding += local.available() + local.scheduled() + locked(&local.reserve).tokens(now);
                // Cooled: decided fewer than a sixteenth of the smallest batch per TTL, or fewer than once (a key
                // turns hot from about an eighth, and 1.5 times per TTL, see `hot_at`: the gap keeps a key near
                // the threshold from going back and forth), measured over `Timings::COOLING_TTLS` TTLs: over one, a key
                // decided a few times per TTL reads 0 or 2 by chance, and would go cold and hot again, a cold
                // call and a lease each time. Under once per TTL a lease serves one decision at most and gives
                // the rest back: a call per decision, as cold, and one more.
                let ttl_ns = nanos(local.lease.ttl);
                if let Some(per_s) = local.heat(nanos(Timings::cooling(local.lease.ttl)), now) {
                    // Decisions per TTL × 16 < max(min_batch, 16), in decisions × ns (a whole count per TTL
                    // would read 0.9 as 0).
                    let per_ttl_ns = u128::from(per_s) * u128::from(ttl_ns);
                    if per_ttl_ns * 16 < u128::from(local.lease.min_batch.max(16)) * 1_000_000_000 {
                        cooled.push(entry.key().clone());
                    }
                }
            }
            for key in cooled {
                if let Some((_, local)) = compiled.leases.remove_if(&key, |_, b| !b.lease_in_flight()) {
                    self.drain_in_background(compiled, local);
                }
            }
            compiled.leases.retain(|_, b| {
                let idle = now.saturating_sub(b.last_used_ns.load(Ordering::Relaxed)) >= idle_ns;
                let gone = idle && b.available() == 0 && b.scheduled() == 0 && !b.lease_in_flight();
                if gone {
                    b.drain();
                    compiled.flush(b.unflushed());
                }
                !gone
            });
            let over = compiled.leases.len().saturating_sub(self.process.max_local_keys);
            if over > 0 {
                self.evict_idlest(compiled, over);
            }
            keys += compiled.leases.len();
            compiled.metrics.outstanding.set(outstanding as f64);
            compiled.metrics.hot_keys.set(compiled.leases.len() as f64);
        }
        telemetry::local_keys(keys);
    }

    /// Evicts the `n` least recently leased keys of a rule, giving their tokens back.
    fn evict_idlest(self: &Arc<Self>, compiled: &Arc<Compiled>, n: usize) {
        // A key with a lease in flight stays: the lease would add tokens to a bucket no longer in the map.
        let mut ages: Vec<(u64, String)> = compiled
            .leases
            .iter()
            .filter(|e| !e.lease_in_flight())
            .map(|e| (e.last_used_ns.load(Ordering::Relaxed), e.key().clone()))
            .collect();
        ages.sort_unstable();
        for (_, key) in ages.into_iter().take(n) {
            if let Some((_, local)) = compiled.leases.remove_if(&key, |_, b| !b.lease_in_flight()) {
                self.drain_in_background(compiled, local);
            }
        }
    }

    /// Takes every leased token of these rules, for shutdown: `(rule, bucket, unspent)` to give back.
    pub(crate) fn drain(rules: &[Arc<Compiled>]) -> Vec<(Arc<Compiled>, Arc<LocalBucket>, Unspent)> {
        let mut drained = Vec::new();
        for compiled in rules {
            for entry in compiled.leases.iter() {
                let unspent = entry.drain();
                compiled.flush(entry.unflushed());
                if unspent.tokens() > 0 {
                    drained.push((compiled.clone(), entry.value().clone(), unspent));
                }
            }
            compiled.leases.clear();
        }
        drained
    }
}
