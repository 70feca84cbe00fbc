//! The fleet's roster of one rule, kept in the store (`lua/fleet.lua` mirrors this line for line): which
//! processes are live, and the hold after an outage (invariants 17 and 19 of docs/ARCHITECTURE.md).
//!
//! Every process that uses a leased or `local` rule sends a *beat* for it about once a second. The roster
//! remembers when it last heard each member, and the count it answered it:
//! - the **live count** is the members heard within `live_ms`: every share of the rule (the lease's fair share,
//!   the first turn, the `local` share) divides by it, so the fleet is counted, not guessed;
//! - a member that comes **back** from a store outage (its calls failed since its last beat), or that joins a
//!   fleet whose every member is silent, starts a **hold** if none runs: every member that was silent for
//!   `silent_ms` (it may have sold alone as well) now *owes* a report, and until each has reported (`settled`:
//!   it charged everything it admitted alone), no process leases or calls the rule's keys. So a process that
//!   owed nothing, or that just started, does not sell the stock again before the fleet's debts are charged;
//! - a member that has not reported within `hold_ms` may have exited, its debt with it: it is **presumed** to
//!   have sold its whole local share (its `1 / count` of a full bucket and of the refill while it was silent),
//!   and the hold lasts on until the rule's buckets have refilled that much (the member's *term*,
//!   [`Roster::term`]). The terms are fixed when the hold starts, so a hold only ever ends sooner than a member
//!   last heard, as the others report.
//!
//! A member unheard for `keep_ms` is forgotten (it exited); one that shut down owing nothing leaves at once.

use std::collections::BTreeMap;

use super::Reply;

/// One member's beat, with the roster's timings (all in ms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Beat {
    /// The member: unique to a limiter for the life of its process.
    pub member: String,
    /// A member heard within this is live (about three beats).
    pub live_ms: u64,
    /// A member silent for this long may have been cut off: a hold waits for its report (about 1.5 beats).
    pub silent_ms: u64,
    /// A member unheard for this long is forgotten.
    pub keep_ms: u64,
    /// How long a hold waits for the members' reports before it presumes the silent ones sold their shares.
    pub hold_ms: u64,
    /// The member's store calls failed since its last beat: it comes back from an outage.
    pub back: bool,
    /// The member owes nothing of the rule (everything it admitted alone is charged).
    pub settled: bool,
    /// How long the rule's slowest key takes to refill from empty (ms): what a member presumed to have sold
    /// alone adds to a hold, with the time it was silent, divided by its count. `None`: the rule's sales alone
    /// are not presumed (a window rule, or a bucket that never refills: waiting cannot make up for them).
    pub refill_ms: Option<u64>,
    /// Back: how long this member's calls had failed (ms), which bounds how long the silent members may have
    /// sold alone (at least `live_ms`: a member joining a silent fleet cannot know); 0 otherwise.
    pub cut_ms: u64,
    /// The member leaves the fleet: it shut down owing nothing.
    pub leave: bool,
}

/// The roster of one rule: when each member was last heard (ms) and the count it was answered, the hold, and
/// who owes a report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Roster {
    pub heard: BTreeMap<String, u64>,
    /// The live count each member was last answered: the divisor of its shares.
    pub counts: BTreeMap<String, u64>,
    /// The hold waits for the reports until this (ms); the presumed terms of those still owing follow it.
    pub hold_until_ms: u64,
    /// Counts the holds started: a process tells a new hold from one it saw.
    pub epoch: u64,
    /// Members whose report the hold waits for, each with its term: the ms its presumed sales add to the hold if
    /// it never reports.
    pub owing: BTreeMap<String, u64>,
}

/// What a beat answers, in the protocol's four integers: `{ processes, owing, hold_ms, epoch }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Count {
    /// Live members, this one included (at least 1).
    pub processes: u64,
    /// Members the hold still waits for.
    pub owing: u64,
    /// How long the hold lasts from now (ms), 0 when none: until `hold_ms` from its start and the terms of
    /// those still owing.
    pub hold_ms: u64,
    /// The holds started so far.
    pub epoch: u64,
}

impl Count {
    /// The script's reply as a count.
    pub(crate) fn from_reply(reply: &Reply) -> Self {
        Self {
            processes: reply.granted.max(1),
            owing: reply.remaining,
            hold_ms: u64::try_from(reply.retry_after_ms).unwrap_or(0),
            epoch: u64::try_from(reply.reset_after_ms).unwrap_or(0),
        }
    }

    /// The count as the script's reply.
    pub(crate) fn to_reply(self) -> Reply {
        Reply {
            granted: self.processes,
            remaining: self.owing,
            retry_after_ms: super::ms(self.hold_ms),
            reset_after_ms: super::ms(self.epoch),
        }
    }
}

impl Roster {
    /// When the hold ends if nobody else reports (ms): its wait for the reports, then the terms of those owing.
    fn ends_ms(&self) -> u64 {
        (self.owing.values()).fold(self.hold_until_ms, |at, term| at.saturating_add(*term))
    }

    /// Whether a hold runs at `now_ms`.
    fn holding(&self, now_ms: u64) -> bool {
        !self.owing.is_empty() && self.ends_ms() > now_ms
    }

    /// What `member`, silent, adds to a hold that starts at `now_ms` if it never reports (ms): the time the
    /// rule's buckets take to refill its presumed sales alone. Its local share was `1 / count` of a full bucket
    /// and of the refill from when it was last heard (at most `max(cut_ms, live_ms) + silent_ms` before: a
    /// member silent longer most likely exited before the outage) to the end of the hold's wait; so its term is
    /// `(refill_ms + that time) / count`, rounded up. 0 when the rule presumes nothing.
    pub(crate) fn term(&self, member: &str, beat: &Beat, now_ms: u64) -> u64 {
        let Some(refill_ms) = beat.refill_ms else {
            return 0;
        };
        let heard = self.heard.get(member).copied().unwrap_or(now_ms);
        let bound = beat.cut_ms.max(beat.live_ms).saturating_add(beat.silent_ms);
        let alone = now_ms.saturating_sub(heard).min(bound).saturating_add(beat.hold_ms);
        let count = self.counts.get(member).copied().unwrap_or(1).max(1);
        refill_ms.saturating_add(alone).div_ceil(count)
    }

    /// Records `beat` at `now_ms` and answers the live count and the hold.
    pub(crate) fn beat(&mut self, beat: &Beat, now_ms: u64) -> Count {
        let forget_before = now_ms.saturating_sub(beat.keep_ms);
        // Members forgotten drop out of the count; a hold keeps their terms.
        let gone: Vec<String> = (self.heard.iter())
            .filter(|(_, at)| **at < forget_before)
            .map(|(m, _)| m.clone())
            .collect();
        for m in gone {
            self.heard.remove(&m);
            self.counts.remove(&m);
        }
        if beat.leave {
            self.heard.remove(&beat.member);
            self.counts.remove(&beat.member);
            self.owing.remove(&beat.member);
        }
        let silent_before = now_ms.saturating_sub(beat.silent_ms);
        // A member that joins a fleet whose every member is silent comes after an outage too (or after the whole
        // fleet left): it may be the first to call when the store is back, before any of them.
        let joins_silence = !beat.leave
            && !self.heard.contains_key(&beat.member)
            && !self.heard.is_empty()
            && self.heard.values().all(|at| *at < silent_before);
        if (beat.back || joins_silence) && !self.holding(now_ms) {
            // The first member back from an outage: every member silent as long as an outage (it may have sold
            // alone too) owes a report, this one until it has charged what it owes.
            let silent: Vec<String> = (self.heard.iter())
                .filter(|(m, at)| **at < silent_before && **m != beat.member)
                .map(|(m, _)| m.clone())
                .collect();
            let mut owing: BTreeMap<String, u64> = (silent.into_iter())
                .map(|m| {
                    let term = self.term(&m, beat, now_ms);
                    (m, term)
                })
                .collect();
            if !beat.settled {
                owing.insert(beat.member.clone(), self.term(&beat.member, beat, now_ms));
            }
            self.owing = owing;
            if !self.owing.is_empty() {
                self.hold_until_ms = now_ms.saturating_add(beat.hold_ms);
                self.epoch += 1;
            }
        }
        if beat.settled {
            self.owing.remove(&beat.member);
        }
        if !self.holding(now_ms) {
            // Everyone has reported, or the terms of those who did not have passed: the hold ends.
            self.owing.clear();
            self.hold_until_ms = self.hold_until_ms.min(now_ms);
        }
        let processes = if beat.leave {
            self.live(beat.live_ms, now_ms)
        } else {
            self.heard.insert(beat.member.clone(), now_ms);
            let processes = self.live(beat.live_ms, now_ms);
            self.counts.insert(beat.member.clone(), processes);
            processes
        };
        Count {
            processes,
            owing: self.owing.len() as u64,
            hold_ms: if self.owing.is_empty() {
                0
            } else {
                self.ends_ms().saturating_sub(now_ms)
            },
            epoch: self.epoch,
        }
    }

    /// Members heard within `live_ms` of `now_ms`.
    fn live(&self, live_ms: u64, now_ms: u64) -> u64 {
        (self.heard.values())
            .filter(|at| at.saturating_add(live_ms) > now_ms)
            .count() as u64
    }

    /// When the roster may be forgotten (ms): its last member is forgotten and no hold runs.
    pub(crate) fn expires_at_ms(&self, keep_ms: u64) -> u64 {
        let last = self.heard.values().max().copied().unwrap_or(0);
        last.saturating_add(keep_ms).max(self.ends_ms())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat(member: &str, back: bool, settled: bool) -> Beat {
        Beat {
            member: member.to_owned(),
            live_ms: 3_000,
            silent_ms: 1_500,
            keep_ms: 60_000,
            hold_ms: 2_000,
            back,
            settled,
            refill_ms: None,
            cut_ms: 0,
            leave: false,
        }
    }

    #[test]
    fn live_members_are_counted_and_the_silent_drop_out() {
        let mut roster = Roster::default();
        assert_eq!(roster.beat(&beat("a", false, true), 0).processes, 1);
        assert_eq!(roster.beat(&beat("b", false, true), 500).processes, 2);
        assert_eq!(roster.beat(&beat("c", false, true), 1_000).processes, 3);
        // `a` was last heard at 0: at 3 000 it is no longer live, but still remembered.
        assert_eq!(roster.beat(&beat("b", false, true), 3_000).processes, 2);
        assert!(roster.heard.contains_key("a"));
        // Unheard for keep_ms, it is forgotten.
        roster.beat(&beat("b", false, true), 61_000);
        assert!(!roster.heard.contains_key("a"));
    }

    #[test]
    fn the_first_member_back_holds_until_every_silent_member_has_reported() {
        let mut roster = Roster::default();
        for m in ["a", "b", "c"] {
            roster.beat(&beat(m, false, true), 0);
        }
        // An outage of 3 s: `a` is back first, owing what it sold alone.
        let first = roster.beat(&beat("a", true, false), 3_000);
        assert_eq!((first.owing, first.hold_ms, first.epoch), (3, 2_000, 1));
        // `b` is back and owed nothing; `a` has charged.
        assert_eq!(roster.beat(&beat("b", true, true), 3_100).owing, 2);
        assert_eq!(roster.beat(&beat("a", false, true), 3_200).owing, 1);
        // `c` reports: the hold ends at once.
        let last = roster.beat(&beat("c", true, true), 3_300);
        assert_eq!((last.owing, last.hold_ms, last.epoch), (0, 0, 1));
    }

    #[test]
    fn a_member_that_never_reports_holds_the_fleet_no_longer_than_the_hold() {
        let mut roster = Roster::default();
        for m in ["a", "b"] {
            roster.beat(&beat(m, false, true), 0);
        }
        assert_eq!(roster.beat(&beat("a", true, true), 5_000).hold_ms, 2_000);
        assert_eq!(roster.beat(&beat("a", false, true), 6_000).hold_ms, 1_000);
        let after = roster.beat(&beat("a", false, true), 7_000);
        assert_eq!((after.owing, after.hold_ms), (0, 0));
    }

    #[test]
    fn a_member_back_while_the_others_were_heard_holds_nobody() {
        let mut roster = Roster::default();
        roster.beat(&beat("a", false, true), 0);
        roster.beat(&beat("b", false, true), 1_000);
        // `a` alone was cut off (a slow link): `b` was heard within silent_ms and leased from the store itself.
        let back = roster.beat(&beat("a", true, true), 2_000);
        assert_eq!((back.owing, back.hold_ms, back.epoch), (0, 0, 0));
        // Owing itself, it holds only until it has charged.
        roster.beat(&beat("b", false, true), 2_000);
        let owing = roster.beat(&beat("a", true, false), 2_100);
        assert_eq!((owing.owing, owing.hold_ms), (1, 2_000));
        assert_eq!(roster.beat(&beat("a", false, true), 2_200).hold_ms, 0);
    }

    #[test]
    fn a_member_joining_a_silent_fleet_holds_it_as_one_back_would() {
        let mut roster = Roster::default();
        for m in ["a", "b"] {
            roster.beat(&beat(m, false, true), 0);
        }
        // After an outage, a process that just started is the first to beat: it owes nothing, the others might.
        let new = roster.beat(&beat("new", false, true), 3_000);
        assert_eq!((new.owing, new.hold_ms, new.epoch), (2, 2_000, 1));
        // Joining a fleet that beats on holds nobody.
        roster.beat(&beat("a", true, true), 3_100);
        roster.beat(&beat("b", true, true), 3_100);
        let other = roster.beat(&beat("other", false, true), 3_200);
        assert_eq!((other.owing, other.hold_ms, other.epoch), (0, 0, 1));
    }

    #[test]
    fn members_that_never_report_are_presumed_to_have_sold_their_shares() {
        let mut roster = Roster::default();
        for m in ["a", "b", "c", "d"] {
            roster.beat(&beat(m, false, true), 0);
        }
        for m in ["a", "b", "c", "d"] {
            assert_eq!(roster.beat(&beat(m, false, true), 1_000).processes, 4);
        }
        // An outage of 3 s on a rule whose buckets refill in 2 s: `a` is back first, owing. Each silent member
        // (and `a`, until it charges) may have sold a quarter of a full bucket and of 3 s + the 2 s wait of
        // refill: its term is (2 000 + 5 000) / 4 ms.
        let back = Beat {
            refill_ms: Some(2_000),
            cut_ms: 3_000,
            ..beat("a", true, false)
        };
        let first = roster.beat(&back, 4_000);
        assert_eq!(roster.owing.values().copied().collect::<Vec<_>>(), [1_750; 4]);
        assert_eq!((first.owing, first.hold_ms, first.epoch), (4, 2_000 + 4 * 1_750, 1));
        // Reports shorten the hold by their terms.
        assert_eq!(roster.beat(&beat("a", false, true), 4_100).hold_ms, 7_150);
        roster.beat(&beat("b", true, true), 4_200);
        assert_eq!(roster.beat(&beat("c", true, true), 4_200).hold_ms, 3_550);
        // `d` exited: the hold lasts its term past the wait, then ends.
        let still = roster.beat(&beat("a", false, true), 7_749);
        assert_eq!((still.owing, still.hold_ms), (1, 1));
        let over = roster.beat(&beat("a", false, true), 7_750);
        assert_eq!((over.owing, over.hold_ms), (0, 0));
    }

    #[test]
    fn a_member_silent_long_before_the_outage_is_presumed_for_the_outage_only() {
        let mut roster = Roster::default();
        roster.beat(&beat("a", false, true), 0);
        roster.beat(&beat("old", false, true), 0);
        roster.beat(&beat("a", false, true), 30_000);
        // `old` was last heard 31 s ago and counted 2: it may have sold alone through the 1 s outage, not 31 s.
        let back = Beat {
            refill_ms: Some(1_000),
            cut_ms: 1_000,
            ..beat("a", true, true)
        };
        let first = roster.beat(&back, 31_000);
        // (1 000 + min(31 000, max(1 000, 3 000) + 1 500) + 2 000) / 2, rounded up.
        assert_eq!((first.owing, first.hold_ms), (1, 2_000 + 3_750));
    }

    #[test]
    fn a_member_that_leaves_is_neither_counted_nor_waited_for() {
        let mut roster = Roster::default();
        for m in ["a", "b", "c"] {
            roster.beat(&beat(m, false, true), 0);
        }
        let leave = Beat {
            leave: true,
            ..beat("c", false, true)
        };
        assert_eq!(roster.beat(&leave, 500).processes, 2);
        assert!(!roster.heard.contains_key("c") && !roster.counts.contains_key("c"));
        // An outage: `a` is back first; only `b` may have sold alone.
        let back = Beat {
            refill_ms: Some(1_000),
            ..beat("a", true, true)
        };
        assert_eq!(roster.beat(&back, 4_000).owing, 1);
    }

    #[test]
    fn a_count_goes_through_the_protocols_four_integers_unchanged() {
        let count = Count {
            processes: 7,
            owing: 2,
            hold_ms: 1_234,
            epoch: 9,
        };
        assert_eq!(Count::from_reply(&count.to_reply()), count);
    }
}
