//! The JSON body of `POST /v1/check`, serialized from a struct (serde's derive) straight into the response's
//! bytes: building a `serde_json::Value` map for it, then printing the map, cost a tree of allocations on every
//! request.

use std::time::Duration;

use tokenlease::Decision;

/// `{"allowed", "remaining", "reset_after_ms", "retry_after_ms", "shadowed", "source"}`: a [`Decision`] as the
/// sidecar answers it, the fields in this (alphabetical) order; durations in whole milliseconds, `null` for
/// "never".
#[derive(Debug, serde::Serialize)]
pub(crate) struct Checked {
    allowed: bool,
    remaining: u64,
    reset_after_ms: Option<u64>,
    retry_after_ms: Option<u64>,
    shadowed: bool,
    source: &'static str,
}

impl Checked {
    /// The body answering `decision`.
    pub(crate) fn of(decision: &Decision) -> Self {
        Self {
            allowed: decision.allowed,
            remaining: decision.remaining,
            reset_after_ms: millis(decision.reset_after),
            retry_after_ms: millis(decision.retry_after),
            shadowed: decision.shadowed,
            source: decision.source.as_str(),
        }
    }
}

/// Whole milliseconds (truncated), `None` for [`Duration::MAX`] ("never").
fn millis(d: Duration) -> Option<u64> {
    (d != Duration::MAX).then(|| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
