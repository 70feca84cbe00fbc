//! The coordinator's summary of a run: the merged counts and latencies against invariant 1 (on the hot key, or on
//! each SKU with `--keys`), printed for a person, and with `--json` as one JSON object on the last line.

use hdrhistogram::Histogram;
use tokenlease::Rule;

use super::keys::KeyFigures;
use super::limits::Limits;
use super::report::Report;
use super::Args;

/// The run the summary describes.
pub(super) struct Run<'a> {
    pub(super) args: &'a Args,
    pub(super) rule: &'a Rule,
    pub(super) limits: &'a Limits,
    /// The store, as the summary names it.
    pub(super) store_desc: &'a str,
    /// The worker processes that ran (one with the in-process store).
    pub(super) processes: u32,
    /// With `--keys`: the per-SKU figures, each SKU against its own bound.
    pub(super) keys: Option<&'a KeyFigures>,
}

/// Prints the summary of `total`, the workers' merged reports, and `hist`, their merged latencies; returns whether
/// the admitted count is within invariant 1's bound (with `--keys`: every SKU's within its own).
pub(super) fn print(run: &Run<'_>, total: &Report, hist: &Histogram<u64>) -> bool {
    let Run {
        args,
        rule,
        limits,
        store_desc,
        processes,
        keys,
    } = *run;
    let lease_ttl_s = limits.lease_ttl_s;
    let span_s = total.span_s();
    let (rate_per_s, bound) = (limits.rate_per_s, limits.bound(span_s));
    let fail_mode = total.fail_mode_errors + total.fail_mode_timeouts + total.fail_mode_circuit_open;
    // Only the decisions the limiter made: a fail_mode answer says nothing of the limiter's speed.
    let made = (total.attempts + total.user_attempts).saturating_sub(fail_mode);
    let decisions_per_s = if span_s > 0.0 { made as f64 / span_s } else { 0.0 };
    let calls_per_decision = total.redis_calls as f64 / made.max(1) as f64;
    let q = |p: f64| hist.value_at_quantile(p) as f64 / 1000.0;
    // One hot key is a run of one SKU.
    let single = KeyFigures {
        hot_keys: u64::from(total.by_lease > 0),
        over_bound_keys: u64::from(total.admitted as f64 > bound),
        max_admitted: total.admitted,
    };
    let figures = keys.unwrap_or(&single);
    let within = figures.over_bound_keys == 0;
    let whose = if keys.is_some() { "the SKUs" } else { "the hot key" };

    println!(
        "flash sale on rule `{}` ({}), store: {store_desc}",
        rule.name,
        if rule.lease().is_some() && !args.no_lease {
            "leased"
        } else {
            "one store call per decision"
        }
    );
    match args.every {
        Some(every) => println!(
            "  processes × tasks     {processes} × {}, each one decision every {}",
            args.tasks,
            humantime::format_duration(every)
        ),
        None => println!("  processes × tasks     {processes} × {}", args.tasks),
    }
    println!("  span                  {span_s:.3} s");
    println!(
        "  capacity, rate        {} tokens, {rate_per_s} /s (lease ttl {lease_ttl_s} s)",
        limits.capacity
    );
    if let Some(n) = args.keys {
        println!(
            "  keys                  {n} SKUs, zipf {}: {} leased (hot)",
            args.zipf, figures.hot_keys
        );
    }
    println!("  attempts              {}", total.attempts);
    if keys.is_some() {
        println!(
            "  admitted              {} in all; at most {} on one SKU ({:.1} % of its bound {bound:.0})",
            total.admitted,
            figures.max_admitted,
            100.0 * figures.max_admitted as f64 / bound
        );
    } else {
        println!(
            "  admitted              {} ({:.1} % of the bound {bound:.0})",
            total.admitted,
            100.0 * total.admitted as f64 / bound
        );
    }
    if total.pending_tokens > 0 {
        println!(
            "  pending at the end    {} (granted to paced leases, not yet released: sold later, not lost)",
            total.pending_tokens
        );
    }
    if total.reserved_tokens > 0 {
        println!(
            "  held in reserves      {} (fail_mode = \"local\": out of the bucket until their holds end)",
            total.reserved_tokens
        );
    }
    println!("  rejected              {}", total.rejected);
    println!(
        "  decided by            {} from leases, {} by the store, {} by fail_mode ({whose})",
        total.by_lease, total.by_store, total.fallback
    );
    if total.fallback > 0 || fail_mode > 0 {
        println!(
            "  decided by fail_mode  {} of {whose}; {fail_mode} in all: {} store errors, {} timeouts, {} breaker open",
            total.fallback, total.fail_mode_errors, total.fail_mode_timeouts, total.fail_mode_circuit_open
        );
    }
    if total.errors > 0 {
        println!("  errors                {}", total.errors);
    }
    if args.users > 0 {
        println!(
            "  user keys             {} attempts, {} admitted over {} users",
            total.user_attempts, total.user_admitted, args.users
        );
    }
    println!(
        "  redis calls           {} ({:.4} per admitted)",
        total.redis_calls,
        total.redis_calls as f64 / total.admitted.max(1) as f64
    );
    // A leased hot key makes millions of decisions per call: four decimals would print 0.
    let per_decision = if calls_per_decision >= 0.01 || calls_per_decision == 0.0 {
        format!("{calls_per_decision:.4}")
    } else {
        format!("{calls_per_decision:.2e}")
    };
    println!("  redis calls/decision  {per_decision} (of the decisions the limiter made)");
    println!("  decisions/s           {decisions_per_s:.0} (made by the limiter: fail_mode answers left out)");
    if total.fail_mode_circuit_open > 0 {
        println!(
            "  WARNING               the circuit breaker opened: {} answers came from fail_mode, not the store; raise [redis] timeout to measure the store",
            total.fail_mode_circuit_open
        );
    }
    println!(
        "  latency p50/p99/p999  {:.2} / {:.2} / {:.2} µs",
        q(0.5),
        q(0.99),
        q(0.999)
    );
    match (keys, within) {
        (None, true) => println!("  invariant             admitted ≤ bound: ok"),
        (None, false) => println!("  invariant             ADMITTED MORE THAN THE BOUND"),
        (Some(_), true) => println!("  invariant             every SKU admitted ≤ its bound: ok"),
        (Some(f), false) => println!(
            "  invariant             {} SKUS ADMITTED MORE THAN THEIR BOUND",
            f.over_bound_keys
        ),
    }
    if args.json {
        let json = serde_json::json!({
            "store": store_desc,
            "rule": rule.name,
            "lease": !args.no_lease,
            "processes": processes,
            "tasks": args.tasks,
            "every_us": args.every.map(|e| e.as_micros()),
            "span_s": span_s,
            "capacity": limits.capacity,
            "rate_per_s": rate_per_s,
            "lease_ttl_s": lease_ttl_s,
            "attempts": total.attempts,
            "admitted": total.admitted,
            "rejected": total.rejected,
            "errors": total.errors,
            "by_lease": total.by_lease,
            "by_store": total.by_store,
            "fallback": total.fallback,
            "fail_mode": {
                "error": total.fail_mode_errors,
                "timeout": total.fail_mode_timeouts,
                "circuit_open": total.fail_mode_circuit_open,
            },
            "user_attempts": total.user_attempts,
            "user_admitted": total.user_admitted,
            "bound": bound,
            "keys": args.keys.unwrap_or(1),
            "zipf": args.keys.map(|_| args.zipf),
            "hot_keys": figures.hot_keys,
            "over_bound_keys": figures.over_bound_keys,
            "max_key_admitted": figures.max_admitted,
            "redis_calls": total.redis_calls,
            "redis_calls_per_decision": calls_per_decision,
            "leased_tokens": total.leased_tokens,
            "returned_tokens": total.returned_tokens,
            "pending_tokens": total.pending_tokens,
            "reserved_tokens": total.reserved_tokens,
            "refusals_answered": total.refusals_answered,
            "peak_rss_mib": total.peak_rss_kib as f64 / 1024.0,
            "decisions_per_s": decisions_per_s,
            "latency_us": { "p50": q(0.5), "p99": q(0.99), "p999": q(0.999) },
        });
        println!("{json}");
    }
    within
}
