//! The fleet's roster of one rule, kept in the store (`lua/fleet.lua` mirrors this line for line): which
//! processes are live (invariant 17 of docs/ARCHITECTURE.md).
//!
//! Every process that leases for a rule sends a *beat* for it about once a second. The roster remembers when it
//! last heard each member; the **live count** is the members heard within `live_ms`, and a hot key's fair share of
//! the burst divides by it, so the fleet is counted, not guessed. A member unheard for `keep_ms` is forgotten (it
//! exited); one that shuts down leaves at once. (Until 2026-11-28 the roster also held the fleet after an outage
//! and presumed what silent members had sold alone: nothing is sold alone any more.)

use std::collections::BTreeMap;

use super::Reply;

/// One member's beat, with the roster's timings (all in ms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Beat {
    /// The member: unique to a limiter for the life of its process.
    pub member: String,
    /// A member heard within this is live (about three beats).
    pub live_ms: u64,
    /// A member unheard for this long is forgotten.
    pub keep_ms: u64,
    /// The member leaves the fleet: it shut down.
    pub leave: bool,
}

/// The roster of one rule: when each member was last heard (ms).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Roster {
    pub heard: BTreeMap<String, u64>,
}

/// What a beat answers: the live members, this one included (at least 1), and the store's time when it ran (ms).
/// In the protocol's four integers, `{ processes, now_ms, 0, 0 }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Count {
    pub processes: u64,
    pub now_ms: u64,
}

impl Count {
    /// The script's reply as a count.
    pub(crate) fn from_reply(reply: &Reply) -> Self {
        Self {
            processes: reply.granted.max(1),
            now_ms: reply.remaining,
        }
    }

    /// The count as the script's reply.
    pub(crate) fn to_reply(self) -> Reply {
        Reply {
            granted: self.processes,
            remaining: self.now_ms,
            retry_after_ms: 0,
            reset_after_ms: 0,
            stamp: 0,
            held: 0,
        }
    }
}

impl Roster {
    /// `beat` at `now_ms`: forgets the members unheard for `keep_ms`, records (or removes, when it leaves) this
    /// one, and answers the members heard within `live_ms`.
    pub(crate) fn beat(&mut self, beat: &Beat, now_ms: u64) -> Count {
        self.heard.retain(|_, at| at.saturating_add(beat.keep_ms) >= now_ms);
        if beat.leave {
            self.heard.remove(&beat.member);
        } else {
            self.heard.insert(beat.member.clone(), now_ms);
        }
        let live = (self.heard.values())
            .filter(|at| at.saturating_add(beat.live_ms) > now_ms)
            .count() as u64;
        Count {
            processes: live,
            now_ms,
        }
    }

    /// When the roster may be forgotten (ms): `keep_ms` after anyone was last heard.
    pub(crate) fn expires_at_ms(&self, keep_ms: u64) -> u64 {
        let last = self.heard.values().max().copied().unwrap_or(0);
        last.saturating_add(keep_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat(member: &str) -> Beat {
        Beat {
            member: member.to_owned(),
            live_ms: 3_000,
            keep_ms: 60_000,
            leave: false,
        }
    }

    #[test]
    fn live_members_are_counted_and_the_silent_drop_out() {
        let mut roster = Roster::default();
        assert_eq!(roster.beat(&beat("a"), 0).processes, 1);
        assert_eq!(roster.beat(&beat("b"), 500).processes, 2);
        assert_eq!(roster.beat(&beat("c"), 1_000).processes, 3);
        // `a` was last heard at 0: at 3 000 it is no longer live, but still remembered.
        assert_eq!(roster.beat(&beat("b"), 3_000).processes, 2);
        assert!(roster.heard.contains_key("a"));
        // Unheard for keep_ms, it is forgotten.
        assert_eq!(roster.beat(&beat("b"), 60_001).processes, 1);
        assert!(!roster.heard.contains_key("a"));
        assert_eq!(roster.expires_at_ms(60_000), 120_001);
    }

    #[test]
    fn a_member_that_leaves_is_counted_out_at_once() {
        let mut roster = Roster::default();
        roster.beat(&beat("a"), 0);
        roster.beat(&beat("b"), 0);
        let leaving = Beat {
            leave: true,
            ..beat("a")
        };
        assert_eq!(roster.beat(&leaving, 10).processes, 1);
        assert_eq!(roster.beat(&beat("b"), 20).processes, 1);
    }
}
