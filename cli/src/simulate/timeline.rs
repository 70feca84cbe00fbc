//! The admitted decisions in 10 ms buckets of virtual time, and invariant 1 checked on every window: the most
//! admitted in any window of length W, against its bound capacity + rate × (W + lease ttl), for every W from
//! 0.2 s to the whole run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::report::Setup;

/// A bucket's length, in milliseconds of virtual time.
const BUCKET_MS: u64 = 10;

/// The shortest window checked, in milliseconds.
const SHORTEST_WINDOW_MS: u64 = 200;

/// Buckets the window check works on at most: a longer run is looked at through coarser buckets (windows then
/// start and end on their edges), so the check stays within about 18 million sums.
const MAX_BUCKETS: usize = 6_000;

/// Allowed decisions counted per 10 ms of virtual time since the start of the sale.
#[derive(Debug)]
pub(super) struct Timeline {
    buckets: Vec<AtomicU64>,
    /// Buckets of the sale itself (the rest take decisions that finished after its end).
    sale: usize,
}

impl Timeline {
    /// A timeline of a sale of `duration`, with a second more for decisions that finish after it.
    pub(super) fn new(duration: Duration) -> Self {
        let sale = usize::try_from(duration.as_millis().div_ceil(u128::from(BUCKET_MS))).unwrap_or(usize::MAX);
        let tail = usize::try_from(1000 / BUCKET_MS).unwrap_or(0);
        Self {
            buckets: (0..sale.saturating_add(tail).max(1))
                .map(|_| AtomicU64::new(0))
                .collect(),
            sale,
        }
    }

    /// Counts one admitted token at `elapsed` since the start (past the tail: in the last bucket).
    pub(super) fn admit(&self, elapsed: Duration) {
        let i = usize::try_from(elapsed.as_millis() / u128::from(BUCKET_MS)).unwrap_or(usize::MAX);
        if let Some(bucket) = self.buckets.get(i).or_else(|| self.buckets.last()) {
            bucket.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The counts per 10 ms bucket: the sale's, and those after it up to the last one admitted.
    pub(super) fn admitted(&self) -> Vec<u64> {
        let mut counts: Vec<u64> = self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect();
        let used = counts.iter().rposition(|&n| n > 0).map_or(0, |i| i + 1);
        counts.truncate(used.max(self.sale));
        counts
    }
}

/// Admitted per second (the last one may be partial).
pub(super) fn per_second(admitted: &[u64]) -> Vec<u64> {
    let per = usize::try_from(1000 / BUCKET_MS).unwrap_or(1);
    admitted.chunks(per).map(|c| c.iter().sum()).collect()
}

/// The window that came closest to its bound (or went furthest over it).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Worst {
    /// Admitted in the window over its bound: at most 1 while invariant 1 holds.
    pub(crate) ratio: f64,
    /// The window's length, in seconds.
    pub(crate) length_s: f64,
    /// When it started, in seconds since the start of the sale.
    pub(crate) at_s: f64,
    /// Tokens admitted in it.
    pub(crate) admitted: u64,
    /// Its bound, in tokens: capacity + rate × (length + lease ttl).
    pub(crate) bound: f64,
}

/// The worst window of the run, over every window length from 0.2 s to the whole run.
pub(super) fn worst_window(admitted: &[u64], setup: &Setup) -> Worst {
    let factor = admitted.len().div_ceil(MAX_BUCKETS).max(1);
    let coarse: Vec<u64> = admitted.chunks(factor).map(|c| c.iter().sum()).collect();
    let bucket_s = (BUCKET_MS as f64 / 1000.0) * factor as f64;
    let mut prefix = Vec::with_capacity(coarse.len() + 1);
    prefix.push(0u64);
    for n in &coarse {
        prefix.push(prefix.last().copied().unwrap_or(0) + n);
    }
    let n = coarse.len();
    let shortest = usize::try_from(SHORTEST_WINDOW_MS.div_ceil(BUCKET_MS))
        .unwrap_or(1)
        .div_ceil(factor);
    let ttl_s = setup.ttl.as_secs_f64();
    let mut worst = Worst::default();
    for w in shortest.max(1)..=n {
        let (most, at) = (0..=n - w)
            .map(|t| (prefix[t + w] - prefix[t], t))
            .max_by_key(|&(sum, t)| (sum, std::cmp::Reverse(t)))
            .unwrap_or((0, 0));
        let length_s = w as f64 * bucket_s;
        let bound = setup.capacity as f64 + setup.rate_per_s * (length_s + ttl_s);
        let ratio = most as f64 / bound;
        if ratio > worst.ratio {
            worst = Worst {
                ratio,
                length_s,
                at_s: at as f64 * bucket_s,
                admitted: most,
                bound,
            };
        }
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(capacity: u64, rate_per_s: f64, ttl_ms: u64) -> Setup {
        Setup {
            processes: 1,
            expected: None,
            rtt_ms: 0.0,
            duration: Duration::from_secs(1),
            demand_per_s: 1,
            skew: false,
            rule: "r".into(),
            capacity,
            rate_per_s,
            lease: None,
            ttl: Duration::from_millis(ttl_ms),
        }
    }

    #[test]
    fn the_worst_window_is_found_at_its_length_and_place() {
        // 1 s of sale, 100 buckets: 100 tokens at 0.5 s, 1 token in every other bucket.
        let mut admitted = vec![1; 100];
        admitted[50] = 100;
        // capacity 50, 100/s, ttl 0: a 0.2 s window may hold 70; the one with the burst holds 119.
        let worst = worst_window(&admitted, &setup(50, 100.0, 0));
        assert!((worst.ratio - 119.0 / 70.0).abs() < 1e-9, "{worst:?}");
        assert!((worst.length_s - 0.2).abs() < 1e-9, "{worst:?}");
        assert_eq!(worst.admitted, 119);
        assert!(worst.at_s <= 0.5 && worst.at_s > 0.3, "{worst:?}");
    }

    #[test]
    fn the_timeline_keeps_the_sale_and_what_came_after_it() {
        let timeline = Timeline::new(Duration::from_millis(100));
        timeline.admit(Duration::from_millis(5));
        timeline.admit(Duration::from_millis(95));
        assert_eq!(timeline.admitted().len(), 10, "the sale's 10 buckets, nothing after it");
        timeline.admit(Duration::from_millis(150));
        timeline.admit(Duration::from_secs(60));
        let admitted = timeline.admitted();
        assert_eq!(admitted.len(), 110, "up to the last bucket of the tail");
        assert_eq!(admitted.iter().sum::<u64>(), 4);
        assert_eq!(per_second(&admitted), vec![3, 1], "the last one in the tail's second");
    }
}
