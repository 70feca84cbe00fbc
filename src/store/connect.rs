//! The Redis store's connections, each kept by a background task that stops when the store is dropped:
//!
//! - one server ([`Single`]), given by its URL or as the master Redis Sentinel names: a [`ConnectionManager`]
//!   (which reconnects by itself after a dropped connection) that the task makes again when the server stops
//!   accepting writes (`READONLY`: a master demoted to a replica by a failover) and, behind Sentinel, when it
//!   fails, after asking the Sentinels for the master again. So a failover is followed by itself, and a
//!   `READONLY` reply is a transient error, never a state for ever;
//! - a Redis Cluster, connected in the background (the cluster may be down at start); the redis crate follows
//!   `MOVED`/`ASK`, and refreshes its slot map on errors and `READONLY`, so it follows a failover too.
//!
//! Each time a task connects to a server it reads the server's `maxmemory-policy` (`eviction.rs`).
//!
//! TLS (`rediss://` URLs) is the redis crate's rustls, with the certificates of `[redis] tls_*` (`config/tls.rs`)
//! when given: on the client of one server, on every node of a cluster, and behind Sentinel on the Sentinels
//! (`rediss://` nodes) and on the master they name, which is then reached over TLS too.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{ConnectionInfo, RedisResult};
use tokio::sync::{watch, Notify};

use super::eviction::EvictionWatch;
use super::target::Target;
use crate::error::StoreErrorKind;
use crate::packed::{tagged, untagged, Atomic, Packed};
use crate::timings::Timings;

/// The back-off between failed attempts to connect or to find the master: from the first to the last.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(50), Duration::from_millis(250));

/// One server's connection at a time, and its number (the first is 1).
#[derive(Clone)]
struct Link {
    conn: ConnectionManager,
    generation: u64,
}

/// What callers ask of the task, and the bell they ring.
struct Wanted {
    remake: Atomic<Remake>,
    notify: Notify,
}

impl Default for Wanted {
    fn default() -> Self {
        Self {
            remake: Atomic::new(Remake::Nothing),
            notify: Notify::new(),
        }
    }
}

/// A request to make a connection again, stepped by [`Remake::and`] as calls fail and taken by the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Remake {
    /// Nothing asked since the task last looked.
    Nothing,
    /// The connection of `generation` failed behind Sentinel (the master may have moved): ask the Sentinels,
    /// and make it again if they name another server.
    Failed { generation: u64 },
    /// The connection of `generation` refused writes (`READONLY`): make it again even when the server's
    /// address is the same.
    Readonly { generation: u64 },
}

impl Remake {
    /// The request after `other`: the newer connection's; of one connection, `Readonly` over `Failed`.
    fn and(self, other: Self) -> Self {
        match (self.generation(), other.generation()) {
            (mine, theirs) if theirs > mine => other,
            (mine, theirs) if mine > theirs => self,
            _ if matches!(other, Self::Readonly { .. }) => other,
            _ => self,
        }
    }

    /// The connection it asks about (0: none).
    fn generation(self) -> u64 {
        match self {
            Self::Nothing => 0,
            Self::Failed { generation } | Self::Readonly { generation } => generation,
        }
    }
}

impl Packed for Remake {
    fn pack(self) -> u64 {
        match self {
            Self::Nothing => tagged(0, 0),
            Self::Failed { generation } => tagged(1, generation),
            Self::Readonly { generation } => tagged(2, generation),
        }
    }

    fn unpack(word: u64) -> Self {
        match untagged(word) {
            (1, generation) => Self::Failed { generation },
            (2, generation) => Self::Readonly { generation },
            _ => Self::Nothing,
        }
    }
}

/// One server's connection, kept by a background task (see the module's documentation).
#[derive(Clone)]
pub(crate) struct Single {
    links: watch::Receiver<Option<Link>>,
    wanted: Arc<Wanted>,
    /// Behind Sentinel: connection failures and timeouts also send the task to the Sentinels.
    sentinel: bool,
}

impl Single {
    /// Starts the task that connects to `target` with `config`, each attempt bounded by `attempt`; it reads the
    /// server's `maxmemory-policy` into `eviction` at each connection made. Needs a tokio runtime.
    pub(crate) fn spawn(
        runtime: &tokio::runtime::Handle,
        target: Target,
        config: ConnectionManagerConfig,
        attempt: Duration,
        eviction: Arc<EvictionWatch>,
    ) -> Self {
        let sentinel = !matches!(target, Target::Url(_));
        let (publish, links) = watch::channel(None);
        let wanted = Arc::new(Wanted::default());
        let task = Task {
            target,
            config,
            attempt,
            eviction,
            publish,
            wanted: wanted.clone(),
        };
        runtime.spawn(task.run());
        Self {
            links,
            wanted,
            sentinel,
        }
    }

    /// The caller's own connection manager, kept as it is: no task, so no connection is made again (the
    /// manager reconnects by itself to the address it was made for) and no `maxmemory-policy` is read.
    pub(crate) fn fixed(conn: ConnectionManager) -> Self {
        // `wait_for` sees the value already there, so the sender may go at once.
        let (_, links) = watch::channel(Some(Link { conn, generation: 1 }));
        Self {
            links,
            wanted: Arc::new(Wanted::default()),
            sentinel: false,
        }
    }

    /// The connection and its generation, once the first is made (callers bound the wait with their timeout).
    pub(crate) async fn connection(&self) -> RedisResult<(ConnectionManager, u64)> {
        let mut links = self.links.clone();
        let link = links.wait_for(Option::is_some).await.ok().and_then(|l| l.clone());
        match link {
            Some(link) => Ok((link.conn, link.generation)),
            None => Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "the connection task ended",
            ))),
        }
    }

    /// The generation of the connection in use now (0 before the first).
    pub(crate) fn generation(&self) -> u64 {
        self.links.borrow().as_ref().map_or(0, |l| l.generation)
    }

    /// A call on the connection of `generation` failed with `kind`: asks for a new connection when the server
    /// refuses writes, and behind Sentinel also when it failed or timed out (the master may have changed).
    pub(crate) fn failed(&self, generation: u64, kind: StoreErrorKind) {
        let remake = match kind {
            StoreErrorKind::Readonly => true,
            StoreErrorKind::Io | StoreErrorKind::Timeout => self.sentinel,
            _ => false,
        };
        if remake && generation > 0 {
            let asked = if kind == StoreErrorKind::Readonly {
                Remake::Readonly { generation }
            } else {
                Remake::Failed { generation }
            };
            self.wanted.remake.update(|was| (was.and(asked), ()));
            self.wanted.notify.notify_one();
        }
    }
}

/// The background task of a [`Single`].
struct Task {
    target: Target,
    config: ConnectionManagerConfig,
    attempt: Duration,
    eviction: Arc<EvictionWatch>,
    publish: watch::Sender<Option<Link>>,
    wanted: Arc<Wanted>,
}

impl Task {
    /// Connects, then waits for a request to connect again, until the store is dropped.
    async fn run(mut self) {
        let mut generation = 0;
        let mut address = None;
        loop {
            let Some(client) = self.resolve().await else { return };
            let info = client.get_connection_info().clone();
            let addr = info.addr().to_string();
            // A `READONLY` of a connection made again since is stale: that one is gone.
            let asked = self.wanted.remake.update(|asked| (Remake::Nothing, asked));
            let readonly = matches!(asked, Remake::Readonly { generation: g } if g >= generation);
            let remade = generation == 0 || readonly || address.as_ref() != Some(&addr);
            if remade {
                // Lazy: it connects on the first call, and reconnects by itself after a dropped connection.
                match ConnectionManager::new_lazy_with_config(client, self.config.clone()) {
                    Ok(conn) => {
                        generation += 1;
                        if generation > 1 {
                            tracing::warn!(server = %addr, readonly, "Redis connection made again");
                        }
                        self.publish.send_replace(Some(Link { conn, generation }));
                        address = Some(addr.clone());
                    }
                    Err(e) => tracing::warn!(error = %e, "cannot make a Redis connection"),
                }
            }
            // The policy of a new server is read while waiting for the next request.
            let check = self.eviction.watch(&addr, &info, self.attempt);
            tokio::pin!(check);
            let mut checked = !remade;
            loop {
                tokio::select! {
                    () = self.publish.closed() => return,
                    () = self.wanted.notify.notified() => {
                        if self.wanted.remake.load().generation() >= generation {
                            break;
                        }
                    }
                    () = &mut check, if !checked => checked = true,
                }
            }
            tokio::select! {
                () = self.publish.closed() => return,
                () = tokio::time::sleep(Timings::REMAKE_INTERVAL) => {}
            }
        }
    }

    /// The server's client, retried with a back-off until found; `None` once the store is dropped.
    async fn resolve(&mut self) -> Option<redis::Client> {
        let mut backoff = BACKOFF.0;
        loop {
            let attempt = tokio::time::timeout(self.attempt, self.target.resolve());
            let result = tokio::select! {
                result = attempt => result,
                () = self.publish.closed() => return None,
            };
            match result {
                Ok(Ok(client)) => return Some(client),
                Ok(Err(e)) => tracing::debug!(error = %e, "cannot find the Redis server yet; retrying"),
                Err(_) => tracing::debug!(attempt = ?self.attempt, "finding the Redis server timed out; retrying"),
            }
            tokio::select! {
                () = self.publish.closed() => return None,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(BACKOFF.1);
        }
    }
}

/// Connects to the Redis Cluster of `client` in the background, retrying with a back-off of 50 ms to 2 s, each
/// attempt bounded by `attempt`; publishes the connection, then reads the `maxmemory-policy` of each node of
/// `nodes` into `eviction`. Stops once done or once the store is dropped.
pub(crate) fn spawn_cluster(
    runtime: &tokio::runtime::Handle,
    client: ClusterClient,
    nodes: Vec<ConnectionInfo>,
    attempt: Duration,
    eviction: Arc<EvictionWatch>,
) -> watch::Receiver<Option<ClusterConnection>> {
    let (publish, conn) = watch::channel(None);
    runtime.spawn(async move {
        let mut backoff = Duration::from_millis(50);
        loop {
            let connect = tokio::time::timeout(attempt, client.get_async_connection());
            let result = tokio::select! {
                result = connect => result,
                () = publish.closed() => return,
            };
            match result {
                Ok(Ok(connection)) => {
                    let _ = publish.send(Some(connection));
                    break;
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "cluster connection failed; retrying"),
                Err(_) => tracing::debug!(?attempt, "cluster connection timed out; retrying"),
            }
            tokio::select! {
                () = publish.closed() => return,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
        for info in &nodes {
            let node = info.addr().to_string();
            let check = eviction.watch(&node, info, attempt);
            tokio::select! {
                () = check => {}
                () = publish.closed() => return,
            }
        }
    });
    conn
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The newer connection's request wins; of one connection, a refusal of writes wins over a failure (it
    /// remakes the connection at the same address); each survives its packing in one word.
    #[test]
    fn a_remake_request_keeps_the_newest_connection_and_readonly() {
        let failed = |generation| Remake::Failed { generation };
        let readonly = |generation| Remake::Readonly { generation };
        assert_eq!(Remake::Nothing.and(failed(2)), failed(2));
        assert_eq!(failed(2).and(readonly(2)), readonly(2));
        assert_eq!(
            readonly(2).and(failed(2)),
            readonly(2),
            "a failure does not undo a READONLY"
        );
        assert_eq!(
            readonly(2).and(failed(3)),
            failed(3),
            "a READONLY of a connection gone is stale"
        );
        assert_eq!(failed(3).and(readonly(2)), failed(3));
        for r in [Remake::Nothing, failed(7), readonly(1 << 40)] {
            assert_eq!(Remake::unpack(r.pack()), r);
        }
    }
}
