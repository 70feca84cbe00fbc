//! A circuit breaker in front of the store: after `failures` transient failures in a row (timeouts, dropped
//! connections) it opens and calls fail at once, without reaching the store, for `open_for`; then it lets one
//! probe through (half-open): success closes it, failure opens it again. Calls refused by an open breaker are
//! decided by the rule's `fail_mode`, so a dead Redis costs callers nothing and is not hammered.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::nanos;

/// The breaker's state, lock-free.
#[derive(Debug)]
pub(crate) struct Breaker {
    failures: u32,
    open_for_ns: u64,
    /// Transient failures in a row.
    consecutive: AtomicU32,
    /// 0 when closed; otherwise when the open breaker half-opens (monotonic ns).
    open_until_ns: AtomicU64,
    /// A half-open probe is in flight.
    probing: AtomicBool,
}

/// What the breaker says about a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Closed: go ahead.
    Yes,
    /// Half-open: this call is the probe.
    Probe,
    /// Open: fail at once.
    No,
}

impl Breaker {
    /// A closed breaker opening after `failures` transient failures in a row, for `open_for`.
    pub(crate) fn new(failures: u32, open_for: Duration) -> Self {
        Self {
            failures: failures.max(1),
            open_for_ns: nanos(open_for),
            consecutive: AtomicU32::new(0),
            open_until_ns: AtomicU64::new(0),
            probing: AtomicBool::new(false),
        }
    }

    /// Whether a call may go to the store at `now_ns`.
    #[inline]
    pub(crate) fn admit(&self, now_ns: u64) -> Admit {
        let until = self.open_until_ns.load(Ordering::Acquire);
        if until == 0 {
            Admit::Yes
        } else if now_ns < until {
            Admit::No
        } else if self
            .probing
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            Admit::Probe
        } else {
            Admit::No
        }
    }

    /// Records how a call that was let through ended: `Some(true)` a transient failure, `Some(false)` any
    /// other error (the store answered), `None` success.
    pub(crate) fn record(&self, transient_failure: Option<bool>, now_ns: u64) {
        match transient_failure {
            Some(true) => {
                let n = self.consecutive.fetch_add(1, Ordering::AcqRel).saturating_add(1);
                if n >= self.failures || self.probing.load(Ordering::Acquire) {
                    self.open_until_ns
                        .store(now_ns.saturating_add(self.open_for_ns).max(1), Ordering::Release);
                    self.probing.store(false, Ordering::Release);
                }
            }
            _ => {
                self.consecutive.store(0, Ordering::Release);
                self.open_until_ns.store(0, Ordering::Release);
                self.probing.store(false, Ordering::Release);
            }
        }
    }

    /// Whether the breaker is open (or half-open) now.
    pub(crate) fn is_open(&self) -> bool {
        self.open_until_ns.load(Ordering::Acquire) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_failures_half_opens_for_one_probe_and_closes_on_success() {
        let b = Breaker::new(3, Duration::from_nanos(100));
        for _ in 0..2 {
            assert_eq!(b.admit(0), Admit::Yes);
            b.record(Some(true), 0);
        }
        b.record(Some(false), 0); // the store answered: the streak ends
        for _ in 0..3 {
            b.record(Some(true), 10);
        }
        assert_eq!(b.admit(50), Admit::No, "open");
        assert_eq!(b.admit(110), Admit::Probe, "half-open: one probe");
        assert_eq!(b.admit(111), Admit::No, "only one");
        b.record(Some(true), 120); // the probe failed: open again
        assert_eq!(b.admit(150), Admit::No);
        assert_eq!(b.admit(220), Admit::Probe);
        b.record(None, 230);
        assert_eq!(b.admit(231), Admit::Yes, "closed");
        assert!(!b.is_open());
    }
}
