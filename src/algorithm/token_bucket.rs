//! Token bucket with lazy refill, in exact integer arithmetic (mirrored by `lua/token_bucket.lua`,
//! `lua/token_return.lua` and `lua/token_acquire.lua`).
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
    /// Tokens × `per_ms` (so that refill is exact). Negative while the bucket is in debt (see
    /// [`TokenBucket::acquire`]).
    pub level: i64,
    /// Milliseconds at which `level` was computed.
    pub ts_ms: u64,
    /// The `per_ms` the level is counted in: a rule reloaded with another period rescales it.
    pub per_ms: u64,
}

/// `ceil(a / b)` for `a ≥ 0`, `b > 0`, in the protocol's signed milliseconds.
fn ceil_ms(a: i64, b: u64) -> i64 {
    ms(ceil_div(u64::try_from(a).unwrap_or(0), b))
}

impl TokenBucket {
    /// The full level in state units.
    #[inline]
    fn full(&self) -> i64 {
        i64::try_from(self.capacity.saturating_mul(self.per_ms)).unwrap_or(i64::MAX)
    }

    #[inline]
    fn units(&self, tokens: u64) -> i64 {
        i64::try_from(tokens.saturating_mul(self.per_ms)).unwrap_or(i64::MAX)
    }

    /// Whole tokens in `level` (floor; negative in debt).
    #[inline]
    fn tokens(&self, level: i64) -> i64 {
        level.div_euclid(ms(self.per_ms))
    }

    /// One process's share of a bucket shared by `processes` processes: `capacity / processes` tokens (at least
    /// 1), refilled at `rate / processes` per period, which is `rate` per `processes × per` (exact).
    pub(crate) fn share(&self, processes: u64) -> Self {
        Self {
            capacity: (self.capacity / processes.max(1)).max(1),
            rate: self.rate,
            per_ms: self.per_ms.saturating_mul(processes.max(1)),
        }
    }

    /// Whether every quantity stays exact in Lua's doubles (capacity × per_ms below 2^53).
    pub(crate) fn is_exact_in_lua(&self) -> bool {
        self.capacity.checked_mul(self.per_ms).is_some_and(|v| v < MAX_EXACT)
            && self.rate.checked_mul(self.per_ms).is_some_and(|v| v < MAX_EXACT)
    }

    /// The state at `now_ms`: a missing bucket is full, then the refill since the last timestamp, capped.
    pub(crate) fn refill(&self, state: Option<TokenBucketState>, now_ms: u64) -> TokenBucketState {
        let full = self.full();
        match state {
            None => TokenBucketState {
                level: full,
                ts_ms: now_ms,
                per_ms: self.per_ms,
            },
            Some(s) => {
                let (mut level, mut ts_ms) = (s.level, s.ts_ms);
                if s.per_ms != self.per_ms && s.per_ms > 0 {
                    let scaled = (i128::from(level) * i128::from(self.per_ms)).div_euclid(i128::from(s.per_ms));
                    level = i64::try_from(scaled).unwrap_or(full);
                }
                if now_ms > ts_ms {
                    let added = i128::from(now_ms - ts_ms) * i128::from(self.rate);
                    level = i64::try_from((i128::from(level) + added).min(i128::from(full))).unwrap_or(full);
                    ts_ms = now_ms;
                }
                TokenBucketState {
                    level: level.min(full),
                    ts_ms,
                    per_ms: self.per_ms,
                }
            }
        }
    }

    /// Milliseconds until `level` reaches full, [`NEVER`] at rate 0.
    fn reset_after(&self, level: i64) -> i64 {
        let full = self.full();
        if level >= full {
            0
        } else if self.rate == 0 {
            NEVER
        } else {
            ceil_ms(full - level, self.rate)
        }
    }

    /// Takes between `min` and `max` tokens at `now_ms`: all that is there up to `max` when at least `min` is
    /// there, else nothing. Returns the new state (`None` = full, the key can be deleted) and the reply.
    ///
    /// `retry_after_ms` of a refusal is the time until `min` tokens are there, [`NEVER`] when `min` exceeds
    /// the capacity or the rate is 0.
    pub(crate) fn take(
        &self,
        state: Option<TokenBucketState>,
        min: u64,
        max: u64,
        now_ms: u64,
    ) -> (Option<TokenBucketState>, Reply) {
        let mut s = self.refill(state, now_ms);
        let tokens = self.tokens(s.level);
        let (mut granted, mut retry_after_ms) = (0, 0);
        if min > self.capacity {
            retry_after_ms = NEVER;
        } else if tokens >= ms(min) {
            granted = u64::try_from(tokens).unwrap_or(0).min(max.max(min));
            s.level -= self.units(granted);
        } else if self.rate == 0 {
            retry_after_ms = NEVER;
        } else {
            retry_after_ms = ceil_ms(self.units(min) - s.level, self.rate);
        }
        let reply = Reply {
            granted,
            remaining: u64::try_from(self.tokens(s.level)).unwrap_or(0),
            retry_after_ms,
            reset_after_ms: self.reset_after(s.level),
        };
        (self.stored(s), reply)
    }

    /// Guava's "consume now, pay later" (`SmoothBursty`): a caller not behind a debt gets its `cost` tokens at
    /// once, even more than are there, and the bucket goes into debt; a caller behind a debt waits until it is
    /// repaid (`retry_after_ms` of a grant is that wait), then takes its tokens, deepening the debt for the
    /// next. A wait above `max_wait_ms` is refused (`retry_after_ms` = until it would fit). Mirrors
    /// `lua/token_acquire.lua`.
    pub(crate) fn acquire(
        &self,
        state: Option<TokenBucketState>,
        cost: u64,
        max_wait_ms: u64,
        now_ms: u64,
    ) -> (Option<TokenBucketState>, Reply) {
        let mut s = self.refill(state, now_ms);
        let refuse = |retry_after_ms: i64, level: i64| Reply {
            granted: 0,
            remaining: u64::try_from(self.tokens(level)).unwrap_or(0),
            retry_after_ms,
            reset_after_ms: self.reset_after(level),
        };
        if cost > self.capacity || (self.rate == 0 && s.level < self.units(cost)) {
            return (state, refuse(NEVER, s.level));
        }
        let wait = if s.level >= 0 { 0 } else { ceil_ms(-s.level, self.rate) };
        if wait > ms(max_wait_ms) {
            return (state, refuse(wait - ms(max_wait_ms), s.level));
        }
        s.level -= self.units(cost);
        let reply = Reply {
            granted: cost,
            remaining: u64::try_from(self.tokens(s.level)).unwrap_or(0),
            retry_after_ms: wait,
            reset_after_ms: self.reset_after(s.level),
        };
        (self.stored(s), reply)
    }

    /// [`TokenBucket::take`] behind a ban (seed 003): a banned key is refused until the ban ends; a refusal
    /// bans it for `ban_ms` (0 = never). Mirrors `token_bucket.lua` called with a ban key.
    pub(crate) fn take_banned(
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
                remaining: u64::try_from(self.tokens(s.level)).unwrap_or(0),
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
    pub(crate) fn give_back(
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
        let before = self.tokens(s.level);
        s.level = s.level.saturating_add(self.units(tokens)).min(self.full());
        let after = self.tokens(s.level);
        let reply = Reply {
            granted: u64::try_from(after - before).unwrap_or(0),
            remaining: u64::try_from(after).unwrap_or(0),
            retry_after_ms: 0,
            reset_after_ms: self.reset_after(s.level),
        };
        (self.stored(s), reply)
    }

    /// Charges `tokens` admitted elsewhere at `now_ms` (a process that decided alone under
    /// `fail_mode = "local"` while the store failed): the level goes down by `tokens`, into debt if need be, but
    /// not below −capacity. A missing bucket is full. The reply's `granted` is 0.
    pub(crate) fn debit(
        &self,
        state: Option<TokenBucketState>,
        tokens: u64,
        now_ms: u64,
    ) -> (Option<TokenBucketState>, Reply) {
        let mut s = self.refill(state, now_ms);
        // Not below −capacity, nor below where it was (an acquire's debt may be deeper): a debit never adds.
        let floor = s.level.min(-self.full());
        s.level = s.level.saturating_sub(self.units(tokens)).max(floor);
        let reply = Reply {
            granted: 0,
            remaining: u64::try_from(self.tokens(s.level)).unwrap_or(0),
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
