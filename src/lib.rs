#![doc = include_str!("../README.md")]
#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic))]

// Leaves first: each module uses only those above it (docs/ARCHITECTURE.md, "Dependency direction").
mod algorithm;
mod background;
mod clock;
mod compiled;
mod config;
mod decide;
mod decision;
mod error;
mod fallback;
mod fleet;
#[cfg(feature = "http")]
pub mod http;
mod lease;
mod limiter;
mod nearby;
mod packed;
mod queue;
mod refusals;
mod rule;
mod store;
pub mod telemetry;
mod timings;

pub use algorithm::TokenBucket;
pub use clock::{Clock, FakeClock, MonotonicClock, TokioClock};
pub use config::{
    redact_url, rls_match, Config, MetricsConfig, ProcessConfig, RedisConfig, RlsRoute, SentinelConfig, ServeConfig,
};
pub use decision::{Decision, Permit, Source};
pub use error::{ConfigError, Error, StoreError, StoreErrorKind};
pub use limiter::builder::LimiterBuilder;
pub use limiter::handle::RuleHandle;
pub use limiter::lifecycle::Readiness;
pub use limiter::{Limiter, LimiterStats};
pub use rule::{Algorithm, Calendar, FailMode, Lease, Override, Quota, Rule, Zone};
pub use store::{BoxFuture, Faults, FaultyStore, LinkFault, MemoryStore, RedisStore, Store, StoreFault};

/// The examples of the README before it became a reference page, kept as doctests (docs/EXAMPLES.md).
#[cfg(doctest)]
#[doc = include_str!("../docs/EXAMPLES.md")]
pub struct Examples;

/// The same for the `http` feature (docs/EXAMPLES-http.md).
#[cfg(all(doctest, feature = "http"))]
#[doc = include_str!("../docs/EXAMPLES-http.md")]
pub struct HttpExamples;
