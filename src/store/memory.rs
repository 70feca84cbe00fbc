//! The in-process store: the embedded default when no Redis is configured, the `local` fail mode's state,
//! and the second target of every store test. It runs the very math of [`crate::algorithm`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dashmap::DashMap;

use super::{arg, bad_args, BoxFuture, Call, Script, Store};
use crate::algorithm::window::{Log, SubBuckets};
use crate::algorithm::{
    Ban, FixedWindow, LeakyBucket, Reply, SlidingLog, SlidingWindow, Tat, TokenBucket, TokenBucketState, WindowCount,
};
use crate::clock::{Clock, MonotonicClock};
use crate::error::StoreError;
use crate::telemetry::Source;

/// Per-key state of the in-process store. The ban lives beside the window (Redis keeps it in a second key
/// of the same hash tag): one entry, one lock.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// The bucket (`None` = full) and its ban.
    TokenBucket(Option<TokenBucketState>, Ban),
    SlidingLog(Log, Ban),
    FixedWindow(WindowCount, Ban),
    SlidingWindow(SubBuckets, Ban),
    LeakyBucket(Tat),
}

/// Rate-limit state in a [`DashMap`], one entry per key; each call holds its key's shard lock, so calls on a
/// key are atomic just as a Lua script is in Redis.
#[derive(Debug)]
pub struct MemoryStore {
    map: DashMap<String, Entry>,
    clock: Arc<dyn Clock>,
    /// When idle keys were last purged (ms of the calls' clock).
    purged_at_ms: AtomicU64,
}

/// A key's state and when it equals a missing key again (the reply's `reset_after_ms` from the last call,
/// as Redis's PEXPIRE): then it is dropped, so idle keys do not accumulate.
#[derive(Debug)]
struct Entry {
    state: State,
    expires_at_ms: u64,
}

/// How often idle keys are purged, in ms of the calls' clock.
const PURGE_EVERY_MS: u64 = 1_000;

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
        Self {
            map: DashMap::new(),
            clock,
            purged_at_ms: AtomicU64::new(0),
        }
    }

    /// Keys held (full token buckets are not held: they equal a missing key).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Runs a call synchronously.
    ///
    /// # Errors
    /// [`StoreError`] of kind `Other` when the arguments are malformed.
    pub fn run_sync(&self, call: &Call) -> Result<Reply, StoreError> {
        let now = call.now_ms.unwrap_or_else(|| self.clock.now_ms());
        let key = call.keys.first().ok_or_else(|| bad_args(call, "no key"))?;
        self.purge(now);
        match call.script {
            Script::TokenBucket | Script::TokenReturn | Script::TokenAcquire => {
                let bucket = TokenBucket {
                    capacity: arg(call, 0)?,
                    rate: arg(call, 1)?,
                    per_ms: arg(call, 2)?,
                };
                if bucket.capacity == 0 || bucket.per_ms == 0 {
                    return Err(bad_args(call, "capacity and per_ms must be at least 1"));
                }
                // min and max (token_bucket), tokens (token_return; negative: a debit), cost and max_wait_ms
                // (token_acquire).
                let debit = call.script == Script::TokenReturn && call.args.get(3).is_some_and(|n| *n < 0);
                let a = match call.args.get(3) {
                    Some(n) if debit => n.unsigned_abs(),
                    _ => arg(call, 3)?,
                };
                let b = if call.script == Script::TokenReturn {
                    0
                } else {
                    arg(call, 4)?
                };
                if (call.script == Script::TokenBucket && (a == 0 || b < a))
                    || (call.script == Script::TokenAcquire && a == 0)
                {
                    return Err(bad_args(call, "need 1 <= min <= max"));
                }
                // A second key is the ban; its duration follows max (token_bucket.lua's ARGV[6]).
                let ban_ms = if call.keys.len() > 1 { arg(call, 5)? } else { 0 };
                self.update(key, now, |state| {
                    let (old, mut ban) = match state {
                        Some(State::TokenBucket(s, ban)) => (s, ban),
                        _ => (None, Ban::default()),
                    };
                    let (new, reply) = match call.script {
                        Script::TokenBucket => bucket.take_banned(old, &mut ban, a, b, ban_ms, now),
                        Script::TokenAcquire => bucket.acquire(old, a, b, now),
                        _ if debit => bucket.debit(old, a, now),
                        _ => bucket.give_back(old, a, now),
                    };
                    let keep = new.is_some() || ban.until_ms > now;
                    (keep.then_some(State::TokenBucket(new, ban)), reply)
                })
            }
            Script::SlidingLog => {
                let (window_ms, limit, cost, ban_ms) = window_args(call, 0, 1, 2, 3)?;
                let algo = SlidingLog { limit, window_ms };
                self.update(key, now, |state| {
                    let (mut log, mut ban) = match state {
                        Some(State::SlidingLog(log, ban)) => (log, ban),
                        _ => Default::default(),
                    };
                    let reply = algo.take(&mut log, &mut ban, cost, ban_ms, now);
                    let keep = !log.is_empty() || ban.until_ms > now;
                    (keep.then_some(State::SlidingLog(log, ban)), reply)
                })
            }
            Script::FixedWindow => {
                let (window_ms, limit, cost, ban_ms) = window_args(call, 0, 1, 2, 3)?;
                let align = call
                    .args
                    .get(4)
                    .copied()
                    .ok_or_else(|| bad_args(call, "align_ms missing"))?;
                if align < -1 {
                    return Err(bad_args(call, "align_ms must be -1 or at least 0"));
                }
                let algo = FixedWindow {
                    limit,
                    window_ms,
                    align_ms: u64::try_from(align).ok(),
                };
                self.update(key, now, |state| {
                    let (mut count, mut ban) = match state {
                        Some(State::FixedWindow(count, ban)) => (count, ban),
                        _ => Default::default(),
                    };
                    let reply = algo.take(&mut count, &mut ban, cost, ban_ms, now);
                    (Some(State::FixedWindow(count, ban)), reply)
                })
            }
            Script::LeakyBucket | Script::LeakyReturn => {
                let queue = LeakyBucket {
                    rate: arg(call, 0)?,
                    per_ms: arg(call, 1)?,
                };
                let cost = arg(call, 2)?;
                let member = call.member.as_deref().ok_or_else(|| bad_args(call, "member missing"))?;
                if queue.rate == 0 || queue.per_ms == 0 || cost == 0 {
                    return Err(bad_args(call, "rate, per_ms and cost must be at least 1"));
                }
                let max_wait_ms = if call.script == Script::LeakyBucket {
                    arg(call, 3)?
                } else {
                    0
                };
                self.update(key, now, |state| {
                    let mut tat = match state {
                        Some(State::LeakyBucket(t)) => Some(t),
                        _ => None,
                    };
                    let reply = match call.script {
                        Script::LeakyBucket => queue.reserve(&mut tat, cost, max_wait_ms, member, now),
                        _ => queue.give_back(&mut tat, cost, member, now),
                    };
                    (tat.map(State::LeakyBucket), reply)
                })
            }
            Script::SlidingWindow => {
                let (window_ms, limit, cost, ban_ms) = window_args(call, 0, 2, 3, 4)?;
                let sub_buckets = arg(call, 1)?;
                if sub_buckets == 0 || window_ms < sub_buckets || window_ms % sub_buckets != 0 {
                    return Err(bad_args(call, "sub_buckets must divide window_ms"));
                }
                let algo = SlidingWindow {
                    limit,
                    window_ms,
                    sub_buckets,
                };
                self.update(key, now, |state| {
                    let (mut subs, mut ban) = match state {
                        Some(State::SlidingWindow(subs, ban)) => (subs, ban),
                        _ => Default::default(),
                    };
                    let reply = algo.take(&mut subs, &mut ban, cost, ban_ms, now);
                    let keep = !subs.is_empty() || ban.until_ms > now;
                    (keep.then_some(State::SlidingWindow(subs, ban)), reply)
                })
            }
        }
    }

    /// Applies `f` to the key's state under its shard lock; `None` removes the key.
    fn update(
        &self,
        key: &str,
        now: u64,
        f: impl FnOnce(Option<State>) -> (Option<State>, Reply),
    ) -> Result<Reply, StoreError> {
        let expiry =
            |reply: &Reply| u64::try_from(reply.reset_after_ms).map_or(u64::MAX, |ms| now.saturating_add(ms.max(1)));
        let placeholder = || State::TokenBucket(None, Ban::default());
        Ok(match self.map.entry(key.to_owned()) {
            dashmap::Entry::Occupied(mut e) => {
                let old = std::mem::replace(&mut e.get_mut().state, placeholder());
                let was = e.get().expires_at_ms;
                let alive = was > now;
                let (new, reply) = f(alive.then_some(old));
                // Never earlier than before: a call that changes nothing (a refusal) leaves Redis's TTL as it was.
                let expires_at_ms = if alive { was.max(expiry(&reply)) } else { expiry(&reply) };
                match new {
                    Some(state) => *e.get_mut() = Entry { state, expires_at_ms },
                    None => {
                        e.remove();
                    }
                }
                reply
            }
            dashmap::Entry::Vacant(e) => {
                let (new, reply) = f(None);
                if let Some(state) = new {
                    e.insert(Entry {
                        state,
                        expires_at_ms: expiry(&reply),
                    });
                }
                reply
            }
        })
    }

    /// Drops the keys whose state equals a missing key again, at most once per [`PURGE_EVERY_MS`].
    fn purge(&self, now: u64) {
        let last = self.purged_at_ms.load(Ordering::Relaxed);
        if now < last.saturating_add(PURGE_EVERY_MS) {
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

/// `(window_ms, limit, cost, ban_ms)` from the given argument positions, checked.
fn window_args(call: &Call, w: usize, l: usize, c: usize, b: usize) -> Result<(u64, u64, u64, u64), StoreError> {
    let (window_ms, limit, cost, ban_ms) = (arg(call, w)?, arg(call, l)?, arg(call, c)?, arg(call, b)?);
    if window_ms == 0 || limit == 0 || cost == 0 {
        return Err(bad_args(call, "window_ms, limit and cost must be at least 1"));
    }
    Ok((window_ms, limit, cost, ban_ms))
}

impl Store for MemoryStore {
    fn run<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Result<Reply, StoreError>> {
        let result = self.run_sync(call);
        Box::pin(std::future::ready(result))
    }

    fn source(&self) -> Source {
        Source::Memory
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(std::future::ready(Ok(())))
    }
}
