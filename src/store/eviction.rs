//! Invariant 15, eviction is seen: a Redis whose `maxmemory-policy` may evict limiter keys loses a bucket's
//! state, and the bucket comes back full (the limit is granted again: overselling). The policy is read with
//! `CONFIG GET maxmemory-policy`, over a connection of its own, each time the store connects to a server; a
//! policy that may evict is logged as a warning naming it and sets `tokenlease_redis_eviction_unsafe` to 1.
//! `[redis] require_noeviction = true` makes it a start-up error instead ([`require_noeviction`]). A managed
//! Redis that refuses `CONFIG` gives a warning, never an error: the policy cannot be known there.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use redis::{AsyncConnectionConfig, ConnectionInfo};

use super::condition::Condition;
use crate::config::RedisConfig;
use crate::error::{Error, StoreError, StoreErrorKind};
use crate::telemetry;

/// The script name of the errors of a policy read.
const SCRIPT: &str = "maxmemory-policy";

/// Whether `policy` may evict limiter keys: every `allkeys-*` policy, and every `volatile-*` one since the
/// limiter's keys carry TTLs. `noeviction` never does.
pub(crate) fn may_evict(policy: &str) -> bool {
    policy.starts_with("allkeys-") || policy.starts_with("volatile-")
}

/// What a server answered to `CONFIG GET maxmemory-policy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reading {
    /// Its policy.
    Policy(String),
    /// It refused the command (a managed Redis that disables `CONFIG`, an ACL): its message.
    Refused(String),
}

/// Reads the `maxmemory-policy` of the server at `info` over a connection of its own, within `timeout`, and
/// its `redis_version` (`INFO server`; `None` when it does not say).
///
/// # Errors
/// [`StoreError`] of kind `Timeout` or `Io` when the server cannot be reached (a refusal is a [`Reading`]).
pub(crate) async fn read(info: &ConnectionInfo, timeout: Duration) -> Result<(Reading, Option<String>), StoreError> {
    let mut version = None;
    let read = async {
        let client = redis::Client::open(info.clone())?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let mut conn = client.get_multiplexed_async_connection_with_config(&config).await?;
        let server = redis::cmd("INFO").arg("server").query_async::<String>(&mut conn).await;
        version = server
            .ok()
            .as_deref()
            .and_then(super::version::of_info)
            .map(str::to_owned);
        redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory-policy")
            .query_async::<Vec<String>>(&mut conn)
            .await
    };
    let reading = read_policy(tokio::time::timeout(timeout, read).await, timeout)?;
    Ok((reading, version))
}

/// What a policy read came to.
fn read_policy(
    answer: Result<redis::RedisResult<Vec<String>>, tokio::time::error::Elapsed>,
    timeout: Duration,
) -> Result<Reading, StoreError> {
    match answer {
        Err(_) => Err(StoreError::timeout(SCRIPT, timeout)),
        Ok(Ok(pair)) => match pair.get(1) {
            Some(policy) => Ok(Reading::Policy(policy.clone())),
            None => Ok(Reading::Refused(format!("no such setting (got {pair:?})"))),
        },
        Ok(Err(e)) if e.code().is_some() => Ok(Reading::Refused(e.to_string())),
        Ok(Err(e)) => Err(StoreError {
            kind: if e.is_timeout() {
                StoreErrorKind::Timeout
            } else {
                StoreErrorKind::Io
            },
            script: SCRIPT,
            message: e.to_string(),
            source: Some(Box::new(e)),
        }),
    }
}

/// The policies (and the versions too old for the scripts) the store's servers reported, by server (`host:port`), behind
/// the eviction gauge.
#[derive(Debug, Default)]
pub(crate) struct EvictionWatch {
    readings: Mutex<HashMap<String, Reading>>,
    /// Servers older than the scripts support, by server, with why (`version.rs`).
    too_old: Mutex<HashMap<String, String>>,
    /// Whether `too_old` has any: the one load each store call pays.
    any_too_old: AtomicBool,
    /// What the operator is told of the store (`condition.rs`): the store's calls and this watch's connections
    /// report to it.
    pub(crate) condition: Condition,
}

impl EvictionWatch {
    /// Records what `node` answered: logs a policy that may evict (or a refusal) when it is new for the node,
    /// and sets the gauge to whether any server's policy may evict.
    pub(crate) fn record(&self, node: &str, reading: Reading) {
        let mut readings = self.readings.lock().unwrap_or_else(PoisonError::into_inner);
        if readings.get(node) != Some(&reading) {
            log(node, &reading);
            readings.insert(node.to_owned(), reading);
        }
        telemetry::eviction_unsafe(at_risk(&readings).is_some());
    }

    /// Records the version `node` reported: a server too old for the scripts is logged as an error and refuses
    /// the store's calls ([`Self::unsupported`]) until it reconnects to a newer one.
    pub(crate) fn record_version(&self, node: &str, version: Option<&str>) {
        let why = version.and_then(super::version::unsupported);
        let mut too_old = self.too_old.lock().unwrap_or_else(PoisonError::into_inner);
        match why {
            Some(why) => {
                if too_old.get(node) != Some(&why) {
                    tracing::error!(%node, "{why}");
                }
                too_old.insert(node.to_owned(), why);
            }
            None => {
                too_old.remove(node);
            }
        }
        self.any_too_old.store(!too_old.is_empty(), Ordering::Release);
    }

    /// Why the store cannot run its scripts, when a server it connected to is older than they support.
    pub(crate) fn unsupported(&self) -> Option<String> {
        if !self.any_too_old.load(Ordering::Acquire) {
            return None;
        }
        let too_old = self.too_old.lock().unwrap_or_else(PoisonError::into_inner);
        too_old.iter().next().map(|(node, why)| format!("{node}: {why}"))
    }

    /// A policy that may evict limiter keys, when a server reported one.
    pub(crate) fn policy_at_risk(&self) -> Option<String> {
        let readings = self.readings.lock().unwrap_or_else(PoisonError::into_inner);
        at_risk(&readings).map(|(_, policy)| policy.to_owned())
    }

    /// Reads the policy of the server `node` at `info` until it answers (retrying with a back-off of 100 ms to
    /// 5 s), and records it. Runs in the task that connects the store, which drops it when it connects again.
    pub(crate) async fn watch(&self, node: &str, info: &ConnectionInfo, timeout: Duration) {
        let mut backoff = Duration::from_millis(100);
        self.condition
            .connecting(node, matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }));
        loop {
            match read(info, timeout).await {
                Ok((reading, version)) => {
                    self.condition.answered();
                    self.record_version(node, version.as_deref());
                    return self.record(node, reading);
                }
                Err(e) => {
                    self.condition.failed(&e);
                    tracing::debug!(%node, error = %e, "cannot read maxmemory-policy yet; retrying");
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }
}

/// Logs what `node` answered: a warning naming a policy that may evict limiter keys, or a refusal.
fn log(node: &str, reading: &Reading) {
    match reading {
        Reading::Policy(policy) if may_evict(policy) => tracing::warn!(
            %node,
            %policy,
            "Redis maxmemory-policy `{policy}` may evict limiter keys: an evicted bucket comes back full and its \
             limit is granted again; set `maxmemory-policy noeviction` (or `[redis] require_noeviction = true` to \
             refuse to start)"
        ),
        Reading::Policy(policy) => tracing::debug!(%node, %policy, "Redis maxmemory-policy"),
        Reading::Refused(why) => tracing::warn!(
            %node,
            "cannot read Redis maxmemory-policy ({why}): make sure it is `noeviction`, or limiter keys may be \
             evicted and their buckets come back full"
        ),
    }
}

fn at_risk(readings: &HashMap<String, Reading>) -> Option<(&str, &str)> {
    readings.iter().find_map(|(node, reading)| match reading {
        Reading::Policy(policy) if may_evict(policy) => Some((node.as_str(), policy.as_str())),
        _ => None,
    })
}

/// `[redis] require_noeviction = true`: reads the policy of every server the store starts on (the URL's, each
/// cluster node given, the master the Sentinels name) now, blocking the caller at most a few timeouts (on a
/// thread of its own with its own runtime, so it may be called inside a runtime, as `Limiter::from_config` is).
///
/// # Errors
/// [`Error::EvictionPolicy`] naming the server and its policy when one may evict limiter keys;
/// [`Error::Store`] when a server (or every Sentinel) cannot be reached: the check needs Redis up at start. A
/// server that refuses `CONFIG` is a warning, not an error.
pub(crate) fn require_noeviction(redis: &RedisConfig) -> Result<(), Error> {
    super::target::install_crypto_provider();
    let timeout = redis.timeout.saturating_mul(10).max(Duration::from_secs(1));
    let joined = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| io_error(format!("cannot start a runtime to check it: {e}")))?;
                runtime.block_on(check_servers(redis, timeout))
            })
            .join()
    });
    joined.unwrap_or_else(|_| Err(io_error("the check panicked".into())))
}

/// The servers of `redis`, each read and checked.
async fn check_servers(redis: &RedisConfig, timeout: Duration) -> Result<(), Error> {
    let mut servers = Vec::new();
    let tls = redis
        .tls_certificates()
        .map_err(|(field, why)| io_error(format!("`{field}` {why}")))?;
    let tls = tls.as_ref();
    if let Some(sentinel) = &redis.sentinel {
        let master = super::target::resolve_master(&sentinel.nodes, &sentinel.master_name, tls, timeout).await;
        servers.push(master.map_err(|e| io_error(format!("cannot find the master through Sentinel: {e}")))?);
    }
    for url in std::iter::once(&redis.url)
        .filter(|u| !u.is_empty())
        .chain(&redis.cluster)
    {
        let info = super::target::connection_info(url, tls)
            .map_err(|e| io_error(format!("`{}`: {e}", crate::config::redact_url(url))))?;
        servers.push(info);
    }
    for info in servers {
        let node = info.addr().to_string();
        let (reading, version) = read(&info, timeout)
            .await
            .map_err(|e| io_error(format!("cannot read it from {node}: {e}")))?;
        if let Some(why) = version.as_deref().and_then(super::version::unsupported) {
            return Err(io_error(format!("{node}: {why}")));
        }
        match reading {
            Reading::Policy(policy) if may_evict(&policy) => return Err(Error::EvictionPolicy { node, policy }),
            Reading::Policy(_) => {}
            Reading::Refused(_) => log(&node, &reading),
        }
    }
    Ok(())
}

/// An error of the start-up check.
fn io_error(message: String) -> Error {
    Error::Store(StoreError {
        kind: StoreErrorKind::Io,
        script: SCRIPT,
        message: format!(
            "`[redis] require_noeviction = true` reads each server's `maxmemory-policy` at start: {message}"
        ),
        source: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allkeys_and_volatile_policies_may_evict_noeviction_does_not() {
        for policy in [
            "allkeys-lru",
            "allkeys-lfu",
            "allkeys-random",
            "volatile-lru",
            "volatile-lfu",
            "volatile-random",
            "volatile-ttl",
        ] {
            assert!(may_evict(policy), "{policy}");
        }
        assert!(!may_evict("noeviction"));
    }

    #[test]
    fn the_watch_reports_any_server_at_risk() {
        let watch = EvictionWatch::default();
        watch.record("a:1", Reading::Policy("noeviction".into()));
        assert_eq!(watch.policy_at_risk(), None);
        watch.record("b:2", Reading::Policy("volatile-ttl".into()));
        assert_eq!(watch.policy_at_risk().as_deref(), Some("volatile-ttl"));
        watch.record("b:2", Reading::Refused("unknown command".into()));
        assert_eq!(watch.policy_at_risk(), None);
    }

    #[test]
    fn a_server_too_old_refuses_calls_until_a_newer_one_answers_in_its_place() {
        let watch = EvictionWatch::default();
        watch.record_version("a:1", Some("7.0.15"));
        assert_eq!(watch.unsupported(), None);
        watch.record_version("b:2", Some("4.0.14"));
        let why = watch.unsupported().expect("too old");
        assert!(why.starts_with("b:2: Redis 4.0.14 is older than 5.0"), "{why}");
        watch.record_version("b:2", Some("5.0.0")); // upgraded, or failed over to a newer replica
        assert_eq!(watch.unsupported(), None);
        watch.record_version("b:2", None);
        assert_eq!(watch.unsupported(), None, "a server that does not say is not refused");
    }
}
