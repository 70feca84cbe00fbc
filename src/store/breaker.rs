//! A circuit breaker in front of the store: after `failures` transient failures in a row (timeouts, dropped
//! connections) it opens and calls fail at once, without reaching the store, for `open_for`; then it lets one
//! probe through (half-open): an answer closes it, a failure opens it again, and a probe that never ends (its
//! caller dropped the call) is given up after another `open_for`. Calls refused by an open breaker are decided
//! by the rule's `fail_mode`, so a dead Redis costs callers nothing and is not hammered.
//!
//! The states and their one step, [`State::step`]:
//!
//! ```text
//!            failures in a row                 open_for passed: one call is the probe
//!  Closed ───────────────────────▶ Open ──────────────────────────────────────────▶ HalfOpen
//!    ▲  ◀──────── an answer ──────── │  ◀── a failure, or the probe lost (open_for) ──── │
//!    └──────────────────────────────────────── an answer ─────────────────────────────────┘
//! ```

use std::time::Duration;

use crate::clock::nanos;
use crate::packed::{tagged, untagged, Atomic, Packed};

/// The breaker's state. Every store call asks it ([`Event::Call`]) and tells it how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// Calls go to the store; `failures` transient failures in a row so far.
    Closed { failures: u32 },
    /// Calls fail at once until `until_ns` (monotonic ns).
    Open { until_ns: u64 },
    /// One call, the probe, went to the store; the others fail at once. Past `until_ns` without its end the
    /// probe is given up and the next call is a probe.
    HalfOpen { until_ns: u64 },
}

/// What happens to a breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Event {
    /// A call asks to go to the store.
    Call,
    /// A call that went ended with the store answering (a success, or an error the store gave).
    Answered,
    /// A call that went ended in a transient failure (a timeout, a dropped connection).
    Failed,
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

/// How a breaker trips: transient failures in a row, and how long it stays open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Trip {
    pub failures: u32,
    pub open_for_ns: u64,
}

impl State {
    /// The state after `event` at `now_ns`, and what it says about the call when the event is a
    /// [`Event::Call`] ([`Admit::Yes`] for the other events).
    pub(crate) fn step(self, event: Event, trip: Trip, now_ns: u64) -> (Self, Admit) {
        let open = Self::Open {
            until_ns: now_ns.saturating_add(trip.open_for_ns),
        };
        match (self, event) {
            (Self::Closed { .. }, Event::Call) => (self, Admit::Yes),
            (Self::Open { until_ns } | Self::HalfOpen { until_ns }, Event::Call) if now_ns >= until_ns => (
                Self::HalfOpen {
                    until_ns: now_ns.saturating_add(trip.open_for_ns),
                },
                Admit::Probe,
            ),
            (Self::Open { .. } | Self::HalfOpen { .. }, Event::Call) => (self, Admit::No),
            (_, Event::Answered) => (Self::Closed { failures: 0 }, Admit::Yes),
            (Self::Closed { failures }, Event::Failed) if failures.saturating_add(1) < trip.failures => {
                (Self::Closed { failures: failures + 1 }, Admit::Yes)
            }
            (_, Event::Failed) => (open, Admit::Yes),
        }
    }
}

impl Packed for State {
    fn pack(self) -> u64 {
        match self {
            Self::Closed { failures } => tagged(0, u64::from(failures)),
            Self::Open { until_ns } => tagged(1, until_ns),
            Self::HalfOpen { until_ns } => tagged(2, until_ns),
        }
    }

    fn unpack(word: u64) -> Self {
        match untagged(word) {
            (0, failures) => Self::Closed {
                failures: u32::try_from(failures).unwrap_or(u32::MAX),
            },
            (1, until_ns) => Self::Open { until_ns },
            (_, until_ns) => Self::HalfOpen { until_ns },
        }
    }
}

/// A breaker shared by a store's callers, lock-free: its [`State`] in one atomic word, stepped by
/// compare-and-swap.
#[derive(Debug)]
pub(crate) struct Breaker {
    trip: Trip,
    state: Atomic<State>,
}

impl Breaker {
    /// A closed breaker opening after `failures` transient failures in a row, for `open_for`.
    pub(crate) fn new(failures: u32, open_for: Duration) -> Self {
        Self {
            trip: Trip {
                failures: failures.max(1),
                open_for_ns: nanos(open_for),
            },
            state: Atomic::new(State::Closed { failures: 0 }),
        }
    }

    /// Steps the state by `event` at `now_ns`.
    fn step(&self, event: Event, now_ns: u64) -> Admit {
        self.state.update(|state| state.step(event, self.trip, now_ns))
    }

    /// Whether a call may go to the store at `now_ns`.
    #[inline]
    pub(crate) fn admit(&self, now_ns: u64) -> Admit {
        self.step(Event::Call, now_ns)
    }

    /// Records how a call that was let through ended: `Some(true)` a transient failure, `Some(false)` any
    /// other error (the store answered), `None` success.
    pub(crate) fn record(&self, transient_failure: Option<bool>, now_ns: u64) {
        let event = if transient_failure == Some(true) {
            Event::Failed
        } else {
            Event::Answered
        };
        self.step(event, now_ns);
    }

    /// Whether the breaker is open (or half-open) now.
    pub(crate) fn is_open(&self) -> bool {
        !matches!(self.state.load(), State::Closed { .. })
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

    #[test]
    fn a_probe_whose_caller_dropped_it_is_given_up_after_open_for() {
        let b = Breaker::new(1, Duration::from_nanos(100));
        b.record(Some(true), 0);
        assert_eq!(b.admit(100), Admit::Probe);
        // The probe's caller dropped the call: its end is never recorded.
        assert_eq!(b.admit(199), Admit::No, "the probe may still answer");
        assert_eq!(b.admit(200), Admit::Probe, "a breaker never stays half-open for good");
    }

    #[test]
    fn each_state_steps_by_each_event() {
        let trip = Trip {
            failures: 2,
            open_for_ns: 10,
        };
        let closed = |failures| State::Closed { failures };
        let open = |until_ns| State::Open { until_ns };
        let half = |until_ns| State::HalfOpen { until_ns };
        let table = [
            (closed(0), Event::Call, 5, (closed(0), Admit::Yes)),
            (closed(0), Event::Failed, 5, (closed(1), Admit::Yes)),
            (closed(1), Event::Failed, 5, (open(15), Admit::Yes)),
            (closed(1), Event::Answered, 5, (closed(0), Admit::Yes)),
            (open(15), Event::Call, 14, (open(15), Admit::No)),
            (open(15), Event::Call, 15, (half(25), Admit::Probe)),
            (open(15), Event::Failed, 14, (open(24), Admit::Yes)),
            (open(15), Event::Answered, 14, (closed(0), Admit::Yes)),
            (half(25), Event::Call, 20, (half(25), Admit::No)),
            (half(25), Event::Call, 25, (half(35), Admit::Probe)),
            (half(25), Event::Failed, 20, (open(30), Admit::Yes)),
            (half(25), Event::Answered, 20, (closed(0), Admit::Yes)),
        ];
        for (state, event, now, expected) in table {
            assert_eq!(
                state.step(event, trip, now),
                expected,
                "{state:?} on {event:?} at {now}"
            );
            assert_eq!(State::unpack(state.pack()), state, "packed in one word");
        }
    }
}
