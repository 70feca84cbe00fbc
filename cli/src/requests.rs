//! The sidecar's own requests, counted and timed per protocol: `tokenlease_serve_requests_total{protocol, code}`
//! and `tokenlease_serve_request_duration_seconds{protocol}`. `protocol` is `http` or `grpc` (Envoy's RLS);
//! `code` is the HTTP status (`200`, `429`, ...) or the RLS answer (`ok`, `over_limit`, or the gRPC status of a
//! refused request, such as `invalid_argument`). The handles of the common codes are made once, so a request
//! costs no lookup in the registry.

use std::time::Duration;

use metrics::{counter, describe_counter, describe_histogram, histogram, Counter, Histogram, Unit};

/// Requests answered, by `protocol` and `code`.
pub(crate) const REQUESTS_TOTAL: &str = "tokenlease_serve_requests_total";
/// How long requests took, from their headers read to their answer, by `protocol`.
pub(crate) const REQUEST_DURATION_SECONDS: &str = "tokenlease_serve_request_duration_seconds";
/// Its buckets, in seconds: 10 µs to 10 s (a queued `acquire` waits up to its rule's `max_wait`).
pub(crate) const REQUEST_BUCKETS: &[f64] = &[
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Describes the metrics (once, at start).
pub(crate) fn describe() {
    describe_counter!(
        REQUESTS_TOTAL,
        Unit::Count,
        "Requests the sidecar answered, by protocol and code"
    );
    describe_histogram!(
        REQUEST_DURATION_SECONDS,
        Unit::Seconds,
        "How long the sidecar's requests took, from their headers to their answer, by protocol"
    );
}

/// The counters and the histogram of one protocol.
#[derive(Debug, Clone)]
pub(crate) struct Requests {
    protocol: &'static str,
    codes: Vec<(&'static str, Counter)>,
    duration: Histogram,
}

impl Requests {
    /// The handles of `protocol`, for its `codes` known in advance (others are looked up when they occur).
    pub(crate) fn new(protocol: &'static str, codes: &[&'static str]) -> Self {
        Self {
            protocol,
            codes: (codes.iter())
                .map(|code| (*code, counter!(REQUESTS_TOTAL, "protocol" => protocol, "code" => *code)))
                .collect(),
            duration: histogram!(REQUEST_DURATION_SECONDS, "protocol" => protocol),
        }
    }

    /// The HTTP API's handles.
    pub(crate) fn http() -> Self {
        Self::new("http", &["200", "400", "404", "413", "429", "500", "503"])
    }

    /// Envoy RLS's handles.
    pub(crate) fn grpc() -> Self {
        Self::new("grpc", &["ok", "over_limit", "invalid_argument", "unavailable"])
    }

    /// Counts a request answered `code` after `took`.
    pub(crate) fn record(&self, code: &str, took: Duration) {
        match self.codes.iter().find(|(known, _)| *known == code) {
            Some((_, counter)) => counter.increment(1),
            None => counter!(REQUESTS_TOTAL, "protocol" => self.protocol, "code" => code.to_owned()).increment(1),
        }
        self.duration.record(took.as_secs_f64());
    }
}
