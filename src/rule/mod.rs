//! Typed, validated rules: what a `[[rule]]` of config.toml becomes, or what code builds directly.

use std::time::Duration;

use crate::algorithm::TokenBucket;

mod lease;
mod validate;
mod zone;

pub use lease::Lease;

pub(crate) use crate::clock::wall_clock_ms;
pub(crate) use validate::{
    check_name, check_sub_buckets, invalid, leaky_params, parse_utc_offset, positive, token_bucket_params,
    validate_lease, whole_ms, window_params, FieldError, NO_BAN_WITH_LEASE,
};
pub use zone::{Calendar, Zone};

/// What the limiter does when the store fails or times out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FailMode {
    /// Allow every call (availability first).
    Open,
    /// Refuse every call (the limit first); the default. A hot key of a leased rule still spends what the store
    /// granted it before the fault: its leased batches within their TTL and its paced chunks.
    #[default]
    Closed,
    /// As `closed`, and a hot key also sells its *reserve*: tokens the store holds for this process while it
    /// reaches the store (about [`crate::Lease::reserve`] of its share of the rate), sold over that long once the
    /// store fails, then refused. A process sells only what the store granted it before the fault, never on
    /// credit (the change from earlier versions: CHANGELOG.md). Cold keys, window rules and queues refuse as
    /// under `closed`.
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
        /// Ban after a refusal, in milliseconds (0 = none; only without a lease).
        ban_ms: u64,
    },
    /// Fixed window counter (`lua/fixed_window.lua`): `limit` tokens per window.
    FixedWindow {
        /// Tokens per window.
        limit: u64,
        /// Window length in milliseconds.
        window_ms: u64,
        /// `None`: rolling (the first hit opens the window); `Some`: calendar windows of a fixed UTC offset
        /// or an IANA time zone.
        calendar: Option<Calendar>,
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

    /// The quota this algorithm grants, as advertised to HTTP clients (the `q` and `w` of the IETF draft's
    /// `RateLimit-Policy`, draft-ietf-httpapi-ratelimit-headers): `limit` tokens per window. A token bucket's
    /// window is the time to refill its whole capacity (none when its rate is 0); a leaky bucket's is `per`.
    pub fn quota(&self) -> Quota {
        let window = |ms: u64| Some(Duration::from_millis(ms));
        match self {
            Self::TokenBucket { bucket, .. } => Quota {
                limit: bucket.capacity,
                window: (bucket.rate > 0).then(|| {
                    let ms = u128::from(bucket.capacity) * u128::from(bucket.per_ms) / u128::from(bucket.rate);
                    Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
                }),
            },
            Self::FixedWindow { limit, window_ms, .. }
            | Self::SlidingLog { limit, window_ms, .. }
            | Self::SlidingWindow { limit, window_ms, .. } => Quota {
                limit: *limit,
                window: window(*window_ms),
            },
            Self::LeakyBucket { rate, per_ms, .. } => Quota {
                limit: *rate,
                window: window(*per_ms),
            },
        }
    }

    /// The most one call can ever be granted, in tokens: larger costs get [`crate::Error::CostAboveCapacity`].
    pub fn capacity(&self) -> u64 {
        match self {
            Self::TokenBucket { bucket, .. } => bucket.capacity,
            Self::FixedWindow { limit, .. } | Self::SlidingLog { limit, .. } | Self::SlidingWindow { limit, .. } => {
                *limit
            }
            Self::LeakyBucket { rate, .. } => *rate,
        }
    }
}

/// A rule's quota: `limit` tokens per `window` (see [`Algorithm::quota`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Tokens per window.
    pub limit: u64,
    /// The window; `None` when the allowance never comes back (a token bucket with rate 0).
    pub window: Option<Duration>,
}

/// A named rule: what to limit and how.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    /// The rule's name: the first argument of [`crate::Limiter::check`] and the `rule` label of every metric.
    /// ASCII letters, digits, `_`, `.` and `-` only, as the constructors and the config check: it is part of every
    /// store key (invariant 14).
    pub name: String,
    /// The algorithm and its limits.
    pub algorithm: Algorithm,
    /// Overrides the limiter's `fail_mode` for this rule.
    pub fail_mode: Option<FailMode>,
    /// Other limits for keys matching a pattern, most specific first.
    pub overrides: Vec<Override>,
    /// Shadow mode: the rule decides and counts (outcome `shadow_rejected` in `tokenlease_decisions_total`) but
    /// every check is allowed, so a new rule can be tried on live traffic. [`crate::Decision::shadowed`] tells
    /// the caller which calls it would have refused.
    pub shadow: bool,
}

/// Other limits for the keys that match `pattern` (VIP users, a partner's API key): same algorithm, other numbers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Override {
    /// A key pattern: `*` matches any run of characters (`vip:*`); without `*` it is an exact key.
    pub pattern: String,
    /// The limits for matching keys (the same algorithm as the rule's).
    pub algorithm: Algorithm,
}

impl Override {
    /// Whether `key` matches the pattern.
    pub fn matches(&self, key: &str) -> bool {
        glob(self.pattern.as_bytes(), key.as_bytes())
    }

    /// Exact keys first, then more literal characters first: the most specific match wins.
    fn specificity(&self) -> (bool, usize) {
        (
            !self.pattern.contains('*'),
            self.pattern.chars().filter(|c| *c != '*').count(),
        )
    }
}

/// `*`-only glob matching, iterative (no recursion on hostile patterns).
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|c| *c == b'*')
}

impl Rule {
    /// A token-bucket rule: `capacity` tokens (the burst), refilled with `rate` tokens every `per`.
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] when `capacity` is 0, `per` is under a millisecond, the numbers exceed
    /// what the scripts compute exactly (capacity × per in ms and rate × per in ms below 2^53), or `name` is empty
    /// or holds anything but ASCII letters, digits, `_`, `.` and `-`.
    pub fn token_bucket(
        name: impl Into<String>,
        capacity: u64,
        rate: u64,
        per: Duration,
    ) -> Result<Self, crate::Error> {
        let bucket = token_bucket_params(capacity, rate, per)
            .map_err(|(name, reason)| crate::Error::InvalidArgument { name, reason })?;
        Self::named(
            name,
            Algorithm::TokenBucket {
                bucket,
                lease: None,
                ban_ms: 0,
            },
        )
    }

    /// A sliding-window log rule (seeds 000–002): at most `limit` tokens in any `window`, exact.
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] naming `name`, `limit` or `window` when one is empty, zero, or not a
    /// whole number of milliseconds.
    pub fn sliding_log(name: impl Into<String>, limit: u64, window: Duration) -> Result<Self, crate::Error> {
        let (limit, window_ms) = window_params(limit, window).map_err(invalid)?;
        Self::named(
            name,
            Algorithm::SlidingLog {
                limit,
                window_ms,
                ban_ms: 0,
            },
        )
    }

    /// A rolling fixed-window rule (seeds 001, 002, 004): the first hit opens a `window` in which at most
    /// `limit` tokens are granted (the seeds' INCR + EXPIRE, with its boundary burst: see the README).
    ///
    /// # Errors
    /// As [`Rule::sliding_log`].
    pub fn fixed_window(name: impl Into<String>, limit: u64, window: Duration) -> Result<Self, crate::Error> {
        let (limit, window_ms) = window_params(limit, window).map_err(invalid)?;
        Self::named(
            name,
            Algorithm::FixedWindow {
                limit,
                window_ms,
                calendar: None,
                ban_ms: 0,
            },
        )
    }

    /// A calendar fixed-window rule (seed 003, scenario 3): windows of `window` start at local midnight (or
    /// the hour, the minute) of the fixed offset `utc_offset` (`"+08:00"`), so a daily quota resets at local
    /// midnight. For a zone with daylight-saving time use [`Rule::calendar_window_in_zone`].
    ///
    /// # Errors
    /// As [`Rule::sliding_log`]; also `utc_offset` when it is not like `+08:00`.
    pub fn calendar_window(
        name: impl Into<String>,
        limit: u64,
        window: Duration,
        utc_offset: &str,
    ) -> Result<Self, crate::Error> {
        let (limit, window_ms) = window_params(limit, window).map_err(invalid)?;
        let offset = parse_utc_offset(utc_offset).map_err(invalid)?;
        let w = i64::try_from(window_ms).map_err(|_| invalid(("window", "is too long".into())))?;
        let align_ms = u64::try_from(offset.rem_euclid(w)).unwrap_or(0);
        Self::calendar(name, limit, window_ms, Calendar::Offset { align_ms })
    }

    /// A calendar fixed-window rule in the IANA time zone `timezone` (`"Europe/Berlin"`, from the tz database
    /// bundled by the `jiff` crate): windows of whole days start at each local midnight, so a daily quota
    /// resets at local midnight on both sides of a daylight-saving change and the 23- and 25-hour days are one
    /// window each; shorter windows follow the wall clock (see [`Zone`]).
    ///
    /// # Errors
    /// As [`Rule::sliding_log`]; also `timezone` when the tz database has no such zone.
    pub fn calendar_window_in_zone(
        name: impl Into<String>,
        limit: u64,
        window: Duration,
        timezone: &str,
    ) -> Result<Self, crate::Error> {
        let (limit, window_ms) = window_params(limit, window).map_err(invalid)?;
        Self::calendar(name, limit, window_ms, Calendar::Zone(Zone::iana(timezone)?))
    }

    fn calendar(name: impl Into<String>, limit: u64, window_ms: u64, calendar: Calendar) -> Result<Self, crate::Error> {
        Self::named(
            name,
            Algorithm::FixedWindow {
                limit,
                window_ms,
                calendar: Some(calendar),
                ban_ms: 0,
            },
        )
    }

    /// A sliding-window counter rule (seed 004): at most `limit` tokens in the last `sub_buckets` sub-buckets
    /// of `window / sub_buckets` each; memory O(sub_buckets) per key; approximate (docs/BENCHMARKS.md, the table of algorithms).
    ///
    /// # Errors
    /// As [`Rule::sliding_log`]; also `sub_buckets` when it is 0, above 1000 or does not divide the window.
    pub fn sliding_window(
        name: impl Into<String>,
        limit: u64,
        window: Duration,
        sub_buckets: u64,
    ) -> Result<Self, crate::Error> {
        let (limit, window_ms) = window_params(limit, window).map_err(invalid)?;
        check_sub_buckets(window_ms, sub_buckets).map_err(invalid)?;
        Self::named(
            name,
            Algorithm::SlidingWindow {
                limit,
                window_ms,
                sub_buckets,
                ban_ms: 0,
            },
        )
    }

    /// A leaky-bucket queue rule (seed 004): jobs leak at `rate` tokens every `per`, across all processes;
    /// [`crate::Limiter::acquire`] waits for a slot, at most `max_wait` (the queue's bound).
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] naming `rate`, `per` or `max_wait` when the rate is 0, `per` is not
    /// a whole number of milliseconds, or the schedule would not stay exact in the scripts.
    pub fn leaky_bucket(
        name: impl Into<String>,
        rate: u64,
        per: Duration,
        max_wait: Duration,
    ) -> Result<Self, crate::Error> {
        let (rate, per_ms, max_wait_ms) = leaky_params(rate, per, max_wait).map_err(invalid)?;
        Self::named(
            name,
            Algorithm::LeakyBucket {
                rate,
                per_ms,
                max_wait_ms,
            },
        )
    }

    /// Bans a key for `ban` after a breach (seed 003, scenario 2): once refused it is refused until the ban
    /// ends, whatever the window says.
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] naming `ban` when it is not a whole number of milliseconds, or when
    /// the rule cannot ban (a leased token bucket, a leaky bucket).
    pub fn with_ban(mut self, ban: Duration) -> Result<Self, crate::Error> {
        let ms = whole_ms(ban, "ban").map_err(invalid)?;
        match &mut self.algorithm {
            Algorithm::TokenBucket { lease: Some(_), .. } => return Err(invalid(("ban", NO_BAN_WITH_LEASE.into()))),
            Algorithm::TokenBucket { ban_ms, .. }
            | Algorithm::FixedWindow { ban_ms, .. }
            | Algorithm::SlidingLog { ban_ms, .. }
            | Algorithm::SlidingWindow { ban_ms, .. } => *ban_ms = ms,
            other => return Err(invalid(("ban", format!("{} rules cannot ban", other.name())))),
        }
        Ok(self)
    }

    fn named(name: impl Into<String>, algorithm: Algorithm) -> Result<Self, crate::Error> {
        let name = name.into();
        check_name(&name, "name").map_err(invalid)?;
        Ok(Self {
            name,
            algorithm,
            fail_mode: None,
            overrides: Vec::new(),
            shadow: false,
        })
    }

    /// Gives the keys matching `pattern` the limits of `limits` (a rule of the same algorithm; its name is not
    /// used). The most specific matching override wins: an exact key, then the most literal characters.
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] naming `override` when the algorithms differ, the pattern is empty,
    /// or `limits` changes whether the rule leases.
    pub fn with_override(mut self, pattern: impl Into<String>, limits: Rule) -> Result<Self, crate::Error> {
        let pattern = pattern.into();
        let bad = |reason: String| invalid(("override", reason));
        if pattern.is_empty() {
            return Err(bad("the pattern must not be empty".into()));
        }
        if std::mem::discriminant(&limits.algorithm) != std::mem::discriminant(&self.algorithm) {
            return Err(bad(format!(
                "`{pattern}` must keep the algorithm {} (got {})",
                self.algorithm.name(),
                limits.algorithm.name()
            )));
        }
        if limits.lease().is_some() != self.lease().is_some() {
            return Err(bad(format!("`{pattern}` must lease exactly when the rule does")));
        }
        self.overrides.push(Override {
            pattern,
            algorithm: limits.algorithm,
        });
        self.overrides.sort_by_key(|o| std::cmp::Reverse(o.specificity()));
        Ok(self)
    }

    /// The limits for `key`: the most specific matching override's, or the rule's own.
    #[inline]
    pub fn algorithm_for(&self, key: &str) -> &Algorithm {
        if self.overrides.is_empty() {
            return &self.algorithm;
        }
        self.overrides
            .iter()
            .find(|o| o.matches(key))
            .map_or(&self.algorithm, |o| &o.algorithm)
    }

    /// Leases batches of this token-bucket rule into the process.
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] when the rule is not a token bucket, `min_batch` is 0,
    /// `max_batch < min_batch`, `max_batch` exceeds the capacity, `ttl` is zero, or `hot_after` is `Some(0)`;
    /// when the rule bans ([`NO_BAN_WITH_LEASE`]); when it has an unleased override already (overrides lease
    /// exactly when the rule does: add them after the lease, each with its own).
    pub fn with_lease(mut self, lease: Lease) -> Result<Self, crate::Error> {
        let Algorithm::TokenBucket {
            bucket,
            lease: slot,
            ban_ms,
        } = &mut self.algorithm
        else {
            return Err(crate::Error::InvalidArgument {
                name: "lease",
                reason: format!("only token_bucket rules lease, not {}", self.algorithm.name()),
            });
        };
        validate_lease(&lease, bucket.capacity)
            .map_err(|(name, reason)| crate::Error::InvalidArgument { name, reason })?;
        if *ban_ms > 0 {
            return Err(invalid(("lease", NO_BAN_WITH_LEASE.into())));
        }
        if !self.overrides.is_empty() {
            let why = "overrides lease exactly when the rule does: add them after the lease, each with its own";
            return Err(invalid(("lease", why.into())));
        }
        *slot = Some(lease);
        Ok(self)
    }

    /// Puts the rule in shadow mode (see [`Rule::shadow`]): it decides and counts, but allows every check.
    pub fn with_shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
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

#[cfg(test)]
mod tests {
    use super::parse_utc_offset;

    #[test]
    fn globs() {
        use super::glob;
        let cases = [
            ("vip:*", "vip:7", true),
            ("vip:*", "vi", false),
            ("*", "", true),
            ("a*b*c", "aXbYc", true),
            ("a*b", "ab", true),
            ("a*b", "abc", false),
            ("key", "key", true),
            ("key", "keys", false),
        ];
        for (p, t, m) in cases {
            assert_eq!(glob(p.as_bytes(), t.as_bytes()), m, "{p} {t}");
        }
    }

    #[test]
    fn the_most_specific_override_wins() {
        use std::time::Duration;
        let rule = |limit| super::Rule::sliding_log("post", limit, Duration::from_secs(60)).unwrap();
        let r = rule(10)
            .with_override("vip:*", rule(100))
            .unwrap()
            .with_override("vip:gold:*", rule(1000))
            .unwrap();
        let r = r.with_override("vip:gold:42", rule(5)).unwrap();
        assert_eq!(r.algorithm_for("user:1").capacity(), 10);
        assert_eq!(r.algorithm_for("vip:1").capacity(), 100);
        assert_eq!(r.algorithm_for("vip:gold:1").capacity(), 1000);
        assert_eq!(r.algorithm_for("vip:gold:42").capacity(), 5);
        let other = super::Rule::fixed_window("post", 1, Duration::from_secs(1)).unwrap();
        assert!(rule(1).with_override("x", other).is_err());
    }

    /// Overrides lease exactly when the rule does, in whichever order the builder is called.
    #[test]
    fn a_lease_after_an_unleased_override_is_refused() {
        use std::time::Duration;
        let bucket = |capacity| super::Rule::token_bucket("buy", capacity, 10, Duration::from_secs(1)).unwrap();
        let lease = super::Lease {
            min_batch: 1,
            max_batch: 5,
            ttl: Duration::from_millis(200),
            hot_after: None,
            reserve: None,
        };
        let late = bucket(10).with_override("vip:*", bucket(20)).unwrap().with_lease(lease);
        assert!(late.is_err_and(|e| e.to_string().contains("overrides lease exactly when the rule does")));
        let leased = bucket(10).with_lease(lease).unwrap();
        assert!(leased.clone().with_override("vip:*", bucket(20)).is_err());
        let vip = bucket(20).with_lease(lease).unwrap();
        let both = leased.with_override("vip:*", vip).unwrap();
        assert!(matches!(
            both.algorithm_for("vip:1"),
            super::Algorithm::TokenBucket { lease: Some(_), .. }
        ));
    }

    #[test]
    fn utc_offsets() {
        assert_eq!(parse_utc_offset("+08:00"), Ok(28_800_000));
        assert_eq!(parse_utc_offset("-05:30"), Ok(-19_800_000));
        assert_eq!(parse_utc_offset("Z"), Ok(0));
        assert!(parse_utc_offset("8").is_err());
        assert!(parse_utc_offset("+8:00").is_err());
        assert!(parse_utc_offset("+25:00").is_err());
    }
}
