//! Time sources. Rate math takes `now` from a [`Clock`] so that tests can fake it (governor's `FakeRelativeClock`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
}

impl TokioClock {
    /// A clock whose origin is tokio's now. Needs a tokio runtime when time is paused.
    pub fn new() -> Self {
        Self {
            origin: tokio::time::Instant::now(),
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
}

/// Nanoseconds of a duration, saturating ([`Duration::MAX`], "never", stays the largest: `u64::MAX`).
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
