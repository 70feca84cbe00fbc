//! Metric names (the README, "Metrics, dashboards, alerts") and the handles the limiter records into.
//!
//! The library only records, through the `metrics` facade; the binary installs the Prometheus exporter.
//! With no recorder installed a metric costs one atomic load. Handles are registered when a rule is built:
//! install the recorder before building the [`crate::Limiter`]. Labels carry the rule name, never a key.

use metrics::{counter, gauge, histogram, Counter, Gauge, Histogram, SharedString, Unit};

use crate::decision::Source;
use crate::error::{FailReason, StoreErrorKind};

/// Decisions, by `rule`, `outcome` (`allowed`/`rejected`, or `shadow_rejected` for a refusal a shadow rule turned
/// into an allowance) and `source` (`local`/`redis`/`memory`/`fallback`).
pub const DECISIONS_TOTAL: &str = "tokenlease_decisions_total";
/// Decisions made by `fail_mode` because the store failed, by `rule` and `reason` (`error`/`timeout`/
/// `circuit_open`); a caller that only waited long for a lease in flight is not one of them.
pub const FAIL_MODE_DECISIONS_TOTAL: &str = "tokenlease_fail_mode_decisions_total";
/// Lease calls to the store, by `rule` and `result` (`granted`/`partial`/`refused`/`error`).
pub const LEASES_TOTAL: &str = "tokenlease_leases_total";
/// Tokens leased from the store, by `rule`.
pub const LEASED_TOKENS_TOTAL: &str = "tokenlease_leased_tokens_total";
/// Leased tokens given back unused, by `rule`.
pub const RETURNED_TOKENS_TOTAL: &str = "tokenlease_returned_tokens_total";
/// Tokens leased and not yet spent or returned (paced chunks still to come and, under `local`, the reserve
/// included): the escrow a process may spend while the store fails, by `rule`.
pub const OUTSTANDING_TOKENS: &str = "tokenlease_outstanding_tokens";
/// Store call latency in seconds, by `script`.
pub const REDIS_DURATION_SECONDS: &str = "tokenlease_redis_duration_seconds";
/// Store call failures, by `script` and `kind` (`timeout`/`io`/`noscript`/`cluster`/`readonly`/`oom`/`other`).
pub const REDIS_ERRORS_TOTAL: &str = "tokenlease_redis_errors_total";
/// Refusals answered in process because the store refused the key lately and its `retry_after` has not
/// passed (invariant 4), by `rule`; also counted in `tokenlease_decisions_total` as `rejected`, `local`.
pub const REFUSALS_CACHED_TOTAL: &str = "tokenlease_refusals_cached_total";
/// Keys held in the local lease cache.
pub const LOCAL_KEYS: &str = "tokenlease_local_keys";
/// Keys of a rule that lease in this process now (hot keys), by `rule`.
pub const HOT_KEYS: &str = "tokenlease_hot_keys";
/// Live processes of a rule's fleet, as its roster in the store counted them at this process's last beat
/// (the divisor of every share of the rule), by `rule`.
pub const FLEET_PROCESSES: &str = "tokenlease_fleet_processes";
/// The store's clock less this process's wall clock, in seconds, read at each beat of a leased rule on Redis (the
/// time the roster's script ran at against the middle of the beat's round trip), by `rule` (in a Cluster each
/// rule's roster may live on another node). A jump means the store's clock stepped: a failover to a server whose
/// clock differs, or an NTP step; each key then refills what the step says, at most `min(capacity, rate × step)`
/// once (docs/ARCHITECTURE.md, Known limits).
pub const STORE_CLOCK_OFFSET_SECONDS: &str = "tokenlease_store_clock_offset_seconds";
/// Callers waiting in a queue, by `rule`.
pub const QUEUE_DEPTH: &str = "tokenlease_queue_depth";
/// Time callers waited in a queue, in seconds, by `rule`.
pub const QUEUE_WAIT_SECONDS: &str = "tokenlease_queue_wait_seconds";

/// 1 while the store is deciding (the last store call or readiness probe succeeded and the circuit breaker is
/// closed), 0 otherwise; what `/readyz` answers.
pub const STORE_READY: &str = "tokenlease_store_ready";
/// 1 when a Redis server's `maxmemory-policy` may evict limiter keys (`allkeys-*`, `volatile-*`: an evicted
/// bucket comes back full), 0 otherwise; read with `CONFIG GET` at each connection.
pub const REDIS_EVICTION_UNSAFE: &str = "tokenlease_redis_eviction_unsafe";

/// Histogram buckets for Redis latency: 50 µs to 100 ms.
pub const REDIS_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
];

/// Histogram buckets for queue waits: 1 ms to 60 s.
pub const QUEUE_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Registers help texts and units with the installed recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        DECISIONS_TOTAL,
        Unit::Count,
        "Rate-limit decisions by rule, outcome (allowed, rejected, shadow_rejected) and source (local, redis, memory, fallback)"
    );
    describe_counter!(
        FAIL_MODE_DECISIONS_TOTAL,
        Unit::Count,
        "Decisions made by fail_mode because the store failed, by rule and reason (error, timeout, circuit_open)"
    );
    describe_counter!(
        REFUSALS_CACHED_TOTAL,
        Unit::Count,
        "Refusals answered in process until the retry_after of the store's last refusal of the key, by rule"
    );
    describe_counter!(
        LEASES_TOTAL,
        Unit::Count,
        "Lease calls to the shared bucket by rule and result (granted, partial, refused, error)"
    );
    describe_counter!(
        LEASED_TOKENS_TOTAL,
        Unit::Count,
        "Tokens leased from the shared bucket, by rule"
    );
    describe_counter!(
        RETURNED_TOKENS_TOTAL,
        Unit::Count,
        "Leased tokens given back unused, by rule"
    );
    describe_gauge!(
        OUTSTANDING_TOKENS,
        Unit::Count,
        "Tokens leased or held in reserve and not yet spent or returned: the most this process can still admit without Redis"
    );
    describe_histogram!(
        REDIS_DURATION_SECONDS,
        Unit::Seconds,
        "Store script call latency in seconds, by script"
    );
    describe_counter!(
        REDIS_ERRORS_TOTAL,
        Unit::Count,
        "Failed store script calls by script and kind (timeout, io, noscript, cluster, readonly, oom, other)"
    );
    describe_gauge!(
        STORE_READY,
        Unit::Count,
        "1 while the store is deciding (last call succeeded, breaker closed, writes accepted), else 0"
    );
    describe_gauge!(
        REDIS_EVICTION_UNSAFE,
        Unit::Count,
        "1 when Redis maxmemory-policy may evict limiter keys (allkeys-*, volatile-*), else 0"
    );
    describe_gauge!(LOCAL_KEYS, Unit::Count, "Keys held in the local lease cache");
    describe_gauge!(
        HOT_KEYS,
        Unit::Count,
        "Keys of a rule that lease in this process now (decided often enough to spend a batch within the lease TTL)"
    );
    describe_gauge!(QUEUE_DEPTH, Unit::Count, "Callers waiting in a queue, by rule");
    describe_gauge!(
        FLEET_PROCESSES,
        Unit::Count,
        "Live processes of a rule's fleet counted by its roster in the store (the divisor of its shares), by rule"
    );
    describe_gauge!(
        STORE_CLOCK_OFFSET_SECONDS,
        Unit::Seconds,
        "The store's clock less this process's wall clock at the last beat of a leased rule on Redis, by rule"
    );
    describe_histogram!(
        QUEUE_WAIT_SECONDS,
        Unit::Seconds,
        "Time callers waited in a queue in seconds, by rule"
    );
}

/// Handles for one rule, registered once so the hot path does no label lookup.
#[derive(Debug, Clone)]
pub(crate) struct RuleMetrics {
    allowed: [Counter; 4],
    rejected: [Counter; 4],
    shadow_rejected: [Counter; 4],
    /// Per [`FailReason`], in [`FailReason::ALL`]'s order.
    pub(crate) fail_mode: [Counter; 3],
    pub(crate) lease_granted: Counter,
    pub(crate) lease_partial: Counter,
    pub(crate) lease_refused: Counter,
    pub(crate) lease_error: Counter,
    pub(crate) leased_tokens: Counter,
    pub(crate) returned_tokens: Counter,
    pub(crate) outstanding: Gauge,
    pub(crate) hot_keys: Gauge,
    pub(crate) queue_depth: Gauge,
    pub(crate) queue_wait: Histogram,
    pub(crate) refusals_cached: Counter,
}

/// Which series a rule can produce: only those are registered, so that dashboards show what exists.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Series {
    /// The rule (or one of its overrides) leases: lease calls, leased, returned and outstanding tokens.
    pub(crate) leases: bool,
    /// The rule can be waited for with `acquire` (leaky and token buckets): queue depth and wait.
    pub(crate) queue: bool,
    /// The rule is in shadow mode: `shadow_rejected` decisions.
    pub(crate) shadow: bool,
}

impl RuleMetrics {
    /// Registers the handles of `rule` for the `series` it can produce; the others are no-ops, never exported.
    pub(crate) fn new(rule: &str, series: Series) -> Self {
        let rule = SharedString::from(rule.to_owned());
        let decision = |outcome: &'static str, s: Source| counter!(DECISIONS_TOTAL, "rule" => rule.clone(), "outcome" => outcome, "source" => s.as_str());
        let leases = series.leases;
        let lease = |result: &'static str| {
            if leases {
                counter!(LEASES_TOTAL, "rule" => rule.clone(), "result" => result)
            } else {
                Counter::noop()
            }
        };
        let lease_counter = |name: &'static str| {
            if leases {
                counter!(name, "rule" => rule.clone())
            } else {
                Counter::noop()
            }
        };
        Self {
            allowed: Source::ALL.map(|s| decision("allowed", s)),
            rejected: Source::ALL.map(|s| decision("rejected", s)),
            shadow_rejected: Source::ALL.map(|s| {
                if series.shadow {
                    decision("shadow_rejected", s)
                } else {
                    Counter::noop()
                }
            }),
            fail_mode: FailReason::ALL
                .map(|r| counter!(FAIL_MODE_DECISIONS_TOTAL, "rule" => rule.clone(), "reason" => r.as_str())),
            lease_granted: lease("granted"),
            lease_partial: lease("partial"),
            lease_refused: lease("refused"),
            lease_error: lease("error"),
            leased_tokens: lease_counter(LEASED_TOKENS_TOTAL),
            returned_tokens: lease_counter(RETURNED_TOKENS_TOTAL),
            outstanding: if leases {
                gauge!(OUTSTANDING_TOKENS, "rule" => rule.clone())
            } else {
                Gauge::noop()
            },
            hot_keys: if leases {
                gauge!(HOT_KEYS, "rule" => rule.clone())
            } else {
                Gauge::noop()
            },
            queue_depth: if series.queue {
                gauge!(QUEUE_DEPTH, "rule" => rule.clone())
            } else {
                Gauge::noop()
            },
            queue_wait: if series.queue {
                histogram!(QUEUE_WAIT_SECONDS, "rule" => rule.clone())
            } else {
                Histogram::noop()
            },
            refusals_cached: counter!(REFUSALS_CACHED_TOTAL, "rule" => rule),
        }
    }

    #[inline]
    pub(crate) fn decision(&self, allowed: bool, source: Source) {
        let i = source as usize;
        if allowed {
            self.allowed[i].increment(1);
        } else {
            self.rejected[i].increment(1);
        }
    }

    /// Decisions a key's shards counted on the hot path (source `local`): `allowed` and `refused`; a `shadow`
    /// rule's refusals were turned into allowances.
    pub(crate) fn local_decisions(&self, allowed: u64, refused: u64, shadow: bool) {
        let i = Source::Local as usize;
        self.allowed[i].increment(allowed);
        if shadow {
            self.shadow_rejected[i].increment(refused);
        } else {
            self.rejected[i].increment(refused);
        }
    }

    /// A refusal that a shadow rule turned into an allowance.
    pub(crate) fn shadow_rejected(&self, source: Source) {
        self.shadow_rejected[source as usize].increment(1);
    }
}

/// Handles for one script.
#[derive(Debug, Clone)]
pub(crate) struct ScriptMetrics {
    pub(crate) duration: Histogram,
    /// One counter per [`StoreErrorKind`], in its declaration order.
    errors: [Counter; StoreErrorKind::ALL.len()],
}

impl ScriptMetrics {
    pub(crate) fn new(script: &'static str) -> Self {
        let errors =
            StoreErrorKind::ALL.map(|k| counter!(REDIS_ERRORS_TOTAL, "script" => script, "kind" => k.as_str()));
        Self {
            duration: histogram!(REDIS_DURATION_SECONDS, "script" => script),
            errors,
        }
    }

    pub(crate) fn error(&self, kind: StoreErrorKind) {
        if let Some(c) = self.errors.get(kind as usize) {
            c.increment(1);
        }
    }
}

/// Sets [`STORE_READY`].
pub(crate) fn store_ready(ready: bool) {
    gauge!(STORE_READY).set(if ready { 1.0 } else { 0.0 });
}

/// Sets [`REDIS_EVICTION_UNSAFE`].
pub(crate) fn eviction_unsafe(at_risk: bool) {
    gauge!(REDIS_EVICTION_UNSAFE).set(if at_risk { 1.0 } else { 0.0 });
}

/// The gauge [`FLEET_PROCESSES`] of `rule`.
pub(crate) fn fleet_processes(rule: &str) -> metrics::Gauge {
    gauge!(FLEET_PROCESSES, "rule" => rule.to_owned())
}

/// The gauge [`STORE_CLOCK_OFFSET_SECONDS`] of `rule`.
pub(crate) fn store_clock_offset(rule: &str) -> metrics::Gauge {
    gauge!(STORE_CLOCK_OFFSET_SECONDS, "rule" => rule.to_owned())
}

/// Sets the number of keys in the local lease cache.
pub(crate) fn local_keys(n: usize) {
    gauge!(LOCAL_KEYS).set(n as f64);
}
