//! What a token bucket's paced leases have yet to release (mirrors the `pend` fields of `lua/token_lease.lua`).
//!
//! A paced lease takes `n` tokens from the level at once but releases them to its process's callers in chunks,
//! one every `chunk_ms` (invariant 18: one call then brings a second's spending of a process that decides 100
//! times a second, not a TTL's). The bucket remembers the grant as *pending*: `n` tokens falling linearly to 0
//! over `ceil(n / chunk) × chunk_ms`. The tokens not yet released are at most that line, and the level refills to
//! at most `capacity − pending`: the level plus what is to be released is then a token bucket that grants each
//! token when its chunk is released, so invariant 1's bound holds with the TTL counted from each release.

use super::ceil_div;

/// How a lease's grant is released: in chunks of `chunk` tokens, one every `chunk_ms` from when the lease was
/// sent, each spent within the lease TTL of its release. `chunk = 0`: not paced (all at once).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Pace {
    /// Tokens per chunk; 0 when the lease is not paced.
    pub chunk: u64,
    /// Milliseconds between two chunks.
    pub chunk_ms: u64,
}

impl Pace {
    /// Milliseconds over which a grant of `granted` tokens is released (its last chunk's release, plus one
    /// chunk's time: the line of [`Pending`] reaches 0 there); `None` when it is released at once (not paced, or
    /// one chunk).
    pub(crate) fn span_ms(&self, granted: u64) -> Option<u64> {
        (self.chunk > 0 && self.chunk_ms > 0 && granted > self.chunk)
            .then(|| ceil_div(granted, self.chunk).saturating_mul(self.chunk_ms))
    }
}

/// Tokens that paced leases were granted and have not released yet, an upper bound: `tokens` at `from_ms`,
/// falling linearly to 0 at `until_ms` (the hash's `pend`, `pend_ts` and `pend_end`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Pending {
    /// Tokens pending at `from_ms`.
    pub tokens: u64,
    /// Milliseconds at which `tokens` were pending.
    pub from_ms: u64,
    /// Milliseconds at which nothing is pending any more.
    pub until_ms: u64,
}

impl Pending {
    /// The tokens pending at `now_ms` (whole tokens, rounded up).
    pub(crate) fn at(&self, now_ms: u64) -> u64 {
        if self.tokens == 0 || now_ms >= self.until_ms {
            return 0;
        }
        if now_ms <= self.from_ms {
            return self.tokens;
        }
        let left = u128::from(self.tokens) * u128::from(self.until_ms - now_ms);
        let span = u128::from(self.until_ms - self.from_ms);
        u64::try_from(left.div_ceil(span)).unwrap_or(u64::MAX)
    }

    /// These pending tokens at `now_ms` with a grant of `granted` tokens released by `pace`: one line from the
    /// sum now to the later of the two ends (above both falls, which are convex, so still an upper bound).
    /// Unchanged when the grant is released at once.
    pub(crate) fn with(&self, granted: u64, pace: Pace, now_ms: u64) -> Self {
        let Some(span) = pace.span_ms(granted) else {
            return *self;
        };
        let pending = self.at(now_ms);
        let mut until_ms = now_ms.saturating_add(span);
        if pending > 0 {
            until_ms = until_ms.max(self.until_ms);
        }
        Self {
            tokens: pending.saturating_add(granted),
            from_ms: now_ms,
            until_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_is_pending_along_a_line_above_its_chunks() {
        // 100 tokens in chunks of 20, one every 100 ms: pending until 500 ms.
        let pace = Pace {
            chunk: 20,
            chunk_ms: 100,
        };
        let p = Pending::default().with(100, pace, 1_000);
        assert_eq!(
            p,
            Pending {
                tokens: 100,
                from_ms: 1_000,
                until_ms: 1_500
            }
        );
        // The chunks released by then: 1 at 1000, 2 at 1100, … 5 at 1400.
        for (t, released) in [(1_000, 1), (1_099, 1), (1_100, 2), (1_250, 3), (1_499, 5)] {
            assert!(p.at(t) >= 100 - 20 * released, "at {t}: {} pending", p.at(t));
        }
        assert_eq!((p.at(1_250), p.at(1_500)), (50, 0));
        // One chunk, or no pace: released at once, nothing pending.
        assert_eq!(Pending::default().with(20, pace, 0), Pending::default());
        assert_eq!(Pending::default().with(100, Pace::default(), 0), Pending::default());
    }

    #[test]
    fn grants_merge_into_one_line_above_their_sum() {
        let pace = Pace {
            chunk: 10,
            chunk_ms: 100,
        };
        let first = Pending::default().with(100, pace, 0); // 100 → 0 over [0, 1000]
        let both = first.with(20, pace, 500); // + 20 → 0 over [500, 700]
        assert_eq!((both.tokens, both.from_ms, both.until_ms), (70, 500, 1_000));
        for t in (500..1_000).step_by(7) {
            let alone = first.at(t) + Pending::default().with(20, pace, 500).at(t);
            assert!(both.at(t) >= alone, "at {t}: {} < {alone}", both.at(t));
        }
    }
}
