//! The store as the limiter calls it: every call counted, refused at once while the circuit breaker is open,
//! and bounded by the limiter's timeouts. The Redis latency and error metrics are recorded by the Redis store
//! itself, where the script and the error kind are known.
//!
//! The circuit breaker ([`Breaker`]): after `failures` transient failures in a row (timeouts, dropped
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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::script::Script;
use super::{Call, Store};
use crate::algorithm::Reply;
use crate::clock::{nanos, Clock};
use crate::decision::Source;
use crate::error::{StoreError, StoreErrorKind};
use crate::packed::{tagged, untagged, Atomic, Packed};
use crate::telemetry;
use crate::timings::Timings;

/// A store behind a circuit breaker, with a count of its calls and the outcome of the last.
#[derive(Debug)]
pub(crate) struct Guarded {
    store: Arc<dyn Store>,
    breaker: Breaker,
    clock: Arc<dyn Clock>,
    calls: AtomicU64,
    /// Calls made, per script in [`Script::ALL`]'s order.
    by_script: [AtomicU64; Script::ALL.len()],
    /// The last call that reached the store succeeded (or none has failed yet); the gauge `store_ready`.
    answered: AtomicBool,
    /// The error of the last call that failed while the store was unavailable.
    last_error: Mutex<Option<String>>,
    pub(crate) timings: Timings,
}

impl Guarded {
    /// Guards `store`; the breaker reads `clock`.
    pub(crate) fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>, timings: Timings) -> Self {
        // Registered now, so a scrape shows it before the first call: no call has failed yet.
        telemetry::store_ready(true);
        Self {
            store,
            breaker: Breaker::new(Timings::BREAKER_FAILURES, timings.breaker_open),
            clock,
            calls: AtomicU64::new(0),
            by_script: std::array::from_fn(|_| AtomicU64::new(0)),
            answered: AtomicBool::new(true),
            last_error: Mutex::new(None),
            timings,
        }
    }

    /// Notes how a call that reached the store ended, for readiness: a store error (not one call's own, such
    /// as a script error) makes the store unavailable until a call succeeds.
    fn note<T>(&self, result: &Result<T, StoreError>) {
        match result {
            // Read first: every call ends here, and a write to the shared flag on each would bounce its cache
            // line between the threads that call the store.
            Ok(_) => {
                if !self.answered.load(Ordering::Acquire) && !self.answered.swap(true, Ordering::AcqRel) {
                    telemetry::store_ready(true);
                }
            }
            Err(e) if e.is_unavailable() => {
                *self.last_error.lock().unwrap_or_else(PoisonError::into_inner) = Some(e.to_string());
                if self.answered.swap(false, Ordering::AcqRel) {
                    telemetry::store_ready(false);
                }
            }
            Err(_) => {}
        }
    }

    /// Whether the store decides now: the breaker is closed (or lets this probe through) and the store's probe
    /// succeeds (for Redis: it answers and accepts writes). The probe counts as a call for the breaker.
    ///
    /// # Errors
    /// The probe's error, or one of kind `Other` naming the last store error when the breaker is open.
    pub(crate) async fn probe(&self) -> Result<(), StoreError> {
        if self.breaker.admit(self.clock.now_ns()) == Admit::No {
            let last = self.last_error.lock().unwrap_or_else(PoisonError::into_inner).clone();
            return Err(StoreError {
                kind: StoreErrorKind::Other,
                script: "probe",
                message: format!(
                    "circuit open: the store failed repeatedly; last error: {}",
                    last.as_deref().unwrap_or("none")
                ),
                source: None,
            });
        }
        let result = self.store.probe().await;
        self.breaker
            .record(result.as_ref().err().map(StoreError::is_transient), self.clock.now_ns());
        self.note(&result);
        result
    }

    /// The unsafe `maxmemory-policy` the store reported, if any.
    pub(crate) fn eviction_policy(&self) -> Option<String> {
        self.store.eviction_policy()
    }

    /// Runs a call unless the breaker is open.
    ///
    /// # Errors
    /// The store's error, or one of kind `CircuitOpen` when the breaker is open (the store was not called).
    pub(crate) async fn run(&self, call: &Call) -> Result<Reply, StoreError> {
        if self.breaker.admit(self.clock.now_ns()) == Admit::No {
            return Err(StoreError {
                kind: StoreErrorKind::CircuitOpen,
                script: call.script().name(),
                message: "circuit open: the store failed repeatedly; not called".into(),
                source: None,
            });
        }
        self.run_past_breaker(call).await
    }

    /// Runs a call even while the breaker is open (a beat: it never holds the breaker's probe); the result is
    /// recorded as any call's, by the breaker and for readiness.
    ///
    /// # Errors
    /// The store's error.
    pub(crate) async fn run_past_breaker(&self, call: &Call) -> Result<Reply, StoreError> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.by_script[call.script() as usize].fetch_add(1, Ordering::Relaxed);
        let result = self.store.run(call).await;
        self.breaker
            .record(result.as_ref().err().map(StoreError::is_transient), self.clock.now_ns());
        self.note(&result);
        result
    }

    /// Calls made so far (leases, returns, beats and direct checks).
    pub(crate) fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Calls made so far per script, by name, in [`Script::ALL`]'s order.
    pub(crate) fn calls_by_script(&self) -> Vec<(&'static str, u64)> {
        Script::ALL
            .iter()
            .zip(&self.by_script)
            .map(|(script, n)| (script.name(), n.load(Ordering::Relaxed)))
            .collect()
    }

    /// The `source` label of the store's decisions.
    pub(crate) fn source(&self) -> Source {
        self.store.source()
    }

    /// Whether the store answers now.
    ///
    /// # Errors
    /// The store's error.
    pub(crate) async fn ping(&self) -> Result<(), StoreError> {
        self.store.ping().await
    }

    /// Whether the breaker is open (or half-open) now.
    pub(crate) fn circuit_open(&self) -> bool {
        self.breaker.is_open()
    }
}

/// The breaker's state. Every store call asks it ([`Event::Call`]) and tells it how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
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
enum Event {
    /// A call asks to go to the store.
    Call,
    /// A call that went ended with the store answering (a success, or an error the store gave).
    Answered,
    /// A call that went ended in a transient failure (a timeout, a dropped connection).
    Failed,
}

/// What the breaker says about a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admit {
    /// Closed: go ahead.
    Yes,
    /// Half-open: this call is the probe.
    Probe,
    /// Open: fail at once.
    No,
}

/// How a breaker trips: transient failures in a row, and how long it stays open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Trip {
    failures: u32,
    open_for_ns: u64,
}

impl State {
    /// The state after `event` at `now_ns`, and what it says about the call when the event is a
    /// [`Event::Call`] ([`Admit::Yes`] for the other events).
    fn step(self, event: Event, trip: Trip, now_ns: u64) -> (Self, Admit) {
        // Open or half-open from now: for `open_for_ns`.
        let next_ns = now_ns.saturating_add(trip.open_for_ns);
        match (self, event) {
            (Self::Closed { .. }, Event::Call) => (self, Admit::Yes),
            (Self::Open { until_ns } | Self::HalfOpen { until_ns }, Event::Call) if now_ns >= until_ns => {
                (Self::HalfOpen { until_ns: next_ns }, Admit::Probe)
            }
            (Self::Open { .. } | Self::HalfOpen { .. }, Event::Call) => (self, Admit::No),
            (_, Event::Answered) => (Self::Closed { failures: 0 }, Admit::Yes),
            (Self::Closed { failures }, Event::Failed) if failures.saturating_add(1) < trip.failures => {
                (Self::Closed { failures: failures + 1 }, Admit::Yes)
            }
            (_, Event::Failed) => (Self::Open { until_ns: next_ns }, Admit::Yes),
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
struct Breaker {
    trip: Trip,
    state: Atomic<State>,
}

impl Breaker {
    /// A closed breaker opening after `failures` transient failures in a row, for `open_for`.
    fn new(failures: u32, open_for: Duration) -> Self {
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
    fn admit(&self, now_ns: u64) -> Admit {
        self.step(Event::Call, now_ns)
    }

    /// Records how a call that was let through ended: `Some(true)` a transient failure, `Some(false)` any
    /// other error (the store answered), `None` success.
    fn record(&self, transient_failure: Option<bool>, now_ns: u64) {
        let event = if transient_failure == Some(true) {
            Event::Failed
        } else {
            Event::Answered
        };
        self.step(event, now_ns);
    }

    /// Whether the breaker is open (or half-open) now.
    fn is_open(&self) -> bool {
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
