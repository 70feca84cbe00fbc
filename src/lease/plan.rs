//! How a [`LocalBucket`] plans its next lease ([`LocalBucket::plan`]): the batch from the demand since the last
//! lease, the turn it should bring, and whether it is paced. A child of `bucket.rs`, which it reads the private
//! fields of.

use std::sync::atomic::Ordering;

use super::{Book, Demand, LocalBucket};
use crate::algorithm::Pace;
use crate::clock::nanos;
use crate::lease::schedule::{paced_turn, LeasePlan};

impl LocalBucket {
    /// Plans the next lease: sizes the batch from the demand since the last lease (decisions per second,
    /// refusals included, so a saturated key keeps its size) to last half the lease TTL, and asks for the whole
    /// batch as `min` when the shared bucket is saturated.
    ///
    /// `fair_share` caps the batch while the shared bucket is not saturated, so that the burst is split between
    /// processes; once it is, the processes take the turns the bucket hands out (`token_lease.lua`) and a batch
    /// may reach `max_batch`. Never more than the demand spends within 0.9 × the TTL, at the demand of the last
    /// TTL where it fell (the rest would go back unspent, a give-back per lease), even less than `min_batch`.
    /// Before any lease the demand is the hot-key sketch's count ([`Self::seeded`]). `cost` is what the caller
    /// needs.
    pub(crate) fn plan(&self, fair_share: u64, cost: u64, now_ns: u64) -> LeasePlan {
        let lease = &self.lease;
        let mut book = self.lock();
        // A probe after a lifted wait ([`Self::sample`]) asks for no turn: refused, it keeps its place in the
        // fleet's queue.
        let probing = book.turn.probing(now_ns);
        let ask = move |turn: u64| if probing { 0 } else { turn };
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
        // A demand that fell over the last samples is read as it is now: measured since the last lease (seconds
        // ago when the key waited for its turn) it would size the batch for the demand of then, and the lease
        // would take the refill the others wait for.
        let fallen = book.recent.fallen(book.demand.per_s(), (now_ns, decisions));
        let demand = book.demand.measured((decided, elapsed_ns), nanos(lease.ttl));
        book.demand = fallen.map_or(demand, Demand::Measured);
        let demand_per_s = book.demand.per_s();
        let observed =
            u64::try_from(u128::from(demand_per_s) * u128::from(horizon_ns) / 1_000_000_000).unwrap_or(u64::MAX);
        let mut batch = observed.clamp(lease.min_batch, lease.max_batch);
        if self.starved.swap(false, Ordering::Relaxed) {
            batch = batch.max(book.batch.saturating_mul(2)).min(lease.max_batch);
        }
        // What the demand spends within 0.9 × the TTL (no cap before a demand is seen), at the demand of the last
        // TTL where that is lower: a demand that just fell would leave most of a lease sized for the old one to
        // expire unspent while the other processes are refused (healthy seed 176: 23 sold of 48 demanded).
        let lately = book
            .recent
            .lately((now_ns, decisions))
            .map_or(demand_per_s, |l| l.max(1));
        let spendable = match demand_per_s.min(lately) {
            0 => u64::MAX,
            d => u64::try_from(u128::from(d) * u128::from(nanos(lease.ttl)) * 9 / 10_000_000_000).unwrap_or(u64::MAX),
        };
        // What a turn on the saturated bucket should bring: what the demand spends in the TTL (fewer turns than
        // batches sized for half of it), even under `min_batch`; the batch before a demand is seen. It spaces the
        // turns the bucket hands out, from the first lease on: spaced by a fair share of the burst, they would
        // each bring a few tokens.
        let turn = if spendable < u64::MAX {
            spendable.clamp(1, lease.max_batch)
        } else {
            batch
        };
        // Paced instead when a turn would bring more as chunks: the turn is then what the demand spends while the
        // burst refills, and nothing is left unspent within a chunk's TTL.
        let paced = paced_turn(
            (&self.bucket, lease),
            book.turn.saturated(),
            (demand_per_s, cost),
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
                per_turn: ask(turn),
                pace,
            };
        }
        if book.turn.saturated() {
            batch = batch.max(turn);
        } else {
            batch = batch.min(fair_share.max(1));
        }
        // No more than the demand spends in the TTL, even under `min_batch` (no cap before a demand is seen): a
        // key deciding once per TTL would give most of a `min_batch` back, a give-back per lease (half of what the
        // warm keys of a Zipf sale leased went back so), and on a saturated bucket hold it while the others are
        // refused (healthy seed 506: a bucket of 13 over 64 processes deciding twice a second each sold 81.6 %,
        // 97.4 % so).
        let batch = batch.min(spendable.max(1)).max(cost);
        self.planned(&mut book, batch, (decisions, now_ns));
        // Saturated: the calls are spaced by the bucket's turns, and each takes what accumulated, however little
        // (a refusal would cost the same call and admit nothing), up to two batches (within what the demand
        // spends in the TTL), so that a turn that comes late loses little.
        let max = if book.turn.saturated() {
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
            per_turn: ask(turn.max(batch)),
            pace: Pace::default(),
        }
    }

    /// What this key may hold for an outage of `reserve_ns` under `fail_mode = "local"`, in a fleet of
    /// `processes`: what its share of the rate sells in that long, at most its share of half the burst (the
    /// fleet's reserves leave the other half to sell); and of that, what its demand spends in that long (the
    /// share before a demand is seen).
    pub(crate) fn reserve_want(&self, processes: u64, reserve_ns: u64) -> (u64, u64) {
        let (b, processes) = (&self.bucket, u128::from(processes.max(1)));
        let most = u128::from(b.rate) * u128::from(reserve_ns) / (u128::from(b.per_ms.max(1)) * 1_000_000 * processes);
        let most = most.min(u128::from(b.capacity) / (2 * processes));
        let demand = u128::from(self.lock().demand.per_s());
        let spent = (demand * u128::from(reserve_ns)).div_ceil(1_000_000_000);
        let spent = if demand > 0 { most.min(spent) } else { most };
        (u64::try_from(most).unwrap_or(0), u64::try_from(spent).unwrap_or(0))
    }

    /// Records a lease planned at `now_ns` for `batch` tokens, `decisions` having been counted by then.
    fn planned(&self, book: &mut Book, batch: u64, (decisions, now_ns): (u64, u64)) {
        book.batch = batch;
        book.last_lease_ns = now_ns;
        book.decisions_at_lease = decisions;
        self.last_used_ns.store(now_ns, Ordering::Relaxed);
        self.low_watermark.store(batch / 4, Ordering::Relaxed);
    }
}
