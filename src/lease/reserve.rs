//! A hot key's *reserve* in one process, `fail_mode = "local"`'s: tokens the shared bucket holds in escrow for
//! this process ([`crate::algorithm::hold`]), renewed by each lease while the store answers, and sold, paced,
//! while it fails. Nothing sold from it is owed: the store took it out of the bucket before the fault, and
//! counts it until the hold ends, which the process never outlives (it counts the end from when it sent the call
//! that set it, never later than the store does).

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::algorithm::HoldAsk;

/// A key's reserve, locked (a poisoned lock is still consistent: each step leaves it whole).
pub(crate) fn locked(reserve: &Mutex<Reserve>) -> MutexGuard<'_, Reserve> {
    reserve.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A key's reserve in this process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Reserve {
    /// Nothing held: none asked yet, the store had none to give, or the hold ended.
    #[default]
    Empty,
    /// `tokens` held, spendable until `until_ns` on this process's clock. They are released for spending
    /// linearly from `since_ns` (when the reply that set them came): `full` over the reserve's length, so that
    /// they last an outage that long, at the rate this process's share sold.
    Held {
        tokens: u64,
        full: u64,
        since_ns: u64,
        until_ns: u64,
    },
}

/// A lease's ask to hold, in flight: what the key held when it was sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Asked {
    pub(crate) ask: HoldAsk,
    sent_tokens: u64,
    until_ns: u64,
}

impl Reserve {
    /// Tokens held at `now_ns`: none once the hold ended.
    pub(crate) fn tokens(&self, now_ns: u64) -> u64 {
        match *self {
            Self::Held { tokens, until_ns, .. } if now_ns < until_ns => tokens,
            _ => 0,
        }
    }

    /// The ask of a lease sent at `sent_ns` by `holder` (its call number `seq`) to hold `want` tokens for
    /// `hold_ns`. Until its reply the key spends at most `want` of what it holds, and no later than the hold
    /// the call asks for ends: if the reply is lost, the store may have recorded no more than that. The pace of
    /// its release stays (a lease tried during an outage does not release more).
    pub(crate) fn ask(&mut self, (holder, seq): (&str, u64), want: u64, hold_ns: u64, sent_ns: u64) -> Asked {
        let until_ns = sent_ns.saturating_add(hold_ns);
        let held = self.tokens(sent_ns).min(want);
        *self = match *self {
            Self::Held {
                full,
                since_ns,
                until_ns: was,
                ..
            } if held > 0 => Self::Held {
                tokens: held,
                full,
                since_ns,
                until_ns: was.min(until_ns),
            },
            _ => Self::Empty,
        };
        Asked {
            ask: HoldAsk {
                holder: holder.to_owned(),
                seq,
                held,
                want,
                hold_ms: hold_ns.div_ceil(1_000_000),
            },
            sent_tokens: held,
            until_ns,
        }
    }

    /// The reply to `asked` came at `now_ns`: the store holds `held` tokens for this process until at least the
    /// ask's end. What the key spent from its reserve since the ask was sent comes off.
    pub(crate) fn answered(&mut self, asked: &Asked, held: u64, now_ns: u64) {
        let spent = asked.sent_tokens.saturating_sub(self.tokens(now_ns));
        let tokens = held.saturating_sub(spent);
        // The store counts the hold's whole milliseconds from when it ran the call: never earlier than this.
        let until_ns = asked.until_ns;
        *self = if tokens == 0 || now_ns >= until_ns {
            Self::Empty
        } else {
            Self::Held {
                tokens,
                full: tokens,
                since_ns: now_ns,
                until_ns,
            }
        };
    }

    /// Draws `cost` tokens at `now_ns` (a time confirmed for spending) when the reserve has released them:
    /// `full × elapsed / reserve_ns` since the reply that set it, less what was drawn since. Returns whether it did.
    pub(crate) fn draw(&mut self, cost: u64, reserve_ns: u64, now_ns: u64) -> bool {
        let Self::Held {
            tokens,
            full,
            since_ns,
            until_ns,
        } = self
        else {
            return false;
        };
        if now_ns >= *until_ns {
            *self = Self::Empty;
            return false;
        }
        let elapsed = u128::from(now_ns.saturating_sub(*since_ns));
        let released = (u128::from(*full) * elapsed / u128::from(reserve_ns.max(1))).min(u128::from(*full));
        let drawn = u128::from(full.saturating_sub(*tokens));
        if released < drawn + u128::from(cost) || *tokens < cost {
            return false;
        }
        *tokens -= cost;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_reserve_is_released_over_its_length_and_ends_with_its_hold() {
        let mut r = Reserve::default();
        let asked = r.ask(("a", 1), 100, 3_000 * MS, 0);
        assert_eq!((asked.ask.held, asked.ask.want, asked.ask.hold_ms), (0, 100, 3_000));
        r.answered(&asked, 100, 10 * MS);
        // A reserve of 1 s: a tenth released after 100 ms, all of it after a second.
        assert!(!r.draw(11, 1_000 * MS, 110 * MS));
        assert!(r.draw(10, 1_000 * MS, 110 * MS));
        assert!(!r.draw(1, 1_000 * MS, 110 * MS));
        assert!(r.draw(90, 1_000 * MS, 1_010 * MS));
        assert_eq!(r.tokens(1_010 * MS), 0);
        // The hold ends 3 s after the ask was sent, on this clock.
        let asked = r.ask(("a", 2), 100, 3_000 * MS, 2_000 * MS);
        r.answered(&asked, 100, 2_001 * MS);
        assert!(r.draw(1, 1_000 * MS, 4_999 * MS));
        assert!(!r.draw(1, 1_000 * MS, 5_000 * MS));
        assert_eq!(r, Reserve::Empty);
    }

    #[test]
    fn until_the_reply_the_key_spends_no_more_and_no_later_than_the_ask_allows() {
        let mut r = Reserve::default();
        let asked = r.ask(("a", 1), 100, 10_000 * MS, 0);
        r.answered(&asked, 100, 0);
        // Asked to hold 40 for 1 s: until the reply (which may be lost) the key holds 40, until 1 s after the ask.
        let asked = r.ask(("a", 2), 40, 1_000 * MS, 500 * MS);
        assert_eq!((asked.ask.held, r.tokens(500 * MS), r.tokens(1_500 * MS)), (40, 40, 0));
        // It draws 5 meanwhile; the store says 40: 35 are left, from the reply on.
        assert!(r.draw(5, 1, 600 * MS));
        r.answered(&asked, 40, 700 * MS);
        assert_eq!(r.tokens(700 * MS), 35);
        // A retry the store had applied already holds nothing.
        let asked = r.ask(("a", 3), 40, 1_000 * MS, 800 * MS);
        r.answered(&asked, 0, 800 * MS);
        assert_eq!(r, Reserve::Empty);
    }
}
