//! The SKUs of a multi-key flash sale (`--keys N --zipf S`): each decision's key drawn from N keys,
//! Zipf-distributed, and each key's admitted decisions and leases tallied per process, merged across processes and
//! checked against the key's own bound.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rand::rngs::SmallRng;
use rand::SeedableRng as _;
use rand_distr::{Distribution as _, Zipf};
use serde::{Deserialize, Serialize};

/// The most SKUs a run may have: each process keeps 9 bytes per key, the coordinator 9 more.
pub(super) const MAX_KEYS: u32 = 1_000_000;

/// Draws SKU indexes `0..n`: index `i` (rank `i + 1`) with probability ∝ `1 / (i + 1)^s`, uniform for `s = 0`.
///
/// The distribution is `rand_distr::Zipf` (rejection sampling after Jason Crease, "Rejection sampling the Zipf
/// distribution", 2019); the generator a `SmallRng` seeded per task, so that tasks draw different sequences.
pub(super) struct SkuDraw {
    zipf: Zipf<f64>,
    rng: SmallRng,
    n: u32,
    /// `sku:{run_id}:` followed by the last index drawn.
    key: String,
    prefix_len: usize,
}

impl SkuDraw {
    /// A draw over `n` ≥ 1 keys `sku:{run_id}:{i}` with exponent `s` ≥ 0, seeded with `seed`.
    pub(super) fn new(run_id: u64, n: u32, s: f64, seed: u64) -> Result<Self, String> {
        let zipf = Zipf::new(f64::from(n), s).map_err(|e| format!("--keys {n} --zipf {s}: {e}"))?;
        let key = format!("sku:{run_id}:");
        Ok(Self {
            zipf,
            rng: SmallRng::seed_from_u64(seed),
            n,
            prefix_len: key.len(),
            key,
        })
    }

    /// The next key's index and name.
    pub(super) fn next(&mut self) -> (usize, &str) {
        // Zipf samples ranks 1..=n as floats; the cast saturates and the clamp keeps the index in range.
        let rank = (self.zipf.sample(&mut self.rng) as u32).clamp(1, self.n);
        let index = rank - 1;
        self.key.truncate(self.prefix_len);
        let _ = write!(self.key, "{index}");
        (index as usize, &self.key)
    }
}

/// One process's per-key tally, shared by its tasks: admitted decisions, and whether any decision came from a lease.
pub(super) struct Tally {
    admitted: Box<[AtomicU64]>,
    leased: Box<[AtomicBool]>,
}

impl Tally {
    pub(super) fn new(n: u32) -> Self {
        Self {
            admitted: (0..n).map(|_| AtomicU64::new(0)).collect(),
            leased: (0..n).map(|_| AtomicBool::new(false)).collect(),
        }
    }

    /// Counts a decision on key `index`: `allowed`, and made from leased tokens (`Source::Local`) when `leased`.
    pub(super) fn record(&self, index: usize, allowed: bool, leased: bool) {
        if allowed {
            if let Some(a) = self.admitted.get(index) {
                a.fetch_add(1, Ordering::Relaxed);
            }
        }
        if leased {
            // Read first: once set, the flag's cache line is only read.
            if let Some(l) = self.leased.get(index).filter(|l| !l.load(Ordering::Relaxed)) {
                l.store(true, Ordering::Relaxed);
            }
        }
    }

    /// The tally as a worker reports it: only the keys that admitted or leased.
    pub(super) fn counts(&self) -> KeyCounts {
        let index = |i: usize| u32::try_from(i).unwrap_or(u32::MAX);
        KeyCounts {
            admitted: (self.admitted.iter().enumerate())
                .map(|(i, a)| (index(i), a.load(Ordering::Relaxed)))
                .filter(|&(_, a)| a > 0)
                .collect(),
            leased: (self.leased.iter().enumerate())
                .filter(|(_, l)| l.load(Ordering::Relaxed))
                .map(|(i, _)| index(i))
                .collect(),
        }
    }
}

/// A worker's per-key counts, compact: `[index, admitted]` pairs of the keys that admitted any, and the indexes of
/// the keys that had a decision from a lease.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct KeyCounts {
    pub(super) admitted: Vec<(u32, u64)>,
    pub(super) leased: Vec<u32>,
}

/// The per-key figures of a run, the workers' counts merged.
#[derive(Debug, Default, PartialEq)]
pub(super) struct KeyFigures {
    /// Distinct keys that had a decision from a lease in any process.
    pub(super) hot_keys: u64,
    /// Keys whose admitted exceeds their own bound (invariant 1 per key: must be 0).
    pub(super) over_bound_keys: u64,
    /// The most any one key admitted.
    pub(super) max_admitted: u64,
}

/// Merges the workers' counts over `n` keys and checks each key against `bound`.
///
/// # Errors
/// A worker reported an index outside `0..n`.
pub(super) fn figures<'a>(
    n: u32,
    workers: impl IntoIterator<Item = &'a KeyCounts>,
    bound: f64,
) -> Result<KeyFigures, String> {
    let len = n as usize;
    let (mut admitted, mut leased) = (vec![0u64; len], vec![false; len]);
    let out_of_range = |i: u32| format!("a worker reported key {i} of {n}");
    for w in workers {
        for &(i, a) in &w.admitted {
            *admitted.get_mut(i as usize).ok_or_else(|| out_of_range(i))? += a;
        }
        for &i in &w.leased {
            *leased.get_mut(i as usize).ok_or_else(|| out_of_range(i))? = true;
        }
    }
    Ok(KeyFigures {
        hot_keys: leased.iter().filter(|&&l| l).count() as u64,
        over_bound_keys: admitted.iter().filter(|&&a| a as f64 > bound).count() as u64,
        max_admitted: admitted.iter().copied().max().unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_stay_in_range_and_zipf_favours_the_first_keys() {
        let mut draw = SkuDraw::new(7, 100, 1.1, 1).unwrap_or_else(|e| panic!("{e}"));
        let mut seen = [0u32; 100];
        for _ in 0..20_000 {
            let (i, key) = draw.next();
            assert_eq!(key, format!("sku:7:{i}"));
            seen[i] += 1;
        }
        assert!(seen[0] > 5 * seen[50], "{seen:?}");
        let mut uniform = SkuDraw::new(7, 4, 0.0, 2).unwrap_or_else(|e| panic!("{e}"));
        let mut seen = [0u32; 4];
        (0..4_000).for_each(|_| seen[uniform.next().0] += 1);
        assert!(seen.iter().all(|&c| (800..1200).contains(&c)), "{seen:?}");
    }

    #[test]
    fn merges_workers_and_counts_keys_over_their_bound() {
        let (a, b) = (Tally::new(4), Tally::new(4));
        (0..6).for_each(|_| a.record(1, true, true));
        (0..5).for_each(|_| b.record(1, true, false));
        b.record(2, true, true);
        b.record(3, false, false);
        let counts = [a.counts(), b.counts()];
        assert_eq!(counts[1].admitted, vec![(1, 5), (2, 1)]);
        let f = figures(4, &counts, 10.0).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            f,
            KeyFigures {
                hot_keys: 2,
                over_bound_keys: 1,
                max_admitted: 11
            }
        );
        assert!(figures(2, &counts, 10.0).is_err());
    }
}
