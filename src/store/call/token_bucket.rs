//! The token bucket's calls: takes, leases, give-backs and pay-later acquires (`token_bucket.lua`,
//! `token_lease.lua`, `token_return.lua`, `token_acquire.lua`).

use std::time::Duration;

use super::{Call, Op};
use crate::algorithm::room::Lent;
use crate::algorithm::{HoldAsk, Pace, TokenBucket};

impl Call {
    /// `token_bucket.lua`: take between `min` and `max` tokens (the limiter leases with [`Call::lease`]).
    #[cfg(test)]
    pub(crate) fn take(key: impl Into<String>, bucket: TokenBucket, min: u64, max: u64) -> Self {
        Self::new(
            key,
            Op::TokenBucket {
                bucket,
                min,
                max,
                ban_ms: 0,
            },
        )
    }

    /// `token_bucket.lua` with its ban key: take `cost` tokens, ban for `ban_ms` after a refusal.
    pub(crate) fn take_or_ban(key: impl Into<String>, bucket: TokenBucket, cost: u64, ban_ms: u64) -> Self {
        Self::new(
            key,
            Op::TokenBucket {
                bucket,
                min: cost,
                max: cost,
                ban_ms,
            },
        )
    }

    /// `token_lease.lua`: a lease of between `min` and `max` tokens sized for `batch`, handed the bucket's next
    /// turn (`batch` spaces them) when it leaves fewer than `min` tokens behind.
    pub(crate) fn lease(key: impl Into<String>, bucket: TokenBucket, (min, max): (u64, u64), batch: u64) -> Self {
        Self::new(
            key,
            Op::TokenLease {
                bucket,
                min,
                max,
                batch,
                pace: Pace::default(),
                hold: None,
            },
        )
    }

    /// This lease (of [`Call::lease`]) released by `pace`: in chunks, the bucket keeping what is to be released
    /// as pending. Other calls are returned unchanged.
    #[must_use]
    pub(crate) fn paced(mut self, pace: Pace) -> Self {
        if let Op::TokenLease { pace: p, .. } = &mut self.op {
            *p = pace;
        }
        self
    }

    /// This lease (of [`Call::lease`]) asking to hold tokens for an outage (`fail_mode = "local"`'s reserve,
    /// [`crate::algorithm::hold`]). Other calls are returned unchanged.
    #[must_use]
    pub(crate) fn holding(mut self, ask: HoldAsk) -> Self {
        if let Op::TokenLease { hold, .. } = &mut self.op {
            *hold = Some(ask);
        }
        self
    }

    /// `token_return.lua`: `tokens` back to the bucket.
    pub(crate) fn give_back(key: impl Into<String>, bucket: TokenBucket, tokens: u64) -> Self {
        Self::new(
            key,
            Op::TokenReturn {
                bucket,
                tokens,
                id: None,
                mark_ms: 0,
                lent: Vec::new(),
            },
        )
    }

    /// This give-back (of [`Call::give_back`]) of the tokens of the leases `lent` names ([`Lent`], by the
    /// [`crate::algorithm::Reply::stamp`] of each): its tokens become their sum, and each lease's add at most the
    /// room the bucket had since it. Applies to a call made [`Call::once`] (the script reads the stamps after the
    /// mark); other calls are returned unchanged.
    #[must_use]
    pub(crate) fn since(mut self, lent: Vec<Lent>) -> Self {
        if let Op::TokenReturn { tokens, lent: at, .. } = &mut self.op {
            *tokens = lent.iter().map(|l| l.tokens).sum();
            *at = lent;
        }
        self
    }

    /// This give-back (of [`Call::give_back`]) applied once however often it is sent with the same `id` (unique
    /// to the call; it must not hold `}`) within `mark` (longer than the call and its retries may take,
    /// [`crate::timings::Timings::mark`]): sent again after a connection dropped once the script ran (a Cluster
    /// client retries such a call), it does not add the tokens twice. Other calls are returned unchanged.
    #[must_use]
    pub(crate) fn once(mut self, id: impl Into<String>, mark: Duration) -> Self {
        if let Op::TokenReturn { id: at, mark_ms, .. } = &mut self.op {
            *at = Some(id.into());
            *mark_ms = crate::clock::millis(mark).max(1);
        }
        self
    }

    /// `token_acquire.lua`: take `cost` now and pay later, when the wait fits in `max_wait_ms`.
    pub(crate) fn acquire(key: impl Into<String>, bucket: TokenBucket, cost: u64, max_wait_ms: u64) -> Self {
        Self::new(
            key,
            Op::TokenAcquire {
                bucket,
                cost,
                max_wait_ms,
            },
        )
    }
}
