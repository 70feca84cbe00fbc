//! The fleet's roster of one rule, kept in the store (`lua/fleet.lua` mirrors this line for line): which
//! processes are live, and the hold after an outage (invariants 17 and 19 of docs/ARCHITECTURE.md).
//!
//! Every process that uses a leased or `local` rule sends a *beat* for it about once a second. The roster
//! remembers when it last heard each member:
//! - the **live count** is the members heard within `live_ms`: every share of the rule (the lease's fair share,
//!   the first turn, the `local` share) divides by it, so the fleet is counted, not guessed;
//! - a member that comes **back** from a store outage (its calls failed since its last beat), or that joins a
//!   fleet whose every member is silent, starts a **hold** if none runs: every member that was silent for `silent_ms` (it may have sold alone as well) now *owes* a
//!   report, and until each has reported (`settled`: it charged everything it admitted alone), or `hold_ms`
//!   has passed, no process leases or calls the rule's keys. So a process that owed nothing, or that just
//!   started, does not sell the stock again before the fleet's debts are charged.
//!
//! A member unheard for `keep_ms` is forgotten (it exited).

use std::collections::{BTreeMap, BTreeSet};

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
    /// The longest a hold lasts.
    pub hold_ms: u64,
    /// The member's store calls failed since its last beat: it comes back from an outage.
    pub back: bool,
    /// The member owes nothing of the rule (everything it admitted alone is charged).
    pub settled: bool,
}

/// The roster of one rule: when each member was last heard (ms), the hold, and who owes a report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Roster {
    pub heard: BTreeMap<String, u64>,
    /// No lease or call of the rule's keys before this (ms); past it, or with nobody owing, no hold.
    pub hold_until_ms: u64,
    /// Counts the holds started: a process tells a new hold from one it saw.
    pub epoch: u64,
    /// Members whose report the hold waits for.
    pub owing: BTreeSet<String>,
}

/// What a beat answers, in the protocol's four integers: `{ processes, owing, hold_ms, epoch }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Count {
    /// Live members, this one included (at least 1).
    pub processes: u64,
    /// Members the hold still waits for.
    pub owing: u64,
    /// How long the hold lasts from now (ms), 0 when none.
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
    /// Records `beat` at `now_ms` and answers the live count and the hold.
    pub(crate) fn beat(&mut self, beat: &Beat, now_ms: u64) -> Count {
        let forget_before = now_ms.saturating_sub(beat.keep_ms);
        self.heard.retain(|_, at| *at >= forget_before);
        let heard = &self.heard;
        self.owing.retain(|m| heard.contains_key(m));
        let silent_before = now_ms.saturating_sub(beat.silent_ms);
        // A member that joins a fleet whose every member is silent comes after an outage too (or after the whole
        // fleet left): it may be the first to call when the store is back, before any of them.
        let joins_silence = !self.heard.contains_key(&beat.member)
            && !self.heard.is_empty()
            && self.heard.values().all(|at| *at < silent_before);
        if (beat.back || joins_silence) && self.hold_until_ms <= now_ms {
            // The first member back from an outage: every member silent as long as an outage (it may have sold
            // alone too) owes a report, this one until it has charged what it owes.
            self.owing = (self.heard.iter())
                .filter(|(m, at)| **at < silent_before && **m != beat.member)
                .map(|(m, _)| m.clone())
                .collect();
            if !beat.settled {
                self.owing.insert(beat.member.clone());
            }
            if !self.owing.is_empty() {
                self.hold_until_ms = now_ms.saturating_add(beat.hold_ms);
                self.epoch += 1;
            }
        }
        if beat.settled {
            self.owing.remove(&beat.member);
        }
        if self.hold_until_ms > now_ms && self.owing.is_empty() {
            // Everyone has reported: the hold ends now.
            self.hold_until_ms = now_ms;
        }
        if self.hold_until_ms <= now_ms {
            self.owing.clear();
        }
        self.heard.insert(beat.member.clone(), now_ms);
        Count {
            processes: (self.heard.values())
                .filter(|at| at.saturating_add(beat.live_ms) > now_ms)
                .count() as u64,
            owing: self.owing.len() as u64,
            hold_ms: self.hold_until_ms.saturating_sub(now_ms),
            epoch: self.epoch,
        }
    }

    /// When the roster may be forgotten (ms): its last member is forgotten and no hold runs.
    pub(crate) fn expires_at_ms(&self, keep_ms: u64) -> u64 {
        let last = self.heard.values().max().copied().unwrap_or(0);
        last.saturating_add(keep_ms).max(self.hold_until_ms)
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
