//! Stores run the algorithms atomically: [`RedisStore`] through the Lua scripts of `lua/`, [`MemoryStore`] in
//! process with the same math. Both speak the protocol of DESIGN.md §4: a script, its keys, integer arguments
//! (with an optional trailing `now_ms`), and a four-integer [`Reply`].

use std::future::Future;
use std::pin::Pin;

use crate::algorithm::Reply;
use crate::error::StoreError;
use crate::telemetry::Source;

pub mod memory;
pub mod redis;

pub use memory::MemoryStore;
pub use redis::RedisStore;

/// A boxed future, as the store trait returns (the stores sit behind `Arc<dyn Store>`).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The scripts of `lua/`, one per algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Script {
    /// `token_bucket.lua`: KEYS bucket; ARGV capacity, rate, per_ms, min, max.
    TokenBucket,
    /// `token_return.lua`: KEYS bucket; ARGV capacity, rate, per_ms, tokens.
    TokenReturn,
    /// `sliding_log.lua`: KEYS log, ban; ARGV window_ms, limit, cost, member, ban_ms.
    SlidingLog,
    /// `fixed_window.lua`: KEYS counter, ban; ARGV window_ms, limit, cost, ban_ms, align_ms (−1 = rolling).
    FixedWindow,
    /// `sliding_window.lua`: KEYS counter, ban; ARGV window_ms, sub_buckets, limit, cost, ban_ms.
    SlidingWindow,
    /// `leaky_bucket.lua`: KEYS queue; ARGV rate, per_ms, cost, max_wait_ms, member.
    LeakyBucket,
    /// `leaky_return.lua`: KEYS queue; ARGV rate, per_ms, cost, member.
    LeakyReturn,
    /// `token_acquire.lua`: KEYS bucket; ARGV capacity, rate, per_ms, cost, max_wait_ms.
    TokenAcquire,
}

impl Script {
    /// The script's name: its file name without `.lua`, and the `script` metric label.
    pub fn name(self) -> &'static str {
        match self {
            Self::TokenBucket => "token_bucket",
            Self::TokenReturn => "token_return",
            Self::SlidingLog => "sliding_log",
            Self::FixedWindow => "fixed_window",
            Self::SlidingWindow => "sliding_window",
            Self::LeakyBucket => "leaky_bucket",
            Self::LeakyReturn => "leaky_return",
            Self::TokenAcquire => "token_acquire",
        }
    }

    /// Where the call's [`Call::member`] goes among the integer arguments (`None`: the script takes none).
    pub fn member_position(self) -> Option<usize> {
        match self {
            Self::SlidingLog | Self::LeakyReturn => Some(3),
            Self::LeakyBucket => Some(4),
            _ => None,
        }
    }

    /// Every script, in declaration order.
    pub const ALL: [Script; 8] = [
        Self::TokenBucket,
        Self::TokenReturn,
        Self::SlidingLog,
        Self::FixedWindow,
        Self::SlidingWindow,
        Self::LeakyBucket,
        Self::LeakyReturn,
        Self::TokenAcquire,
    ];
}

/// One script call: which script, its keys (all sharing one hash tag) and its integer arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The script.
    pub script: Script,
    /// `KEYS`, in the script's order.
    pub keys: Vec<String>,
    /// `ARGV`, in the script's order, without `now_ms`.
    pub args: Vec<i64>,
    /// The unique member of a sliding-log or leaky-bucket call (see [`Script::member_position`]).
    pub member: Option<String>,
    /// The optional trailing `now_ms`: `None` lets the store read its own clock (Redis `TIME`).
    pub now_ms: Option<u64>,
    /// A timeout for this call instead of the store's own.
    pub timeout: Option<std::time::Duration>,
}

impl Call {
    /// A call at the store's own time.
    pub fn new(script: Script, keys: Vec<String>, args: Vec<i64>) -> Self {
        Self {
            script,
            keys,
            args,
            member: None,
            now_ms: None,
            timeout: None,
        }
    }

    /// Sets the unique member of a sliding-log call.
    pub fn with_member(mut self, member: impl Into<String>) -> Self {
        self.member = Some(member.into());
        self
    }

    /// The same call replayed at `now_ms` (tests).
    pub fn at(mut self, now_ms: u64) -> Self {
        self.now_ms = Some(now_ms);
        self
    }
}

/// Where rate-limit state lives. Implementations run each [`Call`] atomically.
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// Runs one script call.
    ///
    /// # Errors
    /// [`StoreError`] when the store fails, times out or rejects the arguments.
    fn run<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Result<Reply, StoreError>>;

    /// The `source` label of decisions this store makes.
    fn source(&self) -> Source;

    /// Whether the store answers now (a `PING` for Redis).
    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>>;
}

/// Reads argument `i` of a call as a non-negative integer.
pub(crate) fn arg(call: &Call, i: usize) -> Result<u64, StoreError> {
    call.args
        .get(i)
        .and_then(|v| u64::try_from(*v).ok())
        .ok_or_else(|| bad_args(call, &format!("argument {i} missing or negative")))
}

pub(crate) fn bad_args(call: &Call, why: &str) -> StoreError {
    StoreError {
        kind: crate::error::StoreErrorKind::Other,
        script: call.script.name(),
        message: format!("bad arguments: {why}"),
        source: None,
    }
}
