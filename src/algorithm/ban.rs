//! The ban of seed 003: after a breach a key is refused until a timestamp, whatever its algorithm says.

use super::{ms, Reply};

/// A ban (seed 003): after a refusal the key is refused until `until_ms`, whatever its window says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Ban {
    /// Milliseconds until which the key is refused (0: not banned).
    pub until_ms: u64,
}

impl Ban {
    /// The ban's rest at `now_ms`, `None` when not banned.
    pub(crate) fn left(&self, now_ms: u64) -> Option<u64> {
        (self.until_ms > now_ms).then(|| self.until_ms - now_ms)
    }

    /// The reply to a refusal: bans for `ban_ms` (no-op when 0), whose rest then is the `retry_after` and at
    /// least the `reset_after`.
    pub(crate) fn refuse(
        &mut self,
        ban_ms: u64,
        now_ms: u64,
        remaining: u64,
        retry_after_ms: i64,
        reset_after_ms: u64,
    ) -> Reply {
        let retry_after_ms = self.breach(ban_ms, now_ms, retry_after_ms);
        let reset_after_ms = if ban_ms > 0 {
            reset_after_ms.max(ban_ms)
        } else {
            reset_after_ms
        };
        Reply {
            granted: 0,
            remaining,
            retry_after_ms,
            reset_after_ms: ms(reset_after_ms),
            stamp: 0,
            held: 0,
        }
    }

    /// Bans for `ban_ms` from `now_ms` (no-op when `ban_ms` is 0); returns the new retry_after.
    pub(crate) fn breach(&mut self, ban_ms: u64, now_ms: u64, retry_after_ms: i64) -> i64 {
        if ban_ms == 0 {
            return retry_after_ms;
        }
        self.until_ms = now_ms.saturating_add(ban_ms);
        ms(ban_ms)
    }
}

/// The reply to a banned key: nothing granted, retry when the ban ends.
pub(crate) fn banned(left: u64, remaining: u64, reset_after_ms: u64) -> Reply {
    Reply {
        granted: 0,
        remaining,
        retry_after_ms: ms(left),
        reset_after_ms: ms(reset_after_ms.max(left)),
        stamp: 0,
        held: 0,
    }
}
