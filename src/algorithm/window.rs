//! Window algorithms and the ban (mirrored by `lua/sliding_log.lua`, `lua/fixed_window.lua`,
//! `lua/sliding_window.lua`): seeds 000–004's per-user limits, exact and atomic.
//!
//! Each `take` works on the in-process form of the state (the Redis form is a ZSET, a hash of start and
//! count, a hash of sub-bucket counters) and gives the same [`Reply`] as its script, to the millisecond.

use std::collections::VecDeque;

use super::ban::banned;
use super::{ms, Ban, Reply, NEVER};

/// Milliseconds from `now_ms` until `need` tokens have left, given `(leaves at ms, tokens)` oldest first;
/// [`NEVER`] if they never do.
fn freed_at(leaving: impl Iterator<Item = (u64, u64)>, mut need: u64, now_ms: u64) -> i64 {
    for (at, n) in leaving {
        if n >= need {
            return ms(at.saturating_sub(now_ms));
        }
        need -= n;
    }
    NEVER
}

/// The reply to a peek (cost 0) that a call of one token would pass: nothing granted, nothing to wait for.
fn peeked(remaining: u64, reset_after_ms: u64) -> Reply {
    Reply {
        granted: 0,
        remaining,
        retry_after_ms: 0,
        reset_after_ms: ms(reset_after_ms),
        stamp: 0,
        held: 0,
    }
}

/// Sliding-window log: at most `limit` tokens granted in any window `(now − window_ms, now]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlidingLog {
    /// Tokens per window (≥ 1).
    pub limit: u64,
    /// Window length in milliseconds (≥ 1).
    pub window_ms: u64,
}

/// The log: `(grant time in ms, tokens)`, oldest first.
pub type Log = VecDeque<(u64, u64)>;

impl SlidingLog {
    /// Takes `cost` tokens at `now_ms` when the window has room; refused attempts are not recorded.
    /// A refusal bans the key for `ban_ms` (0 = no ban). Cost 0 is a peek: the reply a call of one token would
    /// get, with nothing granted, recorded or banned (so in the other algorithms too).
    pub fn take(&self, log: &mut Log, ban: &mut Ban, cost: u64, ban_ms: u64, now_ms: u64) -> Reply {
        while log
            .front()
            .is_some_and(|(t, _)| t.saturating_add(self.window_ms) <= now_ms)
        {
            log.pop_front();
        }
        let count: u64 = log.iter().map(|(_, n)| n).sum();
        let reset_after = log.back().map_or(0, |(t, _)| t + self.window_ms - now_ms);
        let remaining = self.limit.saturating_sub(count);
        if let Some(left) = ban.left(now_ms) {
            return banned(left, remaining, reset_after);
        }
        // A peek (cost 0) answers as a call of one token would, and bans nothing.
        let (peek, cost, ban_ms) = (cost == 0, cost.max(1), if cost == 0 { 0 } else { ban_ms });
        if count + cost <= self.limit {
            if peek {
                return peeked(remaining, reset_after);
            }
            // Kept in time order, as the ZSET orders by score, even if a replay's clock steps back.
            let at = log.partition_point(|(t, _)| *t <= now_ms);
            log.insert(at, (now_ms, cost));
            return Reply {
                granted: cost,
                remaining: self.limit - count - cost,
                retry_after_ms: 0,
                reset_after_ms: ms(self.window_ms),
                stamp: 0,
                held: 0,
            };
        }
        // The (count + cost − limit)-th oldest grant must leave the window.
        let leaving = log.iter().map(|(t, n)| (t + self.window_ms, *n));
        let retry_after = if cost <= self.limit {
            freed_at(leaving, count + cost - self.limit, now_ms)
        } else {
            NEVER
        };
        ban.refuse(ban_ms, now_ms, remaining, retry_after, reset_after)
    }
}

/// Fixed window counter: at most `limit` tokens per window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FixedWindow {
    /// Tokens per window (≥ 1).
    pub limit: u64,
    /// Window length in milliseconds (≥ 1).
    pub window_ms: u64,
    /// Where the window holding `now` starts and ends.
    pub frame: Frame,
}

/// Where a fixed window starts and ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Frame {
    /// The first hit opens the window.
    Rolling,
    /// The window holding `now` is `[start_ms, end_ms)`, as a calendar cuts it (the caller found it for this
    /// `now`: `lua/fixed_window.lua` computes it from `align_ms` or picks it among the boundaries sent).
    Between(i64, i64),
}

/// A fixed window's state: when it opened and what it granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WindowCount {
    /// Milliseconds at which the window opened (may be negative for an aligned window before the epoch).
    pub start_ms: Option<i64>,
    /// Tokens granted in it.
    pub count: u64,
}

impl FixedWindow {
    /// Takes `cost` tokens at `now_ms` when the current window has room. A refusal bans for `ban_ms`.
    pub fn take(&self, state: &mut WindowCount, ban: &mut Ban, cost: u64, ban_ms: u64, now_ms: u64) -> Reply {
        let (now, w) = (ms(now_ms), ms(self.window_ms));
        let mut end = None;
        match self.frame {
            Frame::Between(start, until) => {
                open_at(state, start);
                end = Some(until);
            }
            Frame::Rolling => {
                let fresh = state.start_ms.is_none_or(|s| now >= s + w || now < s);
                if fresh {
                    *state = WindowCount {
                        start_ms: Some(now),
                        count: 0,
                    };
                }
            }
        }
        let end = end.unwrap_or_else(|| state.start_ms.unwrap_or(now) + w);
        let ends_in = u64::try_from(end - now).unwrap_or(0);
        let remaining = self.limit.saturating_sub(state.count);
        if let Some(left) = ban.left(now_ms) {
            let reset = if state.count > 0 { ends_in } else { 0 };
            return banned(left, remaining, reset);
        }
        // A peek (cost 0) answers as a call of one token would, and bans nothing.
        let (peek, cost, ban_ms) = (cost == 0, cost.max(1), if cost == 0 { 0 } else { ban_ms });
        let reset_after = if state.count > 0 { ends_in } else { 0 };
        if state.count + cost <= self.limit {
            if peek {
                // A window a peek opened has count 0 and reset_after 0: the store drops it, as the script
                // writes nothing.
                return peeked(remaining, reset_after);
            }
            state.count += cost;
            return Reply {
                granted: cost,
                remaining: self.limit - state.count,
                retry_after_ms: 0,
                reset_after_ms: ms(ends_in),
                stamp: 0,
                held: 0,
            };
        }
        let retry_after = if cost > self.limit { NEVER } else { ms(ends_in) };
        ban.refuse(ban_ms, now_ms, remaining, retry_after, reset_after)
    }
}

impl FixedWindow {}

/// Makes `start` the window of `state`: a window that is not the stored one starts at 0.
fn open_at(state: &mut WindowCount, start: i64) {
    if state.start_ms != Some(start) {
        *state = WindowCount {
            start_ms: Some(start),
            count: 0,
        };
    }
}

/// Sliding-window counter (seed 004): at most `limit` tokens in the last `sub_buckets` sub-buckets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlidingWindow {
    /// Tokens per window (≥ 1).
    pub limit: u64,
    /// Window length in milliseconds, a multiple of `sub_buckets`.
    pub window_ms: u64,
    /// Sub-buckets per window (≥ 1).
    pub sub_buckets: u64,
}

/// Sub-bucket counters: `(index = floor(ms / sub_ms), tokens)`, oldest first.
pub type SubBuckets = VecDeque<(u64, u64)>;

impl SlidingWindow {
    /// Takes `cost` tokens at `now_ms` when the last `sub_buckets` sub-buckets have room. A refusal bans for
    /// `ban_ms`.
    pub fn take(&self, subs: &mut SubBuckets, ban: &mut Ban, cost: u64, ban_ms: u64, now_ms: u64) -> Reply {
        let n = self.sub_buckets;
        let sub = self.window_ms / n;
        let cur = now_ms / sub;
        subs.retain(|(i, _)| i + n > cur);
        let live = || subs.iter().filter(|(i, _)| *i <= cur);
        let count: u64 = live().map(|(_, c)| c).sum();
        let reset_after = live().map(|(i, _)| *i).max().map_or(0, |i| (i + n) * sub - now_ms);
        let remaining = self.limit.saturating_sub(count);
        if let Some(left) = ban.left(now_ms) {
            return banned(left, remaining, reset_after);
        }
        let until_cur_leaves = (cur + n) * sub - now_ms;
        // A peek (cost 0) answers as a call of one token would, and bans nothing.
        let (peek, cost, ban_ms) = (cost == 0, cost.max(1), if cost == 0 { 0 } else { ban_ms });
        if count + cost <= self.limit {
            if peek {
                return peeked(remaining, reset_after);
            }
            match subs.iter_mut().find(|(i, _)| *i == cur) {
                Some((_, c)) => *c += cost,
                None => {
                    subs.push_back((cur, cost));
                    subs.make_contiguous().sort_unstable();
                }
            }
            return Reply {
                granted: cost,
                remaining: self.limit - count - cost,
                retry_after_ms: 0,
                reset_after_ms: ms(until_cur_leaves),
                stamp: 0,
                held: 0,
            };
        }
        // Oldest sub-buckets leave first: sub-bucket i at (i + n) × sub.
        let leaving = live().map(|(i, c)| ((i + n) * sub, *c));
        let retry_after = if cost <= self.limit {
            freed_at(leaving, count + cost - self.limit, now_ms)
        } else {
            NEVER
        };
        ban.refuse(ban_ms, now_ms, remaining, retry_after, reset_after)
    }
}
