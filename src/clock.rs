//! Time sources. Rate math takes `now` from a [`Clock`] so that tests can fake it (governor's `FakeRelativeClock`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::timings::Timings;

/// This machine's wall clock in ms since the Unix epoch (0 before it): the instant a process adopts a rule's
/// parameters at ([`Clock::wall_ms`]), and the client's guess of the window that `fixed_window.lua` then picks
/// by the Redis server's `TIME`.
pub(crate) fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A monotonic clock in nanoseconds since an arbitrary, fixed origin.
///
/// Lease deadlines, "exhausted until" marks and the in-process store's timestamps read it.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// Nanoseconds since this clock's origin; never decreases.
    fn now_ns(&self) -> u64;

    /// Milliseconds since this clock's origin.
    fn now_ms(&self) -> u64 {
        self.now_ns() / 1_000_000
    }

    /// Milliseconds since the Unix epoch, for instants that processes compare with each other (when a process
    /// adopted a rule's parameters: [`crate::Rule`]'s bucket in the store records the latest). The system clock,
    /// unless the clock says otherwise: a [`TokioClock`] counts from the system clock at its origin, so that
    /// limiters sharing one paused clock (a simulation) read the same instants; a [`FakeClock`] reads its own
    /// time.
    fn wall_ms(&self) -> u64 {
        wall_clock_ms().try_into().unwrap_or(0)
    }
}

/// The real monotonic clock ([`Instant`]).
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Self { origin: Instant::now() }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        nanos(self.origin.elapsed())
    }
}

/// Tokio's clock ([`tokio::time::Instant`]): real time normally, and under `#[tokio::test(start_paused = true)]`
/// the paused clock that `tokio::time::advance` and sleeps move, so waits in tests take no real time.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: tokio::time::Instant,
    /// The system clock's ms since the Unix epoch at `origin`.
    wall_origin_ms: u64,
}

impl TokioClock {
    /// A clock whose origin is tokio's now. Needs a tokio runtime when time is paused.
    pub fn new() -> Self {
        Self {
            origin: tokio::time::Instant::now(),
            wall_origin_ms: wall_clock_ms().try_into().unwrap_or(0),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now_ns(&self) -> u64 {
        nanos(self.origin.elapsed())
    }

    fn wall_ms(&self) -> u64 {
        self.wall_origin_ms.saturating_add(self.now_ms())
    }
}

/// A clock that moves only when told to, for tests. Clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct FakeClock {
    now_ns: Arc<AtomicU64>,
}

impl FakeClock {
    /// A fake clock standing at `start`.
    pub fn starting_at(start: Duration) -> Self {
        let c = Self::default();
        c.advance(start);
        c
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.now_ns.fetch_add(nanos(by), Ordering::SeqCst);
    }
}

impl Clock for FakeClock {
    fn now_ns(&self) -> u64 {
        self.now_ns.load(Ordering::SeqCst)
    }

    fn wall_ms(&self) -> u64 {
        self.now_ms()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ticker thread stops (as when it is starved, or its process was stopped and resumed before it ran):
    /// its reading stands still, and an admission's, which reads the kernel's coarse clock too, does not.
    #[test]
    fn a_reading_that_stood_still_is_seen_by_the_coarse_clock() {
        let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
        let recent = Recent::ticking(clock.clone());
        let Some(ticker) = recent.ticker.clone() else {
            return; // no thread could be started: the clock is read on every call
        };
        ticker.stop.store(true, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(10));
        let stood = recent.now_ns();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(recent.now_ns(), stood, "the ticker stopped");
        let before = clock.now_ns();
        let confirmed = recent.confirmed_ns(recent.now_ns());
        let after = clock.now_ns();
        assert!(confirmed >= before, "an admission read a reading 100 ms behind");
        // Early by at most a kernel tick (10 ms at the coarsest) and the ticker's two: deadlines are not cut short.
        assert!(
            confirmed <= after + 12_000_000,
            "{} ms ahead",
            (confirmed - after) / 1_000_000
        );
    }

    #[test]
    fn a_ticking_reading_keeps_up_and_is_at_most_two_ticks_ahead() {
        let clock: Arc<dyn Clock> = Arc::new(MonotonicClock::new());
        let recent = Recent::ticking(clock.clone());
        let first = recent.now_ns();
        for _ in 0..100 {
            let reading = recent.now_ns();
            assert!(reading <= clock.now_ns() + AHEAD_NS, "more than two ticks ahead");
            std::thread::sleep(Duration::from_millis(1));
        }
        // A real thread on a shared machine: it kept ticking, if not every millisecond.
        assert!(
            recent.now_ns() - first >= 50_000_000,
            "the reading did not move with the clock"
        );
        let fake = FakeClock::starting_at(Duration::from_secs(5));
        assert_eq!(
            Recent::exact(Arc::new(fake.clone())).now_ns(),
            fake.now_ns(),
            "a fake clock is read as is"
        );
    }
}

/// How far ahead of its last reading a ticking [`Recent`] answers ([`Timings::AHEAD`]): two ticks, so that its
/// answer is no earlier than the true time while the ticker thread is late by less than a tick.
const AHEAD_NS: u64 = Timings::AHEAD.as_nanos() as u64;

/// The lease engine's hot-path clock: the monotonic clock read every millisecond by a ticker thread, so that a
/// decision costs one atomic load instead of a clock read (the idea of `quanta::Instant::recent`; quanta's
/// reading is global and stays frozen when its upkeep thread stops, which a limiter cannot allow). It answers
/// two ticks ahead of its last reading, so deadlines are met up to 2 ms early while the ticker keeps up. The
/// ticker's reading stands still while its thread is starved (every core deciding) or its process was stopped
/// and resumed before the thread ran again; a refusal on it is safe (it refuses longer), an admission is not, so
/// an admission reads the kernel's coarse clock ([`Recent::confirmed_ns`]), which no thread of the process
/// keeps. A clock given to the builder (a fake one in tests) is read directly.
#[derive(Debug)]
pub(crate) struct Recent {
    clock: Arc<dyn Clock>,
    ticker: Option<Arc<Ticker>>,
    /// What an admission's reading is confirmed by ([`Recent::confirmed_ns`]).
    check: Check,
}

/// What [`Recent::confirmed_ns`] reads besides the ticker.
#[derive(Debug)]
enum Check {
    /// The kernel's coarse monotonic clock (`CLOCK_MONOTONIC_COARSE` on Linux: a few ns, as fine as the kernel's
    /// tick), mapped to the clock's scale at a tick of its own: `origin` on it is `origin_ns` on the clock, and
    /// `tick_ns` is how far apart its ticks are.
    Coarse {
        origin: coarsetime::Instant,
        origin_ns: u64,
        tick_ns: u64,
    },
    /// The clock itself: no coarse clock ticks within [`Timings::CALIBRATION`], or a stalled reading in tests, whose
    /// clock the kernel does not keep.
    Clock,
}

impl Check {
    /// The coarse clock, mapped to `clock`'s scale at one of its ticks and with its tick measured between two:
    /// about two ticks of waiting (8 ms at the usual 250 Hz). [`Check::Clock`] when it does not tick twice
    /// within [`Timings::CALIBRATION`].
    fn calibrated(clock: &dyn Clock) -> Self {
        let started = Instant::now();
        let mut ticks = Vec::with_capacity(2);
        let mut last = coarsetime::Instant::now_without_cache_update();
        while ticks.len() < 2 && started.elapsed() < Timings::CALIBRATION {
            std::thread::sleep(Duration::from_micros(100));
            let now = coarsetime::Instant::now_without_cache_update();
            if now != last {
                ticks.push((now, clock.now_ns()));
                last = now;
            }
        }
        match ticks[..] {
            [(origin, origin_ns), (next, _)] => Self::Coarse {
                origin,
                origin_ns,
                tick_ns: next.duration_since(origin).as_nanos(),
            },
            _ => Self::Clock,
        }
    }
}

#[derive(Debug)]
struct Ticker {
    ns: AtomicU64,
    stop: AtomicBool,
}

impl Recent {
    /// Reads `clock` on every call.
    pub(crate) fn exact(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            ticker: None,
            check: Check::Clock,
        }
    }

    /// Reads `clock` every millisecond on a thread of its own (stopped when this is dropped), after mapping the
    /// kernel's coarse clock to it (about two kernel ticks); reads it on every call when the thread cannot be
    /// started.
    pub(crate) fn ticking(clock: Arc<dyn Clock>) -> Self {
        let check = Check::calibrated(clock.as_ref());
        let ticker = Arc::new(Ticker {
            ns: AtomicU64::new(clock.now_ns()),
            stop: AtomicBool::new(false),
        });
        let (theirs, their_clock) = (ticker.clone(), clock.clone());
        let spawned = std::thread::Builder::new()
            .name("tokenlease-clock".into())
            .spawn(move || {
                while !theirs.stop.load(Ordering::Relaxed) {
                    theirs.ns.store(their_clock.now_ns(), Ordering::Relaxed);
                    std::thread::sleep(Timings::TICK);
                }
            });
        match spawned {
            Ok(_) => Self {
                clock,
                ticker: Some(ticker),
                check,
            },
            Err(error) => {
                tracing::warn!(%error, "no clock thread: reading the clock on every decision");
                Self::exact(clock)
            }
        }
    }

    /// A reading that stands still, as a ticker thread's does while it is starved or its process is stopped
    /// (`SIGSTOP`) and resumed before the thread runs again (tests).
    #[cfg(test)]
    pub(crate) fn stalled(clock: Arc<dyn Clock>) -> Self {
        let ticker = Ticker {
            ns: AtomicU64::new(clock.now_ns()),
            stop: AtomicBool::new(true),
        };
        Self {
            clock,
            ticker: Some(Arc::new(ticker)),
            check: Check::Clock,
        }
    }

    /// `reading` ([`Recent::now_ns`] taken for this decision) confirmed for spending leased tokens: the later of
    /// it and the kernel's coarse clock a tick ahead (it runs up to a tick behind the true time), so deadlines are
    /// met up to a kernel tick early (4 ms at 250 Hz) and never late even when the ticker's reading stood still;
    /// the clock itself where there is no coarse clock; `reading` as it is without a ticker (it read the clock).
    #[inline]
    pub(crate) fn confirmed_ns(&self, reading: u64) -> u64 {
        if self.ticker.is_none() {
            return reading;
        }
        match &self.check {
            Check::Coarse {
                origin,
                origin_ns,
                tick_ns,
            } => {
                let coarse = coarsetime::Instant::now_without_cache_update()
                    .duration_since(*origin)
                    .as_nanos();
                reading.max(origin_ns.saturating_add(coarse).saturating_add(*tick_ns))
            }
            Check::Clock => reading.max(self.clock.now_ns()),
        }
    }

    /// A time in ns on the clock's scale that is no earlier than now (see the type's docs).
    #[inline]
    pub(crate) fn now_ns(&self) -> u64 {
        match &self.ticker {
            Some(t) => t.ns.load(Ordering::Relaxed).saturating_add(AHEAD_NS),
            None => self.clock.now_ns(),
        }
    }
}

impl Drop for Recent {
    fn drop(&mut self) {
        if let Some(t) = &self.ticker {
            t.stop.store(true, Ordering::Relaxed);
        }
    }
}

/// "Never" in the nanoseconds the hot path counts in: a wait that never ends, a deadline that never comes. It is
/// [`Duration::MAX`] at the public boundary ([`crate::Decision`]) and `-1` in the Lua protocol; [`nanos`] and
/// [`duration`] map one onto the other.
pub(crate) const NEVER_NS: u64 = u64::MAX;

/// Nanoseconds of a duration, saturating: [`Duration::MAX`], "never", is [`NEVER_NS`].
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(NEVER_NS)
}

/// `d` in whole milliseconds, saturating.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The duration of `ns` nanoseconds: [`NEVER_NS`] is [`Duration::MAX`], "never".
pub(crate) fn duration(ns: u64) -> Duration {
    if ns == NEVER_NS {
        Duration::MAX
    } else {
        Duration::from_nanos(ns)
    }
}
