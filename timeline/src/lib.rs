//! Admissions counted in slots of time, and invariant 1 checked on every window of a run:
//! `admitted(W) ≤ bound(W)` for every window of at least a minimum length (0.2 s) up to the whole run, at every
//! start. The one checker of the tests against real servers (`tests/common`) and of `tokenlease simulate`.
//!
//! ```
//! use std::time::Duration;
//! use tokenlease_timeline::Timeline;
//!
//! let timeline = Timeline::new(Duration::from_secs(20));
//! timeline.record(1); // from any task, at Instant::now()
//! let (capacity, rate, ttl) = (100.0, 50.0, Duration::from_millis(200));
//! let worst = timeline.worst(Duration::from_millis(200), |w| capacity + rate * (w + ttl).as_secs_f64());
//! assert!(worst.ratio <= 1.0, "{worst}");
//! ```

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The width of a [`Timeline`]'s slot.
pub const SLOT: Duration = Duration::from_millis(10);

/// Admissions counted per [`SLOT`] since the timeline was made (or since a start the caller counts from, with
/// [`Timeline::record_at`]: virtual time in the simulator).
#[derive(Debug)]
pub struct Timeline {
    started: Instant,
    slots: Vec<AtomicU64>,
}

impl Timeline {
    /// A timeline starting now that can record for `span`, rounded up to whole slots (later admissions count in its
    /// last slot).
    pub fn new(span: Duration) -> Self {
        let n = usize::try_from(span.as_millis().div_ceil(SLOT.as_millis())).unwrap_or(usize::MAX);
        Self {
            started: Instant::now(),
            slots: (0..n.max(1)).map(|_| AtomicU64::new(0)).collect(),
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

    /// Counts `n` admissions at `at` after the start (past the span: in the last slot).
    pub fn record_at(&self, at: Duration, n: u64) {
        let i = usize::try_from(at.as_millis() / SLOT.as_millis()).unwrap_or(usize::MAX);
        if let Some(slot) = self.slots.get(i).or_else(|| self.slots.last()) {
            slot.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// All admissions recorded.
    pub fn total(&self) -> u64 {
        self.slots.iter().map(|s| s.load(Ordering::Relaxed)).sum()
    }

    /// The counts per slot up to the last one that holds one (the run's span).
    pub fn counts(&self) -> Vec<u64> {
        let mut counts: Vec<u64> = self.slots.iter().map(|s| s.load(Ordering::Relaxed)).collect();
        let used = counts.iter().rposition(|&n| n > 0).map_or(0, |i| i + 1);
        counts.truncate(used);
        counts
    }

    /// The most admitted in any window of `window` (rounded up to whole slots), at any start.
    pub fn max_in(&self, window: Duration) -> u64 {
        let counts = self.counts();
        let (n, b) = (counts.len(), slots_in(window, SLOT).max(1));
        let prefix = prefix(&counts);
        (0..n.max(1))
            .map(|i| prefix[(i + b).min(n)] - prefix[i.min(n)])
            .max()
            .unwrap_or(0)
    }

    /// The worst window of the run against `limit(window length)` (see [`worst`]).
    pub fn worst(&self, min: Duration, limit: impl Fn(Duration) -> f64) -> Worst {
        worst(&self.counts(), SLOT, min, |start, end| limit(end - start))
    }
}

/// The window whose count came closest to (or went furthest over) its bound.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Worst {
    /// Admitted over the bound: above 1 is over it.
    pub ratio: f64,
    /// Where the window starts, from the run's start.
    pub start: Duration,
    /// Its length (a whole number of slots).
    pub window: Duration,
    /// Admitted in it.
    pub admitted: u64,
    /// Its bound, in tokens.
    pub limit: f64,
}

impl Worst {
    /// Keeps the window `[start, start + window)` that admitted `admitted` against `limit` if it is worse than
    /// this one (ties keep the first seen).
    pub fn keep_if_worse(&mut self, (start, window): (Duration, Duration), admitted: u64, limit: f64) {
        let ratio = admitted as f64 / limit;
        if ratio > self.ratio {
            *self = Self {
                ratio,
                start,
                window,
                admitted,
                limit,
            };
        }
    }
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

/// The window of `counts` (admissions per `slot`) with the highest admitted over `bound(start, end)`, among
/// every window of at least `min` (rounded up to whole slots) up to the whole run, at every start: the shortest
/// such window, then the earliest. A window of k slots from slot i is given `bound(i × slot, (i + k) × slot)`:
/// its admissions lie within that span. O(n²) calls of `bound` for n slots: coarsen long runs first
/// ([`coarsened`]).
pub fn worst(counts: &[u64], slot: Duration, min: Duration, bound: impl Fn(Duration, Duration) -> f64) -> Worst {
    let n = counts.len();
    let prefix = prefix(counts);
    let at = |i: usize| slot * u32::try_from(i).unwrap_or(u32::MAX);
    let mut worst = Worst::default();
    for k in slots_in(min, slot).max(1)..=n {
        for i in 0..=n - k {
            worst.keep_if_worse((at(i), at(k)), prefix[i + k] - prefix[i], bound(at(i), at(i + k)));
        }
    }
    worst
}

/// `counts` in slots `factor` times as wide (the last one may be partial).
pub fn coarsened(counts: &[u64], factor: usize) -> Vec<u64> {
    counts.chunks(factor.max(1)).map(|c| c.iter().sum()).collect()
}

/// The prefix sums of `counts`: element i is the sum of the first i.
pub fn prefix(counts: &[u64]) -> Vec<u64> {
    let mut prefix = Vec::with_capacity(counts.len() + 1);
    prefix.push(0);
    for c in counts {
        prefix.push(prefix.last().copied().unwrap_or(0) + c);
    }
    prefix
}

/// Whole slots of `slot` that `d` spans, rounded up.
fn slots_in(d: Duration, slot: Duration) -> usize {
    usize::try_from(d.as_nanos().div_ceil(slot.as_nanos().max(1))).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_window_is_found_at_any_start_and_length() {
        let t = Timeline::new(Duration::from_secs(10));
        // 10 per slot for 2 s, then a burst of 500 at 5 s.
        for i in 0..200 {
            t.record_at(SLOT * i, 10);
        }
        t.record_at(Duration::from_secs(5), 500);
        assert_eq!(t.total(), 2500);
        assert_eq!(t.max_in(Duration::from_millis(200)), 500);
        assert_eq!(t.max_in(Duration::from_secs(1)), 1000);
        // A limit of 1000 per second: 2 s at exactly the rate is within; the burst is 2.5x it in 0.2 s. Windows
        // lie within the run, which ends with the burst's slot (5.00-5.01 s): the only 0.2 s window holding it
        // starts at 4.81 s.
        let worst = t.worst(Duration::from_millis(200), |w| 1000.0 * w.as_secs_f64());
        assert_eq!(
            (worst.admitted, worst.window, worst.start),
            (500, Duration::from_millis(200), Duration::from_millis(4810))
        );
        assert!((worst.ratio - 2.5).abs() < 1e-9, "{worst}");
    }

    #[test]
    fn a_bound_of_start_and_end_is_judged_where_it_binds() {
        // 1 ms slots: 30 at 0-9 ms and 30 at 100-109 ms. The bound is 40 for a window ending by 50 ms, else 10
        // plus one for every 2 ms of it: only a short window holding the second burst goes over, the 20 ms
        // [90, 110) furthest (30 against 20; the whole run's 60 has 65).
        let mut counts = vec![0; 110];
        counts[..10].fill(3);
        counts[100..].fill(3);
        let ms = Duration::from_millis;
        let worst = worst(&counts, ms(1), ms(20), |start, end| {
            if end <= ms(50) {
                40.0
            } else {
                10.0 + (end - start).as_secs_f64() * 500.0
            }
        });
        assert_eq!((worst.start, worst.window, worst.admitted), (ms(90), ms(20), 30));
        assert!((worst.ratio - 1.5).abs() < 1e-9, "{worst}");
    }

    #[test]
    fn coarsened_slots_keep_every_admission() {
        assert_eq!(coarsened(&[1, 2, 3, 4, 5], 2), vec![3, 7, 5]);
        assert_eq!(prefix(&[1, 2, 3]), vec![0, 1, 3, 6]);
        let t = Timeline::new(Duration::from_millis(100));
        t.record_at(Duration::from_millis(5), 1);
        t.record_at(Duration::from_secs(60), 1);
        assert_eq!(t.counts().len(), 10, "past the span: in the last slot");
    }
}
