//! The slow side of a [`super::bucket::LocalBucket`]: its book of leases (batches, their deadlines and stamps, the
//! paced chunks to come, the adaptive batch and the demand), behind the bucket's mutex, and what a give-back
//! carries ([`Unspent`]).

use std::collections::VecDeque;

use super::heat::FEWEST_TELLING;
use super::schedule::{Chunk, Schedule};
use super::shards::Counts;
use crate::algorithm::room::Lent;
#[cfg(doc)]
use crate::algorithm::Reply;

/// Tokens to give back to the shared bucket, by the lease each came from ([`Lent`]: the lease's stamp,
/// [`Reply::stamp`], caps what its tokens add, `token_return.lua`). One call gives them all back.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Unspent {
    pub(crate) lent: Vec<Lent>,
}

impl Unspent {
    /// The tokens of `chunks`, each with its lease's stamp.
    pub(super) fn of(chunks: &[Chunk]) -> Self {
        (chunks.iter()).fold(Self::default(), |unspent, c| unspent.and(c.tokens, c.stamp))
    }

    /// `tokens` left of `batches` (oldest first), spent first in, first out: they belong to the newest; any
    /// beyond what the batches hold (taken and put back meanwhile) are counted to the oldest, whose stamp caps
    /// the most.
    pub(super) fn left_of<'a>(batches: impl DoubleEndedIterator<Item = &'a Batch> + Clone, tokens: u64) -> Self {
        let mut left = tokens;
        let mut unspent = Self::default();
        for b in batches.clone().rev() {
            let n = b.tokens.min(left);
            unspent = unspent.and(n, b.stamp);
            left -= n;
        }
        let oldest = batches.map(|b| b.stamp).next().unwrap_or(0);
        unspent.and(left, oldest)
    }

    /// These tokens and `tokens` more of the lease stamped `stamp`.
    #[must_use]
    pub(crate) fn and(mut self, tokens: u64, stamp: u64) -> Self {
        if tokens == 0 {
            return self;
        }
        match self.lent.iter_mut().find(|l| l.stamp == stamp) {
            Some(l) => l.tokens = l.tokens.saturating_add(tokens),
            None => self.lent.push(Lent { stamp, tokens }),
        }
        self
    }

    /// The tokens, all leases together.
    pub(crate) fn tokens(&self) -> u64 {
        self.lent.iter().map(|l| l.tokens).sum()
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
    /// Whether the shared bucket had room at the last lease, and the key's turn when it had not.
    pub(super) turn: Turn,
    /// When the last lease was sent, and the decisions counted by then.
    pub(super) last_lease_ns: u64,
    pub(super) decisions_at_lease: u64,
    /// The key's demand, refusals included.
    pub(super) demand: Demand,
    /// Decisions already added to the metrics.
    pub(super) flushed: Counts,
    /// The decisions counted at the last sweeps: the demand over about the last TTL.
    pub(super) recent: Recent,
    /// When the sweeper last measured the key's heat, and the decisions counted by then.
    pub(super) heat_at_ns: u64,
    pub(super) decisions_at_heat: u64,
}

/// A key's demand in decisions a second, refusals included, stepped by [`Demand::measured`] at each lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Demand {
    /// Nothing known: a bucket made hot on a shared bucket the fleet spends, or one whose first lease waited to
    /// measure it ([`super::bucket::LocalBucket::first_lease_wait`]).
    Unknown,
    /// What the hot-key sketch counted when it made the key hot ([`super::heat::Heat::per_s`]): it sizes the
    /// first lease (a warm key of a Zipf sale deciding once per TTL would lease `min_batch` and give most back),
    /// and a measure of a few decisions replaces it ([`Demand::measured`]). The sketch reads every key at the count
    /// that made it hot, whatever its speed, so a key of 10^4 decisions a second is seeded at a few a second:
    /// mixed with the measures as the demand of a TTL, it ramped a flash sale's leases up by doubling (demand
    /// read 6, 35, 199, 373, 692 ... a second, a lease a few hundred µs) while the other processes' turns were
    /// spaced for a few tokens.
    Seeded(u64),
    /// A moving average of the decisions a second measured between leases ([`smoothed`]).
    Measured(u64),
}

impl Demand {
    /// Decisions a second, 0 when unknown.
    pub(super) fn per_s(self) -> u64 {
        match self {
            Self::Unknown => 0,
            Self::Seeded(per_s) | Self::Measured(per_s) => per_s,
        }
    }

    /// The demand after `decided` decisions in the last `elapsed_ns`, averaged over about one `window_ns` (the
    /// lease TTL) with the one before ([`smoothed`]). A seeded demand is kept by a measure of no decision (the
    /// first lease's, sent by the decision that made the key hot) and replaced by one that counts
    /// [`FEWEST_TELLING`] decisions or more: timed, they tell the key's speed, which the seed does not.
    #[must_use]
    pub(super) fn measured(self, (decided, elapsed_ns): (u64, u64), window_ns: u64) -> Self {
        let before = match self {
            Self::Unknown | Self::Seeded(_) if decided == 0 => return self,
            Self::Seeded(_) if decided >= FEWEST_TELLING => 0,
            Self::Unknown => 0,
            Self::Seeded(per_s) | Self::Measured(per_s) => per_s,
        };
        Self::Measured(smoothed(before, (decided, elapsed_ns), window_ns))
    }
}

/// The demand in decisions a second after `decided` decisions in the last `elapsed_ns`, `before` the estimate
/// until then (0: none): a moving average over about one `window_ns` (the lease TTL), weighted by time, so that
/// two leases sent close together (a lease of few decisions) do not read a slow key as idle, nor a burst as its
/// rate.
pub(super) fn smoothed(before: u64, (decided, elapsed_ns): (u64, u64), window_ns: u64) -> u64 {
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

    /// The span (ns, at least 1) and the decisions seen since the sample `back` samples after the oldest, at
    /// `now_ns` with `decisions` counted.
    fn since(&self, back: usize, (now_ns, decisions): (u64, u64)) -> (u64, u128) {
        let (at_ns, counted) = self.samples[(self.next + back) % self.samples.len()];
        let span_ns = now_ns.saturating_sub(at_ns).max(1);
        (span_ns, u128::from(decisions.saturating_sub(counted)))
    }

    /// The demand in decisions a second over about the last TTL (the newest half of the samples), `None` before
    /// they span a tenth of a second.
    pub(super) fn lately(&self, now: (u64, u64)) -> Option<u64> {
        let (span_ns, seen) = self.since(self.samples.len() / 2, now);
        (span_ns >= 100_000_000).then(|| per_s(seen, span_ns))
    }

    /// The demand in decisions a second when it fell under half of `before_per_s`: since the second newest
    /// sample (a quarter to half a TTL) where that demand would have brought at least 4 × [`FALL_DECISIONS`]
    /// there (fewer than half of 64 comes by chance about once in 10^4), else since the oldest where it would
    /// have brought [`FALL_DECISIONS`]; `None` otherwise. A fast key's fall is so told within half a TTL, before
    /// the tokens leased for the old demand expire here while the other processes are refused.
    pub(super) fn fallen(&self, before_per_s: u64, now: (u64, u64)) -> Option<u64> {
        [(self.samples.len() - 2, 4 * FALL_DECISIONS), (0, FALL_DECISIONS)]
            .into_iter()
            .find_map(|(back, least)| {
                let (span_ns, seen) = self.since(back, now);
                let expected = u128::from(before_per_s) * u128::from(span_ns) / 1_000_000_000;
                (expected >= u128::from(least) && seen * 2 < expected).then(|| per_s(seen, span_ns))
            })
    }
}

/// `seen` decisions over `span_ns` (at least 1) as decisions a second.
fn per_s(seen: u128, span_ns: u64) -> u64 {
    u64::try_from(seen * 1_000_000_000 / u128::from(span_ns)).unwrap_or(u64::MAX)
}

/// What a key knows of the shared bucket: room at the last lease, or saturated (the fleet drains it), and then
/// its turn there (`token_lease.lua`, invariant 18). Stepped by [`Turn::step`]:
///
/// | from | event | to |
/// | --- | --- | --- |
/// | any | `Granted { turn_ns: Some(t), .. }` | `Handed { turn_ns: t }` |
/// | any | `Granted { turn_ns: None, short: false }` | `Room` |
/// | any | `Granted { turn_ns: None, short: true }` | `Saturated` |
/// | `Room` | `Drained` | `Saturated` |
/// | `Handed` | `Outran` | `Saturated` |
/// | any | `Fell` | `Probing` |
/// | `Probing` | `StoreRefused`, the next probe at or after the kept turn | `Saturated` (it waits for the kept turn) |
/// | `Probing` | `StoreRefused` before | `Probing`, the back-off doubled |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Turn {
    /// The shared bucket had room at the last lease: leases are sized as a fair share of the burst and go when
    /// the tokens run low.
    #[default]
    Room,
    /// The fleet drains the shared bucket, no turn to wait for: the next lease goes when the tokens run low,
    /// takes what is there (up to two batches) and is handed a turn.
    Saturated,
    /// Handed a turn with the last grant: no lease before `turn_ns` (monotonic ns).
    Handed { turn_ns: u64 },
    /// The wait for a turn lifted by a fall in the demand ([`super::bucket::LocalBucket::sample`]): its leases
    /// ask for no turn, so that a refusal does not push the fleet's queue of turns back; a refused one waits
    /// `backoff_ns` (doubled each time, from one TTL) and probes again, and waits for the kept turn once the next
    /// probe would come after it.
    Probing { kept_turn_ns: u64, backoff_ns: u64 },
}

/// What happens to a key's turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TurnEvent {
    /// A lease was granted, handed a turn at `turn_ns` (monotonic ns) or none, and leaving the shared bucket
    /// `short` (less than a batch, or less than half its burst: the fleet spends it) or not.
    Granted { turn_ns: Option<u64>, short: bool },
    /// The shared bucket was seen drained: a lease or a decision was refused, or the key was made hot because
    /// the fleet spends the bucket.
    Drained,
    /// A lease was refused at `now_ns`, told to come back after `retry_after_ns` (not "never").
    StoreRefused { retry_after_ns: u64, now_ns: u64 },
    /// Half a batch or more expired unspent (a process alone: any token): the demand was outrun, and the turn's
    /// premise (the fleet spends the bucket) with it.
    Outran,
    /// The demand fell under half while waiting for the turn `kept_turn_ns`; a refused probe backs off
    /// `backoff_ns` first.
    Fell { kept_turn_ns: u64, backoff_ns: u64 },
}

impl Turn {
    /// The turn after `event`, and, for [`TurnEvent::StoreRefused`] while probing, how long to wait instead of
    /// the refusal's `retry_after` (ns): the probe's back-off, or the kept turn once the next probe would come
    /// after it.
    pub(super) fn step(self, event: TurnEvent) -> (Self, Option<u64>) {
        match (self, event) {
            (
                _,
                TurnEvent::Granted {
                    turn_ns: Some(turn_ns), ..
                },
            ) => (Self::Handed { turn_ns }, None),
            (_, TurnEvent::Granted { turn_ns: None, short }) => {
                (if short { Self::Saturated } else { Self::Room }, None)
            }
            (Self::Room, TurnEvent::Drained) | (Self::Handed { .. }, TurnEvent::Outran) => (Self::Saturated, None),
            (
                _,
                TurnEvent::Fell {
                    kept_turn_ns,
                    backoff_ns,
                },
            ) => (
                Self::Probing {
                    kept_turn_ns,
                    backoff_ns,
                },
                None,
            ),
            (
                Self::Probing {
                    kept_turn_ns,
                    backoff_ns,
                },
                TurnEvent::StoreRefused { retry_after_ns, now_ns },
            ) => {
                let backoff = retry_after_ns.max(backoff_ns);
                let kept = kept_turn_ns.saturating_sub(now_ns);
                if backoff >= kept {
                    (Self::Saturated, Some(kept.max(retry_after_ns)))
                } else {
                    let backoff_ns = backoff_ns.saturating_mul(2);
                    (
                        Self::Probing {
                            kept_turn_ns,
                            backoff_ns,
                        },
                        Some(backoff),
                    )
                }
            }
            (turn, _) => (turn, None),
        }
    }

    /// Whether the fleet drains the shared bucket (every state but [`Turn::Room`]).
    pub(super) fn saturated(self) -> bool {
        self != Self::Room
    }

    /// The turn handed with the last grant (monotonic ns), 0 when none.
    pub(super) fn turn_ns(self) -> u64 {
        match self {
            Self::Handed { turn_ns } => turn_ns,
            _ => 0,
        }
    }

    /// Whether the next lease is a probe, at `now_ns`: it asks for no turn until the kept turn.
    pub(super) fn probing(self, now_ns: u64) -> bool {
        matches!(self, Self::Probing { kept_turn_ns, .. } if kept_turn_ns > now_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::{Turn, TurnEvent};

    #[test]
    fn a_turn_steps_by_grants_refusals_and_falls() {
        const MS: u64 = 1_000_000;
        let handed = Turn::Handed { turn_ns: 900 * MS };
        let probing = Turn::Probing {
            kept_turn_ns: 900 * MS,
            backoff_ns: 100 * MS,
        };
        let refused_at = |now_ms: u64| TurnEvent::StoreRefused {
            retry_after_ns: 20 * MS,
            now_ns: now_ms * MS,
        };
        let fell = TurnEvent::Fell {
            kept_turn_ns: 900 * MS,
            backoff_ns: 100 * MS,
        };
        let granted = |turn_ms: Option<u64>, short| TurnEvent::Granted {
            turn_ns: turn_ms.map(|ms| ms * MS),
            short,
        };
        let (room, saturated) = (Turn::Room, Turn::Saturated);
        // state x event -> state, and the wait instead of the refusal's retry_after (ns)
        let table = [
            (room, granted(None, false), room, None),
            (saturated, granted(None, false), room, None),
            (room, granted(None, true), saturated, None),
            (probing, granted(None, false), room, None),
            (probing, granted(None, true), saturated, None),
            (room, granted(Some(900), false), handed, None),
            (probing, granted(Some(900), true), handed, None),
            (room, TurnEvent::Drained, saturated, None),
            (saturated, TurnEvent::Drained, saturated, None),
            (handed, TurnEvent::Drained, handed, None),
            (probing, TurnEvent::Drained, probing, None),
            (handed, TurnEvent::Outran, saturated, None),
            (probing, TurnEvent::Outran, probing, None),
            (room, TurnEvent::Outran, room, None),
            (saturated, TurnEvent::Outran, saturated, None),
            (handed, fell, probing, None),
            (saturated, fell, probing, None),
            // A refused probe backs off, doubling, while the next probe comes before the kept turn...
            (
                probing,
                refused_at(500),
                Turn::Probing {
                    kept_turn_ns: 900 * MS,
                    backoff_ns: 200 * MS,
                },
                Some(100 * MS),
            ),
            // ...and waits for the kept turn once it would not.
            (probing, refused_at(850), saturated, Some(50 * MS)),
            (probing, refused_at(950), saturated, Some(20 * MS)),
            // A refusal of a key not probing is its own retry_after.
            (handed, refused_at(500), handed, None),
            (saturated, refused_at(500), saturated, None),
        ];
        for (from, event, to, instead) in table {
            assert_eq!(from.step(event), (to, instead), "{from:?} + {event:?}");
        }
        assert_eq!(handed.turn_ns(), 900 * MS);
        assert_eq!(probing.turn_ns(), 0);
        assert!(probing.probing(899 * MS) && !probing.probing(900 * MS));
        assert!(!handed.probing(0));
        assert!(!room.saturated() && saturated.saturated() && handed.saturated() && probing.saturated());
    }
}
