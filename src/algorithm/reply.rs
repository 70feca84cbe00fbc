//! The reply every algorithm and every Lua script gives, and the integers of that protocol: "never", the
//! largest exact quantity, milliseconds.

/// The reply every algorithm (and every Lua script) gives: `{ granted, remaining, retry_after_ms, reset_after_ms }`,
/// and a lease's stamp after them.
///
/// See docs/ARCHITECTURE.md, "The Lua protocol".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Reply {
    /// Tokens granted: 0 when refused; for a plain check 0 or the cost; for a lease between `min` and `max`.
    pub granted: u64,
    /// Whole tokens left after this call.
    pub remaining: u64,
    /// Milliseconds until the same call would be granted: 0 when granted, [`NEVER`] when it never can.
    pub retry_after_ms: i64,
    /// Milliseconds until the key is back to its full allowance, [`NEVER`] when it never will be.
    pub reset_after_ms: i64,
    /// A lease's grant: its stamp in the bucket's notes of room (`token_lease.lua`'s fifth integer), which its
    /// give-back sends back ([`crate::algorithm::room::Rooms`]); 0 otherwise.
    pub stamp: u64,
    /// A lease that asked to hold tokens (`src/algorithm/hold.rs`): the tokens its holder holds after it
    /// (`token_lease.lua`'s sixth integer); 0 otherwise.
    pub held: u64,
}

/// The `-1` of the protocol: "never" in `retry_after_ms` and `reset_after_ms`.
pub const NEVER: i64 = -1;

impl Reply {
    /// Builds a reply from the four integers a Lua script returns, and a lease's stamp (0 when absent); a
    /// lease's hold is set apart ([`Reply::held`]).
    pub fn from_wire(values: [i64; 4], stamp: i64) -> Self {
        let [granted, remaining, retry_after_ms, reset_after_ms] = values;
        Self {
            granted: u64::try_from(granted).unwrap_or(0),
            remaining: u64::try_from(remaining).unwrap_or(0),
            retry_after_ms,
            reset_after_ms,
            stamp: u64::try_from(stamp).unwrap_or(0),
            held: 0,
        }
    }
}

/// The largest integer every quantity in the scripts may reach: Lua numbers are doubles, exact below 2^53.
pub const MAX_EXACT: u64 = 1 << 53;

/// `ceil(a / b)` for `b > 0`.
#[inline]
pub(crate) fn ceil_div(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

/// Converts a millisecond count to the protocol's signed integer, saturating.
#[inline]
pub(crate) fn ms(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}
