//! How long `token_return.lua` remembers the marks of the give-backs it applies once.

/// How long the mark of a give-back is remembered (`token_return.lua` sets it with this PX, ms): longer than the
/// retries of one call.
pub(crate) const GIVE_BACK_MARK_MS: u64 = 10_000;
