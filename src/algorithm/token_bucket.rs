//! Token bucket with lazy refill, in exact integer arithmetic (mirrored by `lua/token_bucket.lua` and
//! `lua/token_return.lua`).
//!
//! The level is kept in units of `1 / per_ms` token, so a refill of `rate` tokens per `per_ms` milliseconds
//! adds exactly `rate` units each millisecond: a token due at a millisecond is there at that millisecond and
//! nothing drifts, unlike a float refill. Seed 002's "refill task that pushes tokens on a schedule" is replaced
//! by computing the refill from the last timestamp when the bucket is next touched.

use super::{ceil_div, ms, Ban, Reply, MAX_EXACT, NEVER};

/// Parameters of one token bucket: `capacity` tokens, refilled with `rate` tokens every `per_ms` milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenBucket {
    /// Tokens the bucket holds when full (the burst). At least 1.
    pub capacity: u64,
    /// Tokens added every `per_ms`. 0 makes a stock that never refills.
    pub rate: u64,
    /// The refill period in milliseconds. At least 1.
    pub per_ms: u64,
}

/// The stored state of one bucket: what the Redis hash holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TokenBucketState {
    /// Tokens × `per_ms` (so that refill is exact).
    pub level: u64,
    /// Milliseconds at which `level` was computed.
    pub ts_ms: u64,
}

impl TokenBucket {
    /// The full level in state units.
    #[inline]
    fn full(&self) -> u64 {
        self.capacity.saturating_mul(self.per_ms)
    }

    /// Whether every quantity stays exact in Lua's doubles (capacity × per_ms below 2^53).
    pub fn is_exact_in_lua(&self) -> bool {
        self.capacity.checked_mul(self.per_ms).is_some_and(|v| v < MAX_EXACT)
            && self.rate.checked_mul(self.per_ms).is_some_and(|v| v < MAX_EXACT)
    }

    /// The state at `now_ms`: a missing bucket is full, then the refill since the last timestamp, capped.
    pub fn refill(&self, state: Option<TokenBucketState>, now_ms: u64) -> TokenBucketState {
        let full = self.full();
        match state {
            None => TokenBucketState {
                level: full,
                ts_ms: now_ms,
            },
            Some(s) => {
                let (mut level, mut ts_ms) = (s.level, s.ts_ms);
                if now_ms > ts_ms {
                    level = level.saturating_add((now_ms - ts_ms).saturating_mul(self.rate));
                    ts_ms = now_ms;
                }
                TokenBucketState {
                    level: level.min(full),
                    ts_ms,
                }
            }
        }
    }

    /// Milliseconds until `level` reaches full, [`NEVER`] at rate 0.
    fn reset_after(&self, level: u64) -> i64 {
        let full = self.full();
        if level >= full {
            0
        } else if self.rate == 0 {
            NEVER
        } else {
            ms(ceil_div(full - level, self.rate))
        }
    }

    /// Takes between `min` and `max` tokens at `now_ms`: all that is there up to `max` when at least `min` is
    /// there, else nothing. Returns the new state (`None` = full, the key can be deleted) and the reply.
    ///
    /// `retry_after_ms` of a refusal is the time until `min` tokens are there, [`NEVER`] when `min` exceeds
    /// the capacity or the rate is 0.
    pub fn take(
        &self,
        state: Option<TokenBucketState>,
        min: u64,
        max: u64,
        now_ms: u64,
    ) -> (Option<TokenBucketState>, Reply) {
        let mut s = self.refill(state, now_ms);
        let per = self.per_ms;
        let tokens = s.level / per;
        let (mut granted, mut retry_after_ms) = (0, 0);
        if min > self.capacity {
            retry_after_ms = NEVER;
        } else if tokens >= min {
            granted = tokens.min(max.max(min));
            s.level -= granted * per;
        } else if self.rate == 0 {
            retry_after_ms = NEVER;
        } else {
            retry_after_ms = ms(ceil_div(min * per - s.level, self.rate));
        }
        let reply = Reply {
            granted,
            remaining: s.level / per,
            retry_after_ms,
            reset_after_ms: self.reset_after(s.level),
        };
        (self.stored(s), reply)
    }

    /// [`TokenBucket::take`] behind a ban (seed 003): a banned key is refused until the ban ends; a refusal
    /// bans it for `ban_ms` (0 = never). Mirrors `token_bucket.lua` called with a ban key.
    pub fn take_banned(
        &self,
        state: Option<TokenBucketState>,
        ban: &mut Ban,
        min: u64,
        max: u64,
        ban_ms: u64,
        now_ms: u64,
    ) -> (Option<TokenBucketState>, Reply) {
        // "Never full" (rate 0) stays never; otherwise the key is whole again when both the bucket and the ban are.
        let at_least = |reset: i64, ms: i64| if reset == NEVER { NEVER } else { reset.max(ms) };
        if let Some(left) = ban.left(now_ms) {
            let s = self.refill(state, now_ms);
            let reply = Reply {
                granted: 0,
                remaining: s.level / self.per_ms,
                retry_after_ms: ms(left),
                reset_after_ms: at_least(self.reset_after(s.level), ms(left)),
            };
            return (state, reply);
        }
        let (new, mut reply) = self.take(state, min, max, now_ms);
        if reply.granted == 0 && ban_ms > 0 {
            reply.retry_after_ms = ban.breach(ban_ms, now_ms, reply.retry_after_ms);
            reply.reset_after_ms = at_least(reply.reset_after_ms, ms(ban_ms));
        }
        (new, reply)
    }

    /// Gives `tokens` back at `now_ms`, capped at the capacity; a missing (full) bucket takes nothing.
    /// The reply's `granted` is the number of whole tokens accepted.
    pub fn give_back(
        &self,
        state: Option<TokenBucketState>,
        tokens: u64,
        now_ms: u64,
    ) -> (Option<TokenBucketState>, Reply) {
        let Some(state) = state else {
            return (
                None,
                Reply {
                    granted: 0,
                    remaining: self.capacity,
                    retry_after_ms: 0,
                    reset_after_ms: 0,
                },
            );
        };
        let mut s = self.refill(Some(state), now_ms);
        let before = s.level / self.per_ms;
        s.level = s
            .level
            .saturating_add(tokens.saturating_mul(self.per_ms))
            .min(self.full());
        let after = s.level / self.per_ms;
        let reply = Reply {
            granted: after - before,
            remaining: after,
            retry_after_ms: 0,
            reset_after_ms: self.reset_after(s.level),
        };
        (self.stored(s), reply)
    }

    /// A full bucket equals a missing key: store nothing.
    fn stored(&self, s: TokenBucketState) -> Option<TokenBucketState> {
        (s.level < self.full()).then_some(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NINE_PER_MINUTE: TokenBucket = TokenBucket {
        capacity: 9,
        rate: 9,
        per_ms: 60_000,
    };

    #[test]
    fn tokens_due_at_a_millisecond_are_there_at_it() {
        let b = NINE_PER_MINUTE;
        let (s, r) = b.take(None, 9, 9, 0);
        assert_eq!((r.granted, r.remaining), (9, 0));
        let (_, r) = b.take(s, 3, 3, 19_999);
        assert_eq!((r.granted, r.retry_after_ms), (0, 1));
        let (_, r) = b.take(s, 3, 3, 20_000);
        assert_eq!((r.granted, r.remaining), (3, 0));
    }

    #[test]
    fn a_missing_bucket_starts_full_and_a_full_one_is_not_stored() {
        let b = NINE_PER_MINUTE;
        let (s, r) = b.take(None, 1, 1, 5);
        assert_eq!((r.granted, r.remaining, r.reset_after_ms), (1, 8, 6_667));
        let (s, _) = b.give_back(s, 5, 5);
        assert_eq!(s, None, "a return that fills the bucket deletes it");
    }
}
