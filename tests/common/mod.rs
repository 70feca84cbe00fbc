//! The integration tests' helpers: real servers (`server.rs`, which the crate's own store tests in
//! `src/store/tests` share; `sentinel.rs`, a `redis-sentinel`; `tls.rs`, certificates for both), the delaying TCP
//! proxy (`proxy.rs`), admissions over time checked in every window (the `tokenlease-timeline` crate, `timeline/`), and [`limiter`], the one way these tests build a limiter.
#![allow(dead_code)]

pub mod proxy;
pub mod redaction;
pub mod sentinel;
mod server;
pub mod tls;

pub use server::*;

use std::sync::Arc;
use std::time::Duration;

use tokenlease::{Clock, FailMode, Limiter, LimiterBuilder, MemoryStore, ProcessConfig, RedisStore, Rule, TokioClock};

/// The call timeout of a Redis store when the test sets no [`TestLimiter::timeout`].
pub const REDIS_TIMEOUT: Duration = Duration::from_secs(2);

/// A limiter over `rules`, built with [`TestLimiter::build`]. Unless told otherwise it is what
/// `Limiter::builder()` makes: the in-process store on the real monotonic clock, default timeout, fail mode and
/// expected processes.
///
/// ```ignore
/// common::limiter([rule]).tokio_clock().build()                      // waits under start_paused
/// common::limiter(rules).redis(&server).timeout(T).fail_mode(m).build() // a real redis-server
/// ```
pub fn limiter(rules: impl IntoIterator<Item = Rule>) -> TestLimiter {
    TestLimiter {
        builder: Limiter::builder().rules(rules),
        redis: None,
        clock: None,
        timeout: None,
    }
}

/// The settings of a test limiter; see [`limiter`].
#[must_use]
pub struct TestLimiter {
    builder: LimiterBuilder,
    redis: Option<String>,
    clock: Option<Arc<dyn Clock>>,
    timeout: Option<Duration>,
}

impl TestLimiter {
    /// On `server` (a `RedisStore` whose calls time out after [`Self::timeout`], else [`REDIS_TIMEOUT`])
    /// instead of the in-process store.
    pub fn redis(mut self, server: &RedisServer) -> Self {
        self.redis = Some(server.url());
        self
    }

    /// On the Redis at `url` (a proxy in front of a server, say).
    pub fn redis_url(mut self, url: &str) -> Self {
        self.redis = Some(url.to_owned());
        self
    }

    /// On tokio's clock: the limiter's clock and, unless on Redis, the in-process store's. Under
    /// `#[tokio::test(start_paused = true)]` the paused clock then moves lease deadlines, windows, the store's
    /// `now` and the sweeper together, with every `tokio::time::sleep` or `advance`.
    pub fn tokio_clock(self) -> Self {
        self.clock(Arc::new(TokioClock::new()))
    }

    /// On `clock` (e.g. a `FakeClock`): the limiter's clock and, unless on Redis, the in-process store's. The
    /// sweeper still runs on tokio's timer.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// The limiter's call timeout, also the Redis store's when on Redis.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The fail mode of rules that do not set one.
    pub fn fail_mode(mut self, mode: FailMode) -> Self {
        self.builder = self.builder.fail_mode(mode);
        self
    }

    /// Processes sharing the limits.
    pub fn expected_processes(mut self, n: u32) -> Self {
        self.builder = self.builder.expected_processes(n);
        self
    }

    /// The process settings (local keys, idle TTL, key length).
    pub fn process(mut self, process: ProcessConfig) -> Self {
        self.builder = self.builder.process(process);
        self
    }

    /// Builds the limiter (and starts its sweeper: call inside a tokio runtime); panics when it cannot.
    #[track_caller]
    pub fn build(self) -> Limiter {
        let mut builder = self.builder;
        if let Some(timeout) = self.timeout {
            builder = builder.timeout(timeout);
        }
        if let Some(url) = &self.redis {
            let store = RedisStore::connect(url, self.timeout.unwrap_or(REDIS_TIMEOUT)).expect("a Redis store");
            builder = builder.store(Arc::new(store));
        } else if let Some(clock) = &self.clock {
            builder = builder.store(Arc::new(MemoryStore::with_clock(clock.clone())));
        }
        if let Some(clock) = self.clock {
            builder = builder.clock(clock);
        }
        builder.build().expect("limiter")
    }
}

/// Waits (real time: the fleet's beats run every second) until every limiter of `limiters` counts `n` live
/// processes of `rule`; panics after `limit`.
pub async fn until_all_count(limiters: &[Limiter], rule: &str, n: u64, limit: Duration) {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let counts: Vec<u64> = limiters.iter().map(|l| l.processes(rule)).collect();
        if counts.iter().all(|c| *c == n) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "never all {n}: {counts:?}");
        // real time: the beats.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
