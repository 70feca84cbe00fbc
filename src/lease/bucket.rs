//! One key's leased tokens in this process: a [`LocalBucket`].
//!
//! A [`LocalBucket`] is what the hot path touches: the leased tokens in per-core shards (`shards.rs`), taken
//! with one compare-and-swap on the thread's own shard, a deadline, and a cached "exhausted until". Everything
//! slower (the book of leases and their deadlines, the adaptive batch size, the turn a saturated shared bucket
//! handed out) sits behind a mutex that only the lease, expiry and sweep paths take.
//!
//! Invariant 1 (docs/ARCHITECTURE.md, "Invariants") rests on the deadlines: a token is spent at most `ttl` after the lease that
//! brought it was *sent*, so over any span W the process admits at most what Redis granted over W + ttl.
//! Spending is first-in first-out, so what is left always belongs to the newest leases: when a lease's
//! deadline passes, only the tokens beyond what the younger leases brought are expired and given back.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

pub(crate) use super::book::Unspent;
use super::book::{Batch, Book};
use super::schedule::{large_fleet, paced_turn, LeasePlan, Schedule};
use super::shards::{Counts, Shards};
use crate::algorithm::{Pace, Reply, TokenBucket};
use crate::clock::{nanos, NEVER_NS};
use crate::error::FailReason;
use crate::rule::Lease;

/// How long a "never" from the shared bucket is cached locally before asking again.
pub(crate) const NEVER_RECHECK: Duration = Duration::from_secs(1);

/// One key's leased tokens in this process.
#[derive(Debug)]
pub(crate) struct LocalBucket {
    /// The caller's key.
    key: Box<str>,
    /// The store key (`{prefix}:{rule:key}`), built once.
    pub store_key: String,
    /// The shared bucket's parameters for this key (the rule's, or a matching override's).
    pub bucket: TokenBucket,
    /// The lease settings for this key.
    pub lease: Lease,
    /// Tokens that may be spent now, in per-core shards.
    tokens: Shards,
    /// Earliest deadline of a batch holding tokens, or release of a scheduled chunk; [`NEVER_NS`] when none.
    next_deadline_ns: AtomicU64,
    /// When the next scheduled chunk is released; [`NEVER_NS`] when none.
    next_release_ns: AtomicU64,
    /// The shared bucket said "empty": refuse locally until then.
    exhausted_until_ns: AtomicU64,
    /// The shared bucket said it will never have enough (a rate-0 stock): report "never" while exhausted.
    exhausted_never: AtomicBool,
    /// A lease failed: decide by `fail_mode` until then instead of asking the store again.
    failing_until_ns: AtomicU64,
    /// Why the last lease failed: a [`FailReason`] as its index, for the fail_mode metric.
    fail_reason: AtomicU8,
    /// When the shared bucket will be full again, from the last reply.
    full_at_ns: AtomicU64,
    /// Below this many tokens (in all shards) a lease is started in the background.
    low_watermark: AtomicU64,
    /// A caller found too few tokens since the last lease (demand outran the batch).
    starved: AtomicBool,
    /// One lease in flight per key per process.
    in_flight: AtomicBool,
    /// Made hot on a shared bucket the fleet spends, no lease sent yet: the first may wait ([`Self::first_lease_wait`]).
    measuring: AtomicBool,
    /// Drained for good (evicted, its rule reloaded, the limiter shut down): no lease starts and a grant that
    /// arrives is not added (the caller gives it back).
    retired: AtomicBool,
    /// Last time a lease was started (for idle eviction).
    pub last_used_ns: AtomicU64,
    /// Wakes callers waiting on the lease in flight.
    pub notify: Notify,
    book: Mutex<Book>,
}

/// The outcome of the hot path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Take {
    /// Taken; tokens left in this process.
    Taken { remaining: u64 },
    /// The shared bucket is empty for `retry_ns` from now ([`NEVER_NS`]: never).
    Exhausted { retry_ns: u64 },
    /// Too few tokens here: a lease is needed.
    Empty,
}

impl LocalBucket {
    /// A key's empty bucket.
    pub(crate) fn new(key: &str, store_key: String, bucket: TokenBucket, lease: Lease, now_ns: u64) -> Self {
        Self {
            key: key.into(),
            store_key,
            bucket,
            lease,
            tokens: Shards::default(),
            next_deadline_ns: AtomicU64::new(NEVER_NS),
            next_release_ns: AtomicU64::new(NEVER_NS),
            exhausted_until_ns: AtomicU64::new(0),
            exhausted_never: AtomicBool::new(false),
            failing_until_ns: AtomicU64::new(0),
            fail_reason: AtomicU8::new(FailReason::Error as u8),
            full_at_ns: AtomicU64::new(0),
            low_watermark: AtomicU64::new(lease.min_batch / 4),
            starved: AtomicBool::new(false),
            in_flight: AtomicBool::new(false),
            measuring: AtomicBool::new(false),
            retired: AtomicBool::new(false),
            last_used_ns: AtomicU64::new(now_ns),
            notify: Notify::new(),
            book: Mutex::new(Book {
                batches: VecDeque::new(),
                stamps: VecDeque::new(),
                schedule: Schedule::default(),
                batch: lease.min_batch,
                saturated: false,
                last_lease_ns: now_ns,
                decisions_at_lease: 0,
                demand_per_s: 0,
                flushed: Counts::default(),
                heat_at_ns: now_ns,
                decisions_at_heat: 0,
            }),
        }
    }

    /// The caller's key.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// Tokens that may be spent now (a sum over the shards).
    pub(crate) fn available(&self) -> u64 {
        self.tokens.total()
    }

    /// This new bucket was made hot because the fleet spends the shared bucket: its first lease may wait to
    /// measure the demand ([`Self::first_lease_wait`]).
    #[must_use]
    pub(crate) fn measuring(self) -> Self {
        self.measuring.store(true, Ordering::Release);
        self.lock().saturated = true;
        self
    }

    /// Whether this bucket's first lease, about to be sent at `now_ns` in a fleet of `processes`, waits: when the
    /// bucket was made hot on a shared bucket the fleet spends ([`Self::measuring`]) and the fleet's first turns,
    /// spaced for a guessed `min_batch` each, would take longer than half a TTL to go round, the lease waits until
    /// half a TTL after the bucket was made, its callers refused locally meanwhile (as the fleet's turns would
    /// refuse them) while their decisions measure the demand. The turn the bucket hands it is then spaced for what
    /// it will spend, and the turns do not run together for the rest of the sale. A small fleet leases at once:
    /// its first turns go round within the wait. Returns when the lease may go (ns), `None` when it goes now.
    pub(crate) fn first_lease_wait(&self, processes: u64, now_ns: u64) -> Option<u64> {
        if !self.measuring.swap(false, Ordering::AcqRel) {
            return None;
        }
        if !large_fleet((&self.bucket, &self.lease), processes) {
            return None;
        }
        let half_ttl = u64::try_from(self.lease.ttl.as_nanos() / 2).unwrap_or(u64::MAX);
        let until = self.lock().last_lease_ns.saturating_add(half_ttl);
        if now_ns >= until {
            return None;
        }
        self.exhausted_until_ns.store(until, Ordering::Release);
        Some(until)
    }

    /// Whether a batch's deadline has passed or a scheduled chunk is due, so [`Self::expire`] has work.
    #[inline]
    pub(crate) fn has_expired(&self, now_ns: u64) -> bool {
        now_ns >= self.next_deadline_ns.load(Ordering::Acquire)
    }

    /// The hot path: one compare-and-swap on this thread's shard when tokens are there, one or two loads when
    /// they are not. A taken or refused decision is counted in the shard (`Empty` decides nothing).
    #[inline]
    pub(crate) fn try_take(&self, cost: u64, now_ns: u64) -> Take {
        if let Some(remaining) = self.tokens.take(cost) {
            return Take::Taken { remaining };
        }
        let until = self.exhausted_until_ns.load(Ordering::Acquire);
        if now_ns < until {
            let never = self.exhausted_never.load(Ordering::Relaxed);
            // Back when the next chunk of a paced lease is released, at the latest.
            let next = until.min(
                self.next_release_ns
                    .load(Ordering::Relaxed)
                    .max(now_ns.saturating_add(1_000_000)),
            );
            let retry_ns = if never { NEVER_NS } else { next - now_ns };
            self.tokens.refused();
            return Take::Exhausted { retry_ns };
        }
        Take::Empty
    }

    /// Whether the last lease failed recently: decide by `fail_mode` instead of asking again.
    pub(crate) fn is_failing(&self, now_ns: u64) -> bool {
        now_ns < self.failing_until_ns.load(Ordering::Acquire)
    }

    /// Whether the tokens left call for a background lease, `home_left` being what this thread's shard has
    /// left (the sum over all shards is read only when that share is low). Not before this process's turn on
    /// a saturated shared bucket (`token_lease.lua`).
    #[inline]
    pub(crate) fn below_watermark(&self, home_left: u64, now_ns: u64) -> bool {
        let watermark = self.low_watermark.load(Ordering::Relaxed);
        home_left.saturating_mul(self.tokens.len() as u64) < watermark
            && now_ns >= self.exhausted_until_ns.load(Ordering::Acquire)
            && self.tokens.glance() < watermark
    }

    /// Marks that demand outran the local tokens.
    pub(crate) fn mark_starved(&self) {
        self.starved.store(true, Ordering::Relaxed);
    }

    /// Claims the single lease slot of this key; `false` when a lease is already in flight.
    pub(crate) fn claim_lease(&self) -> bool {
        !self.retired.load(Ordering::Acquire)
            && !self.in_flight.load(Ordering::Acquire)
            && self
                .in_flight
                .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
    }

    /// Releases the lease slot and wakes the waiters.
    pub(crate) fn finish_lease(&self) {
        self.in_flight.store(false, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// Whether the bucket was drained for good.
    pub(crate) fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// Whether a lease is in flight.
    pub(crate) fn lease_in_flight(&self) -> bool {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Nanoseconds until the shared bucket is full again (0 when unknown or already).
    pub(crate) fn reset_after_ns(&self, now_ns: u64) -> u64 {
        self.full_at_ns.load(Ordering::Relaxed).saturating_sub(now_ns)
    }

    /// Plans the next lease: sizes the batch from the demand since the last lease (decisions per second,
    /// refusals included, so a saturated key keeps its size) to last half the lease TTL, and asks for the whole
    /// batch as `min` when the shared bucket is saturated.
    ///
    /// `fair_share` caps the batch while the shared bucket is not saturated, so that the burst is split between
    /// processes; once it is, the processes take the turns the bucket hands out (`token_lease.lua`) and a batch
    /// may reach `max_batch`. Never more than the demand spends within 0.9 × the TTL (the rest would go back
    /// unspent, a give-back per lease). `cost` is what the caller needs.
    pub(crate) fn plan(&self, fair_share: u64, cost: u64, now_ns: u64) -> LeasePlan {
        let lease = &self.lease;
        let mut book = self.lock();
        let decisions = self.tokens.counts().total();
        let decided = decisions.saturating_sub(book.decisions_at_lease);
        let elapsed_ns = now_ns.saturating_sub(book.last_lease_ns).max(1);
        // Decisions per ttl/2 at the observed demand: a batch should be spent well within its TTL.
        let horizon_ns = (nanos(lease.ttl) / 2).max(1);
        // The asking caller is a decision: none counted in half a TTL reads as a slow demand, not an unknown one.
        let decided = if elapsed_ns >= horizon_ns {
            decided.max(1)
        } else {
            decided
        };
        book.demand_per_s = smoothed(book.demand_per_s, (decided, elapsed_ns), nanos(lease.ttl));
        let observed =
            u64::try_from(u128::from(book.demand_per_s) * u128::from(horizon_ns) / 1_000_000_000).unwrap_or(u64::MAX);
        let mut batch = observed.clamp(lease.min_batch, lease.max_batch);
        if self.starved.swap(false, Ordering::Relaxed) {
            batch = batch.max(book.batch.saturating_mul(2)).min(lease.max_batch);
        }
        // What the demand spends within 0.9 × the TTL (no cap before a demand is seen).
        let spendable = match book.demand_per_s {
            0 => u64::MAX,
            d => u64::try_from(u128::from(d) * u128::from(nanos(lease.ttl)) * 9 / 10_000_000_000).unwrap_or(u64::MAX),
        };
        // What a turn on the saturated bucket should bring: what the demand spends in the TTL (fewer turns than
        // batches sized for half of it), the batch before a demand is seen. It spaces the turns the bucket hands
        // out, from the first lease on: spaced by a fair share of the burst, they would each bring a few tokens.
        let turn = if spendable < u64::MAX {
            spendable.clamp(lease.min_batch, lease.max_batch)
        } else {
            batch
        };
        // Paced instead when a turn would bring more as chunks: the turn is then what the demand spends while the
        // burst refills, and nothing is left unspent within a chunk's TTL.
        let paced = paced_turn(
            (&self.bucket, lease),
            book.saturated,
            (book.demand_per_s, cost),
            spendable,
        );
        if let Some((pace, turn)) = paced {
            // A paced grant is at most a turn: its chunks span no longer than the refill of half the burst
            // (`span_chunks`), or the bucket's pending line would hold back its refill.
            let turn = turn.max(cost);
            self.planned(&mut book, turn, (decisions, now_ns));
            return LeasePlan {
                min: cost,
                max: turn,
                batch: turn,
                turn,
                pace,
            };
        }
        if book.saturated {
            batch = batch.max(turn);
        } else {
            batch = batch.min(fair_share.max(1));
        }
        let batch = batch.min(spendable.max(lease.min_batch)).max(cost);
        self.planned(&mut book, batch, (decisions, now_ns));
        // Saturated: the calls are spaced by the bucket's turns, and each takes what accumulated, however little
        // (a refusal would cost the same call and admit nothing), up to two batches (within what the demand
        // spends in the TTL), so that a turn that comes late loses little.
        let max = if book.saturated {
            batch
                .saturating_mul(2)
                .min(self.bucket.capacity)
                .min(spendable)
                .max(batch)
        } else {
            batch
        };
        LeasePlan {
            min: cost,
            max,
            batch,
            turn: turn.max(batch),
            pace: Pace::default(),
        }
    }

    /// Records a lease planned at `now_ns` for `batch` tokens, `decisions` having been counted by then.
    fn planned(&self, book: &mut Book, batch: u64, (decisions, now_ns): (u64, u64)) {
        book.batch = batch;
        book.last_lease_ns = now_ns;
        book.decisions_at_lease = decisions;
        self.last_used_ns.store(now_ns, Ordering::Relaxed);
        self.low_watermark.store(batch / 4, Ordering::Relaxed);
    }

    /// Adds a grant of a lease sent at `sent_ns`: its tokens must be spent within the TTL of that, or, paced
    /// (`plan.pace`), each chunk within the TTL of its release ([`Schedule::split`]); the first chunk is
    /// spendable at once, the others are released by [`Self::expire`].
    ///
    /// When the shared bucket could not give a whole batch, or has less than a batch left (saturation), it
    /// handed this process a turn (`grant.retry_after_ms`, `token_lease.lua`): the next lease is not sent
    /// before it, nor before the last chunk, and until then callers that find no local tokens are refused
    /// locally (docs/ARCHITECTURE.md, invariants 4 and 18).
    ///
    /// Returns `false`, adding nothing, when the bucket is retired or the first chunk's deadline has already
    /// passed (a late reply): the caller gives the grant back.
    #[must_use = "a grant that is not added must be given back"]
    pub(crate) fn add(&self, grant: &Reply, (sent_ns, failures): (u64, u64), plan: LeasePlan, now_ns: u64) -> bool {
        let ttl_ns = nanos(self.lease.ttl);
        let deadline_ns = sent_ns.saturating_add(ttl_ns);
        let mut book = self.lock();
        if self.retired.load(Ordering::Acquire) || now_ns >= deadline_ns {
            return false;
        }
        Self::attribute(&mut book, self.tokens.total());
        let first = book.schedule.split(grant.granted, plan.pace, (sent_ns, failures));
        book.batches.push_back(Batch {
            tokens: first.tokens,
            deadline_ns,
        });
        let until_ns = book
            .schedule
            .last_ns()
            .map_or(deadline_ns, |at| at.saturating_add(ttl_ns));
        book.stamps.push_back((until_ns, grant.stamp));
        // The deadline is in force before the tokens can be spent.
        self.next_deadline_ns.fetch_min(deadline_ns, Ordering::AcqRel);
        let turn_ns = u64::try_from(grant.retry_after_ms)
            .unwrap_or(0)
            .saturating_mul(1_000_000);
        // Saturated: handed a turn, or all it asked for but the bucket has less than a batch left, or less than
        // half its burst (the fleet spends it: a process whose batch is a small fair share would otherwise lease
        // what accumulates between the turns, a call per few tokens). The next lease takes what is there, up to
        // two batches, and is handed a turn then.
        book.saturated =
            turn_ns > 0 || grant.remaining < plan.batch || grant.remaining.saturating_mul(2) < self.bucket.capacity;
        // The next lease starts while enough is left to last two of this lease's round trips at the spend rate
        // (a quarter of the batch at least, the whole batch at most): on a slow network the refill then
        // arrives before the tokens run out.
        let round_trip_ns = now_ns.saturating_sub(book.last_lease_ns);
        let for_two_trips = u128::from(book.demand_per_s) * u128::from(round_trip_ns) * 2 / 1_000_000_000;
        let for_two_trips = u64::try_from(for_two_trips).unwrap_or(u64::MAX);
        self.low_watermark
            .store((plan.batch / 4).max(for_two_trips).min(plan.batch), Ordering::Relaxed);
        self.tokens.add(first.tokens);
        // Not before the turn the bucket handed out (0: none), nor before the last chunk is released.
        let turn = if turn_ns > 0 { now_ns.saturating_add(turn_ns) } else { 0 };
        let not_before = turn.max(book.schedule.last_ns().unwrap_or(0));
        self.exhausted_never.store(false, Ordering::Relaxed);
        self.exhausted_until_ns.store(not_before, Ordering::Release);
        self.failing_until_ns.store(0, Ordering::Release);
        let reset_after_ns = u64::try_from(grant.reset_after_ms)
            .unwrap_or(0)
            .saturating_mul(1_000_000);
        self.full_at_ns
            .store(now_ns.saturating_add(reset_after_ns), Ordering::Relaxed);
        self.publish_deadline(&book);
        true
    }

    /// Records a refusal: refuse locally for `retry_after` ([`Duration::MAX`]: never, re-asked after `recheck`);
    /// the shared bucket is full again after `reset_after`.
    pub(crate) fn refused(&self, retry_after: Duration, recheck: Duration, reset_after: Duration, now_ns: u64) {
        let mut book = self.lock();
        book.saturated = true;
        // "Never" is only cached for a while: tokens given back by another process may still come.
        let never = retry_after == Duration::MAX;
        let wait = if never { recheck } else { retry_after };
        self.exhausted_never.store(never, Ordering::Relaxed);
        self.exhausted_until_ns
            .store(now_ns.saturating_add(nanos(wait)), Ordering::Release);
        self.full_at_ns
            .store(now_ns.saturating_add(nanos(reset_after)), Ordering::Relaxed);
    }

    /// Records a lease the shared bucket refused (it had fewer than `plan.min` tokens: other processes took
    /// their turns): refuse locally until the turn it handed this process, the reply's `retry_after`.
    pub(crate) fn refused_by_store(&self, reply: &Reply, now_ns: u64) {
        let retry_after = crate::decision::from_protocol_ms(reply.retry_after_ms);
        let reset_after = crate::decision::from_protocol_ms(reply.reset_after_ms);
        self.refused(retry_after, NEVER_RECHECK, reset_after, now_ns);
    }

    /// Records a failed lease: decide by `fail_mode` for `backoff` instead of asking again at once.
    pub(crate) fn failed(&self, reason: FailReason, backoff: Duration, now_ns: u64) {
        self.fail_reason.store(reason as u8, Ordering::Relaxed);
        self.failing_until_ns
            .store(now_ns.saturating_add(nanos(backoff)), Ordering::Release);
    }

    /// Why the last lease failed.
    pub(crate) fn fail_reason(&self) -> FailReason {
        let i = usize::from(self.fail_reason.load(Ordering::Relaxed));
        FailReason::ALL.get(i).copied().unwrap_or(FailReason::Error)
    }

    /// Releases the scheduled chunks that are due, then removes the tokens whose deadline has passed and
    /// returns how many, to be given back, with the chunks dropped because the store failed since their lease
    /// was sent (`failures`, the store's failure count now: [`Schedule::since`]).
    ///
    /// Callers taking tokens meanwhile take the oldest first, so what is removed may include tokens of a live
    /// batch: those go back to the shared bucket too, never spent twice.
    pub(crate) fn expire(&self, now_ns: u64, failures: u64) -> Unspent {
        let mut book = self.lock();
        let since = book.oldest_stamp(now_ns);
        Self::attribute(&mut book, self.tokens.total());
        let dropped = book.schedule.since(failures);
        let ttl_ns = nanos(self.lease.ttl);
        let mut released = 0;
        for chunk in book.schedule.due(now_ns) {
            book.batches.push_back(Batch {
                tokens: chunk.tokens,
                deadline_ns: chunk.at_ns.saturating_add(ttl_ns),
            });
            released += chunk.tokens;
        }
        // The deadlines are in force before the tokens can be spent.
        self.publish_deadline(&book);
        self.tokens.add(released);
        let current = self.tokens.total();
        Self::attribute(&mut book, current);
        let live: u64 = book
            .batches
            .iter()
            .filter(|b| b.deadline_ns > now_ns)
            .map(|b| b.tokens)
            .sum();
        let expired = self.tokens.remove(current.saturating_sub(live));
        book.batches.retain(|b| b.deadline_ns > now_ns);
        // A key whose chunks were dropped still leases no sooner than its turn and its last chunk (no lease out of
        // turn), its callers refused locally meanwhile.
        self.publish_deadline(&book);
        Unspent {
            tokens: expired.saturating_add(dropped),
            since,
        }
    }

    /// Retires the bucket for good without taking its tokens: no decision or lease uses it again.
    pub(crate) fn retire(&self) {
        self.retired.store(true, Ordering::Release);
    }

    /// Takes every token, scheduled chunks included (shutdown, eviction), to be given back.
    pub(crate) fn drain(&self) -> Unspent {
        let mut book = self.lock();
        self.retired.store(true, Ordering::Release);
        let since = book.oldest_stamp(u64::MAX);
        book.batches.clear();
        let scheduled = book.schedule.clear();
        self.publish_deadline(&book);
        Unspent {
            tokens: self.tokens.drain().saturating_add(scheduled),
            since,
        }
    }

    /// Tokens of paced leases not released yet.
    pub(crate) fn scheduled(&self) -> u64 {
        self.lock().schedule.tokens()
    }

    /// The decisions counted since the last call, for the metrics.
    pub(crate) fn unflushed(&self) -> Counts {
        let counts = self.tokens.counts();
        let mut book = self.lock();
        let new = Counts {
            allowed: counts.allowed.saturating_sub(book.flushed.allowed),
            refused: counts.refused.saturating_sub(book.flushed.refused),
        };
        book.flushed = counts;
        new
    }

    /// Decisions per second since the last call, once at least `period_ns` has passed since it (`None` before).
    pub(crate) fn heat(&self, period_ns: u64, now_ns: u64) -> Option<u64> {
        let decisions = self.tokens.counts().total();
        let mut book = self.lock();
        let elapsed_ns = now_ns.saturating_sub(book.heat_at_ns);
        if elapsed_ns < period_ns.max(1) {
            return None;
        }
        let decided = decisions.saturating_sub(book.decisions_at_heat);
        book.heat_at_ns = now_ns;
        book.decisions_at_heat = decisions;
        u64::try_from(u128::from(decided) * 1_000_000_000 / u128::from(elapsed_ns)).ok()
    }

    /// Spending is first-in first-out: the `available` tokens belong to the newest batches.
    fn attribute(book: &mut Book, available: u64) {
        let mut left = available;
        for batch in book.batches.iter_mut().rev() {
            batch.tokens = batch.tokens.min(left);
            left -= batch.tokens;
        }
        book.batches.retain(|b| b.tokens > 0);
    }

    fn publish_deadline(&self, book: &Book) {
        let release = book.schedule.next_ns().unwrap_or(NEVER_NS);
        let deadline = book.batches.front().map_or(NEVER_NS, |b| b.deadline_ns);
        self.next_release_ns.store(release, Ordering::Release);
        self.next_deadline_ns.store(deadline.min(release), Ordering::Release);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        // A poisoned book is still consistent: every update leaves it whole before anything can panic.
        self.book.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The demand in decisions a second after `decided` decisions in the last `elapsed_ns`, `before` the estimate
/// until then: a moving average over about one `window_ns` (the lease TTL), weighted by time, so that two leases
/// sent close together (a lease of few decisions) do not read a slow key as idle, nor a burst as its rate.
fn smoothed(before: u64, (decided, elapsed_ns): (u64, u64), window_ns: u64) -> u64 {
    let elapsed_ns = elapsed_ns.max(1);
    let now = u128::from(decided) * 1_000_000_000 / u128::from(elapsed_ns);
    let window_ns = window_ns.max(1);
    let mixed = if before == 0 || elapsed_ns >= window_ns {
        now
    } else {
        let old = u128::from(window_ns - elapsed_ns);
        (u128::from(before) * old + now * u128::from(elapsed_ns)) / u128::from(window_ns)
    };
    u64::try_from(mixed).unwrap_or(u64::MAX)
}

#[cfg(test)]
#[path = "bucket_tests.rs"]
mod tests;
