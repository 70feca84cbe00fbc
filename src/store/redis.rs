//! The Redis store: each call is one `EVALSHA` of a script of `lua/` (`EVAL` and a reload on `NOSCRIPT`,
//! which `redis::Script` does), under a timeout, on one server (given by its URL, or as the master Redis
//! Sentinel names) or on a Redis Cluster that follows `MOVED` and `ASK` redirections and refreshes its slot map.
//! Every key a script touches shares one hash tag (`{rule:key}`), so each call goes to one slot
//! (docs/ARCHITECTURE.md, invariant 5). The connections, and how they follow a failover, are `connect.rs`'s.

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::TlsCertificates;
use tokio::sync::watch;

use super::call::Call;
use super::connect::{self, Single};
use super::eviction::EvictionWatch;
use super::script::{Arg, Script};
use super::target::{self, tcp_settings, Target};
use super::{BoxFuture, Store};
use crate::algorithm::room::Lent;
use crate::algorithm::Reply;
use crate::config::RedisConfig;
use crate::decision::Source;
use crate::error::Error;
use crate::error::{StoreError, StoreErrorKind};
use crate::telemetry::ScriptMetrics;
use crate::timings::Timings;

/// Every script, hashed once (`EVALSHA` by hash, `EVAL` and reload on `NOSCRIPT`).
static SCRIPTS: LazyLock<[redis::Script; Script::ALL.len()]> =
    LazyLock::new(|| Script::ALL.map(|s| redis::Script::new(s.source())));

/// The readiness probe: a script that writes nothing but declares no `no-writes` flag, so Redis 7 refuses it
/// as it would refuse a write: `READONLY` on a replica, `OOM` over `maxmemory`. (Before Redis 7 the shebang
/// does not compile, and the probe falls back to `PING`.)
static PROBE: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new("#!lua\nreturn 1\n"));

fn script(s: Script) -> &'static redis::Script {
    &SCRIPTS[s as usize]
}

/// The connection: one server's (by URL or through Sentinel), or a cluster's, published by the task that
/// connects it in the background (so the cluster may be down at start, and a call that times out does not
/// abort the connecting).
#[derive(Clone)]
enum Conn {
    Single(Single),
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

/// Runs the scripts against one Redis server (by URL or through Sentinel) or a Redis Cluster.
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    timeout: Duration,
    metrics: Vec<ScriptMetrics>,
    eviction: Arc<EvictionWatch>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// A connect error of kind `Other`.
fn connect_error(message: String, source: Option<redis::RedisError>) -> StoreError {
    StoreError {
        kind: StoreErrorKind::Other,
        script: "connect",
        message,
        source: source.map(|e| Box::new(e) as _),
    }
}

/// The running tokio runtime (and rustls's crypto provider installed, for `rediss://`).
fn runtime() -> Result<tokio::runtime::Handle, StoreError> {
    target::install_crypto_provider();
    tokio::runtime::Handle::try_current()
        .map_err(|_| connect_error("a Redis store must be created inside a tokio runtime".into(), None))
}

impl RedisStore {
    /// A store for `url` whose every call gives up after `timeout`. It connects lazily, on the first call, and
    /// reconnects by itself after a failure, so it can be built while Redis is down; a server that refuses
    /// writes (`READONLY`: demoted to a replica) is connected to again. Needs a tokio runtime.
    ///
    /// # Errors
    /// [`StoreError`] of kind `Other` when the URL is malformed or no tokio runtime is running.
    pub fn connect(url: &str, timeout: Duration) -> Result<Self, StoreError> {
        Self::connect_url(url, timeout, None)
    }

    /// A store for `[redis]` of a validated configuration: its server (`url`), cluster or Sentinels, over TLS
    /// with its `tls_*` files for `rediss://` URLs, whose every call gives up after its `timeout`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] naming the `tls_*` file that can no longer be read or parsed; [`StoreError`]
    /// as [`Self::connect`] and the others.
    pub(crate) fn from_redis_config(redis: &RedisConfig) -> Result<Self, Error> {
        let tls = redis
            .tls_certificates()
            .map_err(|(name, reason)| Error::InvalidArgument { name, reason })?;
        let tls = tls.as_ref();
        Ok(match &redis.sentinel {
            Some(s) => Self::sentinel(&s.master_name, &s.nodes, redis.timeout, tls)?,
            None if redis.cluster.is_empty() => Self::connect_url(&redis.url, redis.timeout, tls)?,
            None => Self::cluster(&redis.cluster, redis.timeout, tls)?,
        })
    }

    fn connect_url(url: &str, timeout: Duration, tls: Option<&TlsCertificates>) -> Result<Self, StoreError> {
        let runtime = runtime()?;
        let err = |e: redis::RedisError| connect_error(e.to_string(), Some(e));
        let client = redis::Client::open(target::connection_info(url, tls).map_err(err)?).map_err(err)?;
        Ok(Self::single(&runtime, Target::Url(Box::new(client)), timeout))
    }

    /// A store for the master that the Redis Sentinels at `nodes` (`redis://host:port` of the Sentinels) monitor
    /// as `master_name`, whose every call gives up after `timeout`. A background task asks the Sentinels for the
    /// master (so they may be down at start; calls wait for it within their timeout), and asks again after a
    /// call fails, times out or meets `READONLY`: a failover is followed by itself.
    ///
    /// # Errors
    /// [`StoreError`] of kind `Other` when `nodes` is empty, a URL is malformed, or no tokio runtime is running.
    pub fn connect_sentinel(master_name: &str, nodes: &[String], timeout: Duration) -> Result<Self, StoreError> {
        Self::sentinel(master_name, nodes, timeout, None)
    }

    fn sentinel(
        master_name: &str,
        nodes: &[String],
        timeout: Duration,
        tls: Option<&TlsCertificates>,
    ) -> Result<Self, StoreError> {
        let runtime = runtime()?;
        let target = Target::sentinel(nodes, master_name, tls).map_err(|e| connect_error(e.to_string(), Some(e)))?;
        Ok(Self::single(&runtime, target, timeout))
    }

    fn single(runtime: &tokio::runtime::Handle, target: Target, timeout: Duration) -> Self {
        let config = ConnectionManagerConfig::new()
            // Connecting sends a few commands (the handshake) and waits for their replies: over a slow link that
            // is several round trips, so an attempt may take as long as a connection task gives it.
            .set_connection_timeout(Some(Timings::from_call(timeout).connect))
            // The connection's own limit only backs up the per-call timeouts below; it must not cut a lease or a
            // beat short (a lease timed out after Redis granted it strands its tokens; a beat, the longest at
            // twenty call timeouts, waits for a slow link), so it is the longest.
            .set_response_timeout(Some(Timings::from_call(timeout).beat))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        let eviction = Arc::new(EvictionWatch::default());
        let single = Single::spawn(
            runtime,
            target,
            config,
            Timings::from_call(timeout).connect,
            eviction.clone(),
        );
        Self::with_conn(Conn::Single(single), timeout, eviction)
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
        Self::cluster(nodes, timeout, None)
    }

    fn cluster(nodes: &[String], timeout: Duration, tls: Option<&TlsCertificates>) -> Result<Self, StoreError> {
        let runtime = runtime()?;
        let mut builder = ClusterClient::builder(nodes.iter().map(String::as_str));
        if let Some(certs) = tls {
            builder = builder.certs(certs.clone());
        }
        let client = builder
            .connection_timeout(Timings::from_call(timeout).connect)
            // As for one server: the longest a lease may wait; calls have their own, shorter, timeouts.
            .response_timeout(Timings::from_call(timeout).beat)
            .retries(3)
            .max_retry_wait(100)
            .tcp_settings(tcp_settings())
            .build()
            .map_err(|e| connect_error(e.to_string(), Some(e)))?;
        let infos = nodes
            .iter()
            .map(|n| target::connection_info(n, tls))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| connect_error(e.to_string(), Some(e)))?;
        let eviction = Arc::new(EvictionWatch::default());
        let conn = connect::spawn_cluster(
            &runtime,
            client,
            infos,
            Timings::from_call(timeout).connect,
            eviction.clone(),
        );
        Ok(Self::with_conn(Conn::Cluster(conn), timeout, eviction))
    }

    /// A store on the server of your own `client` (`redis::Client::open`, or `redis::Client::build_with_tls`
    /// for TLS with certificates of your own), whose every call gives up after `timeout`. It is used as
    /// [`Self::connect`] uses the client it makes from a URL: its connection info (address, TLS, credentials,
    /// database, TCP settings) is yours; the store makes its own `ConnectionManager` from it, lazily, with a
    /// connection timeout of `timeout` (at least 100 ms), a response timeout of ten `timeout`s and one retry,
    /// connects again when the server refuses writes (`READONLY`), and reads its `maxmemory-policy` at each
    /// connection. Scripts need no loading: each call is an `EVALSHA`, and an `EVAL` on `NOSCRIPT`. Needs a
    /// tokio runtime.
    ///
    /// # Errors
    /// [`StoreError`] of kind `Other` when no tokio runtime is running.
    pub fn from_client(client: redis::Client, timeout: Duration) -> Result<Self, StoreError> {
        let runtime = runtime()?;
        Ok(Self::single(&runtime, Target::Url(Box::new(client)), timeout))
    }

    /// A store on your own `manager`, whose every call gives up after `timeout` (the store's own timer around
    /// each call, whatever the manager's settings). The manager's connection timeout, response timeout and
    /// retries are yours: keep its response timeout longer than `timeout` (the store's own is ten times
    /// longer), since a response cut short after Redis granted a lease strands the lease's tokens until its
    /// `ttl`. The manager reconnects by itself to the address it was made for; unlike the other constructors,
    /// the store does not connect again after `READONLY` (a master demoted by a failover: use
    /// [`Self::connect_sentinel`] behind Sentinel) and does not read the server's `maxmemory-policy`. Scripts
    /// need no loading: each call is an `EVALSHA`, and an `EVAL` on `NOSCRIPT`.
    pub fn from_connection_manager(manager: ConnectionManager, timeout: Duration) -> Self {
        target::install_crypto_provider();
        let eviction = Arc::new(EvictionWatch::default());
        Self::with_conn(Conn::Single(Single::fixed(manager)), timeout, eviction)
    }

    /// A store on the Redis Cluster of your own `client` (`ClusterClient::builder(nodes)...build()`, with
    /// `.certs(...)` for TLS), whose every call gives up after `timeout`. As in [`Self::connect_cluster`], a
    /// background task connects with it (so the cluster may be down at start), retrying with a back-off of
    /// 50 ms to 2 s, each attempt bounded by ten `timeout`s (at least 1 s). The client's connection timeout,
    /// response timeout and retries are yours: keep its response timeout longer than `timeout`
    /// (`connect_cluster` sets ten times longer; see [`Self::from_connection_manager`] for why). The store does
    /// not read the nodes' `maxmemory-policy` (the client does not say which nodes it was given). Needs a tokio
    /// runtime.
    ///
    /// # Errors
    /// [`StoreError`] of kind `Other` when no tokio runtime is running.
    pub fn from_cluster_client(client: ClusterClient, timeout: Duration) -> Result<Self, StoreError> {
        let runtime = runtime()?;
        let eviction = Arc::new(EvictionWatch::default());
        let conn = connect::spawn_cluster(
            &runtime,
            client,
            Vec::new(),
            Timings::from_call(timeout).connect,
            eviction.clone(),
        );
        Ok(Self::with_conn(Conn::Cluster(conn), timeout, eviction))
    }

    /// A store on your own Redis Cluster connection (`ClusterClient::get_async_connection`), whose every call
    /// gives up after `timeout`. The connection's own timeouts and retries are yours, as for
    /// [`Self::from_cluster_client`]; it follows `MOVED` and `ASK` and refreshes its slot map by itself. The
    /// store does not read the nodes' `maxmemory-policy`.
    pub fn from_cluster_connection(connection: ClusterConnection, timeout: Duration) -> Self {
        target::install_crypto_provider();
        // `wait_for` sees the connection already there, so the sender may go at once.
        let (_, conn) = watch::channel(Some(connection));
        Self::with_conn(Conn::Cluster(conn), timeout, Arc::new(EvictionWatch::default()))
    }

    fn with_conn(conn: Conn, timeout: Duration, eviction: Arc<EvictionWatch>) -> Self {
        let metrics = Script::ALL.iter().map(|s| ScriptMetrics::new(s.name())).collect();
        Self {
            conn,
            timeout,
            metrics,
            eviction,
        }
    }

    /// The connection to send a call on; for a connection not made yet, once it is (callers bound the wait
    /// with their timeout).
    async fn active(&self) -> redis::RedisResult<Active> {
        match &self.conn {
            Conn::Single(single) => Ok(Active::Single(single.connection().await?.0)),
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

    /// Runs `f` on the connection within `timeout`, classifies its error and tells the connection's task about
    /// it (which may connect again).
    async fn on_connection<T, F>(&self, name: &'static str, timeout: Duration, f: F) -> Result<T, StoreError>
    where
        F: AsyncFnOnce(&mut Active) -> redis::RedisResult<T>,
    {
        let generation = match &self.conn {
            Conn::Single(single) => single.generation(),
            Conn::Cluster(_) => 0,
        };
        let call = async { f(&mut self.active().await?).await };
        let result = match tokio::time::timeout(timeout, call).await {
            Err(_) => Err(StoreError::timeout(name, timeout)),
            Ok(result) => result.map_err(|e| classify(name, e)),
        };
        if let (Err(e), Conn::Single(single)) = (&result, &self.conn) {
            single.failed(generation, e.kind);
        }
        result
    }

    /// The timeout of every call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// An error when a server the store connected to is older than the scripts support (`version.rs`).
    fn supported(&self, script: &'static str) -> Result<(), StoreError> {
        match self.eviction.unsupported() {
            None => Ok(()),
            Some(message) => Err(StoreError {
                kind: StoreErrorKind::Other,
                script,
                message,
                source: None,
            }),
        }
    }

    async fn run_call(&self, call: &Call) -> Result<Reply, StoreError> {
        let metrics = self.metrics.get(call.script() as usize);
        if let Err(e) = self.supported(call.script().name()) {
            if let Some(m) = metrics {
                m.error(e.kind);
            }
            return Err(e);
        }
        let script = script(call.script());
        let mut invocation = script.prepare_invoke();
        for key in call.keys() {
            invocation.key(key);
        }
        for arg in call.args() {
            match arg {
                Arg::Int(v) => invocation.arg(v),
                Arg::Str(s) => invocation.arg(s),
                Arg::Lent(lent) => invocation.arg(Lent::encode(lent)),
            };
        }
        let started = Instant::now();
        let timeout = call.timeout.unwrap_or(self.timeout);
        let name = call.script().name();
        let outcome = self
            .on_connection(name, timeout, async |conn| invocation.invoke_async::<Reply>(conn).await)
            .await;
        if let Some(m) = metrics {
            m.duration.record(started.elapsed().as_secs_f64());
        }
        match &outcome {
            Ok(_) => self.eviction.condition.answered(),
            Err(e) => {
                self.eviction.condition.failed(e);
                if let Some(m) = metrics {
                    m.error(e.kind);
                }
            }
        }
        outcome
    }

    /// The probe's timeout: the call timeout, at least 200 ms.
    fn probe_timeout(&self) -> Duration {
        self.timeout.max(Duration::from_millis(200))
    }
}

/// A script's reply as the redis crate reads any value: the Lua protocol's four integers (docs/ARCHITECTURE.md,
/// "The Lua protocol"), and a lease's stamp and hold after them; anything else a parsing error (a store error of
/// kind `other`).
impl redis::FromRedisValue for Reply {
    fn from_redis_value(v: redis::Value) -> Result<Self, redis::ParsingError> {
        let values = Vec::<i64>::from_redis_value(v)?;
        match values[..] {
            [a, b, c, d] => Ok(Reply::from_wire([a, b, c, d], 0)),
            [a, b, c, d, stamp] => Ok(Reply::from_wire([a, b, c, d], stamp)),
            [a, b, c, d, stamp, held] => Ok(Reply {
                held: u64::try_from(held).unwrap_or(0),
                ..Reply::from_wire([a, b, c, d], stamp)
            }),
            _ => Err(format!("a script reply of 4 integers, a stamp and a hold, got {values:?}").into()),
        }
    }
}

/// The kind of a Redis error, from redis-rs's own predicates and the reply's error code.
fn classify(script: &'static str, e: redis::RedisError) -> StoreError {
    let kind = if e.is_timeout() {
        StoreErrorKind::Timeout
    } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        StoreErrorKind::Io
    } else if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) {
        StoreErrorKind::NoScript
    } else if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly) {
        StoreErrorKind::Readonly
    } else if e.code() == Some("OOM") {
        StoreErrorKind::Oom
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
            let ping = async |conn: &mut Active| redis::cmd("PING").query_async::<String>(conn).await;
            self.on_connection("ping", self.probe_timeout(), ping).await.map(drop)
        })
    }

    fn probe(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            self.supported("probe")?;
            let probe = async |conn: &mut Active| PROBE.prepare_invoke().invoke_async::<i64>(conn).await;
            match self.on_connection("probe", self.probe_timeout(), probe).await {
                // A server before Redis 7 (the shebang does not compile): whether it answers.
                Err(e) if e.kind == StoreErrorKind::Other => self.ping().await,
                result => result.map(drop),
            }
        })
    }

    fn eviction_policy(&self) -> Option<String> {
        self.eviction.policy_at_risk()
    }
}

#[cfg(test)]
mod tests {
    use redis::{FromRedisValue, Value};

    use crate::algorithm::Reply;

    #[test]
    fn a_reply_is_four_integers_and_nothing_else() {
        let wire = |v: &[i64]| Value::Array(v.iter().map(|&i| Value::Int(i)).collect());
        let reply = Reply::from_redis_value(wire(&[3, 7, -1, 250])).expect("four integers");
        assert_eq!(
            (
                reply.granted,
                reply.remaining,
                reply.retry_after_ms,
                reply.reset_after_ms
            ),
            (3, 7, -1, 250)
        );
        let short = Reply::from_redis_value(wire(&[3, 7, -1])).expect_err("three integers");
        assert!(short.to_string().contains("4 integers"), "{short}");
        assert!(Reply::from_redis_value(Value::SimpleString("OK".into())).is_err());
    }
}
