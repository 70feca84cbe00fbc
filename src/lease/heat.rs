//! Which keys of a leased rule are hot: [`Heat`], a count-min sketch of the decisions made on keys that do not
//! lease (Cormode and Muthukrishnan, "An improved data stream summary: the count-min sketch", 2005), aged by
//! halving every counter once per lease TTL (as TinyLFU ages its sketch: Einziger, Friedman and Manes, 2017).
//!
//! Its memory is fixed, 128 KiB per leased rule whatever the number of keys, made on the rule's first cold
//! decision. A key's estimate is never below its true count of the recent periods (a count-min sketch only
//! overestimates, and conservative update keeps the overestimate small); with 10^6 distinct keys deciding
//! within one period, a key is overestimated by about 2.7 × decisions / 16384 per period.

use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};

/// Rows (independent hash functions).
const DEPTH: usize = 4;
/// Counters per row (a power of two).
const WIDTH: usize = 1 << 14;

/// The fewest decisions an estimate must hold to say anything of a key: 10^5 keys decided 40 000 times a second,
/// all cold, put the counters at about 1, so a key estimated at 3 is a false positive only about once in 200
/// decisions. The floor of the default `hot_after` and of a rate read from an estimate ([`Heat::per_s`]).
pub(crate) const FEWEST_TELLING: u64 = 3;

/// A count-min sketch of recent decisions per key.
#[derive(Debug)]
pub(crate) struct Heat {
    counters: Box<[AtomicU16]>,
    /// The period after which every counter is halved, in ns (the rule's lease TTL).
    period_ns: u64,
    /// When the current period began: a caller that moves it on (one compare-and-swap) halves the counters.
    period_start_ns: AtomicU64,
}

impl Heat {
    /// An empty sketch halved every `period_ns`.
    pub(crate) fn new(period_ns: u64, now_ns: u64) -> Self {
        Self {
            counters: (0..DEPTH * WIDTH).map(|_| AtomicU16::new(0)).collect(),
            period_ns: period_ns.max(1),
            period_start_ns: AtomicU64::new(now_ns),
        }
    }

    /// The decisions a second that an `estimate` of this sketch stands for: a key decided steadily `r` times per
    /// period reaches about `2r` (each period's count halved at the next). `None` under [`FEWEST_TELLING`]
    /// decisions, too few to tell a rate (a rule with `hot_after = 1` leases a key at its first decision).
    pub(crate) fn per_s(&self, estimate: u64) -> Option<u64> {
        if estimate < FEWEST_TELLING {
            return None;
        }
        let per_s = u128::from(estimate) * 1_000_000_000 / (2 * u128::from(self.period_ns));
        Some(u64::try_from(per_s).unwrap_or(u64::MAX))
    }

    /// The counter indexes of a key's 64-bit hash, one per row (Kirsch and Mitzenmacher's double hashing).
    fn cells(hash: u64) -> [usize; DEPTH] {
        let (h1, h2) = (hash as u32 as usize, ((hash >> 32) as usize) | 1);
        std::array::from_fn(|row| row * WIDTH + (h1.wrapping_add(row.wrapping_mul(h2)) & (WIDTH - 1)))
    }

    /// Counts one decision of the key with this `hash` and returns its estimate: decisions in the current
    /// period plus half those of the one before, a quarter of the one before that, and so on.
    pub(crate) fn observe(&self, hash: u64, now_ns: u64) -> u64 {
        self.age(now_ns);
        let cells = Self::cells(hash);
        let counts = self.counts(cells);
        let min = counts.iter().copied().min().unwrap_or(0);
        // Conservative update: only the counters at the minimum grow.
        for (i, count) in cells.into_iter().zip(counts) {
            if count == min && count < u16::MAX {
                self.counters[i].fetch_add(1, Ordering::Relaxed);
            }
        }
        u64::from(min) + 1
    }

    /// The estimate of the key with this `hash`, as [`Self::observe`] returns it, without counting a decision.
    pub(crate) fn estimate(&self, hash: u64) -> u64 {
        u64::from(self.counts(Self::cells(hash)).into_iter().min().unwrap_or(0))
    }

    /// The counters at these cells.
    fn counts(&self, cells: [usize; DEPTH]) -> [u16; DEPTH] {
        cells.map(|i| self.counters[i].load(Ordering::Relaxed))
    }

    /// Makes the key with this `hash` at least `count` hot at once (its cells raised to it): the store showed
    /// that other processes spend its bucket, so it pays for a lease already.
    pub(crate) fn raise(&self, hash: u64, count: u64) {
        let count = u16::try_from(count).unwrap_or(u16::MAX);
        for i in Self::cells(hash) {
            self.counters[i].fetch_max(count, Ordering::Relaxed);
        }
    }

    /// Halves every counter once a period has passed (one caller does it; the others go on).
    fn age(&self, now_ns: u64) {
        let start = self.period_start_ns.load(Ordering::Relaxed);
        let Some(shift) = self.claim(start, now_ns) else {
            return;
        };
        for counter in self.counters.iter() {
            let count = counter.load(Ordering::Relaxed);
            if count > 0 {
                counter.store(count.checked_shr(shift).unwrap_or(0), Ordering::Relaxed);
            }
        }
    }

    /// Claims the halving of the periods passed since `start` (the period's start as the caller read it) by
    /// moving the period's start on: the halvings to make (a shift), or `None` when no period has passed or
    /// another caller claimed them first. One compare-and-swap, so a caller that read the start before another
    /// claimed it never halves the same periods again.
    fn claim(&self, start: u64, now_ns: u64) -> Option<u32> {
        let periods = now_ns.saturating_sub(start) / self.period_ns;
        if periods == 0 {
            return None;
        }
        let next = start.saturating_add(periods.saturating_mul(self.period_ns));
        self.period_start_ns
            .compare_exchange(start, next, Ordering::AcqRel, Ordering::Relaxed)
            .ok()?;
        Some(u32::try_from(periods).unwrap_or(u32::MAX).min(16))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    fn hash(key: &str) -> u64 {
        foldhash::fast::FixedState::with_seed(1).hash_one(key)
    }

    #[test]
    fn a_raised_key_is_as_hot_at_once_and_its_neighbours_are_not() {
        let heat = Heat::new(1_000, 0);
        heat.raise(7, 2);
        assert_eq!(heat.estimate(7), 2);
        assert_eq!(heat.observe(7, 1), 3, "two raised, one observed");
        assert_eq!(heat.estimate(7), 3, "the estimate counts nothing");
        assert_eq!(heat.observe(8, 1), 1, "another key is not raised");
        // Raising never lowers.
        heat.raise(7, 1);
        assert_eq!(heat.observe(7, 2), 4);
    }

    #[test]
    fn a_key_heats_with_its_decisions_and_cools_by_half_each_period() {
        let heat = Heat::new(100, 0);
        let hot = hash("sku:1");
        for i in 1..=40 {
            assert_eq!(heat.observe(hot, 10), i, "alone, the estimate is exact");
        }
        // Two periods later the 40 are worth 10.
        assert_eq!(heat.observe(hot, 250), 11);
        assert_eq!(heat.observe(hot, 260), 12, "and counting goes on");
        // A sixteenth period of silence forgets it.
        assert_eq!(heat.observe(hot, 2000), 1);
    }

    #[test]
    fn a_caller_that_read_the_period_before_another_aged_it_does_not_halve_again() {
        let heat = Heat::new(100, 0);
        let hot = hash("sku:1");
        for _ in 0..40 {
            heat.observe(hot, 10);
        }
        // Two callers read the start (0) at 150 ns; the first claims the period and halves the counters.
        let seen = heat.period_start_ns.load(Ordering::Relaxed);
        assert_eq!(heat.claim(seen, 150), Some(1));
        // The second, on what it read before, claims nothing: halving again would make the 40 worth 10.
        assert_eq!(heat.claim(seen, 150), None);
        assert_eq!(heat.period_start_ns.load(Ordering::Relaxed), 100);
        assert_eq!(heat.claim(100, 150), None, "the next period has not passed");
        assert_eq!(
            heat.claim(100, 320),
            Some(2),
            "two periods later: two halvings, claimed once"
        );
    }

    #[test]
    fn many_cold_keys_barely_warm_a_key() {
        let heat = Heat::new(u64::MAX, 0);
        for k in 0..100_000 {
            heat.observe(hash(&format!("user:{k}")), 1);
        }
        let worst = (0..1000)
            .map(|k| heat.observe(hash(&format!("other:{k}")), 1))
            .max()
            .unwrap_or(0);
        // 100 000 decisions over 16 384 counters per row: about 6 each, less with four rows and conservative update.
        assert!(worst <= 8, "an unseen key is estimated at {worst}");
    }
}
