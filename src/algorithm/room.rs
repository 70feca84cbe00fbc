//! What a token bucket could take back: the *room* (tokens up to its top) it had at each change of its level
//! since a lease (mirrors the `stamps`, `rooms` and `rooms_from` fields of the token scripts in `lua/`).
//!
//! The store refills a bucket while a lease's tokens are out, as if they were spent. Tokens given back unspent
//! after the level had refilled to its top would count twice: the refill the top cut off then, and the tokens
//! now. A give-back is worth what the bucket would hold had those tokens never left it: at most the lowest room
//! the level had at any change since the lease's grant (the refill is computed, and cut at the top, only at a
//! change). So every change of a leased bucket's level gets a *stamp* (a number that only grows: the store's
//! milliseconds × 1000 plus a count within the millisecond), its room is noted, the lease's reply carries its
//! stamp, and the give-back sends it back ([`Rooms::lowest_since`]).
//!
//! A give-back that adds `d` tokens lowers by `d` every room noted after its lease's stamp (the level would
//! have been that much higher there): two give-backs cannot both fill the same room ([`Rooms::fill_since`]).
//!
//! Only the lowest room since each stamp matters, so a new note removes every earlier one with as much room. At
//! most [`ROOMS`] are kept; beyond, the two neighbours whose rooms differ least merge into the later stamp with
//! the lower room, which can only make a give-back worth less, and by at most that difference.

/// Notes a bucket keeps (the staircase's steps).
pub const ROOMS: usize = 16;

/// Stamps per millisecond: a stamp is `now_ms × STAMPS_PER_MS` plus a count within the millisecond.
pub const STAMPS_PER_MS: u64 = 1000;

/// Tokens a give-back returns from one lease, named by its stamp ([`super::Reply::stamp`]): they add at most the
/// lowest room the bucket had since that lease ([`Rooms::lowest_since`]). A give-back of tokens from several
/// leases names each (each lease's own notes cap its own tokens: capped all at the oldest stamp, tokens of a
/// later lease would lose the room its own grant took, found by `tests/undersell.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lent {
    /// The stamp of the lease the tokens came from.
    pub stamp: u64,
    /// Whole tokens given back.
    pub tokens: u64,
}

impl Lent {
    /// `token_return.lua`'s `since` argument: `stamp:tokens` pairs joined by commas.
    pub(crate) fn encode(lent: &[Self]) -> String {
        let pairs: Vec<String> = lent.iter().map(|l| format!("{}:{}", l.stamp, l.tokens)).collect();
        pairs.join(",")
    }
}

/// The room a bucket had at each change of its level since a lease (module docs). `from == 0`: no lease since the
/// bucket was last full, so nothing is noted and a give-back with a stamp is worth nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Rooms {
    /// The stamp since which every change is noted (the first lease's); 0 when none.
    pub from: u64,
    /// The last stamp handed out.
    pub last: u64,
    /// `(stamp, room)` of the first `len` steps, oldest first; a room is whole tokens the level could take up to
    /// the bucket's top just before the change so stamped.
    pub steps: [(u64, u64); ROOMS],
    /// Steps in use.
    pub len: usize,
}

impl Rooms {
    /// Notes a change at `now_ms` whose level had `room` whole tokens up to the top just before it, and returns
    /// its stamp. `lease`: a lease's grant, which starts the notes; any other change is noted only once they have
    /// started (0 is returned otherwise).
    pub(crate) fn note(&mut self, room: u64, lease: bool, now_ms: u64) -> u64 {
        if self.from == 0 && !lease {
            return 0;
        }
        let stamp = self.last.saturating_add(1).max(now_ms.saturating_mul(STAMPS_PER_MS));
        if self.from == 0 {
            self.from = stamp;
        }
        self.last = stamp;
        while self.len > 0 && self.steps[self.len - 1].1 >= room {
            self.len -= 1;
        }
        if self.len == ROOMS {
            // Two neighbours merge, those whose rooms differ least (the oldest such): the later stamp with the
            // lower room. A give-back of a lease granted between them loses at most that difference.
            let mut i = 0;
            for j in 1..ROOMS - 1 {
                let rise = |k: usize| self.steps[k + 1].1.saturating_sub(self.steps[k].1);
                if rise(j) < rise(i) {
                    i = j;
                }
            }
            self.steps[i + 1].1 = self.steps[i + 1].1.min(self.steps[i].1);
            self.steps.copy_within(i + 1.., i);
            self.len -= 1;
        }
        self.steps[self.len] = (stamp, room);
        self.len += 1;
        // Unused steps are zero, so equal notes compare equal.
        self.steps[self.len..].fill((0, 0));
        stamp
    }

    /// The lowest room noted after `stamp` (a lease's grant), [`u64::MAX`] when no change came after it; 0 when
    /// the notes do not reach back to it (they started later: the bucket was full or reloaded in between).
    pub(crate) fn lowest_since(&self, stamp: u64) -> u64 {
        if self.from == 0 || stamp < self.from {
            return 0;
        }
        self.steps[..self.len]
            .iter()
            .filter(|(m, _)| *m > stamp)
            .map(|(_, room)| *room)
            .min()
            .unwrap_or(u64::MAX)
    }

    /// `tokens` given back from the lease stamped `stamp` are added: had they never left, the level would have
    /// been that much higher at every change since, so each room noted after the stamp is that much less (two
    /// give-backs cannot both fill the same room).
    pub(crate) fn fill_since(&mut self, stamp: u64, tokens: u64) {
        for (m, room) in &mut self.steps[..self.len] {
            if *m > stamp {
                *room = room.saturating_sub(tokens);
            }
        }
    }

    /// The notes a hash holds: `rooms_from`, `stamps` and `rooms` (`stamp:room` pairs joined by commas, as the
    /// scripts write them).
    #[cfg(test)]
    pub(crate) fn from_fields(from: u64, last: u64, rooms: &str) -> Self {
        let mut r = Self {
            from,
            last,
            ..Self::default()
        };
        for (m, room) in rooms.split(',').filter_map(|step| step.split_once(':')) {
            if let (Ok(m), Ok(room), true) = (m.parse(), room.parse(), r.len < ROOMS) {
                r.steps[r.len] = (m, room);
                r.len += 1;
            }
        }
        r
    }

    /// The steps as the hash's `rooms` field writes them.
    #[cfg(test)]
    fn encode(&self) -> String {
        let steps: Vec<String> = self.steps[..self.len].iter().map(|(m, r)| format!("{m}:{r}")).collect();
        steps.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_give_back_is_worth_the_lowest_room_after_its_stamp() {
        let mut r = Rooms::default();
        assert_eq!(r.note(5, false, 1), 0, "nothing is noted before a lease");
        let a = r.note(40, true, 10);
        assert_eq!((a, r.from), (10_000, 10_000));
        let b = r.note(0, false, 10);
        assert_eq!(b, 10_001, "stamps grow within a millisecond");
        let c = r.note(30, true, 20);
        r.note(60, false, 30);
        assert_eq!(r.lowest_since(a), 0, "the level was at its top after a");
        assert_eq!(r.lowest_since(b), 30);
        assert_eq!(r.lowest_since(c), 60);
        assert_eq!(r.lowest_since(r.last), u64::MAX, "nothing changed after the last stamp");
        assert_eq!(r.lowest_since(a - 1), 0, "before the notes start: worth nothing");
        assert_eq!(r.encode(), "10001:0,20000:30,30000:60");
    }

    #[test]
    fn beyond_the_steps_kept_the_neighbours_closest_in_room_merge_into_less_room() {
        let mut r = Rooms::default();
        // Rooms 1, 2, 3, ... 10, then 100, 200, ... : the small rises merge first, the large ones stay exact.
        let rooms: Vec<u64> = (1..=10).chain((1..=12).map(|i| 100 * i)).collect();
        let stamps: Vec<u64> = rooms
            .iter()
            .enumerate()
            .map(|(i, room)| r.note(*room, true, 100 + i as u64))
            .collect();
        assert_eq!(r.len, ROOMS);
        for (i, stamp) in stamps.iter().enumerate() {
            let exact = rooms.get(i + 1).copied().unwrap_or(u64::MAX);
            let kept = r.lowest_since(*stamp);
            assert!(kept <= exact, "after stamp {i}: {kept} > {exact}");
            if rooms[i] >= 100 {
                assert_eq!(kept, exact, "after stamp {i}: the steps of large rises are exact");
            } else {
                assert!(
                    exact - kept <= 9,
                    "after stamp {i}: {kept}, lost more than the small rises"
                );
            }
        }
    }

    use crate::algorithm::token_bucket::Back;
    use crate::algorithm::{Pace, TokenBucket};
    use proptest::prelude::*;

    /// A lease out: granted at `at_ms` with `stamp`, `granted` tokens, of which `back` go back at `back_ms`.
    struct Out {
        at_ms: u64,
        stamp: u64,
        granted: u64,
        back: u64,
        back_ms: u64,
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        /// Leases, takes and give-backs that name their leases (one by one or `merged`, several in a call), in any order: what the bucket grants, less
        /// what comes back, never exceeds its capacity plus its refill over any span of grants. So a fleet that
        /// spends each lease within its TTL admits at most `capacity + rate × (W + ttl)` in any window W.
        #[test]
        fn grants_less_give_backs_stay_within_the_bucket_over_every_span(
            capacity in 1u64..200,
            rate in 0u64..300,
            ttl_ms in 1u64..2_000,
            steps in prop::collection::vec((0u64..400, 0u64..4, 1u64..200, 0u64..=100, 0u64..=100), 1..60),
            merged: bool,
        ) {
            let b = TokenBucket { capacity, rate, per_ms: 1_000 };
            let (mut state, mut now) = (None, 0u64);
            let mut out: Vec<Out> = Vec::new();
            // (ms, net tokens) of each grant, once its give-back is known.
            let mut net: Vec<(u64, u64)> = Vec::new();
            let mut last = 0;
            for (gap, kind, n, back_pct, when_pct) in steps {
                now += gap;
                // Give-backs due by now, oldest first, each at its time (never before the last call).
                // Merged: those due by now go back in one call, each lease's tokens named.
                out.sort_by_key(|o| o.back_ms);
                let mut lent = Vec::new();
                while out.first().is_some_and(|o| o.back_ms <= now) {
                    let o = out.remove(0);
                    last = last.max(o.back_ms);
                    lent.push(Lent { stamp: o.stamp, tokens: o.back });
                    if !merged {
                        state = b.give_back(state, Back::Lent(&lent), last).0;
                        lent.clear();
                    }
                    net.push((o.at_ms, o.granted - o.back));
                }
                if !lent.is_empty() {
                    state = b.give_back(state, Back::Lent(&lent), last).0;
                }
                last = now;
                if kind == 0 {
                    // A plain take: spent at once.
                    let (s, reply) = b.take(state, 1, n, now);
                    state = s;
                    net.push((now, reply.granted));
                    continue;
                }
                let (s, _, reply) = b.lease((state, 0), (1, n, 0), (Pace::default(), None), now);
                state = s;
                if reply.granted > 0 {
                    let back = reply.granted * back_pct / 100;
                    let back_ms = now + ttl_ms * when_pct / 100;
                    out.push(Out { at_ms: now, stamp: reply.stamp, granted: reply.granted, back, back_ms });
                }
            }
            for o in out {
                net.push((o.at_ms, o.granted));
            }
            net.sort_unstable();
            for i in 0..net.len() {
                let mut sum = 0;
                for j in i..net.len() {
                    sum += net[j].1;
                    let bound = capacity * 1_000 + rate * (net[j].0 - net[i].0);
                    prop_assert!(sum * 1_000 <= bound, "{sum} tokens net granted over [{}, {}] ms, bound {} / 1000", net[i].0, net[j].0, bound);
                }
            }
        }
    }
}
