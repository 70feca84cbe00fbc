//! A paced lease's chunks not yet released: the [`Schedule`] of one key's local bucket.
//!
//! A paced lease (`lua/token_lease.lua`, [`crate::algorithm::Pace`]) is granted `n` tokens at once but
//! releases them to the key's callers in chunks of `chunk` tokens, one every `chunk_ms` from when the lease was
//! sent. Each chunk is spent within the lease TTL of its release (invariant 1 counts the TTL from there), and the
//! shared bucket keeps what is still to be released as pending. A process that decides 100 times a second then
//! brings a second's spending per call instead of a TTL's.

use std::collections::VecDeque;

use crate::algorithm::{Pace, TokenBucket};
use crate::rule::Lease;

/// Chunks released at a time, oldest first.
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
}

impl Schedule {
    /// Splits a grant of `granted` tokens, leased at `sent_ns`, by `pace` into chunks: `chunk` tokens each (the
    /// last one the rest), the i-th released at `sent_ns + i × chunk_ms`. Returns the first chunk (released
    /// at `sent_ns`, what is spendable at once) and schedules the others. A grant that is not paced, or fits in
    /// one chunk, is one chunk.
    pub(crate) fn split(&mut self, granted: u64, pace: Pace, sent_ns: u64) -> Chunk {
        let first = Chunk {
            at_ns: sent_ns,
            tokens: granted,
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
            self.chunks.push_back(Chunk { at_ns, tokens });
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

    /// Drops every chunk (the bucket is drained) and returns their tokens, to be given back.
    pub(crate) fn clear(&mut self) -> u64 {
        let tokens = self.tokens();
        self.chunks.clear();
        tokens
    }
}

/// A paced lease's pace and turn (invariant 18), when the shared bucket is `saturated` and the demand of
/// `demand_per_s` decisions a second spends less in the TTL (`spendable`, tokens) than the bucket refills in
/// it (`rate × ttl`, clamped to the batch bounds): the turn is the latter, released in chunks of what the
/// demand spends in half a TTL, one every half TTL. The turns, 0.6 of a turn's refill apart, then come about
/// eight times a second whatever the fleet's size. At 100 decisions a second (a fleet of 1000 sharing 10^5)
/// and the shipped rule, a turn brings 200 tokens in chunks of 10 instead of 18 at once.
///
/// The price is time: a turn's tokens are spent over `granted / demand` (1.2 s here), and what the fleet was
/// granted but has not released yet, about `0.3 × turn × rate / demand` tokens (600 here: ten processes
/// halfway through turns of 120), is spent later than it would be without pacing.
/// `None`: not paced (not saturated, no demand seen, a stock, or the TTL's spending is already a turn).
pub(crate) fn paced_turn(
    (bucket, lease): (&TokenBucket, &Lease),
    saturated: bool,
    demand_per_s: u64,
    spendable: u64,
) -> Option<(Pace, u64)> {
    if !saturated || demand_per_s == 0 || bucket.rate == 0 {
        return None;
    }
    let turn = u128::from(bucket.rate) * lease.ttl.as_millis() / u128::from(bucket.per_ms);
    let turn = u64::try_from(turn)
        .unwrap_or(u64::MAX)
        .clamp(lease.min_batch, lease.max_batch);
    if turn <= spendable {
        return None;
    }
    let half_ttl_ms = u64::try_from(lease.ttl.as_millis() / 2).unwrap_or(u64::MAX).max(1);
    let chunk = u128::from(demand_per_s) * u128::from(half_ttl_ms) / 1_000;
    let pace = Pace {
        chunk: u64::try_from(chunk).unwrap_or(u64::MAX).max(1),
        chunk_ms: half_ttl_ms,
    };
    Some((pace, turn))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_paced_grant_is_released_a_chunk_at_a_time() {
        let mut s = Schedule::default();
        let pace = Pace {
            chunk: 20,
            chunk_ms: 100,
        };
        let first = s.split(70, pace, 1_000 * MS);
        assert_eq!(
            first,
            Chunk {
                at_ns: 1_000 * MS,
                tokens: 20
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
                    tokens: 20
                },
                Chunk {
                    at_ns: 1_200 * MS,
                    tokens: 20
                }
            ]
        );
        assert_eq!(s.clear(), 10);
        assert_eq!(s.next_ns(), None);
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
                s.split(granted, pace, 5),
                Chunk {
                    at_ns: 5,
                    tokens: granted
                }
            );
            assert_eq!(s.tokens(), 0);
        }
    }
}
