//! Typed, validated rules: what a `[[rule]]` of config.toml becomes, or what code builds directly.

use std::time::Duration;

use crate::algorithm::TokenBucket;

/// What the limiter does when the store fails or times out.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Deserialize, serde::Serialize,
)]
#[serde(rename_all = "lowercase")]
pub enum FailMode {
    /// Allow every call (availability first).
    Open,
    /// Refuse every call (the limit first).
    Closed,
    /// Each process enforces `1 / expected_processes` of the rule alone, in process, until the store answers.
    #[default]
    Local,
}

impl FailMode {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Closed => "closed",
            Self::Local => "local",
        }
    }
}

/// How a token-bucket rule leases batches of tokens into the process (DESIGN.md §2, invariant 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// Smallest batch asked for, in tokens (≥ 1).
    pub min_batch: u64,
    /// Largest batch asked for, in tokens (≥ `min_batch`, ≤ the capacity).
    pub max_batch: u64,
    /// How long leased tokens may be spent; what is left then goes back to the shared bucket.
    pub ttl: Duration,
}

/// A rule's algorithm and its limits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Algorithm {
    /// Token bucket (`lua/token_bucket.lua`): `capacity` tokens, `rate` more every `per`.
    TokenBucket {
        /// Bucket parameters in tokens and milliseconds.
        bucket: TokenBucket,
        /// Batches leased into the process; `None` sends every call to the store.
        lease: Option<Lease>,
    },
    /// Fixed window counter (`lua/fixed_window.lua`): `limit` tokens per window.
    FixedWindow {
        /// Tokens per window.
        limit: u64,
        /// Window length in milliseconds.
        window_ms: u64,
        /// `None`: rolling (the first hit opens the window); `Some(offset_ms)`: calendar windows starting at
        /// the times where `now_ms + offset_ms` is a multiple of the window (local midnight in UTC+08:00:
        /// 28 800 000).
        align_ms: Option<u64>,
        /// Ban after a breach, in milliseconds (0 = none).
        ban_ms: u64,
    },
    /// Sliding-window log (`lua/sliding_log.lua`): at most `limit` tokens in any window-long span.
    SlidingLog {
        /// Tokens per window.
        limit: u64,
        /// Window length in milliseconds.
        window_ms: u64,
        /// Ban after a breach, in milliseconds (0 = none).
        ban_ms: u64,
    },
    /// Sliding-window counter of sub-buckets (`lua/sliding_window.lua`, seed 004).
    SlidingWindow {
        /// Tokens per window.
        limit: u64,
        /// Window length in milliseconds.
        window_ms: u64,
        /// Sub-buckets per window.
        sub_buckets: u64,
        /// Ban after a breach, in milliseconds (0 = none).
        ban_ms: u64,
    },
    /// Leaky bucket queue (`lua/leaky_bucket.lua`): `rate` tokens leak every `per_ms`; callers wait for their slot.
    LeakyBucket {
        /// Tokens per `per_ms`.
        rate: u64,
        /// Period in milliseconds.
        per_ms: u64,
        /// The longest a caller may wait, in milliseconds: the queue's bound.
        max_wait_ms: u64,
    },
}

impl Algorithm {
    /// The config spelling of the algorithm.
    pub fn name(&self) -> &'static str {
        match self {
            Self::TokenBucket { .. } => "token_bucket",
            Self::FixedWindow { .. } => "fixed_window",
            Self::SlidingLog { .. } => "sliding_log",
            Self::SlidingWindow { .. } => "sliding_window",
            Self::LeakyBucket { .. } => "leaky_bucket",
        }
    }

    /// The most one call can ever be granted, in tokens: larger costs get [`crate::Error::CostAboveCapacity`].
    pub fn capacity(&self) -> u64 {
        match self {
            Self::TokenBucket { bucket, .. } => bucket.capacity,
            Self::FixedWindow { limit, .. }
            | Self::SlidingLog { limit, .. }
            | Self::SlidingWindow { limit, .. } => *limit,
            Self::LeakyBucket { rate, .. } => *rate,
        }
    }
}

/// A named rule: what to limit and how.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    /// The rule's name: the first argument of [`crate::Limiter::check`] and the `rule` label of every metric.
    pub name: String,
    /// The algorithm and its limits.
    pub algorithm: Algorithm,
    /// Overrides the limiter's `fail_mode` for this rule.
    pub fail_mode: Option<FailMode>,
}

impl Rule {
    /// A token-bucket rule: `capacity` tokens (the burst), refilled with `rate` tokens every `per`.
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] when `capacity` is 0, `per` is under a millisecond, or the numbers
    /// exceed what the scripts compute exactly (capacity × per in ms and rate × per in ms below 2^53).
    pub fn token_bucket(
        name: impl Into<String>,
        capacity: u64,
        rate: u64,
        per: Duration,
    ) -> Result<Self, crate::Error> {
        let bucket = token_bucket_params(capacity, rate, per)
            .map_err(|(name, reason)| crate::Error::InvalidArgument { name, reason })?;
        Ok(Self {
            name: name.into(),
            algorithm: Algorithm::TokenBucket {
                bucket,
                lease: None,
            },
            fail_mode: None,
        })
    }

    /// Leases batches of this token-bucket rule into the process.
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] when the rule is not a token bucket, `min_batch` is 0,
    /// `max_batch < min_batch`, `max_batch` exceeds the capacity, or `ttl` is zero.
    pub fn with_lease(mut self, lease: Lease) -> Result<Self, crate::Error> {
        let Algorithm::TokenBucket {
            bucket,
            lease: slot,
        } = &mut self.algorithm
        else {
            return Err(crate::Error::InvalidArgument {
                name: "lease",
                reason: format!(
                    "only token_bucket rules lease, not {}",
                    self.algorithm.name()
                ),
            });
        };
        validate_lease(&lease, bucket.capacity)
            .map_err(|(name, reason)| crate::Error::InvalidArgument { name, reason })?;
        *slot = Some(lease);
        Ok(self)
    }

    /// Sets this rule's own `fail_mode`.
    pub fn with_fail_mode(mut self, mode: FailMode) -> Self {
        self.fail_mode = Some(mode);
        self
    }

    /// The lease settings, when the rule leases.
    pub fn lease(&self) -> Option<&Lease> {
        match &self.algorithm {
            Algorithm::TokenBucket { lease, .. } => lease.as_ref(),
            _ => None,
        }
    }
}

/// Checks token-bucket parameters; the error names the field.
pub(crate) fn token_bucket_params(
    capacity: u64,
    rate: u64,
    per: Duration,
) -> Result<TokenBucket, (&'static str, String)> {
    if capacity == 0 {
        return Err(("capacity", "must be at least 1 token".into()));
    }
    let per_ms = whole_ms(per, "per")?;
    let bucket = TokenBucket {
        capacity,
        rate,
        per_ms,
    };
    if !bucket.is_exact_in_lua() {
        return Err((
            "capacity",
            format!("capacity × per and rate × per must stay below 2^53 token·ms (capacity {capacity}, rate {rate}, per {per_ms} ms)"),
        ));
    }
    Ok(bucket)
}

/// A duration as whole milliseconds: at least 1, below 2^53 (exact in the scripts); the error names the field.
pub(crate) fn whole_ms(d: Duration, field: &'static str) -> Result<u64, (&'static str, String)> {
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 || !d.subsec_nanos().is_multiple_of(1_000_000) {
        return Err((
            field,
            format!("must be a whole number of milliseconds, at least 1ms (got {d:?})"),
        ));
    }
    if ms >= crate::algorithm::MAX_EXACT {
        return Err((field, "is too long".into()));
    }
    Ok(ms)
}

/// Checks lease settings against the bucket's capacity; the error names the field.
pub(crate) fn validate_lease(lease: &Lease, capacity: u64) -> Result<(), (&'static str, String)> {
    if lease.min_batch == 0 {
        return Err(("lease.min_batch", "must be at least 1 token".into()));
    }
    if lease.max_batch < lease.min_batch {
        return Err((
            "lease.max_batch",
            format!("must be at least min_batch ({})", lease.min_batch),
        ));
    }
    if lease.max_batch > capacity {
        return Err((
            "lease.max_batch",
            format!("must not exceed the capacity ({capacity} tokens)"),
        ));
    }
    if lease.ttl.is_zero() {
        return Err(("lease.ttl", "must be longer than zero".into()));
    }
    Ok(())
}
