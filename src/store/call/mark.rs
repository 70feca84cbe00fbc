//! How long `token_return.lua` remembers the marks of the calls it applies once: give-backs and debits.

use crate::algorithm::TokenBucket;

/// How long the mark of a give-back is remembered (`token_return.lua` sets it with this PX, ms): longer than the
/// retries of one call.
pub(crate) const GIVE_BACK_MARK_MS: u64 = 10_000;

/// How long the mark of a debit of `tokens` to `bucket` is remembered (`token_return.lua` sets it with this PX,
/// ms): a debit sent again later than this after it was applied would be applied again. Ten minutes, or four
/// refills from empty and twice the debit's refill where that is longer: a presumed debit
/// (`fallback/presumed_mode.rs`) is sent by every process for up to two refills and its own after it heard of it.
pub(crate) fn debit_mark_ms(bucket: TokenBucket, tokens: u64) -> u64 {
    const MIN: u64 = 600_000;
    if bucket.rate == 0 {
        return MIN;
    }
    let units = (bucket.capacity.saturating_mul(4))
        .saturating_add(tokens.saturating_mul(2))
        .saturating_mul(bucket.per_ms);
    units.div_ceil(bucket.rate).max(MIN)
}
