//! tokenlease: a distributed rate limiter for flash sales and per-user limits.
//!
//! Each process leases batches of tokens from a token bucket kept in Redis by a Lua script into local buckets,
//! so a hot key is decided in process and Redis sees one call per batch; the shared limit is never exceeded.
//! See the README and DESIGN.md for the architecture and the invariants.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

pub mod algorithm;
mod breaker;
pub mod clock;
pub mod config;
pub mod error;
mod lease;
pub mod limiter;
#[cfg(feature = "http")]
pub mod middleware;
pub mod rule;
pub mod store;
pub mod telemetry;

pub use clock::{Clock, FakeClock, MonotonicClock, TokioClock};
pub use config::{Config, ConfigError};
pub use error::{Error, StoreError, StoreErrorKind};
pub use limiter::{Decision, Limiter, LimiterBuilder, LimiterStats, Permit};
pub use rule::{Algorithm, FailMode, Lease, Quota, Rule};
pub use store::{MemoryStore, RedisStore, Store};
pub use telemetry::Source;

/// The README's examples, compiled and run as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
