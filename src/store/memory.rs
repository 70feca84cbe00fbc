//! The in-process store: the embedded default when no Redis is configured, the `local` fail mode's state,
//! and the second target of every store test. It runs the very math of [`crate::algorithm`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;

use super::call::{Call, Op};
use super::{bad_args, check_sub_buckets, check_window, BoxFuture, Store};
use crate::algorithm::fleet::Roster;
use crate::algorithm::window::{Log, SubBuckets};
use crate::algorithm::{Ban, FixedWindow, Frame, Reply, SlidingLog, SlidingWindow, Tat, TokenBucketState, WindowCount};
use crate::clock::{millis, Clock, MonotonicClock};
use crate::decision::Source;
use crate::error::StoreError;
use crate::rule::Calendar;
use crate::timings::Timings;
use hash::{Fields, Marks};

mod bucket;
mod hash;

/// Per-key state of the in-process store. The ban lives beside the window (Redis keeps it in a second key
/// of the same hash tag): one entry, one lock.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// The bucket (`None` = full; boxed, as its notes of room make it the largest state), its ban, the marks of
    /// the give-backs applied to it, and the fields of its hash beside the level.
    TokenBucket(Option<Box<TokenBucketState>>, Ban, Marks, Fields),
    SlidingLog(Log, Ban),
    FixedWindow(WindowCount, Ban),
    SlidingWindow(SubBuckets, Ban),
    LeakyBucket(Tat),
    /// A rule's roster (`fleet.lua`'s three keys in one entry).
    Roster(Roster),
}

/// Rate-limit state in a [`DashMap`], one entry per key; each call holds its key's shard lock, so calls on a
/// key are atomic just as a Lua script is in Redis.
#[derive(Debug)]
pub struct MemoryStore {
    map: DashMap<String, Entry>,
    clock: Arc<dyn Clock>,
    /// The wall clock's ms since the Unix epoch minus `clock`'s ms, read once at construction: calendar windows
    /// are cut on the wall clock (local midnight) and then counted in `clock`'s ms, as everything else here.
    wall_shift_ms: i64,
    /// When idle keys were last purged (ms of the calls' clock).
    purged_at_ms: AtomicU64,
    /// The simulated round trip of every call (zero: none), see [`MemoryStore::with_latency`].
    rtt: Duration,
}

/// A key's state and when it equals a missing key again (the reply's `reset_after_ms` from the last call,
/// as Redis's PEXPIRE): then it is dropped, so idle keys do not accumulate.
#[derive(Debug, Clone)]
struct Entry {
    state: State,
    expires_at_ms: u64,
}

/// Every key's state at one instant ([`MemoryStore::snapshot`]).
#[derive(Debug)]
pub(crate) struct Snapshot(Vec<(String, Entry)>);

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A store on the real monotonic clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(MonotonicClock::new()))
    }

    /// A store reading `now_ms` from `clock` when a call does not carry one.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        let wall_shift_ms = crate::rule::wall_clock_ms() - i64::try_from(clock.now_ms()).unwrap_or(0);
        Self {
            map: DashMap::new(),
            clock,
            wall_shift_ms,
            purged_at_ms: AtomicU64::new(0),
            rtt: Duration::ZERO,
        }
    }

    /// This store with a round trip of `rtt` added to every call, as a Redis over a network would have, for
    /// simulations (`tokenlease simulate`): a call waits the request's half of `rtt` on tokio's clock, runs, then
    /// waits the rest, so the state it reads and writes is the state about halfway through the round trip.
    /// `Duration::ZERO` (the default) answers at once.
    ///
    /// Tokio's timer counts whole milliseconds and rounds every wait up to one, so the request's half is
    /// `rtt / 2` rounded down to whole milliseconds (0 for an `rtt` under 2 ms: the call runs as it is sent) and
    /// the reply's is the rest: a call takes `rtt` rounded up to a whole millisecond (1 ms for 0.5 ms), never
    /// twice a rounded half.
    ///
    /// The waits are [`tokio::time::sleep`]s: a store with a latency must be called inside a tokio runtime with
    /// its timer enabled (as a [`crate::Limiter`] needs anyway); under paused time they take no real time. The
    /// limiter's store timeout (50 ms by default) still applies to the whole round trip.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use tokenlease::{MemoryStore, TokioClock};
    ///
    /// // A Redis 1 ms away, on tokio's clock (paused in a simulation).
    /// let store = MemoryStore::with_clock(Arc::new(TokioClock::new())).with_latency(Duration::from_millis(1));
    /// assert_eq!(store.latency(), Duration::from_millis(1));
    /// ```
    #[must_use]
    pub fn with_latency(mut self, rtt: Duration) -> Self {
        self.rtt = rtt;
        self
    }

    /// The round trip added to every call ([`MemoryStore::with_latency`]; zero by default).
    pub fn latency(&self) -> Duration {
        self.rtt
    }

    /// Keys held (full token buckets are not held: they equal a missing key).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// A copy of every key's state, to put back with [`MemoryStore::restore`] (a replica's copy, for
    /// [`super::fault::Faults::rollback`]).
    pub(crate) fn snapshot(&self) -> Snapshot {
        Snapshot(self.map.iter().map(|e| (e.key().clone(), e.value().clone())).collect())
    }

    /// Puts back the state of `snapshot`: every key as it was then, and no other.
    pub(crate) fn restore(&self, snapshot: Snapshot) {
        self.map.clear();
        for (key, entry) in snapshot.0 {
            self.map.insert(key, entry);
        }
    }

    /// The token bucket stored under `key`, live or not (tests compare it with the Redis hash).
    #[cfg(test)]
    pub(crate) fn token_bucket(&self, key: &str) -> Option<TokenBucketState> {
        match self.map.get(key).as_deref() {
            Some(Entry {
                state: State::TokenBucket(s, ..),
                ..
            }) => s.as_deref().cloned(),
            _ => None,
        }
    }

    /// Runs a call synchronously: the same math as the call's script.
    ///
    /// # Errors
    /// [`StoreError`] of kind `Other` when the arguments are out of range (as the script refuses them).
    pub(crate) fn run_sync(&self, call: &Call) -> Result<Reply, StoreError> {
        let now = call.now_ms.unwrap_or_else(|| self.clock.now_ms());
        let key = call.key.as_str();
        self.purge(now);
        match &call.op {
            Op::TokenBucket { bucket, .. }
            | Op::TokenLease { bucket, .. }
            | Op::TokenReturn { bucket, .. }
            | Op::TokenAcquire { bucket, .. }
                if bucket.capacity == 0 || bucket.per_ms == 0 =>
            {
                Err(bad_args(call, "capacity and per_ms must be at least 1"))
            }
            Op::TokenBucket { min, max, .. } if (*min == 0 && *max > 0) || max < min => {
                Err(bad_args(call, "need 1 <= min <= max, or min = max = 0 (a peek)"))
            }
            Op::TokenAcquire { cost: 0, .. } => Err(bad_args(call, "need 1 <= min <= max")),
            Op::TokenLease { min, max, .. } if *min == 0 || max < min => Err(bad_args(call, "need 1 <= min <= max")),
            Op::TokenLease { .. } | Op::TokenBucket { .. } | Op::TokenAcquire { .. } | Op::TokenReturn { .. } => {
                self.run_bucket(call, now)
            }
            Op::SlidingLog {
                window_ms,
                limit,
                cost,
                ban_ms,
                ..
            } => {
                check_window(call, *window_ms, *limit)?;
                let algo = SlidingLog {
                    limit: *limit,
                    window_ms: *window_ms,
                };
                self.update(key, now, |state| {
                    let (mut log, mut ban) = match state {
                        Some(State::SlidingLog(log, ban)) => (log, ban),
                        _ => Default::default(),
                    };
                    let reply = algo.take(&mut log, &mut ban, *cost, *ban_ms, now);
                    let keep = !log.is_empty() || ban.until_ms > now;
                    (keep.then_some(State::SlidingLog(log, ban)), reply)
                })
            }
            Op::FixedWindow {
                window_ms,
                limit,
                cost,
                ban_ms,
                calendar,
            } => {
                check_window(call, *window_ms, *limit)?;
                let algo = FixedWindow {
                    limit: *limit,
                    window_ms: *window_ms,
                    frame: self.frame(call, calendar.as_ref(), *window_ms, now),
                };
                self.update(key, now, |state| {
                    let (mut count, mut ban) = match state {
                        Some(State::FixedWindow(count, ban)) => (count, ban),
                        _ => Default::default(),
                    };
                    let reply = algo.take(&mut count, &mut ban, *cost, *ban_ms, now);
                    (Some(State::FixedWindow(count, ban)), reply)
                })
            }
            Op::SlidingWindow {
                window_ms,
                sub_buckets,
                limit,
                cost,
                ban_ms,
            } => {
                check_window(call, *window_ms, *limit)?;
                check_sub_buckets(call, *window_ms, *sub_buckets)?;
                let algo = SlidingWindow {
                    limit: *limit,
                    window_ms: *window_ms,
                    sub_buckets: *sub_buckets,
                };
                self.update(key, now, |state| {
                    let (mut subs, mut ban) = match state {
                        Some(State::SlidingWindow(subs, ban)) => (subs, ban),
                        _ => Default::default(),
                    };
                    let reply = algo.take(&mut subs, &mut ban, *cost, *ban_ms, now);
                    let keep = !subs.is_empty() || ban.until_ms > now;
                    (keep.then_some(State::SlidingWindow(subs, ban)), reply)
                })
            }
            Op::LeakyBucket { queue, .. } | Op::LeakyReturn { queue, .. } if queue.rate == 0 || queue.per_ms == 0 => {
                Err(bad_args(call, "rate and per_ms must be at least 1"))
            }
            Op::LeakyReturn { cost: 0, .. } => Err(bad_args(call, "cost must be at least 1")),
            Op::LeakyBucket {
                queue,
                cost,
                max_wait_ms,
                member,
            } => self.update_queue(key, now, |tat| queue.reserve(tat, *cost, *max_wait_ms, member, now)),
            Op::LeakyReturn { queue, cost, member } => {
                self.update_queue(key, now, |tat| queue.give_back(tat, *cost, member, now))
            }
            Op::Fleet(beat) if beat.member.is_empty() || beat.keep_ms == 0 => {
                Err(bad_args(call, "need a member and keep_ms >= 1"))
            }
            Op::Fleet(beat) => self.update_until(key, now, |state| {
                let mut roster = match state {
                    Some((State::Roster(roster), _)) => roster,
                    _ => Roster::default(),
                };
                let count = roster.beat(beat, now);
                let until = roster.expires_at_ms(beat.keep_ms);
                (Some((State::Roster(roster), until)), count.to_reply())
            }),
            Op::Reset => {
                // The ban lives in the entry here (a second key in Redis).
                self.map.remove(key);
                Ok(Reply {
                    granted: 0,
                    remaining: 0,
                    retry_after_ms: 0,
                    reset_after_ms: 0,
                    stamp: 0,
                    held: 0,
                })
            }
        }
    }

    /// Where the fixed window holding `now` starts and ends: rolling, or cut by `calendar` on the wall clock.
    fn frame(&self, call: &Call, calendar: Option<&Calendar>, window_ms: u64, now: u64) -> Frame {
        match calendar {
            None => Frame::Rolling,
            Some(calendar) => {
                // A call's own `now_ms` is ms since the Unix epoch, as Redis's TIME.
                let shift = if call.now_ms.is_some() { 0 } else { self.wall_shift_ms };
                let wall = i64::try_from(now).unwrap_or(i64::MAX).saturating_add(shift);
                let (start, end) = calendar.window(window_ms, wall);
                Frame::Between(start - shift, end - shift)
            }
        }
    }

    /// Applies a leaky-bucket step to the key's queue.
    fn update_queue(
        &self,
        key: &str,
        now: u64,
        f: impl FnOnce(&mut Option<Tat>) -> Reply,
    ) -> Result<Reply, StoreError> {
        self.update(key, now, |state| {
            let mut tat = match state {
                Some(State::LeakyBucket(t)) => Some(t),
                _ => None,
            };
            let reply = f(&mut tat);
            (tat.map(State::LeakyBucket), reply)
        })
    }

    /// Applies `f` to the key's state under its shard lock; `None` removes the key. The key lives until the
    /// reply's `reset_after_ms`, never earlier than before: a call that changes nothing (a refusal) leaves Redis's
    /// TTL as it was.
    fn update(
        &self,
        key: &str,
        now: u64,
        f: impl FnOnce(Option<State>) -> (Option<State>, Reply),
    ) -> Result<Reply, StoreError> {
        self.update_until(key, now, |old| {
            let was = old.as_ref().map_or(0, |(_, until)| *until);
            let (new, reply) = f(old.map(|(state, _)| state));
            let until = u64::try_from(reply.reset_after_ms).map_or(u64::MAX, |ms| now.saturating_add(ms.max(1)));
            (new.map(|state| (state, until.max(was))), reply)
        })
    }

    /// Applies `f` to the key's live state and until when it lives, under its shard lock: `f` gives the new state
    /// and until when it lives (ms, as a Redis TTL), or `None` to remove the key.
    fn update_until(
        &self,
        key: &str,
        now: u64,
        f: impl FnOnce(Option<(State, u64)>) -> (Option<(State, u64)>, Reply),
    ) -> Result<Reply, StoreError> {
        let placeholder = || State::TokenBucket(None, Ban::default(), Marks::new(), Fields::default());
        Ok(match self.map.entry(key.to_owned()) {
            dashmap::Entry::Occupied(mut e) => {
                let old = std::mem::replace(&mut e.get_mut().state, placeholder());
                let was = e.get().expires_at_ms;
                let (new, reply) = f((was > now).then_some((old, was)));
                match new {
                    Some((state, expires_at_ms)) => *e.get_mut() = Entry { state, expires_at_ms },
                    None => {
                        e.remove();
                    }
                }
                reply
            }
            dashmap::Entry::Vacant(e) => {
                let (new, reply) = f(None);
                if let Some((state, expires_at_ms)) = new {
                    e.insert(Entry { state, expires_at_ms });
                }
                reply
            }
        })
    }

    /// Drops the keys whose state equals a missing key again, at most once per [`Timings::PURGE_EVERY`].
    fn purge(&self, now: u64) {
        let last = self.purged_at_ms.load(Ordering::Relaxed);
        if now < last.saturating_add(millis(Timings::PURGE_EVERY)) {
            return;
        }
        if self
            .purged_at_ms
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            self.map.retain(|_, e| e.expires_at_ms > now);
        }
    }
}

impl Store for MemoryStore {
    fn run<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Result<Reply, StoreError>> {
        if self.rtt.is_zero() {
            return Box::pin(std::future::ready(self.run_sync(call)));
        }
        let sent = Duration::from_millis(u64::try_from((self.rtt / 2).as_millis()).unwrap_or(u64::MAX));
        Box::pin(async move {
            if !sent.is_zero() {
                tokio::time::sleep(sent).await;
            }
            let result = self.run_sync(call);
            tokio::time::sleep(self.rtt.saturating_sub(sent)).await;
            result
        })
    }

    fn source(&self) -> Source {
        Source::Memory
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        if self.rtt.is_zero() {
            return Box::pin(std::future::ready(Ok(())));
        }
        Box::pin(async move {
            tokio::time::sleep(self.rtt).await;
            Ok(())
        })
    }
}
