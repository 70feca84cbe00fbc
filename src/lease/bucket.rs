//! One key's leased tokens in this process: a [`LocalBucket`].
//!
//! A [`LocalBucket`] is what the hot path touches: the leased tokens in per-core shards (`shards.rs`), taken
//! with one compare-and-swap on the thread's own shard, a deadline, and its [`Wait`]. Everything
//! slower (the book of leases and their deadlines, the adaptive batch size, the turn a saturated shared bucket
//! handed out) sits behind a mutex that only the lease, expiry and sweep paths take.
//!
//! Invariant 1 (docs/ARCHITECTURE.md, "Invariants") rests on the deadlines: a token is spent at most `ttl` after the
//! lease that brought it was *sent*, so over any span W the process admits at most what Redis granted over W + ttl.
//! Spending is first-in first-out, so what is left always belongs to the newest leases: when a lease's deadline passes,
//! only the tokens beyond what the younger leases brought are expired and given back.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

pub(crate) use super::book::Unspent;
use super::book::{Batch, Book, Demand, Recent, Turn, TurnEvent};
use super::reserve::Reserve;
use super::schedule::{large_fleet, LeasePlan, Schedule};
use super::shards::{Counts, Shards};
use super::wait::{Backoff, Slot, Wait};
use crate::algorithm::{Reply, TokenBucket};
use crate::clock::{nanos, NEVER_NS};
use crate::error::FailReason;
use crate::packed::Atomic;
use crate::rule::Lease;
use crate::timings::Timings;

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
    /// A paced lease's chunk is still to be released: a caller who finds too few tokens has it released early
    /// ([`Self::release_early`]) rather than being refused.
    chunks_left: AtomicBool,
    /// Whether a caller who finds too few tokens leases, or is refused locally until when.
    wait: Atomic<Wait>,
    /// Whether the last lease failed: `fail_mode` decides until when, and why (the fail_mode metric's reason).
    backoff: Atomic<Backoff>,
    /// When the shared bucket will be full again, from the last reply.
    full_at_ns: AtomicU64,
    /// Below this many tokens (in all shards) a lease is started in the background.
    low_watermark: AtomicU64,
    /// A caller found too few tokens since the last lease (demand outran the batch).
    starved: AtomicBool,
    /// One lease in flight per key per process, or none ever again (retired).
    slot: Atomic<Slot>,
    /// Last time a lease was started (for idle eviction).
    pub last_used_ns: AtomicU64,
    /// Wakes callers waiting on the lease in flight.
    pub notify: Notify,
    book: Mutex<Book>,
    /// What the shared bucket holds in escrow for this key under `fail_mode = "local"`.
    pub reserve: Mutex<Reserve>,
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
            chunks_left: AtomicBool::new(false),
            wait: Atomic::new(Wait::Free),
            backoff: Atomic::new(Backoff::None),
            full_at_ns: AtomicU64::new(0),
            low_watermark: AtomicU64::new(lease.min_batch / 4),
            starved: AtomicBool::new(false),
            slot: Atomic::new(Slot::Idle),
            last_used_ns: AtomicU64::new(now_ns),
            notify: Notify::new(),
            reserve: Mutex::new(Reserve::Empty),
            book: Mutex::new(Book {
                batches: VecDeque::new(),
                schedule: Schedule::default(),
                batch: lease.min_batch,
                turn: Turn::Room,
                last_lease_ns: now_ns,
                decisions_at_lease: 0,
                demand: Demand::Unknown,
                flushed: Counts::default(),
                recent: Recent::new(now_ns),
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

    /// This new bucket's demand before its first lease, `per_s` decisions a second (`None`: unknown): what the
    /// hot-key sketch counted when it made the key hot ([`Demand::Seeded`]). The first lease is sized for it, not
    /// for `min_batch` (a warm key of a Zipf sale deciding once per TTL would lease ten tokens and give back
    /// nine); the next lease's measure replaces it ([`Self::plan`]).
    #[must_use]
    pub(crate) fn seeded(self, per_s: Option<u64>) -> Self {
        if let Some(per_s) = per_s {
            self.lock().demand = Demand::Seeded(per_s);
        }
        self
    }

    /// This new bucket was made hot because the fleet spends the shared bucket: its first lease may wait to
    /// measure the demand ([`Self::first_lease_wait`]).
    #[must_use]
    pub(crate) fn measuring(self) -> Self {
        self.slot.store(Slot::Measuring);
        {
            let mut book = self.lock();
            book.turn = book.turn.step(TurnEvent::Drained).0;
        }
        self
    }

    /// Whether this bucket's first lease, about to be sent at `now_ns` in a fleet of `processes`, its slot claimed
    /// `from` ([`Self::claim_lease`]), waits: when the bucket was made hot on a shared bucket the fleet spends
    /// ([`Self::measuring`], the slot claimed from [`Slot::Measuring`]) and the fleet's first turns,
    /// spaced for a guessed `min_batch` each, would take longer than half a TTL to go round, the lease waits until
    /// half a TTL after the bucket was made, its callers refused locally meanwhile (as the fleet's turns would
    /// refuse them) while their decisions measure the demand. The turn the bucket hands it is then spaced for what
    /// it will spend, and the turns do not run together for the rest of the sale. A small fleet leases at once:
    /// its first turns go round within the wait. Returns when the lease may go (ns), `None` when it goes now.
    pub(crate) fn first_lease_wait(&self, from: Slot, processes: u64, now_ns: u64) -> Option<u64> {
        if from != Slot::Measuring {
            return None;
        }
        if !large_fleet((&self.bucket, &self.lease), processes) {
            return None;
        }
        let half_ttl = u64::try_from(self.lease.ttl.as_nanos() / 2).unwrap_or(u64::MAX);
        let mut book = self.lock();
        // It measures the demand: the sketch's count ([`Self::seeded`]), a few decisions, would size the fleet's
        // turns for the rest of the sale (a process of a thousand leases every few seconds).
        book.demand = Demand::Unknown;
        let until = book.last_lease_ns.saturating_add(half_ttl);
        drop(book);
        if now_ns >= until {
            return None;
        }
        self.wait.store(Wait::until(until));
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
        let wait = self.wait.load();
        let until = wait.until_ns();
        // A chunk still to come is released now rather than a caller refused ([`Self::release_early`]).
        if now_ns < until && !self.chunks_left.load(Ordering::Acquire) {
            let retry_ns = if wait.is_never() { NEVER_NS } else { until - now_ns };
            self.tokens.refused();
            return Take::Exhausted { retry_ns };
        }
        Take::Empty
    }

    /// Puts back `cost` tokens [`Self::try_take`] took from this thread's shard, and the decision it counted:
    /// they were found past their deadline after all; the expiry gives them back.
    pub(crate) fn untake(&self, cost: u64) {
        self.tokens.untake(cost);
    }

    /// Why the last lease failed, while `fail_mode` decides instead of asking again (`None`: ask the store).
    pub(crate) fn failing(&self, now_ns: u64) -> Option<FailReason> {
        self.backoff.load().at(now_ns)
    }

    /// Whether the tokens left call for a background lease, `home_left` being what this thread's shard has
    /// left (the sum over all shards is read only when that share is low). Not before this process's turn on
    /// a saturated shared bucket (`token_lease.lua`).
    #[inline]
    pub(crate) fn below_watermark(&self, home_left: u64, now_ns: u64) -> bool {
        let watermark = self.low_watermark.load(Ordering::Relaxed);
        home_left.saturating_mul(self.tokens.len() as u64) < watermark
            && now_ns >= self.wait.load().until_ns()
            && self.tokens.glance() < watermark
    }

    /// Marks that demand outran the local tokens.
    pub(crate) fn mark_starved(&self) {
        self.starved.store(true, Ordering::Relaxed);
    }

    /// Claims the single lease slot of this key: `Some` of the state it was claimed from ([`Slot::Measuring`]
    /// before a first lease that may wait, [`Self::first_lease_wait`]), `None` when a lease is already in flight
    /// or the bucket is retired.
    pub(crate) fn claim_lease(&self) -> Option<Slot> {
        self.slot.update(Slot::claimed)
    }

    /// Releases the lease slot and wakes the waiters.
    pub(crate) fn finish_lease(&self) {
        self.slot.update(|slot| (slot.ended(), ()));
        self.notify.notify_waiters();
    }

    /// Whether the bucket was drained for good.
    pub(crate) fn is_retired(&self) -> bool {
        self.slot.load() == Slot::Retired
    }

    /// Whether a lease is in flight.
    pub(crate) fn lease_in_flight(&self) -> bool {
        self.slot.load() == Slot::Leasing
    }

    /// Nanoseconds until the shared bucket is full again (0 when unknown or already).
    pub(crate) fn reset_after_ns(&self, now_ns: u64) -> u64 {
        self.full_at_ns.load(Ordering::Relaxed).saturating_sub(now_ns)
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
    pub(crate) fn add(&self, grant: &Reply, sent_ns: u64, plan: LeasePlan, now_ns: u64) -> bool {
        let ttl_ns = nanos(self.lease.ttl);
        let deadline_ns = sent_ns.saturating_add(ttl_ns);
        let mut book = self.lock();
        if self.is_retired() || now_ns >= deadline_ns {
            return false;
        }
        Self::attribute(&mut book, self.tokens.total());
        let first = book.schedule.split((grant.granted, grant.stamp), plan.pace, sent_ns);
        book.batches.push_back(Batch {
            tokens: first.tokens,
            deadline_ns,
            stamp: grant.stamp,
        });
        // The deadline is in force before the tokens can be spent.
        self.next_deadline_ns.fetch_min(deadline_ns, Ordering::AcqRel);
        let turn_ns = u64::try_from(grant.retry_after_ms)
            .unwrap_or(0)
            .saturating_mul(1_000_000);
        // Saturated: handed a turn, or all it asked for but the bucket has less than a batch left, or less than
        // half its burst (the fleet spends it: a process whose batch is a small fair share would otherwise lease
        // what accumulates between the turns, a call per few tokens). The next lease takes what is there, up to
        // two batches, and is handed a turn then.
        let short = grant.remaining < plan.batch || grant.remaining.saturating_mul(2) < self.bucket.capacity;
        // The next lease starts while enough is left to last two of this lease's round trips at the spend rate
        // (a quarter of the batch at least, the whole batch at most): on a slow network the refill then
        // arrives before the tokens run out.
        let round_trip_ns = now_ns.saturating_sub(book.last_lease_ns);
        let for_two_trips = u128::from(book.demand.per_s()) * u128::from(round_trip_ns) * 2 / 1_000_000_000;
        let for_two_trips = u64::try_from(for_two_trips).unwrap_or(u64::MAX);
        self.low_watermark
            .store((plan.batch / 4).max(for_two_trips).min(plan.batch), Ordering::Relaxed);
        self.tokens.add(first.tokens);
        // Not before the turn the bucket handed out, if any, nor before the last chunk is released.
        let turn = (turn_ns > 0).then(|| now_ns.saturating_add(turn_ns));
        book.turn = book.turn.step(TurnEvent::Granted { turn_ns: turn, short }).0;
        let not_before = turn.unwrap_or(0).max(book.schedule.last_ns().unwrap_or(0));
        self.wait.store(Wait::until(not_before));
        self.backoff.store(Backoff::None);
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
        book.turn = book.turn.step(TurnEvent::Drained).0;
        // "Never" is only cached for a while: tokens given back by another process may still come.
        let wait = if retry_after == Duration::MAX {
            Wait::Never {
                recheck_ns: now_ns.saturating_add(nanos(recheck)),
            }
        } else {
            Wait::Until {
                until_ns: now_ns.saturating_add(nanos(retry_after)),
            }
        };
        self.wait.store(wait);
        self.full_at_ns
            .store(now_ns.saturating_add(nanos(reset_after)), Ordering::Relaxed);
    }

    /// Records a lease the shared bucket refused (it had fewer than `plan.min` tokens: other processes took
    /// their turns): refuse locally until the turn it handed this process, the reply's `retry_after`.
    /// A refused probe ([`Self::sample`]) waits its backoff, or for the turn it kept once the next probe would
    /// come after it.
    pub(crate) fn refused_by_store(&self, reply: &Reply, now_ns: u64) {
        let mut retry_after = crate::decision::from_protocol_ms(reply.retry_after_ms);
        let reset_after = crate::decision::from_protocol_ms(reply.reset_after_ms);
        if retry_after != Duration::MAX {
            let mut book = self.lock();
            let event = TurnEvent::StoreRefused {
                retry_after_ns: nanos(retry_after),
                now_ns,
            };
            let (turn, instead) = book.turn.step(event);
            book.turn = turn;
            retry_after = instead.map_or(retry_after, Duration::from_nanos);
        }
        self.refused(retry_after, Timings::NEVER_RECHECK, reset_after, now_ns);
    }

    /// Records a failed lease: decide by `fail_mode` for `backoff` instead of asking again at once.
    pub(crate) fn failed(&self, reason: FailReason, backoff: Duration, now_ns: u64) {
        self.backoff.store(Backoff::Until {
            until_ns: now_ns.saturating_add(nanos(backoff)),
            reason,
        });
    }

    /// Releases the scheduled chunks that are due, then removes the tokens whose deadline has passed and
    /// returns how many, to be given back. Chunks are released whatever the store does: they are escrow
    /// ([`Schedule`]).
    ///
    /// Callers taking tokens meanwhile take the oldest first, so what is removed may include tokens of a live
    /// batch: those go back to the shared bucket too, never spent twice.
    pub(crate) fn expire(&self, now_ns: u64, processes: u64) -> Unspent {
        let mut book = self.lock();
        Self::attribute(&mut book, self.tokens.total());
        let ttl_ns = nanos(self.lease.ttl);
        let mut released = 0;
        for chunk in book.schedule.due(now_ns) {
            book.batches.push_back(Batch {
                tokens: chunk.tokens,
                deadline_ns: chunk.at_ns.saturating_add(ttl_ns),
                stamp: chunk.stamp,
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
        // What is left belongs to the newest leases (a live batch's tokens taken meanwhile are younger): each
        // expired batch's stamp caps what its own tokens add back.
        let unspent = Unspent::left_of(book.batches.iter().filter(|b| b.deadline_ns <= now_ns), expired);
        book.batches.retain(|b| b.deadline_ns > now_ns);
        // Half a batch or more left unspent: the lease outran the demand, and the turn handed with it (its premise:
        // the fleet spends the bucket) is lifted, the next caller leasing at once what goes back now. A process
        // alone on the bucket (`processes`: the fleet's count) lifts it for any token that goes back: no other
        // process takes it, so a turn kept would refuse its callers beside a bucket it refilled (a proptest case:
        // 9 of a batch of 19 went back and a burst of 20 was refused whole, `tests/undersell.rs`).
        let outran = expired.saturating_mul(2) >= book.batch.max(1) || (processes <= 1 && expired > 0);
        if outran && book.schedule.next_ns().is_none() {
            book.turn = book.turn.step(TurnEvent::Outran).0;
            self.wait.store(Wait::Free);
        }
        self.publish_deadline(&book);
        unspent
    }

    /// Releases `cost` tokens of the next chunk of a paced lease now, ahead of its time, because a caller found
    /// none: the demand outran the pace it was measured at (a burst after a quiet spell, one process alone on its
    /// bucket). Only what the caller needs, so that little is left to expire unspent on a saturated bucket,
    /// where a give-back adds little. Exact (invariant 18): the shared bucket refills its level to at most
    /// `capacity − pending`, and its pending line counts the tokens until their chunk's time, so the level plus
    /// the tokens still to come never exceeds the capacity whenever some are released; released sooner, they are
    /// only spent sooner, within the TTL from now. Once the last chunk is out, a process alone on the bucket
    /// (`processes` is the fleet's count), or whose chunks were all out within half their span (its demand at
    /// least doubled since the lease was planned), or on a bucket with room to spare (not saturated) in a fleet
    /// whose paced leases could hold at most a quarter of the bucket pending (`processes × batch × 4 ≤ capacity`;
    /// half let the turns of healthy seed 746 bunch, 95.8 % sold fell to 88.5 %), may lease again from its turn
    /// on. Otherwise it still waits for its last chunk's time, as the shared bucket's pending line does, which a
    /// second paced lease would merge with its own and so over-count: 256 processes at 1.5 times the rate sold
    /// 89 % of a 10 s bound without the wait, 96 % with it. Waiting after a doubled demand too, 24 processes paced
    /// for 138 a second sold 122 of 367 a second (healthy seed 270), and waiting beside a stocked bucket, 311 of
    /// 367. Through an outage too: the chunks are escrow ([`Schedule`]). Returns whether tokens were released.
    pub(crate) fn release_early(&self, cost: u64, now_ns: u64, processes: u64) -> bool {
        let mut book = self.lock();
        let last_ns = book.schedule.last_ns().unwrap_or(0);
        let Some(chunk) = book.schedule.take_early(cost) else {
            return false;
        };
        // Spent in under half the time its chunks span: the demand at least doubled since the lease was planned.
        let outran =
            now_ns.saturating_sub(book.last_lease_ns).saturating_mul(2) < last_ns.saturating_sub(book.last_lease_ns);
        Self::attribute(&mut book, self.tokens.total());
        book.batches.push_back(Batch {
            tokens: chunk.tokens,
            deadline_ns: now_ns.saturating_add(nanos(self.lease.ttl)),
            stamp: chunk.stamp,
        });
        let room =
            !book.turn.saturated() && processes.saturating_mul(book.batch).saturating_mul(4) <= self.bucket.capacity;
        if (processes <= 1 || outran || room) && book.schedule.next_ns().is_none() {
            self.wait.store(Wait::until(book.turn.turn_ns()));
        }
        // The deadline is in force before the tokens can be spent.
        self.publish_deadline(&book);
        self.tokens.add(chunk.tokens);
        true
    }

    /// Samples the decisions counted by `now_ns` ([`Recent`]), and lifts the wait for a turn, or for a refusal's
    /// `retry_after`, when the demand since the oldest sample fell under half of what it was at the last lease
    /// ([`Recent::fallen`]); the next caller leases then, no sooner than the last chunk of a paced lease, as a
    /// probe ([`Self::plan`]). Called by the sweeper.
    ///
    /// A turn is a place in a queue of the fleet's turns, each spaced for the batch its process leased while the
    /// fleet saturated the bucket; 64 processes queue seconds ahead. When the demand steps down, the bucket
    /// refills while the processes wait out those turns, refusing their callers locally (a healthy seed of 64
    /// processes sold 10 to 106 a second for four seconds of a rate of 375). Only a fall in this process's own
    /// demand lifts the wait, so a steady saturated key keeps its turns; a lift costs one call at most. Not while
    /// the shared bucket said "never". Returns whether the wait was lifted.
    pub(crate) fn sample(&self, now_ns: u64) -> bool {
        let decisions = self.tokens.counts().total();
        let mut book = self.lock();
        let fallen = book.recent.fallen(book.demand.per_s(), (now_ns, decisions));
        book.recent.sample((now_ns, decisions));
        let wait = self.wait.load();
        let until = wait.until_ns();
        let not_before = book.schedule.last_ns().unwrap_or(0);
        let probing = matches!(book.turn, Turn::Probing { .. });
        if fallen.is_none() || probing || now_ns >= until || not_before >= until || wait.is_never() {
            return false;
        }
        let fell = TurnEvent::Fell {
            kept_turn_ns: until,
            backoff_ns: nanos(self.lease.ttl),
        };
        book.turn = book.turn.step(fell).0;
        self.wait.store(Wait::until(not_before));
        true
    }

    /// Whether the next lease is a probe after a lifted wait ([`Self::sample`]; [`Self::plan`] asks for no turn).
    #[cfg(test)]
    pub(crate) fn probing(&self, now_ns: u64) -> bool {
        self.lock().turn.probing(now_ns)
    }

    /// Retires the bucket for good without taking its tokens: no decision or lease uses it again.
    pub(crate) fn retire(&self) {
        self.slot.store(Slot::Retired);
    }

    /// Takes every token, scheduled chunks included (shutdown, eviction), to be given back.
    pub(crate) fn drain(&self) -> Unspent {
        let mut book = self.lock();
        self.slot.store(Slot::Retired);
        Self::attribute(&mut book, self.tokens.total());
        let drained = Unspent::left_of(book.batches.iter(), self.tokens.drain());
        book.batches.clear();
        let mut unspent = Unspent::of(&book.schedule.clear());
        for l in drained.lent {
            unspent = unspent.and(l.tokens, l.stamp);
        }
        self.publish_deadline(&book);
        unspent
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
        let release = book.schedule.next_ns();
        let deadline = book.batches.front().map_or(NEVER_NS, |b| b.deadline_ns);
        self.chunks_left.store(release.is_some(), Ordering::Release);
        let next = deadline.min(release.unwrap_or(NEVER_NS));
        self.next_deadline_ns.store(next, Ordering::Release);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        // A poisoned book is still consistent: every update leaves it whole before anything can panic.
        self.book.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[path = "plan.rs"]
mod plan;

#[cfg(test)]
#[path = "bucket_tests.rs"]
mod tests;
