//! A token-bucket rule's lease settings: the batch sizes, how long a batch may be spent, when a key is hot.

use std::time::Duration;

/// How a token-bucket rule leases batches of tokens into the process (docs/ARCHITECTURE.md, invariant 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// Smallest batch asked for, in tokens (≥ 1), but by a key whose demand spends less in the TTL on a shared
    /// bucket that is not saturated: that key asks for what it spends (a batch it would mostly give back costs a
    /// give-back per lease).
    pub min_batch: u64,
    /// Largest batch asked for, in tokens (≥ `min_batch`, ≤ the capacity).
    pub max_batch: u64,
    /// How long leased tokens may be spent; what is left then goes back to the shared bucket.
    pub ttl: Duration,
    /// Decisions a key needs, counted over the recent TTLs (each TTL's count halved at the next), before it
    /// leases: until then each of its decisions is one store call, as without a lease. `Some(1)` leases every
    /// key from its first decision; `None` (the default) is a quarter of `min_batch`, at least 3: about an
    /// eighth of a batch per TTL, steadily.
    pub hot_after: Option<u64>,
}
