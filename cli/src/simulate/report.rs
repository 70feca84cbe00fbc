//! What `simulate` reports: the figures a sale is sized by, as a short table or one JSON object.

use std::time::Duration;

use serde_json::json;

use super::Kind;
use tokenlease_timeline::Worst;

/// The run's parameters.
#[derive(Debug, Clone)]
pub(crate) struct Setup {
    pub(crate) processes: u32,
    /// `--expected`: `None` when left out (the limiter's default).
    pub(crate) expected: Option<u32>,
    /// The store's round trip, in milliseconds (whole ones).
    pub(crate) rtt_ms: f64,
    /// The sale's length, in virtual time.
    pub(crate) duration: Duration,
    /// Decisions per second across the fleet.
    pub(crate) demand_per_s: u64,
    /// A tenth of the processes carry half the demand (`--skew`); else it is spread evenly.
    pub(crate) skew: bool,
    pub(crate) rule: String,
    /// The bucket's capacity, in tokens.
    pub(crate) capacity: u64,
    /// The bucket's refill, in tokens per second.
    pub(crate) rate_per_s: f64,
    /// The lease's smallest and largest batch, in tokens (`None`: no lease, a store call per decision).
    pub(crate) lease: Option<(u64, u64)>,
    /// The lease's ttl (zero without a lease).
    pub(crate) ttl: Duration,
}

impl Setup {
    /// Invariant 1 over the whole sale, in tokens: capacity + rate × (duration + ttl).
    pub(crate) fn bound(&self) -> u64 {
        let tokens = self.capacity as f64 + self.rate_per_s * (self.duration + self.ttl).as_secs_f64();
        tokens.floor() as u64
    }

    /// The fewest store calls per admitted token a leased key can cost, whatever the turns do: a lease brings
    /// at most two `max_batch` (a turn that comes late takes what accumulated, up to two batches; a process too
    /// slow to spend them within the TTL gets them paced), never more than the capacity, so
    /// `1 / min(2 × max_batch, capacity)`. `None` without a lease.
    pub(crate) fn floor(&self) -> Option<f64> {
        let (_, max_batch) = self.lease?;
        let per_lease = (2 * max_batch).min(self.capacity).max(1);
        Some(1.0 / per_lease as f64)
    }
}

/// What the run measured.
#[derive(Debug, Clone)]
pub(crate) struct Figures {
    /// Decisions made (allowed or not).
    pub(crate) decisions: u64,
    /// Decisions that returned an error instead.
    pub(crate) errors: u64,
    /// Tokens admitted, during the sale and by the decisions that finished after it.
    pub(crate) admitted: u64,
    /// The fleet's store calls so far at 0 s, 1 s, 2 s ... and at the end of the sale.
    pub(crate) calls_at: Vec<u64>,
    /// The fleet's store operations so far by kind (in [`Kind::ALL`]'s order, beats included), at the same times.
    pub(crate) ops_at: Vec<[u64; Kind::ALL.len()]>,
    /// Tokens admitted in each second.
    pub(crate) admitted_by_second: Vec<u64>,
    /// Tokens the fleet leased, and gave back, in each second of the sale.
    pub(crate) leased_by_second: Vec<u64>,
    pub(crate) returned_by_second: Vec<u64>,
    pub(crate) worst: Worst,
    /// Tokens leased from the store, and given back unused, by the whole fleet during the sale.
    pub(crate) leased: u64,
    pub(crate) returned: u64,
    /// Tokens granted to paced leases and not yet released when the sale ended: sold later, not lost.
    pub(crate) pending: u64,
    /// Tokens held in the processes' reserves when the sale ended (`local`): out of the bucket until the holds
    /// end, sold only while the store fails.
    pub(crate) reserved: u64,
    /// Decisions made by `fail_mode` (the store failed or timed out).
    pub(crate) fail_mode: u64,
    /// The fleet's beats during the sale (store calls of their own, not in `calls_at`).
    pub(crate) beats: u64,
    /// The live processes the first limiter counted at the end (its rule's roster).
    pub(crate) counted: u64,
    /// How long the run took, in seconds of real time.
    pub(crate) real_s: f64,
}

/// The figures derived from the counts.
struct Derived {
    /// Store calls during the sale.
    calls: u64,
    calls_per_s: f64,
    calls_per_admitted: f64,
    /// From 3 s to the end of the sale: `None` for a sale of 3 s or less.
    steady_calls_per_admitted: Option<f64>,
    steady_calls_per_s: Option<f64>,
    bound: u64,
    sold_pct: f64,
    /// What could sell: the bound, or the decisions made where fewer.
    could_sell: u64,
    /// The share of what could sell that was admitted (issue 33's figure).
    sold_of_could_pct: f64,
    unsold: i64,
    calls_by_second: Vec<u64>,
    /// Store operations per second by kind (beats included), over the sale and from 3 s on.
    ops_per_s: [f64; Kind::ALL.len()],
    steady_ops_per_s: Option<[f64; Kind::ALL.len()]>,
}

/// Where the steady state starts, in seconds.
const STEADY_FROM_S: usize = 3;

fn derive(setup: &Setup, f: &Figures) -> Derived {
    let calls = f.calls_at.last().copied().unwrap_or(0);
    let ratio = |calls: u64, admitted: u64| {
        if admitted == 0 {
            f64::NAN
        } else {
            calls as f64 / admitted as f64
        }
    };
    let duration_s = setup.duration.as_secs_f64();
    let steady = f
        .calls_at
        .get(STEADY_FROM_S)
        .filter(|_| duration_s > STEADY_FROM_S as f64);
    let steady_admitted: u64 = f.admitted_by_second.iter().skip(STEADY_FROM_S).sum();
    let bound = setup.bound();
    let could_sell = bound.min(f.decisions);
    Derived {
        calls,
        calls_per_s: calls as f64 / duration_s,
        calls_per_admitted: ratio(calls, f.admitted),
        steady_calls_per_admitted: steady.map(|&at| ratio(calls - at, steady_admitted)),
        steady_calls_per_s: steady.map(|&at| (calls - at) as f64 / (duration_s - STEADY_FROM_S as f64)),
        bound,
        sold_pct: f.admitted as f64 * 100.0 / bound as f64,
        could_sell,
        sold_of_could_pct: f.admitted as f64 * 100.0 / could_sell.max(1) as f64,
        unsold: i64::try_from(bound).unwrap_or(i64::MAX) - i64::try_from(f.admitted).unwrap_or(i64::MAX),
        calls_by_second: f.calls_at.windows(2).map(|w| w[1] - w[0]).collect(),
        ops_per_s: ops_per_s(f.ops_at.first(), f.ops_at.last(), duration_s),
        steady_ops_per_s: f
            .ops_at
            .get(STEADY_FROM_S)
            .filter(|_| duration_s > STEADY_FROM_S as f64)
            .map(|at| ops_per_s(Some(at), f.ops_at.last(), duration_s - STEADY_FROM_S as f64)),
    }
}

/// Operations per second of each kind between two samples `seconds` apart.
fn ops_per_s(
    from: Option<&[u64; Kind::ALL.len()]>,
    to: Option<&[u64; Kind::ALL.len()]>,
    seconds: f64,
) -> [f64; Kind::ALL.len()] {
    let (from, to) = (from.copied().unwrap_or_default(), to.copied().unwrap_or_default());
    std::array::from_fn(|k| to[k].saturating_sub(from[k]) as f64 / seconds)
}

/// Operations per second by kind as a JSON object, with their sum as `all`.
fn ops_json(ops: &[f64; Kind::ALL.len()]) -> serde_json::Value {
    let mut object: serde_json::Map<String, serde_json::Value> = Kind::ALL
        .iter()
        .map(|k| (k.name().to_owned(), num(ops[*k as usize])))
        .collect();
    object.insert("all".to_owned(), num(ops.iter().sum()));
    serde_json::Value::Object(object)
}

/// Operations per second by kind as a line of text.
fn ops_text(ops: &[f64; Kind::ALL.len()]) -> String {
    let kinds: Vec<String> = Kind::ALL
        .iter()
        .map(|k| format!("{} {:.1}", k.name(), ops[*k as usize]))
        .collect();
    format!("{:.1} ({})", ops.iter().sum::<f64>(), kinds.join(", "))
}

/// A number JSON can hold: `null` for NaN (no token admitted).
fn num(x: f64) -> serde_json::Value {
    serde_json::Number::from_f64(x).map_or(serde_json::Value::Null, serde_json::Value::Number)
}

/// The run as one JSON object.
pub(crate) fn json(setup: &Setup, f: &Figures) -> String {
    let d = derive(setup, f);
    let mut object = json!({
        "processes": setup.processes,
        "expected": setup.expected,
        "rule": setup.rule,
        "capacity": setup.capacity,
        "rate_per_s": num(setup.rate_per_s),
        "min_batch": setup.lease.map(|l| l.0),
        "max_batch": setup.lease.map(|l| l.1),
        "ttl_ms": u64::try_from(setup.ttl.as_millis()).unwrap_or(u64::MAX),
        "rtt_ms": num(setup.rtt_ms),
        "duration_s": num(setup.duration.as_secs_f64()),
        "demand_per_s": setup.demand_per_s,
        "decisions": f.decisions,
        "errors": f.errors,
        "fail_mode_decisions": f.fail_mode,
        "store_calls": d.calls,
        "beats": f.beats,
        "beats_per_s": num(f.beats as f64 / setup.duration.as_secs_f64()),
        "counted": f.counted,
        "calls_per_s": num(d.calls_per_s),
        "calls_per_admitted": num(d.calls_per_admitted),
        "steady_calls_per_s": d.steady_calls_per_s.map(num),
        "steady_calls_per_admitted": d.steady_calls_per_admitted.map(num),
        "floor_calls_per_admitted": setup.floor().map(num),
        "admitted": f.admitted,
        "bound": d.bound,
        "sold_pct": num(d.sold_pct),
        "could_sell": d.could_sell,
        "sold_of_could_pct": num(d.sold_of_could_pct),
        "unsold": d.unsold,
        "leased_tokens": f.leased,
        "returned_tokens": f.returned,
        "worst_window_ratio": num(f.worst.ratio),
        "worst_window_s": num(f.worst.window.as_secs_f64()),
        "worst_window_at_s": num(f.worst.start.as_secs_f64()),
        "worst_window_admitted": f.worst.admitted,
        "worst_window_bound": num(f.worst.limit),
        "calls_by_second": d.calls_by_second,
        "admitted_by_second": f.admitted_by_second,
        "leased_by_second": f.leased_by_second,
        "returned_by_second": f.returned_by_second,
        "real_s": num(f.real_s),
    });
    // Apart from the macro: serde_json's json! recurses once per field.
    object["pending_tokens_at_end"] = json!(f.pending);
    object["reserved_tokens_at_end"] = json!(f.reserved);
    if let serde_json::Value::Object(fields) = &mut object {
        fields.insert("skew".into(), setup.skew.into());
        fields.insert("ops_per_s".into(), ops_json(&d.ops_per_s));
        let steady = d.steady_ops_per_s.as_ref().map_or(serde_json::Value::Null, ops_json);
        fields.insert("steady_ops_per_s".into(), steady);
    }
    object.to_string()
}

/// The run as a short table.
pub(crate) fn print(setup: &Setup, f: &Figures) {
    let d = derive(setup, f);
    let expected = setup
        .expected
        .map_or("left out (the limiter's default)".to_owned(), |n| n.to_string());
    let lease = setup.lease.map_or("no lease".to_owned(), |(min, max)| {
        format!("batches {min}..{max}, ttl {} ms", setup.ttl.as_millis())
    });
    println!(
        "simulate: {} processes (expected_processes {expected}), rule {} (capacity {}, {}/s, {lease})",
        setup.processes, setup.rule, setup.capacity, setup.rate_per_s
    );
    println!(
        "  {} decisions/s on one key{} for {:?} of virtual time, store round trip {} ms ({:.1} s of real time)",
        setup.demand_per_s,
        if setup.skew {
            ", a tenth of the processes carrying half"
        } else {
            ""
        },
        setup.duration,
        setup.rtt_ms,
        f.real_s
    );
    let steady = |x: Option<f64>, digits: usize| x.map_or("-".to_owned(), |x| format!("{x:.digits$}"));
    println!(
        "  store calls/s        {:>10.1}   (from {STEADY_FROM_S} s on: {})",
        d.calls_per_s,
        steady(d.steady_calls_per_s, 1)
    );
    println!(
        "  beats/s              {:>10.1}   (the fleet's count: {} live processes; beats are not in the calls)",
        f.beats as f64 / setup.duration.as_secs_f64(),
        f.counted
    );
    println!("  operations/s         {}", ops_text(&d.ops_per_s));
    if let Some(steady) = &d.steady_ops_per_s {
        println!("    from {STEADY_FROM_S} s on          {}", ops_text(steady));
    }
    println!(
        "  calls per admitted   {:>10.4}   (from {STEADY_FROM_S} s on: {}; the lease's floor: {}, one lease per \
         min(2 × max_batch, capacity) tokens)",
        d.calls_per_admitted,
        steady(d.steady_calls_per_admitted, 4),
        steady(setup.floor(), 4)
    );
    println!(
        "  admitted             {:>10}   of the bound {} = capacity + rate × (duration + ttl): {:.1} %",
        f.admitted, d.bound, d.sold_pct
    );
    println!(
        "  of what could sell   {:>10.1} % (the bound, or the {} decisions made where fewer)",
        d.sold_of_could_pct, d.could_sell
    );
    println!("  unsold               {:>10}", d.unsold);
    println!(
        "  worst window         {:>10.3}   of its bound: {} admitted in {:.2} s from {:.2} s (bound {:.0}){}",
        f.worst.ratio,
        f.worst.admitted,
        f.worst.window.as_secs_f64(),
        f.worst.start.as_secs_f64(),
        f.worst.limit,
        if f.worst.ratio > 1.0 { "  OVER THE BOUND" } else { "" }
    );
    println!(
        "  leased {} tokens, gave back {}, {} pending at the end (granted, sold later), {} held in reserves; {} \
         decisions, {} errors, {} by fail_mode",
        f.leased, f.returned, f.pending, f.reserved, f.decisions, f.errors, f.fail_mode
    );
    println!("  calls per second     {:?}", d.calls_by_second);
    println!("  admitted per second  {:?}", f.admitted_by_second);
    println!("  leased per second    {:?}", f.leased_by_second);
    println!("  given back per sec.  {:?}", f.returned_by_second);
}
