//! The Redis store: each call is one `EVALSHA` of a script of `lua/` (`EVAL` and a reload on `NOSCRIPT`,
//! which `redis::Script` does), over a [`ConnectionManager`] that reconnects by itself, under a timeout.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::{BoxFuture, Call, Script, Store};
use crate::algorithm::Reply;
use crate::error::{StoreError, StoreErrorKind};
use crate::telemetry::{ScriptMetrics, Source};

/// Every script, hashed once (`EVALSHA` by hash, `EVAL` and reload on `NOSCRIPT`).
static SCRIPTS: LazyLock<[redis::Script; Script::ALL.len()]> =
    LazyLock::new(|| Script::ALL.map(|s| redis::Script::new(script_source(s))));

fn script(s: Script) -> &'static redis::Script {
    &SCRIPTS[s as usize]
}

/// The source text of a script of `lua/`, for services in other languages that run them themselves.
pub fn script_source(s: Script) -> &'static str {
    match s {
        Script::TokenBucket => include_str!("../../lua/token_bucket.lua"),
        Script::TokenReturn => include_str!("../../lua/token_return.lua"),
        Script::SlidingLog => include_str!("../../lua/sliding_log.lua"),
        Script::FixedWindow => include_str!("../../lua/fixed_window.lua"),
        Script::SlidingWindow => include_str!("../../lua/sliding_window.lua"),
        Script::LeakyBucket => include_str!("../../lua/leaky_bucket.lua"),
        Script::LeakyReturn => include_str!("../../lua/leaky_return.lua"),
        Script::TokenAcquire => include_str!("../../lua/token_acquire.lua"),
    }
}

/// Runs the scripts against one Redis server.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    timeout: Duration,
    metrics: Vec<ScriptMetrics>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// A store for `url` whose every call gives up after `timeout`. It connects lazily, on the first call, and
    /// reconnects by itself after a failure, so it can be built while Redis is down. Needs a tokio runtime.
    ///
    /// # Errors
    /// [`StoreError`] of kind `Other` when the URL is malformed or no tokio runtime is running.
    pub fn connect(url: &str, timeout: Duration) -> Result<Self, StoreError> {
        let err = |e: redis::RedisError| StoreError {
            kind: StoreErrorKind::Other,
            script: "connect",
            message: e.to_string(),
            source: Some(Box::new(e)),
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(StoreError {
                kind: StoreErrorKind::Other,
                script: "connect",
                message: "a Redis store must be created inside a tokio runtime".into(),
                source: None,
            });
        }
        let client = redis::Client::open(url).map_err(err)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout.max(Duration::from_millis(100))))
            // The connection's own limit only backs up the per-call timeouts below; it must not cut a lease
            // short (a lease timed out after Redis granted it strands its tokens), so it is the longest.
            .set_response_timeout(Some(timeout.saturating_mul(10).max(Duration::from_millis(100))))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        let conn = ConnectionManager::new_lazy_with_config(client, config).map_err(err)?;
        let metrics = Script::ALL.iter().map(|s| ScriptMetrics::new(s.name())).collect();
        Ok(Self { conn, timeout, metrics })
    }

    /// The timeout of every call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    async fn run_call(&self, call: &Call) -> Result<Reply, StoreError> {
        let script = script(call.script);
        let mut invocation = script.prepare_invoke();
        for key in &call.keys {
            invocation.key(key);
        }
        let member_at = call.script.member_position();
        for (i, arg) in call.args.iter().enumerate() {
            if member_at == Some(i) {
                invocation.arg(call.member.as_deref().unwrap_or(""));
            }
            invocation.arg(*arg);
        }
        if member_at == Some(call.args.len()) {
            invocation.arg(call.member.as_deref().unwrap_or(""));
        }
        if let Some(now) = call.now_ms {
            invocation.arg(now);
        }
        let mut conn = self.conn.clone();
        let metrics = self.metrics.get(call.script as usize);
        let started = Instant::now();
        let timeout = call.timeout.unwrap_or(self.timeout);
        let result = tokio::time::timeout(timeout, invocation.invoke_async::<Vec<i64>>(&mut conn)).await;
        if let Some(m) = metrics {
            m.duration.record(started.elapsed().as_secs_f64());
        }
        let name = call.script.name();
        let outcome = match result {
            Err(_) => Err(StoreError::timeout(name, timeout)),
            Ok(Err(e)) => Err(classify(name, e)),
            Ok(Ok(values)) => match <[i64; 4]>::try_from(values) {
                Ok(v) => Ok(Reply::from_wire(v)),
                Err(v) => Err(StoreError {
                    kind: StoreErrorKind::Other,
                    script: name,
                    message: format!("expected 4 integers, got {v:?}"),
                    source: None,
                }),
            },
        };
        if let (Err(e), Some(m)) = (&outcome, metrics) {
            m.error(e.kind);
        }
        outcome
    }
}

fn classify(script: &'static str, e: redis::RedisError) -> StoreError {
    let kind = if e.is_timeout() {
        StoreErrorKind::Timeout
    } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        StoreErrorKind::Io
    } else if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) {
        StoreErrorKind::NoScript
    } else if e.is_cluster_error() {
        StoreErrorKind::Cluster
    } else {
        StoreErrorKind::Other
    };
    StoreError {
        kind,
        script,
        message: e.to_string(),
        source: Some(Box::new(e)),
    }
}

impl Store for RedisStore {
    fn run<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Result<Reply, StoreError>> {
        Box::pin(self.run_call(call))
    }

    fn source(&self) -> Source {
        Source::Redis
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let cmd = redis::cmd("PING");
            let ping = cmd.query_async::<String>(&mut conn);
            match tokio::time::timeout(self.timeout.max(Duration::from_millis(200)), ping).await {
                Err(_) => Err(StoreError::timeout("ping", self.timeout)),
                Ok(Err(e)) => Err(classify("ping", e)),
                Ok(Ok(_)) => Ok(()),
            }
        })
    }
}
