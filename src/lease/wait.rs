//! The states of a hot key that its callers read beside its tokens, each an enum kept in one atomic word
//! ([`crate::packed::Atomic`]), so that a reader never sees half of one change:
//!
//! - [`Wait`]: whether a caller who finds too few local tokens leases now, or is refused locally (the shared
//!   bucket refused this process, handed it a turn, or will never have enough);
//! - [`Backoff`]: whether the key's last lease failed, so that `fail_mode` decides instead of the store;
//! - [`Slot`]: whether a lease of the key is in flight, or the bucket was retired for good; and before its
//!   first lease, whether that lease measures the demand first.
//!
//! ```text
//!  Free ──refused, or granted with a turn or chunks to come──▶ Until { until }   ──until passed──▶ (as Free)
//!  Free ──the bucket will never have enough (rate 0)─────────▶ Never { recheck } ──recheck passed──▶ (as Free)
//!  Until ──half a batch (alone: a token) expired unspent──▶ Free    Until ──the demand fell──▶ Until { last chunk }
//!  None ──a lease failed──▶ Until { until, reason } ──a lease granted──▶ None     (Backoff; as None once passed)
//!  Measuring, Idle ──claimed──▶ Leasing ──ended──▶ Idle;  any ──evicted, reloaded, shut down──▶ Retired (Slot)
//! ```

use crate::error::FailReason;
use crate::packed::{tagged, untagged, Packed};

/// Whether a hot key's caller who finds too few local tokens leases now, or is refused locally until when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// A caller who finds too few tokens leases (below the watermark, a lease starts in the background).
    Free,
    /// The shared bucket refused this process or handed it a turn, the last chunk of a paced lease is still to
    /// come, or the first lease measures the demand: callers who find too few tokens are refused locally until
    /// `until_ns`, then lease.
    Until { until_ns: u64 },
    /// The shared bucket said it will never have enough (a stock with rate 0): callers who find too few tokens
    /// are refused as "never" until `recheck_ns`, then it is asked again (tokens given back may still sell).
    Never { recheck_ns: u64 },
}

impl Wait {
    /// Refused locally until `until_ns` (0, or any instant past: [`Wait::Free`] in effect).
    pub(crate) fn until(until_ns: u64) -> Self {
        if until_ns == 0 {
            Self::Free
        } else {
            Self::Until { until_ns }
        }
    }

    /// Until when callers who find too few tokens are refused locally (0: they lease).
    pub(crate) fn until_ns(self) -> u64 {
        match self {
            Self::Free => 0,
            Self::Until { until_ns } => until_ns,
            Self::Never { recheck_ns } => recheck_ns,
        }
    }

    /// Whether the wait is a "never".
    pub(crate) fn is_never(self) -> bool {
        matches!(self, Self::Never { .. })
    }
}

/// Whether a hot key's last lease failed: its callers are decided by `fail_mode` until when, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backoff {
    /// The last lease was answered (or none failed yet): the store is asked.
    None,
    /// A lease failed for `reason`: `fail_mode` decides until `until_ns`
    /// ([`crate::timings::Timings::backoff`] after the failure).
    Until { until_ns: u64, reason: FailReason },
}

impl Backoff {
    /// Whether `fail_mode` decides at `now_ns`, and for which reason.
    pub(crate) fn at(self, now_ns: u64) -> Option<FailReason> {
        match self {
            Self::Until { until_ns, reason } if now_ns < until_ns => Some(reason),
            _ => None,
        }
    }
}

/// A hot key's one lease slot: a process sends one lease per key at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Slot {
    /// No lease in flight: the next caller below the watermark claims the slot.
    Idle,
    /// A lease is in flight; its callers wait for it or are refused briefly.
    Leasing,
    /// Drained for good (evicted, its rule reloaded, the limiter shut down): no lease starts, and a grant that
    /// arrives is not added (its lease gives it back). A lease in flight when the bucket retired ends unseen.
    Retired,
    /// No lease sent yet, and the key was made hot on a shared bucket the fleet spends: its first lease may
    /// wait to measure the demand (`LocalBucket::first_lease_wait`). Otherwise as [`Slot::Idle`].
    Measuring,
}

impl Slot {
    /// A lease claims the slot: [`Slot::Leasing`], and `Some` of the state it was claimed from ([`Slot::Idle`]
    /// or [`Slot::Measuring`]); `None`, unchanged, when a lease is in flight or the slot is retired.
    pub(crate) fn claimed(self) -> (Self, Option<Self>) {
        match self {
            Self::Idle | Self::Measuring => (Self::Leasing, Some(self)),
            Self::Leasing | Self::Retired => (self, None),
        }
    }

    /// The lease in flight ended: [`Slot::Idle`], unless the slot was retired meanwhile.
    pub(crate) fn ended(self) -> Self {
        match self {
            Self::Leasing => Self::Idle,
            other => other,
        }
    }
}

impl Packed for Wait {
    fn pack(self) -> u64 {
        match self {
            Self::Free => tagged(0, 0),
            Self::Until { until_ns } => tagged(1, until_ns),
            Self::Never { recheck_ns } => tagged(2, recheck_ns),
        }
    }

    fn unpack(word: u64) -> Self {
        match untagged(word) {
            (1, until_ns) => Self::Until { until_ns },
            (2, recheck_ns) => Self::Never { recheck_ns },
            _ => Self::Free,
        }
    }
}

impl Packed for Backoff {
    fn pack(self) -> u64 {
        match self {
            Self::None => tagged(0, 0),
            Self::Until { until_ns, reason } => tagged(1 + reason as u8, until_ns),
        }
    }

    fn unpack(word: u64) -> Self {
        match untagged(word) {
            (0, _) => Self::None,
            (tag, until_ns) => Self::Until {
                until_ns,
                reason: FailReason::ALL
                    .get(usize::from(tag - 1))
                    .copied()
                    .unwrap_or(FailReason::Error),
            },
        }
    }
}

impl Packed for Slot {
    fn pack(self) -> u64 {
        let tag = match self {
            Self::Idle => 0,
            Self::Leasing => 1,
            Self::Retired => 2,
            Self::Measuring => 3,
        };
        tagged(tag, 0)
    }

    fn unpack(word: u64) -> Self {
        match untagged(word).0 {
            0 => Self::Idle,
            1 => Self::Leasing,
            3 => Self::Measuring,
            _ => Self::Retired,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::NEVER_NS;
    use crate::packed::Atomic;

    #[test]
    fn each_state_reads_back_from_its_word() {
        let waits = [
            Wait::Free,
            Wait::Until { until_ns: 5 },
            Wait::Never { recheck_ns: 1 << 40 },
        ];
        for wait in waits {
            let atomic = Atomic::new(Wait::Free);
            atomic.store(wait);
            assert_eq!(atomic.load(), wait);
        }
        for reason in FailReason::ALL {
            let backoff = Backoff::Until { until_ns: 7, reason };
            assert_eq!(Atomic::new(backoff).load(), backoff);
            assert_eq!(backoff.at(6), Some(reason));
            assert_eq!(backoff.at(7), None, "over once its deadline passed");
        }
        assert_eq!(Atomic::new(Backoff::None).load().at(0), None);
        // "For ever" stays after every instant the clock reaches.
        let forever = Atomic::new(Wait::Until { until_ns: NEVER_NS }).load();
        assert!(forever.until_ns() > 1 << 61);
        assert_eq!(Wait::until(0), Wait::Free);
        assert!(Wait::Never { recheck_ns: 3 }.is_never() && !Wait::until(3).is_never());
    }

    #[test]
    fn a_retired_slot_stays_retired_when_its_lease_ends() {
        let slot = Atomic::new(Slot::Measuring);
        assert_eq!(
            slot.update(Slot::claimed),
            Some(Slot::Measuring),
            "claimed from where it was"
        );
        assert_eq!(slot.update(Slot::claimed), None, "one lease at a time");
        slot.update(|s| (s.ended(), ()));
        assert_eq!(slot.update(Slot::claimed), Some(Slot::Idle), "measured once");
        slot.store(Slot::Retired);
        slot.update(|s| (s.ended(), ()));
        assert_eq!(slot.load(), Slot::Retired, "the lease ends unseen");
        for state in [Slot::Idle, Slot::Leasing, Slot::Retired, Slot::Measuring] {
            assert_eq!(Slot::unpack(state.pack()), state);
        }
    }
}
