//! The fleet's roster of one rule, kept in the store (`lua/fleet.lua` mirrors this line for line): which
//! processes are live, the hold after an outage, and what it presumed of the members that never reported
//! (invariants 17 and 19 of docs/ARCHITECTURE.md).
//!
//! Every process that uses a leased or `local` rule sends a *beat* for it about once a second. The roster
//! remembers when it last heard each member, and the count it answered it:
//! - the **live count** is the members heard within `live_ms`: every share of the rule (the lease's fair share,
//!   the first turn, the `local` share) divides by it, so the fleet is counted, not guessed;
//! - a member that comes **back** from a store outage (its calls failed since its last beat), or that joins a
//!   fleet whose every member is silent, starts a **hold** if none runs: every member that was silent for
//!   `silent_ms` (it may have sold alone as well) now *owes* a report, and until each has reported (`settled`:
//!   it charged everything it admitted alone) or `hold_ms` has passed, no process calls the rule's keys. So a
//!   process that owed nothing, or that just started, does not sell the stock again before the fleet's debts are
//!   charged;
//! - a member that has not reported by the hold's end may have exited, its debt with it: it is **presumed** to
//!   have sold its whole local share (its `1 / count` of a full bucket and of the refill while it was silent and
//!   through the hold). The *terms* of those still owing ([`Roster::term`], ms of refill) add up to the hold's
//!   [`Presumption`], which every process charges to each key of the rule before the key's next store call
//!   (`fallback/presumed_mode.rs`): a debit of the token bucket, once per key, or a wait of a leaky queue. Waiting
//!   alone would not do: the refill of a bucket below its cap is banked during the wait and sold after it.
//!
//! A member unheard for `keep_ms` is forgotten (it exited); one that shut down owing nothing leaves at once.

use std::collections::BTreeMap;

use super::Reply;

/// How many `keep_ms` the roster outlives the last beat it heard (an hour at the shipped 60 s): an outage that
/// long still finds who was there when it began (`lua/fleet.lua` has the same 60).
pub(crate) const ROSTER_KEEPS: u64 = 60;

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
    /// How long the slowest key this member decided takes to refill from empty (ms). The roster keeps the
    /// longest any member sent: a presumed term is that, with the time the member was silent, divided by its
    /// count. `None`: the rule's sales alone are not presumed (a window rule, whose limit is per window, or a
    /// bucket that never refills, which sells nothing alone).
    pub refill_ms: Option<u64>,
    /// Back: how long this member's calls had failed (ms), which bounds how long the silent members may have
    /// sold alone (at least `live_ms`: a member joining a silent fleet cannot know); 0 otherwise.
    pub cut_ms: u64,
    /// The member leaves the fleet: it shut down owing nothing.
    pub leave: bool,
}

/// What a hold presumed of the members that never reported: the sum of their terms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Presumption {
    /// The epoch of the hold that made it (the ms it started): it names the presumption, so that each key is
    /// charged it once (the debit's mark). 0: none.
    pub epoch: u64,
    /// What the presumed members may have sold alone, in ms of refill: a token bucket is charged `ms × rate`
    /// tokens, a leaky queue waits `ms`.
    pub ms: u64,
    /// When it was made (the hold's end, ms).
    pub at_ms: u64,
}

impl Presumption {
    /// Until when it matters to a bucket that refills from empty in `refill_ms` (ms): two refills (from
    /// −capacity) and its own ms after `at_ms`; a bucket untouched that long is full with it or without it.
    pub(crate) fn kept_until(&self, refill_ms: u64) -> u64 {
        (self.at_ms)
            .saturating_add(refill_ms.saturating_mul(2))
            .saturating_add(self.ms)
    }

    /// Whether the roster still keeps it at `now_ms`, the longest refill of the rule being `refill_ms`.
    fn kept(&self, refill_ms: Option<u64>, now_ms: u64) -> bool {
        self.ms > 0 && now_ms < self.kept_until(refill_ms.unwrap_or(0))
    }
}

/// The roster of one rule: when each member was last heard (ms) and the count it was answered, the hold, who
/// owes a report, and the last presumption.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Roster {
    pub heard: BTreeMap<String, u64>,
    /// The live count each member was last answered: the divisor of its shares.
    pub counts: BTreeMap<String, u64>,
    /// The last hold's epoch: the ms it started (one more than the previous epoch if that is later).
    pub epoch: u64,
    /// The hold waits for the reports until this (ms).
    pub hold_until_ms: u64,
    /// The longest refill from empty any member sent (ms); `None` before one did.
    pub refill_ms: Option<u64>,
    /// Members whose report the hold waits for, each with its term: the ms of refill it is presumed to have sold
    /// if it never reports.
    pub owing: BTreeMap<String, u64>,
    /// The last presumption, while kept.
    pub presumed: Presumption,
}

/// What a beat answers, in the protocol's four integers: `{ processes, hold_ms, presumed_epoch, presumed_ms }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Count {
    /// Live members, this one included (at least 1).
    pub processes: u64,
    /// How long the hold still waits for the reports from now (ms), 0 when none runs.
    pub hold_ms: u64,
    /// The last presumption kept (its `at_ms` is not sent: 0).
    pub presumed: Presumption,
}

impl Count {
    /// The script's reply as a count.
    pub(crate) fn from_reply(reply: &Reply) -> Self {
        Self {
            processes: reply.granted.max(1),
            hold_ms: reply.remaining,
            presumed: Presumption {
                epoch: u64::try_from(reply.retry_after_ms).unwrap_or(0),
                ms: u64::try_from(reply.reset_after_ms).unwrap_or(0),
                at_ms: 0,
            },
        }
    }

    /// The count as the script's reply.
    pub(crate) fn to_reply(self) -> Reply {
        Reply {
            granted: self.processes,
            remaining: self.hold_ms,
            retry_after_ms: super::ms(self.presumed.epoch),
            reset_after_ms: super::ms(self.presumed.ms),
            stamp: 0,
        }
    }
}

impl Roster {
    /// Whether a hold waits for reports at `now_ms`.
    fn holding(&self, now_ms: u64) -> bool {
        !self.owing.is_empty() && self.hold_until_ms > now_ms
    }

    /// Ends a hold whose wait has passed at `now_ms`: the terms of those still owing become the presumption (with
    /// the one before it, while that is kept).
    fn close(&mut self, now_ms: u64) {
        if self.owing.is_empty() || self.hold_until_ms > now_ms {
            return;
        }
        let mut sum: u64 = self.owing.values().sum();
        self.owing.clear();
        if sum > 0 {
            if self.presumed.kept(self.refill_ms, now_ms) {
                sum = sum.saturating_add(self.presumed.ms);
            }
            self.presumed = Presumption {
                epoch: self.epoch,
                ms: sum,
                at_ms: self.hold_until_ms,
            };
        }
    }

    /// When anyone was last heard, at most `now_ms` (`now_ms` when nobody is on the roster): after an outage,
    /// about when it began.
    fn last_heard(&self, now_ms: u64) -> u64 {
        self.heard.values().max().copied().unwrap_or(now_ms).min(now_ms)
    }

    /// What `member`, silent, is presumed to have sold alone if it never reports to a hold that starts at
    /// `now_ms`, in ms of refill: its local share was `1 / count` of a full bucket (the roster's longest refill)
    /// and of the refill from when it was last heard (at most `max(cut_ms, live_ms, the silence of the whole
    /// roster) + silent_ms` before: a member silent longer most likely exited before the outage) to the end of
    /// the hold's wait; so its term is `(refill + that time) / count`, rounded up. 0 when the beat presumes
    /// nothing. Called before the beat is recorded.
    pub(crate) fn term(&self, member: &str, beat: &Beat, now_ms: u64) -> u64 {
        let (Some(_), Some(refill_ms)) = (beat.refill_ms, self.refill_ms) else {
            return 0;
        };
        let heard = self.heard.get(member).copied().unwrap_or(now_ms);
        let outage = now_ms.saturating_sub(self.last_heard(now_ms));
        let bound = (beat.cut_ms.max(beat.live_ms).max(outage)).saturating_add(beat.silent_ms);
        let alone = now_ms.saturating_sub(heard).min(bound).saturating_add(beat.hold_ms);
        let count = self.counts.get(member).copied().unwrap_or(1).max(1);
        refill_ms.saturating_add(alone).div_ceil(count)
    }

    /// Records `beat` at `now_ms` and answers the live count, the hold and the presumption.
    pub(crate) fn beat(&mut self, beat: &Beat, now_ms: u64) -> Count {
        // Members unheard for keep_ms before anyone was last heard are forgotten (a hold keeps their terms): after
        // an outage, those that were there when it began are kept for the hold that presumes them.
        let forget_before = self.last_heard(now_ms).saturating_sub(beat.keep_ms);
        let gone: Vec<String> = (self.heard.iter())
            .filter(|(_, at)| **at < forget_before)
            .map(|(m, _)| m.clone())
            .collect();
        for m in gone {
            self.heard.remove(&m);
            self.counts.remove(&m);
        }
        self.refill_ms = self.refill_ms.max(beat.refill_ms);
        if !self.presumed.kept(self.refill_ms, now_ms) {
            self.presumed = Presumption::default();
        }
        self.close(now_ms);
        if beat.leave {
            self.heard.remove(&beat.member);
            self.counts.remove(&beat.member);
            self.owing.remove(&beat.member);
        }
        let silent_before = now_ms.saturating_sub(beat.silent_ms);
        // A member that joins a fleet whose every member is silent comes after an outage too (or after the whole
        // fleet left): it may be the first to call when the store is back, before any of them.
        // Not after keep_ms of silence: a newcomer cannot tell an outage from a fleet that stopped (crashed, say)
        // and starts cold, as it would on an empty roster; a member back from an outage knows, and holds.
        let joins_silence = !beat.leave
            && !self.heard.contains_key(&beat.member)
            && !self.heard.is_empty()
            && self.heard.values().all(|at| *at < silent_before)
            && now_ms.saturating_sub(self.last_heard(now_ms)) < beat.keep_ms;
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
                self.epoch = if now_ms > self.epoch { now_ms } else { self.epoch + 1 };
            }
        }
        if beat.settled {
            self.owing.remove(&beat.member);
        }
        // Everyone has reported: the hold ends at once, presuming nobody.
        if self.owing.is_empty() {
            self.hold_until_ms = self.hold_until_ms.min(now_ms);
        }
        self.close(now_ms);
        // The count kept for a member's presumed term is the live one, the smaller: should this answer be lost,
        // the member divides by its own earlier count, and a term over the smaller count charges more than it
        // sold, never less.
        let processes = if beat.leave {
            self.counted(beat.live_ms, now_ms)
        } else {
            self.heard.insert(beat.member.clone(), now_ms);
            self.counts.insert(beat.member.clone(), self.live(beat.live_ms, now_ms));
            self.counted(beat.live_ms, now_ms)
        };
        Count {
            processes,
            hold_ms: if self.holding(now_ms) {
                self.hold_until_ms - now_ms
            } else {
                0
            },
            presumed: Presumption {
                at_ms: 0,
                ..self.presumed
            },
        }
    }

    /// Whether `member` was heard within `live_ms` of `now_ms`.
    fn is_live(&self, member: &str, live_ms: u64, now_ms: u64) -> bool {
        (self.heard.get(member)).is_some_and(|at| at.saturating_add(live_ms) > now_ms)
    }

    /// Members heard within `live_ms` of `now_ms`.
    fn live(&self, live_ms: u64, now_ms: u64) -> u64 {
        (self.heard.keys()).filter(|m| self.is_live(m, live_ms, now_ms)).count() as u64
    }

    /// The count a beat answers: the live members, and while a hold waits those owing it a report that are not
    /// live (a newcomer first after an outage divides its shares by them too: they may still be there, cut off).
    fn counted(&self, live_ms: u64, now_ms: u64) -> u64 {
        let owing = if self.holding(now_ms) {
            (self.owing.keys())
                .filter(|m| !self.is_live(m, live_ms, now_ms))
                .count() as u64
        } else {
            0
        };
        self.live(live_ms, now_ms) + owing
    }

    /// When the roster may be forgotten (ms): [`ROSTER_KEEPS`] × `keep_ms` after anyone was last heard (an
    /// outage that long still finds who was there when it began), no hold waits and no presumption is kept.
    pub(crate) fn expires_at_ms(&self, keep_ms: u64) -> u64 {
        let last = self.heard.values().max().copied().unwrap_or(0);
        let keep_ms = keep_ms.saturating_mul(ROSTER_KEEPS);
        let presumed = if self.presumed.ms > 0 {
            self.presumed.kept_until(self.refill_ms.unwrap_or(0))
        } else {
            0
        };
        last.saturating_add(keep_ms).max(self.hold_until_ms).max(presumed)
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
        // Unheard for keep_ms before anyone was last heard, it is forgotten: not while the whole roster was silent
        // (it was there when the silence began), at the next beat after.
        roster.beat(&beat("b", false, true), 61_000);
        assert!(roster.heard.contains_key("a"));
        roster.beat(&beat("b", false, true), 61_001);
        assert!(!roster.heard.contains_key("a"));
    }

    #[test]
    fn the_first_member_back_holds_until_every_silent_member_has_reported() {
        let mut roster = Roster::default();
        for m in ["a", "b", "c"] {
            roster.beat(&beat(m, false, true), 0);
        }
        // An outage of 3 s: `a` is back first, owing what it sold alone. The hold is named by its start.
        let first = roster.beat(&beat("a", true, false), 3_000);
        assert_eq!((roster.owing.len(), first.hold_ms, roster.epoch), (3, 2_000, 3_000));
        // `b` is back and owed nothing; `a` has charged.
        roster.beat(&beat("b", true, true), 3_100);
        assert_eq!(roster.owing.len(), 2);
        assert_eq!(roster.beat(&beat("a", false, true), 3_200).hold_ms, 1_800);
        assert_eq!(roster.owing.len(), 1);
        // `c` reports: the hold ends at once, presuming nobody.
        let last = roster.beat(&beat("c", true, true), 3_300);
        assert_eq!((last.hold_ms, last.presumed), (0, Presumption::default()));
        assert!(roster.owing.is_empty());
    }

    #[test]
    fn a_member_that_never_reports_holds_the_fleet_no_longer_than_the_hold() {
        let mut roster = Roster::default();
        for m in ["a", "b"] {
            roster.beat(&beat(m, false, true), 0);
        }
        assert_eq!(roster.beat(&beat("a", true, true), 5_000).hold_ms, 2_000);
        assert_eq!(roster.beat(&beat("a", false, true), 6_000).hold_ms, 1_000);
        // A window rule presumes nothing (no refill): the hold just ends.
        let after = roster.beat(&beat("a", false, true), 7_000);
        assert_eq!((after.hold_ms, after.presumed), (0, Presumption::default()));
        assert!(roster.owing.is_empty());
    }

    #[test]
    fn a_member_back_while_the_others_were_heard_holds_nobody() {
        let mut roster = Roster::default();
        roster.beat(&beat("a", false, true), 0);
        roster.beat(&beat("b", false, true), 1_000);
        // `a` alone was cut off (a slow link): `b` was heard within silent_ms and leased from the store itself.
        let back = roster.beat(&beat("a", true, true), 2_000);
        assert_eq!((back.hold_ms, roster.epoch), (0, 0));
        // Owing itself, it holds only until it has charged.
        roster.beat(&beat("b", false, true), 2_000);
        let owing = roster.beat(&beat("a", true, false), 2_100);
        assert_eq!((roster.owing.len(), owing.hold_ms), (1, 2_000));
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
        assert_eq!((roster.owing.len(), new.hold_ms, roster.epoch), (2, 2_000, 3_000));
        // Joining a fleet that beats on holds nobody.
        roster.beat(&beat("a", true, true), 3_100);
        roster.beat(&beat("b", true, true), 3_100);
        let other = roster.beat(&beat("other", false, true), 3_200);
        assert_eq!((other.hold_ms, roster.epoch), (0, 3_000));
    }

    /// `beat` on a rule whose slowest key refills in `refill_ms`, back after `cut_ms` cut off.
    fn presuming(member: &str, (back, settled): (bool, bool), refill_ms: u64, cut_ms: u64) -> Beat {
        Beat {
            refill_ms: Some(refill_ms),
            cut_ms,
            ..beat(member, back, settled)
        }
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
        let first = roster.beat(&presuming("a", (true, false), 2_000, 3_000), 4_000);
        assert_eq!(roster.owing.values().copied().collect::<Vec<_>>(), [1_750; 4]);
        assert_eq!(first.hold_ms, 2_000, "the hold waits hold_ms, whoever owes");
        roster.beat(&beat("a", false, true), 4_100);
        roster.beat(&beat("b", true, true), 4_200);
        roster.beat(&beat("c", true, true), 4_200);
        // `d` exited: at the hold's end its term is presumed, named by the hold's epoch.
        let still = roster.beat(&beat("a", false, true), 5_999);
        assert_eq!((still.hold_ms, still.presumed), (1, Presumption::default()));
        let over = roster.beat(&beat("a", false, true), 6_000);
        let presumed = Presumption {
            epoch: 4_000,
            ms: 1_750,
            at_ms: 0,
        };
        assert_eq!((over.hold_ms, over.presumed), (0, presumed));
        // Every later beat answers it, a process that joins too, until two refills and its ms have passed.
        assert_eq!(roster.beat(&beat("new", false, true), 6_500).presumed, presumed);
        assert_eq!(
            roster.beat(&beat("a", false, true), 6_000 + 4_000 + 1_749).presumed,
            presumed
        );
        let forgotten = roster.beat(&beat("a", false, true), 6_000 + 4_000 + 1_750);
        assert_eq!(forgotten.presumed, Presumption::default());
    }

    #[test]
    fn a_presumption_made_while_one_is_kept_adds_to_it() {
        let mut roster = Roster::default();
        for m in ["a", "b", "c"] {
            roster.beat(&presuming(m, (false, true), 10_000, 0), 0);
        }
        // Two outages 10 s apart; `c` exited in the first, `b` in the second. The second presumption carries the
        // first, so a key nobody touched in between is charged both once.
        roster.beat(&presuming("a", (true, true), 10_000, 2_000), 2_000);
        roster.beat(&beat("b", true, true), 2_500);
        let first = roster.beat(&beat("a", false, true), 4_000).presumed;
        assert_eq!(
            (first.epoch, first.ms),
            (2_000, (10_000 + 2_000 + 2_000_u64).div_ceil(3))
        );
        roster.beat(&presuming("a", (false, true), 10_000, 0), 10_000);
        roster.beat(&presuming("a", (true, true), 10_000, 3_000), 14_000);
        let second = roster.beat(&beat("a", false, true), 16_000).presumed;
        // `b` (last heard at 2.5 s) and `c` (at 0, still on the roster until keep_ms) are presumed for at most
        // max(cut, live, the 4 s nobody was heard) + silent of silence, each counted 3.
        let term = (10_000 + 5_500 + 2_000_u64).div_ceil(3);
        assert_eq!((second.epoch, second.ms), (14_000, 2 * term + first.ms));
    }

    #[test]
    fn an_outage_longer_than_keep_ms_still_presumes_who_was_there_when_it_began() {
        let three = || {
            let mut roster = Roster::default();
            for m in ["a", "b", "c"] {
                roster.beat(&presuming(m, (false, true), 10_000, 0), 0);
            }
            roster
        };
        // Ten minutes without a beat reaching the store, far past keep_ms: b and c exited during it. a, back,
        // holds for them, each presumed to have sold alone through the whole outage and the hold, over its count.
        let mut roster = three();
        let back = roster.beat(&presuming("a", (true, true), 10_000, 600_000), 600_000);
        assert_eq!(back.hold_ms, 2_000);
        assert_eq!(roster.owing.keys().map(String::as_str).collect::<Vec<_>>(), ["b", "c"]);
        assert_eq!(roster.owing["c"], (10_000 + 600_000 + 2_000_u64).div_ceil(3));
        // A newcomer first after that long cannot tell it from a fleet that stopped: it starts cold.
        let mut roster = three();
        let new = roster.beat(&presuming("new", (false, true), 10_000, 0), 600_000);
        assert_eq!((new.hold_ms, roster.owing.len()), (0, 0));
        // Within keep_ms it holds, presuming the 30 s nobody was heard (not only live + silent: 4.5 s).
        let mut roster = three();
        assert_eq!(
            roster.beat(&presuming("new", (false, true), 10_000, 0), 30_000).hold_ms,
            2_000
        );
        assert_eq!(roster.owing["c"], (10_000 + 30_000 + 2_000_u64).div_ceil(3));
    }

    #[test]
    fn a_member_silent_long_before_the_outage_is_presumed_for_the_outage_only() {
        let mut roster = Roster::default();
        roster.beat(&beat("a", false, true), 0);
        roster.beat(&beat("old", false, true), 0);
        roster.beat(&beat("a", false, true), 30_000);
        // `old` was last heard 31 s ago and counted 2: it may have sold alone through the 1 s outage, not 31 s.
        let first = roster.beat(&presuming("a", (true, true), 1_000, 1_000), 31_000);
        // (1 000 + min(31 000, max(1 000, 3 000) + 1 500) + 2 000) / 2, rounded up.
        assert_eq!(first.hold_ms, 2_000);
        assert_eq!(roster.owing.get("old"), Some(&3_750));
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
        roster.beat(&presuming("a", (true, true), 1_000, 0), 4_000);
        assert_eq!(roster.owing.keys().collect::<Vec<_>>(), ["b"]);
    }

    #[test]
    fn a_count_goes_through_the_protocols_four_integers_unchanged() {
        let count = Count {
            processes: 7,
            hold_ms: 1_234,
            presumed: Presumption {
                epoch: 1_700_000_000_000,
                ms: 9,
                at_ms: 0,
            },
        };
        assert_eq!(Count::from_reply(&count.to_reply()), count);
    }
}
