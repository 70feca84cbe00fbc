//! The slow side of a [`super::bucket::LocalBucket`]: its book of leases (batches, their deadlines and stamps, the
//! paced chunks to come, the adaptive batch and the demand), behind the bucket's mutex, and what a give-back
//! carries ([`Unspent`]).

use std::collections::VecDeque;

use super::schedule::Schedule;
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

/// A batch of tokens and the time by which they must be spent.
#[derive(Debug, Clone, Copy)]
pub(super) struct Batch {
    /// Tokens of this batch still attributed to it.
    pub(super) tokens: u64,
    /// Monotonic ns after which its tokens go back.
    pub(super) deadline_ns: u64,
}

#[derive(Debug)]
pub(super) struct Book {
    /// Live batches, oldest first.
    pub(super) batches: VecDeque<Batch>,
    /// `(until_ns, stamp)` of each lease whose tokens may still be here, oldest first: until its last chunk's
    /// deadline, and its stamp in the shared bucket's notes ([`Reply::stamp`]). A give-back sends the oldest
    /// stamp ([`Self::oldest_stamp`]): the tokens it gives back came from that lease or a later one.
    pub(super) stamps: VecDeque<(u64, u64)>,
    /// The chunks of a paced lease still to be released.
    pub(super) schedule: Schedule,
    /// The adaptive batch size, in tokens.
    pub(super) batch: u64,
    /// The shared bucket is saturated: the last lease was handed a turn (`token_lease.lua`) or left less than a
    /// batch behind.
    pub(super) saturated: bool,
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

impl Book {
    /// The stamp of the oldest lease whose tokens may still be here; then forgets the leases whose last deadline
    /// has passed by `now_ns` (their tokens are given back with this stamp). 0 when none.
    pub(super) fn oldest_stamp(&mut self, now_ns: u64) -> u64 {
        let oldest = self.stamps.front().map_or(0, |(_, stamp)| *stamp);
        self.stamps.retain(|(until_ns, _)| *until_ns > now_ns);
        oldest
    }
}
