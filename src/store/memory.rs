//! The in-process store: the embedded default when no Redis is configured, the `local` fail mode's state,
//! and the second target of every store test. It runs the very math of [`crate::algorithm`].

use std::sync::Arc;

use dashmap::DashMap;

use super::{arg, bad_args, BoxFuture, Call, Script, Store};
use crate::algorithm::{Reply, TokenBucket, TokenBucketState};
use crate::clock::{Clock, MonotonicClock};
use crate::error::StoreError;
use crate::telemetry::Source;

/// Per-key state of the in-process store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    TokenBucket(TokenBucketState),
}

/// Rate-limit state in a [`DashMap`], one entry per key; each call holds its key's shard lock, so calls on a
/// key are atomic just as a Lua script is in Redis.
#[derive(Debug)]
pub struct MemoryStore {
    map: DashMap<String, State>,
    clock: Arc<dyn Clock>,
}

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
        match call.script {
            Script::TokenBucket | Script::TokenReturn => {
                let bucket = TokenBucket {
                    capacity: arg(call, 0)?,
                    rate: arg(call, 1)?,
                    per_ms: arg(call, 2)?,
                };
                if bucket.capacity == 0 || bucket.per_ms == 0 {
                    return Err(bad_args(call, "capacity and per_ms must be at least 1"));
                }
                let (a, b) = (arg(call, 3)?, arg(call, 4).unwrap_or(0));
                if call.script == Script::TokenBucket && (a == 0 || b < a) {
                    return Err(bad_args(call, "need 1 <= min <= max"));
                }
                let apply = |state: Option<TokenBucketState>| match call.script {
                    Script::TokenBucket => bucket.take(state, a, b, now),
                    _ => bucket.give_back(state, a, now),
                };
                Ok(self.update(key, |state| {
                    let old = state.map(|State::TokenBucket(s)| s);
                    let (new, reply) = apply(old);
                    (new.map(State::TokenBucket), reply)
                }))
            }
        }
    }

    /// Applies `f` to the key's state under its shard lock; `None` removes the key.
    fn update(&self, key: &str, f: impl FnOnce(Option<State>) -> (Option<State>, Reply)) -> Reply {
        match self.map.entry(key.to_owned()) {
            dashmap::Entry::Occupied(mut e) => {
                let (new, reply) = f(Some(*e.get()));
                match new {
                    Some(s) => *e.get_mut() = s,
                    None => {
                        e.remove();
                    }
                }
                reply
            }
            dashmap::Entry::Vacant(e) => {
                let (new, reply) = f(None);
                if let Some(s) = new {
                    e.insert(s);
                }
                reply
            }
        }
    }
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
