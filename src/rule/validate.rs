//! Every limit's check, in one place: the rule constructors, the config file and the limiter's builder call
//! these. Each error names the field (`(field, reason)`), so the config can add the file and line.

use std::time::Duration;

use crate::algorithm::{TokenBucket, MAX_EXACT};

use super::lease::Lease;

/// A field's name and what is wrong with its value.
pub(crate) type FieldError = (&'static str, String);

/// Why a leased rule cannot ban.
pub(crate) const NO_BAN_WITH_LEASE: &str =
    "a leased rule cannot ban: its refusals are made from leases, not per call (drop `lease` to ban)";

/// A field error as the API's [`crate::Error::InvalidArgument`].
pub(crate) fn invalid((name, reason): FieldError) -> crate::Error {
    crate::Error::InvalidArgument { name, reason }
}

/// A rule name (`field` names it: `name`, or `action_key` for [`crate::Limiter::is_action_allowed`]) is
/// non-empty and made of ASCII letters, digits, `_`, `.` and `-` only. It is part of every store key,
/// `{prefix}:{rule:key}`, where the first `:` after the brace ends it: with a `:` in names, rule `a` with key
/// `b:c` and rule `a:b` with key `c` would share one Redis key, and a brace would end the Cluster hash tag
/// (invariant 14). Keys themselves may hold anything.
pub(crate) fn check_name(name: &str, field: &'static str) -> Result<(), FieldError> {
    if name.is_empty() {
        return Err((field, "must not be empty".into()));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    if let Some(c) = name.chars().find(|&c| !allowed(c)) {
        return Err((
            field,
            format!(
                "holds `{}`: a rule name may hold only ASCII letters, digits, `_`, `.` and `-` (it is part of every \
                 store key, where `:` separates it from the key)",
                c.escape_debug()
            ),
        ));
    }
    Ok(())
}

/// A count that must be at least 1.
pub(crate) fn positive(v: u64, field: &'static str) -> Result<u64, FieldError> {
    if v == 0 {
        return Err((field, "must be at least 1".into()));
    }
    Ok(v)
}

/// Checks a window's limit and length: `(limit, window_ms)`.
pub(crate) fn window_params(limit: u64, window: Duration) -> Result<(u64, u64), FieldError> {
    Ok((positive(limit, "limit")?, whole_ms(window, "window")?))
}

/// Checks leaky-bucket parameters: `(rate, per_ms, max_wait_ms)`; the error names the field.
pub(crate) fn leaky_params(rate: u64, per: Duration, max_wait: Duration) -> Result<(u64, u64, u64), FieldError> {
    if rate == 0 {
        return Err(("rate", "must be at least 1".into()));
    }
    let per_ms = whole_ms(per, "per")?;
    let max_wait_ms = u64::try_from(max_wait.as_millis()).unwrap_or(u64::MAX);
    let exact = |v: u64| v.checked_mul(rate).is_some_and(|x| x < MAX_EXACT);
    if !exact(per_ms) || !exact(max_wait_ms.saturating_add(per_ms)) {
        return Err(("max_wait", format!("rate × (max_wait + per) must stay below 2^53 (rate {rate}, per {per_ms} ms, max_wait {max_wait_ms} ms)")));
    }
    Ok((rate, per_ms, max_wait_ms))
}

/// Sub-buckets divide the window, 1 to 1000 of them.
pub(crate) fn check_sub_buckets(window_ms: u64, sub_buckets: u64) -> Result<(), FieldError> {
    if sub_buckets == 0 || sub_buckets > 1000 || !window_ms.is_multiple_of(sub_buckets) {
        return Err((
            "sub_buckets",
            format!("must divide the window ({window_ms} ms) and be 1 to 1000"),
        ));
    }
    Ok(())
}

/// `+08:00`, `-05:30`, `Z` → offset east of UTC in milliseconds.
pub(crate) fn parse_utc_offset(s: &str) -> Result<i64, FieldError> {
    let bad = || {
        (
            "utc_offset",
            format!("`{s}` is not an offset like \"+08:00\" or \"-05:30\""),
        )
    };
    if s == "Z" || s == "UTC" {
        return Ok(0);
    }
    let (sign, rest) = match s.as_bytes().first() {
        Some(b'+') => (1, &s[1..]),
        Some(b'-') => (-1, &s[1..]),
        _ => return Err(bad()),
    };
    let (h, m) = rest.split_once(':').ok_or_else(bad)?;
    if h.len() != 2 || m.len() != 2 {
        return Err(bad());
    }
    let (h, m): (i64, i64) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    if !(0..=14).contains(&h) || !(0..=59).contains(&m) {
        return Err(bad());
    }
    Ok(sign * (h * 3_600_000 + m * 60_000))
}

/// Checks token-bucket parameters; the error names the field.
pub(crate) fn token_bucket_params(capacity: u64, rate: u64, per: Duration) -> Result<TokenBucket, FieldError> {
    if capacity == 0 {
        return Err(("capacity", "must be at least 1 token".into()));
    }
    let per_ms = whole_ms(per, "per")?;
    let bucket = TokenBucket { capacity, rate, per_ms };
    if !bucket.is_exact_in_lua() {
        return Err((
            "capacity",
            format!("capacity × per and rate × per must stay below 2^53 token·ms (capacity {capacity}, rate {rate}, per {per_ms} ms)"),
        ));
    }
    Ok(bucket)
}

/// A duration as whole milliseconds: at least 1, below 2^53 (exact in the scripts); the error names the field.
pub(crate) fn whole_ms(d: Duration, field: &'static str) -> Result<u64, FieldError> {
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 || !d.subsec_nanos().is_multiple_of(1_000_000) {
        return Err((
            field,
            format!("must be a whole number of milliseconds, at least 1ms (got {d:?})"),
        ));
    }
    if ms >= MAX_EXACT {
        return Err((field, "is too long".into()));
    }
    Ok(ms)
}

/// Checks lease settings against the bucket's capacity; the error names the field.
pub(crate) fn validate_lease(lease: &Lease, capacity: u64) -> Result<(), FieldError> {
    if lease.min_batch == 0 {
        return Err(("lease.min_batch", "must be at least 1 token".into()));
    }
    if lease.hot_after == Some(0) {
        return Err(("lease.hot_after", "must be at least 1 decision".into()));
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
    if lease.reserve.is_some_and(|r| r > Lease::MAX_RESERVE) {
        return Err(("lease.reserve", "must be at most an hour".into()));
    }
    Ok(())
}
