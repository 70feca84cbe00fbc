//! What a lease asks for ([`LeasePlan`]) and, paced, when its tokens come: a paced lease's chunks not yet released,
//! the [`Schedule`] of one key's local bucket.
//!
//! A paced lease (`lua/token_lease.lua`, [`crate::algorithm::Pace`]) is granted `n` tokens at once but
//! releases them to the key's callers in chunks of `chunk` tokens, one every `chunk_ms` from when the lease was
//! sent. Each chunk is spent within the lease TTL of its release (invariant 1 counts the TTL from there), and the
//! shared bucket keeps what is still to be released as pending. A process that decides 100 times a second then
//! brings a second's spending per call instead of a TTL's.

use std::collections::VecDeque;

use crate::algorithm::{Pace, TokenBucket, MAX_EXACT};
use crate::rule::Lease;

/// What a lease will ask the shared bucket for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LeasePlan {
    /// Grant nothing below this many tokens.
    pub min: u64,
    /// Grant at most this many tokens.
    pub max: u64,
    /// The batch: what a lease is sized for (`max` is twice it on a saturated bucket, so that a turn that comes
    /// late takes what accumulated).
    pub batch: u64,
    /// What a turn on the saturated bucket should bring (at least the batch): the bucket spaces the turns it
    /// hands this process by it (`token_lease.lua`).
    pub per_turn: u64,
    /// How the grant is released: paced in chunks when a turn brings more than the demand spends in the TTL.
    pub pace: Pace,
}

/// Chunks released at a time, oldest first.
///
/// The chunks are escrow: the shared bucket counted them as granted when the lease was answered (its pending
/// line keeps its level within `capacity − pending`), so they are released on time whatever the store does
/// meanwhile, through an outage too (invariant 12).
#[derive(Debug, Default)]
pub(crate) struct Schedule {
    chunks: VecDeque<Chunk>,
}

/// Tokens released at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Chunk {
    /// Monotonic ns at which the chunk is released: from then on its tokens may be spent, until a TTL later.
    pub(crate) at_ns: u64,
    pub(crate) tokens: u64,
    /// The stamp of the lease that granted it ([`crate::algorithm::Reply::stamp`]).
    pub(crate) stamp: u64,
}

impl Schedule {
    /// Splits a grant of `granted` tokens stamped `stamp`, leased at `sent_ns`, by `pace` into chunks: `chunk`
    /// tokens each (the last one the rest), the i-th released at `sent_ns + i × chunk_ms`. Returns the first chunk
    /// (released at `sent_ns`, what is spendable at once) and schedules the others. A grant that is not paced, or
    /// fits in one chunk, is one chunk.
    pub(crate) fn split(&mut self, (granted, stamp): (u64, u64), pace: Pace, sent_ns: u64) -> Chunk {
        let first = Chunk {
            at_ns: sent_ns,
            tokens: granted,
            stamp,
        };
        if pace.span_ms(granted).is_none() {
            return first;
        }
        let step_ns = pace.chunk_ms.saturating_mul(1_000_000);
        let mut left = granted - pace.chunk;
        let mut at_ns = sent_ns;
        while left > 0 {
            at_ns = at_ns.saturating_add(step_ns);
            let tokens = left.min(pace.chunk);
            self.chunks.push_back(Chunk { at_ns, tokens, stamp });
            left -= tokens;
        }
        Chunk {
            tokens: pace.chunk,
            ..first
        }
    }

    /// Takes the chunks released by `now_ns`, oldest first.
    pub(crate) fn due(&mut self, now_ns: u64) -> Vec<Chunk> {
        let n = self.chunks.iter().take_while(|c| c.at_ns <= now_ns).count();
        self.chunks.drain(..n).collect()
    }

    /// Takes up to `tokens` of the next chunk, however far its release (the rest stays scheduled); `None` when
    /// none is scheduled.
    pub(crate) fn take_early(&mut self, tokens: u64) -> Option<Chunk> {
        let next = self.chunks.front_mut()?;
        if next.tokens > tokens {
            next.tokens -= tokens;
            return Some(Chunk { tokens, ..*next });
        }
        self.chunks.pop_front()
    }

    /// When the next chunk is released; `None` when none is scheduled.
    pub(crate) fn next_ns(&self) -> Option<u64> {
        self.chunks.front().map(|c| c.at_ns)
    }

    /// When the last chunk is released; `None` when none is scheduled.
    pub(crate) fn last_ns(&self) -> Option<u64> {
        self.chunks.back().map(|c| c.at_ns)
    }

    /// Tokens scheduled, not released yet.
    pub(crate) fn tokens(&self) -> u64 {
        self.chunks.iter().map(|c| c.tokens).sum()
    }

    /// Drops every chunk (the bucket is drained) and returns them, to be given back.
    pub(crate) fn clear(&mut self) -> Vec<Chunk> {
        self.chunks.drain(..).collect()
    }
}

/// A paced lease's pace and turn (invariant 18), when the demand of `demand_per_s` decisions a second spends
/// less in the TTL (`spendable`, tokens) than a turn brings, and either the shared bucket is `saturated` or a
/// whole `min_batch` would not be spent in the TTL (a lease of it would give most of it back, two calls for a
/// few tokens). The grant is released in chunks of what the demand spends in half a TTL (at least `cost`), one
/// every `chunk_ms`, the time the demand takes to spend a chunk; and it spans at most the
/// time the refill takes to make half the burst ([`span_chunks`]): the bucket keeps what paced leases have yet
/// to release as *pending*, one line that over-counts (`lua/token_lease.lua`), and the level refills to at most
/// `capacity − pending`, so a longer span would let the pending line hold the refill back (the cause of the
/// undersell of fleets of 64 to 1000 processes before 2026-11-27: the line stood at the capacity). Where not
/// even two chunks fit in that span, the grant is not paced.
/// The turn is then the bucket's refill in a TTL (`rate × ttl`) or what fits in that span, whichever is less.
///
/// At 100 decisions a second (a fleet of 1000 sharing 10^5) and the shipped rule, a turn brings 100 tokens in
/// chunks of 10, one every 100 ms, instead of 18 at once. The price is time: what the fleet was granted but has
/// not released yet (about `rate × span / 2`, 500 tokens here) is spent later than it would be without pacing.
/// `None`: not paced (no demand seen, a stock, or the TTL's spending is already a turn).
pub(crate) fn paced_turn(
    (bucket, lease): (&TokenBucket, &Lease),
    saturated: bool,
    (demand_per_s, cost): (u64, u64),
    spendable: u64,
) -> Option<(Pace, u64)> {
    if demand_per_s == 0 || bucket.rate == 0 || !(saturated || spendable < lease.min_batch) {
        return None;
    }
    let half_ttl_ms = u64::try_from(lease.ttl.as_millis() / 2).unwrap_or(u64::MAX).max(1);
    // A chunk holds what the demand spends in half a TTL, at least the caller's cost (the demand counts
    // decisions, not tokens), and is released as often as the demand spends it (whole ms, rounded down: a little
    // sooner rather than later).
    let chunk = u128::from(demand_per_s) * u128::from(half_ttl_ms) / 1_000;
    let chunk = u64::try_from(chunk).unwrap_or(u64::MAX).max(cost).max(1);
    let chunk_ms = u128::from(chunk) * 1_000 / u128::from(demand_per_s);
    let chunk_ms = u64::try_from(chunk_ms).unwrap_or(u64::MAX).max(1);
    // A demand too slow to spend a chunk in a TTL (fewer than one decision per TTL) is not paced: each chunk
    // lives a TTL, so its callers would come between chunks and be refused until the last one.
    if chunk_ms > half_ttl_ms.saturating_mul(2) {
        return None;
    }
    // Two chunks that span more than the refill of half the burst would hold back the refill as soon as a few
    // processes are pending at once (a bucket of 101 refilled 889 a second, 16 processes: 60 % sold).
    let chunks = span_chunks(bucket, chunk_ms);
    if chunks < 2 {
        return None;
    }
    let turn = paced_size((bucket, lease)).min(chunk.saturating_mul(chunks));
    if turn <= spendable || turn <= chunk {
        return None;
    }
    // The pending line stays exact in Lua's doubles.
    let span_ms = (MAX_CHUNKS + 1).saturating_mul(chunk_ms);
    if bucket.capacity.saturating_mul(span_ms) >= MAX_EXACT {
        return None;
    }
    Some((Pace { chunk, chunk_ms }, turn))
}

/// The most chunks a paced grant is released in.
const MAX_CHUNKS: u64 = 20;

/// The most chunks, one every `chunk_ms`, a paced grant is released in: as many as fit in the time the refill
/// takes to make half the burst, at most [`MAX_CHUNKS`] (under 2, a grant is not paced: [`paced_turn`]). 10 with
/// the shipped rule (1 s).
pub(crate) fn span_chunks(bucket: &TokenBucket, chunk_ms: u64) -> u64 {
    let half_burst_ms = u128::from(bucket.capacity) * u128::from(bucket.per_ms) / u128::from(bucket.rate.max(1)) / 2;
    u64::try_from(half_burst_ms / u128::from(chunk_ms.max(1)))
        .unwrap_or(u64::MAX)
        .min(MAX_CHUNKS)
}

/// What a paced turn brings: the bucket's refill in one lease TTL (`rate × ttl`, tokens), within the batch bounds.
pub(crate) fn paced_size((bucket, lease): (&TokenBucket, &Lease)) -> u64 {
    let turn = u128::from(bucket.rate) * lease.ttl.as_millis() / u128::from(bucket.per_ms.max(1));
    u64::try_from(turn)
        .unwrap_or(u64::MAX)
        .clamp(lease.min_batch, lease.max_batch)
}

/// Whether `processes` form a large fleet for this key: their first turns, spaced as `token_lease.lua` spaces
/// leases of `min_batch`, would take longer than half a TTL to go round (the last comes `processes − 1`
/// spacings after the first: a process alone is never a large fleet). A large fleet's first leases wait to
/// measure the demand ([`super::bucket::LocalBucket::first_lease_wait`]); a small one's go round within that wait
/// anyway.
pub(crate) fn large_fleet((bucket, lease): (&TokenBucket, &Lease), processes: u64) -> bool {
    let half_ttl_ns = lease.ttl.as_nanos() / 2;
    let guessed_turn_ns = u128::from(bucket.turn_spacing(lease.min_batch)) * 1_000_000;
    guessed_turn_ns * u128::from(processes.saturating_sub(1)) > half_ttl_ns
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// The shipped rule's bucket and lease: 2000 tokens, 1000 a second, batches of 10 to 500 for 200 ms.
    pub(crate) fn shipped() -> (TokenBucket, Lease) {
        let bucket = TokenBucket {
            capacity: 2_000,
            rate: 1_000,
            per_ms: 1_000,
        };
        let lease = Lease {
            min_batch: 10,
            max_batch: 500,
            ttl: std::time::Duration::from_millis(200),
            hot_after: None,
            reserve: None,
        };
        (bucket, lease)
    }

    #[test]
    fn a_paced_grant_is_released_a_chunk_at_a_time() {
        let mut s = Schedule::default();
        let pace = Pace {
            chunk: 20,
            chunk_ms: 100,
        };
        let first = s.split((70, 9), pace, 1_000 * MS);
        assert_eq!(
            first,
            Chunk {
                at_ns: 1_000 * MS,
                tokens: 20,
                stamp: 9
            }
        );
        assert_eq!(
            (s.tokens(), s.next_ns(), s.last_ns()),
            (50, Some(1_100 * MS), Some(1_300 * MS))
        );
        assert!(s.due(1_099 * MS).is_empty());
        assert_eq!(
            s.due(1_200 * MS),
            vec![
                Chunk {
                    at_ns: 1_100 * MS,
                    tokens: 20,
                    stamp: 9
                },
                Chunk {
                    at_ns: 1_200 * MS,
                    tokens: 20,
                    stamp: 9
                }
            ]
        );
        assert_eq!(s.tokens(), 10);
        let left = Chunk {
            at_ns: 1_300 * MS,
            tokens: 10,
            stamp: 9,
        };
        assert_eq!(s.clear(), vec![left], "a drain: what is left goes back");
        assert_eq!(s.next_ns(), None);
    }

    #[test]
    fn a_slow_demand_on_a_saturated_bucket_is_paced_in_chunks_of_at_least_its_cost() {
        let (bucket, lease) = shipped();
        let paced = |saturated, demand, spendable| paced_turn((&bucket, &lease), saturated, demand, spendable);
        let every = |chunk, chunk_ms| Pace { chunk, chunk_ms };
        // 100 decisions a second: chunks of 10 every 100 ms, a turn of 100 (what fits in 1 s, the refill of half
        // the burst), not 200 (the refill in a TTL).
        assert_eq!(paced(true, (100, 1), 18), Some((every(10, 100), 100)));
        // Decisions of 20 tokens each: chunks of 20, one every 200 ms (as fast as they are spent), or none
        // would ever be admitted.
        assert_eq!(paced(true, (100, 20), 18), Some((every(20, 200), 100)));
        // At 4 decisions a second a chunk lasts 250 ms, more than the TTL: callers would come between chunks
        // and be refused until the last one. Not paced.
        assert_eq!(paced(true, (4, 1), 0), None);
        // 10 a second: a turn of 10 chunks of 1, not 200 chunks over 20 s.
        assert_eq!(paced(true, (10, 1), 1), Some((every(1, 100), 10)));
        // 17 a second: a chunk of 1 every 58 ms, as fast as it is spent.
        assert_eq!(paced(true, (17, 1), 3), Some((every(1, 58), 17)));
        // Not saturated, but a whole batch would not be spent in the TTL: paced too.
        assert_eq!(paced(false, (10, 1), 1), Some((every(1, 100), 10)));
        // Not saturated and a batch is spent in the TTL, no demand seen, or a TTL's spending is a turn already:
        // not paced.
        assert_eq!(paced(false, (100, 1), 18), None);
        assert_eq!(paced(true, (0, 1), 0), None);
        assert_eq!(paced(true, (2_500, 1), 450), None);
    }

    /// Healthy seed 87: a bucket of 101 refilled 889 a second, 16 processes deciding 61 times a second each.
    /// Chunks of 9 every 147 ms: two of them span more than the 56 ms the refill takes to make half the burst, so
    /// a dozen processes pending at once would hold the level at 0 (60 % sold). Not paced.
    #[test]
    fn no_pace_where_two_chunks_outlast_the_refill_of_half_the_burst() {
        let bucket = TokenBucket {
            capacity: 101,
            rate: 889,
            per_ms: 1_000,
        };
        let lease = Lease {
            min_batch: 6,
            max_batch: 98,
            ttl: std::time::Duration::from_millis(300),
            hot_after: None,
            reserve: None,
        };
        assert_eq!(span_chunks(&bucket, 147), 0);
        assert_eq!(paced_turn((&bucket, &lease), true, (61, 1), 16), None);
        // Ten times the capacity: ten chunks fit, and the same demand is paced.
        let larger = TokenBucket {
            capacity: 1_010,
            ..bucket
        };
        assert!(paced_turn((&larger, &lease), true, (61, 1), 16).is_some());
    }

    #[test]
    fn a_grant_that_is_not_paced_is_one_chunk() {
        let mut s = Schedule::default();
        for (granted, pace) in [
            (70, Pace::default()),
            (
                20,
                Pace {
                    chunk: 20,
                    chunk_ms: 100,
                },
            ),
        ] {
            assert_eq!(
                s.split((granted, 3), pace, 5),
                Chunk {
                    at_ns: 5,
                    tokens: granted,
                    stamp: 3
                }
            );
            assert_eq!(s.tokens(), 0);
        }
    }
}
