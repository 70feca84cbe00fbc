//! When admissions happened, in 10 ms buckets, to check a bound over every window of a run (invariant 16):
//! `admitted(W) ≤ limit(W)` for every window length W from a minimum (0.2 s) to the whole run, at every start.
//!
//! ```ignore
//! let timeline = Timeline::new(Duration::from_secs(20));
//! timeline.record(1);                                   // from any task, at Instant::now()
//! let worst = timeline.worst(Duration::from_millis(200), |w| CAPACITY as f64 + RATE * (w + TTL).as_secs_f64());
//! assert!(worst.ratio <= 1.0, "{worst}");
//! ```

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The width of a bucket.
pub const SLOT: Duration = Duration::from_millis(10);

/// Admissions counted per 10 ms since the timeline was made.
#[derive(Debug)]
pub struct Timeline {
    started: Instant,
    slots: Vec<AtomicU64>,
}

/// The window whose count came closest to (or went furthest over) its limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Worst {
    /// admitted / limit.
    pub ratio: f64,
    /// Where the window starts, from the timeline's start.
    pub start: Duration,
    /// Its length (a whole number of buckets).
    pub window: Duration,
    /// Admitted in it.
    pub admitted: u64,
    /// Its limit.
    pub limit: f64,
}

impl fmt::Display for Worst {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "worst window {:.2} s from {:.2} s: {} admitted against {:.0} ({:.3}x)",
            self.window.as_secs_f64(),
            self.start.as_secs_f64(),
            self.admitted,
            self.limit,
            self.ratio
        )
    }
}

impl Timeline {
    /// A timeline starting now that can record for `span` (later admissions count in its last bucket).
    pub fn new(span: Duration) -> Self {
        let n = usize::try_from(span.as_millis() / SLOT.as_millis()).unwrap_or(usize::MAX) + 1;
        Self {
            started: Instant::now(),
            slots: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// When the timeline started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Counts `n` admissions now.
    pub fn record(&self, n: u64) {
        self.record_at(self.started.elapsed(), n);
    }

    /// Counts `n` admissions at `at` after the start.
    pub fn record_at(&self, at: Duration, n: u64) {
        let i = usize::try_from(at.as_millis() / SLOT.as_millis()).unwrap_or(usize::MAX);
        let i = i.min(self.slots.len() - 1);
        self.slots[i].fetch_add(n, Ordering::Relaxed);
    }

    /// All admissions recorded.
    pub fn total(&self) -> u64 {
        self.slots.iter().map(|s| s.load(Ordering::Relaxed)).sum()
    }

    /// The counts up to the last bucket that holds one (the run's span).
    fn counts(&self) -> Vec<u64> {
        let mut counts: Vec<u64> = self.slots.iter().map(|s| s.load(Ordering::Relaxed)).collect();
        while counts.last() == Some(&0) {
            counts.pop();
        }
        counts
    }

    /// The most admitted in any window of `window` (rounded up to whole buckets), at any start.
    pub fn max_in(&self, window: Duration) -> u64 {
        let counts = self.counts();
        let b = buckets(window).max(1);
        let prefix = prefix(&counts);
        (0..counts.len().max(1))
            .map(|i| prefix[(i + b).min(counts.len())] - prefix[i.min(counts.len())])
            .max()
            .unwrap_or(0)
    }

    /// The window with the highest admitted / `limit(window)` among every window of at least `min` (in whole
    /// buckets) up to the whole run, at every start. A window of k buckets is given `limit(k × 10 ms)`: its
    /// admissions lie within that span.
    pub fn worst(&self, min: Duration, limit: impl Fn(Duration) -> f64) -> Worst {
        let counts = self.counts();
        let n = counts.len();
        let prefix = prefix(&counts);
        let mut worst = Worst {
            ratio: 0.0,
            start: Duration::ZERO,
            window: Duration::ZERO,
            admitted: 0,
            limit: 0.0,
        };
        for b in buckets(min).max(1)..=n.max(1) {
            let window = SLOT * u32::try_from(b).unwrap_or(u32::MAX);
            let bound = limit(window);
            let (i, admitted) = (0..=n.saturating_sub(b))
                .map(|i| (i, prefix[(i + b).min(n)] - prefix[i]))
                .max_by_key(|&(_, a)| a)
                .unwrap_or((0, 0));
            let ratio = admitted as f64 / bound;
            if ratio > worst.ratio {
                worst = Worst {
                    ratio,
                    start: SLOT * u32::try_from(i).unwrap_or(u32::MAX),
                    window,
                    admitted,
                    limit: bound,
                };
            }
        }
        worst
    }
}

fn buckets(d: Duration) -> usize {
    usize::try_from(d.as_millis().div_ceil(SLOT.as_millis())).unwrap_or(usize::MAX)
}

fn prefix(counts: &[u64]) -> Vec<u64> {
    let mut prefix = Vec::with_capacity(counts.len() + 1);
    prefix.push(0);
    for c in counts {
        prefix.push(prefix.last().copied().unwrap_or(0) + c);
    }
    prefix
}
