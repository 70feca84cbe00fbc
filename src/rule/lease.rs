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
    /// How long an outage a hot key's *reserve* covers under `fail_mode = "local"`: while the store answers, each
    /// process holds in escrow what its share of the rate sells in that long (at most what its demand spends,
    /// and the fleet at most half the burst), and while the store fails it sells those tokens, paced over that
    /// long, and refuses once they are spent (`src/algorithm/hold.rs`). `None`: [`Lease::DEFAULT_RESERVE`];
    /// zero: no reserve. Unused under `open` and `closed`.
    pub reserve: Option<Duration>,
}

impl Lease {
    /// The reserve of a `local` rule that does not set one: 250 ms of its share of the rate (a longer one holds
    /// more of the burst: README, "Guarantees and failures").
    pub const DEFAULT_RESERVE: Duration = Duration::from_millis(250);

    /// The longest reserve a rule may set: an hour.
    pub const MAX_RESERVE: Duration = Duration::from_secs(3600);
}
