//! What a worker reports (its counts and its latency histogram, base64 of the V2 serialization), and the merge of
//! the workers' reports.

use base64::Engine as _;
use hdrhistogram::serialization::{Deserializer, Serializer, V2Serializer};
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::keys::KeyCounts;

/// What a worker reports.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(super) struct Report {
    pub(super) attempts: u64,
    pub(super) admitted: u64,
    pub(super) rejected: u64,
    pub(super) errors: u64,
    /// Hot-key (or SKU) decisions made in process (`source = local`): from leased tokens, or a remembered refusal.
    pub(super) by_lease: u64,
    /// Hot-key (or SKU) decisions made by a store call (`source = redis` or `memory`).
    pub(super) by_store: u64,
    /// Hot-key (or SKU) decisions made by the rule's fail_mode because the store failed.
    pub(super) fallback: u64,
    /// All decisions made by fail_mode, by why: a store error, a store call's timeout, the breaker open.
    pub(super) fail_mode_errors: u64,
    pub(super) fail_mode_timeouts: u64,
    pub(super) fail_mode_circuit_open: u64,
    pub(super) user_attempts: u64,
    pub(super) user_admitted: u64,
    pub(super) redis_calls: u64,
    pub(super) leased_tokens: u64,
    pub(super) returned_tokens: u64,
    /// Tokens granted to paced leases and not yet released when the sale ended (given back at the shutdown):
    /// sold later in a sale that went on, not lost.
    #[serde(default)]
    pub(super) pending_tokens: u64,
    /// Tokens held in the reserves of `fail_mode = "local"` when the sale ended: out of the bucket until the
    /// holds end, sold only while the store fails.
    #[serde(default)]
    pub(super) reserved_tokens: u64,
    /// Refusals the limiter answered in process from a refusal it remembered (no store call).
    #[serde(default)]
    pub(super) refusals_answered: u64,
    /// The worker's peak resident memory in KiB (Linux's `VmHWM`; 0 where unknown); the most of any worker
    /// once merged.
    #[serde(default)]
    pub(super) peak_rss_kib: u64,
    pub(super) first_us: u64,
    pub(super) last_us: u64,
    pub(super) histogram: String,
    /// With `--keys`: the process's admitted count per SKU and the SKUs that leased.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) keys: Option<KeyCounts>,
}

impl Report {
    /// Seconds from the first task's start to the last one's end.
    pub(super) fn span_s(&self) -> f64 {
        self.last_us.saturating_sub(self.first_us.min(self.last_us)) as f64 / 1e6
    }

    /// Adds the decision counts of `other` (a task's or a process's) to these.
    pub(super) fn add_decisions(&mut self, other: &Report) {
        self.attempts += other.attempts;
        self.admitted += other.admitted;
        self.rejected += other.rejected;
        self.errors += other.errors;
        self.by_lease += other.by_lease;
        self.by_store += other.by_store;
        self.fallback += other.fallback;
        self.user_attempts += other.user_attempts;
        self.user_admitted += other.user_admitted;
    }
}

pub(super) fn new_histogram() -> Result<Histogram<u64>, String> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).map_err(|e| e.to_string())
}

pub(super) fn encode_histogram(hist: &Histogram<u64>) -> Result<String, String> {
    let mut bytes = Vec::new();
    V2Serializer::new()
        .serialize(hist, &mut bytes)
        .map_err(|e| e.to_string())?;
    Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
}

fn decode_histogram(b64: &str) -> Result<Histogram<u64>, String> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| e.to_string())?;
    Deserializer::new()
        .deserialize(&mut bytes.as_slice())
        .map_err(|e| e.to_string())
}

/// The workers' reports summed, their span from the first worker's start to the last one's end, and their
/// histograms merged.
pub(super) fn merge(reports: &[Report]) -> Result<(Report, Histogram<u64>), String> {
    let mut hist = new_histogram()?;
    let mut total = Report {
        first_us: u64::MAX,
        ..Report::default()
    };
    for r in reports {
        total.add_decisions(r);
        total.redis_calls += r.redis_calls;
        total.leased_tokens += r.leased_tokens;
        total.returned_tokens += r.returned_tokens;
        total.pending_tokens += r.pending_tokens;
        total.reserved_tokens += r.reserved_tokens;
        total.refusals_answered += r.refusals_answered;
        total.peak_rss_kib = total.peak_rss_kib.max(r.peak_rss_kib);
        total.fail_mode_errors += r.fail_mode_errors;
        total.fail_mode_timeouts += r.fail_mode_timeouts;
        total.fail_mode_circuit_open += r.fail_mode_circuit_open;
        if r.attempts > 0 {
            total.first_us = total.first_us.min(r.first_us);
            total.last_us = total.last_us.max(r.last_us);
        }
        hist.add(decode_histogram(&r.histogram)?).map_err(|e| e.to_string())?;
    }
    Ok((total, hist))
}
