//! Token bucket with lazy refill, in exact integer arithmetic (mirrored by `lua/token_bucket.lua`,
//! `lua/token_return.lua` and `lua/token_acquire.lua`).
//!
//! The level is kept in units of `1 / per_ms` token, so a refill of `rate` tokens per `per_ms` milliseconds
//! adds exactly `rate` units each millisecond: a token due at a millisecond is there at that millisecond and
//! nothing drifts, unlike a float refill. Seed 002's "refill task that pushes tokens on a schedule" is replaced
//! by computing the refill from the last timestamp when the bucket is next touched.

use super::hold::{HoldAsk, Holds};
use super::paced::{Pace, Pending};
use super::room::{Lent, Rooms};
use super::{ceil_div, ms, Ban, Reply, MAX_EXACT, NEVER};

/// What a give-back returns ([`TokenBucket::give_back`], `token_return.lua`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Back<'a> {
    /// Tokens whose leases are not named (a caller of the script that sends no stamp): capped at the top alone.
    Unnamed(u64),
    /// The tokens of these leases, each capped by the room the bucket had since its own.
    Lent(&'a [Lent]),
}

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
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenBucketState {
    /// Tokens × `bucket.per_ms` (so that refill is exact). Negative while the bucket is in debt (see
    /// [`TokenBucket::acquire`]).
    pub level: i64,
    /// Milliseconds at which `level` was computed.
    pub ts_ms: u64,
    /// The parameters `level` was computed with (the hash's `capacity`, `rate`, `per`): after a reload the time
    /// since `ts_ms` refills at these, then the level is converted to the new ones (invariant 11).
    pub bucket: TokenBucket,
    /// What paced leases have yet to release (the hash's `pend` fields, `lua/token_lease.lua`): the level refills
    /// to at most the capacity less these.
    pub paced: Pending,
    /// The room the level had at each change since a lease (the hash's `stamps`, `rooms` and `rooms_from`): what
    /// a give-back may add ([`TokenBucket::give_back`]).
    pub rooms: Rooms,
    /// When the latest call to write the bucket adopted its parameters (the hash's `adopted`, ms since the Unix
    /// epoch; 0: none said): a call adopted earlier reads the bucket in `bucket` rather than its own
    /// ([`TokenBucketState::in_force`], invariant 11).
    pub adopted_ms: u64,
    /// What processes hold in escrow for an outage (the hash's `held` and `h:{holder}` fields,
    /// [`super::hold`]): the level refills to at most the capacity less these and the pending tokens.
    pub holds: Holds,
}

impl TokenBucketState {
    /// The parameters a call of `bucket` adopted at `adopted_ms` decides `state` with: the hash's when it
    /// records parameters adopted later (the call's process has not reloaded yet, or a give-back of a lease
    /// taken before a reload is late), the call's otherwise. So an older call converts the bucket, never
    /// overwrites its parameters (`load_bucket` of `lua/lib/bucket.lua`).
    pub(crate) fn in_force(state: Option<&Self>, bucket: TokenBucket, adopted_ms: u64) -> (TokenBucket, u64) {
        match state {
            Some(s) if s.adopted_ms > adopted_ms && s.bucket.per_ms > 0 => (s.bucket, s.adopted_ms),
            _ => (bucket, adopted_ms),
        }
    }

    /// Milliseconds at which this bucket is full again at the parameters it records, its paced leases have
    /// released everything and its holds have ended and been refilled (when the Redis key expires: a script
    /// stores it with `PEXPIRE` of that rest); `None` at rate 0, which never refills.
    pub(crate) fn full_at_ms(&self) -> Option<u64> {
        let rest = u64::try_from(self.bucket.reset_after(self.level)).ok()?;
        let held = if self.holds.last_ms > self.ts_ms {
            self.holds.last_ms.saturating_add(rest)
        } else {
            0
        };
        Some(self.ts_ms.saturating_add(rest).max(self.paced.until_ms).max(held))
    }
}

/// Euclid's greatest common divisor of `a, b ≥ 1`.
fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b > 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// `level`, counted in 1/`from` token, counted in 1/`to` token, rounded down. With `g = gcd(from, to)`,
/// `o = from / g`, `p = to / g` and `level = q·o + r` (`0 ≤ r < o`), it is `q·p + ⌊r·p / o⌋`, every term exact
/// in the scripts' doubles; where `o·p` reaches 2^53 the second term (less than one token) is dropped, as the
/// scripts do.
fn rescale(level: i64, from: u64, to: u64) -> i64 {
    if from == to || from == 0 {
        return level;
    }
    let g = gcd(from, to);
    let (o, p) = (i128::from(from / g), i128::from(to / g));
    let (q, r) = (i128::from(level).div_euclid(o), i128::from(level).rem_euclid(o));
    let mut scaled = q * p;
    if (o * p) < i128::from(MAX_EXACT) {
        scaled += (r * p).div_euclid(o);
    }
    i64::try_from(scaled).unwrap_or(if scaled < 0 { i64::MIN } else { i64::MAX })
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

    /// Whether every quantity stays exact in Lua's doubles (capacity × per_ms below 2^53).
    pub(crate) fn is_exact_in_lua(&self) -> bool {
        self.capacity.checked_mul(self.per_ms).is_some_and(|v| v < MAX_EXACT)
            && self.rate.checked_mul(self.per_ms).is_some_and(|v| v < MAX_EXACT)
    }

    /// The state at `now_ms` in these parameters: a missing bucket is full; a stored one is refilled since its
    /// timestamp, then converted to these (rescaled to this `per_ms`, capped at this capacity). The time since
    /// the timestamp refills at the lower of the two rates: a reload that raises the rate applies from the first
    /// call after it (Guava's `RateLimiter.setRate` resyncs the same way), one that lowers it from the bucket's
    /// last write (invariant 11).
    pub(crate) fn refill(&self, state: Option<TokenBucketState>, now_ms: u64) -> TokenBucketState {
        let full = self.full();
        let Some(s) = state else {
            return TokenBucketState {
                level: full,
                ts_ms: now_ms,
                bucket: *self,
                paced: Pending::default(),
                rooms: Rooms::default(),
                adopted_ms: 0,
                holds: Holds::default(),
            };
        };
        let mut s = s;
        let mut was = s.bucket;
        if was.per_ms == 0 {
            was.per_ms = self.per_ms;
        }
        let changed = was != *self;
        // Across a change of parameters the time since `ts_ms` refills at the lower rate (tokens per ms): a
        // reload that lowers the rate applies from the bucket's last write (the level is converted there, before
        // anything refills, the stretches up to ended holds' ends too), one that raises it from this call.
        let lower = u128::from(self.rate) * u128::from(was.per_ms) < u128::from(was.rate) * u128::from(self.per_ms);
        if changed && lower {
            s.level = rescale(s.level.min(was.full()), was.per_ms, self.per_ms).min(full);
            was = *self;
        }
        // Holds that ended since: the level refills up to each end under the top it had then, at the parameters
        // it was computed with (module docs of `hold`).
        let ended = s.holds.take_ended(now_ms);
        let mut held = s.holds.tokens() + ended.iter().map(|(_, t)| t).sum::<u64>();
        for (until_ms, tokens) in ended {
            if until_ms > s.ts_ms {
                let top = was
                    .full()
                    .saturating_sub(was.units(s.paced.at(until_ms).saturating_add(held)));
                let added = i128::from(until_ms - s.ts_ms) * i128::from(was.rate);
                let level = (i128::from(s.level.min(was.full())) + added).min(i128::from(top));
                s.level = i64::try_from(level).unwrap_or(top);
                s.ts_ms = until_ms;
            }
            held -= tokens;
        }
        let elapsed = now_ms.saturating_sub(s.ts_ms);
        let ts_ms = s.ts_ms.max(now_ms);
        let added = i128::from(elapsed) * i128::from(was.rate);
        let refilled = i64::try_from((i128::from(s.level) + added).min(i128::from(was.full()))).unwrap_or(full);
        let level = rescale(refilled, was.per_ms, self.per_ms);
        let level = level.min(self.top(&s, now_ms));
        TokenBucketState {
            level,
            ts_ms,
            bucket: *self,
            paced: s.paced,
            // Rooms noted under other parameters mean nothing under these: a reload starts the notes again.
            rooms: if changed { Rooms::default() } else { s.rooms },
            adopted_ms: s.adopted_ms,
            holds: s.holds,
        }
    }

    /// Whole tokens the level of `s` (refilled) could take up to the top at `now_ms`.
    fn room(&self, s: &TokenBucketState, now_ms: u64) -> u64 {
        u64::try_from(self.tokens(self.top(s, now_ms).saturating_sub(s.level))).unwrap_or(0)
    }

    /// The highest level of `s` at `now_ms`: full, less what paced leases have yet to release and what is held.
    fn top(&self, s: &TokenBucketState, now_ms: u64) -> i64 {
        let out = s.paced.at(now_ms).saturating_add(s.holds.tokens());
        self.full().saturating_sub(self.units(out))
    }

    /// What a call that changes nothing (a refusal) leaves stored: the state as it was when it was computed
    /// with these parameters (refilling it later gives the same level), else the converted state `now`, so that
    /// the time since then refills at these parameters.
    fn unchanged(&self, state: Option<TokenBucketState>, now: TokenBucketState) -> Option<TokenBucketState> {
        match state {
            Some(s) if s.bucket != *self => self.stored(now),
            _ => state,
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
    /// the capacity or the rate is 0. `min = max = 0` is a peek: nothing taken, and the `retry_after_ms` of a
    /// call of one token.
    pub(crate) fn take(
        &self,
        state: Option<TokenBucketState>,
        min: u64,
        max: u64,
        now_ms: u64,
    ) -> (Option<TokenBucketState>, Reply) {
        let (new, reply, _) = self.take_noted(state, (min, max), false, now_ms);
        (new, reply)
    }

    /// [`TokenBucket::take`], its grant noted in the bucket's rooms; a `lease`'s grant starts the notes and its
    /// reply carries its stamp. Also returns the room the bucket had before the call (whole tokens up to its top).
    fn take_noted(
        &self,
        state: Option<TokenBucketState>,
        (min, max): (u64, u64),
        lease: bool,
        now_ms: u64,
    ) -> (Option<TokenBucketState>, Reply, u64) {
        let mut s = self.refill(state.clone(), now_ms);
        let room = self.room(&s, now_ms);
        let tokens = self.tokens(s.level);
        let (peek, need) = (max == 0, min.max(1));
        let (mut granted, mut retry_after_ms) = (0, 0);
        if need > self.capacity {
            retry_after_ms = NEVER;
        } else if tokens >= ms(need) {
            if !peek {
                granted = u64::try_from(tokens).unwrap_or(0).min(max.max(min));
                s.level -= self.units(granted);
            }
        } else if self.rate == 0 {
            retry_after_ms = NEVER;
        } else {
            retry_after_ms = ceil_ms(self.units(need) - s.level, self.rate);
        }
        let stamp = if granted > 0 {
            s.rooms.note(room, lease, now_ms)
        } else {
            0
        };
        let reply = Reply {
            granted,
            remaining: u64::try_from(self.tokens(s.level)).unwrap_or(0),
            retry_after_ms,
            reset_after_ms: self.reset_after(s.level),
            stamp: if lease { stamp } else { 0 },
            held: 0,
        };
        let new = if granted > 0 {
            self.stored(s)
        } else {
            self.unchanged(state, s)
        };
        (new, reply, room)
    }

    /// A lease of between `min` and `max` tokens that takes its turn on a saturated bucket (invariant 18;
    /// mirrors `lua/token_lease.lua`): [`TokenBucket::take`], and when the call leaves fewer than `min` tokens
    /// behind (the same call again would be refused) the caller is handed the bucket's next *turn*: `turn_ms`
    /// (the last turn handed out, 0 when none) moves to `max(turn_ms, now_ms)` plus
    /// [`TokenBucket::turn_spacing`] of `batch`, and the reply's `retry_after_ms` is the wait for it (at least
    /// the wait for `min` tokens on a refusal). So the processes of a saturated key call one after another,
    /// a turn's refill apart, whatever their number, and none bunch. A grant released by `pace` (more than one
    /// chunk) is added to the bucket's pending tokens ([`Pending::with`]). Returns the state, the last turn handed
    /// out and the reply. `batch` 0 is a *probe* (a process whose demand fell, no longer waiting for its turn):
    /// it is handed no turn. The turns handed out are not being taken (their holders' demand fell, or they
    /// left) when a lease finds the bucket within a batch of its top (its refill is being lost) or a probe is
    /// granted tokens: the line then restarts from now (`turn_ms` 0). A store drops the turn with a bucket that
    /// another call filled (Redis deletes the hash that holds it).
    ///
    /// Last, a lease with a `hold` asks to hold tokens for an outage ([`super::hold`]): after the grant and the
    /// turn, the holder's record is kept, topped up from the level and renewed; the reply's `held` is what it
    /// holds then, and `remaining` what the level has left.
    pub(crate) fn lease(
        &self,
        (state, turn_ms): (Option<TokenBucketState>, u64),
        (min, max, batch): (u64, u64, u64),
        (pace, hold): (Pace, Option<&HoldAsk>),
        now_ms: u64,
    ) -> (Option<TokenBucketState>, u64, Reply) {
        let (mut new, mut reply, room) = self.take_noted(state, (min, max), true, now_ms);
        // The turns handed out are not being taken (their holders' demand fell, or they left) when the bucket was
        // within a batch of its top (its refill is being lost) or a probe (batch 0) is granted what they left.
        let near_top = batch > 0 && room < batch.min(self.capacity);
        let restart = near_top || (batch == 0 && reply.granted > 0);
        if let Some(s) = new.as_mut().filter(|_| pace.span_ms(reply.granted).is_some()) {
            s.paced = s.paced.with(reply.granted, pace, now_ms);
            // From the state's timestamp, as the script's `pend_ts` (later than now only on a clock gone back).
            s.paced.from_ms = s.paced.from_ms.max(s.ts_ms);
        }
        let mut turn = if restart { 0 } else { turn_ms };
        if self.rate > 0 && batch > 0 && reply.retry_after_ms != NEVER && reply.remaining < min {
            turn = turn.max(now_ms).saturating_add(self.turn_spacing(batch));
            reply.retry_after_ms = reply.retry_after_ms.max(ms(turn - now_ms));
        }
        if let Some(ask) = hold {
            // The bucket as this call left it (refilling again at the same instant changes nothing).
            let mut s = self.refill(new.clone(), now_ms);
            let available = u64::try_from(self.tokens(s.level)).unwrap_or(0);
            if let Some((held, taken, back)) = s.holds.apply(ask, available, now_ms) {
                s.level = s.level - self.units(taken) + self.units(back);
                reply.held = held;
                reply.remaining = u64::try_from(self.tokens(s.level)).unwrap_or(0);
                reply.reset_after_ms = self.reset_after(s.level);
                new = self.stored(s);
            }
        }
        (new, turn, reply)
    }

    /// Milliseconds between two turns on a saturated bucket for leases of `batch` tokens: three fifths of the
    /// time the refill takes to make a batch (at least 1 ms). Each turn then takes what accumulated, about 0.6
    /// batch (a lease on a saturated bucket asks for up to two batches), so what a sale leaves in the bucket when
    /// it ends is under a batch. Exact in Lua's doubles while it is below 2^53 ms.
    pub(crate) fn turn_spacing(&self, batch: u64) -> u64 {
        let refill = ceil_div(batch.min(self.capacity).saturating_mul(self.per_ms), self.rate.max(1));
        ceil_div(refill.saturating_mul(3), 5).max(1)
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
        let mut s = self.refill(state.clone(), now_ms);
        let refuse = |retry_after_ms: i64, level: i64| Reply {
            granted: 0,
            remaining: u64::try_from(self.tokens(level)).unwrap_or(0),
            retry_after_ms,
            reset_after_ms: self.reset_after(level),
            stamp: 0,
            held: 0,
        };
        if cost > self.capacity || (self.rate == 0 && s.level < self.units(cost)) {
            let level = s.level;
            return (self.unchanged(state, s), refuse(NEVER, level));
        }
        let wait = if s.level >= 0 { 0 } else { ceil_ms(-s.level, self.rate) };
        if wait > ms(max_wait_ms) {
            let level = s.level;
            return (self.unchanged(state, s), refuse(wait - ms(max_wait_ms), level));
        }
        s.rooms.note(self.room(&s, now_ms), false, now_ms);
        s.level -= self.units(cost);
        let reply = Reply {
            granted: cost,
            remaining: u64::try_from(self.tokens(s.level)).unwrap_or(0),
            retry_after_ms: wait,
            reset_after_ms: self.reset_after(s.level),
            stamp: 0,
            held: 0,
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
            let s = self.refill(state.clone(), now_ms);
            let reply = Reply {
                granted: 0,
                remaining: u64::try_from(self.tokens(s.level)).unwrap_or(0),
                retry_after_ms: ms(left),
                reset_after_ms: at_least(self.reset_after(s.level), ms(left)),
                stamp: 0,
                held: 0,
            };
            return (self.unchanged(state, s), reply);
        }
        let (new, mut reply) = self.take(state, min, max, now_ms);
        if reply.granted == 0 && ban_ms > 0 && max > 0 {
            reply.retry_after_ms = ban.breach(ban_ms, now_ms, reply.retry_after_ms);
            reply.reset_after_ms = at_least(reply.reset_after_ms, ms(ban_ms));
        }
        (new, reply)
    }

    /// Gives tokens back at `now_ms`: [`Back::Lent`], the tokens of each lease at most the lowest room the level
    /// had at any change after that lease's stamp ([`Rooms::lowest_since`]), so tokens the refill already replaced
    /// while they were out are not added twice, and each lease's tokens added lower the rooms noted after its stamp
    /// before the next lease's are capped ([`Rooms::fill_since`]; the order of the leases does not change the
    /// sum); [`Back::Unnamed`], a caller of the script that sends no stamp, capped at the top alone. Never above
    /// the top (the capacity less what paced leases have yet to release). A missing (full) bucket takes nothing.
    /// The reply's `granted` is the number of whole tokens accepted.
    pub(crate) fn give_back(
        &self,
        state: Option<TokenBucketState>,
        back: Back<'_>,
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
                    stamp: 0,
                    held: 0,
                },
            );
        };
        let mut s = self.refill(Some(state), now_ms);
        let before = self.tokens(s.level);
        let room = self.room(&s, now_ms);
        let tokens = match back {
            Back::Unnamed(tokens) => tokens,
            Back::Lent(lent) => {
                let mut added = 0;
                for l in lent {
                    let n = l
                        .tokens
                        .min(room.saturating_sub(added))
                        .min(s.rooms.lowest_since(l.stamp));
                    s.rooms.fill_since(l.stamp, n);
                    added += n;
                }
                added
            }
        };
        s.rooms.note(room, false, now_ms);
        s.level = s.level.saturating_add(self.units(tokens)).min(self.top(&s, now_ms));
        let after = self.tokens(s.level);
        let reply = Reply {
            granted: u64::try_from(after - before).unwrap_or(0),
            remaining: u64::try_from(after).unwrap_or(0),
            retry_after_ms: 0,
            reset_after_ms: self.reset_after(s.level),
            stamp: 0,
            held: 0,
        };
        (self.stored(s), reply)
    }

    /// A full bucket equals a missing key: store nothing (a paced one is kept until its leases have released
    /// everything, one with holds until they end).
    fn stored(&self, mut s: TokenBucketState) -> Option<TokenBucketState> {
        if s.paced.until_ms <= s.ts_ms {
            // Ended: the script deletes the pending fields.
            s.paced = Pending::default();
        }
        (s.level < self.full() || s.paced.until_ms > s.ts_ms || !s.holds.records.is_empty()).then_some(s)
    }
}

#[cfg(test)]
#[path = "token_bucket_tests.rs"]
mod tests;
