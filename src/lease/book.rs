//! The slow side of a [`super::bucket::LocalBucket`]: its book of leases (batches, their deadlines and stamps, the
//! paced chunks to come, the adaptive batch and the demand), behind the bucket's mutex, and what a give-back
//! carries ([`Unspent`]).

use std::collections::VecDeque;

use super::schedule::{Chunk, Schedule};
use super::shards::Counts;
#[cfg(doc)]
use crate::algorithm::Reply;

/// Tokens to give back to the shared bucket, and `since`: the stamp of the oldest lease they may come from
/// ([`Reply::stamp`]), which caps what they add (`token_return.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Unspent {
    pub(crate) tokens: u64,
    pub(crate) since: u64,
}

impl Unspent {
    /// The tokens of `chunks`, with the oldest of their stamps.
    pub(super) fn of(chunks: &[Chunk]) -> Self {
        (chunks.iter()).fold(Self::default(), |unspent, c| unspent.and(c.tokens, c.stamp))
    }

    /// These tokens and `tokens` more of the lease stamped `stamp`: the older stamp of the two, where each has
    /// tokens.
    #[must_use]
    pub(crate) fn and(self, tokens: u64, stamp: u64) -> Self {
        match (self.tokens, tokens) {
            (_, 0) => self,
            (0, _) => Self { tokens, since: stamp },
            _ => Self {
                tokens: self.tokens.saturating_add(tokens),
                since: self.since.min(stamp),
            },
        }
    }
}

/// A batch of tokens, the time by which they must be spent, and the lease they came from.
#[derive(Debug, Clone, Copy)]
pub(super) struct Batch {
    /// Tokens of this batch still attributed to it.
    pub(super) tokens: u64,
    /// Monotonic ns after which its tokens go back.
    pub(super) deadline_ns: u64,
    /// The stamp of the lease that granted it ([`Reply::stamp`]): its tokens given back send it.
    pub(super) stamp: u64,
}

#[derive(Debug)]
pub(super) struct Book {
    /// Live batches, oldest first.
    pub(super) batches: VecDeque<Batch>,
    /// The chunks of a paced lease still to be released.
    pub(super) schedule: Schedule,
    /// The adaptive batch size, in tokens.
    pub(super) batch: u64,
    /// The shared bucket is saturated: the last lease was handed a turn (`token_lease.lua`) or left less than a
    /// batch behind.
    pub(super) saturated: bool,
    /// Monotonic ns of the turn the shared bucket handed with the last grant: no lease before it (0: none).
    pub(super) turn_at_ns: u64,
    /// When the last lease was sent, and the decisions counted by then.
    pub(super) last_lease_ns: u64,
    pub(super) decisions_at_lease: u64,
    /// Decisions per second between the last two leases (the demand, refusals included).
    pub(super) demand_per_s: u64,
    /// Decisions already added to the metrics.
    pub(super) flushed: Counts,
    /// When the sweeper last measured the key's heat, and the decisions counted by then.
    pub(super) heat_at_ns: u64,
    pub(super) decisions_at_heat: u64,
}
