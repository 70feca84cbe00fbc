//! `[redis]` of config.toml: where the store is (one server's `url`, a `cluster`'s nodes, or the `sentinel`s
//! naming the master), TLS (`tls.rs`), its keys, timeout, fail mode and eviction check, and their checks (the
//! builder uses those of the key prefix and of the number of processes too). A reload may change only `fail_mode`.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::redact_url;
use crate::rule::FieldError;
use crate::rule::{positive, FailMode};

/// `[redis]`. Its `Debug` shows the URLs with their passwords redacted ([`redact_url`]).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisConfig {
    /// `redis://host:port/db` of one server; empty when `cluster` or `sentinel` is set.
    #[serde(default)]
    pub url: String,
    /// `redis://host:port` of some masters of a Redis Cluster (the others are discovered); empty otherwise.
    /// Exactly one of `url`, `cluster` and `sentinel` is set.
    #[serde(default)]
    pub cluster: Vec<String>,
    /// The Sentinel deployment whose master is the store; `None` otherwise.
    #[serde(default)]
    pub sentinel: Option<SentinelConfig>,
    /// PEM file of the certificate authorities that sign the servers' certificates, for `rediss://` URLs (the
    /// server, the cluster's nodes, or the Sentinels and the master they name); unset, the system's roots are
    /// trusted. A relative path is taken from the working directory.
    #[serde(default)]
    pub tls_ca_file: Option<PathBuf>,
    /// PEM file of the client certificate (and its chain) that `rediss://` connections present, for a Redis
    /// with `tls-auth-clients yes`; set with `tls_key_file`.
    #[serde(default)]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's private key (PKCS#8, PKCS#1 or SEC1); set with `tls_cert_file`.
    #[serde(default)]
    pub tls_key_file: Option<PathBuf>,
    /// Refuse to start on a Redis whose `maxmemory-policy` may evict limiter keys (`allkeys-*`, `volatile-*`):
    /// an evicted bucket comes back full. Default `false`: a warning and `tokenlease_redis_eviction_unsafe`.
    #[serde(default)]
    pub require_noeviction: bool,
    /// Prefix of every key: `{prefix}:{rule:key}`.
    #[serde(default = "default_prefix")]
    pub key_prefix: String,
    /// Timeout of every Redis call (humantime, e.g. `"5ms"`).
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// What to do when Redis fails: `open`, `closed` (the default) or `local` (as `closed`, and a hot key sells
    /// its reserve: [`FailMode::Local`]).
    #[serde(default)]
    pub fail_mode: FailMode,
    /// How many processes share a leased rule's burst until its roster in Redis first answers (invariant 17):
    /// from then on a hot key's fair share of the burst divides by the live count the processes' beats keep
    /// there, whatever this says.
    #[serde(default = "default_expected_processes")]
    pub expected_processes: u32,
}

/// `[redis] sentinel = { master_name = "mymaster", nodes = ["redis://10.0.0.1:26379", ...] }`: the store is the
/// master these Sentinels name, followed through failovers. Its `Debug` redacts the passwords of `nodes`.
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SentinelConfig {
    /// The name the Sentinels monitor the master under (`sentinel monitor <name> ...`).
    pub master_name: String,
    /// `redis://host:port` of the Sentinels (not of the Redis servers); the first that answers is asked.
    pub nodes: Vec<String>,
}

/// The URLs of `urls`, redacted, for a `Debug`.
fn redacted(urls: &[String]) -> Vec<String> {
    urls.iter().map(|u| redact_url(u)).collect()
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Destructured: a field added later must be shown here, or skipped, on purpose.
        let Self {
            url,
            cluster,
            sentinel,
            tls_ca_file,
            tls_cert_file,
            tls_key_file,
            require_noeviction,
            key_prefix,
            timeout,
            fail_mode,
            expected_processes,
        } = self;
        f.debug_struct("RedisConfig")
            .field("url", &redact_url(url))
            .field("cluster", &redacted(cluster))
            .field("sentinel", sentinel)
            .field("tls_ca_file", tls_ca_file)
            .field("tls_cert_file", tls_cert_file)
            .field("tls_key_file", tls_key_file)
            .field("require_noeviction", require_noeviction)
            .field("key_prefix", key_prefix)
            .field("timeout", timeout)
            .field("fail_mode", fail_mode)
            .field("expected_processes", expected_processes)
            .finish()
    }
}

impl std::fmt::Debug for SentinelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Self { master_name, nodes } = self;
        f.debug_struct("SentinelConfig")
            .field("master_name", master_name)
            .field("nodes", &redacted(nodes))
            .finish()
    }
}

impl RedisConfig {
    /// Checks the section: exactly one of `url`, `cluster` and `sentinel`, redis:// URLs, TLS files that read
    /// and parse (`tls.rs`), a timeout above zero and at most 60 s, a key prefix and a number of processes in
    /// range.
    ///
    /// # Errors
    /// The field out of range and why.
    pub(super) fn validate(&self) -> Result<(), FieldError> {
        check_servers(self)?;
        self.check_tls()?;
        if self.timeout > Duration::from_secs(60) {
            return Err((
                "timeout",
                "must be at most 60s: a limiter that waits longer does not limit".into(),
            ));
        }
        if self.timeout.is_zero() {
            return Err(("timeout", "must be longer than zero".into()));
        }
        check_expected_processes(self.expected_processes)?;
        check_key_prefix(&self.key_prefix)
    }

    /// The URLs the store connects to (the server's, the cluster's nodes, or the Sentinels), and their field.
    pub(super) fn urls(&self) -> (&'static str, Vec<&String>) {
        match &self.sentinel {
            Some(s) => ("sentinel.nodes", s.nodes.iter().collect()),
            None if self.cluster.is_empty() => ("url", vec![&self.url]),
            None => ("cluster", self.cluster.iter().collect()),
        }
    }

    /// Whether `other` reaches the same store the same way (servers, key prefix, timeout, expected processes,
    /// eviction check): what a reload may not change. `fail_mode` may change.
    pub(crate) fn same_store(&self, other: &Self) -> bool {
        Self {
            fail_mode: other.fail_mode,
            ..self.clone()
        } == *other
    }
}

/// The default prefix of every store key.
pub(crate) const DEFAULT_KEY_PREFIX: &str = "tl";
/// The default timeout of a store call.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);
/// The default number of processes sharing the limits.
pub(crate) const DEFAULT_EXPECTED_PROCESSES: u32 = 4;

fn default_prefix() -> String {
    DEFAULT_KEY_PREFIX.into()
}
fn default_timeout() -> Duration {
    DEFAULT_TIMEOUT
}
fn default_expected_processes() -> u32 {
    DEFAULT_EXPECTED_PROCESSES
}

/// Checks a key prefix: non-empty, without braces (the keys' hash tag is braced).
pub(crate) fn check_key_prefix(prefix: &str) -> Result<(), FieldError> {
    if prefix.is_empty() || prefix.contains(['{', '}']) {
        return Err(("key_prefix", "must be non-empty and hold no `{` or `}`".into()));
    }
    Ok(())
}

/// Checks the number of processes sharing the limits: at least 1.
pub(crate) fn check_expected_processes(n: u32) -> Result<(), FieldError> {
    positive(u64::from(n), "expected_processes").map(|_| ())
}

/// Checks that exactly one of `url`, `cluster` and `sentinel` is set, and that their URLs are redis:// URLs.
fn check_servers(r: &RedisConfig) -> Result<(), FieldError> {
    let set: Vec<&str> = [
        ("url", !r.url.is_empty()),
        ("cluster", !r.cluster.is_empty()),
        ("sentinel", r.sentinel.is_some()),
    ]
    .into_iter()
    .filter_map(|(field, set)| set.then_some(field))
    .collect();
    match set[..] {
        [] => {
            let why = "is required: the server's redis:// URL (or `cluster`: a list of them, or `sentinel`)";
            return Err(("url", why.into()));
        }
        [_] => {}
        [first, ..] => {
            let why = format!(
                "is set together with `{}`: give only one of `url` (one server), `cluster` (the cluster's nodes) \
                 and `sentinel` (its master name and nodes)",
                set[1..].join("` and `")
            );
            return Err((first, why));
        }
    }
    if let Some(s) = &r.sentinel {
        if s.master_name.is_empty() {
            return Err(("sentinel.master_name", "must not be empty".into()));
        }
        if s.nodes.is_empty() {
            let why = "must list at least one Sentinel's redis:// URL";
            return Err(("sentinel.nodes", why.into()));
        }
    }
    let (field, urls) = r.urls();
    match urls.into_iter().find(|url| ::redis::parse_redis_url(url).is_none()) {
        Some(url) => Err((field, format!("`{}` is not a redis:// URL", redact_url(url)))),
        None => Ok(()),
    }
}
