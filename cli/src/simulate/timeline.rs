//! The sizing run's admissions on the shared timeline (`tokenlease-timeline`, the tests' checker too), and
//! invariant 1 checked on every window: the most admitted in any window of length W, against its bound
//! capacity + rate × (W + lease ttl), for every W from 0.2 s to the whole run.

use std::time::Duration;

use tokenlease_timeline::{coarsened, worst, Worst, SLOT};

/// The shortest window checked.
const SHORTEST_WINDOW: Duration = Duration::from_millis(200);

/// Slots the window check works on at most: a longer run is looked at through coarser slots (windows then start
/// and end on their edges), so the check stays within about 18 million sums.
const MAX_SLOTS: usize = 6_000;

/// A timeline for a sale of `duration`, with a second more for decisions that finish after it.
pub(super) fn for_sale(duration: Duration) -> tokenlease_timeline::Timeline {
    tokenlease_timeline::Timeline::new(duration + Duration::from_secs(1))
}

/// The counts per slot of `timeline`: the sale's `duration`, and after it up to the last one admitted.
pub(super) fn admitted(timeline: &tokenlease_timeline::Timeline, duration: Duration) -> Vec<u64> {
    let mut counts = timeline.counts();
    let sale = usize::try_from(duration.as_millis().div_ceil(SLOT.as_millis())).unwrap_or(usize::MAX);
    if counts.len() < sale {
        counts.resize(sale, 0);
    }
    counts
}

/// Admitted per second (the last one may be partial).
pub(super) fn per_second(admitted: &[u64]) -> Vec<u64> {
    let per = usize::try_from(Duration::from_secs(1).as_millis() / SLOT.as_millis()).unwrap_or(1);
    coarsened(admitted, per)
}

/// The worst window of the run, over every window length from 0.2 s to the whole run, against `capacity` +
/// `rate_per_s` × (W + `ttl`).
pub(super) fn worst_window(admitted: &[u64], (capacity, rate_per_s, ttl): (u64, f64, Duration)) -> Worst {
    let factor = admitted.len().div_ceil(MAX_SLOTS).max(1);
    let slot = SLOT * u32::try_from(factor).unwrap_or(u32::MAX);
    worst(&coarsened(admitted, factor), slot, SHORTEST_WINDOW, |start, end| {
        capacity as f64 + rate_per_s * (end - start + ttl).as_secs_f64()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_window_is_found_at_its_length_and_place() {
        // 1 s of sale, 100 slots: 100 tokens at 0.5 s, 1 token in every other slot.
        let mut admitted = vec![1; 100];
        admitted[50] = 100;
        // capacity 50, 100/s, ttl 0: a 0.2 s window may hold 70; the one with the burst holds 119.
        let worst = worst_window(&admitted, (50, 100.0, Duration::ZERO));
        assert!((worst.ratio - 119.0 / 70.0).abs() < 1e-9, "{worst:?}");
        assert_eq!(worst.window, Duration::from_millis(200), "{worst:?}");
        assert_eq!(worst.admitted, 119);
        assert!(
            worst.start <= Duration::from_millis(500) && worst.start > Duration::from_millis(300),
            "{worst:?}"
        );
    }

    #[test]
    fn the_timeline_keeps_the_sale_and_what_came_after_it() {
        let timeline = for_sale(Duration::from_millis(100));
        timeline.record_at(Duration::from_millis(5), 1);
        timeline.record_at(Duration::from_millis(95), 1);
        let sale = Duration::from_millis(100);
        assert_eq!(
            admitted(&timeline, sale).len(),
            10,
            "the sale's 10 slots, nothing after it"
        );
        timeline.record_at(Duration::from_millis(150), 1);
        timeline.record_at(Duration::from_secs(60), 1);
        let admitted = admitted(&timeline, sale);
        assert_eq!(admitted.len(), 110, "up to the last slot of the tail");
        assert_eq!(admitted.iter().sum::<u64>(), 4);
        assert_eq!(per_second(&admitted), vec![3, 1], "the last one in the tail's second");
    }
}
