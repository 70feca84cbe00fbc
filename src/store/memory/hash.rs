//! What the in-process store keeps of a token bucket beside its level: the marks of the calls applied once,
//! and the fields of the bucket's hash (`token_lease.lua`'s turn).

/// The marked give-backs applied to a bucket, by id: what each added (tokens) and until when it is remembered
/// (ms). Redis keeps each in a key of its own beside the bucket (`token_return.lua`); here they live in the
/// bucket's entry, so a give-back and its mark are one step under one lock.
pub(super) type Marks = Vec<(String, u64, u64)>;

/// The fields of a bucket's hash beside its level, gone with the hash: Redis deletes it when the bucket is full
/// (a save) or expires it when it would be (its TTL).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Fields {
    /// The last turn handed out (ms, 0 when none: `token_lease.lua`'s `turn`).
    pub(super) turn_ms: u64,
}
