//! The rule's limits as the report states them, and invariant 1: the most the rule may admit on one key over a span.

use tokenlease::Algorithm;

/// The rule's limits as the report states them, and the most it may admit on one key over a span.
pub(super) struct Limits {
    /// Tokens: a bucket's capacity, a window's limit.
    pub(super) capacity: u64,
    /// Tokens per second over the long run.
    pub(super) rate_per_s: f64,
    pub(super) lease_ttl_s: f64,
    /// `None` for a token bucket; the window in seconds and the extra windows a span may touch otherwise.
    window: Option<(f64, f64)>,
}

impl Limits {
    pub(super) fn of(algorithm: &Algorithm, no_lease: bool) -> Option<Self> {
        let window = |limit: u64, window_ms: u64, extra: f64| Limits {
            capacity: limit,
            rate_per_s: limit as f64 * 1000.0 / window_ms as f64,
            lease_ttl_s: 0.0,
            window: Some((window_ms as f64 / 1000.0, extra)),
        };
        Some(match algorithm {
            Algorithm::TokenBucket { bucket, lease, .. } => Limits {
                capacity: bucket.capacity,
                rate_per_s: bucket.rate as f64 * 1000.0 / bucket.per_ms as f64,
                lease_ttl_s: if no_lease {
                    0.0
                } else {
                    lease.map_or(0.0, |l| l.ttl.as_secs_f64())
                },
                window: None,
            },
            // Any window-long span holds at most `limit`.
            Algorithm::SlidingLog { limit, window_ms, .. } => window(*limit, *window_ms, 0.0),
            // A span crosses one window boundary more than it holds windows.
            Algorithm::FixedWindow { limit, window_ms, .. } => window(*limit, *window_ms, 1.0),
            // The counter forgets a sub-bucket early: one more window's worth at worst.
            Algorithm::SlidingWindow { limit, window_ms, .. } => window(*limit, *window_ms, 1.0),
            _ => return None,
        })
    }

    /// Invariant 1 for a token bucket: capacity + rate × (span + lease ttl); for a window rule:
    /// limit × (⌈span / window⌉ + extra).
    pub(super) fn bound(&self, span_s: f64) -> f64 {
        match self.window {
            None => self.capacity as f64 + self.rate_per_s * (span_s + self.lease_ttl_s),
            Some((w, extra)) => self.capacity as f64 * ((span_s / w).ceil().max(1.0) + extra),
        }
    }
}
