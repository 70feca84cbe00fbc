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
    /// Probing after a wait lifted by a fall in the demand ([`super::bucket::LocalBucket::sample`]).
    pub(super) probe: Option<Probe>,
    /// When the last lease was sent, and the decisions counted by then.
    pub(super) last_lease_ns: u64,
    pub(super) decisions_at_lease: u64,
    /// Decisions per second between the last two leases (the demand, refusals included).
    pub(super) demand_per_s: u64,
    /// Decisions already added to the metrics.
    pub(super) flushed: Counts,
    /// The decisions counted at the last sweeps: the demand over about the last TTL.
    pub(super) recent: Recent,
    /// When the sweeper last measured the key's heat, and the decisions counted by then.
    pub(super) heat_at_ns: u64,
    pub(super) decisions_at_heat: u64,
}

impl Book {
    /// Whether the next lease is a probe after a lifted wait ([`super::bucket::LocalBucket::sample`]): it asks for
    /// no turn, so that a refusal does not push the fleet's queue of turns back, and waits for the kept turn if
    /// refused.
    pub(super) fn probing(&self, now_ns: u64) -> bool {
        self.probe.is_some_and(|p| p.kept_turn_ns > now_ns)
    }
}

/// The decisions a key's demand at its last lease must have brought over the last samples, for a fall to half of
/// them to count as a fall ([`Recent::fallen`]): fewer than half of 16 comes by chance in about one wait of 50
/// (a Poisson count).
pub(super) const FALL_DECISIONS: u64 = 16;

/// A key's decisions counted at the last eight sweeps (a sweep every quarter of the shortest TTL), the oldest
/// overwritten: the demand over about the last two TTLs, which a lease's measure since the last lease (seconds ago
/// while the key waited for its turn) does not see.
#[derive(Debug, Clone, Copy)]
pub(super) struct Recent {
    /// `(monotonic ns, decisions counted by then)`, `next` the oldest.
    samples: [(u64, u64); 8],
    next: usize,
}

impl Recent {
    /// No decision yet at `now_ns`.
    pub(super) fn new(now_ns: u64) -> Self {
        Self {
            samples: [(now_ns, 0); 8],
            next: 0,
        }
    }

    /// Records the decisions counted by `now_ns`, overwriting the oldest sample.
    pub(super) fn sample(&mut self, (now_ns, decisions): (u64, u64)) {
        self.samples[self.next] = (now_ns, decisions);
        self.next = (self.next + 1) % self.samples.len();
    }

    /// The demand in decisions a second since the oldest sample, when it fell under half of `before_per_s`
    /// over a span where that demand would have brought at least [`FALL_DECISIONS`]; `None` otherwise.
    pub(super) fn fallen(&self, before_per_s: u64, (now_ns, decisions): (u64, u64)) -> Option<u64> {
        let (at_ns, counted) = self.samples[self.next];
        let span_ns = now_ns.saturating_sub(at_ns).max(1);
        let expected = u128::from(before_per_s) * u128::from(span_ns) / 1_000_000_000;
        let seen = u128::from(decisions.saturating_sub(counted));
        (expected >= u128::from(FALL_DECISIONS) && seen * 2 < expected)
            .then(|| u64::try_from(seen * 1_000_000_000 / u128::from(span_ns)).unwrap_or(u64::MAX))
    }
}

/// A key probing the shared bucket after its wait for a turn was lifted by a fall in its demand: its leases ask
/// for no turn, so that a refusal does not push the fleet's queue of turns back; a refused one waits `backoff`
/// (doubled each time, from one TTL) and probes again, and waits for the kept turn once the next probe would
/// come after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Probe {
    /// Monotonic ns of the turn the lifted wait would have ended at.
    pub(super) kept_turn_ns: u64,
    /// The wait after the next refusal, ns.
    pub(super) backoff_ns: u64,
}
