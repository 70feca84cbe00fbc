//! Stores run the algorithms atomically: [`RedisStore`] through the Lua scripts of `lua/`, [`MemoryStore`] in
//! process with the same math. Both take a typed call (one per script, `call.rs`) and answer the protocol's
//! four integers (`docs/ARCHITECTURE.md`, "The Lua protocol"). The limiter reaches a store only through
//! `guarded.rs` (breaker, timeouts, counters).

use std::future::Future;
use std::pin::Pin;

use crate::algorithm::Reply;
use crate::decision::Source;
use crate::error::{StoreError, StoreErrorKind};

pub(crate) mod call;
pub(crate) mod condition;
mod connect;
pub(crate) mod eviction;
pub(crate) mod fault;
pub(crate) mod guarded;
pub(crate) mod memory;
pub(crate) mod redis;
pub(crate) mod script;
mod target;
#[cfg(test)]
mod tests;
mod version;

pub(crate) use call::Call;
pub use fault::{Faults, FaultyStore, LinkFault, StoreFault};
pub use memory::MemoryStore;
pub use redis::RedisStore;

/// A boxed future, as the store trait returns (the stores sit behind `Arc<dyn Store>`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

mod sealed {
    /// Seals [`super::Store`]: the calls it runs are the crate's own.
    pub trait Sealed {}
}

/// Where rate-limit state lives: [`RedisStore`] or [`MemoryStore`], given to [`crate::LimiterBuilder::store`].
///
/// Sealed: the scripts' protocol is internal, so the crate's two stores are the only implementations.
pub trait Store: sealed::Sealed + Send + Sync + std::fmt::Debug + 'static {
    /// Runs one script call atomically.
    ///
    /// # Errors
    /// [`StoreError`] when the store fails, times out or rejects the arguments.
    fn run<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Result<Reply, StoreError>>;

    /// The `source` label of decisions this store makes.
    fn source(&self) -> Source;

    /// Whether the store answers now (a `PING` for Redis).
    ///
    /// # Errors
    /// The store's error.
    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Whether the store would decide now: it answers and accepts writes (for Redis, a script that writes
    /// nothing but is refused as a write would be: `READONLY` on a replica, `OOM` over `maxmemory`).
    ///
    /// # Errors
    /// The store's error: kind `Readonly`, `Oom`, `Timeout`, `Io`...
    fn probe(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        self.ping()
    }

    /// The `maxmemory-policy` of a Redis server of the store that may evict the limiter's keys (an evicted
    /// bucket comes back full), when one reported such a policy; `None` otherwise and for the in-process store.
    fn eviction_policy(&self) -> Option<String> {
        None
    }
}

impl sealed::Sealed for MemoryStore {}
impl sealed::Sealed for RedisStore {}
impl sealed::Sealed for FaultyStore {}

/// A call the store refuses: its arguments are out of range.
pub(crate) fn bad_args(call: &Call, why: &str) -> StoreError {
    StoreError {
        kind: StoreErrorKind::Other,
        script: call.script().name(),
        message: format!("bad arguments: {why}"),
        source: None,
    }
}

/// Window and limit are at least 1, as the window scripts require (cost 0 is a peek).
pub(crate) fn check_window(call: &Call, window_ms: u64, limit: u64) -> Result<(), StoreError> {
    if window_ms == 0 || limit == 0 {
        return Err(bad_args(call, "window_ms and limit must be at least 1"));
    }
    Ok(())
}

/// Sub-buckets divide the window, as `sliding_window.lua` requires.
pub(crate) fn check_sub_buckets(call: &Call, window_ms: u64, sub_buckets: u64) -> Result<(), StoreError> {
    if sub_buckets == 0 || window_ms < sub_buckets || !window_ms.is_multiple_of(sub_buckets) {
        return Err(bad_args(call, "sub_buckets must divide window_ms"));
    }
    Ok(())
}
