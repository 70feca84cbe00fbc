//! The Redis store: each call is one `EVALSHA` of a script of `lua/` (`EVAL` and a reload on `NOSCRIPT`,
//! which `redis::Script` does), under a timeout, over a [`ConnectionManager`] that reconnects by itself, or a
//! Redis Cluster connection that follows `MOVED` and `ASK` redirections and refreshes its slot map. Every key a
//! script touches shares one hash tag (`{rule:key}`), so each call goes to one slot (docs/ARCHITECTURE.md, invariant 5).

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use tokio::sync::watch;

use super::call::{Arg, Call, Script};
use super::{BoxFuture, Store};
use crate::algorithm::Reply;
use crate::decision::Source;
use crate::error::{StoreError, StoreErrorKind};
use crate::telemetry::ScriptMetrics;

/// Every script, hashed once (`EVALSHA` by hash, `EVAL` and reload on `NOSCRIPT`).
static SCRIPTS: LazyLock<[redis::Script; Script::ALL.len()]> =
    LazyLock::new(|| Script::ALL.map(|s| redis::Script::new(s.source())));

fn script(s: Script) -> &'static redis::Script {
    &SCRIPTS[s as usize]
}

/// The connection: one server, or a cluster's, published by the task that connects it in the background (so
/// the cluster may be down at start, and a call that times out does not abort the connecting).
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(watch::Receiver<Option<ClusterConnection>>),
}

/// A connection ready for one call.
enum Active {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl redis::aio::ConnectionLike for Active {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(cmd, offset, count),
            Self::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// Runs the scripts against one Redis server or a Redis Cluster.
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
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
        let info = redis::IntoConnectionInfo::into_connection_info(url)
            .map_err(err)?
            .set_tcp_settings(tcp_settings());
        let client = redis::Client::open(info).map_err(err)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout.max(Duration::from_millis(100))))
            // The connection's own limit only backs up the per-call timeouts below; it must not cut a lease
            // short (a lease timed out after Redis granted it strands its tokens), so it is the longest.
            .set_response_timeout(Some(timeout.saturating_mul(10).max(Duration::from_millis(100))))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        let conn = ConnectionManager::new_lazy_with_config(client, config).map_err(err)?;
        Ok(Self::with_conn(Conn::Single(conn), timeout))
    }

    /// A store for the Redis Cluster reached through `nodes` (`redis://host:port` of some of its masters), whose
    /// every call gives up after `timeout`. A background task connects (so the cluster may be down at start),
    /// retrying with a back-off of 50 ms to 2 s, and stops once connected or once the store is dropped; calls
    /// wait for it within their timeout. The connection discovers the other nodes and the slot map, follows
    /// `MOVED` and `ASK` redirections (a resharding) and refreshes the slot map when a node fails over.
    ///
    /// # Errors
    /// [`StoreError`] of kind `Other` when `nodes` is empty, a URL is malformed, or no tokio runtime is running.
    pub fn connect_cluster(nodes: &[String], timeout: Duration) -> Result<Self, StoreError> {
        let other = |message: String, source: Option<redis::RedisError>| StoreError {
            kind: StoreErrorKind::Other,
            script: "connect",
            message,
            source: source.map(|e| Box::new(e) as _),
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(other(
                "a Redis store must be created inside a tokio runtime".into(),
                None,
            ));
        };
        let client = ClusterClient::builder(nodes.iter().map(String::as_str))
            .connection_timeout(timeout.max(Duration::from_millis(100)))
            // As for one server: the longest a lease may wait; calls have their own, shorter, timeouts.
            .response_timeout(timeout.saturating_mul(10).max(Duration::from_millis(100)))
            .retries(3)
            .max_retry_wait(100)
            .tcp_settings(tcp_settings())
            .build()
            .map_err(|e| other(e.to_string(), Some(e)))?;
        let (publish, conn) = watch::channel(None);
        let attempt = timeout.saturating_mul(10).max(Duration::from_secs(1));
        runtime.spawn(async move {
            let mut backoff = Duration::from_millis(50);
            while !publish.is_closed() {
                match tokio::time::timeout(attempt, client.get_async_connection()).await {
                    Ok(Ok(connection)) => {
                        let _ = publish.send(Some(connection));
                        return;
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "cluster connection failed; retrying"),
                    Err(_) => tracing::debug!(?attempt, "cluster connection timed out; retrying"),
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        });
        Ok(Self::with_conn(Conn::Cluster(conn), timeout))
    }

    fn with_conn(conn: Conn, timeout: Duration) -> Self {
        let metrics = Script::ALL.iter().map(|s| ScriptMetrics::new(s.name())).collect();
        Self { conn, timeout, metrics }
    }

    /// The connection to send a call on; for a cluster not connected yet, once it is (callers bound the wait
    /// with their timeout).
    async fn active(&self) -> redis::RedisResult<Active> {
        match &self.conn {
            Conn::Single(conn) => Ok(Active::Single(conn.clone())),
            Conn::Cluster(conn) => {
                let mut conn = conn.clone();
                let ready = conn.wait_for(Option::is_some).await;
                match ready.ok().and_then(|c| c.clone()) {
                    Some(c) => Ok(Active::Cluster(c)),
                    None => Err(redis::RedisError::from((
                        redis::ErrorKind::Io,
                        "the cluster connection task ended",
                    ))),
                }
            }
        }
    }

    /// The timeout of every call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    async fn run_call(&self, call: &Call) -> Result<Reply, StoreError> {
        let script = script(call.script());
        let mut invocation = script.prepare_invoke();
        for key in call.keys() {
            invocation.key(key);
        }
        for arg in call.args() {
            match arg {
                Arg::Int(v) => invocation.arg(v),
                Arg::Str(s) => invocation.arg(s),
            };
        }
        let metrics = self.metrics.get(call.script() as usize);
        let started = Instant::now();
        let timeout = call.timeout.unwrap_or(self.timeout);
        let invoke = async { invocation.invoke_async::<Vec<i64>>(&mut self.active().await?).await };
        let result = tokio::time::timeout(timeout, invoke).await;
        if let Some(m) = metrics {
            m.duration.record(started.elapsed().as_secs_f64());
        }
        let name = call.script().name();
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

/// `TCP_NODELAY`: a call written while another is unanswered goes out at once instead of waiting for the
/// other's reply to carry the ACK (Nagle), which doubled the latency of overlapping calls (`benches/latency.rs`).
fn tcp_settings() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
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
            let ping = async {
                redis::cmd("PING")
                    .query_async::<String>(&mut self.active().await?)
                    .await
            };
            match tokio::time::timeout(self.timeout.max(Duration::from_millis(200)), ping).await {
                Err(_) => Err(StoreError::timeout("ping", self.timeout)),
                Ok(Err(e)) => Err(classify("ping", e)),
                Ok(Ok(_)) => Ok(()),
            }
        })
    }
}
